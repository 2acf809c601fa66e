// reduce_scatter and all_reduce within a server: every element of every
// dtype checked bit for bit against the sum in group-rank order (each rank
// computes every rank's input itself) and against a float64 reference; odd
// sizes around the inline, step and two-shot boundaries; ordinary memory and
// the symmetric heap; in place; ranks outnumbering cores; mismatches and bad
// arguments on every member; a dead peer in the middle of a reduction.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <csignal>
#include <cstring>
#include <algorithm>
#include <optional>
#include <tuple>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/caches.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"
#include "ops/gemm.hpp"

using namespace fastgather;
using namespace std::chrono_literals;

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's element i of call `it`, stored at p as `dtype` (floats with
// fractional bits, so that rounding shows; integers anywhere, so that sums wrap).
void put(DType dtype, void* p, size_t i, int rank, uint64_t it) {
  const uint64_t h = mix(it * 1000003 + static_cast<uint64_t>(rank) * 7919 + i * 0x100000001b3ull);
  const double v = (static_cast<double>(h % 20001) - 10000.0) / 997.0;
  switch (dtype) {
    case DType::kF32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::kF64: *static_cast<double*>(p) = v; break;
    case DType::kF16: *static_cast<uint16_t*>(p) = float_to_half(static_cast<float>(v)); break;
    case DType::kBF16: *static_cast<uint16_t*>(p) = float_to_bf16(static_cast<float>(v)); break;
    case DType::kI32: *static_cast<uint32_t*>(p) = static_cast<uint32_t>(h); break;
    case DType::kI64: *static_cast<uint64_t*>(p) = h; break;
    default: break;
  }
}
double get(DType dtype, const void* p) {
  switch (dtype) {
    case DType::kF32: return *static_cast<const float*>(p);
    case DType::kF64: return *static_cast<const double*>(p);
    case DType::kF16: return half_to_float(*static_cast<const uint16_t*>(p));
    case DType::kBF16: return bf16_to_float(*static_cast<const uint16_t*>(p));
    case DType::kI32: return *static_cast<const int32_t*>(p);
    case DType::kI64: return static_cast<double>(*static_cast<const int64_t*>(p));
    default: return 0;
  }
}
void fill(DType dtype, void* base, size_t count, int rank, uint64_t it) {
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) put(dtype, static_cast<std::byte*>(base) + i * es, i, rank, it);
}

// Element i of the sum over `world` ranks, stored at out as the op must
// give it: in rank order, fp16/bf16 in fp32 rounded once, integers wrapping.
// Across servers, hierarchical (`per_server` ranks on each server): each
// server's ranks in rank order, then the servers' sums in server order.
void expected(DType dtype, void* out, size_t i, int world, uint64_t it, int per_server) {
  alignas(8) std::byte x[8];
  float f = 0, fs = 0;
  double d = 0, ds = 0;
  uint64_t u = 0;
  for (int r = 0; r < world; ++r) {
    put(dtype, x, i, r, it);
    const bool first = r % per_server == 0, last = r % per_server == per_server - 1;
    switch (dtype) {
      case DType::kF64:
        ds = first ? get(dtype, x) : ds + get(dtype, x);
        if (last) d = r < per_server ? ds : d + ds;
        break;
      case DType::kI32: u += *reinterpret_cast<uint32_t*>(x); break;
      case DType::kI64: u += *reinterpret_cast<uint64_t*>(x); break;
      default:
        fs = first ? static_cast<float>(get(dtype, x)) : fs + static_cast<float>(get(dtype, x));
        if (last) f = r < per_server ? fs : f + fs;
        break;
    }
  }
  switch (dtype) {
    case DType::kF32: *static_cast<float*>(out) = f; break;
    case DType::kF16: *static_cast<uint16_t*>(out) = float_to_half(f); break;
    case DType::kBF16: *static_cast<uint16_t*>(out) = float_to_bf16(f); break;
    case DType::kF64: *static_cast<double*>(out) = d; break;
    case DType::kI32: *static_cast<uint32_t*>(out) = static_cast<uint32_t>(u); break;
    case DType::kI64: *static_cast<uint64_t*>(out) = u; break;
    default: break;
  }
}

