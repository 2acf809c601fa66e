// All-gather over a group's shared-memory channel, and the size-based choice
// of protocol. An algorithm sees only the channel and a sink that receives
// each member's bytes where they can be read; what the op does with them
// (copy into an output, multiply them) is the sink's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "algo/copy_in.hpp"
#include "algo/function_ref.hpp"
#include "fastgather/settings.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/shm_channel.hpp"

namespace fastgather::algo {

enum class OpCode : uint32_t { kAllGather = 1, kAllGatherMatmul = 2, kBarrier = 3, kBroadcast = 4 };
const char* op_name(OpCode op);

enum class Protocol {
  kInline,  // bytes ride in the post line: one cache-line transfer per peer
  kCopyInOut,  // one-shot: copy in to own ring buffer, peers copy out, in pipeline steps
  kSingleCopy,  // one-shot, large: peers read the owner's input straight into their
                // output (CMA, process_vm_readv), then a second step says they are done
};

// The schedule. kOneShot is the protocol table's choice; kRingPass is the
// classic ring (n-1 steps, each member forwards the block it received last),
// kept as the multi-step comparator: more copies and a synchronisation per step.
// Across servers (allgather_net.hpp): kDirect sends every block to every
// member on another server; kHierarchical gathers within each server, lets
// one leader per server exchange the server's blocks, and relays what the
// leader received through shared memory.
enum class Schedule : uint8_t { kOneShot = 0, kRingPass = 1, kDirect = 2, kHierarchical = 3 };
const char* schedule_name(Schedule s);

// Where the time of a call went, for the benchmark's shares.
struct GatherStats {
  Schedule schedule = Schedule::kOneShot;
  double intra_ns = 0;  // the server-local (shared-memory) phase
  double inter_ns = 0;  // after it: waiting for other servers' bytes, relaying them
  // A kMismatch from comparing headers, so naming both calls (a truncated
  // network message carries no header: the sender's call is unknown).
  bool headers_compared = false;
  bool single_copy = false;  // the server-local phase read peers' blocks by single copy
  bool streamed_in = false;  // this member's block went into its ring with streaming stores
};

struct ProtocolRule {
  size_t max_bytes;  // per member, inclusive
  Protocol protocol;
  const char* name;
};
// Ordered by max_bytes; the first rule that fits is taken.
std::span<const ProtocolRule> protocol_table();
const ProtocolRule& choose_protocol(size_t bytes_per_member);

// What a call follows when it is handed no group's settings (tests that
// build a call by hand): the defaults.
const Settings& default_settings();

struct GatherCall {
  OpCode op = OpCode::kAllGather;
  uint32_t dtype = 0;
  uint64_t aux = 0;             // compared across members (k for the fused op)
  const char* aux_name = "aux";
  const std::byte* input = nullptr;
  size_t bytes = 0;             // per member
  size_t align = 1;             // every piece is a multiple of this (a row)
  Schedule schedule = Schedule::kOneShot;
  // Where member m's block ends up (the sink puts it there). The ring reads
  // forwarded blocks back from it; across servers, receives land in it
  // directly and the sink is then called with src == landing. Null: the op
  // keeps no copy (allowed within one server only).
  FunctionRef<std::byte*(int member)>* landing = nullptr;
  GatherStats* stats = nullptr;  // filled when not null
  // Learns how to copy into the ring on this machine (null: regular stores).
  CopyInChooser* copy_in = nullptr;
  // Copies into the landing places with streaming stores (copy_out): the
  // op's output is larger than the cache (streams_out).
  bool stream_out = false;
  // A broadcast: only this member's block moves (the others post empty
  // steps in step with it and the sink sees the root's bytes alone); -1:
  // every member's. One server, one-shot, no single copy.
  int root = -1;
  // The group's settings (Communicator's, from Config or the environment).
  const Settings* settings = &default_settings();
};

// sink(member, offset, src, len): bytes [offset, offset+len) of member's input
// are readable at src until the sink returns. Called for this member's own
// input too (src = input), in one piece or (the ring protocol) a piece per
// step, while peers are still copying in.
using PieceSink = FunctionRef<void(int member, size_t offset, const std::byte* src, size_t len)>;

// A coroutine: run it with co_await, or hand it to an engine::Driver. `sink`
// and what call points to must outlive it.
engine::Task<Status> gather(transport::ShmChannel& channel, GatherCall call, PieceSink sink);

// The header every member posts for this call, and its words for errors.
transport::PostHeader header_of(const GatherCall& call);
std::string describe(const GatherCall& call, const transport::PostHeader& h);

// Single copy: from settings->single_copy_min_bytes per member, on a channel
// whose members can read each other, for the one-shot schedule of an op that
// keeps the gathered blocks (call.landing set).
bool uses_single_copy(const transport::ShmChannel& channel, const GatherCall& call);
// The same, call.landing aside: whether an op should give one to get it.
bool single_copy_suits(const transport::ShmChannel& channel, const GatherCall& call);

// Largest piece the ring protocol hands to the sink for this alignment (0: a
// row does not fit one step).
size_t max_piece(const transport::ShmChannel& channel, size_t align);
// The step in which the ring protocol streams a block (the channel's
// pipeline_bytes(), in whole rows; max_piece() where a row exceeds it).
size_t pipeline_piece(const transport::ShmChannel& channel, size_t align);

}  // namespace fastgather::algo
