// fastgather as a torch.distributed backend (torch 1.13's c10d API) and the
// fused all-gather + matmul for torch tensors. Built as the extension module
// fastgather._C; python/fastgather/__init__.py registers the backend.
//
// One ProcessGroupFastgather per torch group: a fastgather Communicator
// whose world is the group's members, meeting through the store torch hands
// the backend (a PrefixStore of the group), with the ranks that share a host
// found from host identities. Nothing here forks.
//
// Ops run to completion before they return (the library's collectives are
// blocking and the group is driven by one thread): the Work handed back is
// already complete, its future already holds the outputs.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fastgather/fastgather.hpp"

namespace fg = fastgather;

namespace {

constexpr const char* kOnlyThese =
    "fastgather serves all_gather, all_gather_into_tensor (_all_gather_base), broadcast and barrier; keep gloo for "
    "the world group (init_process_group(\"gloo\", ...)) and create the groups that gather with "
    "new_group(ranks, backend=\"fastgather\")";

[[noreturn]] void fail(const fg::Status& s) { throw std::runtime_error("fastgather: " + s.to_string()); }

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

fg::DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return fg::DType::kF32;
    case at::kHalf: return fg::DType::kF16;
    case at::kBFloat16: return fg::DType::kBF16;
    case at::kDouble: return fg::DType::kF64;
    case at::kChar: return fg::DType::kI8;
    case at::kByte: return fg::DType::kU8;
    case at::kShort: return fg::DType::kI16;
    case at::kInt: return fg::DType::kI32;
    case at::kLong: return fg::DType::kI64;
    case at::kBool: return fg::DType::kBool;
    default: break;
  }
  TORCH_CHECK(false, "fastgather: dtype ", t.scalar_type(), " is not supported");
}

void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "fastgather: ", what, " is on ", t.device(), "; this build serves CPU tensors");
}

// A contiguous view of t for the library (t must be contiguous).
fg::TensorView view_of(const at::Tensor& t) {
  return fg::TensorView(t.data_ptr(), dtype_of(t), {t.numel()});
}

// Where to put results: t itself if contiguous, else a contiguous temporary
// copied back by finish().
struct Landing {
  at::Tensor user, buf;
  explicit Landing(const at::Tensor& t) : user(t), buf(t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous)) {}
  void finish() {
    if (!buf.is_same(user)) user.copy_(buf);
  }
};

class CompletedWork : public c10d::Work {
 public:
  CompletedWork(c10d::OpType type, std::vector<at::Tensor> result) : c10d::Work(-1, type), result_(std::move(result)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> result) {
  return c10::make_intrusive<CompletedWork>(type, std::move(result));
}

class ProcessGroupFastgather;

// hcom names -> groups, for all_gather_base_mm (the role of get_hccl_comm_name).
std::mutex g_names_mu;
std::map<std::string, ProcessGroupFastgather*> g_names;
int g_serial = 0;

class ProcessGroupFastgather : public c10d::ProcessGroup {
 public:
  ProcessGroupFastgather(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
      : c10d::ProcessGroup(rank, size) {
    fg::Config c;
    c.rank = rank;
    c.world_size = size;
    c.servers = 0;  // find the ranks that share this host
    c.timeout = timeout;
    auto comm = fg::Communicator::create(c, std::make_shared<C10dStore>(store));
    if (!comm.ok()) fail(comm.status());
    comm_ = std::move(comm).value();
    std::lock_guard<std::mutex> lock(g_names_mu);
    name_ = "fastgather-" + std::to_string(++g_serial);
    g_names[name_] = this;
  }
  ~ProcessGroupFastgather() override {
    std::lock_guard<std::mutex> lock(g_names_mu);
    g_names.erase(name_);
  }

  const std::string getBackendName() const override { return "fastgather"; }
  const std::string& name() const { return name_; }
  fg::Group& group() { return comm_->world(); }
  std::string transport() const { return comm_->transport(); }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "fastgather: all_gather takes one input and one output list");
    check_cpu(inputs[0], "the input");
    TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "fastgather: all_gather needs ", size_,
                " output tensors (one per rank of the group), got ", outputs[0].size());
    const at::Tensor in = inputs[0].contiguous();
    std::vector<Landing> land;
    std::vector<fg::TensorView> views;
    land.reserve(outputs[0].size());
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      const at::Tensor& o = outputs[0][i];
      check_cpu(o, "an output");
      TORCH_CHECK(o.scalar_type() == in.scalar_type() && o.numel() == in.numel(), "fastgather: all_gather output ", i,
                  " is ", o.scalar_type(), o.sizes(), ", the input is ", in.scalar_type(), in.sizes());
      land.emplace_back(o);
      views.push_back(view_of(land.back().buf));
    }
    if (fg::Status s = fg::all_gather(group(), view_of(in), std::span<const fg::TensorView>(views)); !s.ok()) fail(s);
    for (Landing& l : land) l.finish();
    return done(c10d::OpType::ALLGATHER, outputs[0]);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    check_cpu(input, "the input");
    check_cpu(output, "the output");
    const at::Tensor in = input.contiguous();
    TORCH_CHECK(output.scalar_type() == in.scalar_type() && output.numel() == in.numel() * size_,
                "fastgather: all_gather_into_tensor output is ", output.scalar_type(), output.sizes(), "; ", size_,
                " ranks x input ", in.scalar_type(), in.sizes(), " need ", in.numel() * size_, " elements");
    Landing land(output);
    if (fg::Status s = fg::all_gather(group(), view_of(in), view_of(land.buf)); !s.ok()) fail(s);
    land.finish();
    return done(c10d::OpType::_ALLGATHER_BASE, {output});
  }

  // Every rank's tensor is gathered and the root's block kept: correct for
  // every dtype and layout, at (size-1) times the traffic of a tree; the
  // library has no one-to-all schedule yet.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1, "fastgather: broadcast takes one tensor");
    check_cpu(tensors[0], "the tensor");
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "fastgather: broadcast root ", opts.rootRank,
                " is outside the group of ", size_);
    at::Tensor& t = tensors[0];
    const at::Tensor in = t.contiguous();
    at::Tensor all = at::empty({size_ * in.numel()}, in.options());
    if (fg::Status s = fg::all_gather(group(), view_of(in), view_of(all)); !s.ok()) fail(s);
    if (rank_ != opts.rootRank) t.copy_(all.narrow(0, opts.rootRank * in.numel(), in.numel()).view(t.sizes()));
    return done(c10d::OpType::BROADCAST, tensors);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    if (fg::Status s = fg::barrier(group()); !s.ok()) fail(s);
    return done(c10d::OpType::BARRIER, {});
  }

