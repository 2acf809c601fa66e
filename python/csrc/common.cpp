#include "common.hpp"

namespace fastgather_torch {

void raise(const fg::Status& s) {
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

fg::TensorView view_of(const at::Tensor& t) {
  auto [dt, n] = library_dtype(t);
  return fg::TensorView(t.data_ptr(), dt, {n});
}

}  // namespace fastgather_torch
