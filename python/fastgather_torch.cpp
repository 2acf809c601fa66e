// fastgather as a torch.distributed backend (torch 2.x: a c10d::Backend for
// the CPU device) and the fused all-gather + matmul as the torch operator
// fastgather::all_gather_base_mm. Built as the extension module
// fastgather._C; python/fastgather/__init__.py registers the backend.
//
// One ProcessGroupFastgather per torch group: a fastgather Communicator
// whose world is the group's members, meeting through the store torch hands
// the backend (a PrefixStore of the group), with the ranks that share a host
// found from host identities. Nothing here forks.
//
// Asynchronous work: every op starts the library's requests (the first bytes
// are posted before it returns) and hands back a Work that owns them. Whoever
// waits drives them: Work::wait() runs the engine's own wait on the calling
// thread, so a blocking call costs no thread hop. A work nobody has come back
// for within a short grace period (async_op=True and Python computing) is
// driven by the group's progress thread, in the engine's own wait (woken by
// the peers' posts) a short slice at a time, so peers are never left waiting
// for this rank's bytes; the thread sleeps when the group has been idle for a
// while. One thread at a time drives a group (drive_mu_): the library's rule;
// the progress thread stands aside whenever the owner asks for the lock.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fastgather/fastgather.hpp"

namespace fg = fastgather;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kOnlyThese =
    "fastgather serves all_gather, all_gather_into_tensor, all_gather_coalesced, "
    "all_gather_into_tensor_coalesced, all_reduce, reduce_scatter and reduce_scatter_tensor (sums), "
    "broadcast and barrier; keep gloo for other ops "
    "(init_process_group(\"gloo\", ...), or backend=\"cpu:gloo\") and create the groups that gather with "
    "new_group(ranks, backend=\"fastgather\")";

// A work its owner has not waited for within this long is driven by the
// group's progress thread; a blocking call is normally done well before.
constexpr auto kGrace = std::chrono::microseconds(500);
// How often the progress thread looks while the group is active, and how
// long the group must be idle before it sleeps until the next op.
constexpr auto kPollIdle = std::chrono::milliseconds(1);
// The longest the progress thread holds the group at a time (waiting in the
// engine for a peer): what an owner coming back may wait for the lock.
constexpr auto kDriveSlice = std::chrono::microseconds(200);
// For advance(): non-blocking rounds only.
constexpr Clock::time_point kNow = Clock::time_point::min();
constexpr auto kLinger = std::chrono::milliseconds(100);

// The library's errors as Python's: arguments that are wrong on this rank or
// disagree between ranks are ValueErrors, what the library does not serve is
// a NotImplementedError (a RuntimeError), a lost peer, a timeout or an abort
// is torch's DistBackendError.
[[noreturn]] void raise(const fg::Status& s) {
  const std::string msg = "fastgather: " + s.to_string();
  switch (s.kind()) {
    case fg::ErrorKind::kInvalidArgument:
    case fg::ErrorKind::kMismatch: C10_THROW_ERROR(ValueError, msg);
    case fg::ErrorKind::kUnsupported: C10_THROW_ERROR(NotImplementedError, msg);
    case fg::ErrorKind::kResourceExhausted: C10_THROW_ERROR(Error, msg);
    default: C10_THROW_ERROR(DistBackendError, msg);
  }
}

std::exception_ptr exception_of(const fg::Status& s) {
  try {
    raise(s);
  } catch (...) {
    return std::current_exception();
  }
}

// torch's rendezvous store, as the library's Store.
class C10dStore : public fg::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  fg::Status set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return fg::Status::Ok();
    } catch (const std::exception& e) {
      return {fg::ErrorKind::kSystem, std::string("torch store: ") + e.what()};
    }
  }

  fg::Result<std::string> get(const std::string& key, Clock::time_point deadline) override {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      store_->wait({key}, std::max(left, std::chrono::milliseconds(1)));
      const std::vector<uint8_t> v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return fg::Status{fg::ErrorKind::kTimeout, "torch store: waiting for key '" + key + "': " + e.what()};
    }
  }

  fg::Result<int64_t> add(const std::string& key, int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      return fg::Status{fg::ErrorKind::kSystem, std::string("torch store: ") + e.what()};
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// The library's dtype for a torch tensor's bytes, and how many elements of it.
// Complex numbers move as pairs of reals; dtypes the library has no name for
// move as bytes (ranks that disagree on them are then told about bytes).
std::pair<fg::DType, int64_t> library_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return {fg::DType::kF32, t.numel()};
    case at::kHalf: return {fg::DType::kF16, t.numel()};
    case at::kBFloat16: return {fg::DType::kBF16, t.numel()};
    case at::kDouble: return {fg::DType::kF64, t.numel()};
    case at::kChar: return {fg::DType::kI8, t.numel()};
    case at::kByte: return {fg::DType::kU8, t.numel()};
    case at::kShort: return {fg::DType::kI16, t.numel()};
    case at::kInt: return {fg::DType::kI32, t.numel()};
    case at::kLong: return {fg::DType::kI64, t.numel()};
    case at::kBool: return {fg::DType::kBool, t.numel()};
    case at::kComplexFloat: return {fg::DType::kF32, 2 * t.numel()};
    case at::kComplexDouble: return {fg::DType::kF64, 2 * t.numel()};
    default: return {fg::DType::kU8, t.numel() * static_cast<int64_t>(t.element_size())};
  }
}

