// The progress engine seen from the API: requests (start_*, test, wait), their
// order on a group, the deadline of a whole operation, abort() from another
// thread and from a signal handler, and finalize(). Real rank processes.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using namespace std::chrono_literals;
using fgtest::check_pattern;
using fgtest::fill_pattern;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// A job whose every rank runs body(config, communicator, world).
using WorldBody = std::function<std::string(const Config&, Communicator&, Group&)>;
std::vector<fgtest::RankResult> on_world(int world, const WorldBody& body, const fgtest::JobOptions& o = {}) {
  return fgtest::run_job(world, [&](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    return body(c, *comm.value(), comm.value()->world());
  }, o);
}

// One all-gather of `bytes` per member, in flight: its input, its outputs
// (contiguous, or one per member), the request, and a check of every byte.
struct InFlight {
  Tensor in;
  Tensor out;                 // contiguous form
  std::vector<Tensor> outs;   // list form
  Request req;
  uint64_t tag = 0;
  bool list = false;

  static InFlight start(Group& g, size_t bytes, uint64_t tag, bool list) {
    InFlight f;
    f.tag = tag;
    f.list = list;
    f.in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
    fill_pattern(f.in.data(), bytes, g.ranks()[g.rank()], tag);
    if (list) {
      std::vector<TensorView> views;
      for (int i = 0; i < g.size(); ++i) {
        f.outs.push_back(Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)}));
        views.push_back(f.outs.back().view());
      }
      // start_all_gather keeps its own copy of the list of views.
      f.req = start_all_gather(g, f.in.view(), std::span<const TensorView>(views));
    } else {
      f.out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * g.size()});
      f.req = start_all_gather(g, f.in.view(), f.out.view());
    }
    return f;
  }

  std::string check(const Group& g) const { return check(g.ranks()); }
  // The group's ranks, for a check after the group is gone.
  std::string check(const std::vector<int>& ranks) const {
    const size_t bytes = in.nbytes();
    for (size_t i = 0; i < ranks.size(); ++i) {
      const char* block = list ? outs[i].data_as<char>() : out.data_as<char>() + i * bytes;
      const long long bad = check_pattern(block, bytes, ranks[i], tag);
      RANK_CHECK(bad < 0, "request {} ({} bytes, {}): block of rank {} wrong at byte {}", tag, bytes,
                 list ? "list" : "contiguous", ranks[i], bad);
    }
    return "";
  }
};

// Several requests on the world and on this rank's TP group, started before
// any is waited for, completed in the reverse order (the oldest driven
// first), with blocking calls in between; every byte checked.
std::string many_in_flight(const Config& c, int tp) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& world = (*comm)->world();
  auto sub = (*comm)->tp_group_of_dp(tp, c.world_size / tp);
  RANK_OK(sub.status());
  const std::vector<size_t> sizes = {0, 1, 33, 4097, 96 * 1024, (1 << 20) + 5, 3 << 20};
  std::vector<InFlight> flights;
  uint64_t tag = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    flights.push_back(InFlight::start(world, sizes[i], ++tag, i % 2 == 1));
    flights.push_back(InFlight::start(*sub.value(), sizes[sizes.size() - 1 - i], ++tag, i % 2 == 0));
  }
  // A blocking call queues behind what was started on its group.
  Tensor in = Tensor::empty(DType::kU8, {777});
  fill_pattern(in.data(), 777, c.rank, 999);
  Tensor out = Tensor::empty(DType::kU8, {777 * c.world_size});
  RANK_OK(all_gather(world, in.view(), out.view()));
  for (int r = 0; r < c.world_size; ++r) {
    RANK_CHECK(check_pattern(out.data_as<char>() + 777 * r, 777, r, 999) < 0, "blocking call after requests: rank {}", r);
  }
  for (auto it = flights.rbegin(); it != flights.rend(); ++it) {
    RANK_OK(it->req.wait());
    RANK_OK(it->req.wait());  // the same status again
    RANK_CHECK(it->req.test(), "a completed request tests complete");
  }
  for (size_t i = 0; i < flights.size(); ++i) {
    if (auto e = flights[i].check(i % 2 == 0 ? world : *sub.value()); !e.empty()) return e;
  }
  return "";
}

}  // namespace

