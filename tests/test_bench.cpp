// fg-bench's arithmetic and output: statistics, the limit model, the JSON
// schema, and --compare's word on MPI.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "harness.hpp"
#include "host.hpp"
#include "limits.hpp"
#include "report.hpp"
#include "stats.hpp"

using namespace fastgather::bench;

TEST(Stats, MedianPercentilesAndMeans) {
  Stats s = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.avg, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(summarize({1, 2, 3, 10}).median, 2.5);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_DOUBLE_EQ(summarize(hundred).p99, 99);  // nearest rank: ceil(0.99*100) = 99th value
  hundred.push_back(1000);
  EXPECT_DOUBLE_EQ(summarize(hundred).p99, 100);  // ceil(0.99*101) = 100th value
  EXPECT_EQ(summarize({}).n, 0u);
}

TEST(Stats, SlowestRankPerIterationAndBandwidths) {
  auto v = slowest_per_iteration({{1, 5, 3}, {2, 4, 9}, {0, 6, 1}});
  EXPECT_EQ(v, (std::vector<double>{2, 6, 9}));
  // nccl-tests: 2 ranks x 96 KiB in 10 us: algbw = 196608 B / 10 us = 19.66 GB/s, busbw = half.
  EXPECT_NEAR(effective_gbs(98304, 256), 0.384, 1e-9);  // the original: 96 KB in 0.256 ms = 0.38 GB/s
  EXPECT_NEAR(algbw_gbs(98304, 2, 10), 19.6608, 1e-9);
  EXPECT_NEAR(busbw_gbs(98304, 2, 10), 9.8304, 1e-9);
  EXPECT_NEAR(busbw_gbs(1000, 4, 1), 3.0, 1e-12);  // 4 KB in 1 us = 4 GB/s, x 3/4
}

TEST(LimitModel, InterpolatesCopiesAndAddsTheTerms) {
  Limits l;
  l.rtt_ns = 200;
  l.local = {{1024, 1.0}, {4096, 4.0}, {16384, 8.0}};
  l.peer = {{1024, 2.0}, {4096, 8.0}, {16384, 16.0}};
  EXPECT_DOUBLE_EQ(copy_us(l.local, 1024), 1.0);
  EXPECT_DOUBLE_EQ(copy_us(l.local, 512), 0.5);            // below: proportional
  EXPECT_NEAR(copy_us(l.local, 2048), 2.0, 1e-9);          // log-log between 1 and 4 us
  EXPECT_NEAR(copy_us(l.local, 8192), std::sqrt(32.0), 1e-9);
  EXPECT_DOUBLE_EQ(copy_us(l.local, 32768), 16.0);         // above: proportional to the last point
  EXPECT_DOUBLE_EQ(copy_us(l.local, 0), 0.0);
  // rtt/2 + (n-1) * peer + local
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 2), 0.1 + 8.0 + 4.0, 1e-9);
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 4), 0.1 + 3 * 8.0 + 4.0, 1e-9);
  // Two members with both CPUs measured at once: rtt/2 + that; more members: as before.
  l.both = {{1024, 5.0}, {4096, 15.0}};
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 2), 0.1 + 15.0, 1e-9);
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 4), 0.1 + 3 * 8.0 + 4.0, 1e-9);
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 4, 2), 0.1 + 15.0, 1e-9);  // two of them on this server
}

TEST(LimitModel, MeasuredFiguresAreSane) {
  Limits l = measure_limits({4096, 65536}, 0, 1);
  EXPECT_EQ(l.error, "");
  ASSERT_EQ(l.local.size(), 2u);
  ASSERT_EQ(l.peer.size(), 2u);
  EXPECT_GT(l.rtt_ns, 1);
  EXPECT_LT(l.rtt_ns, 1e6);
  for (const auto& p : l.local) EXPECT_GT(p.us, 0);
  for (const auto& p : l.peer) EXPECT_GT(p.us, 0);
  ASSERT_EQ(l.both.size(), 2u);
  for (const auto& p : l.both) EXPECT_GT(p.us, 0);
  EXPECT_GT(l.local[1].us, l.local[0].us);  // 16x the bytes take longer
  EXPECT_GT(l.both[1].us, l.both[0].us);
}

