// reduce_scatter and all_reduce as benchmark cases: inputs of exact values
// (sums.hpp), so check mode knows every element of every output.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "cases.hpp"
#include "sums.hpp"

namespace fastgather::bench {

void fill_exact(DType dtype, void* dst, size_t count, int rank, uint64_t it) {
  constexpr size_t kBlock = 4096;
  float tmp[kBlock];
  const size_t es = dtype_size(dtype);
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    for (size_t i = 0; i < m; ++i) tmp[i] = exact_value(rank, it, at + i);
    auto* d = static_cast<std::byte*>(dst) + at * es;
    if (dtype == DType::kF64) {
      for (size_t i = 0; i < m; ++i) reinterpret_cast<double*>(d)[i] = tmp[i];
    } else {
      store_floats(dtype, tmp, d, m);
    }
  }
}

void rewrite_lines(void* data, size_t bytes) {
  auto* b = static_cast<volatile unsigned char*>(data);
  for (size_t i = 0; i < bytes; i += 64) b[i] = b[i];
}

void store_floats(DType dtype, const float* src, void* dst, size_t count) {
  const int64_t n = static_cast<int64_t>(count);
  (void)convert(TensorView(src, DType::kF32, {n}), TensorView(dst, dtype, {n}));
}

void sgemm_f32(int64_t rows, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k),
              1.0f, a, static_cast<int>(k), b, static_cast<int>(n), 0.0f, c, static_cast<int>(n));
}

double sgemm_floor_us(int64_t rows, int64_t n, int64_t k, const float* b) {
  if (rows == 0 || n == 0) return 0;
  std::vector<float> a(static_cast<size_t>(rows * k), 0.5f), c(static_cast<size_t>(rows * n));
  double best = 1e300;
  for (int i = 0; i < 5; ++i) {
    const auto t = std::chrono::steady_clock::now();
    sgemm_f32(rows, n, k, a.data(), b, c.data());
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}

std::string check_exact_sums(DType dtype, const void* out, size_t first, size_t count, const std::vector<int>& ranks,
                             uint64_t it, const std::string& what, ReduceOp op) {
  // The average is the one result that is rounded: within half a unit of the dtype's last place.
  const float avg_slack = dtype == DType::kBF16 ? 1.0f / 128 : dtype == DType::kF16 ? 1.0f / 1024 : 1e-6f;
  constexpr size_t kBlock = 4096;
  float got[kBlock];
  const size_t es = dtype_size(dtype);
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const auto* o = static_cast<const std::byte*>(out) + at * es;
    if (dtype == DType::kF64) {
      for (size_t i = 0; i < m; ++i) got[i] = static_cast<float>(reinterpret_cast<const double*>(o)[i]);
    } else {
      (void)convert(TensorView(o, dtype, {static_cast<int64_t>(m)}), TensorView(got, DType::kF32, {static_cast<int64_t>(m)}));
    }
    for (size_t i = 0; i < m; ++i) {
      float want = op == ReduceOp::kSum || op == ReduceOp::kAvg ? 0.0f : exact_value(ranks.front(), it, first + at + i);
      for (int r : ranks) {
        const float v = exact_value(r, it, first + at + i);
        if (op == ReduceOp::kMin) want = std::min(want, v);
        else if (op == ReduceOp::kMax) want = std::max(want, v);
        else want += v;
      }
      bool right = got[i] == want;
      if (op == ReduceOp::kAvg) {
        want /= static_cast<float>(ranks.size());
        right = std::abs(got[i] - want) <= avg_slack * std::max(1.0f, std::abs(want));
      }
      if (!right) {
        return fmt::format("{}: element {} is {}, the {} is {} (iteration {})", what, first + at + i, got[i],
                           op == ReduceOp::kSum ? "sum" : op == ReduceOp::kAvg ? "average" : op == ReduceOp::kMin ? "minimum" : "maximum",
                           want, it);
      }
    }
  }
  return {};
}

