// All-gather for a group that spans servers: shared memory among the members
// on this server (allgather.hpp), UCX to the others (transport/net_channel).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/allgather.hpp"
#include "algo/plan.hpp"
#include "transport/net_channel.hpp"

namespace fastgather::algo {

// Runs `plan` (plan_call's for this call: direct or hierarchical). On failure both channels are broken, so every later call
// on the group fails at once. A coroutine, like gather().
// The pieces one block is sent in (UCX messages of at most `piece` bytes;
// an empty block is one piece: the header alone).
struct Pieces {
  size_t bytes, piece;
  uint32_t count() const { return bytes == 0 ? 1 : static_cast<uint32_t>((bytes + piece - 1) / piece); }
  size_t offset(uint32_t p) const { return static_cast<size_t>(p) * piece; }
  size_t length(uint32_t p) const { return std::min(piece, bytes - offset(p)); }
};

// Whether a message received for this call (a PostHeader, then `want`
// bytes; `length` in all) is what this member expects: a kMismatch naming
// both sides' calls otherwise. `of` says whose piece it is, for the words.
struct MessageOf {
  int owner;         // the member whose bytes it carries
  uint32_t piece;
  const char* what;  // "block", "partial sums"
};
Status check_message(const transport::NetChannel& net, const GatherCall& call, const transport::PostHeader& mine,
                     const transport::PostHeader& theirs, size_t length, size_t want, MessageOf of);

// Nanoseconds since t, for the stats' split of a call's time.
inline double ns_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count();
}

// One call across servers, run by `run` (its body(callno) and what it
// found: intra_ns, the time of its server-local phases, and
// headers_compared): refused at once where a channel has broken or the plan
// says no; on failure both channels are broken, so that nobody on this
// server waits for a step that will not come and what is in flight is
// dropped; stats, when set, get the intra- and inter-server times.
template <class Run>
engine::Task<Status> run_across(transport::ShmChannel& local, transport::NetChannel& net, const CallPlan& plan,
                                GatherStats* stats, Run& run) {
  if (!net.broken().ok()) co_return net.broken();
  if (!local.broken().ok()) co_return local.broken();
  if (!plan.error.ok()) co_return plan.error;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = co_await run.body(net.next_call());
  if (!s.ok()) {
    net.fail(s);
    local.abort(s);
  }
  if (stats != nullptr) {
    stats->intra_ns = run.intra_ns;
    stats->inter_ns = ns_since(t0) - run.intra_ns;
    stats->headers_compared = run.headers_compared;
  }
  co_return s;
}

engine::Task<Status> gather_across(transport::ShmChannel& local, transport::NetChannel& net, const Topology& topo,
                                   GatherCall call, const CallPlan& plan, PieceSink sink);

}  // namespace fastgather::algo