void check_tensor(const at::Tensor& t, const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "fastgather: ", op, ": ", what, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "fastgather: ", op, ": ", what, " is on ", t.device(),
                    "; this backend serves CPU tensors");
  TORCH_CHECK_VALUE(!t.is_sparse(), "fastgather: ", op, ": ", what, " is sparse");
}

// A contiguous 1-D view of t's bytes for the library (t must be contiguous).
fg::TensorView view_of(const at::Tensor& t) {
  auto [dt, n] = library_dtype(t);
  return fg::TensorView(t.data_ptr(), dt, {n});
}

class ProcessGroupFastgather;

// A collective in flight: the library's requests (in the order started),
// what must live until they complete (contiguous copies, landing buffers),
// and what to do once they have (copy into non-contiguous outputs).
class FastgatherWork : public c10d::Work {
 public:
  FastgatherWork(c10::intrusive_ptr<ProcessGroupFastgather> pg, int rank, c10d::OpType type,
                 std::vector<at::Tensor> result)
      : c10d::Work(rank, type), pg_(std::move(pg)), result_(std::move(result)), started_(Clock::now()) {}

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  void abort() override;

  std::vector<fg::Request> requests;
  std::vector<at::Tensor> keep;        // alive until complete
  std::function<void()> on_success;    // after the requests, on the driving thread

 private:
  friend class ProcessGroupFastgather;
  // The requests are complete: status and copy-back, under the group's drive lock.
  void settle();
  // Tells waiters and the future; outside the drive lock (future callbacks may take the GIL).
  void publish();
  void complete_future();

  c10::intrusive_ptr<ProcessGroupFastgather> pg_;
  std::vector<at::Tensor> result_;
  const Clock::time_point started_;
  bool queued_ = true;  // in the group's pending list (drive lock)
  fg::Status status_;   // set by settle()
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made on request (mutex_)
  bool future_done_ = false;                        // marked or given the error (mutex_)
};

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

// What fastgather.set_settings() asked for: the backends made from then on
// follow it; unset, each reads the environment (Settings::from_environment).
struct PythonSettings {
  std::mutex mu;
  std::optional<fg::Settings> settings;
};
PythonSettings& python_settings() {
  static PythonSettings* s = new PythonSettings;
  return *s;
}

std::optional<fg::Settings> settings_for_new_backends() {
  PythonSettings& s = python_settings();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.settings;
}

class ProcessGroupFastgather : public c10d::Backend {
 public:
  ProcessGroupFastgather(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size) {
    fg::Config c;
    c.rank = rank;
    c.world_size = size;
    c.servers = 0;  // find the ranks that share this host
    c.timeout = timeout;
    c.settings = settings_for_new_backends();
    auto comm = fg::Communicator::create(c, std::make_shared<C10dStore>(store));
    if (!comm.ok()) raise(comm.status());
    comm_ = std::move(comm).value();
    progress_ = std::thread([this] { progress_loop(); });
  }
  ~ProcessGroupFastgather() override { stop_progress(); }
  const fg::Settings& settings() const { return live().settings(); }
  void release_resources() override {
    Names& n = names();
    std::lock_guard<std::mutex> lock(n.mu);
    if (!name_.empty()) n.map.erase(name_);
  }

  // The name all_gather_base_mm takes; registered on first use (it needs the
  // intrusive pointer, which the constructor does not have yet).
  std::string comm_name() {
    Names& n = names();
    std::lock_guard<std::mutex> lock(n.mu);
    if (name_.empty()) {
      name_ = "fastgather-" + std::to_string(++n.serial);
      n.map.insert_or_assign(name_, c10::weak_intrusive_ptr<ProcessGroupFastgather>(
                                          c10::intrusive_ptr<ProcessGroupFastgather>::reclaim_copy(this)));
    }
    return name_;
  }

  const std::string getBackendName() const override { return "fastgather"; }
  std::string transport() const { return live().transport(); }

