// The schedules of a group that spans servers: compositions of a schedule
// within each server over the shared-memory channel (allgather.hpp,
// reduce.hpp) and an exchange between servers over the UCX channel
// (transport/net_channel.hpp). The one place in src/algo that knows both
// transports.
//
// All-gather (plan_call's schedule):
// - direct: every member sends its block to every member on other servers,
//   having posted its receives straight into their landing places, and runs
//   the one-shot gather within its server while the network works;
// - hierarchical: the one-shot gather within each server; its leader sends
//   each local block's pieces on to the other leaders as they land, and
//   relays what it receives to its server's members through its ring.
//
// Sums, hierarchical, for groups with the same number of members, L, on each
// of S servers:
// 1. Within each server, a reduce-scatter of slabs: local member j sums its
//    server's inputs of slab j into partial sums (fp32 for fp16/bf16). For
//    all_reduce, slab j is chunk j of Chunks(bytes, L) (the two-shot's first
//    half); for reduce_scatter, the chunks of members j, L+j, 2L+j, ... (one
//    on each server), made into ring pieces from where they lie.
// 2. Member j of each server sends its partial sums to member j of every
//    other server over UCX (all_reduce: the whole slab; reduce_scatter: the
//    chunk of that server's member), having posted its receives before 1.
// 3. Each sums the S partial sums in server order, a network piece at a time
//    as the pieces complete.
// 4. all_reduce: the summed slabs shared within the server (the two-shot's
//    second half).
// A small all_reduce (sums_whole) has one slab, the whole input, for every
// member: step 1 is the one-shot sum, 2 sends all of it, 4 is not needed.
// Every element is the sum of each server's members in member order, then
// of the servers' partial sums in server order: the same bits on every
// member and every run. With one member per server, step 1 is the input.
// Each member sends (S-1)/L of the input over the network (reduce_scatter:
// (S-1)/n), instead of all of it to every other server.
//
// Every message between servers goes through one Exchange (across.cpp): the
// sender's header, then one piece of one member's bytes, checked on arrival
// against the call this member runs before anyone reads it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/allgather.hpp"
#include "algo/function_ref.hpp"
#include "algo/plan.hpp"
#include "algo/reduce.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/net_channel.hpp"
#include "transport/channel.hpp"

namespace fastgather::algo {

// The pieces one block is sent in (UCX messages of at most `piece` bytes;
// an empty block is one piece: the header alone).
struct Pieces {
  size_t bytes, piece;
  uint32_t count() const { return bytes == 0 ? 1 : static_cast<uint32_t>((bytes + piece - 1) / piece); }
  size_t offset(uint32_t p) const { return static_cast<size_t>(p) * piece; }
  size_t length(uint32_t p) const { return std::min(piece, bytes - offset(p)); }
};

// Runs `plan` (plan_call's for this call: direct or hierarchical). On
// failure both channels are broken, so every later call on the group fails
// at once. A coroutine: `sink`, `plan` and what call points to must outlive it.
engine::Task<Status> gather_across(transport::Channel& local, transport::NetChannel& net, const Topology& topo,
                                   GatherCall call, const CallPlan& plan, PieceSink sink);

// sum(dst, srcs, n, bytes): dst = srcs[0] + ... + srcs[n-1], element-wise,
// `bytes` of the op's dtype.
using SumInto = FunctionRef<void(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes)>;

struct SumsAcross {
  SumInto partial;  // sources of the dtype; partial sums (widen x the bytes) at dst
  Sum of_partials;  // sources: partial sums; the result's bytes [offset, offset+bytes)
  size_t widen = 1;  // bytes of a partial sum per byte of the dtype
  // A reduce-scatter whose input is made as it is sent (the fused op's
  // product rows, as for reduce_scatter_produced); null: read from call.input.
  const Produce* produce = nullptr;
  // Where the partial sums and the other servers' go: grown as needed and
  // kept by the caller between calls (null: allocated for the call).
  std::vector<std::byte>* work = nullptr;
};

// call.op kReduceScatter or kAllReduce, as algo::reduce (out may be the
// input for all_reduce, the own chunk of it for reduce_scatter), or
// kMatmulReduceScatter with sums.produce (out unused: of_partials writes the
// result); `plan` is plan_call's (hierarchical). On failure both channels
// are broken, as in gather_across.
engine::Task<Status> sum_across(transport::Channel& local, transport::NetChannel& net, const Topology& topo,
                                GatherCall call, const CallPlan& plan, std::byte* out, SumsAcross sums);

}  // namespace fastgather::algo
