// Element types of tensors and collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastgather {

enum class DType : uint32_t { kF32 = 1, kF16, kBF16, kF64, kI8, kU8, kI32, kI64, kI16, kBool };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16", "bf16"/"bfloat16", ...
bool parse_dtype(const std::string& text, DType* out);

}  // namespace fastgather