  fg::Group& group() { return live().world(); }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                      "fastgather: all_gather takes one input and one output list, got ", inputs.size(), " and ",
                      outputs.size());
    auto work = make_work(c10d::OpType::ALLGATHER, outputs[0]);
    add_list_gather(*work, "all_gather", outputs[0], inputs[0]);
    return submit(work);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& /*opts*/) override {
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

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    auto work = make_work(c10d::OpType::_ALLGATHER_BASE, {output});
    add_tensor_gather(*work, "all_gather_into_tensor", output, input);
    return submit(work);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& /*opts*/) override {
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
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: broadcast takes one tensor, got ", tensors.size());
    at::Tensor& t = tensors[0];
    check_tensor(t, "broadcast", "the tensor");
    TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_, "fastgather: broadcast root ", opts.rootRank,
                      " is outside the group of ", size_);
    auto work = make_work(c10d::OpType::BROADCAST, tensors);
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    if (!buf.is_same(t)) {
      work->on_success = [t, buf]() mutable { t.copy_(buf); };
    }
    work->keep.push_back(buf);
    start(*work, [&](fg::Group& g) { return fg::start_broadcast(g, view_of(buf), static_cast<int>(opts.rootRank)); });
    return submit(work);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    auto work = make_work(c10d::OpType::BARRIER, {});
    start(*work, [](fg::Group& g) { return fg::start_barrier(g); });
    return submit(work);
  }

  // Sums (fg::all_reduce, fg::reduce_scatter): every element summed in
  // group-rank order, the same bits on every rank.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: all_reduce takes one tensor, got ", tensors.size());
    at::Tensor& t = tensors[0];
    check_sum("all_reduce", t, "the tensor", opts.reduceOp);
    auto work = make_work(c10d::OpType::ALLREDUCE, tensors);
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    if (!buf.is_same(t)) chain_copy(*work, t, buf);
    work->keep.push_back(buf);
    start(*work, [&](fg::Group& g) { return fg::start_all_reduce(g, view_of(buf), view_of(buf)); });
    return submit(work);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    constexpr const char* kOp = "reduce_scatter_tensor";
    check_sum(kOp, input, "the input", opts.reduceOp);
    check_sum(kOp, output, "the output", opts.reduceOp);
    TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "fastgather: ", kOp, ": the output is ",
                     output.scalar_type(), ", the input ", input.scalar_type());
    TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "fastgather: ", kOp, ": the input is ",
                      input.scalar_type(), input.sizes(), "; ", size_, " ranks x output ", output.scalar_type(),
                      output.sizes(), " need ", output.numel() * size_, " elements");
    auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
    add_reduce_scatter(*work, output, input.contiguous());
    return submit(work);
  }

  // outputs[0] = the sum over ranks of their inputs[0][group rank].
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    constexpr const char* kOp = "reduce_scatter";
    TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1, "fastgather: ", kOp,
                      " takes one output and one input list, got ", outputs.size(), " and ", inputs.size());
    at::Tensor& output = outputs[0];
    check_sum(kOp, output, "the output", opts.reduceOp);
    TORCH_CHECK_VALUE(static_cast<int>(inputs[0].size()) == size_, "fastgather: ", kOp, " needs ", size_,
                      " input tensors (one per rank of the group), got ", inputs[0].size());
    std::vector<at::Tensor> flat;
    for (const at::Tensor& in : inputs[0]) {
      check_sum(kOp, in, "an input", opts.reduceOp);
      TORCH_CHECK_VALUE(in.scalar_type() == output.scalar_type() && in.numel() == output.numel(), "fastgather: ", kOp,
                        ": an input is ", in.scalar_type(), in.sizes(), ", the output ", output.scalar_type(),
                        output.sizes());
      flat.push_back(in.reshape({-1}));
    }
    auto work = make_work(c10d::OpType::REDUCE_SCATTER, outputs);
    add_reduce_scatter(*work, output, at::cat(flat));
    return submit(work);
  }

#define FG_UNSUPPORTED(op, name, ...)                                                                  \
  c10::intrusive_ptr<c10d::Work> op(__VA_ARGS__) override {                                            \
    C10_THROW_ERROR(NotImplementedError,                                                               \
                    std::string("fastgather: ") + name + " is not supported by this backend. " + kOnlyThese); \
  }
  FG_UNSUPPORTED(allreduce_sparse, "allreduce_sparse", std::vector<at::Tensor>&, const c10d::AllreduceOptions&)
  FG_UNSUPPORTED(allreduce_coalesced, "allreduce_coalesced", std::vector<at::Tensor>&,
                 const c10d::AllreduceCoalescedOptions&)
  FG_UNSUPPORTED(reduce, "reduce", std::vector<at::Tensor>&, const c10d::ReduceOptions&)
  FG_UNSUPPORTED(gather, "gather", std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                 const c10d::GatherOptions&)
  FG_UNSUPPORTED(scatter, "scatter", std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                 const c10d::ScatterOptions&)
  FG_UNSUPPORTED(reduce_scatter_tensor_coalesced, "reduce_scatter_tensor_coalesced", std::vector<at::Tensor>&,
                 std::vector<at::Tensor>&, const c10d::ReduceScatterOptions&)
  FG_UNSUPPORTED(alltoall_base, "all_to_all_single", at::Tensor&, at::Tensor&, std::vector<int64_t>&,
                 std::vector<int64_t>&, const c10d::AllToAllOptions&)
  FG_UNSUPPORTED(alltoall, "all_to_all", std::vector<at::Tensor>&, std::vector<at::Tensor>&, const c10d::AllToAllOptions&)
  FG_UNSUPPORTED(send, "send", std::vector<at::Tensor>&, int, int)
  FG_UNSUPPORTED(recv, "recv", std::vector<at::Tensor>&, int, int)
  FG_UNSUPPORTED(recvAnysource, "recv (any source)", std::vector<at::Tensor>&, int)
