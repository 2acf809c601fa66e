#include "cases.hpp"

#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "pattern.hpp"
#include "sums.hpp"

namespace fastgather::bench {
namespace {

std::string block_error(const std::string& what, int rank, long long bad, uint64_t it) {
  return fmt::format("{}: block of rank {} wrong at byte {} (iteration {})", what, rank, bad, it);
}

// An input tensor: from the group's symmetric heap when the shape says so.
Tensor input_tensor(Group& g, const CaseShape& s, std::vector<int64_t> shape) {
  if (!s.symmetric) return Tensor::empty(s.dtype, std::move(shape));
  auto t = g.empty(s.dtype, std::move(shape));
  if (!t.ok()) throw std::runtime_error(t.status().message());
  return std::move(t).value();
}

// One set of buffers per variant; iteration i uses set i % variants.
struct Buffers {
  Tensor in, out;
  std::vector<Tensor> outs;
  std::vector<TensorView> views;
};

class AllGatherCase : public Case {
 public:
  enum class Form { kContiguous, kList, kStagedList };

  AllGatherCase(Group& g, const CaseShape& s, Form form, AllGatherOptions options = {})
      : g_(g), form_(form), options_(options) {
    stats_out_ = s.shares ? &stats_ : nullptr;
    options_.stats = stats_out_;
    op = form == Form::kContiguous ? "all_gather" : "all_gather_list";
    impl = options.schedule == Schedule::kAuto ? "fastgather" : to_string(options.schedule);
    if (form == Form::kStagedList) impl = "staged";
    m = s.m;
    dtype = s.dtype;
    for (int v = 0; v < std::max(s.variants, 1); ++v) {
      Buffers b;
      b.in = input_tensor(g, s, {s.m, s.hidden});
      if (form == Form::kContiguous) {
        b.out = Tensor::empty(s.dtype, {s.m * g.size(), s.hidden});
      } else {
        for (int i = 0; i < g.size(); ++i) {
          b.outs.push_back(Tensor::empty(s.dtype, {s.m, s.hidden}));
          b.views.push_back(b.outs.back().view());
        }
      }
      bytes_per_rank = b.in.nbytes();
      sets_.push_back(std::move(b));
    }
    for (size_t v = 0; v < sets_.size(); ++v) fill(sets_[v], v);
  }

  Status run(uint64_t it) override {
    Buffers& b = sets_[it % sets_.size()];
    Status s;
    switch (form_) {
      case Form::kContiguous: s = all_gather(g_, b.in.view(), b.out.view(), options_); break;
      case Form::kList: s = all_gather(g_, b.in.view(), std::span<const TensorView>(b.views), options_); break;
      case Form::kStagedList: return staged(b);
    }
    account(stats_);
    return s;
  }
  void prepare(uint64_t it) override { fill(sets_[it % sets_.size()], it); }
  std::string verify(uint64_t it) override {
    const Buffers& b = sets_[it % sets_.size()];
    for (int i = 0; i < g_.size(); ++i) {
      const void* block = form_ == Form::kContiguous ? b.out.data_as<char>() + static_cast<size_t>(i) * bytes_per_rank
                                                     : b.outs[i].data();
      long long bad = pattern::find_mismatch(block, bytes_per_rank, g_.ranks()[i], it);
      if (bad >= 0) return block_error(op + "/" + impl, g_.ranks()[i], bad, it);
    }
    return {};
  }

 private:
  void fill(Buffers& b, uint64_t it) { pattern::fill(b.in.data(), bytes_per_rank, g_.ranks()[g_.rank()], it); }

  Status staged(Buffers& b) {
    auto t = Clock::now();
    Tensor flat = Tensor::empty(dtype, {static_cast<int64_t>(bytes_per_rank / dtype_size(dtype)) * g_.size()});
    lap("alloc", &t);
    if (Status s = all_gather(g_, b.in.view(), flat.view()); !s.ok()) return s;
    lap("gather_flat", &t);
    for (int i = 0; i < g_.size(); ++i) {
      std::memcpy(b.outs[i].data(), flat.data_as<char>() + static_cast<size_t>(i) * bytes_per_rank, bytes_per_rank);
    }
    lap("copy_back", &t);
    Status s = barrier(g_);  // the per-call stream/rank synchronisation
    lap("sync", &t);
    return s;
  }