namespace {
Row sample_row() {
  Row r;
  r.op = "all_gather";
  r.impl = "fastgather";
  r.m = 8;
  r.bytes_per_rank = 98304;
  r.world = r.group_size = 2;
  r.iters = 10;
  r.lat = summarize({8, 9, 10});
  r.check = "ok";
  r.limit_us = 4;
  r.pct_of_limit = 50;
  return r;
}
}  // namespace

TEST(Json, RowsCarryTheSchemaFields) {
  nlohmann::json j = report_json({{"tp", 1}}, {sample_row()});
  EXPECT_EQ(validate_report_json(j), "");
  EXPECT_EQ(j["rows"][0]["median_us"], 9.0);
  for (const char* field : {"avg_us", "busbw_gbs", "check", "impl", "limit_us", "uneven_placement_pct"}) {
    nlohmann::json broken = j;
    broken["rows"][0].erase(field);
    EXPECT_NE(validate_report_json(broken), "") << field;
  }
  nlohmann::json bad_op = j;
  bad_op["rows"][0]["op"] = "allreduce";
  EXPECT_NE(validate_report_json(bad_op), "");
  nlohmann::json bad_schema = j;
  bad_schema["schema"] = "other/1";
  EXPECT_NE(validate_report_json(bad_schema), "");
}

// Evenly placed: no CPU holds more of its host's ranks than ceil(ranks on
// the host / its cores); hosts are told apart by their boot id.
TEST(Placement, NoCpuHoldsMoreThanItsShareOfTheHostsRanks) {
  auto at = [](uint32_t host, int cores, int cpu) { return Place{host, cores, cpu}; };
  EXPECT_TRUE(evenly_placed({at(1, 2, 0), at(1, 2, 1), at(1, 2, 1), at(1, 2, 0)}));
  EXPECT_FALSE(evenly_placed({at(1, 2, 0), at(1, 2, 0), at(1, 2, 1), at(1, 2, 0)}));  // 3 + 1
  EXPECT_FALSE(evenly_placed({at(1, 2, 1), at(1, 2, 1)}));                            // 2 ranks, 2 cores, one CPU
  EXPECT_TRUE(evenly_placed({at(1, 2, 0), at(1, 2, 1), at(1, 2, 1)}));                // 3 on 2 cores: 2 + 1
  EXPECT_TRUE(evenly_placed({at(1, 2, 0), at(1, 2, 1), at(2, 2, 0), at(2, 2, 1)}));   // CPU 0 of two hosts
  EXPECT_FALSE(evenly_placed({at(1, 2, 0), at(1, 2, 0), at(2, 2, 0), at(2, 2, 1)}));
  EXPECT_TRUE(evenly_placed({at(1, 2, -1), at(1, 2, -1)}));  // not known: not counted against anyone
  for (const Place& p : {at(0xfffff, 4095, 4094), at(0, 1, -1), at(12345, 2, 1)}) {
    const Place q = decode(encode(p));
    EXPECT_EQ(q.host, p.host);
    EXPECT_EQ(q.cores, p.cores);
    EXPECT_EQ(q.cpu, p.cpu);
  }
  const Place here = place_now();
  EXPECT_GE(here.cpu, 0);
  EXPECT_GE(here.cores, 1);
  EXPECT_EQ(here.host, place_now().host);
}

TEST(Report, PlacementListsOnlyRowsWithUnevenIterations) {
  Row even = sample_row();
  Row uneven = sample_row();
  uneven.impl = "mpi";
  uneven.uneven_pct = 40;
  uneven.median_uneven_us = 20;
  uneven.median_even_us = 9;
  EXPECT_EQ(format_placement({even}), "");
  const std::string t = format_placement({even, uneven});
  EXPECT_NE(t.find("| all_gather | mpi | 96 KB | 9.0 | 40.0% | 20.0 | 9.0 |"), std::string::npos) << t;
  EXPECT_EQ(t.find("| fastgather |"), std::string::npos) << t;
}

