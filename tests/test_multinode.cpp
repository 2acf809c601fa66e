// Groups across servers, simulated on this host: each rank is told its server
// (consecutive blocks of ranks), members on one server share memory, and
// everything between servers goes over UCX on TCP loopback (the
// communicator sees every server on this host and keeps UCX to tcp on lo).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "transport/net_channel.hpp"

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;
using fgtest::gather_bytes;

namespace {

// Both forms of all-gather of `bytes` per rank on g with `algo`, every byte checked.
// With `symmetric`, the input comes from the group's heap (Group::empty):
// read in place by the members on this server, sent over UCX to the others.
std::string both_forms(Group& g, size_t bytes, Schedule algo, uint64_t it, bool symmetric = false) {
  const int n = g.size();
  const auto count = static_cast<int64_t>(bytes);
  Tensor in = Tensor::empty(DType::kU8, {count});
  if (symmetric) {
    auto t = g.empty(DType::kU8, {count});
    RANK_OK(t.status());
    in = std::move(t).value();
  }
  fill_pattern(in.data(), bytes, g.ranks()[g.rank()], it);
  Tensor out = Tensor::empty(DType::kU8, {n * count});
  AllGatherOptions opt{.schedule = algo};
  RANK_OK(all_gather(g, in.view(), out.view(), opt));
  for (int i = 0; i < n; ++i) {
    long long bad = check_pattern(out.data_as<char>() + static_cast<size_t>(i) * bytes, bytes, g.ranks()[i], it);
    RANK_CHECK(bad < 0, "{} contiguous, {} bytes: block of rank {} wrong at byte {}", g.describe(), bytes, g.ranks()[i], bad);
  }
  std::vector<Tensor> outs;
  std::vector<TensorView> views;
  for (int i = 0; i < n; ++i) {
    outs.push_back(Tensor::empty(DType::kU8, {count}));
    views.push_back(outs.back().view());
  }
  RANK_OK(all_gather(g, in.view(), std::span<const TensorView>(views), opt));
  for (int i = 0; i < n; ++i) {
    long long bad = check_pattern(outs[i].data(), bytes, g.ranks()[i], it + 0);
    RANK_CHECK(bad < 0, "{} list, {} bytes: buffer of rank {} wrong at byte {}", g.describe(), bytes, g.ranks()[i], bad);
  }
  return "";
}

struct Layout {
  int servers, tp, dp;
};

std::string layout_name(const Layout& l) { return fmt::format("servers{}_tp{}_dp{}", l.servers, l.tp, l.dp); }

}  // namespace

class AcrossServers : public ::testing::TestWithParam<Layout> {};

// Every schedule, both forms, sizes from nothing to several pieces, in the
// TP x DP group and in the world group, private and symmetric inputs.
TEST_P(AcrossServers, BothFormsEverySchedule) {
  const Layout l = GetParam();
  fgtest::JobOptions jo;
  jo.servers = l.servers;
  jo.timeout = std::chrono::milliseconds(20000);
  auto results = fgtest::run_job(l.tp * l.dp, [&](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    // All "servers" are this host: UCX must be kept to TCP on loopback.
    RANK_CHECK((*comm)->transport().find("UCX_TLS=tcp, UCX_NET_DEVICES=lo") != std::string::npos, "{}",
               (*comm)->transport());
    auto sub = (*comm)->tp_group_of_dp(l.tp, l.dp);
    RANK_OK(sub.status());
    uint64_t it = 0;
    for (Group* g : {sub.value(), &(*comm)->world()}) {
      for (auto algo : {Schedule::kAuto, Schedule::kDirect, Schedule::kHierarchical}) {
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{33}, size_t{4097}, size_t{96} << 10, (size_t{1} << 20) + 3,
                             size_t{3} << 20}) {
          // Every other call's input is in the group's symmetric heap (members on one
          // server read it in place; on a server alone a member has no heap).
          ++it;
          if (auto e = both_forms(*g, bytes, algo, it, it % 2 == 0); !e.empty()) return e;
        }
      }
      RANK_OK(barrier(*g));
    }
    return "";
  }, jo);
  fgtest::expect_all_ok(results);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AcrossServers,
                         ::testing::Values(Layout{2, 2, 2}, Layout{2, 1, 4}, Layout{3, 2, 2}, Layout{3, 1, 4},
                                           Layout{3, 2, 3}, Layout{2, 1, 2}, Layout{2, 1, 5}, Layout{2, 1, 6}, Layout{2, 1, 8},
                                           Layout{3, 1, 7}),
                         [](const auto& info) { return layout_name(info.param); });

