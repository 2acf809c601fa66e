#include "algo/allgather.hpp"

#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "base/caches.hpp"
#include "base/huge_pages.hpp"
#include "engine/waits.hpp"
#include "fastgather/dtype.hpp"

namespace fastgather::algo {
namespace {

// From this size a block in its owner's symmetric heap is read there, in
// place, for one more round at the end ("done reading") instead of a copy
// into the ring: below it the extra round costs what the copy saves
// (docs/benchmarks.md, "Symmetric inputs").
constexpr size_t kInPlaceMinBytes = 4 << 10;

constexpr ProtocolRule kRules[] = {
    {transport::kInlineBytes, Protocol::kInline, "inline"},
    {SIZE_MAX, Protocol::kCopyInOut, "copy-in/copy-out"},
};

}  // namespace

std::string describe(const GatherCall& call, const transport::PostHeader& h) {
  auto dt = static_cast<DType>(h.dtype);
  const auto sched = static_cast<Schedule>(h.algo);
  std::string s = fmt::format("{}{} {} bytes of {}", op_name(static_cast<OpCode>(h.op)),
                              sched == Schedule::kOneShot ? "" : fmt::format("({})", schedule_name(sched)), h.bytes,
                              h.bytes == 0 && h.dtype == 0 ? "-" : dtype_name(dt));
  if (call.op == OpCode::kAllGatherMatmul || call.op == OpCode::kBroadcast) s += fmt::format(" with {}={}", call.aux_name, h.aux);
  return s;
}

namespace {

// Compares a peer's header with ours; on a mismatch appends a sentence.
void compare(const transport::ShmChannel& ch, const GatherCall& call, const transport::PostHeader& mine,
             int peer, const transport::PostHeader& theirs, std::string* why) {
  if (theirs.same_call(mine)) return;
  if (!why->empty()) *why += "; ";
  *why += fmt::format("rank {} sent {}, rank {} expected {}", ch.world_rank(peer), describe(call, theirs),
                      ch.world_rank(ch.me()), describe(call, mine));
}

}  // namespace

const char* op_name(OpCode op) {
  switch (op) {
    case OpCode::kAllGather: return "all_gather";
    case OpCode::kAllGatherMatmul: return "all_gather_matmul";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kBroadcast: return "broadcast";
  }
  return "unknown-op";
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kOneShot: return "one-shot";
    case Schedule::kRingPass: return "ring";
    case Schedule::kDirect: return "direct";
    case Schedule::kHierarchical: return "hierarchical";
  }
  return "unknown-schedule";
}

std::span<const ProtocolRule> protocol_table() { return kRules; }

transport::PostHeader header_of(const GatherCall& call) {
  return {call.bytes, call.aux, static_cast<uint8_t>(call.op), static_cast<uint8_t>(call.schedule),
          static_cast<uint8_t>(call.dtype), 0, 0};
}

const ProtocolRule& choose_protocol(size_t bytes) {
  for (const auto& r : kRules) {
    if (bytes <= r.max_bytes) return r;
  }
  return kRules[std::size(kRules) - 1];
}

size_t max_piece(const transport::ShmChannel& channel, size_t align) {
  return channel.max_step_bytes() / align * align;
}

const Settings& default_settings() {
  static const Settings defaults;
  return defaults;
}

size_t pipeline_piece(const transport::ShmChannel& channel, size_t align) {
  const size_t piece = channel.pipeline_bytes() / align * align;
  return piece != 0 ? piece : max_piece(channel, align);
}