TEST(Report, VerdictComparesSameBytesByMedian) {
  Row ag = sample_row();
  Row fused = sample_row();
  fused.op = "all_gather_matmul";
  fused.m = 16;
  fused.lat = summarize({20, 21, 22});
  // Verdicts point into the rows they were given: keep them alive.
  const std::vector<Row> ags = {ag};
  std::vector<Row> fuseds = {fused};
  auto v = verdicts(ags, fuseds);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_TRUE(v[0].at_least_as_fast());
  EXPECT_NE(format_verdicts(v).find("96 KB per rank: all_gather 9.0 us vs all_gather_matmul 21.0 us -> yes"), std::string::npos)
      << format_verdicts(v);
  fuseds[0].lat = summarize({1, 2, 3});
  EXPECT_FALSE(verdicts(ags, fuseds)[0].at_least_as_fast());
  EXPECT_EQ(human_bytes(98304), "96 KB");
  EXPECT_EQ(human_bytes(1536 * 1024), "1.5 MB");
}

namespace {
// Runs a fg-bench binary; returns its exit status and fills *out.
int run_bench(const std::string& exe, const std::string& args, std::string* out) {
  const std::string cmd = fmt::format("{} {} 2>&1", exe, args);
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  return ::pclose(p);
}
}  // namespace

TEST(FgBench, CompareWithoutMpiSaysSoAndWritesValidJson) {
  const std::string json = fmt::format("/tmp/fg-bench-test-{}.json", ::getpid());
  std::string out;
  int rc = run_bench(FG_BENCH_NOMPI, fmt::format("--compare --m 8,9 --hidden 64 --time-ms 5 -c --port {} --json {}",
                                                  fgtest::free_port(), json), &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("MPI comparator: absent - fg-bench was built without MPI"), std::string::npos) << out;
  EXPECT_NE(out.find("### all_gather_list: median latency (us) by implementation"), std::string::npos) << out;
  // A verdict per size (which way it goes is a measurement, not a test: under
  // load the 2 KB rows can go either way).
  EXPECT_TRUE(out.find("-> yes") != std::string::npos || out.find("-> NO") != std::string::npos) << out;
  std::ifstream f(json);
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(validate_report_json(j), "");
  std::set<std::string> impls;
  for (const auto& r : j["rows"]) {
    impls.insert(r["impl"].get<std::string>());
    EXPECT_EQ(r["check"], "ok") << r.dump();
    EXPECT_GT(r["limit_us"].get<double>(), 0) << r.dump();
  }
  EXPECT_EQ(impls, (std::set<std::string>{"fastgather", "private", "staged", "unfused"}));
  std::remove(json.c_str());
}

// Two ranks held on one CPU (taskset) are never evenly placed: a timed run
// waits three measured times for the kernel to spread them after each
// case's warm-up and before each trial, then measures, and its rows say
// that every iteration was unevenly placed, with the median there.
TEST(FgBench, RanksHeldOnOneCpuAreReportedUnevenlyPlaced) {
  if (std::system("command -v taskset >/dev/null 2>&1") != 0) GTEST_SKIP() << "no taskset";
  const std::string json = fmt::format("/tmp/fg-bench-test-placement-{}.json", ::getpid());
  std::string out;
  int rc = run_bench("taskset -c 0 " + std::string(FG_BENCH_NOMPI),
                     fmt::format("--ops all_gather --m 1 --hidden 64 --time-ms 40 --no-limits --port {} --json {}",
                                 fgtest::free_port(), json),
                     &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("### Placement: rows with iterations whose ranks were unevenly placed"), std::string::npos) << out;
  std::ifstream f(json);
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(validate_report_json(j), "");
  ASSERT_FALSE(j["rows"].empty());
  for (const auto& r : j["rows"]) {
    EXPECT_EQ(r["uneven_placement_pct"].get<double>(), 100.0) << r.dump();
    EXPECT_GT(r["median_uneven_us"].get<double>(), 0) << r.dump();
    EXPECT_EQ(r["median_even_us"].get<double>(), 0) << r.dump();
    EXPECT_GE(r["settle_ms"].get<double>(), 2 * 3 * 40.0) << r.dump();  // warm-up and trial waited for an even placement, in vain
  }
  std::remove(json.c_str());
}

