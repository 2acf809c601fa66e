// Fused all-gather + matmul against a double-precision reference GEMM of the
// same (dtype-rounded) inputs. Tolerance per dtype: the op accumulates in
// fp32 and rounds once to the output dtype, so
//   |got - ref| <= u_out * |ref| + k * 2^-24 * sum|x1*x2| + 1e-6
// with u_out the output's unit roundoff: fp32 0 (already counted), fp16
// 2^-11, bf16 2^-8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "base/caches.hpp"
#include "fastgather/fastgather.hpp"
#include "harness.hpp"

using namespace fastgather;

namespace {

double output_roundoff(DType d) {
  switch (d) {
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    default: return 0.0;
  }
}

float load(DType d, const void* p, size_t i) {
  switch (d) {
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
void store(DType d, void* p, size_t i, float v) {
  switch (d) {
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_half(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// Rank r's x1: uniform in [-1, 1), seeded by (seed, r) so every rank can rebuild it.
Tensor make_x1(DType d, int64_t m, int64_t k, int rank, int seed) {
  Tensor t = Tensor::empty(d, {m, k});
  std::mt19937 gen(static_cast<unsigned>(seed * 1000 + rank));
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < m * k; ++i) store(d, t.data(), static_cast<size_t>(i), u(gen));
  return t;
}

struct Case {
  DType dtype;
  int64_t m, k, n;
  bool bias;
  bool gather_output;
  std::string ring_bytes;  // small rings force many pieces per rank
  int servers = 1;         // simulated servers (UCX on loopback between them)
  int tp = 1;              // the TP x DP group instead of the world
  Schedule schedule = Schedule::kAuto;
};

std::string run_case(const Config& c, const Case& cs) {
  if (!cs.ring_bytes.empty()) ::setenv("FG_RING_BYTES", cs.ring_bytes.c_str(), 1);
  // Across servers, small network pieces too (not a multiple of a row: rounded down to rows).
  if (!cs.ring_bytes.empty() && cs.servers > 1) ::setenv("FG_NET_PIECE_BYTES", "40000", 1);
  auto comm = Communicator::create(c);
  RANK_OK(comm.status());
  Group* group = &(*comm)->world();
  if (cs.tp > 1) {
    auto sub = (*comm)->tp_group_of_dp(cs.tp, c.world_size / cs.tp);
    RANK_OK(sub.status());
    group = sub.value();
  }
  Group& g = *group;
  const int w = g.size();
  const DType d = cs.dtype;
  for (int seed = 1; seed <= 3; ++seed) {
    // The second call flips the bias: a call without one right after a call
    // with one, on the same group (its scratch once leaked the old bias).
    const bool use_bias = (seed == 2) != cs.bias;
    Tensor x1 = make_x1(d, cs.m, cs.k, c.rank, seed);
    Tensor x2 = make_x1(d, cs.k, cs.n, 999, seed);  // same on every rank
    Tensor bias = make_x1(d, 1, cs.n, 555, seed);
    Tensor out = Tensor::empty(d, {cs.m * w, cs.n});
    Tensor gathered = Tensor::empty(d, {cs.m * w, cs.k});
    std::optional<TensorView> bias_view;
    if (use_bias) bias_view = TensorView(bias.data(), d, {cs.n});
    AllGatherMatmulOptions opt;
    opt.gather_output = cs.gather_output;
    opt.schedule = cs.schedule;
    CallStats stats;
    opt.stats = &stats;
    RANK_OK(all_gather_matmul(g, x1.view(), x2.view(), bias_view, out.view(),
                              cs.gather_output ? gathered.view() : TensorView{}, opt));
    // Gathered first and multiplied in one call where x2 (in fp32) is over
    // half of L2, in every dtype, and where fp32 has fewer than 64 rows in
    // all; else a piece at a time (each member's block at least one call).
    const size_t rows_all = static_cast<size_t>(cs.m * w);
    const size_t x2_bytes = static_cast<size_t>(cs.k * cs.n) * sizeof(float);
    const bool whole = x2_bytes > fastgather::base::l2_bytes() / 2 || (d == DType::kF32 && rows_all < 64);
    if (w > 1 && cs.m > 0) {
      RANK_CHECK(whole == (stats.gemm_calls == 1), "{} m={} k={} n={}: {} GEMM calls", dtype_name(d), cs.m, cs.k, cs.n,
                 stats.gemm_calls);
    }
    const double u_out = output_roundoff(d);
    // The operands as floats, each element converted once (a load per product
    // was most of the test's time under ASan).
    auto floats = [d](const Tensor& t) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (size_t q = 0; q < v.size(); ++q) v[q] = load(d, t.data(), q);
      return v;
    };
    const std::vector<float> x2f = floats(x2);
    for (int r = 0; r < w; ++r) {
      Tensor xr = make_x1(d, cs.m, cs.k, g.ranks()[r], seed);
      if (cs.gather_output) {
        RANK_CHECK(std::memcmp(gathered.data_as<char>() + r * xr.nbytes(), xr.data(), xr.nbytes()) == 0,
                   "gather_out block of rank {} differs from its x1", r);
      }
      const std::vector<float> xrf = floats(xr);
      for (int64_t i = 0; i < cs.m; ++i) {
        for (int64_t j = 0; j < cs.n; ++j) {
          double ref = use_bias ? load(d, bias.data(), static_cast<size_t>(j)) : 0.0;
          double mag = std::fabs(ref);
          for (int64_t p = 0; p < cs.k; ++p) {
            double t = static_cast<double>(xrf[static_cast<size_t>(i * cs.k + p)]) * x2f[static_cast<size_t>(p * cs.n + j)];
            ref += t;
            mag += std::fabs(t);
          }
          const double got = load(d, out.data(), static_cast<size_t>((r * cs.m + i) * cs.n + j));
          const double allowed = u_out * std::fabs(ref) + static_cast<double>(cs.k) * std::ldexp(1.0, -24) * mag + 1e-6;
          RANK_CHECK(std::fabs(got - ref) <= allowed, "{} output[{}, {}] = {} but reference {} (allowed error {})",
                     dtype_name(d), r * cs.m + i, j, got, ref, allowed);
        }
      }
    }
  }
  return "";
}

}  // namespace

// Every GEMM of the fused op (FG_FUSED_GEMM): the packed kernel (in its
// AVX-512 form where the CPU has it), its AVX2 form, and OpenBLAS.
class Fused : public ::testing::TestWithParam<std::tuple<DType, int, const char*>> {};

TEST_P(Fused, MatchesReferenceGemm) {
  const auto [dtype, world, gemm] = GetParam();
  ::setenv("FG_FUSED_GEMM", gemm, 1);  // read once per process: by the rank processes forked below
  const std::vector<Case> cases = {
      {dtype, 5, 64, 16, false, true, ""},
      {dtype, 5, 64, 16, true, true, ""},
      {dtype, 7, 96, 8, true, false, ""},
      {dtype, 1, 3072, 16, false, true, ""},
      {dtype, 0, 64, 16, true, true, ""},              // m = 0: valid, empty output
      {dtype, 300, 64, 24, true, true, "65536"},       // many pieces per rank
      {dtype, 300, 64, 24, false, false, "65536"},
      // The packed kernel's edges: k past one 256-wide pass and not a multiple
      // of it, n not a multiple of the 16-column panel (1, 3 panels: with
      // AVX-512 a pair and a last one alone), a 4-row tail tile, row chunks
      // (96 rows at n <= 16, fewer at n = 1100 by the core's L2), k = 0. In
      // fp32 fewer than 64 rows are multiplied whole: the 64-row cases keep
      // the packed kernel's fp32 path in the test.
      {dtype, 13, 300, 33, true, true, ""},
      {dtype, 64, 300, 33, true, false, ""},
      {dtype, 100, 520, 7, true, false, ""},
      {dtype, 17, 40, 1100, true, true, ""},
      {dtype, 64, 40, 1100, false, false, ""},
      {dtype, 6, 1, 16, false, true, ""},
      {dtype, 4, 0, 20, true, false, ""},
      // x2 just over half of L2: gathered, then one call in every dtype.
      {dtype, 4, 32, static_cast<int64_t>(fastgather::base::l2_bytes() / 2 / (32 * sizeof(float))) + 16, true, true, ""},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(fmt::format("m={} k={} n={} bias={} gather_output={} ring={}", cs.m, cs.k, cs.n, cs.bias,
                             cs.gather_output, cs.ring_bytes));
    fgtest::expect_all_ok(fgtest::run_job(world, [&](const Config& c) { return run_case(c, cs); }));
  }
}

INSTANTIATE_TEST_SUITE_P(AllGatherMatmul, Fused,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(1, 2, 3), ::testing::Values("packed", "avx2", "openblas")),
                         [](const auto& info) {
                           return fmt::format("{}_world{}_{}", dtype_name(std::get<0>(info.param)), std::get<1>(info.param),
                                              std::get<2>(info.param));
                         });

// Across simulated servers: remote blocks are received, then multiplied as
// each piece lands; both schedules, 1 to 3 members of a group per server
// (uneven too), with and without gather_out.
TEST(AllGatherMatmulAcrossServers, MatchesReferenceGemm) {
  struct Shape {
    int servers, world, tp;
  };
  for (Shape sh : {Shape{2, 4, 2}, Shape{2, 4, 1}, Shape{3, 4, 2}, Shape{3, 4, 1}, Shape{2, 5, 1}, Shape{2, 6, 1}}) {
    for (auto algo : {Schedule::kDirect, Schedule::kHierarchical}) {
      for (DType d : {DType::kF32, DType::kBF16}) {
        // 300 rows of 1 KiB (fp32) per rank and a 64 KiB ring: several network pieces and relay steps.
        for (Case cs : {Case{d, 5, 64, 16, true, true, ""}, Case{d, 300, 256, 24, true, false, "65536"},
                        Case{d, 300, 256, 24, false, true, "65536"}, Case{d, 0, 64, 16, true, true, ""}}) {
          cs.servers = sh.servers;
          cs.tp = sh.tp;
          cs.schedule = algo;
          SCOPED_TRACE(fmt::format("servers={} world={} tp={} {} {} m={} k={} gather_output={}", sh.servers, sh.world,
                                   sh.tp, algo == Schedule::kDirect ? "direct" : "hierarchical",
                                   dtype_name(d), cs.m, cs.k, cs.gather_output));
          fgtest::JobOptions jo;
          jo.servers = sh.servers;
          jo.timeout = std::chrono::milliseconds(20000);
          fgtest::expect_all_ok(fgtest::run_job(sh.world, [&](const Config& c) { return run_case(c, cs); }, jo));
        }
      }
    }
  }
}

TEST(AllGatherMatmulErrors, MismatchedKIsAnErrorOnEveryRank) {
  auto results = fgtest::run_job(2, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    const int64_t k = c.rank == 0 ? 64 : 32, m = c.rank == 0 ? 4 : 8;  // same bytes, different k
    Tensor x1 = Tensor::zeros(DType::kF32, {m, k}), x2 = Tensor::zeros(DType::kF32, {k, 4});
    Tensor out = Tensor::empty(DType::kF32, {2 * m, 4}), go = Tensor::empty(DType::kF32, {2 * m, k});
    Status s = all_gather_matmul(g, x1.view(), x2.view(), std::nullopt, out.view(), go.view());
    RANK_CHECK(s.kind() == ErrorKind::kMismatch, "expected a mismatch, got {}", s.to_string());
    RANK_CHECK(s.message().find("k=32") != std::string::npos && s.message().find("k=64") != std::string::npos,
               "message should name both k: {}", s.message());
    // The group is still usable after a mismatch.
    Tensor a = Tensor::zeros(DType::kF32, {4, 64}), b = Tensor::zeros(DType::kF32, {64, 4});
    Tensor o = Tensor::empty(DType::kF32, {8, 4}), og = Tensor::empty(DType::kF32, {8, 64});
    RANK_OK(all_gather_matmul(g, a.view(), b.view(), std::nullopt, o.view(), og.view()));
    return "";
  });
  fgtest::expect_all_ok(results);
}

TEST(AllGatherMatmulErrors, BadArgumentsAreRejectedLocally) {
  fgtest::expect_all_ok(fgtest::run_job(1, [](const Config& c) -> std::string {
    auto comm = Communicator::create(c);
    RANK_OK(comm.status());
    Group& g = (*comm)->world();
    Tensor x1 = Tensor::zeros(DType::kF16, {4, 8}), x2 = Tensor::zeros(DType::kF16, {8, 2});
    Tensor out = Tensor::empty(DType::kF16, {4, 2}), go = Tensor::empty(DType::kF16, {4, 8});
    auto expect_invalid = [&](const Status& s, const char* needle) -> std::string {
      if (s.kind() != ErrorKind::kInvalidArgument || s.message().find(needle) == std::string::npos) {
        return fmt::format("expected InvalidArgument mentioning '{}', got {}", needle, s.to_string());
      }
      return "";
    };
    Tensor wrong_k = Tensor::zeros(DType::kF16, {7, 2});
    if (auto e = expect_invalid(all_gather_matmul(g, x1.view(), wrong_k.view(), std::nullopt, out.view(), go.view()), "k=8"); !e.empty()) return e;
    Tensor i32 = Tensor::zeros(DType::kI32, {4, 8});
    if (auto e = expect_invalid(all_gather_matmul(g, i32.view(), x2.view(), std::nullopt, out.view(), go.view()), "supported dtypes"); !e.empty()) return e;
    Tensor small_out = Tensor::empty(DType::kF16, {3, 2});
    if (auto e = expect_invalid(all_gather_matmul(g, x1.view(), x2.view(), std::nullopt, small_out.view(), go.view()), "output"); !e.empty()) return e;
    Tensor f32_x2 = Tensor::zeros(DType::kF32, {8, 2});
    if (auto e = expect_invalid(all_gather_matmul(g, x1.view(), f32_x2.view(), std::nullopt, out.view(), go.view()), "x2 is fp32"); !e.empty()) return e;
    Tensor bad_bias = Tensor::zeros(DType::kF16, {3});
    if (auto e = expect_invalid(all_gather_matmul(g, x1.view(), x2.view(), bad_bias.view(), out.view(), go.view()), "bias"); !e.empty()) return e;
    if (auto e = expect_invalid(all_gather_matmul(g, x1.view(), x2.view(), std::nullopt, out.view(), TensorView{}), "gather_out"); !e.empty()) return e;
    if (auto e = expect_invalid(all_gather_matmul(g, x1.view(), x2.view(), std::nullopt, TensorView(x1.data(), DType::kF16, {4, 2}), go.view()), "overlaps"); !e.empty()) return e;
    return "";
  }));
}
