#include "algo/reduce_net.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "algo/allgather_net.hpp"
#include "algo/lockstep.hpp"
#include "algo/reduce_steps.hpp"
#include "engine/waits.hpp"

namespace fastgather::algo {
namespace {

using Clock = std::chrono::steady_clock;
using transport::NetChannel;
using transport::NetIov;
using transport::PostHeader;
using transport::ShmChannel;

class SumAcross {
 public:
  SumAcross(ShmChannel& local, NetChannel& net, const Topology& topo, const GatherCall& call, const CallPlan& plan,
            std::byte* out, SumsAcross sums)
      : local_(local), net_(net), topo_(topo), call_(call), plan_(plan), out_(out), sums_(sums), layout_(topo, call),
        scatter_(scatters(call)), j_(net.me() - topo.first[topo.mine]), mine_(header_of(call, plan)),
        pieces_{layout_.result(scatter_, j_), plan.net_piece} {}

  engine::Task<Status> body(uint32_t callno) { return exchange(callno); }

  double intra_ns = 0;
  bool headers_compared = false;

 private:
  int member_on(int server) const { return topo_.first[server] + j_; }
  size_t wide(size_t bytes) const { return bytes * sums_.widen; }

  engine::Task<Status> exchange(uint32_t callno) {
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
    headers_.assign(static_cast<size_t>(S - 1) * pieces_.count(), PostHeader{});
    int token = 0;
    for (int t = 0; t < S; ++t) {
      if (t == me_server) continue;
      for (uint32_t p = 0; p < pieces_.count(); ++p, ++token) {
        NetIov iov[2] = {{&headers_[static_cast<size_t>(token)], sizeof(PostHeader)},
                         {slot(t) + wide(pieces_.offset(p)), wide(pieces_.length(p))}};
        if (Status s = net_.recv(member_on(t), member_on(t), callno, p, std::span(iov, result == 0 ? 1 : 2), token);
            !s.ok()) {
          co_return s;
        }
      }
    }

    CallState st(local_, call_, plan_);
    const auto t0 = Clock::now();
    if (Status s = co_await partial_sums(st); !s.ok()) {
      headers_compared = s.kind() == ErrorKind::kMismatch;  // the server's members compared theirs
      co_return s;
    }
    intra_ns += ns_since(t0);

    for (int t = 0; t < S; ++t) {
      if (t == me_server) continue;
      const std::byte* from = partial_ + wide(layout_.sent_from(scatter_, t));
      for (uint32_t p = 0; p < pieces_.count(); ++p) {
        NetIov iov[2] = {{const_cast<PostHeader*>(&mine_), sizeof(PostHeader)},
                         {const_cast<std::byte*>(from) + wide(pieces_.offset(p)), wide(pieces_.length(p))}};
        if (Status s = net_.send(member_on(t), net_.me(), callno, p, std::span(iov, result == 0 ? 1 : 2)); !s.ok()) {
          co_return s;
        }
      }
    }

    // Each piece is summed once every other server's part of it is here.
    std::vector<int> arrived(pieces_.count(), 0);
    Sources srcs(S);
    const size_t result_at = scatter_ ? 0 : layout_.first(j_);
    for (size_t left = headers_.size(); left > 0; --left) {
      auto c = co_await engine::any_receive(net_);
      if (!c.ok()) co_return c.status();
      const int tok = c.value().token;
      const uint32_t p = static_cast<uint32_t>(tok) % pieces_.count();
      int t = tok / static_cast<int>(pieces_.count());
      t += t >= me_server ? 1 : 0;
      if (Status s = check_message(net_, call_, mine_, headers_[static_cast<size_t>(tok)], c.value().length,
                                   wide(pieces_.length(p)), {.owner = member_on(t), .piece = p, .what = "partial sums"});
          !s.ok()) {
        headers_compared = c.value().length >= sizeof(PostHeader);
        co_return s;
      }
      if (++arrived[p] < S - 1 || result == 0) continue;
      const size_t off = pieces_.offset(p);
      for (int u = 0; u < S; ++u) {
        srcs[static_cast<size_t>(u)] = u == me_server ? partial_ + wide(layout_.sent_from(scatter_, u) + off) : slot(u) + wide(off);
      }
      sums_.of_partials(result_at + off, srcs.data(), S, pieces_.length(p));
    }
    if (Status s = co_await engine::sends_done(net_); !s.ok()) co_return s;

    if (!scatter_ && !layout_.whole && layout_.locals > 1) {
      const auto t1 = Clock::now();
      Status s = co_await share_sums(st, layout_.slabs, out_);
      intra_ns += ns_since(t1);
      if (!s.ok()) co_return s;
    }
    if (st.in_place) co_return co_await done_reading(st);
    co_return Status::Ok();
  }

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

  ShmChannel& local_;
  NetChannel& net_;
  const Topology& topo_;
  const GatherCall& call_;
  const CallPlan& plan_;
  std::byte* out_;
  SumsAcross sums_;
  const SumLayout layout_;
  const bool scatter_;
  const int j_;  // this member's index on its server
  const PostHeader mine_;
  const Pieces pieces_;  // of what this member sums: its chunk, or its slab
  const std::byte* partial_ = nullptr;
  std::byte* received_ = nullptr;  // every server's partial sums, by server
  std::byte* own_ = nullptr;       // this member's, when made here
  std::vector<std::byte> call_work_;
  std::vector<PostHeader> headers_;
};

}  // namespace

engine::Task<Status> sum_across(ShmChannel& local, NetChannel& net, const Topology& topo, GatherCall call,
                                const CallPlan& plan, std::byte* out, SumsAcross sums) {
  SumAcross run(local, net, topo, call, plan, out, sums);
  co_return co_await run_across(local, net, plan, call.stats, run);
}

}  // namespace fastgather::algo