// --rewrite-inputs stores to every line of each sum's input before the call
// and keeps its values: checked sums of 4 ranks stay exact, heap and private.
TEST(FgBench, SumsWithInputsRewrittenStayExact) {
  const std::string json = fmt::format("/tmp/fg-bench-test-sums-{}.json", ::getpid());
  std::string out;
  int rc = run_bench(FG_BENCH_NOMPI, fmt::format("--dp 4 --compare -c --rewrite-inputs --ops all_reduce,reduce_scatter "
                                                  "--m 1,9 --hidden 64 --time-ms 5 --no-limits --port {} --json {}",
                                                  fgtest::free_port(), json), &out);
  EXPECT_EQ(rc, 0) << out;
  std::ifstream f(json);
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(validate_report_json(j), "");
  EXPECT_EQ(j["config"]["rewrite_inputs"], true);
  std::set<std::string> seen;
  for (const auto& r : j["rows"]) {
    seen.insert(r["op"].get<std::string>() + "/" + r["impl"].get<std::string>());
    EXPECT_EQ(r["check"], "ok") << r.dump();
  }
  EXPECT_EQ(seen, (std::set<std::string>{"all_reduce/fastgather", "all_reduce/private", "reduce_scatter/fastgather",
                                         "reduce_scatter/private"}));
  std::remove(json.c_str());
}

// The other reductions, every value checked (min and max exactly, the
// average within its rounding), at 3 ranks (an average that does not divide).
TEST(FgBench, MinMaxAndAverageChecked) {
  for (const char* op : {"min", "max", "avg"}) {
    const std::string json = fmt::format("/tmp/fg-bench-test-{}-{}.json", op, ::getpid());
    std::string out;
    int rc = run_bench(FG_BENCH_NOMPI, fmt::format("--dp 3 -c --reduce-op {} --ops all_reduce,reduce_scatter --m 1,9 "
                                                    "--hidden 96 --time-ms 5 --no-limits --port {} --json {}",
                                                    op, fgtest::free_port(), json),
                       &out);
    EXPECT_EQ(rc, 0) << out;
    std::ifstream f(json);
    nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j["config"]["reduce_op"], op);
    EXPECT_EQ(j["rows"].size(), 4u) << j.dump();
    for (const auto& r : j["rows"]) EXPECT_EQ(r["check"], "ok") << op << ": " << r.dump();
    EXPECT_NE(out.find(fmt::format("AllReduce, {} (fp32", op)), std::string::npos) << out;
    std::remove(json.c_str());
  }
}

TEST(FgBench, SixRanksTpThreeDpTwoChecked) {
  std::string out;
  int rc = run_bench(FG_BENCH, fmt::format("-c --tp 3 --dp 2 --m 1,8 --hidden 96 --time-ms 5 --no-limits --port {}",
                                           fgtest::free_port()), &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("6 ranks (TP=3 DP=2, groups of 2)"), std::string::npos) << out;
  EXPECT_EQ(out.find("failed"), std::string::npos) << out;
}

TEST(LimitModel, AcrossServersTheWireOrTheServerBounds) {
  Limits l;
  l.rtt_ns = 200;
  l.local = {{1024, 1.0}, {4096, 4.0}};
  l.peer = {{1024, 2.0}, {4096, 8.0}};
  l.wire = {{1024, 10.0}, {4096, 40.0}};
  // 4 ranks, 2 of them on other servers: one message (40 us) plus one more block
  // at the largest message's rate (40 us per 4096 bytes) beats the local part.
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 4, 2), 40.0 + 40.0, 1e-9);
  // No remote blocks: the shared-memory model alone.
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 2, 0), 0.1 + 8.0 + 4.0, 1e-9);
  // A slow server-local part wins over a fast wire.
  l.wire = {{4096, 1.0}};
  EXPECT_NEAR(all_gather_limit_us(l, 4096, 6, 1), 0.1 + 4 * 8.0 + 4.0, 1e-9);
}

namespace {
bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}
}  // namespace

