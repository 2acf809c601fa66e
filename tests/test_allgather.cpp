// all_gather, contiguous and list forms, across world sizes, layouts, sizes
// and dtypes, with every byte checked.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;

namespace {

// One all-gather of `bytes` per rank in both forms on `group`, checked.
std::string gather_and_check(Group& g, size_t bytes, DType dtype, uint64_t it) {
  const size_t elt = dtype_size(dtype);
  const int64_t count = static_cast<int64_t>(bytes / elt);
  const int n = g.size();
  Tensor in = Tensor::empty(dtype, {count});
  fill_pattern(in.data(), in.nbytes(), g.ranks()[g.rank()], it);
  Tensor out = Tensor::empty(dtype, {n * count});
  RANK_OK(all_gather(g, in.view(), out.view()));
  for (int i = 0; i < n; ++i) {
    long long bad = check_pattern(out.data_as<char>() + static_cast<size_t>(i) * in.nbytes(), in.nbytes(), g.ranks()[i], it);
    RANK_CHECK(bad < 0, "contiguous: block of rank {} wrong at byte {} ({} bytes of {})", g.ranks()[i], bad, in.nbytes(),
               dtype_name(dtype));
  }
  std::vector<Tensor> outs;
  std::vector<TensorView> views;
  for (int i = 0; i < n; ++i) {
    outs.push_back(Tensor::empty(dtype, {count}));
    views.push_back(outs.back().view());
  }
  RANK_OK(all_gather(g, in.view(), std::span<const TensorView>(views)));
  for (int i = 0; i < n; ++i) {
    long long bad = check_pattern(outs[i].data(), in.nbytes(), g.ranks()[i], it);
    RANK_CHECK(bad < 0, "list: buffer of rank {} wrong at byte {}", g.ranks()[i], bad);
  }
  return "";
}

std::string world_body(const Config& c, const std::vector<size_t>& sizes) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  uint64_t it = 0;
  for (size_t bytes : sizes) {
    if (auto e = gather_and_check((*comm)->world(), bytes, DType::kU8, ++it); !e.empty()) return e;
  }
  return "";
}

}  // namespace

class WorldSizes : public ::testing::TestWithParam<int> {};

TEST_P(WorldSizes, BothFormsSmallAndOddSizes) {
  const std::vector<size_t> sizes = {0, 1, 7, 8, 31, 32, 33, 4097, 96 * 1024, (1 << 20) + 3, 3 << 20};
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [&](const Config& c) { return world_body(c, sizes); }));
}

INSTANTIATE_TEST_SUITE_P(AllGather, WorldSizes, ::testing::Values(1, 2, 3, 4, 5, 6));

TEST(AllGather, SixtyFourMiBPerRank) {
  for (int world : {2, 3}) {
    fgtest::expect_all_ok(fgtest::run_job(world, [](const Config& c) { return world_body(c, {64u << 20}); }));
  }
}

TEST(AllGather, EveryDtype) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    uint64_t it = 100;
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8, DType::kU8, DType::kI32, DType::kI64}) {
      for (size_t count : {0, 1, 5, 3072, 100000}) {
        if (auto e = gather_and_check((*comm)->world(), count * dtype_size(d), d, ++it); !e.empty()) return e;
      }
    }
    return "";
  }));
}

TEST(AllGather, InPlaceContiguous) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const size_t bytes = 5000;
    Tensor out = Tensor::empty(DType::kU8, {3 * 5000});
    auto* mine = out.data_as<char>() + g.rank() * bytes;
    fill_pattern(mine, bytes, g.rank(), 1);
    RANK_OK(all_gather(g, TensorView(mine, DType::kU8, {5000}), out.view()));
    for (int i = 0; i < 3; ++i) RANK_CHECK(check_pattern(out.data_as<char>() + i * bytes, bytes, i, 1) < 0, "block {}", i);
    return "";
  }));
}

// The original script's layout: tp groups of dp ranks (k, k+tp, ...) all
// gathering at the same time, each on its own channel.
class Layouts : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(Layouts, ConcurrentGroupsGatherTheirOwnRanks) {
  const auto [tp, dp] = GetParam();
  fgtest::expect_all_ok(fgtest::run_job(tp * dp, [tp = tp, dp = dp](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    auto group = (*comm)->tp_group_of_dp(tp, dp);
    RANK_OK(group.status());
    Group& g = *group.value();
    RANK_CHECK(g.size() == dp, "group size {}", g.size());
    for (int i = 0; i < dp; ++i) RANK_CHECK(g.ranks()[i] == c.rank % tp + i * tp, "member {} is rank {}", i, g.ranks()[i]);
    uint64_t it = 0;
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, size_t{96 * 1024}, size_t{3 << 20}}) {
      if (auto e = gather_and_check(g, bytes, DType::kU8, ++it); !e.empty()) return e;
    }
    // The world group still works beside the sub-groups.
    return gather_and_check((*comm)->world(), 4096, DType::kU8, 99);
  }));
}