TEST(Requests, ManyInFlightCompleteInOrderWithEveryByte) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) { return many_in_flight(c, 1); }));
}

// Four ranks on two cores, two TP groups of two.
TEST(Requests, ManyInFlightWhenRanksOutnumberCores) {
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) { return many_in_flight(c, 2); }));
}

TEST(Requests, ManyInFlightAcrossServers) {
  fgtest::JobOptions o;
  o.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) { return many_in_flight(c, 1); }, o));
}

// test() alone drives a request to completion; one member starts late.
TEST(Requests, TestAloneCompletesThem) {
  fgtest::expect_all_ok(on_world(3, [](const Config& c, Communicator&, Group& g) -> std::string {
    if (c.rank == 2) std::this_thread::sleep_for(100ms);
    InFlight f = InFlight::start(g, (2 << 20) + 3, 7, false);
    long tests = 0;
    while (!f.req.test()) ++tests;
    RANK_OK(f.req.wait());
    if (c.rank == 0) RANK_CHECK(tests > 0, "rank 0 waited 100 ms for rank 2; test() must have said no at least once");
    return f.check(g);
  }));
}

// A request dropped before completion is completed by its destructor (the
// members stay in step), and argument errors come back at start.
TEST(Requests, DroppedRequestsCompleteAndBadArgumentsFailAtStart) {
  fgtest::expect_all_ok(on_world(2, [](const Config& c, Communicator&, Group& g) -> std::string {
    Tensor in = Tensor::empty(DType::kU8, {100});
    Tensor wrong = Tensor::empty(DType::kU8, {150});
    Request bad = start_all_gather(g, in.view(), wrong.view());
    RANK_CHECK(bad.test(), "an invalid request is complete at once");
    RANK_CHECK(bad.wait().kind() == ErrorKind::kInvalidArgument, "{}", bad.wait().to_string());
    Tensor out = Tensor::empty(DType::kU8, {200});
    fill_pattern(in.data(), 100, c.rank, 1);
    { Request dropped = start_all_gather(g, in.view(), out.view()); }
    for (int r = 0; r < 2; ++r) RANK_CHECK(check_pattern(out.data_as<char>() + 100 * r, 100, r, 1) < 0, "dropped: rank {}", r);
    Request moved = start_all_gather(g, in.view(), out.view());
    Request other = std::move(moved);
    RANK_CHECK(moved.test(), "a moved-from request is empty and complete");
    RANK_OK(other.wait());
    InFlight f = InFlight::start(g, 12345, 2, true);
    { Request gone = std::move(f.req); }  // completed by its destructor
    return f.check(g);
  }));
}

