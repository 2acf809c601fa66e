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

#include "algo/call.hpp"
#include "algo/function_ref.hpp"
#include "algo/plan.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/channel.hpp"

namespace fastgather::algo {

// sum(offset, srcs, n, bytes): bytes [offset, offset+bytes) of the op's
// result = srcs[0] + ... + srcs[n-1], element-wise, in that order. The
// result may be where one of the sources lies (then it is read first).
using Sum = FunctionRef<void(size_t offset, const std::byte* const* srcs, int n, size_t bytes)>;
// produce(member, offset, len, dst): writes bytes [offset, offset+len) of the
// chunk of this member's input that `member` sums, at dst.
using Produce = FunctionRef<void(int member, size_t offset, size_t len, std::byte* dst)>;

// call.op kReduceScatter: call.input holds n chunks of call.bytes / n bytes;
// the result (call.bytes / n) is the sum of every member's chunk me (also
// kMatmulReduceScatter given its product whole: reduce_scatter_produced's
// steps, the pieces copied from call.input).
// call.op kAllReduce: the result (call.bytes, at out: the second half of
// two-shot copies the others' sums there) is the sum of every member's
// input; out may be call.input. `plan` is plan_call's for the call.
// Coroutines: `sum`, `plan` and what call points to must outlive them.
engine::Task<Status> reduce(transport::Channel& channel, GatherCall call, const CallPlan& plan, std::byte* out,
                            Sum sum);

// A reduce-scatter whose input is made as it is sent (call.op
// kMatmulReduceScatter: rows of a product): the pieces for the peers are
// produced straight into the ring, this member's own after its post, into
// `scratch` (plan.piece bytes), while the peers make theirs.
engine::Task<Status> reduce_scatter_produced(transport::Channel& channel, GatherCall call, const CallPlan& plan,
                                             Produce produce, std::byte* scratch, Sum sum);

}  // namespace fastgather::algo
