// How the ops run an all-gather schedule on a group: within one server, or
// across servers (with the failure reasons members publish to each other).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>
#include <optional>

#include <fmt/format.h>

#include "algo/allgather.hpp"
#include "algo/across.hpp"
#include "algo/plan.hpp"
#include "core/group_impl.hpp"
#include "fastgather/ops.hpp"
#include "ops/request.hpp"

namespace fastgather::ops {

// The group's plan for a call (algo::plan_call), with the group's settings.
inline algo::CallPlan plan_for(Group& g, algo::GatherCall& call) {
  call.settings = &impl_of(g)->settings;
  return algo::plan_call(impl_of(g)->shape, call);
}

// The words for a call across servers that failed (was_broken: the group
// had failed before it). Says what this member saw at once, if it names both
// calls (headers_compared); otherwise what another member saw may say more
// (a truncated message has no header; a lost peer may have left over a
// mismatch it saw).
inline Status explain_across(Group::Impl& i, Status s, bool was_broken, bool headers_compared) {
  if (s.ok() || was_broken || (s.kind() != ErrorKind::kMismatch && s.kind() != ErrorKind::kPeerLost)) return s;
  const bool told = s.kind() == ErrorKind::kMismatch && headers_compared;
  if (told) i.publish_failure(s);
  if (auto why = told ? std::nullopt : i.published_failure(); why && why->message() != s.message()) {
    s = s.kind() == ErrorKind::kPeerLost ? Status{why->kind(), fmt::format("{} (after: {})", why->message(), s.message())}
                                         : Status{s.kind(), fmt::format("{}; {}", s.message(), why->message())};
  }
  if (!told && s.kind() == ErrorKind::kMismatch) i.publish_failure(s);
  return s;
}

// Runs `call` across servers (gather_across, sum_across: a Task starts only
// when awaited) and says its failure in explain_across's words; `st` is the
// stats the call fills.
inline engine::Task<Status> explained(Group::Impl& i, engine::Task<Status> call, const algo::GatherStats& st) {
  const bool was_broken = !i.net->broken().ok() || !i.channel->broken().ok();
  Status s = co_await call;
  RequestAccess::flush_in_background(i);
  co_return explain_across(i, std::move(s), was_broken, st.headers_compared);
}

// Runs `call`, a schedule over the steps between servers (plan.over_steps),
// and says its failure: members that disagreed all saw it in the same step
// (lockstep compares every header), and the group stays usable, as within a
// server; a lost member may have said why it left.
inline engine::Task<Status> over_steps(Group::Impl& i, engine::Task<Status> call) {
  const bool was_broken = !i.net->broken().ok();
  Status s = co_await call;
  RequestAccess::flush_in_background(i);
  if (s.kind() != ErrorKind::kPeerLost) co_return s;
  co_return explain_across(i, std::move(s), was_broken, false);
}

// Runs `plan` (plan_for's for this call) on the group: within one server, or
// across. stats, when set, says how it ran and where the time went. A
// coroutine: `sink` must outlive it.
inline engine::Task<Status> run_gather(Group& g, algo::GatherCall call, algo::CallPlan plan, algo::PieceSink sink,
                                       CallStats* stats = nullptr) {
  Group::Impl& i = *impl_of(g);
  call.settings = &i.settings;
  algo::GatherStats st;
  call.stats = &st;
  Status s;
  if (i.net == nullptr) {
    if (stats == nullptr) co_return co_await algo::gather(*i.channel, call, plan, sink);  // the hot path: no clock reads
    const auto t0 = std::chrono::steady_clock::now();
    s = co_await algo::gather(*i.channel, call, plan, sink);
    st.intra_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  } else if (plan.over_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    s = co_await over_steps(i, algo::gather(*i.steps, call, plan, sink));
    st.inter_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  } else {
    s = co_await explained(i, algo::gather_across(*i.channel, *i.net, i.shape.topo, call, plan, sink), st);
  }
  if (stats != nullptr) {
    // Single copy that fell back ran copy-in/copy-out.
    const algo::Protocol ran = plan.protocol == algo::Protocol::kSingleCopy && !st.single_copy ? algo::Protocol::kCopyInOut
                                                                                                : plan.protocol;
    *stats = {plan.schedule,  algo::protocol_name(ran), plan.piece,    st.intra_ns,
              st.inter_ns,    st.single_copy,           st.streamed_in, st.in_place};
  }
  co_return s;
}

// Every member's block, sizes[m] bytes (this member's at `input`), each
// piece handed to `sink` as it arrives: the all-gather schedule that the
// uneven all-gather, gather, scatter and all_to_all share, so each runs
// within a server and across servers the same way. The sizes travel in the
// header (their hash, in aux) with `op`: members that disagree on either get
// a mismatch. `landing` (same presence on every member): where each block is
// kept whole, which single copy and the schedules across servers need; null,
// then nothing is read by single copy and the group must be on one server.
// `part` (algo::GatherCall::part): across servers, each member is sent only
// the bytes of each block it keeps, and `landing` says where they go.
inline engine::Task<Status> gather_blocks(Group& group, algo::OpCode op, uint32_t dtype, const std::byte* input,
                                          std::vector<size_t> sizes, algo::FunctionRef<std::byte*(int)>* landing,
                                          bool stream_out, algo::PieceSink sink, Schedule schedule = Schedule::kAuto,
                                          CallStats* stats = nullptr, uint64_t also = 0,
                                          algo::FunctionRef<size_t(int, int, size_t*)>* part = nullptr,
                                          algo::FunctionRef<const std::byte*(int)>* part_from = nullptr,
                                          algo::FunctionRef<engine::Task<Status>()>* local_phase = nullptr) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over the sizes, then `also` (a root)
  auto mix = [&hash](uint64_t v) {
    for (int i = 0; i < 8; ++i) hash = (hash ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  };
  for (size_t b : sizes) mix(b);
  mix(also);
  algo::GatherCall call;
  call.op = op;
  call.dtype = dtype;
  call.input = input;
  call.schedule = schedule;
  call.bytes = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  call.sizes = sizes.data();
  call.aux = hash;
  call.landing = landing;
  call.part = part;
  call.part_from = part_from;
  call.local_phase = local_phase;
  call.copy_in = &impl_of(group)->copy_in;
  call.stream_out = stream_out;
  co_return co_await run_gather(group, call, plan_for(group, call), sink, stats);
}

}  // namespace fastgather::ops
