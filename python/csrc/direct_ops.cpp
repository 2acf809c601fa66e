// The direct operators: torch.ops.fastgather.all_reduce, all_gather_into_tensor,
// reduce_scatter_tensor and broadcast (in-place and out-of-place, as torch's
// functional collectives have them), what an inference engine calls on every
// token. No Work, no torch.distributed Python layer, no hand-off: each runs
// the library's blocking call on the caller's thread (the GIL released), in
// order with the group's other requests (the library drives those started
// before it first). The group is named by its handle (fastgather.handle):
// an index into this process's table, looked up per call under one lock.
// Their fake kernels (shapes for torch.compile) are in fastgather/__init__.py.
#include <torch/library.h>

#include <string>
#include <vector>

#include "backend.hpp"
#include "backend_parts.hpp"

namespace fastgather_torch {
namespace {

// torch's functional collectives name reductions in lower case.
c10d::ReduceOp reduction_named(const char* op, c10::string_view name) {
  static constexpr std::pair<const char*, c10d::ReduceOp::RedOpType> kNames[] = {
      {"sum", c10d::ReduceOp::SUM}, {"avg", c10d::ReduceOp::AVG},   {"product", c10d::ReduceOp::PRODUCT},
      {"min", c10d::ReduceOp::MIN}, {"max", c10d::ReduceOp::MAX},   {"band", c10d::ReduceOp::BAND},
      {"bor", c10d::ReduceOp::BOR}, {"bxor", c10d::ReduceOp::BXOR}};
  for (const auto& [word, type] : kNames) {
    if (name == word) return c10d::ReduceOp(type);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "fastgather: ", op, ": reduce_op='", std::string(name),
                              "' is not supported (sum, avg, product, min, max, band, bor, bxor)");
}

// Runs the library's blocking call, the GIL released; its error as Python's.
template <class Call>
void run(Call&& call) {
  fg::Status s;
  without_gil([&] { s = call(); });
  if (!s.ok()) raise(s);
}

void check_size(const char* op, const ProcessGroupFastgather& pg, int64_t group_size) {
  TORCH_CHECK_VALUE(group_size == pg.getSize(), "fastgather: ", op, ": group_size=", group_size, " but the group has ",
                    pg.getSize(), " ranks");
}

// The contiguous tensor an in-place op works on: t, or a copy written back by done().
struct InPlace {
  at::Tensor& user;
  at::Tensor buf;
  explicit InPlace(at::Tensor& t) : user(t), buf(t.contiguous()) {}
  void done() {
    if (!buf.is_same(user)) user.copy_(buf);
  }
};

void all_reduce_(at::Tensor& t, c10::string_view reduce_op, int64_t group) {
  auto pg = group_of_handle(group);
  const fg::ReduceOp red = check_reduce("all_reduce_", t, "the tensor", reduction_named("all_reduce_", reduce_op));
  InPlace io(t);
  run([&] { return fg::all_reduce(pg->group(), view_of(io.buf), view_of(io.buf), {.op = red}); });
  io.done();
}

at::Tensor all_reduce(const at::Tensor& input, c10::string_view reduce_op, int64_t group) {
  auto pg = group_of_handle(group);
  const fg::ReduceOp red = check_reduce("all_reduce", input, "the input", reduction_named("all_reduce", reduce_op));
  const at::Tensor in = input.contiguous();
  at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
  run([&] { return fg::all_reduce(pg->group(), view_of(in), view_of(out), {.op = red}); });
  return out;
}

std::vector<int64_t> rows_times(const at::Tensor& t, int64_t factor) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  if (shape.empty()) shape.push_back(1);
  shape[0] *= factor;
  return shape;
}

void all_gather_into_tensor_out(const at::Tensor& input, int64_t group_size, int64_t group, at::Tensor& out) {
  constexpr const char* kOp = "all_gather_into_tensor_out";
  auto pg = group_of_handle(group);
  check_size(kOp, *pg, group_size);
  check_tensor(input, kOp, "the input");
  check_tensor(out, kOp, "out");
  TORCH_CHECK_VALUE(out.scalar_type() == input.scalar_type() && out.numel() == input.numel() * group_size,
                    "fastgather: ", kOp, ": out is ", out.scalar_type(), out.sizes(), ", the input ", input.scalar_type(),
                    input.sizes(), ": out must hold group_size (", group_size, ") inputs of its dtype");
  const at::Tensor in = input.contiguous();
  InPlace io(out);
  run([&] { return fg::all_gather(pg->group(), view_of(in), view_of(io.buf)); });
  io.done();
}

at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t group_size, int64_t group) {
  constexpr const char* kOp = "all_gather_into_tensor";
  auto pg = group_of_handle(group);
  check_size(kOp, *pg, group_size);
  check_tensor(input, kOp, "the input");
  const at::Tensor in = input.contiguous();
  at::Tensor out = at::empty(rows_times(in, group_size), in.options());
  run([&] { return fg::all_gather(pg->group(), view_of(in), view_of(out)); });
  return out;
}