// The README's two-server run on one host: each "server" starts fg-bench
// with its SERVER_INDEX, as on real servers; every byte checked.
TEST(FgBench, TwoServersStartedByHandChecked) {
  const int port = fgtest::free_port();
  const std::string env = fmt::format("SERVER_NUM=2 MASTER_IP=127.0.0.1 PORT={} TP=2 DP=2 FG_BIND=none", port);
  const std::string args = "-c --m 1,8 --hidden 96 --time-ms 5";
  const std::string other = fmt::format("/tmp/fg-bench-server1-{}.txt", ::getpid());
  const std::string cmd = fmt::format("env {} SERVER_INDEX=1 {} {} > {} 2>&1 & env {} SERVER_INDEX=0 {} {}; s=$?; wait; exit $s",
                                      env, FG_BENCH, args, other, env, FG_BENCH, args);
  std::string out;
  int rc = run_bench("sh -c", "'" + cmd + "'", &out);
  EXPECT_EQ(rc, 0) << out;
  std::ifstream f(other);
  std::string server1;
  // A busy machine may stall a rank for seconds: the stall report on stderr
  // is the one thing server 1 may say.
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("fastgather: still waiting after ", 0) != 0) server1 += line + "\n";
  }
  EXPECT_EQ(server1, "") << "server 1 prints nothing; its ranks report through rank 0";
  EXPECT_NE(out.find("2 servers (ranks 0-1 | 2-3)"), std::string::npos) << out;
  EXPECT_NE(out.find("UCX_TLS=tcp, UCX_NET_DEVICES=lo"), std::string::npos) << out;
  EXPECT_NE(out.find("Between servers"), std::string::npos) << out;
  // TP=2 groups hold one rank on each server: the one-shot between them.
  EXPECT_NE(out.find("inter-server (one-shot)"), std::string::npos) << out;
  EXPECT_NE(out.find("| ok |"), std::string::npos) << out;
  EXPECT_EQ(out.find("failed"), std::string::npos) << out;
  std::remove(other.c_str());
}

// One command simulating three servers under mpirun: MPI_Allgather over TCP
// beside fastgather, every byte of both checked.
TEST(FgBench, SimulatedServersBesideMpiOverTcp) {
  if (sanitized()) GTEST_SKIP() << "Open MPI under the sanitizers reports its own leaks";
  std::string out;
  int rc = run_bench(FG_BENCH, fmt::format("--compare -c --m 1,8 --hidden 96 --time-ms 5 --servers 3 --tp 1 --dp 4 --port {}",
                                           fgtest::free_port()), &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("3 servers (ranks 0-1 | 2-2 | 3-3)"), std::string::npos) << out;
  EXPECT_NE(out.find("btl tcp,self"), std::string::npos) << out;
  EXPECT_NE(out.find("| mpi |"), std::string::npos) << out;
  EXPECT_EQ(out.find("failed"), std::string::npos) << out;
}

// all_to_all beside MPI_Alltoall and send/recv (a ring shift) beside
// MPI_Sendrecv (where fg-bench was built with MPI), every byte of each
// checked: on one server (3 ranks: parts of an odd size) and across two
// simulated servers of two.
TEST(FgBench, AllToAllAndSendRecvBesideMpiChecked) {
  if (sanitized()) GTEST_SKIP() << "Open MPI under the sanitizers reports its own leaks";
  for (const char* layout : {"--dp 3", "--servers 2 --dp 4"}) {
    const std::string json = fmt::format("/tmp/fg-bench-test-a2a-{}.json", ::getpid());
    std::string out;
    int rc = run_bench(FG_BENCH, fmt::format("{} --compare -c --ops all_to_all,send_recv --m 1,9 --hidden 12 "
                                             "--time-ms 5 --no-limits --port {} --json {}", layout, fgtest::free_port(), json),
                       &out);
    EXPECT_EQ(rc, 0) << out;
    std::ifstream f(json);
    nlohmann::json j = nlohmann::json::parse(f);
    std::set<std::string> rows;
    for (const auto& r : j["rows"]) {
      EXPECT_EQ(r["check"], "ok") << layout << ": " << r.dump();
      rows.insert(r["op"].get<std::string>() + "/" + r["impl"].get<std::string>());
    }
    // A build without MPI (the mutation checks' own) has fastgather's rows alone.
    const bool mpi = j["config"]["mpi"] != "absent";
    std::set<std::string> expected = {"all_to_all/fastgather", "send_recv/fastgather"};
    if (mpi) expected.insert({"all_to_all/mpi", "send_recv/mpi"});
    EXPECT_EQ(rows, expected) << out;
    EXPECT_EQ(j["rows"].size(), mpi ? 8u : 4u) << j.dump();
    EXPECT_NE(out.find("### AllToAll (fp32, hidden 12"), std::string::npos) << out;
    EXPECT_NE(out.find("### send/recv (fp32, hidden 12"), std::string::npos) << out;
    EXPECT_NE(out.find("### all_to_all: median latency (us) by implementation"), std::string::npos) << out;
    EXPECT_NE(out.find("### send_recv: median latency (us) by implementation"), std::string::npos) << out;
    std::remove(json.c_str());
  }
}

