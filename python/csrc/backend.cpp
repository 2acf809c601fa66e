#include "backend.hpp"

#include <Python.h>
#include <pybind11/pybind11.h>

#include <map>
#include <mutex>

#include "store.hpp"

namespace fastgather_torch {
namespace {

constexpr const char* kOnlyThese =
    "fastgather serves all_gather, all_gather_into_tensor, all_gather_coalesced, "
    "all_gather_into_tensor_coalesced, all_reduce, all_reduce_coalesced, reduce, reduce_scatter, "
    "reduce_scatter_tensor and its coalesced form (sum, avg, product, min, max, band, bor, bxor, premul_sum), "
    "broadcast, "
    "gather, scatter, all_to_all, all_to_all_single, barrier, and send, recv and recv from any source between "
    "ranks of one server; for other ops "
    "keep a gloo world "
    "(init_process_group(\"gloo\", ...)) and make the groups that gather and reduce with "
    "dist.new_group(ranks, backend=\"fastgather\")";

// hcom names -> groups, for all_gather_base_mm (the role of get_hccl_comm_name).
// Weak: a name does not keep its group alive. A group leaves the map when its
// last strong reference goes (release_resources: with a weak reference out,
// the object itself is freed only when that goes too). Never destroyed, so
// that a group released during exit still finds it.
struct Names {
  std::mutex mu;
  std::map<std::string, c10::weak_intrusive_ptr<ProcessGroupFastgather>> map;
  int serial = 0;
};
Names& names() {
  static Names* n = new Names;
  return *n;
}

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

// PREMUL_SUM: every rank's input times the factor (a scalar, or a tensor of
// one element), in the input's dtype, to be summed; other reductions: t.
at::Tensor premultiplied(const at::Tensor& t, const c10d::ReduceOp& reduce_op) {
  if (reduce_op.op_ != c10d::ReduceOp::PREMUL_SUM) return t;
  const auto* s = static_cast<const c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
  return s->tensor_factor.defined() ? t.mul(s->tensor_factor.to(t.scalar_type())) : t.mul(s->double_factor);
}

// Once the requests are done: the user's tensor gets the contiguous buffer's bytes.
void chain_copy(FastgatherWork& work, at::Tensor user, at::Tensor buf) {
  auto before = std::move(work.flight().on_success);
  work.flight().on_success = [before = std::move(before), user, buf]() mutable {
    if (before) before();
    user.copy_(buf);
  };
}

// The contiguous tensor an in-place reduction works on: t itself, or a copy
// (t is not contiguous, or PREMUL_SUM's t x factor) copied back into t once done.
at::Tensor reduce_buffer(FastgatherWork& work, at::Tensor& t, const c10d::ReduceOp& reduce_op) {
  at::Tensor buf = premultiplied(t, reduce_op).contiguous();
  if (!buf.is_same(t)) chain_copy(work, t, buf);
  work.flight().keep.push_back(buf);
  return buf;
}

// Starts one library request of the work (the flight is not shared yet).
template <class Start>
void start(FastgatherWork& work, fg::Group& g, Start&& how) {
  work.flight().requests.push_back(how(g));
}

}  // namespace

ProcessGroupFastgather::ProcessGroupFastgather(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                               std::chrono::milliseconds timeout, std::optional<fg::Settings> settings)
    : c10d::Backend(rank, size) {
  fg::Config c;
  c.rank = rank;
  c.world_size = size;
  c.servers = 0;  // find the ranks that share this host
  c.timeout = timeout;
  c.settings = std::move(settings);
  auto comm = fg::Communicator::create(c, std::make_shared<C10dStore>(store));
  if (!comm.ok()) raise(comm.status());
  comm_ = std::move(comm).value();
}

ProcessGroupFastgather::~ProcessGroupFastgather() { shutdown(); }

void ProcessGroupFastgather::release_resources() {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  if (!name_.empty()) n.map.erase(name_);
}

std::string ProcessGroupFastgather::comm_name() {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  if (name_.empty()) {
    name_ = "fastgather-" + std::to_string(++n.serial);
    n.map.insert_or_assign(name_, c10::weak_intrusive_ptr<ProcessGroupFastgather>(
                                      c10::intrusive_ptr<ProcessGroupFastgather>::reclaim_copy(this)));
  }
  return name_;
}

c10::intrusive_ptr<ProcessGroupFastgather> find_group(const std::string& hcom) {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  auto it = n.map.find(hcom);
  c10::intrusive_ptr<ProcessGroupFastgather> pg = it == n.map.end() ? nullptr : it->second.lock();
  TORCH_CHECK_VALUE(pg != nullptr, "fastgather: no fastgather group is named '", hcom,
                    "' in this process (get it from fastgather.get_comm_name(group, rank))");
  return pg;
}

fg::Communicator& ProcessGroupFastgather::live() const {
  TORCH_CHECK(comm_ != nullptr, "fastgather: this group was shut down (destroy_process_group)");
  return *comm_;
}

c10::intrusive_ptr<FastgatherWork> ProcessGroupFastgather::make_work(c10d::OpType type, std::vector<at::Tensor> result) {
  live();
  return c10::make_intrusive<FastgatherWork>(c10::intrusive_ptr<ProcessGroupFastgather>::reclaim_copy(this), rank_,
                                             type, std::move(result));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::submit(const c10::intrusive_ptr<FastgatherWork>& work) {
  work->submitted();
  seq_.fetch_add(1, std::memory_order_relaxed);
  return work;
}

// The communicator's finalize() completes what was started and waits for
// the completion callbacks, which may be Python's (a Future's .then): they
// need the GIL this thread may hold.
void ProcessGroupFastgather::shutdown() {
  if (!comm_) return;
  std::unique_ptr<fg::Communicator> comm = std::move(comm_);
  auto end = [&] { (void)comm->finalize(); };  // its error (a peer gone) was each op's to report
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    end();
  } else {
    end();
  }
}

void ProcessGroupFastgather::abort() {
  if (comm_) comm_->abort();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& /*opts*/) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                    "fastgather: all_gather takes one input and one output list, got ", inputs.size(), " and ",
                    outputs.size());
  auto work = make_work(c10d::OpType::ALLGATHER, outputs[0]);
  add_list_gather(*work, "all_gather", outputs[0], inputs[0]);
  return submit(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  // output_lists[r][i] receives group rank r's inputs[i].
  constexpr const char* kOp = "all_gather_coalesced";
  TORCH_CHECK_VALUE(static_cast<int>(output_lists.size()) == size_, "fastgather: ", kOp, " needs ", size_,
                    " output lists (one per rank of the group), got ", output_lists.size());
  std::vector<std::vector<at::Tensor>> per_input(inputs.size());
  std::vector<at::Tensor> flat;
  for (auto& l : output_lists) {
    TORCH_CHECK_VALUE(l.size() == inputs.size(), "fastgather: ", kOp, ": an output list holds ", l.size(),
                      " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < l.size(); ++i) per_input[i].push_back(l[i]);
    flat.insert(flat.end(), l.begin(), l.end());
  }
  // Every argument is checked before the first request starts: a rank
  // must not start half of a collective its peers will not finish.
  for (size_t i = 0; i < inputs.size(); ++i) check_list_gather(kOp, per_input[i], inputs[i]);
  auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, flat);
  for (size_t i = 0; i < inputs.size(); ++i) add_list_gather(*work, kOp, per_input[i], inputs[i]);
  return submit(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::AllgatherOptions& /*opts*/) {
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, {output});
  add_tensor_gather(*work, "all_gather_into_tensor", output, input);
  return submit(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& /*opts*/) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastgather: all_gather_into_tensor_coalesced: ", inputs.size(),
                    " inputs but ", outputs.size(), " outputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor_gather("all_gather_into_tensor_coalesced", outputs[i], inputs[i]);
  }
  auto work = make_work(c10d::OpType::COALESCED, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    add_tensor_gather(*work, "all_gather_into_tensor_coalesced", outputs[i], inputs[i]);
  }
  return submit(work);
}

