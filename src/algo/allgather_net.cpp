#include "algo/allgather_net.hpp"

#include "algo/lockstep.hpp"
#include "engine/waits.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace fastgather::algo {
namespace {

using Clock = std::chrono::steady_clock;
using transport::NetChannel;
using transport::NetIov;
using transport::PostHeader;
using transport::ShmChannel;

// One expected message: member `owner`'s piece `piece`, with the header the
// sender put in front of it.
struct Expected {
  int owner;
  uint32_t piece;
  PostHeader header;
};

class Across {
 public:
  Across(ShmChannel& local, NetChannel& net, const Topology& topo, const GatherCall& call, const CallPlan& plan,
         PieceSink sink)
      : local_(local), net_(net), topo_(topo), call_(call), plan_(plan), sink_(sink),
        mine_(header_of(call, plan)) {}

  // The engine keeps the network moving while this member waits for local
  // peers (the local gather, the relay) whenever anything is in flight.
  engine::Task<Status> body(uint32_t callno) {
    // (Not a conditional expression: g++ 12 mishandles co_await inside one.)
    if (plan_.schedule == Schedule::kDirect) co_return co_await direct(callno);
    co_return co_await hierarchical(callno);
  }

  double intra_ns = 0;
  bool headers_compared = false;

 private:
  std::byte* landing(int member, size_t off) const {
    return call_.bytes == 0 ? nullptr : (*call_.landing)(member) + off;
  }
  int me() const { return net_.me(); }
  // The pieces of member's block (uneven blocks: each its own size).
  Pieces pieces(int member) const { return {call_.block(member), plan_.net_piece}; }
  // A message is the header alone when there are no bytes behind it.
  static size_t iovs(size_t len) { return len == 0 ? 1 : 2; }

  // The server-local phase: the one-shot gather over shared memory, with
  // member indices translated to the group's. keep: also leave each block in
  // its landing place (a leader sends them on from there).
  engine::Task<Status> local_phase(bool keep) {
    const int base = topo_.first[topo_.mine];
    GatherCall c = call_;
    c.landing = nullptr;
    c.stats = nullptr;
    if (c.sizes != nullptr) c.sizes += base;  // the server's members, by their local index
    auto translate = [&](int m, size_t off, const std::byte* src, size_t len) {
      const int member = base + m;
      if (keep) {
        std::byte* dst = landing(member, off);
        if (dst != src) std::memcpy(dst, src, len);
        src = dst;
        // A member's pieces arrive in order: what lies below off+len has landed.
        if (forwarding_ && forward_error_.ok()) forward_error_ = forward(forward_call_, member, off + len);
      }
      sink_(member, off, src, len);
    };
    Status s = co_await gather(local_, c, plan_, translate);
    if (s.kind() == ErrorKind::kMismatch) headers_compared = true;
    co_return s;
  }

  // Receives of every piece of every member in [first, last) from `from(member)`.
  template <class From>
  Status post_receives(uint32_t callno, int first, int last, From from) {
    for (int m = first; m < last; ++m) {
      if (topo_.local(m)) continue;
      for (uint32_t p = 0; p < pieces(m).count(); ++p) {
        expected_.push_back({m, p, {}});
      }
    }
    // Addresses of headers are taken only once the vector stops growing.
    for (size_t t = 0; t < expected_.size(); ++t) {
      Expected& e = expected_[t];
      const Pieces of = pieces(e.owner);
      NetIov iov[2] = {{&e.header, sizeof(PostHeader)}, {landing(e.owner, of.offset(e.piece)), of.length(e.piece)}};
      if (Status s = net_.recv(from(e.owner), e.owner, callno, e.piece, std::span(iov, iovs(of.length(e.piece))),
                               static_cast<int>(t));
          !s.ok()) {
        return s;
      }
    }
    return Status::Ok();
  }

  // Times the server-local phase (the rest of the call is inter-server time).
  engine::Task<Status> timed_local_phase(bool keep) {
    const auto t = Clock::now();
    Status s = co_await local_phase(keep);
    intra_ns += ns_since(t);
    co_return s;
  }

  // Sends piece p of `owner`'s block, whose bytes start at block_start, to
  // member `to`, behind this member's header (the header alone for 0 bytes).
  Status send_piece(uint32_t callno, int to, int owner, uint32_t p, const std::byte* block_start) {
    const Pieces of = pieces(owner);
    NetIov iov[2] = {{const_cast<PostHeader*>(&mine_), sizeof(PostHeader)},
                     {const_cast<std::byte*>(block_start) + of.offset(p), of.length(p)}};
    return net_.send(to, owner, callno, p, std::span(iov, iovs(of.length(p))));
  }

