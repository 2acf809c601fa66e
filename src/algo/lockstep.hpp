// The one step every schedule is made of, over any channel
// (transport/channel.hpp): post, then wait for the peers' posts of the same
// step. No member is ever more than one step ahead of the peers it waits
// for, which is what lets a channel reuse its post lines and buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algo/call.hpp"
#include "algo/copy_in.hpp"
#include "algo/function_ref.hpp"
#include "algo/plan.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/channel.hpp"

namespace fastgather::algo {

// What one call's steps share: the channel, the call and its plan, the
// header every step carries, and what the steps have found.
struct CallState {
  CallState(transport::Channel& channel, const GatherCall& c, const CallPlan& p)
      : ch(channel), caps(channel.capabilities()), call(c), plan(p), mine(header_of(c, p)) {}

  transport::Channel& ch;
  const transport::Capabilities caps;
  const GatherCall& call;
  const CallPlan& plan;
  const transport::PostHeader mine;
  bool first = true;      // the next step is the call's first: it compares headers
  std::string mismatch;   // what differed, once a peer's header did
  int disagreeing = -1;   // world rank of the first peer whose header differed
  bool in_place = false;  // some member's block was read in its heap: everyone says "done" at the end
  bool sent_in_place = false;  // this member sent bytes from where they lie: they must leave before the call ends

  Status mismatch_status() const;
};

// This member's part of one step.
struct Step {
  bool inline_data = false;  // the bytes ride with the post (at most capabilities().inline_bytes)
  const std::byte* data = nullptr;
  size_t len = 0;
  CopyIn how = CopyIn::kCached;  // into the ring
  // The bytes may be posted where they lie (read there in this member's
  // heap region, or sent from there: Channel::in_place) when the plan
  // allows it: they stay unchanged until the call ends.
  bool may_be_in_place = false;
  // The step's header: the call's (CallState::mine) unless set. The relay
  // says in it whose bytes it carries.
  const transport::PostHeader* header = nullptr;
  int only_from = -1;  // wait for this member's post alone (-1: every peer's)
  // Writes the step's len bytes into the ring in place of copying them from
  // data (a step gathered from several places of the input).
  const FunctionRef<void(std::byte* ring)>* fill = nullptr;
  // Which peers read which of the step's bytes (a channel that sends each
  // peer its own copy sends only those).
  transport::Readers readers = {};
  // Where a peer's bytes of this step are to land (its room at *room), for a
  // channel that receives in place (Capabilities::receives_in_place); null
  // or nullptr returned: wherever the channel keeps them.
  const FunctionRef<std::byte*(int peer, size_t* room)>* land = nullptr;
};

// The order in which a member waits for its peers' posts of a step: first
// the peers that last posted from the CPU this member runs on (they post
// only once it lets them have the CPU, so their waits start by yielding:
// Waiter::comes_from_cpu), then the others, for which spinning may pay; each
// kind from the next member on, so that peers do not all read the same one
// first. cpu_of(m): the CPU member m last posted from (-1: unknown).
class PeerOrder {
 public:
  PeerOrder(int members, int me, int my_cpu, FunctionRef<int(int)> cpu_of);
  int size() const { return n_; }
  int operator[](int i) const { return data()[i]; }

 private:
  const int* data() const { return heap_.empty() ? in_place_.data() : heap_.data(); }
  static constexpr int kInPlace = 16;  // no allocation for the usual group sizes
  int n_ = 0;
  std::array<int, kInPlace> in_place_{};
  std::vector<int> heap_;
};

// take(peer, header, src): a peer's post of this step; src is where its bytes
// are readable (in its post line, ring or heap; over the network, the part
// this member reads: see Readers) until this member posts again.
using Take = FunctionRef<void(int peer, const transport::PostHeader& header, const std::byte* src)>;

// One step: publish the step's bytes, call `posted`, then wait for each
// peer's post of the same step (in PeerOrder), compare headers on the call's
// first step and hand each post to `take`. Every peer is waited for even
// after a mismatch, so all members leave the call at the same step; after
// one, take is not called.
engine::Task<Status> lockstep(CallState& st, const Step& step, FunctionRef<void()> posted, Take take);

// The end of a call's steps: "done reading" where a block was read in its
// owner's heap, and this member's bytes sent from where they lie gone.
engine::Task<Status> finish(CallState& st);

// "Done reading": a step with nothing in it. An owner whose input peers
// read where it lies (CallState::in_place) leaves only after every peer has
// posted this.
engine::Task<Status> done_reading(CallState& st);

}  // namespace fastgather::algo