namespace {

class ReduceCase : public Case {
 public:
  ReduceCase(Group& g, const CaseShape& s, bool scatter, Schedule schedule) : g_(g), scatter_(scatter) {
    op = scatter ? "reduce_scatter" : "all_reduce";
    impl = schedule == Schedule::kAuto ? "fastgather" : to_string(schedule);
    options_.schedule = schedule;
    options_.op = s.reduce_op;
    asked_ = s.reduce_op;
    m = s.m;
    dtype = s.dtype;
    count_ = static_cast<size_t>(s.m * s.hidden);
    const size_t n = static_cast<size_t>(g.size());
    if (scatter && count_ % n != 0) throw std::invalid_argument("reduce_scatter needs m * hidden divisible by the group size");
    out_count_ = scatter ? count_ / n : count_;
    options_.stats = s.shares ? &stats_ : nullptr;
    for (int v = 0; v < std::max(s.variants, 1); ++v) {
      if (s.symmetric) {
        auto t = g.empty(s.dtype, {static_cast<int64_t>(count_)});
        if (!t.ok()) throw std::runtime_error(t.status().message());
        ins_.push_back(std::move(t).value());
      } else {
        ins_.push_back(Tensor::empty(s.dtype, {static_cast<int64_t>(count_)}));
      }
      outs_.push_back(Tensor::empty(s.dtype, {static_cast<int64_t>(out_count_)}));
    }
    bytes_per_rank = ins_.front().nbytes();
    for (size_t v = 0; v < ins_.size(); ++v) prepare(v);
  }
  Status run(uint64_t it) override {
    const size_t v = it % ins_.size();
    return scatter_ ? reduce_scatter(g_, ins_[v].view(), outs_[v].view(), options_)
                    : all_reduce(g_, ins_[v].view(), outs_[v].view(), options_);
  }
  void prepare(uint64_t it) override {
    fill_exact(dtype, ins_[it % ins_.size()].data(), count_, g_.ranks()[g_.rank()], it);
  }
  void rewrite(uint64_t it) override { rewrite_lines(ins_[it % ins_.size()].data(), ins_[it % ins_.size()].nbytes()); }
  std::string verify(uint64_t it) override {
    const size_t first = scatter_ ? static_cast<size_t>(g_.rank()) * out_count_ : 0;
    return check_exact_sums(dtype, outs_[it % outs_.size()].data(), first, out_count_, g_.ranks(), it, op + "/" + impl,
                            asked_);
  }

 private:
  Group& g_;
  bool scatter_;
  size_t count_ = 0, out_count_ = 0;
  ReduceOptions options_;
  ReduceOp asked_ = ReduceOp::kSum;  // what the outputs are checked against (the call's own is options_.op)
  std::vector<Tensor> ins_, outs_;
};

// x1 (m * size, hidden) @ x2 (hidden, n) on every rank, reduce-scattered
// along rows into (m, n): fused, or the GEMM of the whole product in fp32,
// then reduce_scatter of it, then rounding into the output.
class MatmulReduceScatterCase : public Case {
 public:
  MatmulReduceScatterCase(Group& g, const CaseShape& s, bool fused) : g_(g), fused_(fused), k_(s.hidden), n_(s.n) {
    op = "matmul_reduce_scatter";
    impl = fused ? "fastgather" : "unfused";
    m = s.m;
    dtype = s.dtype;
    rows_ = s.m * g.size();
    x2_ = Tensor::empty(s.dtype, {k_, n_});
    out_ = Tensor::empty(s.dtype, {s.m, n_});
    for (int v = 0; v < std::max(s.variants, 1); ++v) x1_.push_back(Tensor::empty(s.dtype, {rows_, k_}));
    bytes_per_rank = static_cast<size_t>(rows_ * n_) * sizeof(float);  // the product each rank reduce-scatters
    b_.resize(static_cast<size_t>(k_ * n_));
    for (size_t i = 0; i < b_.size(); ++i) b_[i] = exact_value(1000, 0, i);
    store_floats(dtype, b_.data(), x2_.data(), b_.size());
    for (size_t v = 0; v < x1_.size(); ++v) prepare(v);
  }