// The fused op as a request: output and gather_out as the blocking call's.
TEST(Requests, FusedOpAsARequestMatchesTheBlockingCall) {
  fgtest::expect_all_ok(on_world(3, [](const Config& c, Communicator&, Group& g) -> std::string {
    const int64_t m = 37, k = 19, n = 23;
    Tensor x1 = Tensor::empty(DType::kF32, {m, k}), x2 = Tensor::empty(DType::kF32, {k, n}), bias = Tensor::empty(DType::kF32, {n});
    for (int64_t i = 0; i < m * k; ++i) x1.data_as<float>()[i] = static_cast<float>((i * 7 + c.rank * 13) % 17) - 8;
    for (int64_t i = 0; i < k * n; ++i) x2.data_as<float>()[i] = static_cast<float>((i * 5) % 11) - 5;
    for (int64_t i = 0; i < n; ++i) bias.data_as<float>()[i] = static_cast<float>(i);
    Tensor out_a = Tensor::empty(DType::kF32, {3 * m, n}), out_b = Tensor::empty(DType::kF32, {3 * m, n});
    Tensor go_a = Tensor::empty(DType::kF32, {3 * m, k}), go_b = Tensor::empty(DType::kF32, {3 * m, k});
    Request r = start_all_gather_matmul(g, x1.view(), x2.view(), bias.view(), out_a.view(), go_a.view());
    RANK_OK(all_gather_matmul(g, x1.view(), x2.view(), bias.view(), out_b.view(), go_b.view()));
    RANK_OK(r.wait());
    RANK_CHECK(std::memcmp(out_a.data(), out_b.data(), out_a.nbytes()) == 0, "outputs differ");
    RANK_CHECK(std::memcmp(go_a.data(), go_b.data(), go_a.nbytes()) == 0, "gather_out differs");
    // Small integers: the products are exact in fp32.
    for (int64_t row = 0; row < 3 * m; ++row) {
      const int src = static_cast<int>(row / m);
      const int64_t i = row % m;
      for (int64_t j = 0; j < n; ++j) {
        float want = static_cast<float>(j);
        for (int64_t l = 0; l < k; ++l) {
          want += (static_cast<float>(((i * k + l) * 7 + src * 13) % 17) - 8) * (static_cast<float>(((l * n + j) * 5) % 11) - 5);
        }
        RANK_CHECK(out_a.data_as<float>()[row * n + j] == want, "output[{}][{}] = {}, want {}", row, j,
                   out_a.data_as<float>()[row * n + j], want);
      }
    }
    return "";
  }));
}

// Requests on two groups, and blocking calls, in opposite orders on the two
// ranks: rank 0 starts a long gather on group A and then blocks on group B;
// rank 1 starts one on B and then blocks on A. Each blocked rank's wait loop
// must drive its other group's request, or each waits for the other until
// the deadline. Both complete, every byte checked, well within the timeout.
TEST(Requests, ProgressReachesTheOtherGroupsWhileBlocked) {
  // 16 KiB ring steps: 1 MiB is 64 steps, each needing the peer's progress.
  fgtest::ScopedEnv env({{"FG_RING_BYTES", "65536"}, {"FG_SINGLE_COPY", "off"}});
  fgtest::JobOptions o;
  o.timeout = 20000ms;
  fgtest::expect_all_ok(on_world(2, [](const Config& c, Communicator& comm, Group& world) -> std::string {
    auto other = comm.new_group({0, 1});
    RANK_OK(other.status());
    Group& a = world;
    Group& b = *other.value();
    const auto t0 = Clock::now();
    // Group A gathers (1 MiB + 7) bytes (tag 1), group B (1 MiB + 9) (tag 2).
    const bool zero = c.rank == 0;
    InFlight started = InFlight::start(zero ? a : b, (1 << 20) + (zero ? 7 : 9), zero ? 1 : 2, false);
    InFlight blocking = InFlight::start(zero ? b : a, (1 << 20) + (zero ? 9 : 7), zero ? 2 : 1, true);
    RANK_OK(blocking.req.wait());
    RANK_OK(started.req.wait());
    RANK_CHECK(ms_since(t0) < 10000, "took {} ms: the other group's request was not driven", ms_since(t0));
    if (auto e = started.check(c.rank == 0 ? a : b); !e.empty()) return e;
    return blocking.check(c.rank == 0 ? b : a);
  }, o));
}

