// Settings (include/fastgather/settings.hpp): read from the environment
// through the table in env.cpp, the one place that reads variables.
#include "fastgather/settings.hpp"

#include <fmt/format.h>

#include "base/caches.hpp"
#include "base/env.hpp"

namespace fastgather {
namespace {

// Sets *field from a count variable when it is set.
template <typename T>
Status read_count(const char* name, T* field) {
  auto v = base::env_count(name);
  if (!v.ok()) return v.status();
  if (v.value()) *field = static_cast<T>(*v.value());
  return Status::Ok();
}

Status read_us(const char* name, std::optional<std::chrono::microseconds>* field) {
  auto v = base::env_count(name);
  if (!v.ok()) return v.status();
  if (v.value()) *field = std::chrono::microseconds(*v.value());
  return Status::Ok();
}

// In the variable's range.
Status in_range(const char* name, uint64_t value) {
  const base::EnvVar* var = base::find_env(name);
  if (var == nullptr || (value >= var->min && value <= var->max)) return Status::Ok();
  return {ErrorKind::kInvalidArgument,
          fmt::format("setting {}={} is outside {}..{} ({})", name, value, var->min, var->max, var->doc)};
}

}  // namespace

Result<Settings> Settings::from_environment() {
  Settings s;
  for (auto [name, field] : {std::pair{"FG_PIPELINE_BYTES", &s.pipeline_bytes},
                             {"FG_STREAM_OUT_BYTES", &s.stream_out_bytes}}) {
    auto v = base::env_count(name);
    if (!v.ok()) return v.status();
    if (v.value()) *field = static_cast<size_t>(*v.value());
  }
  for (auto [name, field] : {std::pair{"FG_RING_BYTES", &s.ring_bytes}, {"FG_SYMMETRIC_BYTES", &s.symmetric_bytes},
                             {"FG_SINGLE_COPY_MIN_BYTES", &s.single_copy_min_bytes},
                             {"FG_HIER_MIN_BYTES", &s.hier_min_bytes}, {"FG_NET_PIECE_BYTES", &s.net_piece_bytes}}) {
    if (Status st = read_count(name, field); !st.ok()) return st;
  }
  if (Status st = read_us("FG_SPIN_US", &s.spin); !st.ok()) return st;
  if (Status st = read_us("FG_YIELD_US", &s.yield); !st.ok()) return st;
  uint64_t report_ms = static_cast<uint64_t>(s.report_after.count());
  if (Status st = read_count("FG_REPORT_MS", &report_ms); !st.ok()) return st;
  s.report_after = std::chrono::milliseconds(report_ms);
  auto copy_in = base::env_word("FG_COPY_IN");
  if (!copy_in.ok()) return copy_in.status();
  if (copy_in.value()) s.copy_in = *copy_in.value() == "cached" ? CopyIn::kCached : CopyIn::kStreaming;
  auto single = base::env_word("FG_SINGLE_COPY");
  if (!single.ok()) return single.status();
  if (single.value()) {
    s.single_copy = *single.value() == "off" ? SingleCopy::kOff : *single.value() == "always" ? SingleCopy::kAlways
                                                                                            : SingleCopy::kAuto;
  }
  auto gemm = base::env_word("FG_FUSED_GEMM");
  if (!gemm.ok()) return gemm.status();
  if (gemm.value()) {
    s.fused_gemm = *gemm.value() == "openblas" ? FusedGemm::kOpenBlas : *gemm.value() == "avx2" ? FusedGemm::kAvx2
                                                                                               : FusedGemm::kAuto;
  }
  return s;
}

Status Settings::validate() const {
  const std::pair<const char*, uint64_t> kCounts[] = {
      {"FG_RING_BYTES", ring_bytes},
      {"FG_SYMMETRIC_BYTES", symmetric_bytes},
      {"FG_SINGLE_COPY_MIN_BYTES", single_copy_min_bytes},
      {"FG_HIER_MIN_BYTES", hier_min_bytes},
      {"FG_NET_PIECE_BYTES", net_piece_bytes},
  };
  for (auto [name, v] : kCounts) {
    if (Status s = in_range(name, v); !s.ok()) return s;
  }
  if (pipeline_bytes) {
    if (Status s = in_range("FG_PIPELINE_BYTES", *pipeline_bytes); !s.ok()) return s;
  }
  if (stream_out_bytes) {
    if (Status s = in_range("FG_STREAM_OUT_BYTES", *stream_out_bytes); !s.ok()) return s;
  }
  if (Status s = in_range("FG_REPORT_MS", static_cast<uint64_t>(report_after.count())); !s.ok()) return s;
  if (spin) {
    if (Status s = in_range("FG_SPIN_US", static_cast<uint64_t>(spin->count())); !s.ok()) return s;
  }
  if (yield) {
    if (Status s = in_range("FG_YIELD_US", static_cast<uint64_t>(yield->count())); !s.ok()) return s;
  }
  return Status::Ok();
}

size_t Settings::effective_pipeline_bytes() const {
  if (pipeline_bytes) return *pipeline_bytes;
  return base::l2_bytes() / 4;
}

size_t Settings::effective_stream_out_bytes() const {
  if (stream_out_bytes) return *stream_out_bytes;
  return base::counted_llc_bytes(base::cache_bytes(0)) / 4;
}

std::string Settings::describe() const {
  auto us = [](const std::optional<std::chrono::microseconds>& v) {
    return v ? std::to_string(v->count()) : std::string("auto");
  };
  const char* copy = copy_in == CopyIn::kLearned ? "learned" : copy_in == CopyIn::kCached ? "cached" : "streaming";
  const char* single = single_copy == SingleCopy::kAuto ? "auto" : single_copy == SingleCopy::kOff ? "off" : "always";
  const char* gemm = fused_gemm == FusedGemm::kAuto ? "auto" : fused_gemm == FusedGemm::kOpenBlas ? "openblas" : "avx2";
  return fmt::format(
      "FG_RING_BYTES={} FG_PIPELINE_BYTES={} FG_SYMMETRIC_BYTES={} FG_STREAM_OUT_BYTES={} FG_COPY_IN={} "
      "FG_SINGLE_COPY={} FG_SINGLE_COPY_MIN_BYTES={} FG_FUSED_GEMM={} FG_SPIN_US={} FG_YIELD_US={} "
      "FG_HIER_MIN_BYTES={} FG_NET_PIECE_BYTES={} FG_REPORT_MS={}",
      ring_bytes, effective_pipeline_bytes(), symmetric_bytes, effective_stream_out_bytes(), copy, single,
      single_copy_min_bytes, gemm, us(spin), us(yield), hier_min_bytes,
      net_piece_bytes, report_after.count());
}

}  // namespace fastgather
