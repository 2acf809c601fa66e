// The call description, at the bottom of algo/: what every member agrees a
// call is (the op, its sizes and dtype, the group's layout across servers)
// and the facts about its bytes that the planner and every schedule read
// (how a sum splits them into chunks and slabs, what a member exchanges).
// Everything in algo/ includes this; it includes nothing of algo/ but the
// two utilities below it (tests/test_layers.cpp holds the order).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/copy_in.hpp"
#include "algo/function_ref.hpp"
#include "engine/task.hpp"
#include "fastgather/status.hpp"
#include "fastgather/schedule.hpp"
#include "fastgather/settings.hpp"

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
  kGather = 9,
  kScatter = 10,
  kAllToAll = 11,
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
  // `bytes`.
  const size_t* sizes = nullptr;
  size_t block(int member) const { return sizes != nullptr ? sizes[static_cast<size_t>(member)] : bytes; }
  // Which bytes of member `owner`'s block member `reader` keeps: (*part)(owner,
  // reader, &offset) is their length, from offset in the block; the same
  // answer on every member. Across servers such a call runs direct and sends
  // a member on another server only its part (gather: the blocks to the root;
  // scatter: each its chunk; all_to_all: each its split); within a server, by
  // single copy, a member reads only its part of each peer's block. With
  // parts `landing` says where a member's part (not its block) lands. Null:
  // every member keeps every block.
  FunctionRef<size_t(int owner, int reader, size_t* offset)>* part = nullptr;
  // With parts, across servers: where this member's part for `reader` lies,
  // when its parts are not one buffer (a scatter's list); then `input` is
  // needed only by the members of this server. Null: input + offset.
  FunctionRef<const std::byte*(int reader)>* part_from = nullptr;
  // With parts, across servers: what this server's members need of each
  // other, run instead of the server-local gather (which would move each
  // member's whole block to every member here). A scatter's is the
  // reduce-scatter's steps from the root's chunks. Null: the gather.
  FunctionRef<engine::Task<Status>()>* local_phase = nullptr;
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

// Members are numbered in ascending world rank and servers hold consecutive
// world ranks, so each server's members are consecutive: a Topology is the
// first member of each server present in the group.
struct Topology {
  std::vector<int> first;  // first[s]: first member on the group's s-th server; first.back(): members
  int mine = 0;            // this member's server slot

  int servers() const { return static_cast<int>(first.size()) - 1; }
  int members() const { return first.back(); }
  int server_of(int member) const;
  int leader(int slot) const { return first[slot]; }
  int local_count() const { return first[mine + 1] - first[mine]; }
  bool local(int member) const { return member >= first[mine] && member < first[mine + 1]; }
  bool one_per_server() const { return members() == servers(); }
  // From each member's server index (any increasing labels), and this member's position.
  static Topology of(const std::vector<int>& server_of_member, int me);
};

// Which bytes of an all-reduce each member sums in two-shot: chunk m starts at
// first(m) bytes and holds size(m) (whole cache lines but the last; some may
// be empty).
struct Chunks {
  size_t total = 0, each = 0;
  Chunks(size_t total_bytes, int members, size_t align);
  // A reduce-scatter's: n equal chunks back to back.
  static Chunks equal(size_t total_bytes, int members);
  size_t first(int m) const { return std::min(total, each * static_cast<size_t>(m)); }
  size_t size(int m) const { return std::min(each, total - first(m)); }
};

// Whether an all_reduce across servers is summed whole within each server
// (up to kSumWholeMaxBytes per member: algo/thresholds.hpp).
bool sums_whole(const Topology& topo, const GatherCall& call);


// A sum across servers (across.hpp): which bytes this member sums and
// exchanges (in the dtype's bytes).
bool scatters(const GatherCall& call);  // reduce_scatter (and the fused one): not all_reduce
struct SumLayout {
  SumLayout(const Topology& topo, const GatherCall& call);
  int servers, locals;
  Chunks slabs;  // slab j: what local member j sums within the server
  size_t chunk;  // reduce_scatter: each member's chunk of the result
  bool whole;    // every member sums all of its server's inputs (sums_whole)
  size_t first(int j) const { return whole ? 0 : slabs.first(j); }
  size_t size(int j) const { return whole ? slabs.total : slabs.size(j); }
  // The partial sums member j of server t receives from this member: where
  // they lie in this member's slab, and how many bytes.
  size_t sent_from(bool scatter, int t) const { return scatter ? static_cast<size_t>(t) * chunk : 0; }
  size_t result(bool scatter, int j) const { return scatter ? chunk : size(j); }
};

// The largest message the exchange of a sum across servers sends for this
// call, in the dtype's bytes.
size_t exchanged_bytes(const Topology& topo, const GatherCall& call);

}  // namespace fastgather::algo