namespace {

// One lockstep step: publish `len` bytes of `data` (inline, or through this
// member's ring), then - after `posted` - wait for every peer's post of the
// same step, compare headers on the call's first step, and hand each peer's
// post to `take` (which knows how many bytes the peer's step holds). Every
// peer is waited for even after a mismatch, so all members leave the call at
// the same step.
engine::Task<Status> lockstep(transport::ShmChannel& ch, const GatherCall& call, transport::PostHeader mine,
                              Protocol protocol, CopyIn how, const std::byte* data, size_t len, bool first,
                              std::string* mismatch, int* disagreeing, FunctionRef<void()> posted,
                              FunctionRef<void(int peer, const std::byte* src)> take, bool* in_place = nullptr) {
  const int n = ch.members();
  const int me = ch.me();
  const uint64_t step = ch.next_step();
  std::optional<uint64_t> at_heap;
  if (in_place != nullptr && len != 0 && call.bytes >= kInPlaceMinBytes && ch.heap() != nullptr) {
    at_heap = ch.heap()->own_offset(data, len);
  }
  if (protocol == Protocol::kInline) {
    ch.post(step, mine, data, len);
  } else if (at_heap) {  // the bytes are in this member's heap region: peers read them there
    mine.in_heap = 1;
    mine.offset = static_cast<uint32_t>(*at_heap);
    ch.post(step, mine);
    *in_place = true;
  } else {
    uint32_t at = 0;
    std::byte* dst = ch.claim(len, &at);
    if (len != 0) copy_into_ring(how, dst, data, len);
    mine.offset = at;
    ch.post(step, mine);
  }
  posted();
  // Start with the next member so peers do not all read the same one first.
  for (int i = 1; i < n; ++i) {
    const int peer = (me + i) % n;
    auto line = co_await engine::arrival(ch, peer, step);
    if (!line.ok()) co_return line.status();
    const transport::PostHeader& theirs = line.value()->header;
    if (first) compare(ch, call, mine, peer, theirs, mismatch);
    if (first && disagreeing != nullptr && *disagreeing < 0 && !mismatch->empty()) *disagreeing = ch.world_rank(peer);
    if (in_place != nullptr && theirs.in_heap != 0) *in_place = true;
    if (!mismatch->empty()) continue;
    take(peer, protocol == Protocol::kInline ? reinterpret_cast<const std::byte*>(line.value()->inline_data)
                                             : ch.member_data(peer, theirs));
  }
  co_return Status::Ok();
}

// "Done reading": a step with nothing in it. An owner whose input peers
// read where it lies leaves only after every peer has posted this.
engine::Task<Status> done_reading(transport::ShmChannel& ch, const GatherCall& call, transport::PostHeader mine,
                                  std::string* mismatch, int* disagreeing) {
  auto nothing = [] {};
  auto none = [](int, const std::byte*) {};
  co_return co_await lockstep(ch, call, mine, Protocol::kInline, CopyIn::kCached, nullptr, 0, false, mismatch,
                              disagreeing, nothing, none);
}

// What an owner posts inline in the first step of single copy.
struct Offer {
  uint64_t addr;     // its input: in its address space, or (in_heap) in its heap region
  uint8_t readable;  // 1: worth reading by single copy (heap, huge pages, or FG_SINGLE_COPY=always)
  uint8_t in_heap;   // 1: read it in the heap, with memcpy; 0: with process_vm_readv
};
static_assert(sizeof(Offer) <= transport::kInlineBytes);

// Single copy: every member posts its input's address and whether it is
// worth reading that way (inline, through lockstep(), which also compares
// headers and places the own block), and waits for everyone's post first
// (so that on a mismatch nobody reads a block whose owner is already
// leaving). If any owner's memory is not (4 KiB pages: slower than the
// ring, measured), everyone says *fell_back and the caller runs the ring
// from here - the same decision on every member, from the same posts.
// Otherwise each member reads each peer's block straight into its landing
// place, handing it to the sink piece by piece, and takes a second step:
// "done reading". An owner leaves only once every peer has posted that, so
// its input stays valid as long as anyone reads it.
engine::Task<Status> single_copy(transport::ShmChannel& ch, const GatherCall& call, transport::PostHeader mine,
                                 size_t piece, std::string* mismatch, int* disagreeing, bool* fell_back,
                                 PieceSink sink) {
  const int n = ch.members();
  const int me = ch.me();
  Offer offer{};
  const std::optional<uint64_t> at_heap = ch.heap() != nullptr ? ch.heap()->own_offset(call.input, call.bytes) : std::nullopt;
  offer.addr = at_heap ? *at_heap : reinterpret_cast<uint64_t>(call.input);
  offer.in_heap = at_heap ? 1 : 0;
  offer.readable = at_heap || call.settings->single_copy == Settings::SingleCopy::kAlways || base::in_huge_range(call.input, call.bytes) ? 1 : 0;
  bool all_readable = offer.readable != 0;
  auto own = [&] { sink(me, 0, call.input, call.bytes); };
  auto note_offer = [&](int, const std::byte* src) {
    Offer theirs{};
    std::memcpy(&theirs, src, sizeof(theirs));
    all_readable &= theirs.readable != 0;
  };
  Status s = co_await lockstep(ch, call, mine, Protocol::kInline, CopyIn::kCached,
                               reinterpret_cast<const std::byte*>(&offer), sizeof(offer), true, mismatch, disagreeing,
                               own, note_offer);
  if (!s.ok() || !mismatch->empty()) co_return s;  // the caller words a mismatch
  if (!all_readable) {
    *fell_back = true;
    co_return Status::Ok();
  }
  // Every peer's offer stays in its post line until this member posts again.
  const uint64_t step = ch.last_step();
  for (int i = 1; i < n; ++i) {
    const int peer = (me + i) % n;
    Offer theirs{};
    std::memcpy(&theirs, ch.line(peer, step).inline_data, sizeof(theirs));
    std::byte* dst = (*call.landing)(peer);
    // From the heap in pipeline steps (a quarter of L2), so that what was
    // read is still in the cache when it is copied out; process_vm_readv
    // keeps larger pieces, where each system call costs more than the cache
    // saves (docs/benchmarks.md, "Pipelining the ring").
    const size_t step = theirs.in_heap != 0 ? pipeline_piece(ch, call.align) : piece;
    for (size_t off = 0; off < call.bytes; off += step) {
      const size_t len = std::min(step, call.bytes - off);
      if (theirs.in_heap != 0) {
        copy_out(dst + off, ch.heap()->member_data(peer, theirs.addr + off), len, call.stream_out);
      } else if (Status r = ch.read_peer(peer, dst + off, theirs.addr + off, len); !r.ok()) {
        co_return r;
      }
      sink(peer, off, dst + off, len);
    }
  }
  co_return co_await done_reading(ch, call, mine, mismatch, disagreeing);
}

}  // namespace