  Group& g_;
  Form form_;
  AllGatherOptions options_;
  std::vector<Buffers> sets_;
};

class AllGatherMatmulCase : public Case {
 public:
  AllGatherMatmulCase(Group& g, const CaseShape& s, bool fused) : g_(g), fused_(fused), k_(s.hidden), n_(s.n) {
    stats_out_ = s.shares ? &stats_ : nullptr;
    op = "all_gather_matmul";
    impl = fused ? "fastgather" : "unfused";
    m = s.m;
    dtype = s.dtype;
    const int w = g.size();
    x2_ = Tensor::empty(s.dtype, {s.hidden, s.n});
    out_ = Tensor::empty(s.dtype, {s.m * w, s.n});
    gather_ = Tensor::empty(s.dtype, {s.m * w, s.hidden});
    for (int v = 0; v < std::max(s.variants, 1); ++v) x1_.push_back(input_tensor(g, s, {s.m, s.hidden}));
    bytes_per_rank = x1_.front().nbytes();
    b_.resize(static_cast<size_t>(k_ * n_));
    for (size_t i = 0; i < b_.size(); ++i) b_[i] = exact_value(1000, 0, i);
    store_floats(dtype, b_.data(), x2_.data(), b_.size());
    for (size_t v = 0; v < x1_.size(); ++v) prepare(v);
  }

  Status run(uint64_t it) override {
    const Tensor& x1 = x1_[it % x1_.size()];
    if (fused_) {
      AllGatherMatmulOptions opt;
      opt.stats = stats_out_;
      Status s = all_gather_matmul(g_, x1.view(), x2_.view(), std::nullopt, out_.view(), gather_.view(), opt);
      account(stats_);
      return s;
    }
    // Unfused: gather everything, then convert and multiply the whole matrix.
    auto t = Clock::now();
    if (Status s = all_gather(g_, x1.view(), gather_.view()); !s.ok()) return s;
    lap("gather", &t);
    const size_t rows = static_cast<size_t>(m * g_.size());
    if (dtype == DType::kF32) {  // nothing to convert
      if (rows != 0) sgemm_f32(static_cast<int64_t>(rows), n_, k_, gather_.data_as<float>(), x2_.data_as<float>(), out_.data_as<float>());
      lap("gemm", &t);
      return Status::Ok();
    }
    a32_.resize(rows * k_);
    b32_.resize(static_cast<size_t>(k_ * n_));
    c32_.resize(rows * n_);
    const int64_t r = static_cast<int64_t>(rows);
    if (Status s = convert(gather_.view(), TensorView(a32_.data(), DType::kF32, {r, k_})); !s.ok()) return s;
    if (Status s = convert(x2_.view(), TensorView(b32_.data(), DType::kF32, {k_, n_})); !s.ok()) return s;
    lap("convert", &t);
    if (rows != 0) sgemm_f32(r, n_, k_, a32_.data(), b32_.data(), c32_.data());
    lap("gemm", &t);
    if (Status s = convert(TensorView(c32_.data(), DType::kF32, {r, n_}), out_.view()); !s.ok()) return s;
    lap("convert", &t);
    return Status::Ok();
  }

  void prepare(uint64_t it) override {
    std::vector<float> a(static_cast<size_t>(m * k_));
    fill_rows(g_.ranks()[g_.rank()], it, 0, m, a.data());
    store_floats(dtype, a.data(), x1_[it % x1_.size()].data(), a.size());
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
        store_floats(dtype, a.data(), expect.data(), static_cast<size_t>(rows * k_));
        if (std::memcmp(expect.data(), gather_.data_as<char>() + grow * k_ * elt, rows * k_ * elt) != 0) {
          return fmt::format("all_gather_matmul/{}: gather_out rows {}..{} (rank {}) differ from the input (iteration {})",
                             impl, grow, grow + rows, g_.ranks()[i], it);
        }
        sgemm_f32(rows, n_, k_, a.data(), b_.data(), c.data());
        store_floats(dtype, c.data(), expect.data(), static_cast<size_t>(rows * n_));
        if (std::memcmp(expect.data(), out_.data_as<char>() + grow * n_ * elt, rows * n_ * elt) != 0) {
          return fmt::format("all_gather_matmul/{}: output rows {}..{} differ from the reference GEMM (iteration {})",
                             impl, grow, grow + rows, it);
        }
      }
    }
    return {};
  }

  // The GEMM of the gathered matrix in fp32, at this machine's single-thread speed.
  double compute_floor_us() override { return sgemm_floor_us(m * g_.size(), n_, k_, b_.data()); }

 private:
  void fill_rows(int rank, uint64_t it, int64_t r0, int64_t rows, float* dst) const {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k_; ++j) dst[r * k_ + j] = exact_value(rank, it, static_cast<size_t>((r0 + r) * k_ + j));
    }
  }

  Group& g_;
  bool fused_;
  int64_t k_, n_;
  std::vector<Tensor> x1_;
  Tensor x2_, out_, gather_;
  std::vector<float> b_, a32_, b32_, c32_;
};

}  // namespace