#undef FG_UNSUPPORTED

  // destroy_process_group: what was started completes, then the orderly end.
  void shutdown() override {
    stop_progress();
    std::unique_lock<std::timed_mutex> lock(drive_mu_);
    std::vector<c10::intrusive_ptr<FastgatherWork>> done;
    advance(nullptr, Clock::time_point::max(), &done);
    if (comm_) {
      // Its error (a peer already gone, say) was each op's to report.
      (void)comm_->finalize();
      comm_.reset();
    }
    lock.unlock();
    for (auto& w : done) w->publish();
  }
  void abort() override {
    if (comm_) comm_->abort();
  }

  // The fused op: blocking, in order with the group's other requests.
  fg::Status matmul_reduce_scatter(const fg::TensorView& a, const fg::TensorView& w, const std::optional<fg::TensorView>& b,
                                   const fg::TensorView& out) {
    std::vector<c10::intrusive_ptr<FastgatherWork>> done;
    fg::Status s;
    {
      OwnerLock lock(*this);
      s = fg::matmul_reduce_scatter(group(), a, w, b, out);
      advance(nullptr, kNow, &done);  // works ahead of it are complete now
    }
    for (auto& d : done) d->publish();
    return s;
  }

  fg::Status all_gather_matmul(const fg::TensorView& a, const fg::TensorView& w, const std::optional<fg::TensorView>& b,
                               const fg::TensorView& out, const fg::TensorView& gathered,
                               const fg::AllGatherMatmulOptions& opt) {
    std::vector<c10::intrusive_ptr<FastgatherWork>> done;
    fg::Status s;
    {
      OwnerLock lock(*this);
      s = fg::all_gather_matmul(group(), a, w, b, out, gathered, opt);
      advance(nullptr, kNow, &done);  // works ahead of it are complete now
    }
    for (auto& d : done) d->publish();
    return s;
  }

 private:
  friend class FastgatherWork;

  fg::Communicator& live() const {
    TORCH_CHECK(comm_ != nullptr, "fastgather: this group was shut down (destroy_process_group)");
    return *comm_;
  }

  c10::intrusive_ptr<FastgatherWork> make_work(c10d::OpType type, std::vector<at::Tensor> result) {
    live();
    return c10::make_intrusive<FastgatherWork>(c10::intrusive_ptr<ProcessGroupFastgather>::reclaim_copy(this), rank_,
                                               type, std::move(result));
  }

  // The owner's side of drive_mu_ (ops, waits): the progress thread does not
  // take the lock while an owner is waiting for it.
  class OwnerLock {
   public:
    explicit OwnerLock(ProcessGroupFastgather& pg, Clock::time_point until = Clock::time_point::max()) : pg_(pg) {
      pg_.owners_waiting_.fetch_add(1, std::memory_order_acq_rel);
      owns_ = until == Clock::time_point::max() ? (pg_.drive_mu_.lock(), true) : pg_.drive_mu_.try_lock_until(until);
      pg_.owners_waiting_.fetch_sub(1, std::memory_order_acq_rel);
    }
    ~OwnerLock() {
      if (owns_) pg_.drive_mu_.unlock();
    }
    bool owns() const { return owns_; }
    OwnerLock(const OwnerLock&) = delete;
    OwnerLock& operator=(const OwnerLock&) = delete;

   private:
    ProcessGroupFastgather& pg_;
    bool owns_;
  };

  // Starts one library request of the work, under the drive lock.
  template <class Start>
  void start(FastgatherWork& work, Start&& how) {
    OwnerLock lock(*this);
    work.requests.push_back(how(group()));
  }

  c10::intrusive_ptr<c10d::Work> submit(const c10::intrusive_ptr<FastgatherWork>& work) {
    {
      OwnerLock lock(*this);
      pending_.push_back(work);
    }
    if (sleeping_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(sleep_mu_);
      sleeping_.store(false, std::memory_order_release);
      sleep_cv_.notify_one();
    }
    return work;
  }

  void check_tensor_gather(const char* op, const at::Tensor& output, const at::Tensor& input) const {
    check_tensor(input, op, "the input");
    check_tensor(output, op, "the output");
    TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "fastgather: ", op, ": the output is ",
                     output.scalar_type(), ", the input ", input.scalar_type());
    TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "fastgather: ", op, ": the output is ",
                      output.scalar_type(), output.sizes(), "; ", size_, " ranks x input ", input.scalar_type(),
                      input.sizes(), " need ", input.numel() * size_, " elements");
  }

  void add_tensor_gather(FastgatherWork& work, const char* op, const at::Tensor& output, const at::Tensor& input) {
    check_tensor_gather(op, output, input);
    const at::Tensor in = input.contiguous();
    at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    if (!out.is_same(output)) chain_copy(work, output, out);
    work.keep.push_back(in);
    work.keep.push_back(out);
    start(work, [&](fg::Group& g) { return fg::start_all_gather(g, view_of(in), view_of(out)); });
  }

  void check_list_gather(const char* op, const std::vector<at::Tensor>& outputs, const at::Tensor& input) const {
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

  void add_list_gather(FastgatherWork& work, const char* op, const std::vector<at::Tensor>& outputs,
                       const at::Tensor& input) {
    check_list_gather(op, outputs, input);
    const at::Tensor in = input.contiguous();
    work.keep.push_back(in);
    std::vector<fg::TensorView> views;
    for (const at::Tensor& o : outputs) {
      at::Tensor buf = o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous);
      if (!buf.is_same(o)) chain_copy(work, o, buf);
      work.keep.push_back(buf);
      views.push_back(view_of(buf));
    }
    start(work, [&](fg::Group& g) { return fg::start_all_gather(g, view_of(in), std::span<const fg::TensorView>(views)); });
  }

  // A tensor a sum may take: on the CPU, a dtype the library sums, SUM.
  static void check_sum(const char* op, const at::Tensor& t, const char* what, const c10d::ReduceOp& reduce_op) {
    check_tensor(t, op, what);
    TORCH_CHECK_VALUE(reduce_op == c10d::ReduceOp::SUM, "fastgather: ", op, " sums (ReduceOp.SUM); other reductions: ",
                      kOnlyThese);
    const auto st = t.scalar_type();
    TORCH_CHECK_TYPE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16 || st == at::kDouble || st == at::kInt ||
                         st == at::kLong || st == at::kComplexFloat || st == at::kComplexDouble,
                     "fastgather: ", op, ": ", what, " is ", st,
                     "; sums take float32, float16, bfloat16, float64, int32, int64 and complex");
  }

  // input: contiguous, group.size() chunks of output's size.
  void add_reduce_scatter(FastgatherWork& work, const at::Tensor& output, const at::Tensor& input) {
    at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    if (!out.is_same(output)) chain_copy(work, output, out);
    work.keep.push_back(input);
    work.keep.push_back(out);
    start(work, [&](fg::Group& g) { return fg::start_reduce_scatter(g, view_of(input), view_of(out)); });
  }

  static void chain_copy(FastgatherWork& work, at::Tensor user, at::Tensor buf) {
    auto before = std::move(work.on_success);
    work.on_success = [before = std::move(before), user, buf]() mutable {
      if (before) before();
      user.copy_(buf);
    };
  }

  // Under the drive lock: settles pending works in order, as far as their
  // requests complete by `until` (kNow: non-blocking rounds; max: as long as
  // it takes), up to and including `upto` (null: all). True when `upto` (or
  // everything) is settled.
  bool advance(FastgatherWork* upto, Clock::time_point until, std::vector<c10::intrusive_ptr<FastgatherWork>>* done) {
    while (!pending_.empty()) {
      const c10::intrusive_ptr<FastgatherWork>& w = pending_.front();
      if (until != Clock::time_point::max()) {  // else settle() waits
        for (fg::Request& r : w->requests) {
          const auto now = Clock::now();
          const bool complete =
              until <= now ? r.test() : r.wait_for(std::chrono::duration_cast<std::chrono::microseconds>(until - now));
          if (!complete) return false;
        }
      }
      w->settle();
      const bool last = w.get() == upto;
      done->push_back(w);
      pending_.pop_front();
      if (last) return true;
    }
    return true;
  }

  void stop_progress() {
    if (!progress_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(sleep_mu_);
      stop_ = true;
      sleeping_.store(false, std::memory_order_release);
      sleep_cv_.notify_one();
    }
    progress_.join();
  }

  void progress_loop() {
    auto idle_since = Clock::now();
    std::unique_lock<std::mutex> nap(sleep_mu_);
    while (!stop_) {
      nap.unlock();
      bool pending = true, drove = false;
      std::vector<c10::intrusive_ptr<FastgatherWork>> done;
      if (owners_waiting_.load(std::memory_order_acquire) == 0) {
        std::unique_lock<std::timed_mutex> lock(drive_mu_, std::try_to_lock);
        if (lock.owns_lock()) {  // else someone is driving: nothing to add
          if (!pending_.empty() && Clock::now() - pending_.front()->started_ >= kGrace) {
            drove = true;
            advance(nullptr, Clock::now() + kDriveSlice, &done);
          }
          pending = !pending_.empty();
        }
      }
      for (auto& w : done) w->publish();
      done.clear();
      const auto now = Clock::now();
      if (pending) idle_since = now;
      if (drove && pending) {  // the slice waited in the engine: straight on, after a word to the owner
        std::this_thread::yield();
        nap.lock();
        continue;
      }
      nap.lock();
      if (stop_) break;
      if (!pending && now - idle_since > kLinger) {
        // Asleep until the next op (submit() wakes it). The check after
        // saying so closes the race with a submit() that saw us awake.
        sleeping_.store(true, std::memory_order_release);
        nap.unlock();
        bool empty;
        {
          std::lock_guard<std::timed_mutex> lock(drive_mu_);
          empty = pending_.empty();
        }
        nap.lock();
        if (!empty) {
          sleeping_.store(false, std::memory_order_release);
          continue;
        }
        sleep_cv_.wait(nap, [&] { return stop_ || !sleeping_.load(std::memory_order_acquire); });
        idle_since = Clock::now();
        continue;
      }
      sleep_cv_.wait_for(nap, pending ? std::chrono::duration_cast<std::chrono::microseconds>(kGrace)
                                      : std::chrono::duration_cast<std::chrono::microseconds>(kPollIdle));
    }
  }

  std::unique_ptr<fg::Communicator> comm_;
  std::string name_;
  // One thread at a time drives the group's requests (the library's rule);
  // it also guards pending_. Timed: wait(timeout) must not block past it.
  std::timed_mutex drive_mu_;
  std::atomic<int> owners_waiting_{0};
  std::deque<c10::intrusive_ptr<FastgatherWork>> pending_;
  // The progress thread's sleep.
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<bool> sleeping_{false};
  bool stop_ = false;  // sleep_mu_
  std::thread progress_;
};

