// Bulk conversions between the fused op's input dtypes and fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fastgather/tensor.hpp"

namespace fastgather::ops {

// src holds count elements of dtype (fp32, fp16 or bf16).
void to_float(DType dtype, const void* src, float* dst, size_t count);
void from_float(DType dtype, const float* src, void* dst, size_t count);

}  // namespace fastgather::ops
