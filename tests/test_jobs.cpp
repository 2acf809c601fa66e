// The job as a whole, with real processes: a spawner that dies or is told to
// stop takes its ranks with it; one rank's failure ends the job; bad sizes,
// counts and addresses are refused by name before anything is allocated or
// forked; the rendezvous is not fooled by another job or another program
// on its port.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "bootstrap/tcp_store.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using Clock = std::chrono::steady_clock;

namespace {

using Env = fgtest::ScopedEnv;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool port_is_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  ::close(fd);
  return ok;
}

// Reaps any orphan that was reparented to us (we are the subreaper); true
// once `pid` is gone.
bool gone(pid_t pid) {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// A spawner of 2 ranks that gather forever; each rank writes its pid to `fd`.
pid_t start_spawner(int port, int fd) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  LaunchPlan p;
  p.dp = 2;
  p.master_port = port;
  ::_exit(run_local_ranks(p, [fd](const Config& c) {
    auto comm = Communicator::create(c);
    if (!comm.ok()) return 1;
    const int32_t me = ::getpid();
    (void)!::write(fd, &me, sizeof(me));
    for (;;) {
      if (!barrier((*comm)->world()).ok()) return 2;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }));
}

}  // namespace

// SIGKILL, SIGTERM or SIGINT to the spawner's pid alone: its ranks end too,
// and the port is free for the next job.
TEST(Spawner, RanksDieWithTheirSpawner) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned ranks come to us, so we can see them go
  for (int sig : {SIGKILL, SIGTERM, SIGINT}) {
    SCOPED_TRACE(::strsignal(sig));
    const int port = fgtest::free_port();
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    const pid_t spawner = start_spawner(port, p[1]);
    ::close(p[1]);
    int32_t ranks[2] = {};
    ASSERT_EQ(::read(p[0], &ranks[0], 4), 4);
    ASSERT_EQ(::read(p[0], &ranks[1], 4), 4);
    ::close(p[0]);
    const auto t0 = Clock::now();
    ASSERT_EQ(::kill(spawner, sig), 0);
    ASSERT_EQ(::waitpid(spawner, nullptr, 0), spawner);
    // A generous bound: they must not run on (before the fix: minutes, at full CPU).
    while ((!gone(ranks[0]) || !gone(ranks[1])) && ms_since(t0) < 20000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_TRUE(gone(ranks[0]) && gone(ranks[1])) << "ranks still running 20 s after the spawner got signal " << sig;
    std::printf("signal %d to the spawner: its ranks ended %.0f ms later\n", sig, ms_since(t0));
    EXPECT_TRUE(port_is_free(port)) << "port " << port << " still held";
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// One rank fails while the others are busy with something long (here a
// sleep; in a real job another group's work): the job ends after the grace,
// not when the others happen to finish, and says so.
TEST(Spawner, OneFailedRankEndsTheJob) {
  LaunchPlan p;
  p.tp = 2;
  p.dp = 2;
  p.master_port = fgtest::free_port();
  p.timeout = std::chrono::milliseconds(60000);
  const auto t0 = Clock::now();
  int rc = run_local_ranks(p, [](const Config& c) {
    auto comm = Communicator::create(c);
    if (!comm.ok()) return 10;
    if (c.rank == 1) return 7;
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  });
  EXPECT_NE(rc, 0);
  EXPECT_LT(ms_since(t0), 60000) << "survivors were left to run on";
  std::printf("a failed rank ended the job %.0f ms after the start\n", ms_since(t0));
}

// A second job started on the port of a running one, without FG_TOKEN: its
// rank is refused (the spawner gave its own ranks a token) and the first
// job completes undisturbed.
TEST(Spawner, AnotherJobOnThePortIsRefused) {
  const int port = fgtest::free_port();
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  pid_t job_a = ::fork();
  if (job_a == 0) {
    ::close(p[0]);
    LaunchPlan plan;
    plan.dp = 2;
    plan.master_port = port;
    ::_exit(run_local_ranks(plan, [&](const Config& c) {
      if (c.rank == 1) {
        // Rank 0's store is up: let the intruder try first.
        char go = 0;
        (void)!::write(p[1], &go, 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      }
      auto comm = Communicator::create(c);
      if (!comm.ok()) return 20;
      return barrier((*comm)->world()).ok() ? 0 : 21;
    }));
  }
  ::close(p[1]);
  char go = 0;
  ASSERT_EQ(::read(p[0], &go, 1), 1);
  ::close(p[0]);
  auto results = fgtest::run_job(2, [&](const Config& c) -> std::string {
    if (c.rank != 1) return "";  // only job B's rank 1 goes to job A's port
    auto comm = Communicator::create(c);
    RANK_CHECK(!comm.ok(), "a rank of another job was let into the job on port {}", c.master_port);
    RANK_CHECK(comm.status().message().find("token") != std::string::npos, "{}", comm.status().to_string());
    return "";
  }, {.timeout = std::chrono::milliseconds(3000), .port = port});
  fgtest::expect_all_ok(results);
  int st = 0;
  ASSERT_EQ(::waitpid(job_a, &st, 0), job_a);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the first job was disturbed: status " << st;
}

namespace {

// What a local stranger who knows the job's id (it is in the job's segment
// names in /dev/shm while they exist) tries on the job's store: every token
// it could derive from what it can read, with and without a rank's identity,
// and if let in, SET job/abort. Returns how many attempts were admitted.
int stranger_attempts(int port, const std::string& job) {
  int admitted = 0;
  for (const std::string& token : {std::string(), "spawner-" + job, job}) {
    for (const char* identity : {"", "1/2"}) {
      auto c = bootstrap::TcpStoreClient::connect("127.0.0.1", port, token, Clock::now() + std::chrono::seconds(2),
                                                  identity);
      if (!c.ok()) continue;
      ++admitted;
      (void)c.value()->set(bootstrap::kJobAbortKey, bootstrap::job_abort_value({ErrorKind::kAborted, "a stranger"}, 0));
    }
  }
  return admitted;
}

}  // namespace

// A one-server job started without FG_TOKEN: its store admits only its own
// ranks. A local user of another uid, and one of the same uid, who know the
// job id try every token derivable from it while rank 1 has not joined yet:
// none gets in, and the job completes. (Before: the token was
// "spawner-<job id>", and uid 65534 stopped a root job this way.)
TEST(Spawner, ALocalStrangerCannotJoinOrStopAJob) {
  const bool root = ::geteuid() == 0;
  const int port = fgtest::free_port();
  int to_test[2], to_rank[2];
  ASSERT_EQ(::pipe(to_test), 0);
  ASSERT_EQ(::pipe(to_rank), 0);
  std::fflush(nullptr);
  pid_t job = ::fork();
  if (job == 0) {
    ::close(to_test[0]);
    ::close(to_rank[1]);
    LaunchPlan plan;
    plan.dp = 2;
    plan.master_port = port;
    plan.timeout = std::chrono::milliseconds(20000);
    ::_exit(run_local_ranks(plan, [&](const Config& c) {
      if (c.rank == 1) {
        // Rank 0's store is up: the strangers try first, with the job's id.
        const std::string job_id = c.job_id;
        (void)!::write(to_test[1], job_id.data(), job_id.size());
        ::close(to_test[1]);
        char done = 0;
        if (::read(to_rank[0], &done, 1) != 1) return 30;
      }
      auto comm = Communicator::create(c);
      if (!comm.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", c.rank, comm.status().to_string().c_str());
        return 20;
      }
      return barrier((*comm)->world()).ok() ? 0 : 21;
    }));
  }
  ::close(to_test[1]);
  ::close(to_rank[0]);
  char buf[128] = {};
  const ssize_t n = ::read(to_test[0], buf, sizeof(buf) - 1);
  ::close(to_test[0]);
  ASSERT_GT(n, 0) << "rank 1 did not say the job id";
  const std::string job_id(buf, static_cast<size_t>(n));
  EXPECT_EQ(stranger_attempts(port, job_id), 0) << "a stranger of this uid was admitted";
  if (root) {
    EXPECT_EQ(fgtest::as_nobody([&] { return stranger_attempts(port, job_id); }), 0) << "a stranger of uid 65534 was admitted";
  }
  char done = 1;
  ASSERT_EQ(::write(to_rank[1], &done, 1), 1);
  ::close(to_rank[1]);
  int st = 0;
  ASSERT_EQ(::waitpid(job, &st, 0), job);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the job was disturbed: status " << st;
  if (!root) GTEST_SKIP() << "the stranger of another uid needs root to run; same-uid strangers were refused";
}

// Two one-server jobs started at once without PORT each take a free port of
// their own (the spawner's listening socket, handed to rank 0): both complete,
// on different ports, whoever holds the default one. (Before: both took
// 29500, and the second failed or was refused.)
TEST(Spawner, TwoJobsWithoutAPortEachTakeAFreeOne) {
  int ports[2];
  ASSERT_EQ(::pipe(ports), 0);
  std::vector<pid_t> jobs;
  for (int j = 0; j < 2; ++j) {
    std::fflush(nullptr);
    pid_t job = ::fork();
    if (job == 0) {
      LaunchPlan plan;  // no master_port: PORT unset
      plan.dp = 2;
      ::_exit(run_local_ranks(plan, [&](const Config& c) {
        if (c.rank == 0) (void)!::write(ports[1], &c.master_port, sizeof(int));
        auto comm = Communicator::create(c);
        if (!comm.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", c.rank, comm.status().to_string().c_str());
          return 20;
        }
        for (int i = 0; i < 200; ++i) {
          if (!barrier((*comm)->world()).ok()) return 21;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        return 0;
      }));
    }
    jobs.push_back(job);
  }
  ::close(ports[1]);
  int got[2] = {0, 0};
  ASSERT_EQ(::read(ports[0], &got[0], sizeof(int)), static_cast<ssize_t>(sizeof(int)));
  ASSERT_EQ(::read(ports[0], &got[1], sizeof(int)), static_cast<ssize_t>(sizeof(int)));
  ::close(ports[0]);
  for (pid_t job : jobs) {
    int st = 0;
    ASSERT_EQ(::waitpid(job, &st, 0), job);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a job failed: status " << st;
  }
  EXPECT_NE(got[0], got[1]);
  for (int p : got) {
    EXPECT_GT(p, 0);
    EXPECT_NE(p, LaunchPlan::kDefaultPort);
  }
}

// Something else holds the port and accepts connections but never answers:
// the rank says so within seconds instead of waiting the whole timeout, and
// rank 0 says it cannot listen.
TEST(Rendezvous, AnotherProgramOnThePortFailsFast) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(fd, 16), 0);  // the kernel completes connections; nobody answers
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  Config c;
  c.rank = 1;
  c.world_size = 2;
  c.master_port = ntohs(sa.sin_port);
  c.timeout = std::chrono::milliseconds(30000);
  const auto t0 = Clock::now();
  auto comm = Communicator::create(c);
  const double took = ms_since(t0);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("another program"), std::string::npos) << comm.status().to_string();
  EXPECT_LT(took, 15000) << "waited most of the 30 s timeout";
  std::printf("silent program on the port: error after %.0f ms\n", took);
  c.rank = 0;
  auto r0 = Communicator::create(c);
  ASSERT_FALSE(r0.ok());
  EXPECT_NE(r0.status().message().find("cannot listen"), std::string::npos) << r0.status().to_string();
  ::close(fd);
}

// MASTER_IP may be a host name or an IPv6 address, not only an IPv4 literal.
TEST(Rendezvous, MasterMayBeANameOrIpv6) {
  std::vector<std::string> masters = {"localhost"};
  {
    int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_addr = in6addr_loopback;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) masters.push_back("::1");
    if (fd >= 0) ::close(fd);
  }
  for (const std::string& master : masters) {
    LaunchPlan p;
    p.dp = 2;
    p.master_port = fgtest::free_port();
    p.master_addr = master;
    int rc = run_local_ranks(p, [](const Config& c) {
      auto comm = Communicator::create(c);
      if (!comm.ok()) {
        std::fprintf(stderr, "%s\n", comm.status().to_string().c_str());
        return 1;
      }
      int32_t mine = c.rank + 40, all[2] = {};
      if (!all_gather((*comm)->world(), TensorView(&mine, DType::kI32, {1}), TensorView(all, DType::kI32, {2})).ok()) return 2;
      return all[0] == 40 && all[1] == 41 ? 0 : 3;
    });
    EXPECT_EQ(rc, 0) << "MASTER_IP=" << master;
  }
  Config c;
  c.rank = 0;
  c.world_size = 1;
  c.master_addr = "no-such-host.invalid";
  c.master_port = fgtest::free_port();
  auto comm = Communicator::create(c);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("does not resolve"), std::string::npos) << comm.status().to_string();
}

