// broadcast: every root, sizes across the inline, ring and pipelined paths,
// ordinary memory and the symmetric heap, every byte checked; mismatched
// roots and bad roots are errors on every member.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;
using fgtest::check_pattern;
using fgtest::fill_pattern;

namespace {

std::string broadcast_every_root(const Config& c, bool from_heap) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  uint64_t it = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{31}, size_t{33}, size_t{4097}, size_t{96 * 1024},
                       size_t{(3 << 20) + 3}}) {
    for (int root = 0; root < g.size(); ++root) {
      ++it;
      Tensor t = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)});
      if (from_heap) {
        auto h = g.empty(DType::kU8, {static_cast<int64_t>(bytes)});
        RANK_OK(h.status());
        t = std::move(h).value();
      }
      // Every member fills its own pattern: only the root's may survive.
      fill_pattern(t.data(), bytes, g.rank(), it);
      RANK_OK(broadcast(g, t.view(), root));
      long long bad = check_pattern(t.data(), bytes, root, it);
      RANK_CHECK(bad < 0, "{} bytes from root {}: wrong at byte {}", bytes, root, bad);
      if (g.rank() == root) std::memset(t.data(), 0, bytes);  // peers must be done reading
    }
  }
  return "";
}

}  // namespace

class BroadcastWorlds : public ::testing::TestWithParam<int> {};

TEST_P(BroadcastWorlds, EveryRootEverySizeOrdinaryMemory) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return broadcast_every_root(c, false); }));
}

TEST_P(BroadcastWorlds, EveryRootEverySizeFromTheHeap) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return broadcast_every_root(c, true); }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, BroadcastWorlds, ::testing::Values(2, 3));

TEST(Broadcast, RootsThatDisagreeAreAMismatchOnEveryMemberAndTheGroupStaysUsable) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor t = Tensor::empty(DType::kF32, {100});
    Status s = broadcast(g, t.view(), g.rank() == 2 ? 1 : 0);
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    RANK_CHECK(s.message().find("root") != std::string::npos, "{}", s.message());
    Status bad = broadcast(g, t.view(), 3);
    RANK_CHECK(bad.kind() == ErrorKind::kInvalidArgument, "{}", bad.to_string());
    fill_pattern(t.data(), t.nbytes(), g.rank(), 9);
    RANK_OK(broadcast(g, t.view(), 2));
    RANK_CHECK(check_pattern(t.data(), t.nbytes(), 2, 9) < 0, "after the mismatch");
    return "";
  }));
}

TEST(Broadcast, AsARequestBesideAGather) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor b = Tensor::empty(DType::kU8, {5000});
    fill_pattern(b.data(), b.nbytes(), g.rank(), 3);
    Tensor in = Tensor::empty(DType::kU8, {77});
    fill_pattern(in.data(), in.nbytes(), g.rank(), 4);
    Tensor out = Tensor::empty(DType::kU8, {77 * 2});
    Request r1 = start_broadcast(g, b.view(), 1);
    Request r2 = start_all_gather(g, in.view(), out.view());
    RANK_OK(r2.wait());
    RANK_OK(r1.wait());
    RANK_CHECK(check_pattern(b.data(), b.nbytes(), 1, 3) < 0, "broadcast");
    RANK_CHECK(check_pattern(out.data_as<char>() + 77, 77, 1, 4) < 0, "gather");
    return "";
  }));
}