// One rank on each server: the schedules written for one server (one-shot,
// ring; the sums' in test_reduce.cpp) run between the servers over the steps
// of transport/net_steps.hpp, every byte checked, in both forms and as
// broadcast; the steps are rank 0's size whatever the others' settings say;
// ranks that disagree are all told in the same step, and the group stays usable.
TEST(OneRankEachServer, TheSchedulesOfOneServerRunBetweenServers) {
  for (int servers : {2, 3}) {
    fgtest::JobOptions jo;
    jo.servers = servers;
    jo.timeout = std::chrono::milliseconds(20000);
    auto results = fgtest::run_job(servers, [&](const Config& given) -> std::string {
      Config c = given;
      Settings st = c.settings.value_or(Settings{});
      // Rank 0's steps are 64 KiB, everyone else would cut 1 MiB ones.
      if (c.rank == 0) st.net_piece_bytes = 64 << 10;
      c.settings = st;
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      Group& g = (*comm)->world();
      uint64_t it = 0;
      for (auto algo : {Schedule::kAuto, Schedule::kOneShot, Schedule::kRing}) {
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{33}, size_t{4097}, size_t{96} << 10, (size_t{1} << 20) + 3}) {
          ++it;
          if (auto e = both_forms(g, bytes, algo, it); !e.empty()) return e;
          CallStats stats;
          Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
          Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * servers});
          RANK_OK(all_gather(g, in.view(), out.view(), {.schedule = algo, .stats = &stats}));
          const Schedule want = algo == Schedule::kRing && servers > 2 ? Schedule::kRing : Schedule::kOneShot;
          RANK_CHECK(stats.schedule == want, "{} bytes asked {}: ran {}", bytes, to_string(algo), to_string(stats.schedule));
          RANK_CHECK(bytes < (size_t{96} << 10) || stats.piece_bytes == (size_t{64} << 10), "{} bytes in steps of {}, not rank 0's 64 KiB",
                     bytes, stats.piece_bytes);
        }
      }
      for (size_t bytes : {size_t{5}, size_t{200} << 10}) {
        ++it;
        Tensor b = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
        fill_pattern(b.data(), bytes, c.rank == 1 ? 1 : 77, it);
        RANK_OK(broadcast(g, b.view(), 1));
        long long bad = check_pattern(b.data(), bytes, 1, it);
        RANK_CHECK(bad < 0, "broadcast of {} bytes wrong at byte {}", bytes, bad);
      }
      // The last rank disagrees on the size: every rank names both sizes and
      // the disagreeing rank, and the next call runs right.
      Status s = gather_bytes(g, c.rank == servers - 1 ? 200 : 100);
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("100 bytes") != std::string::npos &&
                     s.message().find("200 bytes") != std::string::npos &&
                     s.message().find(fmt::format("rank {}", servers - 1)) != std::string::npos,
                 "got {}", s.to_string());
      if (auto e = both_forms(g, 70000, Schedule::kAuto, ++it); !e.empty()) return e;
      return "";
    }, jo);
    fgtest::expect_all_ok(results);
  }
}

