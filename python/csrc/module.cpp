// The extension module fastgather._C: registers the backend's class,
// makes backends for torch (python/fastgather/__init__.py registers
// create_backend with torch.distributed), and the settings set from Python.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <mutex>
#include <optional>
#include <string>

#include "backend.hpp"

namespace fastgather_torch {
namespace {

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
  return c10::make_intrusive<ProcessGroupFastgather>(store, rank, size, timeout, settings_for_new_backends());
}

}  // namespace
}  // namespace fastgather_torch

using namespace fastgather_torch;

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastgather: a torch.distributed backend and the fused all-gather + matmul";
  py::module_::import("torch.distributed");
  // One name per group in this process, whatever the rank (torch_npu's takes one).
  auto name = [](ProcessGroupFastgather& pg, py::object /*rank*/) { return pg.comm_name(); };
  py::class_<ProcessGroupFastgather, c10d::Backend, c10::intrusive_ptr<ProcessGroupFastgather>>(m,
                                                                                                "ProcessGroupFastgather")
      .def("get_comm_name", name, py::arg("rank") = py::none(), "The name all_gather_base_mm takes as hcom")
      .def("get_hccl_comm_name", name, py::arg("rank") = py::none(), "get_comm_name, under torch_npu's name")
      .def("transport", &ProcessGroupFastgather::transport)
      .def("handle", &ProcessGroupFastgather::handle, "The group's handle for the direct operators");
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
