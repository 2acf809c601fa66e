#include "algo/allgather.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "algo/lockstep.hpp"
#include "algo/plan.hpp"
#include "base/caches.hpp"
#include "base/huge_pages.hpp"
#include "engine/waits.hpp"
#include "transport/shm_heap.hpp"

namespace fastgather::algo {

Status CallState::mismatch_status() const {
  return Status{ErrorKind::kMismatch, fmt::format("{}: {}", ch.label(), mismatch), disagreeing};
}

PeerOrder::PeerOrder(int members, int me, int my_cpu, FunctionRef<int(int)> cpu_of) : n_(std::max(members - 1, 0)) {
  if (n_ > kInPlace) heap_.resize(static_cast<size_t>(n_));
  int* out = heap_.empty() ? in_place_.data() : heap_.data();
  int k = 0;
  // One look at each peer's CPU: it may change meanwhile, and every peer
  // must be in the order once.
  for (int i = 1; i < members; ++i) {
    const int peer = (me + i) % members;
    if (my_cpu >= 0 && cpu_of(peer) == my_cpu) out[k++] = peer;
  }
  const int near = k;
  for (int i = 1; i < members; ++i) {
    const int peer = (me + i) % members;
    if (std::find(out, out + near, peer) == out + near) out[k++] = peer;
  }
}

engine::Task<Status> lockstep(CallState& st, const Step& s, FunctionRef<void()> posted, Take take) {
  transport::Channel& ch = st.ch;
  const int n = ch.members();
  const int me = ch.me();
  const uint64_t step = ch.next_step();
  transport::PostHeader mine = s.header != nullptr ? *s.header : st.mine;
  std::optional<uint64_t> at;
  if (s.may_be_in_place && st.plan.in_place && s.len != 0 && !s.inline_data) at = ch.in_place(s.data, s.len);
  if (s.land != nullptr && st.caps.receives_in_place) {
    for (int peer = 0; peer < n; ++peer) {
      size_t room = 0;
      if (std::byte* dst = peer != me ? (*s.land)(peer, &room) : nullptr; dst != nullptr) ch.land(peer, step, dst, room);
    }
  }
  if (s.inline_data) {
    ch.post(step, mine, s.data, s.len, s.readers);
  } else if (at) {  // posted where they lie: peers read them in this member's heap, or they are sent from there
    mine.in_heap = 1;
    mine.offset = static_cast<uint32_t>(*at);
    ch.post_in_place(step, mine, s.data, s.len, s.readers);
    if (st.caps.shared_heap) st.in_place = true;
    else st.sent_in_place = true;
  } else {
    uint32_t at = 0;
    std::byte* dst = ch.claim(s.len, &at);
    if (s.fill != nullptr) (*s.fill)(dst);
    else if (s.len != 0) copy_into_ring(s.how, dst, s.data, s.len);
    mine.offset = at;
    ch.post(step, mine, nullptr, 0, s.readers);
  }
  posted();
  const bool compare = st.first;
  st.first = false;
  auto cpu_of = [&](int m) { return ch.member_cpu(m); };
  const PeerOrder order(n, me, ::sched_getcpu(), cpu_of);
  // Disagreeing peers, said from the next member on whatever the order of
  // the waits (which follows the CPUs): the same words, and the same first
  // peer, wherever the ranks run.
  std::vector<std::pair<int, std::string>> differ;
  for (int i = 0; i < order.size(); ++i) {
    const int peer = order[i];
    if (s.only_from >= 0 && peer != s.only_from) continue;
    if (Status a = co_await engine::arrival(ch, peer, step); !a.ok()) co_return a;
    const transport::PostHeader& theirs = ch.header(peer, step);
    if (compare && !theirs.same_call(st.mine)) {
      differ.emplace_back((peer - me + n) % n,
                          fmt::format("rank {} sent {}, rank {} expected {}", ch.world_rank(peer), describe(st.call, theirs, &st.mine),
                                      ch.world_rank(me), describe(st.call, st.mine, &theirs)));
    }
    if (theirs.in_heap != 0) st.in_place = true;
    if (!st.mismatch.empty() || !differ.empty()) continue;
    take(peer, theirs, ch.bytes(peer, step, s.inline_data));
  }
  std::sort(differ.begin(), differ.end());
  for (const auto& [after_me, words] : differ) {
    if (st.mismatch.empty()) st.disagreeing = ch.world_rank((me + after_me) % n);
    else st.mismatch += "; ";
    st.mismatch += words;
  }
  // The call ends on the mismatch (the group goes on): what this member
  // sent from where it lies has left before the caller may reuse it.
  if (!st.mismatch.empty() && st.sent_in_place) co_return co_await engine::sent(ch);
  co_return Status::Ok();
}

engine::Task<Status> finish(CallState& st) {
  if (st.in_place) {
    // An owner's block stays valid until every peer has read it: nobody
    // leaves before everyone has posted this step (the same decision on
    // every member, from the same headers).
    if (Status s = co_await done_reading(st); !s.ok()) co_return s;
  }
  if (st.sent_in_place) co_return co_await engine::sent(st.ch);
  co_return Status::Ok();
}

engine::Task<Status> done_reading(CallState& st) {
  auto nothing = [] {};
  auto none = [](int, const transport::PostHeader&, const std::byte*) {};
  co_return co_await lockstep(st, Step{.inline_data = true}, nothing, none);
}

namespace {

// What an owner posts inline in the first step of single copy.
struct Offer {
  uint64_t addr;     // its input: in its address space, or (in_heap) in its heap region
  uint8_t readable;  // 1: worth reading by single copy (heap, huge pages, a crowded host, or FG_SINGLE_COPY=always)
  uint8_t in_heap;   // 1: read it in the heap, with memcpy; 0: with process_vm_readv
};
// Single copy runs only where members read each other's memory (the
// shared-memory channel, whose post line carries 32 bytes inline).
static_assert(sizeof(Offer) <= 32);

// Single copy: every member posts its input's address and whether it is
// worth reading that way (inline, through lockstep(), which also compares
// headers and places the own block), and waits for everyone's post first
// (so that on a mismatch nobody reads a block whose owner is already
// leaving). If any owner's memory is not (4 KiB pages: slower than the
// ring on a quiet host, measured), everyone says *fell_back and the caller
// runs copy-in/copy-out from here - the same decision on every member, from
// the same posts. On a crowded host (more tasks runnable than cores, beyond
// the job's ranks: Channel::crowded) an owner offers ordinary memory too, up
// to kCrowdedSingleCopyMaxBytes: each step of the ring waits for every
// member to be scheduled, and there a wait costs a time slice; single copy
// has two steps however large the block. Otherwise each member reads each
// peer's block straight into its landing place, handing it to the sink
// piece by piece, and takes a second step: "done reading". An owner leaves only once every peer has
// posted that, so its input stays valid as long as anyone reads it.
engine::Task<Status> single_copy(CallState& st, bool* fell_back, PieceSink sink) {
  transport::Channel& ch = st.ch;
  const GatherCall& call = st.call;
  const int n = ch.members();
  const int me = ch.me();
  Offer offer{};
  const size_t mine = call.block(me);
  const std::optional<uint64_t> at_heap = ch.heap() != nullptr ? ch.heap()->own_offset(call.input, mine) : std::nullopt;
  offer.addr = at_heap ? *at_heap : reinterpret_cast<uint64_t>(call.input);
  offer.in_heap = at_heap ? 1 : 0;
  bool readable =
      at_heap || base::worth_reading_by_peers(call.input, mine, call.settings->single_copy == Settings::SingleCopy::kAlways);
  if (!readable && call.settings->single_copy == Settings::SingleCopy::kAuto && mine <= kCrowdedSingleCopyMaxBytes) {
    readable = ch.crowded();
  }
  offer.readable = readable ? 1 : 0;
  bool all_readable = offer.readable != 0;
  auto own = [&] {
    if (mine != 0) sink(me, 0, call.input, mine);
  };
  auto note_offer = [&](int, const transport::PostHeader&, const std::byte* src) {
    Offer theirs{};
    std::memcpy(&theirs, src, sizeof(theirs));
    all_readable &= theirs.readable != 0;
  };
  const Step offering{.inline_data = true, .data = reinterpret_cast<const std::byte*>(&offer), .len = sizeof(offer)};
  Status s = co_await lockstep(st, offering, own, note_offer);
  if (!s.ok() || !st.mismatch.empty()) co_return s;  // the caller words a mismatch
  if (!all_readable) {
    *fell_back = true;
    co_return Status::Ok();
  }
  // Every peer's offer stays in its post line until this member posts again.
  const uint64_t step = ch.last_step();
  for (int i = 1; i < n; ++i) {
    const int peer = (me + i) % n;
    Offer theirs{};
    std::memcpy(&theirs, ch.bytes(peer, step, true), sizeof(theirs));
    std::byte* dst = (*call.landing)(peer);
    // With parts (all_to_all), only this member's part of the block, read
    // straight to where it lands.
    size_t first = 0;
    const size_t want = call.part != nullptr ? (*call.part)(peer, me, &first) : call.block(peer);
    // From the heap in pipeline steps (a quarter of L2), so that what was
    // read is still in the cache when it is copied out; process_vm_readv
    // keeps larger pieces, where each system call costs more than the cache
    // saves (docs/benchmarks.md, "Pipelining the ring").
    const size_t piece = theirs.in_heap != 0 ? st.plan.piece : st.plan.read_piece;
    for (size_t off = 0; off < want; off += piece) {
      const size_t len = std::min(piece, want - off);
      if (theirs.in_heap != 0) {
        copy_out(dst + off, ch.heap()->member_data(peer, theirs.addr + first + off), len, call.stream_out);
      } else if (Status r = ch.read_peer(peer, dst + off, theirs.addr + first + off, len); !r.ok()) {
        co_return r;
      }
      sink(peer, first + off, dst + off, len);
    }
  }
  co_return co_await done_reading(st);
}

}  // namespace

engine::Task<Status> gather(transport::Channel& ch, GatherCall call, const CallPlan& plan, PieceSink sink) {
  if (!ch.broken().ok()) co_return ch.broken();
  if (!plan.error.ok()) co_return plan.error;
  const int n = ch.members();
  const int me = ch.me();
  // In a broadcast, members other than the root contribute nothing.
  const bool contributes = call.root < 0 || call.root == me;
  if (n == 1) {  // nobody to tell: the own block is all there is
    if (call.block(me) != 0 && contributes) sink(me, 0, call.input, call.block(me));
    co_return Status::Ok();
  }
  const auto started = std::chrono::steady_clock::now();
  CallState st(ch, call, plan);
  Protocol protocol = plan.protocol;
  if (protocol == Protocol::kSingleCopy) {
    bool fell_back = false;
    Status s = co_await single_copy(st, &fell_back, sink);
    if (!s.ok()) co_return s;
    if (!st.mismatch.empty()) co_return st.mismatch_status();
    if (call.stats != nullptr) call.stats->single_copy = !fell_back;
    if (!fell_back) co_return Status::Ok();
    protocol = Protocol::kCopyInOut;  // headers compared, own block placed: copy-in/copy-out from here
  }
  const size_t mine = contributes ? call.block(me) : 0;
  // How to copy into the ring: whichever has made whole calls faster here.
  // Only a call that copies into this member's ring asks and teaches the
  // chooser: a block posted where it lies (its owner's heap), or none (a
  // broadcast's other members), copies nothing unless the ring forwards
  // others' blocks, and its time says nothing of either way (fg-bench
  // --compare alternates heap and private inputs on one group: the heap's
  // calls, timed into whichever way was picked, made the two ways look alike).
  const bool copies_own = mine != 0 && !(plan.in_place && ch.in_place(call.input, mine).has_value());
  const bool learns = call.copy_in != nullptr && protocol == Protocol::kCopyInOut &&
                      (copies_own || plan.schedule == Schedule::kRing);
  const CopyIn how = learns ? call.copy_in->pick(call.bytes) : CopyIn::kCached;
  if (call.stats != nullptr) call.stats->streamed_in = how == CopyIn::kStreaming;
  const size_t piece = plan.piece;

  // Sends `from` (from_bytes of it) in pieces, one lockstep step each, for
  // as many steps as the largest block takes, and hands what arrives to
  // take(peer, offset, src). The own block goes to the sink on the call's
  // first step, or with own_each_step a piece at each step, just after it
  // was copied into the ring: still in this core's cache.
  using TakePiece = FunctionRef<void(int peer, size_t offset, const std::byte* src)>;
  // The bytes of `member`'s block in the step at `off`.
  auto piece_of = [&](int member, size_t off) {
    const size_t b = call.block(member);
    return off < b ? std::min(piece, b - off) : size_t{0};
  };
  const int prev = (me + n - 1) % n;
  // reader: the one peer that reads the steps' bytes (-1: every peer);
  // block: the block the peers' steps carry (-1: each peer its own; else
  // only the predecessor's bytes are read, of that block).
  auto send_in_steps = [&](const std::byte* from, size_t from_bytes, bool own_each_step, TakePiece take,
                           int reader, int block) -> engine::Task<Status> {
    for (size_t off = 0; st.first || off < call.bytes;) {  // at least one step, even for 0 bytes
      const size_t len = off < from_bytes ? std::min(piece, from_bytes - off) : 0;
      const bool own_now = st.first;
      auto posted = [&] {
        if (own_each_step) {
          if (off < mine) sink(me, off, call.input + off, std::min(piece, mine - off));
        } else if (own_now && mine != 0) {
          sink(me, 0, call.input, mine);
        }
      };
      auto take_step = [&](int peer, const transport::PostHeader&, const std::byte* src) {
        if (call.root < 0 || peer == call.root) take(peer, off, src);
      };
      // A channel that receives in place puts each peer's piece straight
      // where the sink would copy it (which then copies nothing).
      auto land = [&](int peer, size_t* room) -> std::byte* {
        const int of = block < 0 ? peer : peer == prev ? block : -1;
        if (of < 0 || call.landing == nullptr || call.part != nullptr || (call.root >= 0 && peer != call.root)) {
          return nullptr;  // with parts, landing is where a part goes, not a block
        }
        *room = piece_of(of, off);
        return *room != 0 ? (*call.landing)(of) + off : nullptr;
      };
      const FunctionRef<std::byte*(int, size_t*)> land_ref(land);
      const Step step{.inline_data = protocol == Protocol::kInline, .data = from + off, .len = len,
                      .how = how, .may_be_in_place = true, .readers = {.only = reader}, .land = &land_ref};
      Status s = co_await lockstep(st, step, posted, take_step);
      if (!s.ok()) co_return s;
      if (!st.mismatch.empty()) co_return st.mismatch_status();
      off += std::min(piece, call.bytes - off);
    }
    co_return Status::Ok();
  };
  if (plan.schedule == Schedule::kRing) {
    // n-1 rounds; in round r this member forwards block (me - r) to me+1 and
    // receives block (me - r - 1) from me-1 (0 bytes: a single step in the
    // first round, to compare headers).
    for (int round = 0; round < n - 1; ++round) {
      const int send = (me - round + n) % n, recv = (me - round - 1 + n) % n;
      const std::byte* from = round == 0 ? call.input : (*call.landing)(send);
      auto take = [&](int peer, size_t off, const std::byte* src) {
        if (const size_t len = piece_of(recv, off); peer == prev && len != 0) sink(recv, off, src, len);
      };
      Status s = co_await send_in_steps(from, call.block(send), false, take, (me + 1) % n, recv);
      if (!s.ok()) co_return s;
    }
  } else {
    // One-shot: every member's piece goes to every peer in the same step;
    // after single copy fell back, the own block is placed already.
    auto take = [&](int peer, size_t off, const std::byte* src) {
      if (const size_t len = piece_of(peer, off); len != 0) sink(peer, off, src, len);
    };
    Status s = co_await send_in_steps(call.input, mine, st.first, take, -1, -1);
    if (!s.ok()) co_return s;
  }
  if (Status s = co_await finish(st); !s.ok()) co_return s;
  if (call.stats != nullptr) call.stats->in_place = st.in_place;
  if (learns) {
    call.copy_in->record(call.bytes, how, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - started).count());
  }
  co_return Status::Ok();
}

}  // namespace fastgather::algo
