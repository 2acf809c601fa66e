// The reductions: all_reduce (dense and sparse COO, and coalesced),
// reduce_scatter in its forms, and reduce; every torch ReduceOp the library
// serves for the dtype, PREMUL_SUM as a sum of premultiplied inputs.
#include "backend.hpp"

#include "backend_parts.hpp"

namespace fastgather_torch {

// The library's reduction for torch's, for a tensor of this dtype: or a
// NotImplementedError naming the op, the reduction and the dtype.
fg::ReduceOp check_reduce(const char* op, const at::Tensor& t, const char* what, const c10d::ReduceOp& reduce_op) {
  check_tensor(t, op, what);
  static constexpr const char* kNames[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto r = static_cast<unsigned>(reduce_op.op_);
  if (r == c10d::ReduceOp::PREMUL_SUM) {
    // A sum of the inputs each multiplied by the factor first (premultiplied()).
    TORCH_CHECK_NOT_IMPLEMENTED(t.is_floating_point() || t.is_complex(), "fastgather: ", op,
                                ": ReduceOp.PREMUL_SUM of ", t.scalar_type(),
                                " is not supported (floating and complex dtypes only)");
    TORCH_CHECK_VALUE(dynamic_cast<const c10d::PreMulSumSupplement*>(reduce_op.supplement_.get()) != nullptr,
                      "fastgather: ", op, ": ReduceOp.PREMUL_SUM without its factor");
    return fg::ReduceOp::kSum;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(r <= c10d::ReduceOp::BXOR, "fastgather: ", op, ": ReduceOp.",
                              r < std::size(kNames) ? kNames[r] : "?", " is not supported. ", kOnlyThese);
  const auto ours = static_cast<fg::ReduceOp>(r);  // the same order: SUM .. BXOR
  const auto st = t.scalar_type();
  const bool known = st == at::kFloat || st == at::kHalf || st == at::kBFloat16 || st == at::kDouble ||
                     st == at::kChar || st == at::kByte || st == at::kShort || st == at::kInt || st == at::kLong ||
                     st == at::kBool || st == at::kComplexFloat || st == at::kComplexDouble;
  // A complex number is a pair of reals: summed and averaged as such, and
  // nothing else (a product or a minimum of pairs is not of the numbers).
  const bool complex = st == at::kComplexFloat || st == at::kComplexDouble;
  TORCH_CHECK_NOT_IMPLEMENTED(known && (!complex || r <= c10d::ReduceOp::AVG) &&
                                  fg::reducible(ours, library_dtype(t).first),
                              "fastgather: ", op, ": ReduceOp.", kNames[r], " of ", st,
                              " is not supported (sum, product, min and max take every real dtype; avg floating "
                              "ones and complex; band, bor and bxor integers and bool; complex: sum and avg)");
  return ours;
}

namespace {

// PREMUL_SUM: every rank's input times the factor (a scalar, or a tensor of
// one element), in the input's dtype, to be summed; other reductions: t.
at::Tensor premultiplied(const at::Tensor& t, const c10d::ReduceOp& reduce_op) {
  if (reduce_op.op_ != c10d::ReduceOp::PREMUL_SUM) return t;
  const auto* s = static_cast<const c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
  return s->tensor_factor.defined() ? t.mul(s->tensor_factor.to(t.scalar_type())) : t.mul(s->double_factor);
}

// The contiguous tensor an in-place reduction works on: t itself, or a copy
// (t is not contiguous, or PREMUL_SUM's t x factor) copied back into t once done.
at::Tensor reduce_buffer(FastgatherWork& work, at::Tensor& t, const c10d::ReduceOp& reduce_op) {
  at::Tensor buf = premultiplied(t, reduce_op).contiguous();
  if (!buf.is_same(t)) chain_copy(work, t, buf);
  work.flight().keep.push_back(buf);
  return buf;
}

}  // namespace

// Reductions (fg::all_reduce, fg::reduce_scatter): every element reduced in
// group-rank order, the same bits on every rank.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allreduce(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: all_reduce takes one tensor, got ", tensors.size());
  at::Tensor& t = tensors[0];
  if (t.defined() && t.layout() == at::kSparse) return allreduce_sparse(t, opts);
  const fg::ReduceOp red = check_reduce("all_reduce", t, "the tensor", opts.reduceOp);
  auto work = make_work(c10d::OpType::ALLREDUCE, tensors);
  const at::Tensor buf = reduce_buffer(*work, t, opts.reduceOp);
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_reduce(g, view_of(buf), view_of(buf), {.op = red}); });
  return submit(work, opts.asyncOp);
}