// Bad flags and sizes are refused before anything is allocated or forked:
// exit status 2 (never a signal), naming the flag.
TEST(FgBench, BadFlagsAndSizesAreRefusedByName) {
  struct Bad {
    const char* args;
    const char* needle;
  };
  const Bad cases[] = {
      {"--m -1", "--m"},          {"--m 0", "--m"},           {"--hidden -5", "--hidden"},
      {"--hidden 0", "--hidden"}, {"--n -3", "--n"},          {"--n 0", "--n"},
      {"--iters 0", "--iters"},   {"--iters -1", "--iters"},  {"--time-ms 0", "--time-ms"},
      {"--time-ms -1", "--time-ms"}, {"--time-ms nan", "--time-ms"}, {"--trials 0", "--trials"},
      {"--warmup -1", "--warmup"}, {"--port 0", "--port"},     {"--tp 46341 --dp 46341", "--tp"},
      {"--m 1000000000", "available"}, {"--m 4000000 --hidden 100000", "available"},
      // Output files are checked before the run, not after it.
      {"--json /nonexistent/dir/x.json", "--json /nonexistent/dir/x.json: the folder /nonexistent/dir does not exist"},
      {"--plot /nonexistent/p.png", "--plot /nonexistent/p.png: the folder /nonexistent does not exist"},
      {"--json /tmp", "--json /tmp: is a folder"},
      {"--json /dev/full", "--json /dev/full: a test write failed (No space left on device)"},
      {"--master ''", "rendezvous host (MASTER_IP, --master) is empty"},
      {"MASTER_IP=", "MASTER_IP is set but empty"},
  };
  for (const Bad& b : cases) {
    std::string out;
    // A leading VAR= sets the environment of the run instead of a flag.
    const std::string a = b.args;
    const bool env = a.find('=') != std::string::npos && a.rfind("--", 0) != 0;
    int rc = env ? run_bench(a + " " + FG_BENCH_NOMPI, "--no-limits --no-compare", &out)
                 : run_bench(FG_BENCH_NOMPI, fmt::format("{} --no-limits --no-compare", a), &out);
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << b.args << " -> status " << rc << ": " << out;
    EXPECT_NE(out.find(b.needle), std::string::npos) << b.args << ": " << out;
  }
  std::string out;
  int rc = run_bench(FG_BENCH_NOMPI, fmt::format("--m 8 --hidden 64 --time-ms 5 --no-limits --port {}", fgtest::free_port()), &out);
  EXPECT_EQ(rc, 0) << "a valid run after the refusals: " << out.substr(0, 2000);
}

// A fused-op row too large for the shared-memory ring is skipped with the
// reason; the rows already measured and those after it are kept.
TEST(FgBench, ARowTooLargeForTheRingIsSkippedNotFatal) {
  std::string out;
  int rc = run_bench("FG_RING_BYTES=65536 " + std::string(FG_BENCH_NOMPI),
                     fmt::format("-c --m 1,2 --hidden 8192 --mm-dtype fp32 --time-ms 5 --no-limits --no-compare --port {}",
                                 fgtest::free_port()),
                     &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("skipped"), std::string::npos) << out;
  EXPECT_NE(out.find("exceeds"), std::string::npos) << out;
  EXPECT_NE(out.find("### AllGather (fp32, hidden 8192)"), std::string::npos) << out;
}

namespace {

// Processes whose parent is `pid`, from /proc.
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == pid) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

}  // namespace

// The /dev/shm files a process has mapped.
std::set<std::string> shm_files_of(pid_t pid) {
  std::set<std::string> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(f, line)) {
    const size_t at = line.find("/dev/shm/");
    if (at != std::string::npos) out.insert(line.substr(at, line.find(" (deleted)") == std::string::npos ? std::string::npos
                                                                                                       : line.find(" (deleted)") - at));
  }
  return out;
}

// Every process below pid (its children, theirs, ...).
std::vector<pid_t> descendants_of(pid_t pid) {
  std::vector<pid_t> out;
  for (pid_t c : children_of(pid)) {
    out.push_back(c);
    for (pid_t d : descendants_of(c)) out.push_back(d);
  }
  return out;
}

