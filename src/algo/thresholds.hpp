// Every size at which a plan changes its mind, in one table: the constant
// (or the FG_* setting whose default it is), what it decides, and the
// benchmark that set it. plan_call reads the constants below and the
// settings; docs/architecture.md shows thresholds() as it is (a test holds
// the two together, and finds every benchmark cited).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fastgather::algo {

struct Threshold {
  const char* name;      // the constant, or the setting whose default it is
  size_t bytes;          // per member (0: derived from the machine, see `decides`)
  const char* decides;
  // Where it was measured: "FILE.md: HEADING", a heading of that file in
  // docs/; or "not measured: WHY".
  const char* measured;
};

// From this size a block in its owner's symmetric heap is read there, in
// place, for one more round at the end ("done reading") instead of a copy
// into the ring: below it the extra round costs what the copy saves.
inline constexpr Threshold kInPlace{
    "kInPlaceMinBytes", 4 << 10,
    "a block in its owner's symmetric heap is read there (one more step) instead of copied into the ring",
    "benchmarks.md: Symmetric inputs (issue 12, 2026-12-03)"};
// An all_reduce where the job's ranks outnumber the cores reads inputs in
// place only from this size: an input its owner has just written reaches a
// reader on the other core as a copy in the owner's ring does, and below it
// the "done reading" step costs more than the owner's local copy saves.
inline constexpr Threshold kInPlaceAllReduceOutnumbered{
    "kInPlaceMinBytesAllReduceOutnumbered", 256 << 10,
    "the same for an all_reduce where the job's ranks on the server outnumber its cores",
    "benchmarks.md: Two-shot from 32 KiB where ranks outnumber cores (2026-12-05, evening)"};
// From this size per member an all-reduce of 3 or more members runs
// two-shot: each member reads its chunk of everyone's input and the sums once
// more, instead of everyone's whole input.
inline constexpr Threshold kTwoShot{
    "kTwoShotMinBytes", 256 << 10, "an all_reduce of 3+ members runs two-shot",
    "benchmarks.md: Reductions: reduce_scatter, all_reduce, matmul_reduce_scatter (issue 23, 2026-12-05)"};
// Where the job's ranks outnumber the cores, from this size: ranks that share
// a core take turns, so the lines a peer has just written into its ring
// reach the reader from the other core: one-shot pulls every peer's input
// whole that way, two-shot 2/n of it, and the extra step costs no sleep
// between ranks that yield to each other.
inline constexpr Threshold kTwoShotOutnumbered{
    "kTwoShotMinBytesOutnumbered", 32 << 10,
    "an all_reduce of 3+ members runs two-shot where the job's ranks on the server outnumber its cores",
    "benchmarks.md: Two-shot from 32 KiB where ranks outnumber cores (2026-12-05, evening)"};
// An all-reduce of 2 members runs two-shot from this size, whether its ranks
// outnumber the cores or not: each member then copies half its input into
// its ring instead of all of it and sums half, for one more step; a private
// or freshly written input is summed faster from here. An input in the heap
// that nobody has written since the last call is not (one-shot reads it
// from the reader's own cache), nor, in those runs, one read in place at
// 512 KiB by pairs whose ranks outnumber the cores.
inline constexpr Threshold kTwoShotTwoMembers{"kTwoShotMinBytesTwoMembers", 128 << 10,
                                              "an all_reduce of 2 members runs two-shot",
                                              "benchmarks.md: Two-shot for two members (issue 23, 2026-12-06)"};
// Up to this size per member an all_reduce across servers is summed whole
// within each server (one step: every member sums all of its server's
// inputs, as the one-shot does) and every member exchanges all of its
// partial sums, so that no step is needed to share the sums afterwards:
// for a small sum the steps cost more than the bytes. Measured with 2
// servers of 2 ranks on 2 cores: as fast or faster up to 16 KB, level at
// 32 KB, slower at 64 KB.
inline constexpr Threshold kSumWhole{
    "kSumWholeMaxBytes", 32 << 10,
    "up to this size an all_reduce across servers is summed whole within each server and exchanged whole",
    "benchmarks.md: Sums across servers: hierarchical (issue 23, 2026-12-05)"};

// On a crowded host (Channel::crowded) an owner offers its
// block for single copy up to this size per member even where it lies in
// 4 KiB pages: each ring step waits for every member to be scheduled, which
// costs a time slice there, and single copy takes two steps. Beyond it the
// kernel's pinning of 4 KiB pages costs more than the steps it saves (6 MB:
// level or slower than the ring under 2 busy processes).
inline constexpr Threshold kCrowdedSingleCopy{
    "kCrowdedSingleCopyMaxBytes", 2 << 20,
    "on a crowded host a one-shot all-gather on one server reads ordinary (4 KiB-page) inputs by single copy up to "
    "this size",
    "benchmarks.md: Blocking calls on the caller's thread, single copy on a crowded host (issue 38, 2026-12-07, night)"};

inline constexpr size_t kInPlaceMinBytes = kInPlace.bytes;
inline constexpr size_t kInPlaceMinBytesAllReduceOutnumbered = kInPlaceAllReduceOutnumbered.bytes;
inline constexpr size_t kTwoShotMinBytes = kTwoShot.bytes;
inline constexpr size_t kTwoShotMinBytesOutnumbered = kTwoShotOutnumbered.bytes;
inline constexpr size_t kTwoShotMinBytesTwoMembers = kTwoShotTwoMembers.bytes;
inline constexpr size_t kSumWholeMaxBytes = kSumWhole.bytes;
inline constexpr size_t kCrowdedSingleCopyMaxBytes = kCrowdedSingleCopy.bytes;

// The constants above and the defaults of the settings that size how a call
// runs (FG_SINGLE_COPY_MIN_BYTES, FG_HIER_MIN_BYTES, FG_NET_PIECE_BYTES,
// FG_PIPELINE_BYTES, FG_STREAM_OUT_BYTES), in one list.
std::vector<Threshold> thresholds();

// The table as docs/architecture.md holds it (Markdown rows, a header first).
std::string thresholds_table();

}  // namespace fastgather::algo