// The root's tensor is written once and read by the others (fg::broadcast).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::broadcast(std::vector<at::Tensor>& tensors,
                                                                 const c10d::BroadcastOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: broadcast takes one tensor, got ", tensors.size());
  at::Tensor& t = tensors[0];
  check_tensor(t, "broadcast", "the tensor");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_, "fastgather: broadcast root ", opts.rootRank,
                    " is outside the group of ", size_);
  auto work = make_work(c10d::OpType::BROADCAST, tensors);
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  if (!buf.is_same(t)) chain_copy(*work, t, buf);
  work->flight().keep.push_back(buf);
  start(*work, group(),
        [&](fg::Group& g) { return fg::start_broadcast(g, view_of(buf), static_cast<int>(opts.rootRank)); });
  return submit(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::barrier(const c10d::BarrierOptions& /*opts*/) {
  auto work = make_work(c10d::OpType::BARRIER, {});
  start(*work, group(), [](fg::Group& g) { return fg::start_barrier(g); });
  return submit(work);
}

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
  return submit(work);
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
    auto gather_counts = [&] { s = fg::all_gather(group(), view_of(nnz_mine), view_of(nnz_all)); };
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release nogil;
      gather_counts();
    } else {
      gather_counts();
    }
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
  return submit(work);
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
  return submit(work);
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
  return submit(work);
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
  return submit(work);
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
  return submit(work);
}

