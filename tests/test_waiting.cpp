// How the engine waits on a crowded host (issue 20): a waiter gives its core
// away almost at once when more tasks want the host's cores than it has, and
// spins, then yields, only on a quiet one; the host's state is read from the
// kernel's count of runnable tasks.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "algo/plan.hpp"
#include "core/group_impl.hpp"
#include "engine/driver.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "transport/wait_policy.hpp"

using namespace fastgather;
using Clock = std::chrono::steady_clock;

namespace {

// Never ready until it has been asked to sleep once; records when that was.
class FirstSleep final : public engine::Waiter {
 public:
  bool await_ready() { return false; }
  Status await_resume() { return error; }
  bool ready() override { return slept_at_.has_value(); }
  Status check() override { return Status::Ok(); }
  Status timed_out(std::chrono::milliseconds) override { return {ErrorKind::kTimeout, "timed out"}; }
  Status fail(const Status& why) override { return why; }
  void sleep(std::chrono::nanoseconds) override {
    if (!slept_at_) slept_at_ = Clock::now();
  }
  bool comes_from_cpu(int) override { return on_this_cpu; }
  std::optional<Clock::time_point> slept_at_;
  bool on_this_cpu = false;  // what it says of the awaited peer's CPU
};

engine::Task<Status> wait_once(FirstSleep* w, Clock::time_point* began, Clock::duration* until_sleep) {
  *began = Clock::now();
  Status s = co_await *w;
  *until_sleep = *w->slept_at_ - *began;
  co_return s;
}

std::atomic<int> g_own_asked_about{-1};  // what the driver told the crowd hook last
std::atomic<bool> g_say_crowded{false};  // what the crowd hook answers

// The shortest of five waits from its start to its first sleep.
Clock::duration first_sleep_after(bool crowded, int own_on_host = 0) {
  transport::WaitPolicy p;
  p.own_on_host = own_on_host;
  g_say_crowded = crowded;
  p.crowded = [](int own) {
    g_own_asked_about = own;
    return g_say_crowded.load();
  };
  engine::DriveOptions o;
  o.policy = p;
  Clock::duration best = Clock::duration::max();
  for (int i = 0; i < 5; ++i) {
    FirstSleep w;
    Clock::time_point began;
    Clock::duration until_sleep{};
    EXPECT_TRUE(engine::Driver::run(wait_once(&w, &began, &until_sleep), o).ok());
    best = std::min(best, until_sleep);
  }
  return best;
}

// The shortest of three waits from its start to its first sleep, under a
// policy of a long spin and no yield.
Clock::duration first_sleep_with_a_long_spin(bool peer_on_this_cpu, bool adapt) {
  transport::WaitPolicy p;
  p.spin = std::chrono::milliseconds(40);
  p.yield = Clock::duration::zero();
  p.adapt = adapt;
  p.crowded = [](int) { return false; };
  engine::DriveOptions o;
  o.policy = p;
  Clock::duration shortest = Clock::duration::max();
  for (int i = 0; i < 3; ++i) {
    FirstSleep w;
    w.on_this_cpu = peer_on_this_cpu;
    Clock::time_point began;
    Clock::duration until_sleep{};
    EXPECT_TRUE(engine::Driver::run(wait_once(&w, &began, &until_sleep), o).ok());
    shortest = std::min(shortest, until_sleep);
  }
  return shortest;
}

// Arrives, and its sender leaves, between the driver's look at it and the
// sender's health check (a peer that posts its last step and exits).
class ArrivesAsItsSenderLeaves final : public engine::Waiter {
 public:
  bool await_ready() { return false; }
  Status await_resume() { return error; }
  bool ready() override { return arrived_; }
  Status check() override {
    arrived_ = true;
    return {ErrorKind::kPeerLost, "rank 1 died; rank 0 was waiting for it"};
  }
  Status timed_out(std::chrono::milliseconds) override { return {ErrorKind::kTimeout, "timed out"}; }
  Status fail(const Status& why) override { return why; }
  void sleep(std::chrono::nanoseconds) override {}
  bool arrived_ = false;
};

engine::Task<Status> wait_for(ArrivesAsItsSenderLeaves* w) { co_return co_await *w; }

}  // namespace

// What a peer posted before it exited is not lost to its exit (seen in a
// 3-rank job under load: the last rank finished, exited, and a peer still
// waiting on its last post was told it had died).
TEST(Waiting, WhatArrivedBeforeItsSenderLeftCounts) {
  ArrivesAsItsSenderLeaves w;
  const Status s = engine::Driver::run(wait_for(&w), engine::DriveOptions{});
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(w.arrived_);
}

TEST(Waiting, OnACrowdedHostAWaiterSleepsAlmostAtOnce) {
  using std::chrono::microseconds;
  const transport::WaitPolicy quiet;
  // Quiet: it spins, then yields, and sleeps only after both (by the clock).
  EXPECT_GE(first_sleep_after(false), quiet.spin + quiet.yield);
  // Crowded: after its short spin (2 us; the best of five allows for being
  // descheduled meanwhile).
  EXPECT_LT(first_sleep_after(true), microseconds(100));
}

