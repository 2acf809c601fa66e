#include "algo/across.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "algo/lockstep.hpp"
#include "algo/reduce_steps.hpp"
#include "engine/waits.hpp"

namespace fastgather::algo {
namespace {

using Clock = std::chrono::steady_clock;
using transport::NetChannel;
using transport::NetIov;
using transport::PostHeader;
using transport::Channel;

// Nanoseconds since t, for the stats' split of a call's time.
double ns_since(Clock::time_point t) { return std::chrono::duration<double, std::nano>(Clock::now() - t).count(); }

// The messages of one call between servers, for every schedule that crosses
// them: each is the sender's header (the call it runs), then one piece of
// one member's bytes (the header alone for none). A schedule says which
// pieces it expects, from whom and where they land (expect, then
// post_receives once), sends its own (send), and takes what arrives in the
// order it arrives (next), each checked first: a message of another call, or
// of another length, is a kMismatch naming both sides' calls.
class Exchange {
 public:
  struct Message {
    int from;        // the member that sends it
    int owner;       // the member whose bytes it carries
    uint32_t piece;  // which piece of them
    std::byte* dst;  // where they land
    size_t len;
    PostHeader header = {};  // the sender's, once it arrived
  };

  // `what` names the bytes in errors ("block", "partial sums").
  Exchange(NetChannel& net, const GatherCall& call, const PostHeader& mine, uint32_t callno, const char* what)
      : net_(net), call_(call), mine_(mine), callno_(callno), what_(what) {}

  void expect(int from, int owner, uint32_t piece, std::byte* dst, size_t len) {
    messages_.push_back({from, owner, piece, dst, len});
  }
  // Posts a receive for every message expected (once, after the last expect:
  // the headers' addresses are taken here).
  Status post_receives() {
    for (size_t t = 0; t < messages_.size(); ++t) {
      Message& m = messages_[t];
      NetIov iov[2] = {{&m.header, sizeof(PostHeader)}, {m.dst, m.len}};
      if (Status s = net_.recv(m.from, m.owner, callno_, m.piece, std::span(iov, iovs(m.len)), static_cast<int>(t));
          !s.ok()) {
        return s;
      }
    }
    return Status::Ok();
  }
  size_t expected() const { return messages_.size(); }

  // Sends piece `piece` of `owner`'s bytes (len of them, at src) to `to`,
  // behind this member's header.
  Status send(int to, int owner, uint32_t piece, const std::byte* src, size_t len) {
    NetIov iov[2] = {{const_cast<PostHeader*>(&mine_), sizeof(PostHeader)}, {const_cast<std::byte*>(src), len}};
    return net_.send(to, owner, callno_, piece, std::span(iov, iovs(len)));
  }

  // The next expected message that arrived, once it is known to be of this call.
  engine::Task<Result<const Message*>> next() {
    auto c = co_await engine::any_receive(net_);
    if (!c.ok()) co_return c.status();
    const Message& m = messages_[static_cast<size_t>(c.value().token)];
    const size_t length = c.value().length;
    const bool has_header = length >= sizeof(PostHeader);
    if (has_header && m.header.same_call(mine_) && length == sizeof(PostHeader) + m.len) co_return &m;
    headers_compared = has_header;
    const std::string sent = has_header ? describe(call_, m.header, &mine_) : fmt::format("a {}-byte message", length);
    const int owner = net_.world_rank(m.owner);
    co_return Status{ErrorKind::kMismatch,
                     fmt::format("{}: rank {} sent {} (piece {} of rank {}'s {}), rank {} expected {}", net_.label(),
                                 net_.world_rank(m.from), sent, m.piece, owner, what_, net_.world_rank(net_.me()),
                                 describe(call_, mine_, has_header ? &m.header : nullptr)),
                     net_.world_rank(m.from)};
  }
  // Every send of this call has completed (its bytes may be written again).
  engine::SendsDone sends_done() { return engine::sends_done(net_); }

  // A header of another call arrived: this member can name both calls.
  bool headers_compared = false;

