// What a channel can do, as data: the planner (algo::GroupShape, plan_call)
// reads it to choose protocols and sizes, so no schedule asks which kind of
// channel it runs on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastgather::transport {

struct Capabilities {
  // Bytes that ride with a step's announcement itself (the shared-memory
  // post line): one transfer per peer (0: none).
  size_t inline_bytes = 0;
  // The largest step a member can post at once (0: no limit), and the step a
  // large block is streamed in so that readers start on its first piece while
  // its owner copies the next (0: max_step_bytes).
  size_t max_step_bytes = 0;
  size_t pipeline_bytes = 0;
  // The most pieces one member's bytes of a call may be cut into (0: no
  // limit): UCX messages are numbered by 16 bits of their tag.
  uint32_t max_pieces = 0;
  // A member can read a peer's memory straight into its own (single copy).
  bool reads_peer_memory = false;
  // The members map each other's symmetric heap: a block there is read in place.
  bool shared_heap = false;
  // Every piece of a call may be posted at once, received straight where it
  // lands (UCX); otherwise steps are paced by the peers' reading (a ring).
  bool many_in_flight = false;
  // A step's bytes are sent from where they lie (no copy into the channel;
  // Channel::sent() says when they have left), and a peer's are received
  // where the schedule says they land (Channel::land): the steps over UCX.
  bool sends_from_source = false;
  bool receives_in_place = false;
};

}  // namespace fastgather::transport