  // Sends every piece of `owner`'s block, read from src, to member `to`.
  Status send_block(uint32_t callno, int to, int owner, const std::byte* src) {
    for (uint32_t p = 0; p < pieces(owner).count(); ++p) {
      if (Status s = send_piece(callno, to, owner, p, src); !s.ok()) return s;
    }
    return Status::Ok();
  }

  // Leader: sends the not yet sent pieces of local member `member` that lie
  // wholly below `upto` (the bytes of it landed so far) to every other leader.
  Status forward(uint32_t callno, int member, size_t upto) {
    uint32_t& next = sent_[static_cast<size_t>(member - topo_.first[topo_.mine])];
    const Pieces of = pieces(member);
    for (; next < of.count() && of.offset(next) + of.length(next) <= upto; ++next) {
      for (int slot = 0; slot < topo_.servers(); ++slot) {
        if (slot == topo_.mine) continue;
        if (Status s = send_piece(callno, topo_.leader(slot), member, next, landing(member, 0)); !s.ok()) return s;
      }
    }
    return Status::Ok();
  }

  // Waits for the next received piece and checks it is the call we expect.
  engine::Task<Result<const Expected*>> next_piece() {
    auto c = co_await engine::any_receive(net_);
    if (!c.ok()) co_return c.status();
    const Expected& e = expected_[static_cast<size_t>(c.value().token)];
    Status s = check_message(net_, call_, mine_, e.header, c.value().length, pieces(e.owner).length(e.piece),
                             {.owner = e.owner, .piece = e.piece, .what = "block"});
    if (!s.ok()) {
      headers_compared = c.value().length >= sizeof(PostHeader);
      co_return s;
    }
    co_return &e;
  }

  // Direct: every member sends its block to every member on other servers,
  // posts receives for theirs straight into their landing places, and runs
  // the server-local gather while the network works.
  engine::Task<Status> direct(uint32_t callno) {
    expected_.clear();
    if (Status s = post_receives(callno, 0, topo_.members(), [](int m) { return m; }); !s.ok()) co_return s;
    for (int m = 0; m < topo_.members(); ++m) {
      if (topo_.local(m)) continue;
      if (Status s = send_block(callno, m, me(), call_.input); !s.ok()) co_return s;
    }
    if (Status s = co_await timed_local_phase(false); !s.ok()) co_return s;
    for (size_t left = expected_.size(); left > 0; --left) {
      auto e = co_await next_piece();
      if (!e.ok()) co_return e.status();
      const int owner = e.value()->owner;
      const size_t off = pieces(owner).offset(e.value()->piece), len = pieces(owner).length(e.value()->piece);
      if (len != 0) sink_(owner, off, landing(owner, off), len);
    }
    co_return co_await engine::sends_done(net_);
  }

