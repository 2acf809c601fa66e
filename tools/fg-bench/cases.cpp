#include "cases.hpp"

#include <cblas.h>

#include <vector>

#include <fmt/format.h>

#include "pattern.hpp"

namespace fastgather::bench {
namespace {

std::string block_error(const char* what, int rank, long long bad, uint64_t it) {
  return fmt::format("{}: block of rank {} wrong at byte {} (iteration {})", what, rank, bad, it);
}

class AllGatherCase : public Case {
 public:
  AllGatherCase(Group& g, const CaseShape& s, bool list) : g_(g), list_(list) {
    op = list ? "all_gather_list" : "all_gather";
    impl = "fastgather";
    m = s.m;
    dtype = s.dtype;
    in_ = Tensor::empty(s.dtype, {s.m, s.hidden});
    bytes_per_rank = in_.nbytes();
    if (list) {
      for (int i = 0; i < g.size(); ++i) {
        outs_.push_back(Tensor::empty(s.dtype, {s.m, s.hidden}));
        views_.push_back(outs_.back().view());
      }
    } else {
      out_ = Tensor::empty(s.dtype, {s.m * g.size(), s.hidden});
    }
    prepare(0);
  }
  Status run(uint64_t) override {
    return list_ ? all_gather(g_, in_.view(), std::span<const TensorView>(views_)) : all_gather(g_, in_.view(), out_.view());
  }
  void prepare(uint64_t it) override { pattern::fill(in_.data(), bytes_per_rank, g_.ranks()[g_.rank()], it); }
  std::string verify(uint64_t it) override {
    for (int i = 0; i < g_.size(); ++i) {
      const void* block = list_ ? outs_[i].data() : out_.data_as<char>() + static_cast<size_t>(i) * bytes_per_rank;
      long long bad = pattern::find_mismatch(block, bytes_per_rank, g_.ranks()[i], it);
      if (bad >= 0) return block_error(op.c_str(), g_.ranks()[i], bad, it);
    }
    return {};
  }

 private:
  Group& g_;
  bool list_;
  Tensor in_, out_;
  std::vector<Tensor> outs_;
  std::vector<TensorView> views_;
};

// Values k/8 for k in -8..7: exact in fp16 and bf16, and every dot product
// over hidden <= 2^12 terms is exact in fp32, so the expected output is
// known bit for bit whatever order the GEMM sums in.
float exact_value(int rank, uint64_t it, size_t index) {
  return static_cast<float>(static_cast<int>(pattern::word(rank, it, index) & 15u) - 8) * 0.125f;
}

class AllGatherMatmulCase : public Case {
 public:
  AllGatherMatmulCase(Group& g, const CaseShape& s) : g_(g), k_(s.hidden), n_(s.n) {
    op = "all_gather_matmul";
    impl = "fastgather";
    m = s.m;
    dtype = s.dtype;
    const int w = g.size();
    x1_ = Tensor::empty(s.dtype, {s.m, s.hidden});
    x2_ = Tensor::empty(s.dtype, {s.hidden, s.n});
    out_ = Tensor::empty(s.dtype, {s.m * w, s.n});
    gather_ = Tensor::empty(s.dtype, {s.m * w, s.hidden});
    bytes_per_rank = x1_.nbytes();
    b_.resize(static_cast<size_t>(k_ * n_));
    for (size_t i = 0; i < b_.size(); ++i) b_[i] = exact_value(1000, 0, i);
    store(b_.data(), x2_.data(), b_.size());
    prepare(0);
  }
  Status run(uint64_t) override {
    return all_gather_matmul(g_, x1_.view(), x2_.view(), std::nullopt, out_.view(), gather_.view());
  }
  void prepare(uint64_t it) override {
    std::vector<float> a(static_cast<size_t>(m * k_));
    fill_rows(g_.ranks()[g_.rank()], it, 0, m, a.data());
    store(a.data(), x1_.data(), a.size());
  }
  std::string verify(uint64_t it) override {
    const size_t elt = dtype_size(dtype);
    constexpr int64_t kBlock = 256;
    std::vector<float> a(static_cast<size_t>(kBlock * k_)), c(static_cast<size_t>(kBlock * n_));
    std::vector<char> expect(static_cast<size_t>(kBlock * std::max(k_, n_)) * elt);
    for (int i = 0; i < g_.size(); ++i) {
      for (int64_t r0 = 0; r0 < m; r0 += kBlock) {
        const int64_t rows = std::min(kBlock, m - r0);
        const int64_t grow = i * m + r0;  // row in the gathered matrix
        fill_rows(g_.ranks()[i], it, r0, rows, a.data());
        store(a.data(), expect.data(), static_cast<size_t>(rows * k_));
        if (std::memcmp(expect.data(), gather_.data_as<char>() + grow * k_ * elt, rows * k_ * elt) != 0) {
          return fmt::format("all_gather_matmul: gather_out rows {}..{} (rank {}) differ from the input (iteration {})",
                             grow, grow + rows, g_.ranks()[i], it);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(n_),
                    static_cast<int>(k_), 1.0f, a.data(), static_cast<int>(k_), b_.data(), static_cast<int>(n_), 0.0f,
                    c.data(), static_cast<int>(n_));
        store(c.data(), expect.data(), static_cast<size_t>(rows * n_));
        if (std::memcmp(expect.data(), out_.data_as<char>() + grow * n_ * elt, rows * n_ * elt) != 0) {
          return fmt::format("all_gather_matmul: output rows {}..{} differ from the reference GEMM (iteration {})", grow,
                             grow + rows, it);
        }
      }
    }
    return {};
  }

 private:
  void fill_rows(int rank, uint64_t it, int64_t r0, int64_t rows, float* dst) const {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k_; ++j) dst[r * k_ + j] = exact_value(rank, it, static_cast<size_t>((r0 + r) * k_ + j));
    }
  }
  void store(const float* src, void* dst, size_t count) const {
    for (size_t i = 0; i < count; ++i) {
      switch (dtype) {
        case DType::kF16: static_cast<uint16_t*>(dst)[i] = float_to_half(src[i]); break;
        case DType::kBF16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(src[i]); break;
        default: static_cast<float*>(dst)[i] = src[i]; break;
      }
    }
  }

  Group& g_;
  int64_t k_, n_;
  Tensor x1_, x2_, out_, gather_;
  std::vector<float> b_;
};

}  // namespace

std::unique_ptr<Case> make_all_gather(Group& g, const CaseShape& s) { return std::make_unique<AllGatherCase>(g, s, false); }
std::unique_ptr<Case> make_all_gather_list(Group& g, const CaseShape& s) { return std::make_unique<AllGatherCase>(g, s, true); }
std::unique_ptr<Case> make_all_gather_matmul(Group& g, const CaseShape& s) {
  return std::make_unique<AllGatherMatmulCase>(g, s);
}

}  // namespace fastgather::bench