 private:
  // A message is the header alone when there are no bytes behind it.
  static size_t iovs(size_t len) { return len == 0 ? 1 : 2; }

  NetChannel& net_;
  const GatherCall& call_;
  const PostHeader& mine_;
  const uint32_t callno_;
  const char* what_;
  std::vector<Message> messages_;
};

// One call across servers, run by `run` (its body(exchange) and what it
// found: intra_ns, the time of its server-local phases): refused at once
// where a channel has broken or the plan says no; on failure both channels
// are broken, so that nobody on this server waits for a step that will not
// come and what is in flight is dropped; stats, when set, get the intra- and
// inter-server times and whether headers were compared.
template <class Run>
engine::Task<Status> run_across(Channel& local, NetChannel& net, const GatherCall& call, const CallPlan& plan,
                                const char* what, Run& run) {
  if (!net.broken().ok()) co_return net.broken();
  if (!local.broken().ok()) co_return local.broken();
  if (!plan.error.ok()) co_return plan.error;
  const auto t0 = Clock::now();
  const PostHeader mine = header_of(call, plan);
  Exchange exchange(net, call, mine, net.next_call(), what);
  Status s = co_await run.body(exchange);
  if (!s.ok()) {
    net.fail(s);
    local.abort(s);
  }
  if (call.stats != nullptr) {
    call.stats->intra_ns = run.intra_ns;
    call.stats->inter_ns = ns_since(t0) - run.intra_ns;
    call.stats->headers_compared = exchange.headers_compared || run.local_headers_compared;
  }
  co_return s;
}

// The all-gather across servers: direct or hierarchical (across.hpp).
class Across {
 public:
  Across(Channel& local, NetChannel& net, const Topology& topo, const GatherCall& call, const CallPlan& plan,
         PieceSink sink)
      : local_(local), net_(net), topo_(topo), call_(call), plan_(plan), sink_(sink) {}

  // The engine keeps the network moving while this member waits for local
  // peers (the local gather, the relay) whenever anything is in flight.
  engine::Task<Status> body(Exchange& ex) {
    ex_ = &ex;
    // (Not a conditional expression: g++ 12 mishandles co_await inside one.)
    if (plan_.schedule == Schedule::kDirect) co_return co_await direct();
    co_return co_await hierarchical();
  }

  double intra_ns = 0;
  bool local_headers_compared = false;

 private:
  std::byte* landing(int member, size_t off) const {
    return call_.bytes == 0 ? nullptr : (*call_.landing)(member) + off;
  }
  int me() const { return net_.me(); }
  // The pieces of member's block (uneven blocks: each its own size).
  Pieces pieces(int member) const { return {call_.block(member), plan_.net_piece}; }
  // The bytes of owner's block that reader keeps (GatherCall::part), and their pieces.
  struct Part {
    size_t offset;
    Pieces pieces;
  };
  Part part(int owner, int reader) const {
    if (call_.part == nullptr) return {0, pieces(owner)};
    size_t offset = 0;
    const size_t len = (*call_.part)(owner, reader, &offset);
    return {offset, {len, plan_.net_piece}};
  }