// The timeout bounds a whole call, not each of its waits: ranks 1 and 2 let
// their sides of a 256-step gather advance only when they test() (every 100
// ms, 50 ms apart), and neither can pass a step before the other has posted
// it, so each of rank 0's waits is short but the call is not (with a
// deadline per wait, as before the engine, no wait would have timed out).
// (With one such rank, it could run through many steps in one test() while
// rank 0 kept pace.)
TEST(Deadline, BoundsTheWholeCallNotEachWait) {
  // 16 KiB ring steps: 4 MiB is 256 steps (through the ring, not single copy).
  fgtest::ScopedEnv env({{"FG_RING_BYTES", "65536"}, {"FG_SINGLE_COPY", "off"}});
  fgtest::JobOptions o;
  o.timeout = 1000ms;
  auto results = on_world(3, [](const Config& c, Communicator&, Group& g) -> std::string {
    Tensor in = Tensor::empty(DType::kU8, {4 << 20});
    Tensor out = Tensor::empty(DType::kU8, {12 << 20});
    if (c.rank != 0) {
      if (c.rank == 2) std::this_thread::sleep_for(50ms);
      Request r = start_all_gather(g, in.view(), out.view());
      const auto t0 = Clock::now();
      while (!r.test() && ms_since(t0) < 20000) std::this_thread::sleep_for(100ms);
      Status s = r.wait();
      RANK_CHECK(!s.ok(), "rank 0 gave up; rank 1's call cannot succeed");
      return "";
    }
    const auto t0 = Clock::now();
    Status s = all_gather(g, in.view(), out.view());
    const double took = ms_since(t0);
    RANK_CHECK(s.kind() == ErrorKind::kTimeout, "{}", s.to_string());
    RANK_CHECK(took >= 1000 && took < 5000, "the call took {} ms with a 1000 ms timeout", took);
    return "";
  }, o);
  fgtest::expect_all_ok(results);
}

// abort() from another thread ends this rank's blocked call, and the peer
// that then waits for it learns at once (long before the 30 s timeout).
TEST(Abort, FromAnotherThreadEndsTheCallAndThePeerLearns) {
  fgtest::JobOptions o;
  o.timeout = 30000ms;
  fgtest::expect_all_ok(on_world(2, [](const Config& c, Communicator& comm, Group& g) -> std::string {
    if (c.rank == 0) {
      Clock::time_point aborted_at;
      std::thread aborter([&] {
        std::this_thread::sleep_for(300ms);
        aborted_at = Clock::now();
        comm.abort();
      });
      Status s = fgtest::gather_bytes(g, 4096);  // rank 1 does not come
      aborter.join();
      const double after = ms_since(aborted_at);
      RANK_CHECK(s.kind() == ErrorKind::kAborted, "{}", s.to_string());
      RANK_CHECK(after < 5000, "the call ended {} ms after abort()", after);
      Status again = fgtest::gather_bytes(g, 4096);
      RANK_CHECK(again.kind() == ErrorKind::kAborted, "a call after abort(): {}", again.to_string());
      Status fin = comm.finalize();
      RANK_CHECK(fin.kind() == ErrorKind::kAborted, "finalize after abort: {}", fin.to_string());
      return "";
    }
    std::this_thread::sleep_for(1s);
    // Rank 0 had posted its bytes before it aborted: this call may complete.
    Status first = fgtest::gather_bytes(g, 4096);
    RANK_CHECK(first.ok() || first.kind() == ErrorKind::kPeerLost, "{}", first.to_string());
    const auto t0 = Clock::now();
    Status s = fgtest::gather_bytes(g, 4096);  // rank 0 will never post this one
    RANK_CHECK(s.kind() == ErrorKind::kPeerLost, "{}", s.to_string());
    RANK_CHECK(s.message().find("rank 0") != std::string::npos, "{}", s.message());
    RANK_CHECK(ms_since(t0) < 5000, "took {} ms to learn of the abort", ms_since(t0));
    return "";
  }, o));
}

namespace {
Communicator* g_comm = nullptr;
void on_sigusr1(int) { g_comm->abort(); }

// SIGUSR1 to this thread after `delay`, whose handler calls comm.abort();
// join the returned thread.
std::thread abort_from_a_signal_in(Communicator& comm, std::chrono::milliseconds delay) {
  g_comm = &comm;
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  ::sigaction(SIGUSR1, &sa, nullptr);
  const pthread_t target = ::pthread_self();
  return std::thread([target, delay] {
    std::this_thread::sleep_for(delay);
    ::pthread_kill(target, SIGUSR1);
  });
}
}  // namespace

