// The element-wise sums of the reductions: dst = srcs[0] + ... + srcs[n-1],
// in that order, for every element. fp16 and bf16 are summed in fp32 and
// rounded once (to nearest even); integers wrap. Vectorised with what the CPU
// has (AVX-512, AVX2, else SSE2: chosen at run time); the order of the
// additions, and so every bit of the result, is the same on each.
#pragma once

#include <cstddef>

#include "fastgather/dtype.hpp"

namespace fastgather::ops {

// fp32, fp16, bf16, fp64, int32, int64.
bool summable(DType dtype);
// dst may be one of the sources; n >= 1; bytes a multiple of the element.
void sum(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes);

}  // namespace fastgather::ops