// Checks count elements at `got` (element `first` of the whole sum onward):
// every bit as expected(), and floats within rounding of the float64 sum.
std::string check_sum(DType dtype, const void* got, size_t first, size_t count, int world, uint64_t it, int per_server) {
  const size_t es = dtype_size(dtype);
  const bool floating = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
  const double eps = dtype == DType::kF64 ? 1.2e-16 : dtype == DType::kF32 ? 6e-8 : dtype == DType::kF16 ? 4.9e-4 : 3.9e-3;
  for (size_t i = first; i < first + count; ++i) {
    const std::byte* g = static_cast<const std::byte*>(got) + (i - first) * es;
    alignas(8) std::byte want[8];
    expected(dtype, want, i, world, it, per_server);
    if (std::memcmp(g, want, es) != 0) {
      return fmt::format("element {} of the sum ({}): got {}, want {}", i, dtype_name(dtype), get(dtype, g), get(dtype, want));
    }
    if (!floating) continue;
    double ref = 0, mag = 0;
    for (int r = 0; r < world; ++r) {
      alignas(8) std::byte x[8];
      put(dtype, x, i, r, it);
      ref += get(dtype, x);
      mag += std::fabs(get(dtype, x));
    }
    // world-1 additions in fp32 (or fp64) and one rounding to the dtype.
    const double tol = (world * (dtype == DType::kF64 ? 1.2e-16 : 6e-8) + eps) * mag + 1e-300;
    if (std::fabs(get(dtype, g) - ref) > tol) {
      return fmt::format("element {} ({}): {} is {} from the float64 sum {} (tolerance {})", i, dtype_name(dtype),
                         get(dtype, g), std::fabs(get(dtype, g) - ref), ref, tol);
    }
  }
  return "";
}

struct Case {
  DType dtype;
  size_t count;  // all_reduce: elements; reduce_scatter: elements per rank of the output
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32, DType::kI64}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{17}, size_t{1000}, size_t{4099}, size_t{70001}}) {
      all.push_back({d, count});
    }
  }
  all.push_back({DType::kF32, 300000});  // past the two-shot size and many steps
  all.push_back({DType::kBF16, 150001});
  return all;
}

Result<Tensor> make(Group& g, bool from_heap, DType dtype, size_t count) {
  if (from_heap) return g.empty(dtype, {static_cast<int64_t>(count)});
  return Tensor::allocate(dtype, {static_cast<int64_t>(count)});
}

// per_server: ranks on each server of a hierarchical sum across servers,
// which every call must have run (0: the sum in rank order). one_each: the
// group has one rank on each server, and every call must have run a
// schedule written for one server over the steps between them.
std::string every_case_on(Group& g, bool from_heap, Schedule all_reduce_schedule, int per_server = 0,
                          Schedule reduce_scatter_schedule = Schedule::kAuto, bool one_each = false) {
  const int n = g.size();
  if (per_server == 0) per_server = n;
  const bool hierarchical = per_server != n;
  auto one_server_schedule = [](Schedule s) { return s == Schedule::kOneShot || s == Schedule::kTwoShot; };
  uint64_t it = 0;
  for (const Case& k : cases()) {
    const size_t es = dtype_size(k.dtype);
    // all_reduce, into another tensor and in place.
    for (bool in_place : {false, true}) {
      ++it;
      auto in = make(g, from_heap, k.dtype, k.count);
      RANK_OK(in.status());
      fill(k.dtype, in->data(), k.count, g.rank(), it);
      std::optional<Tensor> out;
      if (!in_place) {
        auto made = make(g, from_heap, k.dtype, k.count);
        RANK_OK(made.status());
        out = std::move(made).value();
      }
      const TensorView dst = in_place ? in->view() : out->view();
      CallStats stats;
      RANK_OK(all_reduce(g, in->view(), dst, {.schedule = all_reduce_schedule, .stats = &stats}));
      RANK_CHECK(!hierarchical || stats.schedule == Schedule::kHierarchical, "all_reduce ran {}", to_string(stats.schedule));
      RANK_CHECK(!one_each || one_server_schedule(stats.schedule), "all_reduce ran {}", to_string(stats.schedule));
      std::string bad = check_sum(k.dtype, dst.data, 0, k.count, n, it, per_server);
      RANK_CHECK(bad.empty(), "all_reduce {} x {}{} ({}, {}): {}", k.count, dtype_name(k.dtype), in_place ? " in place" : "",
                 to_string(stats.schedule), stats.protocol, bad);
      if (!in_place) {  // the input is untouched
        std::vector<std::byte> mine(k.count * es);
        fill(k.dtype, mine.data(), k.count, g.rank(), it);
        RANK_CHECK(k.count == 0 || std::memcmp(mine.data(), in->data(), k.count * es) == 0, "all_reduce changed its input");
      }
    }
    // reduce_scatter, into another tensor and into the own chunk.
    for (bool own_chunk : {false, true}) {
      ++it;
      auto in = make(g, from_heap, k.dtype, k.count * static_cast<size_t>(n));
      RANK_OK(in.status());
      // Chunk j of every input holds elements j*count.. of the whole sum.
      fill(k.dtype, in->data(), k.count * static_cast<size_t>(n), g.rank(), it);
      std::optional<Tensor> out;
      if (!own_chunk) {
        auto made = make(g, from_heap, k.dtype, k.count);
        RANK_OK(made.status());
        out = std::move(made).value();
      }
      std::byte* mine = static_cast<std::byte*>(in->data()) + static_cast<size_t>(g.rank()) * k.count * es;
      const TensorView dst = own_chunk ? TensorView(mine, k.dtype, {static_cast<int64_t>(k.count)}) : out->view();
      CallStats stats;
      RANK_OK(reduce_scatter(g, in->view(), dst, {.schedule = reduce_scatter_schedule, .stats = &stats}));
      RANK_CHECK(!hierarchical || stats.schedule == Schedule::kHierarchical, "reduce_scatter ran {}", to_string(stats.schedule));
      RANK_CHECK(!one_each || one_server_schedule(stats.schedule), "reduce_scatter ran {}", to_string(stats.schedule));
      std::string bad = check_sum(k.dtype, dst.data, static_cast<size_t>(g.rank()) * k.count, k.count, n, it, per_server);
      RANK_CHECK(bad.empty(), "reduce_scatter {} x {} per rank{} ({}, {}): {}", k.count, dtype_name(k.dtype),
                 own_chunk ? " into the own chunk" : "", to_string(stats.schedule), stats.protocol, bad);
    }
  }
  return "";
}

