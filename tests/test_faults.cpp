// Bad input across ranks and dead or stalled peers: every rank gets a clear
// error in bounded time, never a hang or corrupt data, and /dev/shm is clean.
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using fgtest::gather_bytes;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

TEST(Mismatch, SizesNameTheRanksAndBytesOnEveryRankAndTheGroupRecovers) {
  auto results = fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    for (size_t big : {size_t{98304}, size_t{16}, size_t{5u << 20}}) {
      const size_t mine = c.rank == 2 ? big / 2 : big;
      Status s = gather_bytes(g, mine);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch, "expected Mismatch, got {}", s.to_string());
      const std::string want =
          c.rank == 2 ? fmt::format("rank 0 sent all_gather {} bytes", big) : fmt::format("rank 2 sent all_gather {} bytes", big / 2);
      RANK_CHECK(s.message().find(want) != std::string::npos, "message lacks '{}': {}", want, s.message());
      RANK_CHECK(s.message().find(fmt::format("rank {} expected", c.rank)) != std::string::npos, "{}", s.message());
      // The first peer that disagreed, as a field (rank 2 reads rank 0 first).
      RANK_CHECK(s.peer() == (c.rank == 2 ? 0 : 2), "peer() = {} for rank {}", s.peer(), c.rank);
      // Same group, right sizes: works, and the data is right.
      Tensor in = Tensor::empty(DType::kU8, {4097}), out = Tensor::empty(DType::kU8, {3 * 4097});
      fgtest::fill_pattern(in.data(), 4097, c.rank, big);
      RANK_OK(all_gather(g, in.view(), out.view()));
      for (int r = 0; r < 3; ++r) RANK_CHECK(fgtest::check_pattern(out.data_as<char>() + r * 4097, 4097, r, big) < 0, "rank {}", r);
    }
    return "";
  });
  fgtest::expect_all_ok(results);
}

// A member waits first for the peers on its own CPU (algo::PeerOrder); the
// peer a mismatch names first is still the next member on, wherever the
// ranks run: rank 2, on rank 1's CPU and not rank 0's, names rank 0.
TEST(Mismatch, TheFirstDisagreeingPeerDoesNotDependOnWhereRanksRun) {
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU";
  fgtest::expect_all_ok(fgtest::run_job(3, [&](const Config& c) -> std::string {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[c.rank == 0 ? 0 : 1], &one);
    RANK_CHECK(::sched_setaffinity(0, sizeof(one), &one) == 0, "sched_setaffinity: {}", std::strerror(errno));
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    RANK_OK(gather_bytes(g, 64));  // every member has posted from its CPU
    Status s = gather_bytes(g, c.rank == 2 ? 32 : 64);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "expected Mismatch, got {}", s.to_string());
    RANK_CHECK(s.peer() == (c.rank == 2 ? 0 : 2), "peer() = {} for rank {}: {}", s.peer(), c.rank, s.message());
    if (c.rank == 2) {
      const size_t first = s.message().find("rank 0 sent"), second = s.message().find("rank 1 sent");
      RANK_CHECK(first != std::string::npos && second != std::string::npos && first < second, "{}", s.message());
    }
    return "";
  }));
}

TEST(Mismatch, DtypesAndOpsAreNamed) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Status s = gather_bytes(g, 4096, c.rank == 0 ? DType::kF32 : DType::kF16);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    RANK_CHECK(s.message().find("fp16") != std::string::npos && s.message().find("fp32") != std::string::npos, "{}", s.message());
    s = c.rank == 0 ? barrier(g) : gather_bytes(g, 0);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    RANK_CHECK(s.message().find("barrier") != std::string::npos, "{}", s.message());
    RANK_OK(barrier(g));
    return "";
  }));
}