void FastgatherWork::settle() {
  for (fg::Request& r : requests) {
    fg::Status s = r.wait();  // complete: returns its status
    if (status_.ok() && !s.ok()) status_ = s;
  }
  queued_ = false;
  if (status_.ok() && on_success) {
    try {
      on_success();
    } catch (const std::exception& e) {
      status_ = {fg::ErrorKind::kSystem, std::string("copying into the outputs: ") + e.what()};
    }
  }
  requests.clear();
  keep.clear();
  on_success = nullptr;
}

void FastgatherWork::publish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
  }
  finish(status_.ok() ? nullptr : exception_of(status_));
  complete_future();
}

// Once the work is complete and someone asked for its future: exactly once,
// whichever of publish() and getFuture() comes second.
void FastgatherWork::complete_future() {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_ || !completed_ || future_done_) return;
    future_done_ = true;
    fut = future_;
  }
  if (exception_) {
    fut->setError(exception_);
  } else {
    fut->markCompleted(c10::IValue(result_));
  }
}

bool FastgatherWork::isCompleted() {
  std::vector<c10::intrusive_ptr<FastgatherWork>> done;
  {
    std::unique_lock<std::timed_mutex> lock(pg_->drive_mu_, std::try_to_lock);
    if (lock.owns_lock() && queued_) pg_->advance(this, kNow, &done);
  }
  for (auto& w : done) w->publish();
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool FastgatherWork::wait(std::chrono::milliseconds timeout) {
  const bool forever = timeout == kNoTimeout;
  const auto deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  for (;;) {
    std::vector<c10::intrusive_ptr<FastgatherWork>> done;
    {
      // The engine's own wait, until the deadline (without a timeout, the
      // group's own deadline is the only one).
      ProcessGroupFastgather::OwnerLock lock(*pg_, deadline);
      if (lock.owns() && queued_) pg_->advance(this, deadline, &done);
    }
    for (auto& w : done) w->publish();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (forever) cv_.wait(lock, [&] { return completed_; });
      if (completed_) {
        if (exception_) std::rethrow_exception(exception_);
        return true;
      }
    }
    if (Clock::now() >= deadline) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("fastgather: ", c10d::opTypeToString(opType_), " was not complete after wait(timeout=",
                               timeout.count(), " ms); it is still in flight (wait again, or destroy the group)"));
    }
  }
}