std::string every_case(const Config& c, bool from_heap, Schedule all_reduce_schedule, int per_server = 0,
                       Schedule reduce_scatter_schedule = Schedule::kAuto, bool one_each = false) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  return every_case_on((*comm)->world(), from_heap, all_reduce_schedule, per_server, reduce_scatter_schedule, one_each);
}

}  // namespace

class ReduceWorlds : public ::testing::TestWithParam<int> {};

TEST_P(ReduceWorlds, EveryDtypeAndSizeOrdinaryMemory) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return every_case(c, false, Schedule::kAuto); }));
}

TEST_P(ReduceWorlds, EveryDtypeAndSizeFromTheHeap) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return every_case(c, true, Schedule::kAuto); }));
}

TEST_P(ReduceWorlds, AllReduceTwoShotAtEverySize) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return every_case(c, false, Schedule::kTwoShot); }));
}

TEST_P(ReduceWorlds, AllReduceOneShotAtEverySizeFromTheHeap) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return every_case(c, true, Schedule::kOneShot); }));
}

// 2 ranks, 3 and 5 on this machine's 2 cores.
INSTANTIATE_TEST_SUITE_P(Ranks, ReduceWorlds, ::testing::Values(2, 3, 5));

TEST(Reduce, MismatchesAreNamedOnEveryMemberAndTheGroupStaysUsable) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const bool odd = g.rank() == 2;
    Tensor a = Tensor::empty(DType::kF32, {3000});
    Tensor b = Tensor::empty(DType::kF32, {odd ? 3001 : 3000});
    Status s = all_reduce(g, b.view(), b.view());
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "sizes: {}", s.to_string());
    RANK_CHECK(s.message().find("all_reduce") != std::string::npos && s.message().find("12004") != std::string::npos,
               "{}", s.message());
    // Same bytes, another dtype.
    Tensor h = Tensor::empty(odd ? DType::kI32 : DType::kF32, {3000});
    s = all_reduce(g, h.view(), h.view());
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "dtypes: {}", s.to_string());
    // Another schedule asked for.
    s = all_reduce(g, a.view(), a.view(), {.schedule = odd ? Schedule::kTwoShot : Schedule::kOneShot});
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "schedules: {}", s.to_string());
    // Another op with the same bytes.
    Tensor third = Tensor::empty(DType::kF32, {1000});
    s = odd ? reduce_scatter(g, a.view(), third.view()) : all_reduce(g, a.view(), a.view());
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "ops: {}", s.to_string());
    RANK_CHECK(s.message().find("reduce_scatter") != std::string::npos, "{}", s.message());
    // Still usable, and right.
    for (int64_t i = 0; i < 3000; ++i) static_cast<float*>(a.data())[i] = static_cast<float>(g.rank() + i);
    RANK_OK(all_reduce(g, a.view(), a.view()));
    for (int64_t i = 0; i < 3000; ++i) {
      RANK_CHECK(static_cast<float*>(a.data())[i] == static_cast<float>(3 * i + 3), "element {}", i);
    }
    return "";
  }));
}

