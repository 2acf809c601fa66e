#include "algo/plan.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "fastgather/dtype.hpp"
#include "fastgather/reduce_op.hpp"

namespace fastgather::algo {

const char* protocol_name(Protocol p) {
  switch (p) {
    case Protocol::kInline: return "inline";
    case Protocol::kCopyInOut: return "copy-in/copy-out";
    case Protocol::kSingleCopy: return "single copy";
  }
  return "unknown-protocol";
}

GroupShape GroupShape::of(const transport::Channel& local, const Topology& topo, bool outnumbered) {
  GroupShape g;
  g.outnumbered = outnumbered;
  g.topo = topo;
  g.local = local.capabilities();
  g.label = local.label();
  return g;
}

size_t max_piece(size_t max_step_bytes, size_t align) { return max_step_bytes / align * align; }

// The crossover's default (Settings::hier_min_bytes): measured on TCP
// loopback (docs/multinode.md), hierarchical - the leader forwarding pieces
// while the local gather runs - was as fast or faster from well below it;
// direct keeps the small messages, where a real network's extra hop would show.
Schedule choose_schedule(const Topology& topo, size_t bytes, Schedule asked, size_t hier_min_bytes) {
  // Nothing to relay: only direct lets every member see every other member's header.
  if (bytes == 0) return Schedule::kDirect;
  if (asked == Schedule::kDirect || asked == Schedule::kHierarchical) return asked;
  if (topo.one_per_server()) return Schedule::kDirect;  // nothing to relay: the same messages
  return bytes >= hier_min_bytes ? Schedule::kHierarchical : Schedule::kDirect;
}

size_t net_piece_bytes(size_t bytes, size_t align, size_t configured, uint32_t max_pieces) {
  configured = std::max<size_t>(configured, 4096);
  align = std::max<size_t>(align, 1);
  size_t piece = std::max(align, configured / align * align);
  // No more pieces than the channel numbers (UCX: 16 bits of the tag):
  // large blocks get larger pieces.
  const size_t min_piece = max_pieces == 0 ? 0 : (bytes + max_pieces - 1) / max_pieces;
  if (piece < min_piece) piece = (min_piece + align - 1) / align * align;
  return piece;
}

namespace {

CallPlan plan_gather(const GroupShape& g, const GatherCall& call);

// reduce_scatter and all_reduce within one server, and the fused
// matmul_reduce_scatter (one server only): copy-in/copy-out (or inline, or
// read in place from the heap); no single copy (a sum reads every source once
// wherever it lies, so reading a peer's block into the own memory first would
// only add a pass).
CallPlan plan_reduction(const GroupShape& g, const GatherCall& call) {
  CallPlan p;
  p.asked = call.schedule;
  const char* op = op_name(call.op);
  auto refuse = [&](std::string why) {
    p.error = Status{ErrorKind::kUnsupported, fmt::format("{}: {}", g.label, why)};
    return p;
  };
  if (g.topo.servers() > 1) {
    return refuse(fmt::format("{} runs within one server; this group spans {} servers", op, g.topo.servers()));
  }
  const bool all_reduce = call.op == OpCode::kAllReduce;
  const int n = g.topo.members();
  const size_t two_shot_from = n == 2          ? kTwoShotMinBytesTwoMembers
                               : g.outnumbered ? kTwoShotMinBytesOutnumbered
                                               : kTwoShotMinBytes;
  switch (call.schedule) {
    case Schedule::kAuto:
      p.schedule = all_reduce && n >= 2 && call.bytes >= two_shot_from ? Schedule::kTwoShot : Schedule::kOneShot;
      break;
    case Schedule::kOneShot: p.schedule = Schedule::kOneShot; break;
    case Schedule::kTwoShot:
      if (all_reduce) {
        p.schedule = Schedule::kTwoShot;
        break;
      }
      [[fallthrough]];
    default:
      return refuse(fmt::format("{} runs {}within one server, not {}", op, all_reduce ? "one-shot or two-shot " : "one-shot ",
                                to_string(call.schedule)));
  }
  if (n == 1) p.schedule = Schedule::kOneShot;  // nothing to share
  // A reduce-scatter step carries a piece for every member: it is inline
  // when the whole input rides in the post line.
  const bool scatters = !all_reduce || p.schedule == Schedule::kTwoShot;
  // The fused op (and a scatter) makes its pieces in the ring: never inline.
  const bool produced = call.op == OpCode::kMatmulReduceScatter || call.op == OpCode::kScatter;
  p.protocol = call.bytes <= g.local.inline_bytes && p.schedule == Schedule::kOneShot && !produced ? Protocol::kInline
                                                                                                     : Protocol::kCopyInOut;
  const size_t align = std::max<size_t>(call.align, 1);
  const size_t step = max_piece(g.local.pipeline_bytes != 0 ? std::min(g.local.pipeline_bytes, g.local.max_step_bytes) : g.local.max_step_bytes, align);
  if (p.protocol == Protocol::kInline) {
    p.piece = call.bytes;
  } else if (scatters) {
    // Whole cache lines for each member where the step allows.
    const size_t each = step / static_cast<size_t>(n);
    p.piece = each >= 64 && 64 % align == 0 ? each / 64 * 64 : each / align * align;
  } else {
    p.piece = step;
  }
  if (p.piece == 0 && call.bytes != 0 && n > 1) {
    return refuse(fmt::format("a step of the shared-memory ring ({} bytes, FG_RING_BYTES) cannot hold a {}-byte "
                              "element for each of {} members", g.local.max_step_bytes, align, n));
  }
  const size_t in_place_from = all_reduce && g.outnumbered ? kInPlaceMinBytesAllReduceOutnumbered : kInPlaceMinBytes;
  // (A channel that sends from where the bytes lie does so at any size.)
  p.in_place = ((g.local.shared_heap && call.bytes >= in_place_from) || g.local.sends_from_source) &&
               p.protocol != Protocol::kInline && !produced;
  return p;
}

// A sum across servers with the same members on every server: the local
// phase is planned as the reduce-scatter (produced pieces: the slabs are
// made from the chunks where they lie), two-shot's first half, or (a small
// all_reduce, sums_whole) the one-shot, on one server of this server's
// members; the exchange in network pieces.
CallPlan plan_sum_across(const GroupShape& g, const GatherCall& call) {
  GroupShape server = g;
  server.topo = Topology::of(std::vector<int>(static_cast<size_t>(g.topo.local_count()), 0), 0);
  // The crowd's rules (two-shot sooner, in place later) were measured within
  // one server; across servers the local phase reads the heap from 4 KiB.
  server.outnumbered = false;
  GatherCall local = call;
  local.schedule = call.op != OpCode::kAllReduce ? Schedule::kAuto
                   : sums_whole(g.topo, call)     ? Schedule::kOneShot
                                                  : Schedule::kTwoShot;
  if (call.op != OpCode::kAllReduce) local.op = OpCode::kMatmulReduceScatter;  // made into the ring
  CallPlan p = plan_reduction(server, local);
  p.asked = call.schedule;
  p.schedule = Schedule::kHierarchical;
  if (!p.error.ok()) p.error = Status{ErrorKind::kUnsupported, fmt::format("{} (across servers, within each)", p.error.message())};
  p.net_piece = net_piece_bytes(exchanged_bytes(g.topo, call), call.align, call.settings->net_piece_bytes, g.net.max_pieces);
  return p;
}

bool same_members_per_server(const Topology& topo) {
  for (int s = 1; s < topo.servers(); ++s) {
    if (topo.first[s + 1] - topo.first[s] != topo.first[1]) return false;
  }
  return true;
}

// A group with one member on each server runs the schedules written for one
// server over the steps between them: the same one-shot, ring and two-shot,
// the same bits. The schedules across servers keep what is asked of them by
// name (direct, hierarchical), the fused matmul_reduce_scatter, whose
// pieces are made as they are sent, and the calls whose members keep parts
// of the blocks (GatherCall::part: direct).
bool runs_over_steps(const GroupShape& g, const GatherCall& call) {
  if (g.topo.servers() < 2 || !g.topo.one_per_server() || g.steps.max_step_bytes == 0) return false;
  if (call.op == OpCode::kMatmulReduceScatter) return false;
  if (call.part != nullptr) return false;  // direct: each member sent only its part
  return call.schedule != Schedule::kDirect && call.schedule != Schedule::kHierarchical;
}

}  // namespace

CallPlan plan_call(const GroupShape& g, const GatherCall& call) {
  const bool sums = call.op == OpCode::kReduceScatter || call.op == OpCode::kAllReduce;
  const bool fused = call.op == OpCode::kMatmulReduceScatter;
  if (runs_over_steps(g, call)) {
    GroupShape one = g;
    one.topo = Topology::of(std::vector<int>(static_cast<size_t>(g.topo.members()), 0), g.topo.mine);
    one.local = g.steps;
    GatherCall c = call;
    // Two members between servers: one-shot sums at every size (two-shot's
    // halved sums do not pay for its second round trip).
    if (sums && g.topo.members() == 2 && c.schedule == Schedule::kAuto) c.schedule = Schedule::kOneShot;
    CallPlan p = sums ? plan_reduction(one, c) : plan_gather(one, c);
    p.asked = call.schedule;
    p.over_steps = true;
    return p;
  }
  if ((sums || fused) && g.topo.servers() > 1) {
    auto refuse = [&](std::string why) {
      CallPlan p;
      p.asked = call.schedule;
      p.error = Status{ErrorKind::kUnsupported, fmt::format("{}: across servers {} {}", g.label, op_name(call.op), why)};
      return p;
    };
    const bool hierarchical = call.schedule == Schedule::kAuto || call.schedule == Schedule::kHierarchical;
    if (hierarchical && same_members_per_server(g.topo)) return plan_sum_across(g, call);
    // The fused op has no one-shot across servers.
    if (fused || call.schedule == Schedule::kHierarchical) {
      return refuse("runs hierarchical, and only with the same number of members on every server");
    }
    if (call.schedule != Schedule::kAuto && call.schedule != Schedule::kOneShot) {
      return refuse(fmt::format("runs hierarchical (reduce within servers, exchange, spread) or one-shot (an "
                                "all-gather of the inputs), not {}", to_string(call.schedule)));
    }
    // One-shot: every member's input gathered (an all-gather whose header
    // names the sum), and each member sums what it needs.
    GatherCall gather = call;
    gather.schedule = Schedule::kAuto;
    CallPlan p = plan_gather(g, gather);
    p.asked = call.schedule;
    p.gathers_inputs = true;
    return p;
  }
  // A scatter within a server runs the reduce-scatter's steps (ops/collectives.cpp).
  const bool scatters = call.op == OpCode::kScatter && g.topo.servers() == 1;
  if (sums || fused || scatters) return plan_reduction(g, call);
  return plan_gather(g, call);
}

namespace {

CallPlan plan_gather(const GroupShape& g, const GatherCall& call) {
  const Settings& settings = *call.settings;
  const Topology& topo = g.topo;
  const bool spans = topo.servers() > 1;
  const int local = topo.local_count();
  CallPlan p;
  p.asked = call.schedule;
  auto refuse = [&](std::string why) {
    p.error = Status{ErrorKind::kUnsupported, fmt::format("{}: {}", g.label, why)};
    return p;
  };

  // The schedule.
  if (spans) {
    if (call.schedule == Schedule::kRing) {
      return refuse("the ring schedule runs within one server; a group across servers runs direct or hierarchical");
    }
    if (call.bytes != 0 && call.landing == nullptr) return refuse("this op keeps no copy of the gathered blocks");
    // Members that keep parts of the blocks are sent only those, from their
    // owners: nothing to relay.
    p.schedule = call.part != nullptr ? Schedule::kDirect
                                      : choose_schedule(topo, call.bytes, call.schedule, settings.hier_min_bytes);
    p.net_piece = net_piece_bytes(call.bytes, call.align, settings.net_piece_bytes, g.net.max_pieces);
  } else {
    // A ring of two is the one-shot; the ring forwards blocks read back from
    // their landing places, so only an op that keeps them runs it.
    const bool ring = call.schedule == Schedule::kRing && topo.members() > 2 && call.landing != nullptr &&
                      call.part == nullptr && call.root < 0;
    p.schedule = ring ? Schedule::kRing : Schedule::kOneShot;
  }

  // The protocol among the members on this server.
  const size_t largest = max_piece(g.local.max_step_bytes, call.align);
  const bool single_copy = !spans && p.schedule == Schedule::kOneShot && call.root < 0 && call.landing != nullptr &&
                           g.local.reads_peer_memory && local > 1 && call.bytes >= settings.single_copy_min_bytes;
  if (single_copy) {
    p.protocol = Protocol::kSingleCopy;
  } else if (call.bytes <= g.local.inline_bytes) {
    p.protocol = Protocol::kInline;
  } else {
    p.protocol = Protocol::kCopyInOut;
  }
  const bool relays = p.schedule == Schedule::kHierarchical && call.bytes != 0;
  if (largest == 0 && local > 1 && (p.protocol != Protocol::kInline || relays)) {
    return refuse(fmt::format("a {}-byte row exceeds the {}-byte step of the shared-memory ring (FG_RING_BYTES)",
                              call.align, g.local.max_step_bytes));
  }
  const size_t pipelined = max_piece(g.local.pipeline_bytes, call.align);
  p.piece = p.protocol == Protocol::kInline ? call.bytes : (pipelined != 0 ? pipelined : largest);
  p.read_piece = largest;
  p.relay_piece = p.schedule == Schedule::kHierarchical ? largest : 0;
  p.in_place = ((g.local.shared_heap && call.bytes >= kInPlaceMinBytes) || g.local.sends_from_source) &&
               p.protocol != Protocol::kInline;
  return p;
}

}  // namespace

// The header's `algo` byte: the schedule asked for (3 bits), the one planned
// (3 bits) and the protocol (2 bits). Settings may differ between ranks
// (FG_SINGLE_COPY_MIN_BYTES, FG_HIER_MIN_BYTES): members whose plans differ
// would otherwise read each other's steps wrongly, and now disagree instead.
static_assert(static_cast<int>(Schedule::kTwoShot) < 8 && static_cast<int>(Protocol::kSingleCopy) < 4);

transport::PostHeader header_of(const GatherCall& call, const CallPlan& plan) {
  const auto algo = static_cast<uint8_t>(static_cast<unsigned>(plan.asked) | static_cast<unsigned>(plan.schedule) << 3 |
                                         static_cast<unsigned>(plan.protocol) << 6);
  return {call.bytes, call.aux, static_cast<uint8_t>(call.op), algo, static_cast<uint8_t>(call.dtype), 0, 0};
}

std::string describe(const GatherCall& call, const transport::PostHeader& h, const transport::PostHeader* other) {
  const auto asked = static_cast<Schedule>(h.algo & 7);
  const auto ran = static_cast<Schedule>((h.algo >> 3) & 7);
  const auto protocol = static_cast<Protocol>(h.algo >> 6);
  // The schedule is said where it was asked for, or planned other than the
  // default; the protocol where it is what differs from the other header.
  std::string how = asked != Schedule::kAuto ? to_string(asked) : "";
  if (ran != Schedule::kOneShot && ran != asked) how += fmt::format("{}{}", how.empty() ? "" : "->", to_string(ran));
  if (other != nullptr && (other->algo >> 6) != (h.algo >> 6)) {
    how += fmt::format("{}{}", how.empty() ? "" : ", ", protocol_name(protocol));
  }
  std::string s = fmt::format("{}{} {} bytes of {}", op_name(static_cast<OpCode>(h.op)),
                              how.empty() ? "" : fmt::format("({})", how), h.bytes,
                              h.bytes == 0 && h.dtype == 0 ? "-" : dtype_name(static_cast<DType>(h.dtype)));
  if (call.op == OpCode::kAllGatherMatmul || call.op == OpCode::kBroadcast || call.op == OpCode::kMatmulReduceScatter) {
    s += fmt::format(" with {}={}", call.aux_name, h.aux);
  }
  if (call.op == OpCode::kAllGatherV) s += fmt::format(" with block sizes #{:016x}", h.aux);
  if (call.op == OpCode::kGather || call.op == OpCode::kScatter) {
    s += std::string_view(call.aux_name) == "root" ? fmt::format(" with root={}", h.aux)
                                                   : fmt::format(" with root and block sizes #{:016x}", h.aux);
  }
  if (call.op == OpCode::kAllToAll) s += fmt::format(" with splits #{:016x}", h.aux);
  // A reduction is said where it is not the sum, or where the other's is not.
  if ((call.op == OpCode::kAllReduce || call.op == OpCode::kReduceScatter) &&
      (h.aux != 0 || (other != nullptr && other->aux != 0))) {
    s += fmt::format(" with reduction={}", to_string(static_cast<ReduceOp>(h.aux)));
  }
  return s;
}

namespace {

std::string size_words(size_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10) && b % (1 << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} bytes", b);
}

// The examples' channels: what plan_table()'s caller says they can do.
struct Channels {
  transport::Capabilities within, between;
};

GroupShape example_group(const Channels& ch, std::vector<int> servers, bool single_copy = true, bool heap = false) {
  GroupShape g;
  g.topo = Topology::of(servers, 0);
  g.net = ch.between;
  if (g.topo.one_per_server()) {  // as a communicator makes them (NetSteps)
    const size_t step = net_piece_bytes(0, 64, default_settings().net_piece_bytes, ch.between.max_pieces);
    g.steps = {.max_step_bytes = step, .pipeline_bytes = step};
  }
  g.local = ch.within;
  g.local.reads_peer_memory = single_copy;
  g.local.shared_heap = heap;
  g.label = "example";
  return g;
}

GatherCall example_call(size_t bytes, Schedule asked = Schedule::kAuto, bool keeps = true) {
  // plan_call asks only whether the op keeps the blocks, not where.
  static auto nowhere = [](int) -> std::byte* { return nullptr; };
  static FunctionRef<std::byte*(int)> keeping(nowhere);
  GatherCall c;
  c.bytes = bytes;
  c.schedule = asked;
  c.landing = keeps ? &keeping : nullptr;
  return c;
}

// A call whose members keep parts of the blocks (a gather to member 0).
GatherCall example_parts(size_t bytes) {
  static auto to_first = [](int, int reader, size_t* offset) -> size_t {
    *offset = 0;
    return reader == 0 ? 1 : 0;
  };
  static FunctionRef<size_t(int, int, size_t*)> parts(to_first);
  GatherCall c = example_call(bytes);
  c.op = OpCode::kGather;
  c.part = &parts;
  return c;
}

// keeps: as the one-shot across servers calls the all-gather (its inputs kept).
GatherCall example_sum(OpCode op, size_t bytes, bool keeps = false) {
  GatherCall c = example_call(bytes, Schedule::kAuto, keeps);
  c.op = op;
  c.align = 4;
  return c;
}

}  // namespace