#define FG_UNSUPPORTED(op, ...)                                                          \
  c10::intrusive_ptr<c10d::Work> op(__VA_ARGS__) override {                              \
    TORCH_CHECK(false, "fastgather: " #op " is not supported by this backend. ", kOnlyThese); \
  }
  FG_UNSUPPORTED(allreduce, std::vector<at::Tensor>&, const c10d::AllreduceOptions&)
  FG_UNSUPPORTED(allreduce_coalesced, std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&)
  FG_UNSUPPORTED(reduce, std::vector<at::Tensor>&, const c10d::ReduceOptions&)
  FG_UNSUPPORTED(allgather_coalesced, std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                 const c10d::AllgatherOptions&)
  FG_UNSUPPORTED(gather, std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&, const c10d::GatherOptions&)
  FG_UNSUPPORTED(scatter, std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&, const c10d::ScatterOptions&)
  FG_UNSUPPORTED(reduce_scatter, std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                 const c10d::ReduceScatterOptions&)
  FG_UNSUPPORTED(_reduce_scatter_base, at::Tensor&, at::Tensor&, const c10d::ReduceScatterOptions&)
  FG_UNSUPPORTED(alltoall_base, at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                 const c10d::AllToAllOptions&)
  FG_UNSUPPORTED(alltoall, std::vector<at::Tensor>&, std::vector<at::Tensor>&, const c10d::AllToAllOptions&)
  FG_UNSUPPORTED(send, std::vector<at::Tensor>&, int, int)
  FG_UNSUPPORTED(recv, std::vector<at::Tensor>&, int, int)
  FG_UNSUPPORTED(recvAnysource, std::vector<at::Tensor>&, int)
#undef FG_UNSUPPORTED

 private:
  std::unique_ptr<fg::Communicator> comm_;
  std::string name_;
};

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::duration<float> timeout) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ProcessGroupFastgather>(store, rank, size, ms);
}

ProcessGroupFastgather* find_group(const std::string& hcom) {
  std::lock_guard<std::mutex> lock(g_names_mu);
  auto it = g_names.find(hcom);
  TORCH_CHECK(it != g_names.end(), "fastgather: no fastgather group is named '", hcom,
              "' in this process (get it from fastgather.get_comm_name(group, rank))");
  return it->second;
}

std::string comm_name(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  auto* ours = dynamic_cast<ProcessGroupFastgather*>(pg.get());
  TORCH_CHECK(ours != nullptr, "fastgather: group is a '", pg->getBackendName(),
              "' group; create it with new_group(ranks, backend=\"fastgather\")");
  return ours->name();
}