TEST(Reduce, BadArgumentsAreRefusedOnTheRankThatPassedThem) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor u8 = Tensor::empty(DType::kU8, {64});
    Tensor f = Tensor::empty(DType::kF32, {64});
    Tensor f2 = Tensor::empty(DType::kF32, {64});
    Tensor half = Tensor::empty(DType::kF32, {32});
    Tensor d = Tensor::empty(DType::kF64, {64});
    auto refused = [&](Status s, const char* words) -> std::string {
      if (s.kind() != ErrorKind::kInvalidArgument) return fmt::format("{}: {}", words, s.to_string());
      if (s.message().find(words) == std::string::npos) return fmt::format("'{}' not in {}", words, s.message());
      return "";
    };
    std::string bad;
    // uint8 is summed now (test_reductions.cpp); its average is not: refused as unserved.
    if (Status s = all_reduce(g, u8.view(), u8.view(), {.op = ReduceOp::kAvg});
        s.kind() != ErrorKind::kUnsupported || s.message().find("avg of") == std::string::npos) {
      return "avg of uint8: " + s.to_string();
    }
    if (bad = refused(all_reduce(g, f.view(), d.view()), "output is fp64"); !bad.empty()) return bad;
    if (bad = refused(all_reduce(g, f.view(), half.view()), "holds 128 bytes"); !bad.empty()) return bad;
    const TensorView shifted(static_cast<float*>(f.data()) + 1, DType::kF32, {63});
    const TensorView first63(f.data(), DType::kF32, {63});
    if (bad = refused(all_reduce(g, first63, shifted), "overlaps"); !bad.empty()) return bad;
    if (bad = refused(reduce_scatter(g, f.view(), f.view()), "need 512"); !bad.empty()) return bad;
    const TensorView not_own(f.data(), DType::kF32, {32});  // rank 1's own chunk is the second half
    if (g.rank() == 1) {
      if (bad = refused(reduce_scatter(g, f.view(), not_own), "overlaps"); !bad.empty()) return bad;
    }
    const TensorView null_in(nullptr, DType::kF32, {64});
    if (bad = refused(all_reduce(g, null_in, f2.view()), "null"); !bad.empty()) return bad;
    // Nothing was posted: the next call lines up.
    for (int i = 0; i < 64; ++i) static_cast<float*>(f.data())[i] = 1.5f;
    RANK_OK(all_reduce(g, f.view(), f2.view()));
    RANK_CHECK(static_cast<float*>(f2.data())[63] == 3.0f, "{}", static_cast<float*>(f2.data())[63]);
    return "";
  }));
}

TEST(Reduce, AsRequestsInOrderBesideAGather) {
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor x = Tensor::empty(DType::kF32, {9000});
    Tensor y = Tensor::empty(DType::kF32, {3000});
    Tensor z = Tensor::empty(DType::kF32, {9000});
    for (int i = 0; i < 9000; ++i) static_cast<float*>(x.data())[i] = static_cast<float>(g.rank() * 10000 + i);
    Request r1 = start_all_reduce(g, x.view(), x.view());
    Request r2 = start_reduce_scatter(g, x.view(), y.view());  // starts after r1: it sees r1's sums
    Request r3 = start_all_gather(g, y.view(), z.view());
    RANK_OK(r3.wait());
    RANK_OK(r1.wait());
    RANK_OK(r2.wait());
    for (int i = 0; i < 9000; ++i) {
      const float sum = static_cast<float>(30000 + 3 * i);  // exact in fp32
      RANK_CHECK(static_cast<float*>(x.data())[i] == sum, "all_reduce element {}", i);
    }
    for (int i = 0; i < 9000; ++i) {  // chunk r of 3 x the all-reduced x, gathered
      const float sum = 3.0f * static_cast<float>(30000 + 3 * i);
      RANK_CHECK(static_cast<float*>(z.data())[i] == sum, "reduce_scatter then gather: element {}", i);
    }
    return "";
  }));
}