  Status run(uint64_t it) override {
    const Tensor& x1 = x1_[it % x1_.size()];
    if (fused_) return matmul_reduce_scatter(g_, x1.view(), x2_.view(), std::nullopt, out_.view());
    auto t = Clock::now();
    const size_t rows = static_cast<size_t>(rows_);
    c32_.resize(rows * static_cast<size_t>(n_));
    const float* a = x1.data_as<float>();
    const float* b = x2_.data_as<float>();
    if (dtype != DType::kF32) {
      a32_.resize(rows * static_cast<size_t>(k_));
      b32_.resize(static_cast<size_t>(k_ * n_));
      if (Status s = convert(x1.view(), TensorView(a32_.data(), DType::kF32, {rows_, k_})); !s.ok()) return s;
      if (Status s = convert(x2_.view(), TensorView(b32_.data(), DType::kF32, {k_, n_})); !s.ok()) return s;
      a = a32_.data();
      b = b32_.data();
      lap("convert", &t);
    }
    if (rows != 0 && n_ != 0) sgemm_f32(rows_, n_, k_, a, b, c32_.data());
    lap("gemm", &t);
    const TensorView product(c32_.data(), DType::kF32, {rows_ * n_});
    if (dtype == DType::kF32) {
      Status s = reduce_scatter(g_, product, TensorView(out_.data(), DType::kF32, {m * n_}));
      lap("reduce_scatter", &t);
      return s;
    }
    r32_.resize(static_cast<size_t>(m * n_));
    if (Status s = reduce_scatter(g_, product, TensorView(r32_.data(), DType::kF32, {m * n_})); !s.ok()) return s;
    lap("reduce_scatter", &t);
    Status s = convert(TensorView(r32_.data(), DType::kF32, {m, n_}), out_.view());
    lap("convert", &t);
    return s;
  }

  void prepare(uint64_t it) override {
    fill_exact(dtype, x1_[it % x1_.size()].data(), static_cast<size_t>(rows_ * k_), g_.ranks()[g_.rank()], it);
  }

  // Every rank's product is exact in fp32 (sums.hpp), so the expected
  // output is the exact sum rounded once, whatever order either side sums in.
  std::string verify(uint64_t it) override {
    std::vector<float> a(static_cast<size_t>(m * k_)), c(static_cast<size_t>(m * n_)), sum(static_cast<size_t>(m * n_), 0.0f);
    const size_t first = static_cast<size_t>(g_.rank() * m * k_);
    for (int r : g_.ranks()) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = exact_value(r, it, first + i);
      if (m != 0 && n_ != 0) sgemm_f32(m, n_, k_, a.data(), b_.data(), c.data());
      for (size_t i = 0; i < c.size(); ++i) sum[i] += c[i];
    }
    std::vector<std::byte> expect(out_.nbytes());
    store_floats(dtype, sum.data(), expect.data(), sum.size());
    if (std::memcmp(expect.data(), out_.data(), expect.size()) != 0) {
      return fmt::format("matmul_reduce_scatter/{}: the output differs from the reference (iteration {})", impl, it);
    }
    return {};
  }

  // The GEMM of the whole product in fp32, at this machine's single-thread speed.
  double compute_floor_us() override { return sgemm_floor_us(rows_, n_, k_, b_.data()); }

 private:
  Group& g_;
  bool fused_;
  int64_t k_, n_, rows_ = 0;
  std::vector<Tensor> x1_;
  Tensor x2_, out_;
  std::vector<float> b_, a32_, b32_, c32_, r32_;
};

}  // namespace

std::unique_ptr<Case> make_matmul_reduce_scatter(Group& g, const CaseShape& s) {
  return std::make_unique<MatmulReduceScatterCase>(g, s, true);
}
std::unique_ptr<Case> make_unfused_matmul_reduce_scatter(Group& g, const CaseShape& s) {
  return std::make_unique<MatmulReduceScatterCase>(g, s, false);
}

std::unique_ptr<Case> make_all_reduce(Group& g, const CaseShape& s, Schedule schedule) {
  return std::make_unique<ReduceCase>(g, s, false, schedule);
}
std::unique_ptr<Case> make_reduce_scatter(Group& g, const CaseShape& s, Schedule schedule) {
  return std::make_unique<ReduceCase>(g, s, true, schedule);
}

}  // namespace fastgather::bench
