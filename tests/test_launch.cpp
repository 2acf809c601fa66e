// Launch as the original script: TP, DP, SERVER_NUM, SERVER_INDEX,
// MASTER_IP, PORT; spawned local ranks; validation of every number.
#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <optional>
#include <regex>
#include <set>

#include "base/env.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "transport/shm_segment.hpp"

using namespace fastgather;

using Env = fgtest::ScopedEnv;

TEST(LaunchPlan, ReadsTheOriginalVariables) {
  Env e({{"TP", "3"}, {"DP", "2"}, {"SERVER_NUM", "2"}, {"SERVER_INDEX", "1"}, {"MASTER_IP", "10.0.0.7"}, {"PORT", "4567"}});
  auto p = launch_plan_from_env();
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p.value().world_size(), 6);
  EXPECT_EQ(p.value().local_ranks(), 3);
  EXPECT_EQ(p.value().first_local_rank(), 3);
  Config c = p.value().config_for_rank(4);
  EXPECT_EQ(c.master_addr, "10.0.0.7");
  EXPECT_EQ(c.master_port, 4567);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_EQ(c.server_of(2), 0);
  EXPECT_EQ(c.server_of(3), 1);
}

// SERVER_NUM need not divide TP*DP: servers take consecutive blocks, the
// first ones one rank more (TP=2 DP=2 on 3 servers: ranks 0-1, 2, 3).
TEST(LaunchPlan, UnevenServersTakeConsecutiveBlocks) {
  Env e({{"TP", "2"}, {"DP", "2"}, {"SERVER_NUM", "3"}, {"SERVER_INDEX", "1"}});
  auto p = launch_plan_from_env();
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p.value().first_local_rank(), 2);
  EXPECT_EQ(p.value().local_ranks(), 1);
  Config c = p.value().config_for_rank(2);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  const int expected[] = {0, 0, 1, 2};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(c.server_of(r), expected[r]) << "rank " << r;
  EXPECT_EQ(c.ranks_on(0), 2);
  EXPECT_EQ(c.ranks_on(2), 1);
  // Every rank lands on exactly one server, for many shapes.
  for (int world = 1; world <= 13; ++world) {
    for (int servers = 1; servers <= world; ++servers) {
      for (int r = 0; r < world; ++r) {
        const int s = Config::server_of_rank(world, servers, r);
        ASSERT_GE(r, Config::first_rank_on_server(world, servers, s)) << world << "/" << servers;
        ASSERT_LT(r, Config::first_rank_on_server(world, servers, s + 1)) << world << "/" << servers;
      }
      ASSERT_EQ(Config::first_rank_on_server(world, servers, servers), world);
    }
  }
}

TEST(LaunchPlan, RejectsWhatCannotFillOrParse) {
  {
    Env e({{"TP", "1"}, {"DP", "2"}, {"SERVER_NUM", "3"}});
    auto p = launch_plan_from_env();
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("cannot fill SERVER_NUM=3"), std::string::npos) << p.status().message();
  }
  {
    Env e({{"SERVER_NUM", "2"}, {"SERVER_INDEX", "2"}});
    EXPECT_FALSE(launch_plan_from_env().ok());
  }
  {
    Env e({{"TP", "two"}, {"DP", "2"}});
    auto p = launch_plan_from_env();
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("TP='two'"), std::string::npos);
  }
  Config c;
  c.rank = 3;
  c.world_size = 4;
  c.servers = 2;
  c.server_index = 0;
  EXPECT_NE(c.validate().message().find("belongs to server 1"), std::string::npos) << c.validate().message();
}

TEST(RunLocalRanks, SpawnsEveryRankAndReportsFailures) {
  LaunchPlan p;
  p.tp = 2;
  p.dp = 2;
  p.master_port = fgtest::free_port();
  // Each rank gathers its rank number; the sum proves all four took part.
  int rc = run_local_ranks(p, [](const Config& c) {
    auto comm = Communicator::create(c);
    if (!comm.ok()) return 10;
    int32_t mine = c.rank, all[4] = {};
    if (!all_gather((*comm)->world(), TensorView(&mine, DType::kI32, {1}), TensorView(all, DType::kI32, {4})).ok()) return 11;
    return all[0] + all[1] + all[2] + all[3] == 6 ? 0 : 12;
  });
  EXPECT_EQ(rc, 0);

  p.master_port = fgtest::free_port();
  p.timeout = std::chrono::milliseconds(1000);
  rc = run_local_ranks(p, [](const Config& c) {
    auto comm = Communicator::create(c);
    if (!comm.ok()) return 10;
    if (c.rank == 2) ::raise(SIGKILL);
    int32_t mine = c.rank, all[4] = {};
    Status s = all_gather((*comm)->world(), TensorView(&mine, DType::kI32, {1}), TensorView(all, DType::kI32, {4}));
    return s.kind() == ErrorKind::kPeerLost ? 0 : 13;
  });
  EXPECT_NE(rc, 0);  // one rank was killed: the job failed
}