TEST(Arguments, WrongBuffersAreRejectedBeforeAnyCommunication) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor in = Tensor::zeros(DType::kF32, {10}), small = Tensor::zeros(DType::kF32, {19});
    Status s = all_gather(g, in.view(), small.view());
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("need 80") != std::string::npos, "{}", s.to_string());
    s = all_gather(g, TensorView(nullptr, DType::kF32, {10}), small.view());
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("null") != std::string::npos, "{}", s.to_string());
    std::vector<TensorView> one = {in.view()};
    s = all_gather(g, in.view(), std::span<const TensorView>(one));
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("1 output buffers for 2 ranks") != std::string::npos, "{}", s.to_string());
    Tensor out = Tensor::zeros(DType::kF32, {20});
    s = all_gather(g, TensorView(out.data_as<float>() + 5, DType::kF32, {10}), out.view());
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("overlaps") != std::string::npos, "{}", s.to_string());
    // Zero-size collectives are valid no-ops.
    RANK_OK(all_gather(g, TensorView(nullptr, DType::kF32, {0}), TensorView(nullptr, DType::kF32, {0})));
    auto notmine = (*comm)->new_group({1 - c.rank});
    RANK_CHECK(!notmine.ok() && notmine.status().message().find("not a member") != std::string::npos, "{}", notmine.status().to_string());
    auto dup = (*comm)->new_group({0, 0, 1});
    RANK_CHECK(!dup.ok() && dup.status().message().find("listed twice") != std::string::npos, "{}", dup.status().to_string());
    return "";
  }));
}

class DeadRank : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The victim dies (SIGKILL) before any collective, between collectives, or
// while the others are inside one; every survivor fails naming it, fast.
TEST_P(DeadRank, SurvivorsFailNamingItWithinTheTimeout) {
  const auto [world, phase] = GetParam();
  const int victim = world - 1;
  fgtest::JobOptions opt;
  opt.timeout = 5000ms;
  auto results = fgtest::run_job(world, [&, world = world, phase = phase](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    if (c.rank == victim) {
      if (phase >= 1) {
        for (int i = 0; i < 50; ++i) RANK_OK(gather_bytes(g, 4096));
      }
      if (phase == 2) std::this_thread::sleep_for(50ms);  // survivors are waiting inside the next call
      ::raise(SIGKILL);
    }
    Status s;
    Clock::time_point last_ok = Clock::now();
    for (int i = 0; i < 1000000 && s.ok(); ++i) {
      s = gather_bytes(g, 4096);
      if (s.ok()) last_ok = Clock::now();
    }
    RANK_CHECK(s.kind() == ErrorKind::kPeerLost, "expected PeerLost, got {}", s.to_string());
    RANK_CHECK(s.message().find(fmt::format("rank {}", victim)) != std::string::npos ||
                   s.message().find("aborted") != std::string::npos,
               "message should name rank {}: {}", victim, s.message());
    // The victim, or the survivor that told us it had given up.
    RANK_CHECK(s.peer() >= 0 && s.peer() < world && s.peer() != c.rank, "peer() = {}", s.peer());
    const double noticed_ms = ms_since(last_ok);
    RANK_CHECK(noticed_ms < 2000, "took {:.0f} ms to notice", noticed_ms);
    // Destroying the communicator after the error returns promptly too.
    auto d0 = Clock::now();
    comm.value().reset();
    const double destroy_ms = ms_since(d0);
    RANK_CHECK(destroy_ms < 5000 + 1000, "destroy took {:.0f} ms", destroy_ms);
    std::printf("world %d phase %d: rank %d got PeerLost %.1f ms after its last good call; destroy %.1f ms\n", world,
                phase, c.rank, noticed_ms, destroy_ms);
    std::fflush(stdout);
    return "";
  }, opt);
  for (int r = 0; r < world; ++r) {
    if (r == victim) {
      EXPECT_EQ(results[r].signal, SIGKILL);
    } else {
      EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].error;
    }
  }
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

std::string dead_rank_name(const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  static const char* kPhase[] = {"before", "between", "during"};
  return fmt::format("world{}_{}", std::get<0>(info.param), kPhase[std::get<1>(info.param)]);
}

INSTANTIATE_TEST_SUITE_P(Faults, DeadRank, ::testing::Combine(::testing::Values(2, 4, 6), ::testing::Values(0, 1, 2)),
                         dead_rank_name);