// A peer that dies while the others sum: they fail naming it, at once.
TEST(Reduce, ADeadPeerInTheMiddleOfAReductionIsFoundAtOnce) {
  auto results = fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor x = Tensor::empty(DType::kF32, {1 << 20});
    for (int i = 0; i < 20; ++i) RANK_OK(all_reduce(g, x.view(), x.view(), {.schedule = Schedule::kTwoShot}));
    if (c.rank == 2) {
      std::this_thread::sleep_for(50ms);  // the others are inside the next call
      ::raise(SIGKILL);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status s = all_reduce(g, x.view(), x.view(), {.schedule = Schedule::kTwoShot});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    RANK_CHECK(s.kind() == ErrorKind::kPeerLost, "{}", s.to_string());
    RANK_CHECK(s.message().find("rank 2") != std::string::npos, "{}", s.message());
    RANK_CHECK(ms < 2000, "noticed after {:.0f} ms", ms);
    return "";
  });
  EXPECT_EQ(results[2].signal, SIGKILL);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].error;
  EXPECT_EQ(results[1].exit_code, 0) << results[1].error;
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

// Across servers (simulated servers, UCX over TCP loopback): every dtype and
// size, every element bit for bit as the hierarchical sum gives it (each
// server's ranks, then the servers in order), or, one-shot asked, as within
// a server; with one and with several ranks on each server.
TEST(Reduce, AcrossServersHierarchicalEveryDtypeAndSize) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) { return every_case(c, false, Schedule::kAuto, 2); }, opt));
}

TEST(Reduce, AcrossServersHierarchicalFromTheHeap) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) { return every_case(c, true, Schedule::kHierarchical, 2,
                                                                                     Schedule::kHierarchical); }, opt));
}

// One rank on each server: the one-shot and two-shot sums written for one
// server run between the servers (transport/net_steps.hpp), every element
// summed in rank order, as within a server.
TEST(Reduce, AcrossServersOneRankEachServer) {
  fgtest::JobOptions opt;
  opt.servers = 3;
  for (Schedule s : {Schedule::kAuto, Schedule::kOneShot, Schedule::kTwoShot}) {
    fgtest::expect_all_ok(fgtest::run_job(3, [s](const Config& c) {
      return every_case(c, false, s, 0, s == Schedule::kTwoShot ? Schedule::kAuto : s, true);
    }, opt));
  }
}

TEST(Reduce, AcrossServersThreeServersOfTwoRanks) {
  fgtest::JobOptions opt;
  opt.servers = 3;
  fgtest::expect_all_ok(fgtest::run_job(6, [](const Config& c) { return every_case(c, false, Schedule::kAuto, 2); }, opt));
}

TEST(Reduce, AcrossServersOneShotGathersTheInputs) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) {
    return every_case(c, false, Schedule::kOneShot, 0, Schedule::kOneShot);
  }, opt));
}

// 2 ranks on one server, 1 on the other: no hierarchical sum (refused when
// asked for); auto gathers the inputs and sums in rank order.
TEST(Reduce, AcrossServersUnevenServersGatherTheInputs) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(3, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Tensor x = Tensor::empty(DType::kF32, {1000});
    Status s = all_reduce((*comm)->world(), x.view(), x.view(), {.schedule = Schedule::kHierarchical});
    RANK_CHECK(s.kind() == ErrorKind::kUnsupported && s.message().find("same number of members") != std::string::npos,
               "{}", s.to_string());
    return every_case_on((*comm)->world(), false, Schedule::kAuto);
  }, opt));
}

// A mismatch between servers (rank 3 sums more elements; its server's ranks
// agree with each other, and so do the first server's) is named on every
// member, with both sizes.
TEST(Reduce, AcrossServersAMismatchIsNamedOnEveryMember) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor x = Tensor::empty(DType::kF32, {g.rank() >= 2 ? 4000 : 3000});
    Status s = all_reduce(g, x.view(), x.view());
    // Whoever received a larger message than it expected reads what its
    // sender saw (the sender received a smaller one, with its header).
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "{}", s.to_string());
    RANK_CHECK(s.message().find("all_reduce") != std::string::npos && s.message().find("12000") != std::string::npos &&
                   s.message().find("16000") != std::string::npos,
               "{}", s.to_string());
    RANK_CHECK(!all_reduce(g, x.view(), x.view()).ok(), "a failed group across servers must stay failed");
    return "";
  }, opt));
}