#define FG_UNSUPPORTED(op, name, ...)                                                                        \
  c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::op(__VA_ARGS__) {                                   \
    C10_THROW_ERROR(NotImplementedError,                                                                     \
                    std::string("fastgather: ") + name + " is not supported by this backend. " + kOnlyThese); \
  }
FG_UNSUPPORTED(allreduce_sparse, "allreduce_sparse", std::vector<at::Tensor>&, const c10d::AllreduceOptions&)
#undef FG_UNSUPPORTED

// Point-to-point: the library's send and recv, beside the collectives
// (fastgather/ops.hpp). Only the two ranks take part, so no sequence number
// is counted (it must be the same on every member of the group).
namespace {
at::Tensor& one_tensor(const char* op, std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: ", op, " takes one tensor, got ", tensors.size());
  check_tensor(tensors[0], op, "the tensor");
  return tensors[0];
}
}  // namespace

void ProcessGroupFastgather::check_peer(const char* op, int peer) const {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size_ && peer != rank_, "fastgather: ", op, ": rank ", peer,
                    peer == rank_ ? " is this rank itself" : " is not a rank of the group", " (group of ", size_,
                    ", this rank ", rank_, ")");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = one_tensor("send", tensors);
  check_peer("send", dst);
  auto work = make_work(c10d::OpType::SEND, tensors);
  const at::Tensor buf = t.contiguous();
  work->flight().keep.push_back(buf);
  start(*work, group(), [&](fg::Group& g) { return fg::start_send(g, view_of(buf), dst, tag); });
  work->submitted();
  return work;
}

void ProcessGroupFastgather::add_recv(FastgatherWork& work, const at::Tensor& t, int src, int tag) {
  at::Tensor out = output_buffer(work, t);
  work.flight().keep.push_back(out);
  Flight* f = &work.flight();  // outlives the request (the work's flight holds both)
  start(work, group(), [&](fg::Group& g) { return fg::start_recv(g, view_of(out), src, tag, &f->source); });
  work.submitted();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = one_tensor("recv", tensors);
  check_peer("recv", src);
  auto work = make_work(c10d::OpType::RECV, tensors);
  add_recv(*work, t, src, tag);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = one_tensor("recv (any source)", tensors);
  auto work = make_work(c10d::OpType::RECVANYSOURCE, tensors);
  add_recv(*work, t, fg::kAnySource, tag);
  return work;
}