// A peer stopped (SIGSTOP) for 10 s and then continued is slow, not lost:
// with the default timeout (Config's own, 10 minutes) the call completes,
// and the waiting rank said whom it waited for while it was stopped.
TEST(Stall, APeerStoppedForTenSecondsIsReportedNotFailed) {
  const std::string log = fmt::format("/tmp/fg-stall-{}.log", ::getpid());
  const Config defaults;
  fgtest::JobOptions opt;
  opt.timeout = defaults.timeout;
  auto results = fgtest::run_job(2, [&](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    RANK_OK(gather_bytes(g, 1000));
    if (c.rank == 1) {
      // A helper continues this rank 10 s after it stopped itself.
      const pid_t me = ::getpid();
      if (::fork() == 0) {
        std::this_thread::sleep_for(10s);
        ::kill(me, SIGCONT);
        ::_exit(0);
      }
      ::raise(SIGSTOP);
    } else {
      RANK_CHECK(std::freopen(log.c_str(), "w", stderr) != nullptr, "cannot send stderr to {}", log);
    }
    const auto t0 = Clock::now();
    RANK_OK(gather_bytes(g, 1000));
    if (c.rank == 0) {
      RANK_CHECK(ms_since(t0) > 9000, "rank 1 was stopped for 10 s, the call took {:.0f} ms", ms_since(t0));
      std::fflush(stderr);
      std::ifstream f(log);
      const std::string said((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      RANK_CHECK(said.find("fastgather: still waiting after") != std::string::npos &&
                     said.find("rank 1 did not arrive") != std::string::npos &&
                     said.find("rank 0 waiting at step") != std::string::npos,
                 "no report of the wait on stderr: '{}'", said);
      std::printf("while rank 1 was stopped, rank 0 said:\n%s", said.c_str());
      std::fflush(stdout);
    }
    return "";
  }, opt);
  std::remove(log.c_str());
  fgtest::expect_all_ok(results);
}

TEST(Stall, SlowRankIsNoErrorMissingRankTimesOut) {
  fgtest::JobOptions opt;
  opt.timeout = 800ms;
  auto results = fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    if (c.rank == 1) std::this_thread::sleep_for(300ms);  // slow, within the timeout
    RANK_OK(gather_bytes(g, 1000));
    if (c.rank == 1) {
      std::this_thread::sleep_for(3000ms);  // never arrives in time
      return "";
    }
    auto t0 = Clock::now();
    Status s = gather_bytes(g, 1000);
    RANK_CHECK(s.kind() == ErrorKind::kTimeout, "{}", s.to_string());
    RANK_CHECK(s.message().find("rank 1 did not arrive within 800 ms") != std::string::npos, "{}", s.message());
    // In the words torch's tests look for (" (Timed out|closed|timeout) ").
    RANK_CHECK(s.to_string().find(" Timed out ") != std::string::npos, "{}", s.to_string());
    RANK_CHECK(s.peer() == 1, "peer() = {}", s.peer());
    // Not before the timeout; the upper bound is only against a hang (ASan, loaded cores).
    RANK_CHECK(ms_since(t0) >= 790 && ms_since(t0) < 10000, "{:.0f} ms", ms_since(t0));
    return "";
  }, opt);
  fgtest::expect_all_ok(results);
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

TEST(Cleanup, NothingLeftInDevShmAfterNormalOrErrorExit) {
  auto results = fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto sub = (*comm)->tp_group_of_dp(2, 2);
    RANK_OK(sub.status());
    RANK_OK(gather_bytes(*sub.value(), 100));
    return c.rank == 3 ? "deliberate error exit" : "";
  });
  EXPECT_EQ(results[3].exit_code, 1);
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

TEST(Oversubscribed, SixRanksOnTwoCoresMixedSizes) {
  fgtest::expect_all_ok(fgtest::run_job(6, [](const Config& c) {
    return fgtest::gather_mixed_sizes(c, 3, 2, {8, 96 * 1024, 1000, 0, 300000}, 2000);
  }));
}

// A member that cannot build a group (here: no address space left for the
// group's symmetric heap, as under `ulimit -v`) says why to the members
// waiting on it: they fail at once with its reason, not at their timeout,
// and the reason names the setting that needs the address space. The
// creator (member 0) and a member that maps what the creator made, in turn.
class MemberCannotMap : public ::testing::TestWithParam<int> {};

