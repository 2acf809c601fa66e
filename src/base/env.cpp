#include "base/env.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace fastgather::base {
namespace {

using K = EnvVar::Kind;

// Bounds are sanity bounds: beyond them a value is a typo or an overflow,
// never a configuration that could work (a 4097-rank group overflows the
// network tag's member field; a ring over 1 GiB per member takes longer to
// map and fault in than any timeout).
constexpr EnvVar kTable[] = {
    {"TP", K::kCount, 1, 4096, "", "1", "tensor-parallel size: TP concurrent groups of DP ranks (world = TP*DP)"},
    {"DP", K::kCount, 1, 4096, "", "2 (fg-bench)", "ranks per group"},
    {"SERVER_NUM", K::kCount, 1, 4096, "", "1", "servers in the job"},
    {"SERVER_INDEX", K::kCount, 0, 4095, "", "0; unset with SERVER_NUM > 1 in fg-bench: simulate every server here",
     "this server"},
    {"MASTER_IP", K::kText, 0, 0, "", "127.0.0.1", "host of the rendezvous store (rank 0): an address or a host name"},
    {"PORT", K::kCount, 1, 65535, "", "unset: one server, a free port of the spawner's choice; else 29500", "TCP port of the rendezvous store"},
    {"FG_TIMEOUT_MS", K::kCount, 0, 86'400'000, "", "600000 (10 minutes)", "a peer that does not arrive in this time fails the call (0: never); a dead one is found at once"},
    {"FG_REPORT_MS", K::kCount, 0, 86'400'000, "", "5000", "a rank waiting this long says whom it waits for, again at growing intervals (0: never)"},
    {"FG_TOKEN", K::kText, 0, 0, "", "empty (one server: a secret of the spawner's own)", "job secret every rank must present to the store"},
    {"FG_RING_BYTES", K::kCount, 16384, uint64_t{1} << 30, "", "4194304 (4 MiB)", "shared-memory ring per member"},
    {"FG_PIPELINE_BYTES", K::kCount, 64, uint64_t{1} << 30, "", "a quarter of the L2 cache, at most FG_RING_BYTES/4",
     "the ring protocol streams a block in steps of this many bytes (the group's creator decides)"},
    {"FG_SYMMETRIC_BYTES", K::kCount, 0, uint64_t{1} << 32, "", "1073741824 (1 GiB, reserved as used)",
     "symmetric heap per member of a group on one server, for Group::empty (0: none)"},
    {"FG_STREAM_OUT_BYTES", K::kCount, 0, uint64_t{1} << 40, "", "a quarter of the last-level cache, counted as at most 128 MiB",
     "output bytes per call from which blocks are copied out with streaming stores"},
    {"FG_COPY_IN", K::kWord, 0, 0, "cached|streaming", "learned per size", "how bytes are stored into the ring"},
    {"FG_SINGLE_COPY", K::kWord, 0, 0, "auto|off|always",
     "auto: where every member can read every other, for huge-page memory (and 4 KiB pages up to 2 MiB on a crowded host)",
     "large messages read straight from the peer's memory (CMA); always: also 4 KiB-page memory; off: the ring"},
    {"FG_SINGLE_COPY_MIN_BYTES", K::kCount, 1, uint64_t{1} << 40, "", "1048576",
     "bytes per member from which single copy is used"},
    {"FG_FUSED_GEMM", K::kWord, 0, 0, "packed|avx2|openblas", "packed where the CPU has AVX2+FMA+F16C and gemm_threads is 1",
     "the fused ops' GEMM: x2 packed once per call with x1 converted in tiles (AVX-512 where the CPU has it; avx2: never), or OpenBLAS sgemm on fp32 copies"},
    {"FG_SPIN_US", K::kCount, 0, 1'000'000, "", "20 (2 when oversubscribed)", "waiting: spin this long first (set: no adapting to a crowded host)"},
    {"FG_YIELD_US", K::kCount, 0, 10'000'000, "", "200 (50 when oversubscribed)", "waiting: then yield this long, then sleep"},
    {"FG_BIND", K::kWord, 0, 0, "none|core", "core when ranks <= CPUs", "pin spawned ranks to CPUs, or not"},
    {"FG_HIER_MIN_BYTES", K::kCount, 0, uint64_t{1} << 40, "", "65536", "across servers: bytes per rank from which the hierarchical schedule is used"},
    {"FG_NET_PIECE_BYTES", K::kCount, 4096, uint64_t{1} << 31, "", "1048576", "across servers: largest UCX message"},
    {"FG_NO_HUGEPAGES", K::kFlag, 0, 0, "", "unset: tensors of 1 MiB and more get MADV_HUGEPAGE",
     "Tensor: no huge-page alignment or advice"},
    {"FG_RANK", K::kText, 0, 0, "", "unset", "with FG_WORLD_SIZE: this process is that rank of a job another launcher started (also OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, PMIX_RANK/SIZE)"},
    {"FG_WORLD_SIZE", K::kText, 0, 0, "", "unset", "see FG_RANK"},
    {"OMPI_COMM_WORLD_RANK", K::kText, 0, 0, "", "set by Open MPI's mpirun", "see FG_RANK"},
    {"OMPI_COMM_WORLD_SIZE", K::kText, 0, 0, "", "set by Open MPI's mpirun", "see FG_RANK"},
    {"PMI_RANK", K::kText, 0, 0, "", "set by MPICH's and Slurm's launchers", "see FG_RANK"},
    {"PMI_SIZE", K::kText, 0, 0, "", "set by MPICH's and Slurm's launchers", "see FG_RANK"},
    {"PMIX_RANK", K::kText, 0, 0, "", "set by PMIx launchers", "see FG_RANK"},
    {"PMIX_SIZE", K::kText, 0, 0, "", "set by PMIx launchers", "see FG_RANK"},
    {"FG_UCX_LIBRARY", K::kText, 0, 0, "", "the build's UCX (its libdir/libucp.so.0), then libucp.so.0 on the loader's path",
     "across servers: the libucp to load (a path or a name for dlopen)"},
    {"UCX_TLS", K::kText, 0, 0, "", "UCX's; tcp when servers are simulated on one host", "UCX's transports (UCX reads it; fastgather only looks)"},
    {"UCX_NET_DEVICES", K::kText, 0, 0, "", "UCX's; lo when servers are simulated on one host", "UCX's devices (UCX reads it; fastgather only looks)"},
    {"UCX_RNDV_THRESH", K::kText, 0, 0, "", "UCX's; inf where TCP alone carries the bytes between servers", "UCX's rendezvous threshold (UCX reads it; fastgather asks inf where TCP alone is used and this is unset)"},
    {"UCX_TCP_TX_SEG_SIZE", K::kText, 0, 0, "", "UCX's; 256k where TCP alone carries the bytes between servers", "UCX's TCP segment (fastgather sets both to 256k in its process where TCP alone is used and neither is set)"},
    {"UCX_TCP_RX_SEG_SIZE", K::kText, 0, 0, "", "UCX's; 256k where TCP alone carries the bytes between servers", "UCX's TCP segment (fastgather sets both to 256k in its process where TCP alone is used and neither is set)"},
    {"FG_LOG_SETTINGS", K::kFlag, 0, 0, "", "unset", "rank 0 prints the effective settings when a communicator starts"},
    {"FG_NO_MPIRUN", K::kFlag, 0, 0, "", "unset", "fg-bench: do not re-run under mpirun for the MPI comparator"},
};

}  // namespace