// Many calls back to back, sizes from one byte to several steps, the same
// buffers each time: every byte of every call right (a step read from a
// buffer still holding another step's bytes would show), and no memory grows.
TEST(OneRankEachServer, ThousandsOfCallsOfMixedSizesEveryByte) {
  fgtest::JobOptions jo;
  jo.servers = 2;
  jo.timeout = std::chrono::milliseconds(20000);
  auto results = fgtest::run_job(2, [&](const Config& given) -> std::string {
    Config c = given;
    Settings st = c.settings.value_or(Settings{});
    st.net_piece_bytes = 16 << 10;  // several steps from 16 KiB on
    c.settings = st;
    const double before = fgtest::rss_bytes();
    if (auto e = fgtest::gather_mixed_sizes(c, 1, 2, {1, 4097, 70000, (size_t{1} << 18) + 5, 33}, 2000); !e.empty()) return e;
    const double grown = fgtest::rss_bytes() - before;
    RANK_CHECK(grown < 64.0 * (1 << 20), "resident memory grew by {:.0f} MiB over 2000 calls", grown / (1 << 20));
    return "";
  }, jo);
  fgtest::expect_all_ok(results);
}

using Clock = std::chrono::steady_clock;

// A rank on another server disagreeing on the size: every member reports the
// mismatch with both sizes; nobody hangs, and the group stays failed
// (messages of the failed call may still be in flight, so it is not reused).
TEST(AcrossServersFaults, MismatchIsNamedAndTheGroupStaysFailed) {
  for (size_t big : {size_t{16}, size_t{98304}}) {
    fgtest::JobOptions jo;
    jo.servers = 2;
    auto results = fgtest::run_job(4, [&](const Config& c) -> std::string {
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      Group& g = (*comm)->world();
      Status s = gather_bytes(g, c.rank == 3 ? big * 2 : big);
      // Whoever saw the disagreement names it; whoever only lost a peer over
      // it reads the reason that peer published before it left.
      RANK_CHECK(s.kind() == ErrorKind::kMismatch, "got {}", s.to_string());
      RANK_CHECK(s.message().find(fmt::format("{} bytes", big)) != std::string::npos &&
                     s.message().find(fmt::format("{} bytes", 2 * big)) != std::string::npos &&
                     s.message().find("rank 3") != std::string::npos,
                 "should name rank 3 and both sizes: {}", s.message());
      Status again = gather_bytes(g, big);
      RANK_CHECK(!again.ok(), "a failed group across servers must stay failed");
      return "";
    }, jo);
    fgtest::expect_all_ok(results);
  }
}

// A whole server dies mid-run (its ranks SIGKILLed): the other server's ranks
// get an error naming a lost rank well within the timeout, exit cleanly, and
// leave nothing in /dev/shm.
TEST(AcrossServersFaults, ServerDeathIsAnErrorOnTheOthers) {
  for (int tp : {1, 2}) {
    fgtest::JobOptions jo;
    jo.servers = 2;
    jo.timeout = std::chrono::milliseconds(5000);
    jo.hang_limit = std::chrono::seconds(60);
    auto results = fgtest::run_job(4, [&](const Config& c) -> std::string {
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      auto sub = (*comm)->tp_group_of_dp(tp, 4 / tp);
      RANK_OK(sub.status());
      Group& g = *sub.value();
      auto last_ok = Clock::now();
      for (int it = 0;; ++it) {
        if (c.server_index == 1 && it == 200) ::raise(SIGKILL);
        Status s = gather_bytes(g, it % 2 == 0 ? 64 : 256 << 10);
        if (s.ok()) {
          last_ok = Clock::now();
          RANK_CHECK(it < 100000, "the dead server was never noticed");
          continue;
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - last_ok).count();
        RANK_CHECK(s.kind() == ErrorKind::kPeerLost || s.kind() == ErrorKind::kTimeout, "got {}", s.to_string());
        RANK_CHECK(ms < 5000 + 1000, "noticed after {:.0f} ms: {}", ms, s.to_string());
        std::fprintf(stderr, "rank %d (tp %d): %s after %.1f ms\n", c.rank, tp, s.to_string().c_str(), ms);
        return "";
      }
    }, jo);
    for (int r = 0; r < 4; ++r) {
      if (r < 2) {
        EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].error;
      } else {
        EXPECT_EQ(results[r].signal, SIGKILL) << "rank " << r;
      }
    }
    EXPECT_TRUE(fgtest::segments_of(results).empty());
  }
}