TEST_P(MemberCannotMap, TheOthersFailAtOnceWithItsReason) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "an address-space limit and a sanitizer's shadow memory do not mix";
#endif
  const int failing = GetParam();
  fgtest::JobOptions o;
  o.timeout = 20s;
  auto results = fgtest::run_job(3, [&](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    if (c.rank == failing) {
      // Room for what this process has, and 64 MiB more: not for a second
      // heap of 3 x FG_SYMMETRIC_BYTES (1 GiB by default).
      long pages = 0;
      FILE* f = std::fopen("/proc/self/statm", "r");
      RANK_CHECK(f != nullptr && std::fscanf(f, "%ld", &pages) == 1, "cannot read /proc/self/statm");
      std::fclose(f);
      const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (64 << 20);
      rlimit rl{limit, limit};
      RANK_CHECK(::setrlimit(RLIMIT_AS, &rl) == 0, "setrlimit: {}", std::strerror(errno));
    }
    const auto t0 = Clock::now();
    auto g = (*comm)->new_group({0, 1, 2});
    const double took = ms_since(t0);
    RANK_CHECK(!g.ok(), "the group was built although rank {} had no address space for its heap", failing);
    const std::string& m = g.status().message();
    RANK_CHECK(m.find("FG_SYMMETRIC_BYTES") != std::string::npos, "the reason does not name the setting: {}", m);
    if (c.rank != failing) {
      RANK_CHECK(m.find(fmt::format("rank {}: creating group", failing)) != std::string::npos,
                 "the reason is not rank {}'s: {}", failing, m);
      RANK_CHECK(took < 5000, "learnt it after {:.0f} ms (the timeout is 20 s)", took);
      std::printf("rank %d learnt rank %d's failure after %.0f ms: %s\n", c.rank, failing, took, m.c_str());
      std::fflush(stdout);
    }
    return "";
  }, o);
  fgtest::expect_all_ok(results);
}

INSTANTIATE_TEST_SUITE_P(Groups, MemberCannotMap, ::testing::Values(0, 2));

// A creator later than the others' patience (the FG_RING_BYTES=
// 1073741824 with 4 ranks: rank 0 was still filling its 4 GiB segment; here
// it arrives 1.5 s late with a 500 ms timeout): the waiting ranks say what
// it was to make - its size and the setting - and the creator, when it gets
// there, fails with their reason instead of saying nothing.
TEST(Groups, ACreatorSlowerThanTheTimeoutIsNamedWithItsSegment) {
  fgtest::JobOptions o;
  o.timeout = 500ms;
  const auto t0 = Clock::now();
  auto results = fgtest::run_job(4, [](const Config& base) -> std::string {
    Config c = base;
    Settings s;
    s.ring_bytes = size_t{1} << 20;
    s.symmetric_bytes = 0;
    c.settings = s;
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    if (c.rank == 0) std::this_thread::sleep_for(1500ms);
    auto g = (*comm)->new_group({0, 1, 2, 3});
    RANK_CHECK(!g.ok(), "the group was made although rank 0 came 1.5 s late with a 500 ms timeout");
    const std::string& m = g.status().message();
    RANK_CHECK(m.find("rank 0 never created the group's segment (5 MiB: 4 members x FG_RING_BYTES=1048576)") !=
                   std::string::npos,
               "the reason does not say what rank 0 was to make: {}", m);
    return "";
  }, o);
  fgtest::expect_all_ok(results);
  EXPECT_LT(ms_since(t0), 20000);
}

// What a group costs (the 200 new_group calls, 8 MB each): its ring
// (members x FG_RING_BYTES, populated) and a few file descriptors; nothing
// that grows otherwise. 60 groups of 2 with a 64 KiB ring, RSS and fds
// counted before and after.
TEST(Groups, EachGroupCostsItsRingAndTwoDescriptors) {
  auto results = fgtest::run_job(2, [](const Config& base) -> std::string {
    Config c = base;
    Settings s;
    s.ring_bytes = 65536;
    c.settings = s;
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto fds = [] {
      int n = 0;
      for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.is_symlink() ? 1 : 0;
      return n;
    };
    const double rss0 = fgtest::rss_bytes();
    const int fd0 = fds();
    constexpr int kGroups = 60;
    for (int i = 0; i < kGroups; ++i) RANK_OK((*comm)->new_group({0, 1}).status());
    const double per_group = (fgtest::rss_bytes() - rss0) / kGroups;
    const double per_fd = static_cast<double>(fds() - fd0) / kGroups;
    if (c.rank == 0) {
      std::printf("per group: %.0f KiB of RSS (ring: 2 x 64 KiB), %.2f fds\n", per_group / 1024, per_fd);
      std::fflush(stdout);
    }
    RANK_CHECK(per_group < 2 * 65536 + (256 << 10), "{:.0f} bytes of RSS per group", per_group);
    RANK_CHECK(per_fd <= 2.0, "{:.2f} descriptors per group", per_fd);
    return "";
  });
  fgtest::expect_all_ok(results);
}