  // The server-local phase: the one-shot gather over shared memory, with
  // member indices translated to the group's. keep: also leave each block in
  // its landing place (a leader sends them on from there). With parts, each
  // member's block here is only what this server's members keep of it (from
  // the first such byte to the last): a member on another server gets its
  // part over the network, and nobody here needs it.
  engine::Task<Status> local_phase(bool keep) {
    const int base = topo_.first[topo_.mine];
    const int here = topo_.local_count();
    GatherCall c = call_;
    c.landing = nullptr;
    c.stats = nullptr;
    c.part = nullptr;
    c.part_from = nullptr;
    std::vector<size_t> span, lo;
    if (call_.part != nullptr) {
      span.assign(static_cast<size_t>(here), 0);
      lo.assign(static_cast<size_t>(here), 0);
      for (int k = 0; k < here; ++k) {
        size_t first = SIZE_MAX, last = 0;
        for (int r = 0; r < here; ++r) {
          size_t off = 0;
          const size_t len = (*call_.part)(base + k, base + r, &off);
          if (len == 0) continue;
          first = std::min(first, off);
          last = std::max(last, off + len);
        }
        if (first == SIZE_MAX) continue;
        lo[static_cast<size_t>(k)] = first;
        span[static_cast<size_t>(k)] = last - first;
      }
      c.sizes = span.data();
      c.bytes = *std::max_element(span.begin(), span.end());
      const size_t mine = lo[static_cast<size_t>(me() - base)];
      c.input = call_.input == nullptr || span[static_cast<size_t>(me() - base)] == 0 ? nullptr : call_.input + mine;
    } else if (c.sizes != nullptr) {
      c.sizes += base;  // the server's members, by their local index
    }
    auto translate = [&](int m, size_t off, const std::byte* src, size_t len) {
      const int member = base + m;
      if (!lo.empty()) off += lo[static_cast<size_t>(m)];
      if (keep) {
        std::byte* dst = landing(member, off);
        if (dst != src) std::memcpy(dst, src, len);
        src = dst;
        // A member's pieces arrive in order: what lies below off+len has landed.
        if (forwarding_ && forward_error_.ok()) forward_error_ = forward(member, off + len);
      }
      sink_(member, off, src, len);
    };
    Status s = co_await gather(local_, c, plan_, translate);
    if (s.kind() == ErrorKind::kMismatch) local_headers_compared = true;
    co_return s;
  }

  // Expects every piece of every member on another server from `from(member)`.
  template <class From>
  Status post_receives(From from) {
    for (int m = 0; m < topo_.members(); ++m) {
      if (topo_.local(m)) continue;
      const Pieces of = pieces(m);
      for (uint32_t p = 0; p < of.count(); ++p) ex_->expect(from(m), m, p, landing(m, of.offset(p)), of.length(p));
    }
    return ex_->post_receives();
  }

  // Times the server-local phase (the rest of the call is inter-server time).
  engine::Task<Status> timed_local_phase(bool keep) {
    const auto t = Clock::now();
    Status s = co_await local_phase(keep);
    intra_ns += ns_since(t);
    co_return s;
  }

  // Sends piece p of `owner`'s block, whose bytes start at block_start, to member `to`.
  Status send_piece(int to, int owner, uint32_t p, const std::byte* block_start) {
    const Pieces of = pieces(owner);
    return ex_->send(to, owner, p, block_start == nullptr ? nullptr : block_start + of.offset(p), of.length(p));
  }

  // Leader: sends the not yet sent pieces of local member `member` that lie
  // wholly below `upto` (the bytes of it landed so far) to every other leader.
  Status forward(int member, size_t upto) {
    uint32_t& next = sent_[static_cast<size_t>(member - topo_.first[topo_.mine])];
    const Pieces of = pieces(member);
    for (; next < of.count() && of.offset(next) + of.length(next) <= upto; ++next) {
      for (int slot = 0; slot < topo_.servers(); ++slot) {
        if (slot == topo_.mine) continue;
        if (Status s = send_piece(topo_.leader(slot), member, next, landing(member, 0)); !s.ok()) return s;
      }
    }
    return Status::Ok();
  }

