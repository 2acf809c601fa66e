#include "algo/reduce.hpp"

#include <algorithm>
#include <vector>

#include "algo/copy_in.hpp"
#include "algo/lockstep.hpp"
#include "algo/reduce_steps.hpp"
#include "transport/shm_heap.hpp"

namespace fastgather::algo {

namespace {

size_t part(size_t size, size_t off, size_t most) { return size > off ? std::min(most, size - off) : 0; }

}  // namespace

engine::Task<Status> scatter_sums(CallState& st, const Chunks& chunks, size_t at, Sum sum, const Produce* produce,
                                  std::byte* scratch) {
  transport::Channel& ch = st.ch;
  const GatherCall& call = st.call;
  const int n = ch.members();
  const int me = ch.me();
  const bool inline_data = st.plan.protocol == Protocol::kInline && produce == nullptr;
  // The input posted where it lies (read there in this member's heap, or
  // each peer sent its piece from there), unless it is made as it is sent.
  const bool where_it_lies = produce == nullptr && st.plan.in_place && call.bytes != 0 &&
                         ch.in_place(call.input, call.bytes).has_value();
  const size_t sub = inline_data ? std::max<size_t>(chunks.each, 1) : st.plan.piece;
  Sources srcs(n);
  for (size_t off = 0; st.first || off < chunks.each; off += sub) {
    const size_t stride = part(chunks.each, off, sub);  // every member's piece has room for this much
    const size_t len_me = part(chunks.size(me), off, stride);
    auto fill = [&](std::byte* ring) {
      for (int d = 0; d < n; ++d) {
        const size_t len = part(chunks.size(d), off, stride);
        if (d == me || len == 0) continue;
        std::byte* to = ring + static_cast<size_t>(d) * stride;
        if (produce != nullptr) (*produce)(d, off, len, to);
        else copy_into_ring(CopyIn::kCached, to, call.input + chunks.first(d) + off, len);
      }
    };
    FunctionRef<void(std::byte*)> fill_ref(fill);
    Step step{.inline_data = inline_data, .data = call.input, .len = call.bytes};
    if (where_it_lies) {
      step.may_be_in_place = true;
      step.readers = {.each = chunks.each, .base = off, .length = stride};  // member d: its chunk's piece
    } else if (!inline_data) {
      step.len = stride * static_cast<size_t>(n);
      step.fill = &fill_ref;
      step.readers.each = stride;  // member d reads piece d
    }
    // The own piece is made while the peers make theirs.
    auto posted = [&] {
      if (produce != nullptr && len_me != 0) (*produce)(me, off, len_me, scratch);
    };
    auto take = [&](int peer, const transport::PostHeader& h, const std::byte* src) {
      // Posted whole (inline, or the input in the peer's heap), or a piece
      // per member, this member's where the channel says it is.
      srcs[static_cast<size_t>(peer)] = inline_data || h.in_heap != 0 ? src + chunks.first(me) + off
                                                                      : ch.bytes(peer, ch.last_step(), false, static_cast<size_t>(me) * stride);
    };
    Status s = co_await lockstep(st, step, posted, take);
    if (!s.ok()) co_return s;
    if (!st.mismatch.empty()) co_return st.mismatch_status();
    if (len_me != 0) {
      srcs[static_cast<size_t>(me)] = produce != nullptr ? scratch : call.input + chunks.first(me) + off;
      sum(at + off, srcs.data(), n, len_me);
    }
  }
  co_return Status::Ok();
}

engine::Task<Status> share_sums(CallState& st, const Chunks& chunks, std::byte* out) {
  transport::Channel& ch = st.ch;
  const int me = ch.me();
  const size_t piece = st.plan.piece * static_cast<size_t>(ch.members());
  for (size_t off = 0; off == 0 || off < chunks.each; off += piece) {
    // A channel that receives in place puts each peer's sums straight where
    // they go (and take copies nothing).
    auto land = [&](int peer, size_t* room) -> std::byte* {
      *room = part(chunks.size(peer), off, piece);
      return out + chunks.first(peer) + off;
    };
    const FunctionRef<std::byte*(int, size_t*)> land_ref(land);
    const Step step{.data = out + chunks.first(me) + off, .len = part(chunks.size(me), off, piece), .may_be_in_place = true,
                    .land = &land_ref};
    auto nothing = [] {};
    auto take = [&](int peer, const transport::PostHeader&, const std::byte* src) {
      std::byte* dst = out + chunks.first(peer) + off;
      if (const size_t len = part(chunks.size(peer), off, piece); len != 0 && dst != src) copy_out(dst, src, len, false);
    };
    Status s = co_await lockstep(st, step, nothing, take);
    if (!s.ok()) co_return s;
  }
  co_return Status::Ok();
}

engine::Task<Status> sum_everything(CallState& st, const std::byte* out, Sum sum) {
  transport::Channel& ch = st.ch;
  const GatherCall& call = st.call;
  const int n = ch.members();
  const int me = ch.me();
  const bool inline_data = st.plan.protocol == Protocol::kInline;
  // In place (out is the input) a peer must not read the input where it
  // lies: this member overwrites each piece once it has summed it.
  const bool own_heap = call.input != out;
  Sources srcs(n);
  for (size_t off = 0; st.first || off < call.bytes;) {
    const size_t len = std::min(st.plan.piece, call.bytes - off);
    const Step step{.inline_data = inline_data, .data = call.input + off, .len = len, .may_be_in_place = own_heap};
    auto nothing = [] {};
    auto take = [&](int peer, const transport::PostHeader&, const std::byte* src) { srcs[static_cast<size_t>(peer)] = src; };
    Status s = co_await lockstep(st, step, nothing, take);
    if (!s.ok()) co_return s;
    if (!st.mismatch.empty()) co_return st.mismatch_status();
    if (len != 0) {
      srcs[static_cast<size_t>(me)] = call.input + off;
      sum(off, srcs.data(), n, len);
    }
    off += len;
  }
  co_return Status::Ok();
}

engine::Task<Status> reduce(transport::Channel& ch, GatherCall call, const CallPlan& plan, std::byte* out, Sum sum) {
  if (!ch.broken().ok()) co_return ch.broken();
  if (!plan.error.ok()) co_return plan.error;
  const int n = ch.members();
  if (n == 1) {  // the sum of one: the input
    if (call.bytes != 0) sum(0, &call.input, 1, call.bytes);
    co_return Status::Ok();
  }
  CallState st(ch, call, plan);
  Status s;
  if (call.op == OpCode::kAllReduce && plan.schedule == Schedule::kOneShot) {
    s = co_await sum_everything(st, out, sum);
  } else if (call.op == OpCode::kAllReduce) {
    const Chunks chunks(call.bytes, n, call.align);
    s = co_await scatter_sums(st, chunks, chunks.first(ch.me()), sum);
    if (s.ok()) s = co_await share_sums(st, chunks, out);
  } else {
    s = co_await scatter_sums(st, Chunks::equal(call.bytes, n), 0, sum);
  }
  if (!s.ok()) co_return s;
  // Peers may still read what lies in this member's heap (nobody leaves
  // before everyone is done), or its sends be on their way.
  co_return co_await finish(st);
}

engine::Task<Status> reduce_scatter_produced(transport::Channel& ch, GatherCall call, const CallPlan& plan,
                                             Produce produce, std::byte* scratch, Sum sum) {
  if (!ch.broken().ok()) co_return ch.broken();
  if (!plan.error.ok()) co_return plan.error;
  CallState st(ch, call, plan);
  co_return co_await scatter_sums(st, Chunks::equal(call.bytes, ch.members()), 0, sum, &produce, scratch);
}

}  // namespace fastgather::algo
