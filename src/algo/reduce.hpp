// Reductions over a group's shared-memory channel: reduce-scatter and
// all-reduce, in lockstep steps like the all-gather. The schedules move bytes
// and say which sources make which destination; the arithmetic is the op's
// (a Sum), as the fused op's GEMM is the all-gather sink's business.
//
// Every element is summed by one member from all members' sources in member
// order (0, 1, ..., n-1), whatever order the posts arrived in: equal inputs
// give equal bits on every run, and an all-reduce's result is the same on
// every member.
#pragma once

#include <cstddef>

#include "algo/allgather.hpp"
#include "algo/function_ref.hpp"
#include "algo/plan.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/shm_channel.hpp"

namespace fastgather::algo {

// sum(dst, srcs, n, bytes): dst = srcs[0] + ... + srcs[n-1], element-wise,
// in that order. dst may be one of the sources (then it is read first).
using Sum = FunctionRef<void(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes)>;

// Which bytes of an all-reduce each member sums in two-shot: chunk m starts at
// first(m) bytes and holds size(m) (whole cache lines but the last; some may
// be empty).
struct Chunks {
  size_t total = 0, each = 0;
  Chunks(size_t total_bytes, int members, size_t align);
  size_t first(int m) const { return std::min(total, each * static_cast<size_t>(m)); }
  size_t size(int m) const { return std::min(each, total - first(m)); }
};

// call.op kReduceScatter: call.input holds n chunks of call.bytes / n bytes;
// out (call.bytes / n) = the sum of every member's chunk me.
// call.op kAllReduce: out (call.bytes) = the sum of every member's input;
// out may be call.input. `plan` is plan_call's for the call.
// Coroutines: `sum`, `plan` and what call points to must outlive them.
engine::Task<Status> reduce(transport::ShmChannel& channel, GatherCall call, const CallPlan& plan, std::byte* out,
                            Sum sum);

}  // namespace fastgather::algo