// abort() from a signal handler (what a SIGTERM handler of a training job
// does) while this rank is blocked in a call: the call ends Aborted - not
// PeerLost, which the peer's exit would produce anyway: the peer stays alive
// until this rank has checked.
TEST(Abort, FromASignalHandlerEndsTheBlockedCall) {
  fgtest::JobOptions o;
  o.timeout = 30000ms;
  fgtest::expect_all_ok(on_world(2, [](const Config& c, Communicator& comm, Group& g) -> std::string {
    if (c.rank == 1) {
      std::this_thread::sleep_for(3s);  // never calls; alive past rank 0's checks
      return "";
    }
    std::thread sender = abort_from_a_signal_in(comm, 300ms);
    const auto t0 = Clock::now();
    Status s = fgtest::gather_bytes(g, 1 << 16);
    sender.join();
    RANK_CHECK(s.kind() == ErrorKind::kAborted, "{}", s.to_string());
    RANK_CHECK(ms_since(t0) < 2500, "took {} ms: not ended by the abort", ms_since(t0));
    return "";
  }, o));
}

// abort() from a signal handler while this rank is outside any call (here:
// asleep, as it would be computing): the handler itself marks the groups'
// shared memory (abort_now: no lock, no allocation), so a peer that waits on
// this rank learns "rank 0 aborted the group" at once, while this rank is
// still alive and has made no call since.
TEST(Abort, FromASignalHandlerOutsideACallReachesThePeers) {
  fgtest::JobOptions o;
  o.timeout = 30000ms;
  fgtest::expect_all_ok(on_world(2, [](const Config& c, Communicator& comm, Group& g) -> std::string {
    if (c.rank == 1) {
      std::this_thread::sleep_for(1s);  // rank 0 was aborted at 300 ms
      const auto t0 = Clock::now();
      Status s = fgtest::gather_bytes(g, 4096);
      RANK_CHECK(s.kind() == ErrorKind::kPeerLost && s.message().find("rank 0 aborted the group") != std::string::npos,
                 "{}", s.to_string());
      RANK_CHECK(ms_since(t0) < 2000, "took {} ms to learn of the abort", ms_since(t0));
      return "";
    }
    std::thread sender = abort_from_a_signal_in(comm, 300ms);
    std::this_thread::sleep_for(4s);  // no call: only the handler can have told rank 1
    sender.join();
    Status s = fgtest::gather_bytes(g, 4096);
    RANK_CHECK(s.kind() == ErrorKind::kAborted, "a call after abort(): {}", s.to_string());
    return "";
  }, o));
}

// test() alone, never wait(), notices a peer that died and the call's
// deadline: it returns true with that error, in bounded time.
TEST(Requests, TestAloneNoticesADeadPeerAndTheDeadline) {
  for (bool dies : {true, false}) {
    fgtest::JobOptions o;
    o.timeout = dies ? 30000ms : 800ms;
    fgtest::expect_all_ok(on_world(2, [&](const Config& c, Communicator&, Group& g) -> std::string {
      if (c.rank == 1) {
        std::this_thread::sleep_for(dies ? 300ms : 3000ms);
        if (dies) ::_exit(0);  // without a word
        return "";
      }
      Tensor in = Tensor::zeros(DType::kU8, {4096}), out = Tensor::zeros(DType::kU8, {8192});
      Request req = start_all_gather(g, in.view(), out.view());
      const auto t0 = Clock::now();
      while (!req.test()) {
        RANK_CHECK(ms_since(t0) < 10000, "test() has not noticed the {} after 10 s", dies ? "dead peer" : "deadline");
      }
      Status s = req.wait();
      RANK_CHECK(s.kind() == (dies ? ErrorKind::kPeerLost : ErrorKind::kTimeout), "{}", s.to_string());
      return "";
    }, o));
  }
}