  // Direct: every member sends its block to every member on other servers,
  // posts receives for theirs straight into their landing places, and runs
  // the server-local gather while the network works.
  // With parts (GatherCall::part), each member on another server is sent
  // only its part of the block (an empty one: the header alone, so that
  // every pair still compares calls).
  engine::Task<Status> direct() {
    for (int m = 0; m < topo_.members(); ++m) {
      if (topo_.local(m)) continue;
      const Part in = part(m, me());
      for (uint32_t p = 0; p < in.pieces.count(); ++p) {
        const size_t len = in.pieces.length(p);
        // With parts, landing(m) is where m's part for this member goes.
        const size_t at = (call_.part != nullptr ? 0 : in.offset) + in.pieces.offset(p);
        ex_->expect(m, m, p, len == 0 ? nullptr : landing(m, at), len);
      }
    }
    if (Status s = ex_->post_receives(); !s.ok()) co_return s;
    for (int m = 0; m < topo_.members(); ++m) {
      if (topo_.local(m)) continue;
      const Part out = part(me(), m);
      for (uint32_t p = 0; p < out.pieces.count(); ++p) {
        const size_t len = out.pieces.length(p);
        const std::byte* src = nullptr;
        if (len != 0) src = (call_.part_from != nullptr ? (*call_.part_from)(m) : call_.input + out.offset) + out.pieces.offset(p);
        if (Status s = ex_->send(m, me(), p, src, len); !s.ok()) co_return s;
      }
    }
    if (call_.local_phase != nullptr) {
      const auto t = Clock::now();
      Status s = co_await (*call_.local_phase)();
      intra_ns += ns_since(t);
      if (s.kind() == ErrorKind::kMismatch) local_headers_compared = true;
      if (!s.ok()) co_return s;
    } else if (Status s = co_await timed_local_phase(false); !s.ok()) {
      co_return s;
    }
    for (size_t left = ex_->expected(); left > 0; --left) {
      auto got = co_await ex_->next();
      if (!got.ok()) co_return got.status();
      const Exchange::Message& m = *got.value();
      if (m.len == 0) continue;
      const Part in = part(m.owner, me());
      sink_(m.owner, in.offset + in.pieces.offset(m.piece), m.dst, m.len);
    }
    co_return co_await ex_->sends_done();
  }