std::span<const EnvVar> env_table() { return kTable; }

const EnvVar* find_env(const char* name) {
  for (const EnvVar& v : kTable) {
    if (std::strcmp(v.name, name) == 0) return &v;
  }
  return nullptr;
}

Result<uint64_t> parse_count(const std::string& text, uint64_t min, uint64_t max, const std::string& what) {
  bool digits = !text.empty() && text.size() <= 20;
  for (char ch : text) digits &= ch >= '0' && ch <= '9';
  if (!digits) {
    return Status{ErrorKind::kInvalidArgument,
                  fmt::format("{}='{}' is not a whole number (digits only, {}..{})", what, text, min, max)};
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < min || v > max) {
    return Status{ErrorKind::kInvalidArgument, fmt::format("{}={} is outside {}..{}", what, text, min, max)};
  }
  return static_cast<uint64_t>(v);
}

Result<std::optional<uint64_t>> env_count(const char* name) {
  const EnvVar* var = find_env(name);
  const char* v = std::getenv(name);
  if (var == nullptr || v == nullptr || *v == '\0') return std::optional<uint64_t>{};
  auto r = parse_count(v, var->min, var->max, fmt::format("environment variable {}", name));
  if (!r.ok()) return Status{r.status().kind(), fmt::format("{} ({})", r.status().message(), var->doc)};
  return std::optional<uint64_t>{r.value()};
}

Result<std::optional<std::string>> env_word(const char* name) {
  const EnvVar* var = find_env(name);
  const char* v = std::getenv(name);
  if (var == nullptr || v == nullptr || *v == '\0') return std::optional<std::string>{};
  std::string words = var->words;
  for (size_t at = 0; at <= words.size();) {
    size_t bar = words.find('|', at);
    if (bar == std::string::npos) bar = words.size();
    if (words.compare(at, bar - at, v) == 0 && std::strlen(v) == bar - at) return std::optional<std::string>{v};
    at = bar + 1;
  }
  return Status{ErrorKind::kInvalidArgument,
                fmt::format("environment variable {}='{}' is not one of {} ({})", name, v, words, var->doc)};
}

uint64_t env_count_or(const char* name, uint64_t fallback) {
  auto v = env_count(name);
  return v.ok() && v.value() ? *v.value() : fallback;
}

std::optional<std::string> env_text(const char* name, bool empty_counts) {
  const char* v = find_env(name) != nullptr ? std::getenv(name) : nullptr;
  if (v == nullptr || (*v == '\0' && !empty_counts)) return std::nullopt;
  return std::string(v);
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::string describe_environment() {
  std::string out;
  for (const EnvVar& v : kTable) {
    std::string accepts;
    switch (v.kind) {
      case K::kCount: accepts = fmt::format("{}..{}", v.min, v.max); break;
      case K::kWord: accepts = v.words; break;
      case K::kText: accepts = "text"; break;
      case K::kFlag: accepts = "set = on"; break;
    }
    out += fmt::format("{:<20} {:<26} {} (default: {})\n", v.name, accepts, v.doc, v.fallback);
  }
  return out;
}

Status check_environment() {
  for (const EnvVar& var : kTable) {
    if (var.kind == K::kCount) {
      if (auto r = env_count(var.name); !r.ok()) return r.status();
    } else if (var.kind == K::kWord) {
      if (auto r = env_word(var.name); !r.ok()) return r.status();
    }
  }
  return Status::Ok();
}

}  // namespace fastgather::base
