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
#include "fastgather/schedule.hpp"
#include "fastgather/settings.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "transport/shm_channel.hpp"

namespace fastgather::algo {

enum class OpCode : uint32_t {
  kAllGather = 1,
  kAllGatherV = 7,
  kMatmulReduceScatter = 8,
  kAllGatherMatmul = 2,
  kBarrier = 3,
  kBroadcast = 4,
  kReduceScatter = 5,
  kAllReduce = 6,
};
const char* op_name(OpCode op);

// Where the time of a call went, for the benchmark's shares.
struct GatherStats {
  Schedule schedule = Schedule::kAuto;  // the plan's
  double intra_ns = 0;  // the server-local (shared-memory) phase
  double inter_ns = 0;  // after it: waiting for other servers' bytes, relaying them
  // A kMismatch from comparing headers, so naming both calls (a truncated
  // network message carries no header: the sender's call is unknown).
  bool headers_compared = false;
  bool single_copy = false;  // the server-local phase read peers' blocks by single copy
  bool streamed_in = false;  // this member's block went into its ring with streaming stores
  bool in_place = false;     // some member's block was read where it lies, in its owner's heap
};

// What a call follows when it is handed no group's settings (tests that
// build a call by hand): the defaults.
const Settings& default_settings();

struct GatherCall {
  OpCode op = OpCode::kAllGather;
  uint32_t dtype = 0;
  uint64_t aux = 0;             // compared across members (k for the fused op)
  const char* aux_name = "aux";
  const std::byte* input = nullptr;
  size_t bytes = 0;             // per member (uneven blocks: the largest)
  // Uneven blocks (all_gather_v): member m's block is sizes[m] bytes, and
  // aux names the list (members must agree on it). Null: every block is
  // `bytes`. One server only.
  const size_t* sizes = nullptr;
  size_t block(int member) const { return sizes != nullptr ? sizes[static_cast<size_t>(member)] : bytes; }
  size_t align = 1;             // every piece is a multiple of this (a row)
  Schedule schedule = Schedule::kAuto;  // as asked (plan_call decides what runs)
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

struct CallPlan;  // plan.hpp

// Runs the server-local part of `plan` (plan_call's for this call): the
// one-shot or the ring schedule, by the plan's protocol. A coroutine: run it
// with co_await, or hand it to an engine::Driver. `sink`, `plan` and what
// call points to must outlive it.
engine::Task<Status> gather(transport::ShmChannel& channel, GatherCall call, const CallPlan& plan, PieceSink sink);

}  // namespace fastgather::algo