std::vector<PlanRow> plan_table(const transport::Capabilities& within, const transport::Capabilities& between) {
  const Settings& d = default_settings();
  const Channels ch{within, between};
  const size_t inline_bytes = within.inline_bytes;
  const std::vector<int> one_server = {0, 0, 0}, two_servers = {0, 0, 1, 1};
  return {
      {"across servers, an op whose members keep parts of the blocks (gather, scatter, all_to_all)",
       "schedule: direct",
       "a member on another server is sent only its part (the root each block of a gather, each member its chunk of "
       "a scatter and its split of an all_to_all), straight where it goes; within each server only what its members keep "
       "of each other's blocks moves (a scatter: the reduce-scatter's steps), by the rows of one server",
       example_parts(d.hier_min_bytes), example_group(ch, {0, 1, 2})},
      {"across servers, one member on each, neither direct nor hierarchical asked for, any op but "
       "matmul_reduce_scatter", "over the steps between servers, planned by the rows of one server below",
       fmt::format("a step is a UCX message to each peer of what it reads (a ring step's bytes to the next member "
                   "only, a reduce-scatter step's piece to its member), sent from where it lies and received where it "
                   "lands, at most {} (`FG_NET_PIECE_BYTES` of group rank 0); nothing inline, no single copy, no heap; "
                   "the sums of two members one-shot at every size", size_words(d.net_piece_bytes)),
       example_sum(OpCode::kAllReduce, 4096), example_group(ch, {0, 1, 2})},
      {"one server, the ring asked for, 3+ members, an op that keeps the blocks", "schedule: ring",
       "n-1 steps, each member forwarding one block",
       example_call(4096, Schedule::kRing), example_group(ch, one_server)},
      {"one server, otherwise", "schedule: one-shot", "every member's block to every peer in the same steps",
       example_call(4096, Schedule::kRing, false), example_group(ch, one_server)},
      {fmt::format("across servers: 0 bytes; direct asked for; or, unless hierarchical was asked for, one member "
                   "per server or under {} per member (`FG_HIER_MIN_BYTES`)", size_words(d.hier_min_bytes)),
       "schedule: direct", "every block sent to every member on another server",
       example_call(d.hier_min_bytes - 1), example_group(ch, two_servers)},
      {"across servers, otherwise", "schedule: hierarchical",
       "gather within servers, one leader per server exchanges, relays through its ring",
       example_call(d.hier_min_bytes), example_group(ch, two_servers)},
      {fmt::format("one-shot on one server, >= {} per member (`FG_SINGLE_COPY_MIN_BYTES`), members can read "
                   "each other, an op that keeps the blocks", size_words(d.single_copy_min_bytes)),
       "protocol: single copy (copy-in/copy-out unless every owner's input is in huge pages or its heap, "
       "or `FG_SINGLE_COPY=always`)",
       "one copy (`process_vm_readv`, or `memcpy` from the heap), one more step",
       example_call(d.single_copy_min_bytes), example_group(ch, one_server)},
      {fmt::format("<= {} per member", size_words(inline_bytes)), "protocol: inline",
       "one cache-line transfer per peer", example_call(inline_bytes), example_group(ch, one_server)},
      {"larger", "protocol: copy-in/copy-out, in pipeline steps", "two copies, no barrier",
       example_call(inline_bytes + 1), example_group(ch, one_server)},
      {fmt::format(">= {} per member (an all_reduce within one server whose job's ranks outnumber its cores: >= {}), "
                   "the group has a symmetric heap", size_words(kInPlaceMinBytes),
                   size_words(kInPlaceMinBytesAllReduceOutnumbered)),
       "in place where an input lies in its owner's heap (`Group::empty`): posted there, peers read it there",
       "one copy, one more step", example_call(kInPlaceMinBytes), example_group(ch, one_server, false, true)},
      {"sums (reduce_scatter, all_reduce) across servers, as many members on every server, auto or hierarchical "
       "asked", "schedule: hierarchical",
       fmt::format("each member sums 1/L of its server's inputs (L members; fp16/bf16 in fp32), exchanges these "
                   "partial sums with the same member of every other server and sums them in server order; all_reduce: "
                   "the sums shared within the server (up to {} per member: each member sums all of its server's "
                   "inputs and exchanges them whole, nothing to share)", size_words(kSumWholeMaxBytes)),
       example_sum(OpCode::kAllReduce, 4096), example_group(ch, two_servers)},
      {"sums across servers, one-shot asked or servers with different numbers of members",
       "the all-gather's rows above for the inputs, then each member's sums",
       "every input to every member on another server", example_sum(OpCode::kReduceScatter, 4096, true),
       example_group(ch, {0, 0, 1})},
      {fmt::format("sums within one server: all_reduce of 3+ members, >= {} per member ({} where the job's ranks "
                   "on the server outnumber its cores), or of 2 members, >= {}; two-shot or auto asked",
                   size_words(kTwoShotMinBytes), size_words(kTwoShotMinBytesOutnumbered),
                   size_words(kTwoShotMinBytesTwoMembers)),
       "schedule: two-shot", "each member sums its 1/n chunk of every input, then copies every other member's summed chunk",
       example_sum(OpCode::kAllReduce, kTwoShotMinBytes), example_group(ch, one_server)},
      {"sums, otherwise", "schedule: one-shot",
       "reduce_scatter: each member sums its chunk of every input; all_reduce: each member sums every input whole",
       example_sum(OpCode::kReduceScatter, 4096), example_group(ch, one_server)},
      {fmt::format("sums, one-shot, <= {} per member", size_words(inline_bytes)), "protocol: inline",
       "one cache-line transfer per peer", example_sum(OpCode::kAllReduce, inline_bytes), example_group(ch, one_server)},
      {"sums, larger", "protocol: copy-in/copy-out, in steps",
       "a reduce-scatter step holds a piece of every other member's chunk (the own chunk never enters the ring); a "
       "one-shot all_reduce step, a piece of the whole input",
       example_sum(OpCode::kReduceScatter, 4096), example_group(ch, one_server)},
  };
}

}  // namespace fastgather::algo