INSTANTIATE_TEST_SUITE_P(TpDp, Layouts,
                         ::testing::Values(std::pair{1, 2}, std::pair{2, 2}, std::pair{3, 2}, std::pair{1, 4}),
                         [](const auto& info) { return fmt::format("tp{}_dp{}", info.param.first, info.param.second); });

// 10,000 back-to-back calls of varying sizes, no barrier between them:
// the parity rotation must never let a fast rank overwrite a slot a slow
// rank is still reading.
TEST(AllGather, TenThousandBackToBackVaryingSizes) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const size_t sizes[] = {0, 1, 8, 32, 33, 100, 4097, 20000, 70000, (1 << 20) + 5};
    const size_t max = (1 << 20) + 5;
    Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(max)});
    Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(3 * max)});
    for (uint64_t it = 0; it < 10000; ++it) {
      const size_t bytes = sizes[(it * 7 + it / 13) % std::size(sizes)];
      fill_pattern(in.data(), bytes, c.rank, it);
      TensorView iv(in.data(), DType::kU8, {static_cast<int64_t>(bytes)});
      TensorView ov(out.data(), DType::kU8, {static_cast<int64_t>(3 * bytes)});
      if (it % 2 == 0) {
        RANK_OK(all_gather(g, iv, ov));
      } else {
        std::vector<TensorView> list;
        for (int i = 0; i < 3; ++i) list.emplace_back(out.data_as<char>() + i * bytes, DType::kU8, std::vector<int64_t>{static_cast<int64_t>(bytes)});
        RANK_OK(all_gather(g, iv, std::span<const TensorView>(list)));
      }
      for (int i = 0; i < 3; ++i) {
        long long bad = check_pattern(out.data_as<char>() + i * bytes, bytes, i, it);
        RANK_CHECK(bad < 0, "call {} ({} bytes): rank {} block wrong at byte {}", it, bytes, i, bad);
      }
    }
    return "";
  }));
}

// The ring schedule (the multi-step comparator) must gather the same bytes.
class RingSchedule : public ::testing::TestWithParam<int> {};

TEST_P(RingSchedule, GathersEveryByteInBothForms) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) -> std::string {
    ::setenv("FG_RING_BYTES", "262144", 1);  // 64 KB steps: several chunks per block
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int n = g.size();
    AllGatherOptions ring;
    ring.schedule = Schedule::kRing;
    uint64_t it = 500;
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{33}, size_t{4097}, size_t{200000}}) {
      ++it;
      Tensor in = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
      fill_pattern(in.data(), bytes, c.rank, it);
      Tensor out = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes) * n});
      RANK_OK(all_gather(g, in.view(), out.view(), ring));
      std::vector<Tensor> outs;
      std::vector<TensorView> views;
      for (int i = 0; i < n; ++i) {
        outs.push_back(Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)}));
        views.push_back(outs.back().view());
      }
      RANK_OK(all_gather(g, in.view(), std::span<const TensorView>(views), ring));
      for (int i = 0; i < n; ++i) {
        RANK_CHECK(check_pattern(out.data_as<char>() + i * bytes, bytes, i, it) < 0, "contiguous, {} bytes, block {}", bytes, i);
        RANK_CHECK(check_pattern(outs[i].data(), bytes, i, it) < 0, "list, {} bytes, block {}", bytes, i);
      }
    }
    // Members that disagree on the schedule get a mismatch, not a hang.
    Tensor in = Tensor::zeros(DType::kU8, {5000}), out = Tensor::zeros(DType::kU8, {5000 * n});
    Status s = all_gather(g, in.view(), out.view(), c.rank == 0 ? ring : AllGatherOptions{});
    if (n > 1) {
      RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("(ring)") != std::string::npos, "{}", s.to_string());
    }
    RANK_OK(all_gather(g, in.view(), out.view()));
    return "";
  }));
}

INSTANTIATE_TEST_SUITE_P(AllGather, RingSchedule, ::testing::Values(1, 2, 3, 4, 5));

// A group can be destroyed on its own and the same ranks grouped again; the
// world group cannot be destroyed.
TEST(AllGather, GroupsCanBeDestroyedAndMadeAgain) {
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    for (int round = 0; round < 3; ++round) {
      auto g = (*comm)->tp_group_of_dp(2, 2);
      RANK_OK(g.status());
      RANK_OK(fgtest::gather_bytes(*g.value(), 4096));
      RANK_OK((*comm)->destroy_group(g.value()));
    }
    Status w = (*comm)->destroy_group(&(*comm)->world());
    RANK_CHECK(w.kind() == ErrorKind::kInvalidArgument, "{}", w.to_string());
    RANK_OK(fgtest::gather_bytes((*comm)->world(), 64));
    return "";
  }));
}