c10::intrusive_ptr<c10::ivalue::Future> FastgatherWork::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut = future_;
  }
  complete_future();
  return fut;
}

void FastgatherWork::abort() { pg_->abort(); }

c10::intrusive_ptr<ProcessGroupFastgather> find_group(const std::string& hcom) {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  auto it = n.map.find(hcom);
  c10::intrusive_ptr<ProcessGroupFastgather> pg = it == n.map.end() ? nullptr : it->second.lock();
  TORCH_CHECK_VALUE(pg != nullptr, "fastgather: no fastgather group is named '", hcom,
                    "' in this process (get it from fastgather.get_comm_name(group, rank))");
  return pg;
}

// torch_npu.npu_all_gather_base_mm: output = allgather(x1) @ x2 + bias,
// gather_out = allgather(x1) (an empty tensor when gather_output is false).
std::tuple<at::Tensor, at::Tensor> all_gather_base_mm(const at::Tensor& x1, const at::Tensor& x2, c10::string_view hcom,
                                                      int64_t world_size, const std::optional<at::Tensor>& bias,
                                                      int64_t gather_index, bool gather_output, int64_t comm_turn) {
  auto pg = find_group(std::string(hcom));
  TORCH_CHECK_VALUE(world_size == pg->getSize(), "fastgather: world_size=", world_size, " but group '", hcom, "' has ",
                    pg->getSize(), " ranks");
  TORCH_CHECK_VALUE(gather_index == 0, "fastgather: gather_index=", gather_index,
                    " is not supported (only 0: gather x1)");
  TORCH_CHECK_VALUE(comm_turn == 0, "fastgather: comm_turn=", comm_turn, " is not supported (only 0)");
  check_tensor(x1, "all_gather_base_mm", "x1");
  check_tensor(x2, "all_gather_base_mm", "x2");
  TORCH_CHECK_VALUE(x1.dim() == 2 && x2.dim() == 2, "fastgather: x1 and x2 must be 2-D, got ", x1.sizes(), " and ",
                    x2.sizes());
  TORCH_CHECK_VALUE(x1.size(1) == x2.size(0), "fastgather: x1 ", x1.sizes(), " and x2 ", x2.sizes(), " disagree on k");
  const auto dt = x1.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kHalf || dt == at::kBFloat16 || dt == at::kFloat, "fastgather: x1 is ", dt,
                   "; all_gather_base_mm takes float16, bfloat16 or float32");
  TORCH_CHECK_TYPE(x2.scalar_type() == dt, "fastgather: x2 is ", x2.scalar_type(), ", x1 is ", dt);
  const int64_t m = x1.size(0), k = x1.size(1), n = x2.size(1);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    check_tensor(*bias, "all_gather_base_mm", "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == dt, "fastgather: bias must be ",
                      dt, " of shape [", n, "], got ", bias->scalar_type(), bias->sizes());
    b = bias->contiguous();
  }
  const at::Tensor a = x1.contiguous(), w = x2.contiguous();
  at::Tensor out = at::empty({m * world_size, n}, a.options());
  at::Tensor gathered = gather_output ? at::empty({m * world_size, k}, a.options()) : at::empty({0}, a.options());
  auto dims = [](const at::Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); };
  auto v = [&](const at::Tensor& t) { return fg::TensorView(t.data_ptr(), library_dtype(t).first, dims(t)); };
  std::optional<fg::TensorView> bv;
  if (b.defined()) bv = v(b);
  fg::AllGatherMatmulOptions opt;
  opt.gather_output = gather_output;
  if (fg::Status s = pg->all_gather_matmul(v(a), v(w), bv, v(out), gather_output ? v(gathered) : fg::TensorView{}, opt);
      !s.ok()) {
    raise(s);
  }
  return {out, gathered};
}