void ProcessGroupFastgather::check_tensor_gather(const char* op, const at::Tensor& output,
                                                 const at::Tensor& input) const {
  check_tensor(input, op, "the input");
  check_tensor(output, op, "the output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "fastgather: ", op, ": the output is ",
                   output.scalar_type(), ", the input ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "fastgather: ", op, ": the output is ",
                    output.scalar_type(), output.sizes(), "; ", size_, " ranks x input ", input.scalar_type(),
                    input.sizes(), " need ", input.numel() * size_, " elements");
}

void ProcessGroupFastgather::add_tensor_gather(FastgatherWork& work, const char* op, const at::Tensor& output,
                                               const at::Tensor& input) {
  check_tensor_gather(op, output, input);
  const at::Tensor in = input.contiguous();
  at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
  if (!out.is_same(output)) chain_copy(work, output, out);
  work.flight().keep.push_back(in);
  work.flight().keep.push_back(out);
  start(work, group(), [&](fg::Group& g) { return fg::start_all_gather(g, view_of(in), view_of(out)); });
}

void ProcessGroupFastgather::check_list_gather(const char* op, const std::vector<at::Tensor>& outputs,
                                               const at::Tensor& input) const {
  check_tensor(input, op, "the input");
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_, "fastgather: ", op, " needs ", size_,
                    " output tensors (one per rank of the group), got ", outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& o = outputs[i];
    check_tensor(o, op, "an output");
    TORCH_CHECK_TYPE(o.scalar_type() == input.scalar_type(), "fastgather: ", op, " output ", i, " is ",
                     o.scalar_type(), ", the input ", input.scalar_type());
    // Outputs may differ in size (an uneven all-gather); this rank's is the input's.
    TORCH_CHECK_VALUE(static_cast<int>(i) != rank_ || o.numel() == input.numel(), "fastgather: ", op, " output ", i,
                      " (this rank's) is ", o.scalar_type(), o.sizes(), ", the input is ", input.scalar_type(),
                      input.sizes());
  }
}

void ProcessGroupFastgather::add_list_gather(FastgatherWork& work, const char* op, const std::vector<at::Tensor>& outputs,
                                             const at::Tensor& input) {
  check_list_gather(op, outputs, input);
  const at::Tensor in = input.contiguous();
  work.flight().keep.push_back(in);
  std::vector<fg::TensorView> views;
  for (const at::Tensor& o : outputs) {
    at::Tensor buf = o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous);
    if (!buf.is_same(o)) chain_copy(work, o, buf);
    work.flight().keep.push_back(buf);
    views.push_back(view_of(buf));
  }
  start(work, group(),
        [&](fg::Group& g) { return fg::start_all_gather(g, view_of(in), std::span<const fg::TensorView>(views)); });
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

void ProcessGroupFastgather::check_root(const char* op, int64_t root) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "fastgather: ", op, " root ", root, " is outside the group of ", size_);
}

at::Tensor ProcessGroupFastgather::output_buffer(FastgatherWork& work, const at::Tensor& user) {
  at::Tensor buf = user.is_contiguous() ? user : at::empty_like(user, at::MemoryFormat::Contiguous);
  if (!buf.is_same(user)) chain_copy(work, user, buf);
  work.flight().keep.push_back(buf);
  return buf;
}

