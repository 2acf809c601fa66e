// all_gather with uneven blocks: the v form (counts) and the list form with
// outputs of different sizes, every byte checked, empty blocks among them,
// one-shot and ring, ordinary memory and the heap, ranks outnumbering cores,
// across servers;
// members that disagree on the sizes get a mismatch; bad counts are refused.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;

namespace {

// Elements of group rank r's block in layout `k`: zeros, tiny, around the
// inline and step sizes, and one block much larger than the others.
int64_t count_of(int k, int r) {
  static const std::vector<std::vector<int64_t>> kLayouts = {
      {0, 1, 0, 5, 2},          {7, 0, 9, 8, 1},
      {1000, 33, 4099, 0, 17},  {70001, 5, 1, 300000, 64},
      {0, 0, 0, 0, 0},          {16384, 16384, 16383, 16385, 1},
  };
  return kLayouts[static_cast<size_t>(k)][static_cast<size_t>(r % 5)] + (r >= 5 ? r : 0);
}

std::string uneven(const Config& c, bool from_heap, Schedule schedule) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int n = g.size();
  uint64_t it = 0;
  for (int k = 0; k < 6; ++k) {
    for (DType dtype : {DType::kF32, DType::kU8, DType::kBF16}) {
      ++it;
      const size_t es = dtype_size(dtype);
      std::vector<int64_t> counts;
      for (int r = 0; r < n; ++r) counts.push_back(count_of(k, r));
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      auto in = from_heap ? g.empty(dtype, {counts[static_cast<size_t>(g.rank())]})
                          : Tensor::allocate(dtype, {counts[static_cast<size_t>(g.rank())]});
      RANK_OK(in.status());
      fill_pattern(in->data(), in->nbytes(), g.rank(), it);
      // The v form.
      Tensor out = Tensor::empty(dtype, {total});
      CallStats stats;
      RANK_OK(all_gather_v(g, in->view(), out.view(), counts, {.schedule = schedule, .stats = &stats}));
      // (Nothing to relay: direct.)
      const Schedule ran = total == 0 ? Schedule::kDirect : schedule;
      RANK_CHECK(c.servers == 1 || schedule == Schedule::kAuto || stats.schedule == ran, "asked {}, ran {}",
                 to_string(schedule), to_string(stats.schedule));
      size_t at = 0;
      for (int r = 0; r < n; ++r) {
        const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(r)]) * es;
        const long long bad = check_pattern(static_cast<std::byte*>(out.data()) + at, bytes, r, it);
        RANK_CHECK(bad < 0, "layout {} {}: block of rank {} ({} bytes) wrong at byte {} ({}, {})", k, dtype_name(dtype), r,
                   bytes, bad, to_string(stats.schedule), stats.protocol);
        at += bytes;
      }
      // The list form with outputs of different sizes.
      std::vector<Tensor> outs;
      std::vector<TensorView> views;
      for (int r = 0; r < n; ++r) {
        outs.push_back(Tensor::empty(dtype, {counts[static_cast<size_t>(r)]}));
        views.push_back(outs.back().view());
      }
      RANK_OK(all_gather(g, in->view(), std::span<const TensorView>(views), {.schedule = schedule}));
      for (int r = 0; r < n; ++r) {
        const long long bad = check_pattern(outs[static_cast<size_t>(r)].data(), outs[static_cast<size_t>(r)].nbytes(), r, it);
        RANK_CHECK(bad < 0, "list form, layout {}: block of rank {} wrong at byte {}", k, r, bad);
      }
    }
  }
  return "";
}

}  // namespace

class UnevenWorlds : public ::testing::TestWithParam<int> {};

TEST_P(UnevenWorlds, EveryBlockEveryByteOrdinaryMemory) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return uneven(c, false, Schedule::kAuto); }));
}

TEST_P(UnevenWorlds, EveryBlockEveryByteFromTheHeap) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return uneven(c, true, Schedule::kAuto); }));
}

TEST_P(UnevenWorlds, EveryBlockEveryByteOnTheRing) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return uneven(c, false, Schedule::kRing); }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, UnevenWorlds, ::testing::Values(2, 3, 5));

