// How a call will run, decided once before its first step: the schedule, the
// protocol among the members on this server, and how large a step or a
// message is. Every path follows the plan and CallStats reports it.
//
// A plan is made from what every member agrees on (the call's size and shape,
// the op, the group's layout and settings), so every member makes the same
// one. Two things are left to the call itself, decided by all members from
// the same posts: whether single copy falls back to copy-in/copy-out (an
// owner's memory is not worth reading that way), and whether any block is
// read in place (it lies in its owner's symmetric heap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "algo/call.hpp"
#include "algo/thresholds.hpp"
#include "fastgather/schedule.hpp"
#include "fastgather/status.hpp"
#include "transport/channel.hpp"

namespace fastgather::algo {

enum class Protocol : uint8_t {
  kInline,      // bytes ride in the post line: one cache-line transfer per peer
  kCopyInOut,   // copy in to the own ring, peers copy out, in pipeline steps
  kSingleCopy,  // peers read the owner's input straight into their output, then
                // a second step says they are done (falls back to copy-in/copy-out)
};
const char* protocol_name(Protocol p);

// What a plan needs to know of the group: its layout across servers and what
// its channels can do (data: a schedule never asks which channel it runs on).
struct GroupShape {
  Topology topo;
  // What the channels can do: among the members on this server (shared
  // memory), and between servers (UCX; set by the communicator where the
  // group spans servers).
  transport::Capabilities local;
  transport::Capabilities net;
  // Between servers when each holds one member: the steps over UCX
  // (transport/net_steps.hpp) that the schedules within a server run on
  // (max_step_bytes 0: none).
  transport::Capabilities steps;
  // The job's ranks on this server are more than its cores (every member on
  // a server sees the same).
  bool outnumbered = false;
  std::string_view label;     // the group, for errors
  static GroupShape of(const transport::Channel& local, const Topology& topo, bool outnumbered);
};

struct CallPlan {
  Schedule asked = Schedule::kAuto;       // what the op was asked for (members must agree)
  Schedule schedule = Schedule::kOneShot;  // what runs: never kAuto
  Protocol protocol = Protocol::kInline;   // among the members on this server
  // Bytes per shared-memory step (inline: the whole block). A reduce-scatter
  // (and a two-shot all-reduce) sends a piece to every peer in each step:
  // the bytes for one peer.
  size_t piece = 0;
  size_t read_piece = 0;   // single copy: bytes per process_vm_readv
  size_t relay_piece = 0;  // hierarchical: bytes per relay step through the leader's ring
  size_t net_piece = 0;    // across servers: bytes per UCX message
  bool in_place = false;   // a block in its owner's symmetric heap may be read there
  // A sum across servers run one-shot: the all-gather planned here gathers
  // every input, then each member sums (else: across.hpp's hierarchical sum).
  bool gathers_inputs = false;
  // The group has one member on each server, and the schedule (one-shot,
  // ring, two-shot: planned as within a server) runs over the steps between
  // them (GroupShape::steps) instead of the exchange of across.hpp.
  bool over_steps = false;
  Status error;            // this call cannot run (nothing has been posted)
};

CallPlan plan_call(const GroupShape& group, const GatherCall& call);

// The header every member posts for this call (the asked and the planned
// schedule and the protocol in it), and its words for errors; the protocol
// is named where it differs from `other`'s.
transport::PostHeader header_of(const GatherCall& call, const CallPlan& plan);
std::string describe(const GatherCall& call, const transport::PostHeader& h, const transport::PostHeader* other = nullptr);

// The rules plan_call follows, in its order, as docs/architecture.md shows
// them (a test holds the two together); `example` is a call each row decides.
// The examples' groups have channels that can do what `within` (among the
// members of a server) and `between` (across servers) say: the caller names
// the channels, the plan knows none.
struct PlanRow {
  std::string when, plan, cost;
  GatherCall example;
  GroupShape group;
};
std::vector<PlanRow> plan_table(const transport::Capabilities& within, const transport::Capabilities& between);

// The sizes at which a plan changes its mind, each with the benchmark that
// set it: algo/thresholds.hpp.

// Largest piece a step holds for this alignment (0: a row does not fit one
// step).
size_t max_piece(size_t max_step_bytes, size_t align);
inline size_t max_piece(const transport::Channel& channel, size_t align) {
  return max_piece(channel.capabilities().max_step_bytes, align);
}

// Size-based choice across servers (kAuto: by size): direct while a message
// is small, hierarchical once it is large enough that sending each block to
// every member of a server costs more than the relay within it.
// hier_min_bytes (Settings, FG_HIER_MIN_BYTES) is the crossover.
Schedule choose_schedule(const Topology& topo, size_t bytes_per_member, Schedule asked, size_t hier_min_bytes);

// Largest piece a UCX message carries: `configured` (Settings,
// FG_NET_PIECE_BYTES; at least 4 KiB) in whole rows of `align`, larger where
// the channel cannot number the pieces (max_pieces, 0: no limit; UCX's
// 16 tag bits).
size_t net_piece_bytes(size_t bytes, size_t align, size_t configured, uint32_t max_pieces);

}  // namespace fastgather::algo