// A server that never starts: the others fail creation with a timeout (or,
// once the store's host has given up and gone, with its loss).
TEST(AcrossServersFaults, MissingServerTimesOut) {
  fgtest::JobOptions jo;
  jo.servers = 2;
  jo.timeout = std::chrono::milliseconds(1000);
  auto results = fgtest::run_job(4, [&](const Config& c) -> std::string {
    if (c.server_index == 1) return "";  // never shows up
    auto t0 = Clock::now();
    auto comm = Communicator::create(c);
    RANK_CHECK(!comm.ok() && (comm.status().kind() == ErrorKind::kTimeout ||
                              (c.rank != 0 && comm.status().kind() == ErrorKind::kPeerLost)),
               "got {}", comm.status().to_string());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    RANK_CHECK(ms < 3000, "took {:.0f} ms", ms);
    return "";
  }, jo);
  fgtest::expect_all_ok(results);
}

// Different groups may be driven from different threads at once (the API's
// promise): each group across servers has its own UCX worker. Each rank runs
// the world group in one thread and its TP group in another.
TEST(AcrossServers, TwoGroupsDrivenFromTwoThreadsAtOnce) {
  for (int servers : {1, 2}) {
    fgtest::JobOptions jo;
    jo.servers = servers;
    jo.timeout = std::chrono::milliseconds(20000);
    auto results = fgtest::run_job(4, [&](const Config& c) -> std::string {
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      auto sub = (*comm)->tp_group_of_dp(2, 2);
      RANK_OK(sub.status());
      std::string errors[2];
      auto drive = [&](Group* g, int which) {
        for (uint64_t it = 0; it < 150 && errors[which].empty(); ++it) {
          const size_t bytes = it % 3 == 0 ? 40000 : it % 3 == 1 ? 24 : 700000;
          errors[which] = both_forms(*g, bytes, Schedule::kAuto, it * 2 + which);
        }
      };
      std::thread other(drive, sub.value(), 1);
      drive(&(*comm)->world(), 0);
      other.join();
      return errors[0] + errors[1];
    }, jo);
    fgtest::expect_all_ok(results);
  }
}

// A job on one server never loads UCX: none of its libraries is mapped in a
// rank, before or after its communicator made a group and ran a call (so
// libucm's hooks, and the fork hazard they bring, stay out of the process:
// src/transport/ucx_api.hpp). A job across servers loads it in every rank.
TEST(Ucx, OnlyJobsAcrossServersLoadIt) {
  for (int servers : {1, 2}) {
    fgtest::JobOptions jo;
    jo.servers = servers;
    auto results = fgtest::run_job(2, [&](const Config& c) -> std::string {
      RANK_CHECK(!transport::ucx_mapped(), "UCX is mapped in a rank before its communicator");
      auto comm = Communicator::create(c);
      RANK_OK(comm.status());
      if (std::string e = both_forms((*comm)->world(), 4096, Schedule::kAuto, 1); !e.empty()) return e;
      const bool mapped = transport::ucx_mapped();
      RANK_CHECK(mapped == (servers > 1), "with {} server(s), UCX is {}mapped", servers, mapped ? "" : "not ");
      return "";
    }, jo);
    fgtest::expect_all_ok(results);
  }
}

