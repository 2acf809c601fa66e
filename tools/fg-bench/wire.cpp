#include "wire.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "stats.hpp"
#include "engine/waits.hpp"
#include "transport/net_channel.hpp"

namespace fastgather::bench {

Result<std::vector<CopyPoint>> measure_wire(Communicator& comm, const std::vector<size_t>& sizes_in) {
  using Clock = std::chrono::steady_clock;
  const Config& c = comm.config();
  const int peer = c.first_rank_on(1);
  const bool active = c.rank == 0 || c.rank == peer;
  std::unique_ptr<transport::UcxContext> context;
  std::unique_ptr<transport::UcxWorker> worker;
  constexpr size_t kSlot = 4096;
  std::vector<char> mine(kSlot, 0), all(kSlot * static_cast<size_t>(c.world_size), 0);
  if (active) {
    auto ctx = transport::UcxContext::create({.loopback = comm.simulated_servers()});
    if (!ctx.ok()) return ctx.status();
    context = std::move(ctx).value();
    auto w = transport::UcxWorker::create(*context);
    if (!w.ok()) return w.status();
    worker = std::move(w).value();
    const std::string& a = worker->address();
    if (a.size() + 4 > kSlot) return Status{ErrorKind::kUnsupported, "UCX worker address too long to exchange"};
    const auto len = static_cast<uint32_t>(a.size());
    std::memcpy(mine.data(), &len, 4);
    std::memcpy(mine.data() + 4, a.data(), a.size());
  }
  if (Status s = all_gather(comm.world(), TensorView(mine.data(), DType::kU8, {static_cast<int64_t>(kSlot)}),
                            TensorView(all.data(), DType::kU8, {static_cast<int64_t>(all.size())}));
      !s.ok()) {
    return s;
  }
  std::vector<CopyPoint> points;
  if (active) {
    const int other = c.rank == 0 ? peer : 0;
    uint32_t len = 0;
    std::memcpy(&len, all.data() + static_cast<size_t>(other) * kSlot, 4);
    std::vector<std::string> addresses(2);
    const int me = c.rank == 0 ? 0 : 1;
    addresses[1 - me].assign(all.data() + static_cast<size_t>(other) * kSlot + 4, len);
    auto ch = transport::NetChannel::connect(std::move(worker), 1, {0, peer}, me, addresses, "wire");
    if (!ch.ok()) return ch.status();
    transport::NetChannel& net = *ch.value();
    std::vector<size_t> sizes = sizes_in;
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    std::vector<char> buf(sizes.empty() ? 1 : std::max<size_t>(sizes.back(), 1), 1);
    // One round trip: rank 0 sends, the peer answers with the same size.
    auto trip = [&](size_t bytes) -> engine::Task<Status> {
      const uint32_t call = net.next_call();
      transport::NetIov iov{buf.data(), bytes};
      const std::span<const transport::NetIov> v(&iov, 1);
      if (me == 0) {
        if (Status s = net.send(1, 0, call, 0, v); !s.ok()) co_return s;
        if (Status s = net.recv(1, 1, call, 0, v, 0); !s.ok()) co_return s;
      } else {
        if (Status s = net.recv(0, 0, call, 0, v, 0); !s.ok()) co_return s;
        if (auto r = co_await engine::any_receive(net); !r.ok()) co_return r.status();
        if (Status s = net.send(0, 1, call, 0, v); !s.ok()) co_return s;
        co_return co_await engine::sends_done(net);
      }
      if (auto r = co_await engine::any_receive(net); !r.ok()) co_return r.status();
      co_return co_await engine::sends_done(net);
    };
    auto round = [&](size_t bytes) {
      engine::DriveOptions o;
      o.policy = transport::WaitPolicy::for_members(2, c.timeout);
      o.net = &net;
      return engine::Driver::run(trip(bytes), o);
    };
    for (size_t bytes : sizes) {
      const int reps = static_cast<int>(std::clamp<size_t>((32u << 20) / std::max<size_t>(bytes, 1), 10, 500));
      for (int i = 0; i < 3; ++i) {
        if (Status s = round(bytes); !s.ok()) return s;
      }
      std::vector<double> us;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        if (Status s = round(bytes); !s.ok()) return s;
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
      }
      points.push_back({bytes, summarize(us).median});
    }
  }
  if (Status s = barrier(comm.world()); !s.ok()) return s;
  return points;
}

}  // namespace fastgather::bench