// `nbytes` of uint8 in the group's symmetric heap (Group::empty), which the
// group's all-gathers read in place; the Python side views it as the dtype
// and shape asked for. The tensor keeps the heap alive.
at::Tensor empty_bytes(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t nbytes) {
  auto* ours = dynamic_cast<ProcessGroupFastgather*>(pg.get());
  TORCH_CHECK(ours != nullptr, "fastgather: group is a '", pg->getBackendName(),
              "' group; create it with new_group(ranks, backend=\"fastgather\")");
  TORCH_CHECK(nbytes >= 0, "fastgather: empty: negative size ", nbytes);
  auto t = ours->group().empty(fg::DType::kU8, {nbytes});
  if (!t.ok()) fail(t.status());
  auto* held = new fg::Tensor(std::move(t).value());
  return at::from_blob(held->data(), {nbytes}, [held](void*) { delete held; }, at::TensorOptions().dtype(at::kByte));
}

// torch_npu.npu_all_gather_base_mm: output = allgather(x1) @ x2 + bias,
// gather_out = allgather(x1) (an empty tensor when gather_output is false).
std::tuple<at::Tensor, at::Tensor> all_gather_base_mm(const at::Tensor& x1, const at::Tensor& x2, const std::string& hcom,
                                                      int64_t world_size, const std::optional<at::Tensor>& bias,
                                                      int64_t gather_index, bool gather_output, int64_t comm_turn) {
  ProcessGroupFastgather* pg = find_group(hcom);
  TORCH_CHECK(world_size == pg->getSize(), "fastgather: world_size=", world_size, " but group '", hcom, "' has ",
              pg->getSize(), " ranks");
  TORCH_CHECK(gather_index == 0, "fastgather: gather_index=", gather_index, " is not supported (only 0: gather x1)");
  TORCH_CHECK(comm_turn == 0, "fastgather: comm_turn=", comm_turn, " is not supported (only 0)");
  check_cpu(x1, "x1");
  check_cpu(x2, "x2");
  TORCH_CHECK(x1.dim() == 2 && x2.dim() == 2, "fastgather: x1 and x2 must be 2-D, got ", x1.sizes(), " and ", x2.sizes());
  TORCH_CHECK(x1.size(1) == x2.size(0), "fastgather: x1 ", x1.sizes(), " and x2 ", x2.sizes(), " disagree on k");
  const auto dt = x1.scalar_type();
  TORCH_CHECK(dt == at::kHalf || dt == at::kBFloat16 || dt == at::kFloat,
              "fastgather: x1 is ", dt, "; all_gather_base_mm takes float16, bfloat16 or float32");
  TORCH_CHECK(x2.scalar_type() == dt, "fastgather: x2 is ", x2.scalar_type(), ", x1 is ", dt);
  const int64_t m = x1.size(0), k = x1.size(1), n = x2.size(1);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    check_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == dt, "fastgather: bias must be ", dt,
                " of shape [", n, "], got ", bias->scalar_type(), bias->sizes());
    b = bias->contiguous();
  }
  const at::Tensor a = x1.contiguous(), w = x2.contiguous();
  at::Tensor out = at::empty({m * world_size, n}, a.options());
  at::Tensor gathered = gather_output ? at::empty({m * world_size, k}, a.options()) : at::empty({0}, a.options());
  auto dims = [](const at::Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); };
  auto v = [&](const at::Tensor& t) { return fg::TensorView(t.data_ptr(), dtype_of(t), dims(t)); };
  std::optional<fg::TensorView> bv;
  if (b.defined()) bv = v(b);
  fg::AllGatherMatmulOptions opt;
  opt.gather_output = gather_output;
  if (fg::Status s = fg::all_gather_matmul(pg->group(), v(a), v(w), bv, v(out),
                                           gather_output ? v(gathered) : fg::TensorView{}, opt);
      !s.ok()) {
    fail(s);
  }
  return {out, gathered};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastgather: a torch.distributed backend and the fused all-gather + matmul";
  m.def("create_process_group", &create_process_group, pybind11::arg("store"), pybind11::arg("rank"),
        pybind11::arg("size"), pybind11::arg("timeout"));
  m.def("comm_name", &comm_name, pybind11::arg("group"));
  m.def("transport", [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
    auto* ours = dynamic_cast<ProcessGroupFastgather*>(pg.get());
    TORCH_CHECK(ours != nullptr, "fastgather: not a fastgather group");
    return ours->transport();
  });
  m.def("empty_bytes", &empty_bytes, pybind11::arg("group"), pybind11::arg("nbytes"));
  m.def("all_gather_base_mm", &all_gather_base_mm, pybind11::arg("x1"), pybind11::arg("x2"), pybind11::arg("hcom"),
        pybind11::arg("world_size"), pybind11::arg("bias") = pybind11::none(), pybind11::arg("gather_index") = 0,
        pybind11::arg("gather_output") = true, pybind11::arg("comm_turn") = 0);
}
