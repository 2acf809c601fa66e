// The reductions' names and what each serves (include/fastgather/reduce_op.hpp).
#include "fastgather/reduce_op.hpp"

namespace fastgather {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "unknown-reduction";
}

bool reducible(ReduceOp op, DType dtype) {
  bool floating = false, integer = false;
  switch (dtype) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF64: floating = true; break;
    case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32: case DType::kI64: case DType::kBool:
      integer = true;
      break;
  }
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kProduct: case ReduceOp::kMin: case ReduceOp::kMax: return floating || integer;
    case ReduceOp::kAvg: return floating;
    case ReduceOp::kBand: case ReduceOp::kBor: case ReduceOp::kBxor: return integer;
  }
  return false;
}

}  // namespace fastgather
