// Issue 4: the rendezvous port, partial group creation, cleanup after
// SIGKILL, and a long oversubscribed soak.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {
// Checked all-gathers until stop() says so on rank 0. With `joined` set,
// each rank creates the file <joined>.<rank> once it is in the job.
std::string gather_until(const Config& c, const std::function<bool()>& stop_now, const std::string& joined = "") {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  if (!joined.empty()) std::ofstream(fmt::format("{}.{}", joined, c.rank)) << c.rank;
  Group& g = (*comm)->world();
  Tensor in = Tensor::empty(DType::kU8, {4096}), out = Tensor::empty(DType::kU8, {4096 * g.size()});
  for (uint64_t it = 0;; ++it) {
    if (it % 64 == 0) {  // rank 0's decision counts for everyone: calls must match
      int32_t stop = stop_now(), all[16] = {};
      RANK_OK(all_gather(g, TensorView(&stop, DType::kI32, {1}), TensorView(all, DType::kI32, {g.size()})));
      if (all[0] != 0) break;
    }
    fgtest::fill_pattern(in.data(), 4096, c.rank, it);
    RANK_OK(all_gather(g, in.view(), out.view()));
    for (int r = 0; r < g.size(); ++r) RANK_CHECK(fgtest::check_pattern(out.data_as<char>() + r * 4096, 4096, r, it) < 0, "call {}", it);
  }
  return "";
}

std::string gather_for(const Config& c, std::chrono::milliseconds how_long) {
  const auto end = Clock::now() + how_long;
  return gather_until(c, [&] { return Clock::now() >= end; });
}

// A job that runs until the test says stop, and says when all its ranks
// are in (an event, not a guessed delay a loaded machine may outlast).
struct BackgroundJob {
  std::string dir = fmt::format("/tmp/fg-test-{}-{}", ::getpid(), serial()++);
  std::vector<fgtest::RankResult> results;
  std::thread runner;

  BackgroundJob(int world, const fgtest::JobOptions& opt) {
    std::filesystem::create_directories(dir);
    const std::string joined = dir + "/joined", stop = dir + "/stop";
    runner = std::thread([this, world, opt, joined, stop] {
      results = fgtest::run_job(world, [&](const Config& c) {
        return gather_until(c, [&] { return std::filesystem::exists(stop); }, joined);
      }, opt);
    });
    for (const auto until = Clock::now() + 60s; Clock::now() < until;) {
      bool all = true;
      for (int r = 0; r < world; ++r) all &= std::filesystem::exists(fmt::format("{}.{}", joined, r));
      if (all) break;
      std::this_thread::sleep_for(1ms);
    }
  }
  std::vector<fgtest::RankResult> finish() {
    std::ofstream(dir + "/stop") << 1;
    runner.join();
    std::filesystem::remove_all(dir);
    return results;
  }
  static int& serial() {
    static int n = 0;
    return n;
  }
};
}  // namespace

TEST(Rendezvous, ANewJobReusesTheSamePortCleanly) {
  fgtest::JobOptions opt;
  opt.port = fgtest::free_port();
  for (int job = 0; job < 3; ++job) {
    fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) { return gather_for(c, 50ms); }, opt));
  }
}

TEST(Rendezvous, ASecondJobOnTheSamePortIsRefusedAndTheFirstCarriesOn) {
  fgtest::JobOptions opt;
  opt.port = fgtest::free_port();
  BackgroundJob job_a(2, opt);  // both of its ranks have joined
  fgtest::JobOptions opt_b = opt;
  opt_b.timeout = 1000ms;
  auto second = fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_CHECK(!comm.ok(), "rank {} of the second job joined the first job", c.rank);
    const std::string& m = comm.status().message();
    if (c.rank == 0) {
      RANK_CHECK(m.find("cannot listen") != std::string::npos, "{}", m);
    } else {
      // The first job is complete: its store admits nobody else.
      RANK_CHECK(m.find("all 2 ranks of this job have joined") != std::string::npos, "{}", m);
    }
    return "";
  }, opt_b);
  fgtest::expect_all_ok(second);
  fgtest::expect_all_ok(job_a.finish());
}

TEST(Rendezvous, AWrongTokenIsRefusedAndTheJobCarriesOn) {
  fgtest::JobOptions opt;
  opt.port = fgtest::free_port();
  opt.token = "job-a-secret";
  BackgroundJob job_a(2, opt);
  fgtest::JobOptions stranger = opt;
  stranger.token = "guess";
  stranger.timeout = 1000ms;
  auto refused = fgtest::run_job(1, [&](const Config& base) -> std::string {
    Config c = base;
    c.rank = 1;  // pretends to be rank 1 of a 2-rank job
    c.world_size = 2;
    auto comm = Communicator::create(c);
    RANK_CHECK(!comm.ok(), "a rank with the wrong token joined");
    RANK_CHECK(comm.status().message().find("token") != std::string::npos, "{}", comm.status().message());
    return "";
  }, stranger);
  fgtest::expect_all_ok(refused);
  fgtest::expect_all_ok(job_a.finish());
}

