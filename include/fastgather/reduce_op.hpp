// The element-wise reductions of reduce_scatter and all_reduce (torch's
// ReduceOp): vocabulary of the ops, the algorithms' headers and their
// errors, so implemented at the bottom (src/base).
#pragma once

#include <cstdint>

#include "fastgather/dtype.hpp"

namespace fastgather {

enum class ReduceOp : uint8_t {
  kSum = 0,  // integers wrap; fp16/bf16 in fp32, rounded once
  kAvg,      // floating dtypes: the sum over the members, divided by their number
  kProduct,  // integers wrap; fp16/bf16 in fp32, rounded once
  kMin,      // NaN wins, as torch.minimum
  kMax,      // NaN wins, as torch.maximum
  kBand,     // integers and bool
  kBor,
  kBxor,
};
// "sum", "avg", "product", "min", "max", "band", "bor", "bxor"
const char* to_string(ReduceOp op);

// Whether `op` is served for `dtype`: sum, product, min and max for every
// dtype (bool: sum and max are "or", product and min "and"); avg for fp32,
// fp16, bf16 and fp64; band, bor and bxor for the integers and bool.
bool reducible(ReduceOp op, DType dtype);

}  // namespace fastgather
