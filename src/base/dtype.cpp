// The element types (include/fastgather/dtype.hpp): vocabulary every layer
// uses, so implemented here at the bottom.
#include "fastgather/dtype.hpp"

namespace fastgather {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kI16: return 2;
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "fp64";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kI16: return "int16";
    case DType::kBool: return "bool";
  }
  return "invalid-dtype";
}

bool parse_dtype(const std::string& t, DType* out) {
  struct Name {
    const char* text;
    DType dtype;
  };
  static const Name kNames[] = {
      {"fp32", DType::kF32},  {"f32", DType::kF32},   {"float32", DType::kF32}, {"float", DType::kF32},
      {"fp16", DType::kF16},  {"f16", DType::kF16},   {"float16", DType::kF16}, {"half", DType::kF16},
      {"bf16", DType::kBF16}, {"bfloat16", DType::kBF16}, {"fp64", DType::kF64}, {"f64", DType::kF64},
      {"float64", DType::kF64}, {"int8", DType::kI8}, {"uint8", DType::kU8}, {"int32", DType::kI32},
      {"int64", DType::kI64}, {"int16", DType::kI16}, {"bool", DType::kBool},
  };
  for (const auto& n : kNames) {
    if (t == n.text) {
      *out = n.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace fastgather
