#include "algo/thresholds.hpp"

#include <fmt/format.h>

#include "fastgather/settings.hpp"

namespace fastgather::algo {

std::vector<Threshold> thresholds() {
  const Settings d;
  return {
      {"FG_SINGLE_COPY_MIN_BYTES", d.single_copy_min_bytes,
       "a one-shot all-gather on one server reads peers' inputs by single copy (where they lie in huge pages or the heap)",
       "benchmarks.md: Later the same day: huge pages and single copy from 1 MiB"},
      kCrowdedSingleCopy,
      {"FG_PIPELINE_BYTES", 0, "the ring's step: a quarter of this CPU's L2 (unset)",
       "benchmarks.md: Pipelining the ring (issue 12, 2026-12-03)"},
      {"FG_STREAM_OUT_BYTES", 0,
       "output bytes per call from which blocks are copied out with streaming stores: a quarter of the last-level "
       "cache (unset)",
       "benchmarks.md: Streaming stores where the last-level cache is a server's (2026-12-06)"},
      kInPlace,
      kInPlaceAllReduceOutnumbered,
      kTwoShot,
      kTwoShotOutnumbered,
      kTwoShotTwoMembers,
      {"FG_HIER_MIN_BYTES", d.hier_min_bytes, "an all-gather across servers runs hierarchical instead of direct",
       "multinode.md: Measured here (loopback)"},
      {"FG_NET_PIECE_BYTES", d.net_piece_bytes, "the largest UCX message between servers",
       "not measured: a round size, at which a collective's 32766 piece numbers cover 32 GiB of one block (larger blocks take larger pieces)"},
      kSumWhole,
  };
}

namespace {

std::string size_words(size_t b) {
  if (b == 0) return "this machine's";
  if (b % (1 << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b % (1 << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} bytes", b);
}

}  // namespace

std::string thresholds_table() {
  std::string t = "| threshold | per member | decides | set by |\n| --- | --- | --- | --- |\n";
  for (const Threshold& th : thresholds()) {
    t += fmt::format("| `{}` | {} | {} | {} |\n", th.name, size_words(th.bytes), th.decides, th.measured);
  }
  return t;
}

}  // namespace fastgather::algo
