// How a member copies its bytes into its own ring, chosen by measurement.
//
// Regular stores are fastest when the peers' cores share a cache with ours,
// but when the host places the vCPUs far apart every line a peer read
// earlier costs a cross-die invalidation, an order of magnitude more
// (docs/benchmarks.md). Streaming (non-temporal) stores cost the same
// everywhere (the peers then read from memory). No static choice is right on a machine whose
// placement changes under us, so each group learns: per size class it keeps
// the last whole-call times under each way, takes the one with the lower
// median (a preempted call must not flip the choice), and tries the other
// one now and then. The writer alone decides; readers do not care.
#pragma once

#include "fastgather/settings.hpp"

#include <array>
#include <cstddef>
#include <cstdint>

namespace fastgather::algo {

enum class CopyIn : uint8_t { kCached = 0, kStreaming = 1 };

void copy_into_ring(CopyIn how, std::byte* dst, const std::byte* src, size_t len);

// Copies a block (or piece) into the caller's output - from a ring, a peer's
// heap region or the own input - with streaming stores when `streaming`
// (any alignment; regular stores where the CPU has no AVX2).
void copy_out(std::byte* dst, const std::byte* src, size_t len, bool streaming);
// Whether a call that writes `output_bytes` on this rank copies out with
// streaming stores: from a quarter of the last-level cache
// (FG_STREAM_OUT_BYTES), where the ranks' outputs and inputs together no
// longer fit it. Beyond the cache, regular stores first read every output
// line they write (read for ownership), and the output evicts what the peers
// still read; below it, regular stores keep the output in the cache for
// whoever reads it next (docs/benchmarks.md, "Streaming stores for large
// outputs", has the measurements on both sides of the threshold).
bool streams_out(size_t output_bytes, const Settings& settings);

class CopyInChooser {
 public:
  // Settings::copy_in (FG_COPY_IN=cached|streaming) forces one way (benchmarks); default: learn.
  explicit CopyInChooser(Settings::CopyIn forced = Settings::CopyIn::kLearned);
  CopyIn pick(size_t bytes);
  void record(size_t bytes, CopyIn how, double call_ns);
  // The calls recorded so far in `bytes`'s size class, both ways together.
  uint64_t recorded(size_t bytes) const;

  static constexpr size_t kMinLearnedBytes = 16 * 1024;  // below: lines are few, cached wins

 private:
  struct Arm {
    std::array<float, 16> recent_ns{};  // a ring of the latest samples
    uint32_t samples = 0;
    float median() const;
  };
  struct SizeClass {
    std::array<Arm, 2> arms;
    uint64_t calls = 0;
    CopyIn best = CopyIn::kCached;
  };
  static size_t size_class(size_t bytes);
  std::array<SizeClass, 40> classes_{};
  int forced_ = -1;
};

}  // namespace fastgather::algo
