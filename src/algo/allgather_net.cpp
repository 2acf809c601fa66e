#include "algo/allgather_net.hpp"

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

double ns_since(Clock::time_point t) { return std::chrono::duration<double, std::nano>(Clock::now() - t).count(); }

// One expected message: member `owner`'s piece `piece`, with the header the
// sender put in front of it.
struct Expected {
  int owner;
  uint32_t piece;
  PostHeader header;
};

// The pieces of one member's block.
struct Pieces {
  size_t bytes, piece;
  uint32_t count() const { return bytes == 0 ? 1 : static_cast<uint32_t>((bytes + piece - 1) / piece); }
  size_t offset(uint32_t p) const { return static_cast<size_t>(p) * piece; }
  size_t length(uint32_t p) const { return std::min(piece, bytes - offset(p)); }
};

class Across {
 public:
  Across(ShmChannel& local, NetChannel& net, const Topology& topo, const GatherCall& call, PieceSink sink)
      : local_(local), net_(net), topo_(topo), call_(call), sink_(sink),
        pieces_{call.bytes, net_piece_bytes(call.bytes, call.align, call.settings->net_piece_bytes)}, mine_(header_of(call)) {}

  // The engine keeps the network moving while this member waits for local
  // peers (the local gather, the relay) whenever anything is in flight.
  engine::Task<Status> run(Schedule schedule) {
    const uint32_t callno = net_.next_call();
    Status s;
    // (Not a conditional expression: g++ 12 mishandles co_await inside one.)
    if (schedule == Schedule::kDirect) {
      s = co_await direct(callno);
    } else {
      s = co_await hierarchical(callno);
    }
    if (!s.ok()) {
      // Leave nobody on this server waiting for a step that will not come,
      // and drop what is in flight.
      net_.fail(s);
      local_.abort(s);
    }
    co_return s;
  }

  double intra_ns = 0;
  bool headers_compared = false;

 private:
  std::byte* landing(int member, size_t off) const {
    return call_.bytes == 0 ? nullptr : (*call_.landing)(member) + off;
  }
  int me() const { return net_.me(); }

  // The server-local phase: the one-shot gather over shared memory, with
  // member indices translated to the group's. keep: also leave each block in
  // its landing place (a leader sends them on from there).
  engine::Task<Status> local_phase(bool keep) {
    const int base = topo_.first[topo_.mine];
    GatherCall c = call_;
    c.landing = nullptr;
    c.stats = nullptr;
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
    Status s = co_await gather(local_, c, translate);
    if (s.kind() == ErrorKind::kMismatch) headers_compared = true;
    co_return s;
  }