TEST(Waiting, SetSpinOrYieldDecideEvenOnACrowdedHost) {
  Settings s;
  s.spin = std::chrono::microseconds(300);
  EXPECT_FALSE(transport::WaitPolicy::for_members(2, std::chrono::milliseconds(1000), s).adapt);
  EXPECT_TRUE(transport::WaitPolicy::for_members(2, std::chrono::milliseconds(1000), Settings{}).adapt);
}

// A peer that last posted from the waiter's own CPU can post only once the
// waiter lets it have the CPU: spinning there only delays it (4 ranks on 2
// cores: docs/benchmarks.md), so such a wait skips its spin. Set spin or
// yield still decide.
TEST(Waiting, AWaitForAPeerOnTheSameCpuSkipsTheSpin) {
  using std::chrono::milliseconds;
  EXPECT_GE(first_sleep_with_a_long_spin(false, true), milliseconds(40));
  EXPECT_LT(first_sleep_with_a_long_spin(true, true), milliseconds(20));
  EXPECT_GE(first_sleep_with_a_long_spin(true, false), milliseconds(40));
}

// The job's own ranks are no crowd: where they outnumber the cores, only
// tasks beyond them make one (yielding between ranks that share a core hands
// it over at once; sleeping pays a wake-up per step: docs/benchmarks.md).
TEST(Waiting, TheJobsOwnRanksAreNoCrowd) {
  // 2 cores; one task more than the cores is a quiet host's noise.
  EXPECT_FALSE(transport::oversubscribed(3, 2, 0));
  EXPECT_TRUE(transport::oversubscribed(4, 2, 0));
  EXPECT_TRUE(transport::oversubscribed(4, 2, 2));
  // 4 ranks of the job on 2 cores: all 4 runnable (and the noise) is no crowd, 2 strangers more are.
  EXPECT_FALSE(transport::oversubscribed(4, 2, 4));
  EXPECT_FALSE(transport::oversubscribed(5, 2, 4));
  EXPECT_TRUE(transport::oversubscribed(6, 2, 4));
  // The driver asks with the policy's count of the job's ranks.
  first_sleep_after(false, 6);
  EXPECT_EQ(g_own_asked_about.load(), 6);
}

// Every group's waits know how many of the job's ranks share the host, the
// groups of a TP x DP layout too (each of 2 members, 4 ranks on the host),
// and so do their plans: where the 4 outnumber the cores, an all_reduce of
// the world runs two-shot from kTwoShotMinBytesOutnumbered.
TEST(Waiting, EveryGroupKnowsTheJobsRanksOnItsHost) {
  auto results = fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto group = (*comm)->tp_group_of_dp(2, 2);
    RANK_OK(group.status());
    const bool outnumbered = transport::ranks_outnumber_cores(4);
    for (const Group* g : {&(*comm)->world(), *group}) {
      const int own = impl_of(*g)->policy.own_on_host;
      RANK_CHECK(own == 4, "{}: the policy counts {} of the job's ranks on this host, not 4", g->describe(), own);
      RANK_CHECK(impl_of(*g)->shape.outnumbered == outnumbered, "{}: its plans see the ranks outnumbering the cores: {}",
                 g->describe(), !outnumbered);
    }
    Tensor x = Tensor::empty(DType::kF32, {static_cast<int64_t>(algo::kTwoShotMinBytesOutnumbered / 4)});
    float* v = x.data_as<float>();
    const size_t count = static_cast<size_t>(x.numel());
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(c.rank + 1);
    CallStats stats;
    RANK_OK(all_reduce((*comm)->world(), x.view(), x.view(), {.stats = &stats}));
    const Schedule want = outnumbered ? Schedule::kTwoShot : Schedule::kOneShot;
    RANK_CHECK(stats.schedule == want, "a {}-byte all_reduce of 4 ranks ran {}, not {}", x.nbytes(),
               to_string(stats.schedule), to_string(want));
    for (size_t i = 0; i < count; ++i) RANK_CHECK(v[i] == 10.0f, "element {}: {}, not 10", i, v[i]);
    return "";
  });
  fgtest::expect_all_ok(results);
}

// More busy processes than cores: the kernel's count of runnable tasks says so.
TEST(Waiting, TheHostIsSeenOversubscribedUnderLoad) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<pid_t> loops;
  for (unsigned i = 0; i < cores + 2; ++i) {
    pid_t p = ::fork();
    if (p == 0) {
      volatile unsigned spin = 0;  // a loop with a side effect: one the compiler keeps
      for (;;) spin = spin + 1;
    }
    loops.push_back(p);
  }
  bool seen = false;
  for (auto until = Clock::now() + std::chrono::seconds(2); !seen && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(11));
    seen = transport::host_oversubscribed();
  }
  for (pid_t p : loops) ::kill(p, SIGKILL);
  for (pid_t p : loops) ::waitpid(p, nullptr, 0);
  EXPECT_TRUE(seen) << cores + 2 << " busy processes on " << cores << " cores, and the host was not seen oversubscribed";
}
