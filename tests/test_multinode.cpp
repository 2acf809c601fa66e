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

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;

namespace {

// Both forms of all-gather of `bytes` per rank on g with `algo`, every byte checked.
std::string both_forms(Group& g, size_t bytes, AllGatherAlgorithm algo, uint64_t it) {
  const int n = g.size();
  const auto count = static_cast<int64_t>(bytes);
  Tensor in = Tensor::empty(DType::kU8, {count});
  fill_pattern(in.data(), bytes, g.ranks()[g.rank()], it);
  Tensor out = Tensor::empty(DType::kU8, {n * count});
  AllGatherOptions opt{.algorithm = algo};
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
// TP x DP group and in the world group.
TEST_P(AcrossServers, BothFormsEverySchedule) {
  const Layout l = GetParam();
  fgtest::JobOptions jo;
  jo.servers = l.servers;
  jo.timeout = std::chrono::milliseconds(20000);
  auto results = fgtest::run_job(l.tp * l.dp, [&](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto sub = (*comm)->tp_group_of_dp(l.tp, l.dp);
    RANK_OK(sub.status());
    uint64_t it = 0;
    for (Group* g : {sub.value(), &(*comm)->world()}) {
      for (auto algo : {AllGatherAlgorithm::kAuto, AllGatherAlgorithm::kDirect, AllGatherAlgorithm::kHierarchical}) {
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{33}, size_t{4097}, size_t{96} << 10, (size_t{1} << 20) + 3,
                             size_t{3} << 20}) {
          if (auto e = both_forms(*g, bytes, algo, ++it); !e.empty()) return e;
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
                                           Layout{3, 2, 3}),
                         [](const auto& info) { return layout_name(info.param); });