TEST(Uneven, MembersThatDisagreeOnTheSizesGetAMismatchAndTheGroupGoesOn) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    // Rank 2 thinks rank 0 sends 10 elements and rank 1 sends 20; the others, 20 and 10.
    const std::vector<int64_t> mine = g.rank() == 2 ? std::vector<int64_t>{10, 20, 5} : std::vector<int64_t>{20, 10, 5};
    Tensor in = Tensor::empty(DType::kF32, {mine[static_cast<size_t>(g.rank())]});
    Tensor out = Tensor::empty(DType::kF32, {35});
    Status s = all_gather_v(g, in.view(), out.view(), mine);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    RANK_CHECK(s.message().find("all_gather_v") != std::string::npos && s.message().find("block sizes") != std::string::npos,
               "{}", s.message());
    // An even list on one member, an uneven one on the others.
    std::vector<Tensor> outs;
    std::vector<TensorView> views;
    for (int r = 0; r < 3; ++r) {
      outs.push_back(Tensor::empty(DType::kF32, {g.rank() == 0 || r != 1 ? 4 : 6}));
      views.push_back(outs.back().view());
    }
    Tensor four = Tensor::empty(DType::kF32, {g.rank() == 1 && g.rank() != 0 ? 6 : 4});
    s = all_gather(g, four.view(), std::span<const TensorView>(views));
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    // Agreeing again.
    const std::vector<int64_t> agreed = {3, 0, 2};
    Tensor in2 = Tensor::empty(DType::kU8, {agreed[static_cast<size_t>(g.rank())]});
    Tensor out2 = Tensor::empty(DType::kU8, {5});
    fill_pattern(in2.data(), in2.nbytes(), g.rank(), 77);
    RANK_OK(all_gather_v(g, in2.view(), out2.view(), agreed));
    RANK_CHECK(check_pattern(out2.data(), 3, 0, 77) < 0 && check_pattern(static_cast<std::byte*>(out2.data()) + 3, 2, 2, 77) < 0,
               "after the mismatch");
    return "";
  }));
}

TEST(Uneven, BadCountsAreRefusedOnTheRankThatPassedThem) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor in = Tensor::empty(DType::kF32, {4});
    Tensor out = Tensor::empty(DType::kF32, {10});
    auto refused = [&](std::vector<int64_t> counts, const char* words) -> std::string {
      Status s = all_gather_v(g, in.view(), out.view(), counts);
      if (s.kind() != ErrorKind::kInvalidArgument) return fmt::format("{}: {}", words, s.to_string());
      if (s.message().find(words) == std::string::npos) return fmt::format("'{}' not in {}", words, s.message());
      return "";
    };
    for (auto [counts, words] : std::vector<std::pair<std::vector<int64_t>, const char*>>{
             {{4}, "1 counts for 2 ranks"},
             {{4, -1}, "counts[1] = -1"},
             {{4, 4}, "add up to 32"},
             {{4, int64_t{1} << 62}, "counts[1]"},
             {{5, 5}, g.rank() == 0 ? "counts[0] = 5" : "counts[1] = 5"},
         }) {
      if (std::string bad = refused(counts, words); !bad.empty()) return bad;
    }
    const TensorView eight(out.data(), DType::kF32, {8});
    const TensorView overlapping(static_cast<float*>(out.data()) + 2, DType::kF32, {4});  // no rank's own block
    Status s = all_gather_v(g, overlapping, eight, std::vector<int64_t>{4, 4});
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("overlaps") != std::string::npos, "{}",
               s.to_string());
    // Nothing was posted: a good call lines up.
    std::vector<int64_t> counts = {4, 6};
    Tensor mine = Tensor::empty(DType::kF32, {counts[static_cast<size_t>(g.rank())]});
    fill_pattern(mine.data(), mine.nbytes(), g.rank(), 5);
    RANK_OK(all_gather_v(g, mine.view(), out.view(), counts));
    RANK_CHECK(check_pattern(static_cast<float*>(out.data()) + 4, 24, 1, 5) < 0, "rank 1's block");
    return "";
  }));
}

// Across servers (UCX over TCP loopback): every block of every layout, both
// forms, direct and hierarchical (the leader relaying blocks of different
// sizes), on 2 servers of 2 ranks and of 3 and 2.
TEST(Uneven, AcrossServersEveryBlockEveryByte) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  for (Schedule schedule : {Schedule::kAuto, Schedule::kDirect, Schedule::kHierarchical}) {
    fgtest::expect_all_ok(fgtest::run_job(4, [schedule](const Config& c) { return uneven(c, false, schedule); }, opt));
  }
  fgtest::expect_all_ok(fgtest::run_job(5, [](const Config& c) { return uneven(c, true, Schedule::kHierarchical); }, opt));
}