namespace {

// The library's elements per element of t (complex: two reals).
int64_t per_element(const at::Tensor& t) {
  return static_cast<int64_t>(t.element_size() / fg::dtype_size(library_dtype(t).first));
}

// Elements of t per row of its first dimension.
int64_t row_elements(const at::Tensor& t) {
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return row;
}

// The parts of t's rows, as torch's split sizes say (none: equal parts), in
// the library's elements.
std::vector<int64_t> counts_of(const char* what, const at::Tensor& t, const std::vector<int64_t>& splits, int n) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  std::vector<int64_t> counts;
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % n == 0, "fastgather: all_to_all_single: the ", what, " has ", rows,
                      " rows, not a multiple of the ", n, " ranks (pass split sizes)");
    counts.assign(static_cast<size_t>(n), rows / n);
  } else {
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == n, "fastgather: all_to_all_single: ", splits.size(), " ",
                      what, " split sizes for ", n, " ranks");
    counts = splits;
  }
  for (int64_t& c : counts) {
    TORCH_CHECK_VALUE(c >= 0 && c <= rows, "fastgather: all_to_all_single: a ", what, " split of ", c, " rows (the ",
                      what, " has ", rows, ")");
    c *= row_elements(t) * per_element(t);
  }
  return counts;
}

// The root's list of a gather (outputs) or scatter (inputs), checked against
// `one` (the input or output every rank passes); none elsewhere, where torch
// passes no list or one empty list.
std::vector<at::Tensor> rooted_list(const char* op, std::vector<std::vector<at::Tensor>>& lists, bool am_root, int size,
                                    const at::Tensor& one, const char* list_word, const char* one_word) {
  if (!am_root) {
    TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), "fastgather: ", op, " takes no ",
                      list_word, " tensors on a rank other than the root");
    return {};
  }
  TORCH_CHECK_VALUE(lists.size() == 1 && static_cast<int>(lists[0].size()) == size, "fastgather: ", op, " needs ", size,
                    " ", list_word, " tensors on the root, got ", lists.empty() ? 0 : lists[0].size());
  const std::string an = std::string("an ") + list_word;
  for (const at::Tensor& t : lists[0]) {
    check_tensor(t, op, an.c_str());
    TORCH_CHECK_TYPE(t.scalar_type() == one.scalar_type(), "fastgather: ", op, ": ", an, " is ", t.scalar_type(),
                     ", the ", one_word, " ", one.scalar_type());
    TORCH_CHECK_VALUE(t.numel() == one.numel(), "fastgather: ", op, ": ", an, " is ", t.sizes(), ", the ", one_word,
                      " ", one.sizes());
  }
  return lists[0];
}

}  // namespace

// The root keeps every rank's input (fg::gather: within a server each input
// is copied into shared memory once and only the root copies them out).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::GatherOptions& opts) {
  constexpr const char* kOp = "gather";
  TORCH_CHECK_VALUE(inputs.size() == 1, "fastgather: gather takes one input, got ", inputs.size());
  check_root(kOp, opts.rootRank);
  const at::Tensor& input = inputs[0];
  check_tensor(input, kOp, "the input");
  const std::vector<at::Tensor> outs = rooted_list(kOp, outputs, opts.rootRank == rank_, size_, input, "output", "input");
  auto work = make_work(c10d::OpType::GATHER, outs);
  const at::Tensor in = input.contiguous();
  work->flight().keep.push_back(in);
  // Straight into the root's outputs (a contiguous copy for one that is not).
  std::vector<fg::TensorView> views;
  for (const at::Tensor& o : outs) views.push_back(view_of(output_buffer(*work, o)));
  const int root = static_cast<int>(opts.rootRank);
  start(*work, group(), [&](fg::Group& g) {
    return fg::start_gather(g, view_of(in), std::span<const fg::TensorView>(views), root);
  });
  return submit(work);
}

// Each rank gets its tensor of the root's list (fg::scatter).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ScatterOptions& opts) {
  constexpr const char* kOp = "scatter";
  TORCH_CHECK_VALUE(outputs.size() == 1, "fastgather: scatter takes one output, got ", outputs.size());
  check_root(kOp, opts.rootRank);
  const at::Tensor& output = outputs[0];
  check_tensor(output, kOp, "the output");
  std::vector<at::Tensor> chunks;
  for (const at::Tensor& in : rooted_list(kOp, inputs, opts.rootRank == rank_, size_, output, "input", "output")) {
    chunks.push_back(in.contiguous());
  }
  auto work = make_work(c10d::OpType::SCATTER, outputs);
  // Straight from the root's inputs (contiguous copies of those that are not).
  std::vector<fg::TensorView> views;
  for (const at::Tensor& c : chunks) {
    work->flight().keep.push_back(c);
    views.push_back(view_of(c));
  }
  const at::Tensor out = output_buffer(*work, output);
  const int root = static_cast<int>(opts.rootRank);
  start(*work, group(), [&](fg::Group& g) {
    return fg::start_scatter(g, std::span<const fg::TensorView>(views), view_of(out), root);
  });
  return submit(work);
}