// Every environment variable is checked before anything is forked or
// allocated, and the error names it and what it accepts.
TEST(Environment, BadValuesAreRefusedByName) {
  struct Bad {
    std::vector<std::pair<const char*, const char*>> vars;
    const char* needle;
  };
  const Bad launch_cases[] = {
      {{{"TP", " 2"}}, "TP=' 2'"},
      {{{"DP", "2 "}}, "DP='2 '"},
      {{{"DP", "-1"}}, "DP='-1'"},
      {{{"PORT", "0"}}, "PORT=0"},
      {{{"PORT", "65536"}}, "PORT=65536"},
      {{{"DP", "100000"}}, "DP=100000"},
      {{{"TP", "46341"}, {"DP", "46341"}}, "TP=46341"},
      {{{"TP", "64"}, {"DP", "65"}}, "at most 4096 ranks"},
      {{{"TP", "16"}, {"DP", "64"}}, "at most 512 ranks per server"},
      {{{"FG_TIMEOUT_MS", "5s"}}, "FG_TIMEOUT_MS='5s'"},
      {{{"FG_RING_BYTES", "1"}}, "FG_RING_BYTES=1 is outside"},
      {{{"FG_RING_BYTES", "abc"}}, "FG_RING_BYTES='abc'"},
      {{{"FG_HIER_MIN_BYTES", "64k"}}, "FG_HIER_MIN_BYTES='64k'"},
      {{{"FG_COPY_IN", "fast"}}, "FG_COPY_IN='fast'"},
      {{{"FG_BIND", "yes"}}, "FG_BIND='yes'"},
  };
  for (const Bad& b : launch_cases) {
    Env e(b.vars);
    auto p = launch_plan_from_env();
    ASSERT_FALSE(p.ok()) << b.needle;
    EXPECT_EQ(p.status().kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(p.status().message().find(b.needle), std::string::npos) << p.status().message();
  }
  // A communicator made without the launcher checks them too.
  for (const Bad& b : {Bad{{{"FG_RING_BYTES", "abc"}}, "FG_RING_BYTES"}, Bad{{{"FG_SPIN_US", "-3"}}, "FG_SPIN_US"},
                       Bad{{{"FG_NET_PIECE_BYTES", "1"}}, "FG_NET_PIECE_BYTES"}}) {
    Env e(b.vars);
    Config c;
    c.rank = 0;
    c.world_size = 1;
    c.master_port = fgtest::free_port();
    auto comm = Communicator::create(c);
    ASSERT_FALSE(comm.ok()) << b.needle;
    EXPECT_NE(comm.status().message().find(b.needle), std::string::npos) << comm.status().message();
  }
  Config c;
  c.rank = 0;
  c.world_size = 1;
  c.master_port = 0;
  EXPECT_NE(c.validate().message().find("port 0"), std::string::npos) << c.validate().message();
}

// A group whose rings cannot fit in /dev/shm is refused by name on every
// member, before the segment is made (it would be SIGBUS while faulting in).
TEST(Environment, RingsLargerThanDevShmAreRefused) {
  struct statvfs fs {};
  ASSERT_EQ(::statvfs("/dev/shm", &fs), 0);
  const unsigned long long free_bytes = static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize;
  const int members = static_cast<int>(free_bytes >> 30) + 1;  // rings of 1 GiB each
  if (members > 48) GTEST_SKIP() << "/dev/shm has " << (free_bytes >> 30) << " GiB free: too many ranks to fill it";
  Env e(std::vector<std::pair<const char*, const char*>>{{"FG_RING_BYTES", "1073741824"}});
  auto results = fgtest::run_job(members, [&](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_CHECK(!comm.ok(), "a {}-member group of 1 GiB rings was created", members);
    // Rank 0 names the shortage; the others read its words in the store.
    RANK_CHECK(comm.status().kind() == ErrorKind::kResourceExhausted ||
                   comm.status().message().find("job aborted: rank 0") != std::string::npos,
               "{}", comm.status().to_string());
    RANK_CHECK(comm.status().message().find("FG_RING_BYTES") != std::string::npos, "{}", comm.status().message());
    return "";
  }, {.timeout = std::chrono::milliseconds(20000)});
  fgtest::expect_all_ok(results);
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

// Absurd shapes never reach the allocator as wrapped-around sizes.
TEST(Environment, AbsurdTensorShapesThrowNotWrap) {
  EXPECT_THROW(Tensor::empty(DType::kF32, {-1, 8}), std::length_error);
  EXPECT_THROW(Tensor::empty(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}), std::length_error);
  EXPECT_EQ(Tensor::empty(DType::kF32, {0, 8}).nbytes(), 0u);
}

// Tensor::allocate says it as Group::empty does: a status, no exception.
TEST(Environment, TensorAllocateReturnsTheErrorAsAStatus) {
  auto negative = Tensor::allocate(DType::kF32, {-1, 8});
  EXPECT_EQ(negative.status().kind(), ErrorKind::kInvalidArgument) << negative.status().to_string();
  auto wraps = Tensor::allocate(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_EQ(wraps.status().kind(), ErrorKind::kInvalidArgument) << wraps.status().to_string();
  // 64 TiB: more than this machine has, a size the allocator refuses.
  auto huge = Tensor::allocate(DType::kU8, {int64_t{1} << 46});
  EXPECT_EQ(huge.status().kind(), ErrorKind::kResourceExhausted) << huge.status().to_string();
  EXPECT_NE(huge.status().message().find("uint8[70368744177664]"), std::string::npos) << huge.status().message();
  EXPECT_THROW(Tensor::empty(DType::kU8, {int64_t{1} << 46}), std::bad_alloc);
  auto fine = Tensor::allocate(DType::kF32, {3, 5});
  ASSERT_TRUE(fine.ok()) << fine.status().to_string();
  EXPECT_EQ(fine.value().nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(fine.value().data()) % 64, 0u);
}

// A rank that timed out leaves at once: it does not wait in its exit for the
// very peer that never came (before: the whole timeout again, and more
// across servers).
TEST(Exit, ARankThatTimedOutLeavesPromptly) {
  auto results = fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    if (c.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(6000));  // never takes part
      return "";
    }
    Status s = fgtest::gather_bytes((*comm)->world(), 64);
    RANK_CHECK(s.kind() == ErrorKind::kTimeout, "expected a timeout, got {}", s.to_string());
    const auto t0 = Clock::now();
    comm.value().reset();
    const double took = ms_since(t0);
    std::printf("closing the communicator after a timeout took %.1f ms\n", took);
    RANK_CHECK(took < 1500, "closing after a timeout took {:.0f} ms (timeout 3000 ms)", took);
    return "";
  }, {.timeout = std::chrono::milliseconds(3000)});
  fgtest::expect_all_ok(results);
}