// torch_npu.npu_mm_reduce_scatter_base: x1 (m, k) @ x2 (k, n) on every rank,
// summed over the group and scattered along rows: (m / world_size, n), + bias.
at::Tensor mm_reduce_scatter_base(const at::Tensor& x1, const at::Tensor& x2, c10::string_view hcom, int64_t world_size,
                                  c10::string_view reduce_op, const std::optional<at::Tensor>& bias, int64_t comm_turn) {
  constexpr const char* kOp = "mm_reduce_scatter_base";
  auto pg = find_group(std::string(hcom));
  TORCH_CHECK_VALUE(world_size == pg->getSize(), "fastgather: world_size=", world_size, " but group '", hcom, "' has ",
                    pg->getSize(), " ranks");
  TORCH_CHECK_VALUE(reduce_op == "sum", "fastgather: ", kOp, ": reduce_op='", std::string(reduce_op),
                    "' is not supported (only 'sum')");
  TORCH_CHECK_VALUE(comm_turn == 0, "fastgather: comm_turn=", comm_turn, " is not supported (only 0)");
  check_tensor(x1, kOp, "x1");
  check_tensor(x2, kOp, "x2");
  TORCH_CHECK_VALUE(x1.dim() == 2 && x2.dim() == 2, "fastgather: x1 and x2 must be 2-D, got ", x1.sizes(), " and ",
                    x2.sizes());
  TORCH_CHECK_VALUE(x1.size(1) == x2.size(0), "fastgather: x1 ", x1.sizes(), " and x2 ", x2.sizes(), " disagree on k");
  TORCH_CHECK_VALUE(x1.size(0) % world_size == 0, "fastgather: ", kOp, ": x1's ", x1.size(0), " rows do not split over ",
                    world_size, " ranks");
  const auto dt = x1.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kHalf || dt == at::kBFloat16 || dt == at::kFloat, "fastgather: x1 is ", dt, "; ", kOp,
                   " takes float16, bfloat16 or float32");
  TORCH_CHECK_TYPE(x2.scalar_type() == dt, "fastgather: x2 is ", x2.scalar_type(), ", x1 is ", dt);
  const int64_t m = x1.size(0), n = x2.size(1);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    check_tensor(*bias, kOp, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == dt, "fastgather: bias must be ",
                      dt, " of shape [", n, "], got ", bias->scalar_type(), bias->sizes());
    b = bias->contiguous();
  }
  const at::Tensor a = x1.contiguous(), w = x2.contiguous();
  at::Tensor out = at::empty({m / world_size, n}, a.options());
  auto dims = [](const at::Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); };
  auto v = [&](const at::Tensor& t) { return fg::TensorView(t.data_ptr(), library_dtype(t).first, dims(t)); };
  std::optional<fg::TensorView> bv;
  if (b.defined()) bv = v(b);
  if (fg::Status s = pg->matmul_reduce_scatter(v(a), v(w), bv, v(out)); !s.ok()) raise(s);
  return out;
}

// Our backend behind a Python object, or a TypeError naming what it was.
ProcessGroupFastgather* ours(const py::handle& obj, const char* what) {
  auto* mine = py::isinstance<ProcessGroupFastgather>(obj) ? py::cast<ProcessGroupFastgather*>(obj) : nullptr;
  TORCH_CHECK_TYPE(mine != nullptr, "fastgather: ", what, " is not a fastgather backend");
  return mine;
}

// `nbytes` of uint8 in the group's symmetric heap (Group::empty), which the
// group's all-gathers read in place; the Python side views it as the dtype
// and shape asked for. The tensor keeps the heap alive.
at::Tensor empty_bytes(ProcessGroupFastgather& pg, int64_t nbytes) {
  TORCH_CHECK_VALUE(nbytes >= 0, "fastgather: empty: negative size ", nbytes);
  auto t = pg.group().empty(fg::DType::kU8, {nbytes});
  if (!t.ok()) raise(t.status());
  auto* held = new fg::Tensor(std::move(t).value());
  return at::from_blob(held->data(), {nbytes}, [held](void*) { delete held; }, at::TensorOptions().dtype(at::kByte));
}