std::unique_ptr<Case> make_all_gather(Group& g, const CaseShape& s) {
  return std::make_unique<AllGatherCase>(g, s, AllGatherCase::Form::kContiguous);
}
std::unique_ptr<Case> make_all_gather_with(Group& g, const CaseShape& s, Schedule schedule) {
  AllGatherOptions o;
  o.schedule = schedule;
  return std::make_unique<AllGatherCase>(g, s, AllGatherCase::Form::kContiguous, o);
}
std::unique_ptr<Case> make_private_all_gather(Group& g, const CaseShape& s) {
  CaseShape p = s;
  p.symmetric = false;
  auto c = std::make_unique<AllGatherCase>(g, p, AllGatherCase::Form::kContiguous);
  c->impl = "private";
  return c;
}
std::unique_ptr<Case> make_all_gather_list(Group& g, const CaseShape& s) {
  return std::make_unique<AllGatherCase>(g, s, AllGatherCase::Form::kList);
}
std::unique_ptr<Case> make_staged_all_gather_list(Group& g, const CaseShape& s) {
  return std::make_unique<AllGatherCase>(g, s, AllGatherCase::Form::kStagedList);
}
namespace {

// A case with one input (from the heap where the shape says) and one output,
// each m x hidden, per variant: all_to_all's and send/recv's. The derived
// constructor fills the inputs (prepare() is theirs).
class InOutCase : public Case {
 protected:
  InOutCase(Group& g, const CaseShape& s, const char* name) : g_(g) {
    op = name;
    impl = "fastgather";
    m = s.m;
    dtype = s.dtype;
    for (int v = 0; v < std::max(s.variants, 1); ++v) {
      Buffers b;
      b.in = input_tensor(g, s, {s.m, s.hidden});
      b.out = Tensor::empty(s.dtype, {s.m, s.hidden});
      bytes_per_rank = b.in.nbytes();
      sets_.push_back(std::move(b));
    }
  }
  Buffers& set(uint64_t it) { return sets_[it % sets_.size()]; }
  size_t variants() const { return sets_.size(); }
  Group& g_;

 private:
  std::vector<Buffers> sets_;
};

class AllToAllCase : public InOutCase {
 public:
  AllToAllCase(Group& g, const CaseShape& s) : InOutCase(g, s, "all_to_all") {
    for (size_t v = 0; v < variants(); ++v) prepare(v);
  }
  Status run(uint64_t it) override { return all_to_all(g_, set(it).in.view(), set(it).out.view()); }
  void prepare(uint64_t it) override {
    pattern::fill_parts(set(it).in.data(), part(), g_.size(), g_.ranks()[g_.rank()], g_.ranks().data(), it);
  }
  std::string verify(uint64_t it) override {
    return check_all_to_all(set(it).out.data(), part(), g_.ranks(), g_.ranks()[g_.rank()], it, op + "/" + impl);
  }

 private:
  size_t part() const { return bytes_per_rank / static_cast<size_t>(g_.size()); }
};

// Each rank sends its m x hidden to the next group rank and receives the
// previous one's (a ring shift, as a pipeline's stages pass activations on).
class SendRecvCase : public InOutCase {
 public:
  SendRecvCase(Group& g, const CaseShape& s) : InOutCase(g, s, "send_recv") {
    for (size_t v = 0; v < variants(); ++v) prepare(v);
  }
  Status run(uint64_t it) override {
    Buffers& b = set(it);
    const int n = g_.size(), me = g_.rank();
    Request sent = start_send(g_, b.in.view(), (me + 1) % n);
    const Status got = recv(g_, b.out.view(), (me + n - 1) % n);
    const Status s = sent.wait();
    return got.ok() ? s : got;
  }
  void prepare(uint64_t it) override { pattern::fill(set(it).in.data(), bytes_per_rank, g_.ranks()[g_.rank()], it); }
  std::string verify(uint64_t it) override {
    const int from = g_.ranks()[static_cast<size_t>((g_.rank() + g_.size() - 1) % g_.size())];
    const long long bad = pattern::find_mismatch(set(it).out.data(), bytes_per_rank, from, it);
    return bad < 0 ? std::string() : fmt::format("send_recv/fastgather: rank {}'s message wrong at byte {} (iteration {})",
                                                 from, bad, it);
  }
};

}  // namespace

std::unique_ptr<Case> make_send_recv(Group& g, const CaseShape& s) { return std::make_unique<SendRecvCase>(g, s); }

std::string check_all_to_all(const void* out, size_t part_bytes, const std::vector<int>& members, int me, uint64_t it,
                             const std::string& what) {
  for (size_t i = 0; i < members.size(); ++i) {
    const long long bad = pattern::find_mismatch(static_cast<const char*>(out) + i * part_bytes, part_bytes,
                                                 pattern::part_key(members[i], me), it);
    if (bad >= 0) return fmt::format("{}: part from rank {} wrong at byte {} (iteration {})", what, members[i], bad, it);
  }
  return {};
}

std::unique_ptr<Case> make_all_to_all(Group& g, const CaseShape& s) { return std::make_unique<AllToAllCase>(g, s); }

std::unique_ptr<Case> make_all_gather_matmul(Group& g, const CaseShape& s) {
  return std::make_unique<AllGatherMatmulCase>(g, s, true);
}
std::unique_ptr<Case> make_unfused_all_gather_matmul(Group& g, const CaseShape& s) {
  return std::make_unique<AllGatherMatmulCase>(g, s, false);
}

}  // namespace fastgather::bench