  // Receives of every piece of every member in [first, last) from `from(member)`.
  template <class From>
  Status post_receives(uint32_t callno, int first, int last, From from) {
    for (int m = first; m < last; ++m) {
      if (topo_.local(m)) continue;
      for (uint32_t p = 0; p < pieces_.count(); ++p) {
        expected_.push_back({m, p, {}});
      }
    }
    // Addresses of headers are taken only once the vector stops growing.
    for (size_t t = 0; t < expected_.size(); ++t) {
      Expected& e = expected_[t];
      NetIov iov[2] = {{&e.header, sizeof(PostHeader)}, {landing(e.owner, pieces_.offset(e.piece)), pieces_.length(e.piece)}};
      if (Status s = net_.recv(from(e.owner), e.owner, callno, e.piece, std::span(iov, call_.bytes == 0 ? 1 : 2),
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
    NetIov iov[2] = {{const_cast<PostHeader*>(&mine_), sizeof(PostHeader)},
                     {const_cast<std::byte*>(block_start) + pieces_.offset(p), pieces_.length(p)}};
    return net_.send(to, owner, callno, p, std::span(iov, call_.bytes == 0 ? 1 : 2));
  }

  // Sends every piece of `owner`'s block, read from src, to member `to`.
  Status send_block(uint32_t callno, int to, int owner, const std::byte* src) {
    for (uint32_t p = 0; p < pieces_.count(); ++p) {
      if (Status s = send_piece(callno, to, owner, p, src); !s.ok()) return s;
    }
    return Status::Ok();
  }

  // Leader: sends the not yet sent pieces of local member `member` that lie
  // wholly below `upto` (the bytes of it landed so far) to every other leader.
  Status forward(uint32_t callno, int member, size_t upto) {
    uint32_t& next = sent_[static_cast<size_t>(member - topo_.first[topo_.mine])];
    for (; next < pieces_.count() && pieces_.offset(next) + pieces_.length(next) <= upto; ++next) {
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
    const size_t want = sizeof(PostHeader) + pieces_.length(e.piece);
    if (c.value().length < sizeof(PostHeader) || !e.header.same_call(mine_) || c.value().length != want) {
      std::string theirs = c.value().length < sizeof(PostHeader)
                               ? fmt::format("a {}-byte message", c.value().length)
                               : describe(call_, e.header);
      headers_compared = c.value().length >= sizeof(PostHeader);
      co_return Status{ErrorKind::kMismatch, fmt::format("{}: rank {} sent {} (piece {} of rank {}'s block), rank {} expected {}",
                                                      net_.label(), net_.world_rank(e.owner), theirs, e.piece,
                                                      net_.world_rank(e.owner), net_.world_rank(me()),
                                                      describe(call_, mine_)),
                    net_.world_rank(e.owner)};
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
      const size_t off = pieces_.offset(e.value()->piece);
      if (call_.bytes != 0) sink_(e.value()->owner, off, landing(e.value()->owner, off), pieces_.length(e.value()->piece));
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
        if (Status f = forward(callno, m, call_.bytes); !f.ok()) co_return f;  // 0 bytes: the header alone
      }
    }
    const size_t chunk = call_.bytes == 0 ? 0 : max_piece(local_, call_.align);
    if (call_.bytes != 0 && chunk == 0) {
      co_return Status{ErrorKind::kUnsupported, fmt::format("{}: a {}-byte row exceeds the {}-byte ring step",
                                                            local_.label(), call_.align, local_.max_step_bytes())};
    }
    const int remote_members = topo_.members() - topo_.local_count();
    const bool relay = topo_.local_count() > 1 && call_.bytes != 0;

    if (!am_leader) {
      // As many relay steps as the leader will post: each remote piece, cut into ring steps.
      size_t steps = 0;
      for (uint32_t p = 0; relay && p < pieces_.count(); ++p) steps += (pieces_.length(p) + chunk - 1) / chunk;
      steps *= static_cast<size_t>(remote_members);
      for (size_t i = 0; i < steps; ++i) {
        const uint64_t step = local_.next_step();
        local_.post(step, mine_);
        // The first relay step is a full lockstep among the server's
        // members: after it, everyone has finished reading everyone's last
        // local-phase step. Later relay steps wait for the leader only, so
        // without this a member two relay steps ahead would reuse the post
        // line (and ring header) another member was still reading from the
        // local phase (seen: 3 members on a server got stale blocks).
        for (int peer = 1; i == 0 && peer < local_.members(); ++peer) {
          if (peer == local_.me()) continue;
          if (auto l = co_await engine::arrival(local_, peer, step); !l.ok()) co_return l.status();
        }
        auto line = co_await engine::arrival(local_, 0, step);  // the leader is local member 0
        if (!line.ok()) co_return line.status();
        const PostHeader& h = line.value()->header;
        const int owner = static_cast<int>(h.aux >> 48);
        const size_t off = h.aux & ((uint64_t{1} << 48) - 1);
        sink_(owner, off, local_.member_data(0, h.offset), h.bytes);
      }
      co_return Status::Ok();
    }

    for (size_t left = expected_.size(); left > 0; --left) {
      auto e = co_await next_piece();
      if (!e.ok()) co_return e.status();
      const int owner = e.value()->owner;
      const size_t off0 = pieces_.offset(e.value()->piece), len0 = pieces_.length(e.value()->piece);
      if (call_.bytes == 0) continue;
      const std::byte* src = landing(owner, off0);
      sink_(owner, off0, src, len0);
      for (size_t at = 0; relay && at < len0; at += chunk) {
        const size_t len = std::min(chunk, len0 - at);
        const uint64_t step = local_.next_step();
        uint32_t ring_at = 0;
        copy_into_ring(CopyIn::kCached, local_.claim(len, &ring_at), src + at, len);
        PostHeader h = mine_;
        h.bytes = len;
        h.aux = (uint64_t(owner) << 48) | (off0 + at);
        h.offset = ring_at;
        local_.post(step, h);
        // Lockstep with the members (see shm_channel.hpp): their post of this
        // step says they are done with the one before.
        for (int i = 1; i < local_.members(); ++i) {
          auto line = co_await engine::arrival(local_, i, step);
          if (!line.ok()) co_return line.status();
        }
      }
    }
    co_return co_await engine::sends_done(net_);
  }

  ShmChannel& local_;
  NetChannel& net_;
  const Topology& topo_;
  const GatherCall& call_;
  PieceSink sink_;
  Pieces pieces_;
  const PostHeader mine_;
  std::vector<Expected> expected_;
  // Leader, hierarchical: per local member, the pieces already sent on.
  std::vector<uint32_t> sent_;
  bool forwarding_ = false;
  uint32_t forward_call_ = 0;
  Status forward_error_;
};

}  // namespace

int Topology::server_of(int member) const {
  return static_cast<int>(std::upper_bound(first.begin(), first.end(), member) - first.begin()) - 1;
}

Topology Topology::of(const std::vector<int>& server_of_member, int me) {
  Topology t;
  for (size_t m = 0; m < server_of_member.size(); ++m) {
    if (m == 0 || server_of_member[m] != server_of_member[m - 1]) t.first.push_back(static_cast<int>(m));
  }
  t.first.push_back(static_cast<int>(server_of_member.size()));
  t.mine = t.server_of(me);
  return t;
}

// The crossover's default (Settings::hier_min_bytes): measured on TCP
// loopback (docs/multinode.md), hierarchical - the leader forwarding pieces
// while the local gather runs - was as fast or faster from well below it;
// direct keeps the small messages, where a real network's extra hop would show.
Schedule choose_schedule(const Topology& topo, size_t bytes, Schedule requested, size_t hier_min_bytes) {
  // Nothing to relay: only direct lets every member see every other member's header.
  if (bytes == 0) return Schedule::kDirect;
  if (requested == Schedule::kDirect || requested == Schedule::kHierarchical) return requested;
  if (topo.one_per_server()) return Schedule::kDirect;  // nothing to relay: the same messages
  return bytes >= hier_min_bytes ? Schedule::kHierarchical : Schedule::kDirect;
}

size_t net_piece_bytes(size_t bytes, size_t align, size_t configured) {
  configured = std::max<size_t>(configured, 4096);
  align = std::max<size_t>(align, 1);
  size_t piece = std::max(align, configured / align * align);
  // The tag has 16 bits for the piece: large blocks get larger pieces.
  const size_t min_piece = (bytes + transport::kMaxNetPieces - 1) / transport::kMaxNetPieces;
  if (piece < min_piece) piece = (min_piece + align - 1) / align * align;
  return piece;
}

engine::Task<Status> gather_across(ShmChannel& local, NetChannel& net, const Topology& topo, GatherCall call,
                                   PieceSink sink) {
  if (!net.broken().ok()) co_return net.broken();
  if (!local.broken().ok()) co_return local.broken();
  if (call.schedule == Schedule::kRingPass) {
    co_return Status{ErrorKind::kUnsupported, fmt::format("{}: the ring schedule runs within one server; a group across "
                                                          "servers runs direct or hierarchical", net.label())};
  }
  if (call.bytes != 0 && call.landing == nullptr) {
    co_return Status{ErrorKind::kUnsupported, fmt::format("{}: this op keeps no copy of the gathered blocks", net.label())};
  }
  GatherCall c = call;
  c.schedule = choose_schedule(topo, call.bytes, call.schedule, call.settings->hier_min_bytes);
  const auto t0 = Clock::now();
  Across run(local, net, topo, c, sink);
  Status s = co_await run.run(c.schedule);
  if (call.stats != nullptr) {
    call.stats->schedule = c.schedule;
    call.stats->intra_ns = run.intra_ns;
    call.stats->inter_ns = ns_since(t0) - run.intra_ns;
    call.stats->headers_compared = run.headers_compared;
  }
  co_return s;
}

}  // namespace fastgather::algo