// FG_UCX_LIBRARY naming what is not UCX - no such file, or a library without
// UCX's functions: every rank's Communicator::create fails at once with
// which library and why; no crash, no hang.
TEST(Ucx, ALibraryThatIsNotUcxFailsEveryRankWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/nonexistent/libucp.so.0", "FG_UCX_LIBRARY=/nonexistent/libucp.so.0 could not be loaded"},
      {"libm.so.6", "the library loaded as UCX (libm.so.6) has no ucp_"}};
  for (const auto& [lib, words] : cases) {
    fgtest::JobOptions jo;
    jo.servers = 2;
    auto results = fgtest::run_job(2, [&](const Config& c) -> std::string {
      ::setenv("FG_UCX_LIBRARY", lib.c_str(), 1);
      auto comm = Communicator::create(c);
      RANK_CHECK(!comm.ok(), "a communicator across servers was made with FG_UCX_LIBRARY={}", lib);
      RANK_CHECK(comm.status().message().find(words) != std::string::npos, "{:?} not in {}", words,
                 comm.status().to_string());
      return "";
    }, jo);
    fgtest::expect_all_ok(results);
  }
}

// Where TCP alone carries the bytes between servers (the user chose it, or
// the servers are simulated on one host), the library asks UCX for eager
// sends and 256 KiB TCP segments (2-3.5x faster than UCX's defaults between
// two hosts: docs/multinode.md), each unless the user set it; where the user
// chose other transports it leaves UCX's defaults. Each case in a rank of its
// own: the segments are set in the process's environment.
TEST(Ucx, OverTcpAloneEagerSendsInLargeSegmentsUnlessTheUserSetThem) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> env;
    bool loopback;
    const char* tx;  // UCX_TCP_TX_SEG_SIZE after the context is made (nullptr: unset)
    const char* rx;
    bool eager;      // UCX_RNDV_THRESH=inf asked by the library
  };
  const std::vector<Case> cases = {
      {{{"UCX_TLS", "tcp"}}, false, "256k", "256k", true},
      {{}, true, "256k", "256k", true},
      {{{"UCX_TLS", "tcp"}, {"UCX_TCP_TX_SEG_SIZE", "64k"}}, false, "64k", nullptr, true},
      {{{"UCX_TLS", "tcp"}, {"UCX_RNDV_THRESH", "8k"}}, false, "256k", "256k", false},
      {{{"UCX_TLS", "shm"}}, false, nullptr, nullptr, false},
  };
  for (const Case& k : cases) {
    auto results = fgtest::run_job(1, [&](const Config&) -> std::string {
      for (const char* v : {"UCX_TLS", "UCX_NET_DEVICES", "UCX_RNDV_THRESH", "UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"}) {
        ::unsetenv(v);
      }
      std::string said;
      for (const auto& [name, value] : k.env) {
        ::setenv(name, value, 1);
        said += fmt::format("{}={} ", name, value);
      }
      auto context = transport::UcxContext::create({.loopback = k.loopback});
      RANK_OK(context.status());
      const std::string& describe = (*context)->describe();
      for (const auto& [name, want] : {std::pair{"UCX_TCP_TX_SEG_SIZE", k.tx}, std::pair{"UCX_TCP_RX_SEG_SIZE", k.rx}}) {
        const char* got = std::getenv(name);
        RANK_CHECK((got == nullptr) == (want == nullptr) && (got == nullptr || std::string(got) == want),
                   "{}loopback {}: {} is {}, not {}", said, k.loopback, name, got ? got : "unset", want ? want : "unset");
      }
      const bool eager = describe.find("UCX_RNDV_THRESH=inf") != std::string::npos;
      RANK_CHECK(eager == k.eager, "{}loopback {}: {}", said, k.loopback, describe);
      if (k.tx != nullptr) {
        RANK_CHECK(describe.find(std::string("SEG_SIZE=") + k.tx) != std::string::npos, "{}: {}", said, describe);
      }
      return "";
    });
    fgtest::expect_all_ok(results);
  }
}