  // Hierarchical: the leader posts its receives, then gathers within the
  // server, sending each local piece on to the other leaders as it lands;
  // it relays what it receives to its server's members through its
  // shared-memory ring, piece by piece as the pieces arrive.
  engine::Task<Status> hierarchical(uint32_t callno) {
    const int leader = topo_.leader(topo_.mine);
    const bool am_leader = me() == leader;
    if (am_leader) {
      // Receives first, and each local block's pieces go to the other
      // leaders as soon as they have landed here: the network works while
      // the server-local gather is still going.
      expected_.clear();
      if (Status s = post_receives(callno, 0, topo_.members(), [&](int m) { return topo_.leader(topo_.server_of(m)); });
          !s.ok()) {
        co_return s;
      }
      sent_.assign(static_cast<size_t>(topo_.local_count()), 0);
      forward_call_ = callno;
      forwarding_ = true;
    }
    Status s = co_await timed_local_phase(am_leader);
    forwarding_ = false;
    if (!s.ok()) co_return s;
    if (!forward_error_.ok()) co_return forward_error_;
    if (am_leader) {
      for (int m = topo_.first[topo_.mine]; m < topo_.first[topo_.mine + 1]; ++m) {
        if (Status f = forward(callno, m, call_.block(m)); !f.ok()) co_return f;  // 0 bytes: the header alone
      }
    }
    const size_t chunk = plan_.relay_piece;
    const bool relay = topo_.local_count() > 1 && call_.bytes != 0;
    // The relay's steps through the leader's ring: a lockstep in which only
    // the leader posts bytes, with their owner and offset in its header. The
    // first is a full lockstep among the server's members: after it, everyone
    // has finished reading everyone's last local-phase step. Later ones wait
    // for the leader only (the leader waits for everyone, so nobody is more
    // than one step ahead of another), and the leader for everyone: their
    // post of a step says they are done with the one before.
    CallState relay_state(local_, call_, plan_);
    relay_state.first = false;  // the local phase compared the headers
    constexpr int kLeader = 0;  // the leader is local member 0

    if (!am_leader) {
      // As many relay steps as the leader will post: each remote piece, cut into ring steps.
      size_t steps = 0;
      for (int m = 0; relay && m < topo_.members(); ++m) {
        if (topo_.local(m)) continue;
        const Pieces of = pieces(m);
        for (uint32_t p = 0; p < of.count(); ++p) steps += (of.length(p) + chunk - 1) / chunk;
      }
      auto nothing = [] {};
      auto relayed = [&](int peer, const PostHeader& h, const std::byte* src) {
        if (peer != kLeader) return;
        const int owner = static_cast<int>(h.aux >> 48);
        const size_t off = h.aux & ((uint64_t{1} << 48) - 1);
        sink_(owner, off, src, h.bytes);
      };
      for (size_t i = 0; i < steps; ++i) {
        const Step empty{.only_from = i == 0 ? -1 : kLeader};
        if (Status s = co_await lockstep(relay_state, empty, nothing, relayed); !s.ok()) co_return s;
      }
      co_return Status::Ok();
    }

    auto nothing = [] {};
    auto ignore = [](int, const PostHeader&, const std::byte*) {};
    for (size_t left = expected_.size(); left > 0; --left) {
      auto e = co_await next_piece();
      if (!e.ok()) co_return e.status();
      const int owner = e.value()->owner;
      const size_t off0 = pieces(owner).offset(e.value()->piece), len0 = pieces(owner).length(e.value()->piece);
      if (len0 == 0) continue;
      const std::byte* src = landing(owner, off0);
      sink_(owner, off0, src, len0);
      for (size_t at = 0; relay && at < len0; at += chunk) {
        PostHeader h = mine_;
        h.bytes = std::min(chunk, len0 - at);
        h.aux = (uint64_t(owner) << 48) | (off0 + at);
        const Step piece{.data = src + at, .len = h.bytes, .header = &h};
        if (Status s = co_await lockstep(relay_state, piece, nothing, ignore); !s.ok()) co_return s;
      }
    }
    co_return co_await engine::sends_done(net_);
  }

  ShmChannel& local_;
  NetChannel& net_;
  const Topology& topo_;
  const GatherCall& call_;
  const CallPlan& plan_;
  PieceSink sink_;
  const PostHeader mine_;
  std::vector<Expected> expected_;
  // Leader, hierarchical: per local member, the pieces already sent on.
  std::vector<uint32_t> sent_;
  bool forwarding_ = false;
  uint32_t forward_call_ = 0;
  Status forward_error_;
};

}  // namespace

Status check_message(const NetChannel& net, const GatherCall& call, const PostHeader& mine, const PostHeader& theirs,
                     size_t length, size_t want, MessageOf of) {
  if (length >= sizeof(PostHeader) && theirs.same_call(mine) && length == sizeof(PostHeader) + want) return Status::Ok();
  const bool has_header = length >= sizeof(PostHeader);
  const std::string sent = has_header ? describe(call, theirs, &mine) : fmt::format("a {}-byte message", length);
  const int from = net.world_rank(of.owner);
  return Status{ErrorKind::kMismatch,
                fmt::format("{}: rank {} sent {} (piece {} of rank {}'s {}), rank {} expected {}", net.label(), from, sent,
                            of.piece, from, of.what, net.world_rank(net.me()),
                            describe(call, mine, has_header ? &theirs : nullptr)),
                from};
}

engine::Task<Status> gather_across(ShmChannel& local, NetChannel& net, const Topology& topo, GatherCall call,
                                   const CallPlan& plan, PieceSink sink) {
  Across run(local, net, topo, call, plan, sink);
  co_return co_await run_across(local, net, plan, call.stats, run);
}

}  // namespace fastgather::algo
