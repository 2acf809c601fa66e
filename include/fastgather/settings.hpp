// Every tunable of the library in one typed object. Communicator::create
// reads it from the environment once (Settings::from_environment: the FG_*
// variables of `fg-bench --help-env`, each checked against its range), unless
// Config::settings carries one set in code; the communicator's groups and
// their calls then follow that object alone, so one process can run
// communicators with different settings (tests do). `describe()` lists the
// effective values, which FG_LOG_SETTINGS=1 prints at start-up.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fastgather/status.hpp"

namespace fastgather {

struct Settings {
  // Shared-memory ring per member of a group (FG_RING_BYTES), a multiple of 4 KiB.
  size_t ring_bytes = size_t{4} << 20;
  // The ring protocol's step (FG_PIPELINE_BYTES); unset: a quarter of this CPU's L2.
  std::optional<size_t> pipeline_bytes;
  // Symmetric heap per member of a group on one server (FG_SYMMETRIC_BYTES; 0: none).
  size_t symmetric_bytes = size_t{1} << 30;
  // Output bytes per call from which blocks are copied out with streaming
  // stores (FG_STREAM_OUT_BYTES; 0: always); unset: a quarter of the
  // last-level cache, counted as at most 128 MiB.
  std::optional<size_t> stream_out_bytes;
  // How bytes are stored into the ring (FG_COPY_IN): learned per size, or forced.
  enum class CopyIn { kLearned, kCached, kStreaming } copy_in = CopyIn::kLearned;
  // Large messages read straight from the peer's memory (FG_SINGLE_COPY):
  // where huge-page memory allows (auto), never, or for any memory.
  enum class SingleCopy { kAuto, kOff, kAlways } single_copy = SingleCopy::kAuto;
  // From this many bytes per member (FG_SINGLE_COPY_MIN_BYTES): single copy
  // pays on huge-page memory, which Tensor gives from 1 MiB (docs/benchmarks.md,
  // "Single copy").
  size_t single_copy_min_bytes = size_t{1} << 20;
  // The fused ops' GEMM (FG_FUSED_GEMM): the packed kernel where the CPU has
  // it (its AVX-512 form where the CPU has that), the packed kernel's AVX2
  // form whatever the CPU has, or OpenBLAS's sgemm.
  enum class FusedGemm { kAuto, kOpenBlas, kAvx2 } fused_gemm = FusedGemm::kAuto;
  // Waiting: spin, then yield, then sleep (FG_SPIN_US, FG_YIELD_US); unset:
  // by how many processes share the cores.
  std::optional<std::chrono::microseconds> spin, yield;
  // Across servers: bytes per rank from which the hierarchical schedule is
  // used (FG_HIER_MIN_BYTES), and the largest UCX message (FG_NET_PIECE_BYTES).
  size_t hier_min_bytes = size_t{64} << 10;
  size_t net_piece_bytes = size_t{1} << 20;
  // A rank that has waited this long in one wait says on stderr whom it
  // waits for and where, and again at growing intervals (FG_REPORT_MS; 0: never).
  std::chrono::milliseconds report_after{5000};

  // The defaults with every FG_* variable that is set applied; an error
  // names the first variable whose value is not accepted.
  static Result<Settings> from_environment();
  // Ranges as the environment's (a value set in code is checked the same way).
  Status validate() const;
  // The effective values, one "NAME=value" each, space-separated (resolved:
  // cache-derived defaults shown as the bytes they come to).
  std::string describe() const;
  // pipeline_bytes and stream_out_bytes as they apply on this machine.
  size_t effective_pipeline_bytes() const;
  size_t effective_stream_out_bytes() const;
};

}  // namespace fastgather