// fastgather.set_settings(**kw): the environment's settings with these
// overrides, checked, for the backends made from now on; no keyword: back to
// the environment alone. Unknown names and wrong types are TypeError, values
// out of range ValueError, each naming the setting.
void set_settings(const py::kwargs& kw) {
  if (kw.empty()) {
    PythonSettings& ps = python_settings();
    std::lock_guard<std::mutex> lock(ps.mu);
    ps.settings.reset();
    return;
  }
  auto base = fg::Settings::from_environment();
  if (!base.ok()) raise(base.status());
  fg::Settings s = base.value();
  auto count = [](const std::string& name, py::handle v) -> uint64_t {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
      C10_THROW_ERROR(TypeError, "fastgather: set_settings: " + name + " takes an int, got " +
                                     std::string(py::str(py::type::of(v))));
    }
    const auto x = v.cast<long long>();
    TORCH_CHECK_VALUE(x >= 0, "fastgather: set_settings: ", name, "=", x, " is negative");
    return static_cast<uint64_t>(x);
  };
  auto word = [](const std::string& name, py::handle v, std::initializer_list<const char*> words) -> int {
    if (!py::isinstance<py::str>(v)) {
      C10_THROW_ERROR(TypeError, "fastgather: set_settings: " + name + " takes a str, got " +
                                     std::string(py::str(py::type::of(v))));
    }
    const std::string w = v.cast<std::string>();
    int i = 0;
    std::string all;
    for (const char* x : words) {
      if (w == x) return i;
      all += (all.empty() ? "" : ", ") + std::string(x);
      ++i;
    }
    C10_THROW_ERROR(ValueError, "fastgather: set_settings: " + name + "='" + w + "' is not one of " + all);
  };
  for (auto [key, value] : kw) {
    const std::string k = py::str(key);
    if (k == "ring_bytes") s.ring_bytes = count(k, value);
    else if (k == "pipeline_bytes") s.pipeline_bytes = count(k, value);
    else if (k == "symmetric_bytes") s.symmetric_bytes = count(k, value);
    else if (k == "stream_out_bytes") s.stream_out_bytes = count(k, value);
    else if (k == "single_copy_min_bytes") s.single_copy_min_bytes = count(k, value);
    else if (k == "hier_min_bytes") s.hier_min_bytes = count(k, value);
    else if (k == "net_piece_bytes") s.net_piece_bytes = count(k, value);
    else if (k == "spin_us") s.spin = std::chrono::microseconds(count(k, value));
    else if (k == "yield_us") s.yield = std::chrono::microseconds(count(k, value));
    else if (k == "report_ms") s.report_after = std::chrono::milliseconds(count(k, value));
    else if (k == "copy_in") s.copy_in = static_cast<fg::Settings::CopyIn>(word(k, value, {"learned", "cached", "streaming"}));
    else if (k == "single_copy") s.single_copy = static_cast<fg::Settings::SingleCopy>(word(k, value, {"auto", "off", "always"}));
    else if (k == "fused_gemm") s.fused_gemm = static_cast<fg::Settings::FusedGemm>(word(k, value, {"auto", "openblas", "avx2"}));
    else C10_THROW_ERROR(TypeError, "fastgather: set_settings: no setting named '" + k + "'");
  }
  if (fg::Status st = s.validate(); !st.ok()) raise(st);
  PythonSettings& ps = python_settings();
  std::lock_guard<std::mutex> lock(ps.mu);
  ps.settings = s;
}

c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(store != nullptr, "fastgather: no store");
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "fastgather: rank ", rank, " of ", size);
  return c10::make_intrusive<ProcessGroupFastgather>(store, rank, size, timeout);
}

}  // namespace

TORCH_LIBRARY(fastgather, m) {
  m.def(
      "all_gather_base_mm(Tensor x1, Tensor x2, str hcom, int world_size, Tensor? bias=None, int gather_index=0, "
      "bool gather_output=True, int comm_turn=0) -> (Tensor, Tensor)");
  m.def(
      "mm_reduce_scatter_base(Tensor x1, Tensor x2, str hcom, int world_size, str reduce_op='sum', Tensor? bias=None, "
      "int comm_turn=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastgather, CPU, m) {
  m.impl("all_gather_base_mm", &all_gather_base_mm);
  m.impl("mm_reduce_scatter_base", &mm_reduce_scatter_base);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastgather: a torch.distributed backend and the fused all-gather + matmul";
  py::module_::import("torch.distributed");
  // One name per group in this process, whatever the rank (torch_npu's takes one).
  auto name = [](ProcessGroupFastgather& pg, py::object /*rank*/) { return pg.comm_name(); };
  py::class_<ProcessGroupFastgather, c10d::Backend, c10::intrusive_ptr<ProcessGroupFastgather>>(m,
                                                                                                "ProcessGroupFastgather")
      .def("get_comm_name", name, py::arg("rank") = py::none(), "The name all_gather_base_mm takes as hcom")
      .def("get_hccl_comm_name", name, py::arg("rank") = py::none(), "get_comm_name, under torch_npu's name")
      .def("transport", &ProcessGroupFastgather::transport);
  m.def("create_backend", &create_backend, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
        py::call_guard<py::gil_scoped_release>());
  m.def("comm_name", [](py::handle obj) { return ours(obj, "the backend")->comm_name(); });
  m.def("set_settings", &set_settings);
  m.def("settings_of", [](py::handle obj) { return ours(obj, "the backend")->settings().describe(); });
  m.def("new_settings", [] {
    if (auto s = settings_for_new_backends()) return s->describe();
    auto env = fg::Settings::from_environment();
    if (!env.ok()) raise(env.status());
    return env.value().describe();
  });
  m.def("empty_bytes", [](py::handle obj, int64_t nbytes) { return empty_bytes(*ours(obj, "the backend"), nbytes); });
}