// A sparse COO tensor, summed as gloo sums one: every rank's coalesced
// indices and values gathered (their counts first: this call waits for that
// small all-gather), then the entries that coincide added up, and the sum
// written into the tensor once the gathers are done.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allreduce_sparse(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  constexpr const char* kOp = "all_reduce of a sparse tensor";
  TORCH_CHECK_NOT_IMPLEMENTED(opts.reduceOp == c10d::ReduceOp::SUM, "fastgather: ", kOp,
                              " takes ReduceOp.SUM only (as gloo does)");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "fastgather: ", kOp, ": the tensor is on ", t.device(), ", not the CPU");
  const at::Tensor c = t.coalesce();
  const at::Tensor idx = c._indices().contiguous();  // (sparse_dim, nnz), int64
  const at::Tensor val = c._values().contiguous();   // (nnz, dense sizes...)
  const int64_t sparse_dim = c.sparse_dim();
  int64_t row = 1;  // elements of one entry's value
  for (int64_t d = sparse_dim; d < c.dim(); ++d) row *= c.size(d);
  // The library's elements per torch element (a complex number is two reals).
  const int64_t per = val.is_complex() ? 2 : (library_dtype(val).first == fg::DType::kU8 ? val.element_size() : 1);
  at::Tensor nnz_mine = at::full({1}, c._nnz(), at::kLong);
  at::Tensor nnz_all = at::empty({size_}, at::kLong);
  {
    fg::Status s;
    without_gil([&] { s = fg::all_gather(group(), view_of(nnz_mine), view_of(nnz_all)); });
    if (!s.ok()) raise(s);
  }
  std::vector<int64_t> nnz(nnz_all.data_ptr<int64_t>(), nnz_all.data_ptr<int64_t>() + size_);
  std::vector<int64_t> idx_counts, val_counts;
  int64_t total = 0;
  for (int64_t n : nnz) {
    TORCH_CHECK_VALUE(n >= 0, "fastgather: ", kOp, ": a rank has ", n, " entries");
    idx_counts.push_back(sparse_dim * n);
    val_counts.push_back(row * n * per);
    total += n;
  }
  std::vector<int64_t> val_shape{total};
  for (int64_t d = sparse_dim; d < c.dim(); ++d) val_shape.push_back(c.size(d));
  at::Tensor idx_all = at::empty({sparse_dim * total}, at::kLong);
  at::Tensor val_all = at::empty(val_shape, val.options());
  auto work = make_work(c10d::OpType::ALLREDUCE, {t});
  work->flight().keep.insert(work->flight().keep.end(), {idx, val, idx_all, val_all});
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_gather_v(g, view_of(idx), view_of(idx_all), idx_counts); });
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_gather_v(g, view_of(val), view_of(val_all), val_counts); });
  work->flight().on_success = [t, idx_all, val_all, nnz, sparse_dim]() mutable {
    std::vector<at::Tensor> parts;
    int64_t off = 0;
    for (int64_t n : nnz) {
      parts.push_back(idx_all.narrow(0, off, sparse_dim * n).view({sparse_dim, n}));
      off += sparse_dim * n;
    }
    t.copy_(at::sparse_coo_tensor(at::cat(parts, 1), val_all, t.sizes()).coalesce());
  };
  return submit(work, opts.asyncOp);
}

// One library request per tensor under one Work (torch's coalescing
// manager, all_reduce_coalesced); every tensor checked before the first starts.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                           const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* kOp = "all_reduce_coalesced";
  fg::ReduceOp red = fg::ReduceOp::kSum;
  for (const at::Tensor& t : tensors) red = check_reduce(kOp, t, "a tensor", opts.reduceOp);
  auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  for (at::Tensor& t : tensors) {
    const at::Tensor buf = reduce_buffer(*work, t, opts.reduceOp);
    start(*work, group(), [&](fg::Group& g) { return fg::start_all_reduce(g, view_of(buf), view_of(buf), {.op = red}); });
  }
  return submit(work, opts.asyncOp);
}