// A rank killed while its server's members and the other server's are inside
// a hierarchical all_reduce: every other member learns it at once.
TEST(Reduce, AcrossServersADeadPeerInTheMiddleIsFoundAtOnce) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  auto results = fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor x = Tensor::empty(DType::kF32, {1 << 20});
    for (int i = 0; i < 10; ++i) RANK_OK(all_reduce(g, x.view(), x.view()));
    if (c.rank == 3) {
      std::this_thread::sleep_for(50ms);  // the others are inside the next call
      ::raise(SIGKILL);
    }
    const auto t0 = std::chrono::steady_clock::now();
    CallStats stats;
    Status s = all_reduce(g, x.view(), x.view(), {.stats = &stats});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Rank 3's server learns it from rank 3's pidfd; the other server, from
    // its partner there (rank 2 leaves the call), a lost rank either way.
    RANK_CHECK(s.kind() == ErrorKind::kPeerLost, "{}", s.to_string());
    RANK_CHECK(s.message().find(c.rank == 2 ? "rank 3" : "rank ") != std::string::npos, "{}", s.to_string());
    RANK_CHECK(ms < 2000, "noticed after {:.0f} ms", ms);
    return "";
  }, opt);
  EXPECT_EQ(results[3].signal, SIGKILL);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].exit_code, 0) << results[r].error;
  EXPECT_TRUE(fgtest::segments_of(results).empty());
}

TEST(Reduce, AcrossServersWhatIsNotBuiltIsRefusedOnEveryMember) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor x = Tensor::empty(DType::kF32, {1000});
    Status s = all_reduce(g, x.view(), x.view(), {.schedule = Schedule::kTwoShot});
    RANK_CHECK(s.kind() == ErrorKind::kUnsupported && s.message().find("not two-shot") != std::string::npos, "{}",
               s.to_string());
    Tensor x1 = Tensor::empty(DType::kF32, {8, 4});
    Tensor x2 = Tensor::empty(DType::kF32, {4, 4});
    Tensor out = Tensor::empty(DType::kF32, {2, 4});
    s = matmul_reduce_scatter(g, x1.view(), x2.view(), std::nullopt, out.view(), {.schedule = Schedule::kOneShot});
    RANK_CHECK(s.kind() == ErrorKind::kUnsupported && s.message().find("runs hierarchical") != std::string::npos, "{}",
               s.to_string());
    for (int i = 0; i < 1000; ++i) static_cast<float*>(x.data())[i] = static_cast<float>(g.rank() + 1);
    RANK_OK(all_reduce(g, x.view(), x.view()));  // nothing was posted: this one lines up
    RANK_CHECK(static_cast<float*>(x.data())[999] == 10.0f, "{}", static_cast<float*>(x.data())[999]);
    return "";
  }, opt));
}

