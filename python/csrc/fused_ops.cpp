// The torch_npu operators, on a fastgather group named by its hcom name:
// fastgather::all_gather_base_mm (torch_npu.npu_all_gather_base_mm) and
// fastgather::mm_reduce_scatter_base (torch_npu.npu_mm_reduce_scatter_base).
// Blocking: each runs in order with the group's other requests (the library
// drives the ones started before it first).
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend.hpp"

namespace fastgather_torch {
namespace {

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
  if (fg::Status s = fg::all_gather_matmul(pg->group(), v(a), v(w), bv, v(out), gather_output ? v(gathered) : fg::TensorView{}, opt);
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
  if (fg::Status s = fg::matmul_reduce_scatter(pg->group(), v(a), v(w), bv, v(out)); !s.ok()) raise(s);
  return out;
}

}  // namespace
}  // namespace fastgather_torch

TORCH_LIBRARY(fastgather, m) {
  m.def(
      "all_gather_base_mm(Tensor x1, Tensor x2, str hcom, int world_size, Tensor? bias=None, int gather_index=0, "
      "bool gather_output=True, int comm_turn=0) -> (Tensor, Tensor)");
  m.def(
      "mm_reduce_scatter_base(Tensor x1, Tensor x2, str hcom, int world_size, str reduce_op='sum', Tensor? bias=None, "
      "int comm_turn=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastgather, CPU, m) {
  m.impl("all_gather_base_mm", &fastgather_torch::all_gather_base_mm);
  m.impl("mm_reduce_scatter_base", &fastgather_torch::mm_reduce_scatter_base);
}