at::Tensor reduce_scatter_tensor(const at::Tensor& input, c10::string_view reduce_op, int64_t group_size, int64_t group) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  auto pg = group_of_handle(group);
  check_size(kOp, *pg, group_size);
  const fg::ReduceOp red = check_reduce(kOp, input, "the input", reduction_named(kOp, reduce_op));
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(0) % group_size == 0, "fastgather: ", kOp, ": the input's ",
                    input.sizes(), " first dimension does not split over ", group_size, " ranks");
  const at::Tensor in = input.contiguous();
  std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end());
  shape[0] /= group_size;
  at::Tensor out = at::empty(shape, in.options());
  run([&] { return fg::reduce_scatter(pg->group(), view_of(in), view_of(out), {.op = red}); });
  return out;
}

void broadcast_(at::Tensor& t, int64_t src, int64_t group) {
  auto pg = group_of_handle(group);
  check_tensor(t, "broadcast_", "the tensor");
  TORCH_CHECK_VALUE(src >= 0 && src < pg->getSize(), "fastgather: broadcast_: src ", src, " is not a group rank (0..",
                    pg->getSize() - 1, ")");
  InPlace io(t);
  run([&] { return fg::broadcast(pg->group(), view_of(io.buf), static_cast<int>(src)); });
  io.done();
}

at::Tensor broadcast(const at::Tensor& input, int64_t src, int64_t group) {
  check_tensor(input, "broadcast", "the input");
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  broadcast_(out, src, group);
  return out;
}

}  // namespace
}  // namespace fastgather_torch

TORCH_LIBRARY_FRAGMENT(fastgather, m) {
  m.def("all_reduce(Tensor input, str reduce_op, int group) -> Tensor");
  // The in-place and out= forms return nothing: torch.compile functionalizes a
  // custom operator that writes its argument only if no output aliases it.
  m.def("all_reduce_(Tensor(a!) input, str reduce_op, int group) -> ()");
  m.def("all_gather_into_tensor(Tensor input, int group_size, int group) -> Tensor");
  m.def("all_gather_into_tensor_out(Tensor input, int group_size, int group, *, Tensor(a!) out) -> ()");
  m.def("reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, int group) -> Tensor");
  m.def("broadcast(Tensor input, int src, int group) -> Tensor");
  m.def("broadcast_(Tensor(a!) input, int src, int group) -> ()");
}

TORCH_LIBRARY_IMPL(fastgather, CPU, m) {
  m.impl("all_reduce", &fastgather_torch::all_reduce);
  m.impl("all_reduce_", &fastgather_torch::all_reduce_);
  m.impl("all_gather_into_tensor", &fastgather_torch::all_gather_into_tensor);
  m.impl("all_gather_into_tensor_out", &fastgather_torch::all_gather_into_tensor_out);
  m.impl("reduce_scatter_tensor", &fastgather_torch::reduce_scatter_tensor);
  m.impl("broadcast", &fastgather_torch::broadcast);
  m.impl("broadcast_", &fastgather_torch::broadcast_);
}