// The spawner SIGKILLed while a rank holds a segment of the job that is not
// yet unlinked (made, its peers not there yet): the ranks die with it
// (their death signal), and the job's reaper removes the segment - nobody
// else is left to. This process is the subreaper, so the reaper ends here.
TEST(RunLocalRanks, ASpawnerKilledLeavesNoSegmentOfItsJob) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  std::fflush(nullptr);
  const pid_t spawner = ::fork();
  if (spawner == 0) {
    ::close(ready[0]);
    LaunchPlan p;
    p.dp = 2;
    p.master_port = fgtest::free_port();
    ::_exit(run_local_ranks(p, [&](const Config& c) {
      std::optional<transport::ShmSegment> kept;  // held until the rank dies
      if (c.rank == 0) {
        auto seg = transport::ShmSegment::create(transport::ShmSegment::segment_name(c.job_id, ::getpid(), 1), 4096);
        if (!seg.ok()) return 1;
        kept.emplace(std::move(seg).value());
        const std::string line = kept->name() + "\n";
        if (::write(ready[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 1;
      }
      for (;;) ::pause();
    }));
  }
  ::close(ready[1]);
  std::string name;
  pollfd pfd{ready[0], POLLIN, 0};
  char c = 0;
  while (::poll(&pfd, 1, 10000) == 1 && ::read(ready[0], &c, 1) == 1 && c != '\n') name += c;
  ::close(ready[0]);
  ASSERT_FALSE(name.empty()) << "rank 0 made no segment within 10 s";
  const std::filesystem::path file = "/dev/shm" + name;
  EXPECT_TRUE(std::filesystem::exists(file)) << file;
  ::kill(spawner, SIGKILL);
  const bool none = fgtest::reap_all_children(std::chrono::seconds(10), std::chrono::milliseconds(5));
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  EXPECT_TRUE(none) << "processes left 10 s after the spawner's SIGKILL";
  EXPECT_FALSE(std::filesystem::exists(file)) << file << " left behind";
  transport::ShmSegment::sweep_stale();
}

TEST(RunLocalRanks, ARankStartedByASpawnerRunsOnlyItself) {
  Env e({{"FG_RANK", "1"}, {"FG_WORLD_SIZE", "2"}});
  LaunchPlan p;
  int calls = 0;
  int rc = run_local_ranks(p, [&](const Config& c) {
    ++calls;
    return c.rank == 1 && c.world_size == 2 ? 0 : 1;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(calls, 1);
}

// The README's table of environment variables and the one the code reads
// (base/env.cpp) name the same variables, and `fg-bench --help-env` prints the latter.
TEST(Environment, TheReadmeTableMatchesTheCode) {
  std::ifstream f(std::string(FG_SOURCE_DIR) + "/README.md");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t start = text.find("## Environment");
  ASSERT_NE(start, std::string::npos);
  const std::string section = text.substr(start, text.find("\n## ", start + 1) - start);
  std::set<std::string> in_readme;
  const std::regex name(R"(`((?:FG_|TP|DP|SERVER_|MASTER_|PORT|UCX_|OMPI_|PMI)[A-Z_]*)`)");
  for (std::sregex_iterator it(section.begin(), section.end(), name), end; it != end; ++it) in_readme.insert((*it)[1]);
  std::set<std::string> in_code;
  for (const auto& v : base::env_table()) in_code.insert(v.name);
  EXPECT_EQ(in_readme, in_code);
  const std::string help = environment_help();
  for (const auto& v : in_code) EXPECT_NE(help.find(v), std::string::npos) << v;
}

// The README's library example is the program the ReadmeExample test runs.
TEST(Readme, TheExampleIsTheProgramThatIsTested) {
  auto slurp = [](const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  const std::string readme = slurp(std::string(FG_SOURCE_DIR) + "/README.md");
  const std::string program = slurp(std::string(FG_SOURCE_DIR) + "/tests/example_readme.cpp");
  const std::string open = "## Using the library\n\n```cpp\n";
  const size_t a = readme.find(open);
  ASSERT_NE(a, std::string::npos) << "README has no library example";
  const size_t b = readme.find("```\n", a + open.size());
  ASSERT_NE(b, std::string::npos);
  const std::string shown = readme.substr(a + open.size(), b - a - open.size());
  ASSERT_GT(shown.size(), 200u);
  EXPECT_NE(program.find(shown), std::string::npos) << "README's example differs from tests/example_readme.cpp";
}
