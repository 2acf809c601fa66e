// Argument checks shared by the collectives: each failure names the rank,
// the group and what was wrong.
#pragma once

#include <string>

#include <fmt/format.h>

#include "fastgather/communicator.hpp"
#include "fastgather/status.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather::ops {

inline Status invalid(const Group& g, const char* op, const std::string& why) {
  return {ErrorKind::kInvalidArgument,
          fmt::format("{} on {} (rank {}): {}", op, g.describe(), g.ranks()[g.rank()], why)};
}

inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return an != 0 && bn != 0 && pa < pb + bn && pb < pa + an;
}

// A buffer holding `bytes` must have a pointer unless it is empty.
inline Status need_data(const Group& g, const char* op, const char* what, const TensorView& t) {
  if (t.data == nullptr && t.nbytes() != 0) return invalid(g, op, fmt::format("{} is null but holds {} bytes", what, t.nbytes()));
  for (int64_t d : t.shape) {
    if (d < 0) return invalid(g, op, fmt::format("{} has a negative dimension: {}", what, t.describe()));
  }
  return Status::Ok();
}

// The fused ops' x1 (m, k) and x2 (k, n): 2-D, one dtype of fp32, fp16 and
// bf16, agreeing on k.
inline Status check_matmul_operands(const Group& g, const char* op, const TensorView& x1, const TensorView& x2) {
  const DType dt = x1.dtype;
  if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16) {
    return invalid(g, op, fmt::format("x1 is {}; supported dtypes are fp32, fp16 and bf16", dtype_name(dt)));
  }
  if (x1.shape.size() != 2) return invalid(g, op, fmt::format("x1 must be 2-D (m, k), got {}", x1.describe()));
  if (x2.shape.size() != 2) return invalid(g, op, fmt::format("x2 must be 2-D (k, n), got {}", x2.describe()));
  if (x2.dtype != dt) return invalid(g, op, fmt::format("x2 is {}, x1 is {}", dtype_name(x2.dtype), dtype_name(dt)));
  if (x2.shape[0] != x1.shape[1]) {
    return invalid(g, op, fmt::format("x1 {} has k={}, x2 {} has {} rows", x1.describe(), x1.shape[1], x2.describe(),
                                      x2.shape[0]));
  }
  return Status::Ok();
}

}  // namespace fastgather::ops