// fg-bench's spawner SIGKILLed in the middle of a run: every rank (and every
// simulated server's spawner) is gone within moments (the issue asks 100 ms;
// measured 5-15 ms, the bound here leaves room for a busy machine), and no
// segment of the job is left in /dev/shm.
TEST(FgBench, ItsSpawnerKilledItsRanksDieAtOnceAndLeaveNoSegment) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  for (const char* servers : {"1", "2"}) {
    const std::string port = std::to_string(fgtest::free_port());
    std::fflush(nullptr);
    pid_t top = ::fork();
    if (top == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(FG_BENCH_NOMPI, FG_BENCH_NOMPI, "--servers", servers, "--dp", "4", "--m", "64", "--hidden", "1024",
              "--time-ms", "30000", "--no-compare", "--no-limits", "--port", port.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Until every rank runs and has mapped its group's segment.
    std::vector<pid_t> below;
    std::set<std::string> files;
    const auto ready_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < ready_by) {
      below = descendants_of(top);
      files.clear();
      size_t mapped = 0;
      for (pid_t p : below) {
        auto f = shm_files_of(p);
        mapped += f.empty() ? 0 : 1;
        files.insert(f.begin(), f.end());
      }
      if (mapped >= 4) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_FALSE(files.empty()) << "no rank mapped a segment within 20 s (servers " << servers << ")";
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(top, SIGKILL);
    const bool gone = fgtest::reap_all_children(std::chrono::seconds(10), std::chrono::milliseconds(1));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(gone) << "processes left 10 s after killing the spawner (servers " << servers << ")";
    EXPECT_LT(ms, 1000) << "the ranks outlived their spawner by " << ms << " ms (servers " << servers << ")";
    std::printf("servers %s: %zu processes gone %.1f ms after the spawner's SIGKILL\n", servers, below.size(), ms);
    // Segments are unlinked once every member has mapped them; none of the
    // job's (named fg-<job>-...) may be left, mapped or not.
    std::set<std::string> jobs;
    for (const std::string& f : files) {
      const std::string name = f.substr(std::string("/dev/shm/").size());
      jobs.insert(name.substr(0, name.find('-', 3) + 1));
    }
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      const std::string name = e.path().filename().string();
      for (const std::string& job : jobs) EXPECT_NE(name.rfind(job, 0), 0u) << name << " left behind (servers " << servers << ")";
    }
    if (!gone) {
      for (pid_t c : children_of(::getpid())) ::kill(c, SIGKILL);
      while (::waitpid(-1, nullptr, 0) > 0) {
      }
    }
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// fg-bench killed at any point of its limits measurement - its top process,
// or its ranks (the measuring rank's helper then loses its parent) - leaves
// no process behind: everything it started has ended within a few seconds.
// (Before: a helper reparented to init spun at 100% of a core for as long
// as anyone looked, 25 minutes and more.) This process is the subreaper, so
// whatever is orphaned comes to it; no child left means nothing left.
TEST(FgBench, KilledDuringItsLimitsMeasurementItLeavesNoProcess) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  for (int delay_ms : {150, 400, 800, 1500}) {
    for (bool ranks : {false, true}) {
      const int port = fgtest::free_port();
      std::fflush(nullptr);
      pid_t top = ::fork();
      if (top == 0) {
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, 1);
        ::dup2(null, 2);
        const std::string p = std::to_string(port);
        ::execl(FG_BENCH_NOMPI, FG_BENCH_NOMPI, "--m", "8,4096", "--hidden", "3072", "--time-ms", "2000",
                "--no-compare", "--port", p.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      if (ranks) {
        for (pid_t r : children_of(top)) ::kill(r, SIGKILL);
      } else {
        ::kill(top, SIGKILL);
      }
      const bool none = fgtest::reap_all_children(std::chrono::seconds(10), std::chrono::milliseconds(20));
      EXPECT_TRUE(none) << "processes left 10 s after killing " << (ranks ? "the ranks" : "fg-bench") << " at "
                        << delay_ms << " ms";
      if (!none) {
        for (pid_t c : children_of(::getpid())) ::kill(c, SIGKILL);
        while (::waitpid(-1, nullptr, 0) > 0) {
        }
        break;  // one leak says it; each further one would wait its 10 s
      }
    }
    if (HasFailure()) break;
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}