bool single_copy_suits(const transport::ShmChannel& ch, const GatherCall& call) {
  return ch.single_copy() && ch.members() > 1 && call.schedule == Schedule::kOneShot && call.root < 0 &&
         call.bytes >= call.settings->single_copy_min_bytes;
}

bool uses_single_copy(const transport::ShmChannel& ch, const GatherCall& call) {
  return call.landing != nullptr && single_copy_suits(ch, call);
}

engine::Task<Status> gather(transport::ShmChannel& ch, GatherCall call, PieceSink sink) {
  if (!ch.broken().ok()) co_return ch.broken();
  const int n = ch.members();
  const int me = ch.me();
  // In a broadcast, members other than the root contribute nothing.
  const bool contributes = call.root < 0 || call.root == me;
  if (n == 1) {  // nobody to tell: the own block is all there is
    if (call.bytes != 0 && contributes) sink(me, 0, call.input, call.bytes);
    co_return Status::Ok();
  }
  const transport::PostHeader mine = header_of(call);
  Protocol protocol = uses_single_copy(ch, call) ? Protocol::kSingleCopy : choose_protocol(call.bytes).protocol;
  size_t chunk = protocol == Protocol::kInline ? call.bytes : max_piece(ch, call.align);
  if (protocol != Protocol::kInline && chunk == 0) {
    co_return Status{ErrorKind::kUnsupported, fmt::format("{}: a {}-byte row exceeds the {}-byte step of a {}-byte ring",
                                                          ch.label(), call.align, ch.max_step_bytes(), ch.ring_bytes())};
  }
  const auto started = std::chrono::steady_clock::now();
  std::string mismatch;
  auto own = [&] {
    if (call.bytes != 0 && contributes) sink(me, 0, call.input, call.bytes);
  };
  int disagreeing = -1;  // world rank of the first peer whose header differed
  auto failed = [&] { return Status{ErrorKind::kMismatch, fmt::format("{}: {}", ch.label(), mismatch), disagreeing}; };
  // The call's first step compares headers and places this member's own block.
  bool first = true;
  bool fell_back = false;
  if (protocol == Protocol::kSingleCopy) {
    Status s = co_await single_copy(ch, call, mine, chunk, &mismatch, &disagreeing, &fell_back, sink);
    if (!s.ok()) co_return s;
    if (!mismatch.empty()) co_return failed();
    if (call.stats != nullptr) call.stats->single_copy = !fell_back;
    if (!fell_back) co_return Status::Ok();
    protocol = Protocol::kCopyInOut;  // headers compared, own block placed: the ring from here
    first = false;
  } else if (call.stats != nullptr) {
    call.stats->single_copy = false;
  }
  // The ring path streams a block in pipeline steps.
  if (protocol == Protocol::kCopyInOut) chunk = pipeline_piece(ch, call.align);
  // How to copy into the ring: whichever has made whole calls faster here.
  const CopyIn how = call.copy_in != nullptr && protocol == Protocol::kCopyInOut ? call.copy_in->pick(call.bytes) : CopyIn::kCached;
  if (call.stats != nullptr) call.stats->streamed_in = how == CopyIn::kStreaming;

  // Sends `from` (call.bytes of it) in chunks, one lockstep step each, and
  // hands what arrives to take(peer, offset, src, len). The own block goes
  // to the sink on the first step, or with own_each_step a chunk at each
  // step, just after it was copied into the ring: still in this core's cache.
  using Take = FunctionRef<void(int peer, size_t offset, const std::byte* src, size_t len)>;
  bool in_place = false;  // some member's block was read in its heap: everyone says "done" at the end
  auto send_in_steps = [&](const std::byte* from, bool own_each_step, Take take) -> engine::Task<Status> {
    for (size_t off = 0; first || off < call.bytes;) {  // at least one step, even for 0 bytes
      const size_t len = std::min(chunk, call.bytes - off);
      const bool own_now = first;
      auto posted = [&] {
        if (own_each_step) {
          if (len != 0 && contributes) sink(me, off, call.input + off, len);
        } else if (own_now) {
          own();
        }
      };
      auto take_step = [&](int peer, const std::byte* src) {
        if (len != 0 && (call.root < 0 || peer == call.root)) take(peer, off, src, len);
      };
      Status s = co_await lockstep(ch, call, mine, protocol, how, from + off, contributes ? len : 0, first, &mismatch,
                                   &disagreeing, posted, take_step, &in_place);
      if (!s.ok()) co_return s;
      if (!mismatch.empty()) co_return failed();
      first = false;
      off += len;
    }
    co_return Status::Ok();
  };

  if (call.schedule == Schedule::kRingPass && n > 2 && call.landing != nullptr) {
    // n-1 rounds; in round r this member forwards block (me - r) to me+1 and
    // receives block (me - r - 1) from me-1 (0 bytes: a single step in the
    // first round, to compare headers).
    const int prev = (me + n - 1) % n;
    for (int round = 0; round < n - 1; ++round) {
      const int send = (me - round + n) % n, recv = (me - round - 1 + n) % n;
      const std::byte* from = round == 0 ? call.input : (*call.landing)(send);
      auto take = [&](int peer, size_t off, const std::byte* src, size_t len) {
        if (peer == prev) sink(recv, off, src, len);
      };
      Status s = co_await send_in_steps(from, false, take);
      if (!s.ok()) co_return s;
    }
  } else {
    // One-shot: every member's chunk goes to every peer in the same step.
    auto take = [&](int peer, size_t off, const std::byte* src, size_t len) { sink(peer, off, src, len); };
    Status s = co_await send_in_steps(call.input, first, take);
    if (!s.ok()) co_return s;
  }
  if (in_place) {
    // An owner's block stays valid until every peer has read it: nobody
    // leaves before everyone has posted this step (the same decision on
    // every member, from the same headers).
    if (Status s = co_await done_reading(ch, call, mine, &mismatch, &disagreeing); !s.ok()) co_return s;
  }
  if (call.copy_in != nullptr && protocol == Protocol::kCopyInOut) {
    call.copy_in->record(call.bytes, how, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - started).count());
  }
  co_return Status::Ok();
}

}  // namespace fastgather::algo