// all_to_all_single: rows of input to every rank by input_splits (none:
// equal), rows from every rank into output by output_splits (fg::all_to_all).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                     std::vector<int64_t>& output_splits,
                                                                     std::vector<int64_t>& input_splits,
                                                                     const c10d::AllToAllOptions& /*opts*/) {
  constexpr const char* kOp = "all_to_all_single";
  check_tensor(input, kOp, "the input");
  check_tensor(output, kOp, "the output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "fastgather: ", kOp, ": the output is ",
                   output.scalar_type(), ", the input ", input.scalar_type());
  std::vector<int64_t> send, recv;
  if (!input_splits.empty() || !output_splits.empty()) {
    send = counts_of("input", input, input_splits, size_);
    recv = counts_of("output", output, output_splits, size_);
  } else {
    TORCH_CHECK_VALUE(input.numel() == output.numel() && (input.dim() == 0 ? 1 : input.size(0)) % size_ == 0,
                      "fastgather: ", kOp, ": the input ", input.sizes(), " and the output ", output.sizes(),
                      " must hold as many elements, in rows a multiple of the ", size_, " ranks (or pass split sizes)");
  }
  auto work = make_work(c10d::OpType::ALLTOALL_BASE, {output});
  const at::Tensor in = input.contiguous();
  work->flight().keep.push_back(in);
  const at::Tensor out = output_buffer(*work, output);
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_to_all(g, view_of(in), view_of(out), send, recv); });
  return submit(work);
}

// all_to_all of lists: inputs[j] to rank j, outputs[m] from rank m, of any sizes.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::alltoall(std::vector<at::Tensor>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllToAllOptions& /*opts*/) {
  constexpr const char* kOp = "all_to_all";
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                    "fastgather: ", kOp, " needs ", size_, " inputs and outputs (one per rank of the group), got ",
                    inputs.size(), " and ", outputs.size());
  std::vector<at::Tensor> flat;
  std::vector<int64_t> send, recv;
  for (const at::Tensor& in : inputs) {
    check_tensor(in, kOp, "an input");
    TORCH_CHECK_TYPE(in.scalar_type() == inputs[0].scalar_type(), "fastgather: ", kOp, ": inputs of ",
                     in.scalar_type(), " and ", inputs[0].scalar_type());
    flat.push_back(in.reshape({-1}));
    send.push_back(in.numel() * per_element(in));
  }
  int64_t total = 0;
  for (const at::Tensor& o : outputs) {
    check_tensor(o, kOp, "an output");
    TORCH_CHECK_TYPE(o.scalar_type() == inputs[0].scalar_type(), "fastgather: ", kOp, ": an output is ",
                     o.scalar_type(), ", the inputs ", inputs[0].scalar_type());
    recv.push_back(o.numel() * per_element(o));
    total += o.numel();
  }
  auto work = make_work(c10d::OpType::ALLTOALL, outputs);
  const at::Tensor in = at::cat(flat);
  at::Tensor all = at::empty({total}, outputs[0].options());
  work->flight().keep.push_back(in);
  work->flight().keep.push_back(all);
  int64_t offset = 0;
  for (const at::Tensor& o : outputs) {
    chain_copy(*work, o, all.narrow(0, offset, o.numel()).view_as(o));
    offset += o.numel();
  }
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_to_all(g, view_of(in), view_of(all), send, recv); });
  return submit(work);
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
  return submit(work);
}

}  // namespace fastgather_torch