// matmul_reduce_scatter: values k/8 (k in -8..7) make every product and sum
// exact in fp32 in any order, so the expected output is known bit for bit
// (rounded once to the dtype); the float64 reference is then the same.
namespace {

float exact(int rank, int salt, size_t i) {
  return static_cast<float>(static_cast<int>(mix(static_cast<uint64_t>(rank) * 1000 + static_cast<uint64_t>(salt) * 7 + i * 131) & 15u) - 8) *
         0.125f;
}

Tensor exact_tensor(DType dtype, std::vector<int64_t> shape, int rank, int salt) {
  Tensor t = Tensor::empty(dtype, shape);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = exact(rank, salt, i);
  (void)convert(TensorView(v.data(), DType::kF32, {t.numel()}), t.view());
  return t;
}

std::string matmul_reduce_scatter_cases(const Config& c, int gemm_threads) {
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group& g = (*comm)->world();
  const int64_t w = g.size();
  int salt = 0;
  // x2 twice this core's L2 (k = 32), with 64 rows or more: multiplied at
  // once for its size alone, in every dtype.
  const size_t l2 = fastgather::base::l2_bytes();
  const auto wide = static_cast<int64_t>(2 * l2 / (32 * sizeof(float)));
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [rows_each, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 5, 1}, {7, 300, 100}, {64, 33, 1000}, {3, 0, 16}, {0, 8, 8}, {50, 64, 3072}, {32, 32, wide}}) {
      // One float64 reference for the call without the bias and the call
      // with it: both take the same inputs.
      ++salt;
      const int64_t m = rows_each * w;
      Tensor x1 = exact_tensor(dtype, {m, k}, g.rank(), salt);
      Tensor x2 = exact_tensor(dtype, {k, n}, g.rank(), salt + 1000);
      Tensor bias = exact_tensor(dtype, {n}, 99, salt);
      // The reference, in float64: every rank's x1 @ x2, rows of this rank's chunk.
      std::vector<double> want(static_cast<size_t>(rows_each * n), 0.0), b64(static_cast<size_t>(k * n));
      for (int r = 0; r < w; ++r) {
        for (size_t q = 0; q < b64.size(); ++q) b64[q] = exact(r, salt + 1000, q);
        for (int64_t i = 0; i < rows_each; ++i) {
          const int64_t row = g.rank() * rows_each + i;
          double* to = want.data() + i * n;
          for (int64_t q = 0; q < k; ++q) {
            const double x = exact(r, salt, static_cast<size_t>(row * k + q));
            const double* b_row = b64.data() + q * n;
            for (int64_t j = 0; j < n; ++j) to[j] += x * b_row[j];
          }
        }
      }
      for (bool with_bias : {false, true}) {
        Tensor out = Tensor::empty(dtype, {rows_each, n});
        std::optional<TensorView> b;
        if (with_bias) b = bias.view();
        CallStats stats;
        RANK_OK(matmul_reduce_scatter(g, x1.view(), x2.view(), b, out.view(), {.gemm_threads = gemm_threads, .stats = &stats}));
        RANK_CHECK(c.servers == 1 || stats.schedule == Schedule::kHierarchical, "across servers it ran {}",
                   to_string(stats.schedule));
        // The wide x2 (beyond L2) is multiplied at once in every dtype, and
        // in fp32 fewer than 64 rows too; with an x2 well within L2, at
        // least 64 rows, and other dtypes' rows, a piece at a time (each
        // member's chunk at least one call).
        const size_t x2_bytes = static_cast<size_t>(k * n) * sizeof(float);
        if (w > 1 && c.servers == 1 && m > 0 && (n == wide || x2_bytes <= l2 / 4)) {
          const bool at_once = n == wide || (dtype == DType::kF32 && m < 64);
          RANK_CHECK(at_once == (stats.gemm_calls == 1), "{} m={} k={} n={}: {} GEMM calls", dtype_name(dtype), m, k, n,
                     stats.gemm_calls);
        }
        // The output as fp32, converted whole (one view per element cost most of this test's time under ASan).
        std::vector<float> got_all(static_cast<size_t>(rows_each * n));
        if (!got_all.empty()) RANK_OK(convert(out.view(), TensorView(got_all.data(), DType::kF32, {rows_each, n})));
        for (int64_t i = 0; i < rows_each * n; ++i) {
          double expect = want[static_cast<size_t>(i)] + (with_bias ? exact(99, salt, static_cast<size_t>(i % n)) : 0.0);
          float rounded = static_cast<float>(expect);
          if (dtype == DType::kBF16) rounded = bf16_to_float(float_to_bf16(rounded));
          if (dtype == DType::kF16) rounded = half_to_float(float_to_half(rounded));
          const float got = got_all[static_cast<size_t>(i)];
          RANK_CHECK(got == rounded, "{} m={} k={} n={}{} ({} GEMM): element {} is {}, want {} (float64 {})", dtype_name(dtype),
                     m, k, n, with_bias ? " +bias" : "", gemm_threads > 1 ? "OpenBLAS" : "packed", i, got, rounded, expect);
        }
      }
    }
  }
  return "";
}

}  // namespace

class MatmulReduceScatterWorlds : public ::testing::TestWithParam<int> {};

TEST_P(MatmulReduceScatterWorlds, MatchesTheFloat64ReferenceBitForBit) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return matmul_reduce_scatter_cases(c, 1); }));
}