// finalize() completes what was started, says Ok when all was well, and may
// be called again; the destructor then has nothing left to do.
TEST(Finalize, CompletesStartedRequestsAndIsIdempotent) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    InFlight f = InFlight::start((*comm)->world(), 300000, 5, true);
    auto ranks = (*comm)->world().ranks();
    RANK_OK(comm.value()->finalize());
    RANK_CHECK(f.req.test(), "finalize completed the request");
    RANK_OK(f.req.wait());
    for (int i = 0; i < 3; ++i) {
      RANK_CHECK(check_pattern(f.outs[i].data(), 300000, ranks[i], 5) < 0, "block of rank {}", i);
    }
    RANK_OK(comm.value()->finalize());
    return "";
  }));
}

// wait_for: gives up after its timeout without an error (the request stays in
// flight, and completes later with every byte right); returns true once done.
TEST(Requests, WaitForGivesUpWithoutAnErrorAndTheRequestCompletesLater) {
  fgtest::expect_all_ok(on_world(2, [](const Config&, Communicator&, Group& g) -> std::string {
    if (g.rank() == 1) std::this_thread::sleep_for(400ms);
    InFlight f = InFlight::start(g, 300 << 10, 7, false);  // several pipeline steps
    if (g.rank() == 0) {
      const auto t0 = Clock::now();
      const bool done = f.req.wait_for(50ms);
      const double took = ms_since(t0);
      RANK_CHECK(!done, "complete although rank 1 starts 400 ms later");
      RANK_CHECK(took >= 49 && took < 300, "wait_for(50 ms) returned after {:.1f} ms", took);
    }
    RANK_CHECK(f.req.wait_for(std::chrono::microseconds(10'000'000)), "not complete within 10 s");
    RANK_OK(f.req.wait());
    return f.check(g);
  }));
}

// ------------------------------------------------ progress owned by the library

// Nobody on rank 0 drives its request: it hands it over and sleeps. Rank 1
// starts 20 ms later and blocks; 1 MiB through 16 KiB ring steps is 64 steps,
// each needing rank 0's side, so rank 1 returns during rank 0's sleep only if
// the library's progress thread drives rank 0's request.
TEST(Progress, DrivesARequestItsOwnerLeft) {
  fgtest::ScopedEnv env({{"FG_RING_BYTES", "65536"}, {"FG_SINGLE_COPY", "off"}});
  fgtest::JobOptions o;
  o.timeout = 20000ms;
  fgtest::expect_all_ok(on_world(2, [](const Config&, Communicator&, Group& g) -> std::string {
    constexpr size_t kBytes = (1 << 20) + 3;
    if (g.rank() == 0) {
      InFlight f = InFlight::start(g, kBytes, 11, false);
      f.req.drive_in_background();
      std::this_thread::sleep_for(1500ms);
      RANK_CHECK(f.req.test(), "the request was not complete after 1.5 s in the progress thread's hands");
      return f.check(g);
    }
    std::this_thread::sleep_for(20ms);
    const auto t0 = Clock::now();
    InFlight f = InFlight::start(g, kBytes, 11, false);
    RANK_OK(f.req.wait());
    const double took = ms_since(t0);
    RANK_CHECK(took < 1000, "the blocking side took {:.0f} ms: rank 0's request was not driven while it slept", took);
    return f.check(g);
  }, o));
}