// DTensor's Partial -> Shard and sequence parallelism reach reduce_scatter_tensor this way.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastgather: ", kOp, ": ", inputs.size(), " inputs but ",
                    outputs.size(), " outputs");
  fg::ReduceOp red = fg::ReduceOp::kSum;
  for (size_t i = 0; i < inputs.size(); ++i) red = check_reduce_scatter(kOp, outputs[i], inputs[i], opts.reduceOp);
  auto work = make_work(c10d::OpType::COALESCED, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    add_reduce_scatter(*work, outputs[i], premultiplied(inputs[i], opts.reduceOp).contiguous(), red);
  }
  return submit(work, opts.asyncOp);
}

fg::ReduceOp ProcessGroupFastgather::check_reduce_scatter(const char* op, const at::Tensor& output,
                                                          const at::Tensor& input, const c10d::ReduceOp& reduce_op) const {
  const fg::ReduceOp red = check_reduce(op, input, "the input", reduce_op);
  check_reduce(op, output, "the output", reduce_op);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "fastgather: ", op, ": the output is ",
                   output.scalar_type(), ", the input ", input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "fastgather: ", op, ": the input is ",
                    input.scalar_type(), input.sizes(), "; ", size_, " ranks x output ", output.scalar_type(),
                    output.sizes(), " need ", output.numel() * size_, " elements");
  return red;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                            const c10d::ReduceScatterOptions& opts) {
  const fg::ReduceOp red = check_reduce_scatter("reduce_scatter_tensor", output, input, opts.reduceOp);
  auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  add_reduce_scatter(*work, output, premultiplied(input, opts.reduceOp).contiguous(), red);
  return submit(work, opts.asyncOp);
}

// outputs[0] = the sum over ranks of their inputs[0][group rank].
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                                      const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter";
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1, "fastgather: ", kOp,
                    " takes one output and one input list, got ", outputs.size(), " and ", inputs.size());
  at::Tensor& output = outputs[0];
  const fg::ReduceOp red = check_reduce(kOp, output, "the output", opts.reduceOp);
  TORCH_CHECK_VALUE(static_cast<int>(inputs[0].size()) == size_, "fastgather: ", kOp, " needs ", size_,
                    " input tensors (one per rank of the group), got ", inputs[0].size());
  std::vector<at::Tensor> flat;
  for (const at::Tensor& in : inputs[0]) {
    check_reduce(kOp, in, "an input", opts.reduceOp);
    TORCH_CHECK_VALUE(in.scalar_type() == output.scalar_type() && in.numel() == output.numel(), "fastgather: ", kOp,
                      ": an input is ", in.scalar_type(), in.sizes(), ", the output ", output.scalar_type(),
                      output.sizes());
    flat.push_back(premultiplied(in, opts.reduceOp).reshape({-1}));
  }
  auto work = make_work(c10d::OpType::REDUCE_SCATTER, outputs);
  add_reduce_scatter(*work, output, at::cat(flat), red);
  return submit(work, opts.asyncOp);
}

// input: contiguous, group.size() chunks of output's size.
void ProcessGroupFastgather::add_reduce_scatter(FastgatherWork& work, const at::Tensor& output,
                                                const at::Tensor& input, fg::ReduceOp red) {
  at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
  if (!out.is_same(output)) chain_copy(work, output, out);
  work.flight().keep.push_back(input);
  work.flight().keep.push_back(out);
  start(work, group(),
        [&](fg::Group& g) { return fg::start_reduce_scatter(g, view_of(input), view_of(out), {.op = red}); });
}

// The root's tensor = the reduction of every rank's (fg::reduce); the others' stay as they were.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::reduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::ReduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: reduce takes one tensor, got ", tensors.size());
  at::Tensor& t = tensors[0];
  const fg::ReduceOp red = check_reduce("reduce", t, "the tensor", opts.reduceOp);
  check_root("reduce", opts.rootRank);
  auto work = make_work(c10d::OpType::REDUCE, tensors);
  const int root = static_cast<int>(opts.rootRank);
  // Only the root's tensor takes the result (others' stay as they were, PREMUL_SUM's too).
  const at::Tensor buf = premultiplied(t, opts.reduceOp).contiguous();
  if (!buf.is_same(t) && root == rank_) chain_copy(*work, t, buf);
  work->flight().keep.push_back(buf);
  start(*work, group(), [&](fg::Group& g) { return fg::start_reduce(g, view_of(buf), root, {.op = red}); });
  return submit(work, opts.asyncOp);
}

}  // namespace fastgather_torch