  // Hierarchical: the leader posts its receives, then gathers within the
  // server, sending each local piece on to the other leaders as it lands;
  // it relays what it receives to its server's members through its
  // shared-memory ring, piece by piece as the pieces arrive.
  engine::Task<Status> hierarchical() {
    const int leader = topo_.leader(topo_.mine);
    const bool am_leader = me() == leader;
    if (am_leader) {
      // Receives first, and each local block's pieces go to the other
      // leaders as soon as they have landed here: the network works while
      // the server-local gather is still going.
      if (Status s = post_receives([&](int m) { return topo_.leader(topo_.server_of(m)); }); !s.ok()) co_return s;
      sent_.assign(static_cast<size_t>(topo_.local_count()), 0);
      forwarding_ = true;
    }
    Status s = co_await timed_local_phase(am_leader);
    forwarding_ = false;
    if (!s.ok()) co_return s;
    if (!forward_error_.ok()) co_return forward_error_;
    if (am_leader) {
      for (int m = topo_.first[topo_.mine]; m < topo_.first[topo_.mine + 1]; ++m) {
        if (Status f = forward(m, call_.block(m)); !f.ok()) co_return f;  // 0 bytes: the header alone
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
    for (size_t left = ex_->expected(); left > 0; --left) {
      auto got = co_await ex_->next();
      if (!got.ok()) co_return got.status();
      const Exchange::Message& m = *got.value();
      if (m.len == 0) continue;
      const size_t off0 = pieces(m.owner).offset(m.piece);
      sink_(m.owner, off0, m.dst, m.len);
      for (size_t at = 0; relay && at < m.len; at += chunk) {
        PostHeader h = relay_state.mine;
        h.bytes = std::min(chunk, m.len - at);
        h.aux = (uint64_t(m.owner) << 48) | (off0 + at);
        const Step piece{.data = m.dst + at, .len = h.bytes, .header = &h};
        if (Status s = co_await lockstep(relay_state, piece, nothing, ignore); !s.ok()) co_return s;
      }
    }
    co_return co_await ex_->sends_done();
  }

  Channel& local_;
  NetChannel& net_;
  const Topology& topo_;
  const GatherCall& call_;
  const CallPlan& plan_;
  PieceSink sink_;
  Exchange* ex_ = nullptr;
  // Leader, hierarchical: per local member, the pieces already sent on.
  std::vector<uint32_t> sent_;
  bool forwarding_ = false;
  Status forward_error_;
};

// The sums across servers, hierarchical (across.hpp).
class SumAcross {
 public:
  SumAcross(Channel& local, NetChannel& net, const Topology& topo, const GatherCall& call, const CallPlan& plan,
            std::byte* out, SumsAcross sums)
      : local_(local), net_(net), topo_(topo), call_(call), plan_(plan), out_(out), sums_(sums), layout_(topo, call),
        scatter_(scatters(call)), j_(net.me() - topo.first[topo.mine]),
        pieces_{layout_.result(scatter_, j_), plan.net_piece} {}

  engine::Task<Status> body(Exchange& ex) {
    const int S = layout_.servers, me_server = topo_.mine;
    const size_t result = pieces_.bytes;
    // Room for every server's partial sums (this server's slot stays unused),
    // then this member's own, then a ring piece (the reduce-scatter's own pieces).
    const size_t slab = layout_.size(j_);
    const size_t received = (wide(result) * static_cast<size_t>(S) + 63) / 64 * 64;  // own_ on a cache line
    const size_t own = wide(slab) + (scatter_ ? plan_.piece : 0);
    std::vector<std::byte>& work = sums_.work != nullptr ? *sums_.work : call_work_;
    if (work.size() < received + own) work.resize(received + own);
    received_ = work.data();
    own_ = work.data() + received;
    for (int t = 0; t < S; ++t) {
      if (t == me_server) continue;
      for (uint32_t p = 0; p < pieces_.count(); ++p) {
        ex.expect(member_on(t), member_on(t), p, slot(t) + wide(pieces_.offset(p)), wide(pieces_.length(p)));
      }
    }
    if (Status s = ex.post_receives(); !s.ok()) co_return s;

    CallState st(local_, call_, plan_);
    const auto t0 = Clock::now();
    if (Status s = co_await partial_sums(st); !s.ok()) {
      local_headers_compared = s.kind() == ErrorKind::kMismatch;  // the server's members compared theirs
      co_return s;
    }
    intra_ns += ns_since(t0);

    for (int t = 0; t < S; ++t) {
      if (t == me_server) continue;
      const std::byte* from = partial_ + wide(layout_.sent_from(scatter_, t));
      for (uint32_t p = 0; p < pieces_.count(); ++p) {
        if (Status s = ex.send(member_on(t), net_.me(), p, from + wide(pieces_.offset(p)), wide(pieces_.length(p)));
            !s.ok()) {
          co_return s;
        }
      }
    }

    // Each piece is summed once every other server's part of it is here.
    std::vector<int> arrived(pieces_.count(), 0);
    Sources srcs(S);
    const size_t result_at = scatter_ ? 0 : layout_.first(j_);
    for (size_t left = ex.expected(); left > 0; --left) {
      auto got = co_await ex.next();
      if (!got.ok()) co_return got.status();
      const uint32_t p = got.value()->piece;
      if (++arrived[p] < S - 1 || result == 0) continue;
      const size_t off = pieces_.offset(p);
      for (int u = 0; u < S; ++u) {
        srcs[static_cast<size_t>(u)] = u == me_server ? partial_ + wide(layout_.sent_from(scatter_, u) + off) : slot(u) + wide(off);
      }
      sums_.of_partials(result_at + off, srcs.data(), S, pieces_.length(p));
    }
    if (Status s = co_await ex.sends_done(); !s.ok()) co_return s;

    if (!scatter_ && !layout_.whole && layout_.locals > 1) {
      const auto t1 = Clock::now();
      Status s = co_await share_sums(st, layout_.slabs, out_);
      intra_ns += ns_since(t1);
      if (!s.ok()) co_return s;
    }
    co_return co_await finish(st);
  }

  double intra_ns = 0;
  bool local_headers_compared = false;

 private:
  int member_on(int server) const { return topo_.first[server] + j_; }
  size_t wide(size_t bytes) const { return bytes * sums_.widen; }
  std::byte* slot(int server) const { return received_ + wide(pieces_.bytes) * static_cast<size_t>(server); }

  // Step 1: this server's partial sums of this member's slab, at partial_.
  engine::Task<Status> partial_sums(CallState& st) {
    const size_t slab = layout_.size(j_);
    if (layout_.locals == 1) {
      // The slab is the input. It is sent as it is unless it must be widened,
      // or an all_reduce in place would overwrite it while it is being sent.
      if (sums_.widen == 1 && (scatter_ || out_ != call_.input) && sums_.produce == nullptr) {
        partial_ = call_.input;
        co_return Status::Ok();
      }
      partial_ = own_;
      if (sums_.produce != nullptr) {  // every server's chunk, made a ring piece at a time as within a server
        const size_t step = std::max<size_t>(plan_.piece, 1);
        for (int t = 0; t < layout_.servers; ++t) {
          for (size_t at = 0; at < layout_.chunk; at += step) {
            (*sums_.produce)(t, at, std::min(step, layout_.chunk - at), own_ + static_cast<size_t>(t) * layout_.chunk + at);
          }
        }
      } else if (slab != 0) {
        sums_.partial(own_, &call_.input, 1, slab);
      }
      co_return Status::Ok();
    }
    partial_ = own_;
    std::byte* partials = own_;
    auto sum = [&](size_t offset, const std::byte* const* srcs, int n, size_t bytes) {
      sums_.partial(partials + wide(offset), srcs, n, bytes);
    };
    FunctionRef<void(size_t, const std::byte* const*, int, size_t)> sum_ref(sum);
    // (out_: an all_reduce in place must not let peers read the input where
    // it lies, as this member overwrites it with the sums.)
    if (layout_.whole) co_return co_await sum_everything(st, out_, sum_ref);
    if (!scatter_) co_return co_await scatter_sums(st, layout_.slabs, 0, sum_ref);
    // Slab d holds the chunks of members d, L+d, 2L+d, ...: byte x of it is
    // byte x % chunk of chunk (x / chunk) * L + d of the input.
    const size_t chunk = layout_.chunk;
    const size_t locals = static_cast<size_t>(layout_.locals);
    auto produce = [&](int d, size_t offset, size_t len, std::byte* dst) {
      while (len != 0) {
        const size_t t = offset / chunk, within = offset % chunk, take = std::min(len, chunk - within);
        const size_t member = t * locals + static_cast<size_t>(d);
        if (sums_.produce != nullptr) (*sums_.produce)(static_cast<int>(member), within, take, dst);
        else std::memcpy(dst, call_.input + member * chunk + within, take);
        dst += take;
        offset += take;
        len -= take;
      }
    };
    Produce produce_ref(produce);
    co_return co_await scatter_sums(st, layout_.slabs, 0, sum_ref, &produce_ref, own_ + wide(slab));
  }

  Channel& local_;
  NetChannel& net_;
  const Topology& topo_;
  const GatherCall& call_;
  const CallPlan& plan_;
  std::byte* out_;
  SumsAcross sums_;
  const SumLayout layout_;
  const bool scatter_;
  const int j_;  // this member's index on its server
  const Pieces pieces_;  // of what this member sums: its chunk, or its slab
  const std::byte* partial_ = nullptr;
  std::byte* received_ = nullptr;  // every server's partial sums, by server
  std::byte* own_ = nullptr;       // this member's, when made here
  std::vector<std::byte> call_work_;
};

}  // namespace

engine::Task<Status> gather_across(Channel& local, NetChannel& net, const Topology& topo, GatherCall call,
                                   const CallPlan& plan, PieceSink sink) {
  Across run(local, net, topo, call, plan, sink);
  co_return co_await run_across(local, net, call, plan, "block", run);
}

engine::Task<Status> sum_across(Channel& local, NetChannel& net, const Topology& topo, GatherCall call,
                                const CallPlan& plan, std::byte* out, SumsAcross sums) {
  SumAcross run(local, net, topo, call, plan, out, sums);
  co_return co_await run_across(local, net, call, plan, "partial sums", run);
}

}  // namespace fastgather::algo