TEST(Groups, AGroupCreatedOnSomeRanksOnlyTimesOutWithAMessage) {
  fgtest::JobOptions opt;
  opt.timeout = 500ms;
  auto results = fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    if (c.rank == 2) {
      std::this_thread::sleep_for(1500ms);  // never calls new_group
      return "";
    }
    auto t0 = Clock::now();
    auto g = (*comm)->new_group({0, 1, 2});
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    RANK_CHECK(!g.ok(), "group creation succeeded without rank 2");
    RANK_CHECK(g.status().kind() == ErrorKind::kTimeout, "{}", g.status().to_string());
    RANK_CHECK(g.status().message().find("group [0,1,2]") != std::string::npos, "{}", g.status().message());
    RANK_CHECK(ms < 2000, "{:.0f} ms", ms);
    // Groups that all their members create still work.
    auto pair = (*comm)->new_group({0, 1});
    RANK_OK(pair.status());
    Tensor in = Tensor::zeros(DType::kF32, {3}), out = Tensor::zeros(DType::kF32, {6});
    RANK_OK(all_gather(*pair.value(), in.view(), out.view()));
    return "";
  }, opt);
  fgtest::expect_all_ok(results);
}

TEST(Cleanup, NothingLeftAfterEveryRankIsKilled) {
  auto results = fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto sub = (*comm)->tp_group_of_dp(2, 2);
    RANK_OK(sub.status());
    RANK_OK(barrier((*comm)->world()));  // every group is built before anyone dies
    ::raise(SIGKILL);
    return "";
  });
  for (const auto& r : results) EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

TEST(Cleanup, ACreatorKilledBeforeUnlinkIsSweptByTheNextJob) {
  fgtest::JobOptions opt;
  opt.timeout = 3000ms;
  auto crashed = fgtest::run_job(2, [](const Config& c) -> std::string {
    // Rank 1 never attaches, so rank 0 waits at the attach barrier. It leaves
    // at once: the sooner the job is over, the shorter the time in which
    // another test's start-up (ctest runs them in parallel) may sweep the
    // leftover before it is looked for.
    if (c.rank == 1) return "";
    // Dies holding the segment's name: as soon as its segment exists (not
    // after a guessed delay, which a loaded machine may outlast).
    std::thread killer([] {
      const std::string mine = fmt::format("-{}-", ::getpid());
      for (int i = 0; i < 10000; ++i) {
        for (const std::string& n : fgtest::fg_segments()) {
          if (n.find(mine) != std::string::npos) ::raise(SIGKILL);
        }
        std::this_thread::sleep_for(1ms);
      }
    });
    killer.detach();
    auto comm = Communicator::create(c);
    return "rank 0 should have been killed";
  }, opt);
  ASSERT_EQ(crashed[0].signal, SIGKILL);
  EXPECT_FALSE(fgtest::segments_of(crashed).empty()) << "the test needs a leftover to sweep";
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) { return gather_for(c, 10ms); }));
  EXPECT_TRUE(fgtest::segments_of(crashed).empty());
}

// 6 ranks on 2 cores, TP=3 DP=2, 100,000 mixed-size all-gathers per group,
// every byte checked: no livelock, no corruption. The time is recorded.
TEST(Soak, HundredThousandMixedCollectivesSixRanksOnTwoCores) {
  const auto t0 = Clock::now();
  fgtest::JobOptions opt;
  opt.hang_limit = 900s;
  auto results = fgtest::run_job(6, [](const Config& c) {
    return fgtest::gather_mixed_sizes(c, 3, 2, {0, 8, 33, 4097, 65536, 8, 1000, 32}, 100000);
  }, opt);
  fgtest::expect_all_ok(results);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  RecordProperty("seconds", fmt::format("{:.1f}", s));
  std::printf("soak: 6 ranks on %u cores, 100000 collectives per group in %.1f s\n", std::thread::hardware_concurrency(), s);
}

TEST(Rendezvous, LosingTheStoreHostStopsNewGroupsButNotExistingOnes) {
  fgtest::JobOptions opt;
  opt.timeout = 2000ms;
  auto results = fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group* pair = nullptr;
    if (c.rank != 0) {
      auto g = (*comm)->new_group({1, 2});
      RANK_OK(g.status());
      pair = g.value();
    }
    RANK_OK(barrier((*comm)->world()));
    if (c.rank == 0) ::raise(SIGKILL);  // the store's host dies
    for (int i = 0; i < 100; ++i) {
      Tensor in = Tensor::zeros(DType::kF32, {64}), out = Tensor::zeros(DType::kF32, {128});
      RANK_OK(all_gather(*pair, in.view(), out.view()));
    }
    auto again = (*comm)->new_group({1, 2});
    RANK_CHECK(!again.ok(), "a group was created without the store");
    RANK_CHECK(again.status().message().find("store host (world rank 0) lost") != std::string::npos, "{}",
               again.status().message());
    return "";
  }, opt);
  EXPECT_EQ(results[0].signal, SIGKILL);
  EXPECT_EQ(results[1].exit_code, 0) << results[1].error;
  EXPECT_EQ(results[2].exit_code, 0) << results[2].error;
}
