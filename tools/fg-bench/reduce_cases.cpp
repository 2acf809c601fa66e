// reduce_scatter and all_reduce as benchmark cases: inputs of exact values
// (sums.hpp), so check mode knows every element of every output.
#include <stdexcept>
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
      (void)convert(TensorView(tmp, DType::kF32, {static_cast<int64_t>(m)}), TensorView(d, dtype, {static_cast<int64_t>(m)}));
    }
  }
}

std::string check_exact_sums(DType dtype, const void* out, size_t first, size_t count, const std::vector<int>& ranks,
                             uint64_t it, const std::string& what) {
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
      float want = 0;
      for (int r : ranks) want += exact_value(r, it, first + at + i);
      if (got[i] != want) {
        return fmt::format("{}: element {} is {}, the sum is {} (iteration {})", what, first + at + i, got[i], want, it);
      }
    }
  }
  return {};
}

namespace {

class ReduceCase : public Case {
 public:
  ReduceCase(Group& g, const CaseShape& s, bool scatter) : g_(g), scatter_(scatter) {
    op = scatter ? "reduce_scatter" : "all_reduce";
    impl = "fastgather";
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
  std::string verify(uint64_t it) override {
    const size_t first = scatter_ ? static_cast<size_t>(g_.rank()) * out_count_ : 0;
    return check_exact_sums(dtype, outs_[it % outs_.size()].data(), first, out_count_, g_.ranks(), it, op + "/" + impl);
  }

 private:
  Group& g_;
  bool scatter_;
  size_t count_ = 0, out_count_ = 0;
  ReduceOptions options_;
  std::vector<Tensor> ins_, outs_;
};

}  // namespace

std::unique_ptr<Case> make_all_reduce(Group& g, const CaseShape& s) { return std::make_unique<ReduceCase>(g, s, false); }
std::unique_ptr<Case> make_reduce_scatter(Group& g, const CaseShape& s) { return std::make_unique<ReduceCase>(g, s, true); }

}  // namespace fastgather::bench