// torch's PowerSGD hook: a callback that starts a collective and waits for
// its completion (here: its own callback). Neither rank's thread ever drives:
// A is handed over with a callback that starts B and waits up to 10 s for
// B's callback. B is driven by the progress thread, and B's callback runs on
// another completion thread while A's still waits. Were the callbacks run on
// the progress thread, nobody would drive B.
TEST(Progress, ACallbackStartsARequestAndWaitsForItsCompletion) {
  fgtest::ScopedEnv env({{"FG_RING_BYTES", "65536"}, {"FG_SINGLE_COPY", "off"}});
  fgtest::JobOptions o;
  o.timeout = 20000ms;
  fgtest::expect_all_ok(on_world(3, [](const Config&, Communicator& comm, Group& g) -> std::string {
    struct Shared {
      InFlight a, b;
      std::promise<Status> b_done;
      std::promise<std::string> a_outcome;
      std::thread::id main = std::this_thread::get_id();
    };
    auto sh = std::make_shared<Shared>();
    sh->a = InFlight::start(g, (1 << 20) + 1, 21, false);
    sh->a.req.on_complete([sh, &g](const Status& sa) {
      std::string why;
      if (!sa.ok()) why = "A failed: " + sa.to_string();
      if (why.empty() && std::this_thread::get_id() == sh->main) why = "A's callback ran on the thread that started it";
      if (why.empty()) {
        sh->b = InFlight::start(g, (512 << 10) + 5, 22, true);
        sh->b.req.on_complete([sh](const Status& sb) { sh->b_done.set_value(sb); });
        auto fut = sh->b_done.get_future();
        if (fut.wait_for(10s) != std::future_status::ready) {
          why = "B's completion never came while A's callback waited for it";
        } else if (Status sb = fut.get(); !sb.ok()) {
          why = "B failed: " + sb.to_string();
        }
      }
      sh->a_outcome.set_value(why);
    });
    auto outcome = sh->a_outcome.get_future();
    RANK_CHECK(outcome.wait_for(30s) == std::future_status::ready, "A's callback did not finish within 30 s");
    const std::string why = outcome.get();
    RANK_CHECK(why.empty(), "{}", why);
    if (auto e = sh->a.check(g); !e.empty()) return e;
    if (auto e = sh->b.check(g); !e.empty()) return e;
    // A callback asked for after completion runs too, and finalize() runs
    // whatever is still to run before it returns.
    std::atomic<int> late{0};
    sh->a.req.on_complete([&late](const Status& s) { late = s.ok() ? 1 : 2; });
    InFlight c = InFlight::start(g, 4097, 23, false);
    c.req.on_complete([&late](const Status& s) {
      std::this_thread::sleep_for(50ms);
      late += s.ok() ? 10 : 20;
    });
    const std::vector<int> ranks = g.ranks();  // g is gone with finalize()
    RANK_OK(comm.finalize());
    RANK_CHECK(late.load() == 11, "after finalize(): callbacks ran as {} (11: both, with Ok)", late.load());
    return c.check(ranks);
  }, o));
}

// A request's callback asked for after its communicator is gone (a torch
// Work dropped after destroy_process_group): it runs, on a thread of its
// own, never on the caller's, which may hold a lock the callback takes.
TEST(Progress, ACallbackAskedForAfterTheCommunicatorIsGoneRunsOnAThreadOfItsOwn) {
  fgtest::JobOptions o;
  o.hang_limit = std::chrono::seconds(30);  // run on the caller, it would wait for its own lock
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    InFlight f = InFlight::start((*comm)->world(), 5000, 31, false);
    const std::vector<int> ranks = (*comm)->world().ranks();
    RANK_OK((*comm)->finalize());
    comm.value().reset();  // the communicator, its progress thread and completion threads: gone
    // Shared with the callback's thread, which may still be unlocking after
    // this thread has seen the value and left (on the stack, TSan saw the
    // mutex destroyed under that unlock).
    auto held = std::make_shared<std::mutex>();
    auto ran = std::make_shared<std::promise<std::thread::id>>();
    auto fut = ran->get_future();
    {
      std::lock_guard<std::mutex> lock(*held);  // what the callback takes: it must not run here
      f.req.on_complete([held, ran](const Status& s) {
        std::lock_guard<std::mutex> l(*held);
        ran->set_value(s.ok() ? std::this_thread::get_id() : std::thread::id());
      });
    }
    RANK_CHECK(fut.wait_for(10s) == std::future_status::ready, "the callback never ran");
    const std::thread::id where = fut.get();
    RANK_CHECK(where != std::thread::id(), "the callback saw an error");
    RANK_CHECK(where != std::this_thread::get_id(), "the callback ran on the caller's thread");
    return f.check(ranks);
  }, o));
}