TEST_P(MatmulReduceScatterWorlds, MatchesItWithOpenBlas) {
  fgtest::expect_all_ok(fgtest::run_job(GetParam(), [](const Config& c) { return matmul_reduce_scatter_cases(c, 2); }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, MatmulReduceScatterWorlds, ::testing::Values(1, 2, 3));

// Across servers (hierarchical: the product made into each server's ring,
// partial sums exchanged): 2 ranks on each of 2 servers, 1 on each of 2,
// and 2 on each of 3.
TEST(MatmulReduceScatter, AcrossServersMatchesTheReferenceBitForBit) {
  fgtest::JobOptions opt;
  opt.servers = 2;
  fgtest::expect_all_ok(fgtest::run_job(4, [](const Config& c) { return matmul_reduce_scatter_cases(c, 1); }, opt));
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) { return matmul_reduce_scatter_cases(c, 2); }, opt));
  opt.servers = 3;
  fgtest::expect_all_ok(fgtest::run_job(6, [](const Config& c) { return matmul_reduce_scatter_cases(c, 1); }, opt));
}

// One GEMM call holds the product, and for bf16/fp16 x1's fp32 copy, whole:
// not past 64 MiB of either, whatever x2's size asks for.
TEST(MatmulReduceScatter, OneCallHoldsAtMost64MiBWhole) {
  const size_t l2 = fastgather::base::l2_bytes();
  // x2 (k = 8192) as large as L2: over half of it, so one call if it may.
  const size_t k = 8192, n = std::max<size_t>(l2 / (k * sizeof(float)), 1);
  // x1 in fp32: `rows` x k floats = 64 MiB (held), one more row is not.
  const size_t rows = ops::kWholeMaxBytes / (k * sizeof(float));
  EXPECT_TRUE(ops::multiply_whole(DType::kBF16, rows, k, n));
  EXPECT_FALSE(ops::multiply_whole(DType::kBF16, rows + 1, k, n));
  EXPECT_FALSE(ops::multiply_whole(DType::kF16, rows + 1, k, n));
  EXPECT_TRUE(ops::multiply_whole(DType::kF32, rows + 1, k, n));  // fp32 x1 is used where it lies
  // The product: m x n floats past 64 MiB is never made whole.
  const size_t most_rows = ops::kWholeMaxBytes / (n * sizeof(float));
  EXPECT_TRUE(ops::multiply_whole(DType::kF32, most_rows, k, n));
  EXPECT_FALSE(ops::multiply_whole(DType::kF32, most_rows + 1, k, n));
}

TEST(MatmulReduceScatter, AnotherKIsAMismatchAndBadShapesAreRefused) {
  fgtest::expect_all_ok(fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int64_t k = g.rank() == 1 ? 9 : 8;
    Tensor x1 = Tensor::empty(DType::kF32, {4, k});
    Tensor x2 = Tensor::empty(DType::kF32, {k, 16});
    Tensor out = Tensor::empty(DType::kF32, {2, 16});
    Status s = matmul_reduce_scatter(g, x1.view(), x2.view(), std::nullopt, out.view());
    RANK_CHECK(s.kind() == ErrorKind::kMismatch && s.message().find("k=8") != std::string::npos &&
                   s.message().find("k=9") != std::string::npos, "{}", s.to_string());
    Tensor x3 = Tensor::empty(DType::kF32, {3, 8});
    Tensor x4 = Tensor::empty(DType::kF32, {8, 16});
    s = matmul_reduce_scatter(g, x3.view(), x4.view(), std::nullopt, out.view());
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("do not split over 2") != std::string::npos, "{}",
               s.to_string());
    Tensor small = Tensor::empty(DType::kF32, {1, 16});
    Tensor x5 = Tensor::empty(DType::kF32, {4, 8});
    s = matmul_reduce_scatter(g, x5.view(), x4.view(), std::nullopt, small.view());
    RANK_CHECK(s.kind() == ErrorKind::kInvalidArgument && s.message().find("expected fp32[2, 16]") != std::string::npos, "{}",
               s.to_string());
    // Still usable: ones times ones, summed over 2 ranks.
    Tensor ones1 = Tensor::empty(DType::kF32, {4, 8});
    Tensor ones2 = Tensor::empty(DType::kF32, {8, 16});
    std::fill_n(static_cast<float*>(ones1.data()), 32, 1.0f);
    std::fill_n(static_cast<float*>(ones2.data()), 128, 1.0f);
    RANK_OK(matmul_reduce_scatter(g, ones1.view(), ones2.view(), std::nullopt, out.view()));
    RANK_CHECK(static_cast<float*>(out.data())[31] == 16.0f, "{}", static_cast<float*>(out.data())[31]);
    return "";
  }));
}
