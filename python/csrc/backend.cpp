#include "backend.hpp"

#include <Python.h>
#include <pybind11/pybind11.h>

#include <map>
#include <mutex>

#include "backend_parts.hpp"
#include "store.hpp"

namespace fastgather_torch {

const char* const kOnlyThese =
    "fastgather serves all_gather, all_gather_into_tensor, all_gather_coalesced, "
    "all_gather_into_tensor_coalesced, all_reduce, all_reduce_coalesced, reduce, reduce_scatter, "
    "reduce_scatter_tensor and its coalesced form (sum, avg, product, min, max, band, bor, bxor, premul_sum), "
    "broadcast, "
    "gather, scatter, all_to_all, all_to_all_single, barrier, send and recv (and recv from any source); for other ops "
    "keep a gloo world "
    "(init_process_group(\"gloo\", ...)) and make the groups that gather and reduce with "
    "dist.new_group(ranks, backend=\"fastgather\")";

// Once the requests are done: the user's tensor gets the contiguous buffer's bytes.
void chain_copy(FastgatherWork& work, at::Tensor user, at::Tensor buf) {
  auto before = std::move(work.flight().on_success);
  work.flight().on_success = [before = std::move(before), user, buf]() mutable {
    if (before) before();
    user.copy_(buf);
  };
}

void without_gil(const std::function<void()>& fn) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    fn();
  } else {
    fn();
  }
}

namespace {

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

// Handles -> groups, for the direct operators: an index into a table that
// only grows, so that a handle is never another group's. Weak, as the names.
struct Handles {
  std::mutex mu;
  std::vector<c10::weak_intrusive_ptr<ProcessGroupFastgather>> slots;
};
Handles& handles() {
  static Handles* h = new Handles;
  return *h;
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

int64_t ProcessGroupFastgather::handle() {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mu);
  if (handle_ < 0) {
    handle_ = static_cast<int64_t>(h.slots.size());
    h.slots.emplace_back(c10::intrusive_ptr<ProcessGroupFastgather>::reclaim_copy(this));
  }
  return handle_;
}

c10::intrusive_ptr<ProcessGroupFastgather> group_of_handle(int64_t handle) {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mu);
  TORCH_CHECK_VALUE(handle >= 0 && handle < static_cast<int64_t>(h.slots.size()), "fastgather: ", handle,
                    " is not a fastgather group handle in this process (get one from fastgather.handle(group))");
  c10::intrusive_ptr<ProcessGroupFastgather> pg = h.slots[static_cast<size_t>(handle)].lock();
  TORCH_CHECK_VALUE(pg != nullptr, "fastgather: the group of handle ", handle, " is gone");
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

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::submit(const c10::intrusive_ptr<FastgatherWork>& work, bool async_op) {
  work->submitted(async_op);
  seq_.fetch_add(1, std::memory_order_relaxed);
  return work;
}

// The communicator's finalize() completes what was started and waits for
// the completion callbacks, which may be Python's (a Future's .then): they
// need the GIL this thread may hold.
void ProcessGroupFastgather::shutdown() {
  if (!comm_) return;
  std::unique_ptr<fg::Communicator> comm = std::move(comm_);
  without_gil([&] { (void)comm->finalize(); });  // its error (a peer gone) was each op's to report
}

void ProcessGroupFastgather::abort() {
  if (comm_) comm_->abort();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                    "fastgather: all_gather takes one input and one output list, got ", inputs.size(), " and ",
                    outputs.size());
  auto work = make_work(c10d::OpType::ALLGATHER, outputs[0]);
  add_list_gather(*work, "all_gather", outputs[0], inputs[0]);
  return submit(work, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
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
  return submit(work, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::AllgatherOptions& opts) {
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, {output});
  add_tensor_gather(*work, "all_gather_into_tensor", output, input);
  return submit(work, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "fastgather: all_gather_into_tensor_coalesced: ", inputs.size(),
                    " inputs but ", outputs.size(), " outputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor_gather("all_gather_into_tensor_coalesced", outputs[i], inputs[i]);
  }
  auto work = make_work(c10d::OpType::COALESCED, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    add_tensor_gather(*work, "all_gather_into_tensor_coalesced", outputs[i], inputs[i]);
  }
  return submit(work, opts.asyncOp);
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
  return submit(work, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::barrier(const c10d::BarrierOptions& opts) {
  auto work = make_work(c10d::OpType::BARRIER, {});
  start(*work, group(), [](fg::Group& g) { return fg::start_barrier(g); });
  return submit(work, opts.asyncOp);
}

#define FG_UNSUPPORTED(op, name, ...)                                                                        \
  c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::op(__VA_ARGS__) {                                   \
    C10_THROW_ERROR(NotImplementedError,                                                                     \
                    std::string("fastgather: ") + name + " is not supported by this backend. " + kOnlyThese); \
  }
FG_UNSUPPORTED(allreduce_sparse, "allreduce_sparse", std::vector<at::Tensor>&, const c10d::AllreduceOptions&)
#undef FG_UNSUPPORTED

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

void ProcessGroupFastgather::check_root(const char* op, int64_t root) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "fastgather: ", op, " root ", root, " is outside the group of ", size_);
}

at::Tensor ProcessGroupFastgather::output_buffer(FastgatherWork& work, const at::Tensor& user) {
  at::Tensor buf = user.is_contiguous() ? user : at::empty_like(user, at::MemoryFormat::Contiguous);
  if (!buf.is_same(user)) chain_copy(work, user, buf);
  work.flight().keep.push_back(buf);
  return buf;
}

}  // namespace fastgather_torch
