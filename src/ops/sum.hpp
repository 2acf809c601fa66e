// The element-wise sums of the reductions: dst = srcs[0] + ... + srcs[n-1],
// in that order, for every element. fp16 and bf16 are summed in fp32 and
// rounded once (to nearest even); integers wrap. Vectorised with what the CPU
// has (AVX-512, AVX2, else SSE2: chosen at run time; the bf16 sum by hand
// with AVX-512BW); the order of the additions, and so every bit of the
// result, is the same on each (a NaN stays a NaN; which operand's payload it
// carries is the instruction's choice).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fastgather/dtype.hpp"
#include "fastgather/reduce_op.hpp"

namespace fastgather::ops {

// fp32, fp16, bf16, fp64, int32, int64.
bool summable(DType dtype);
// dst may be one of the sources; n >= 1; bytes a multiple of the element.
void sum(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes);

// For tests: the bf16 sum by the compiler's loop alone (what sum() runs
// where the CPU lacks AVX-512BW), and whether sum() runs the hand-written
// AVX-512 loop on this CPU instead (same bits).
void sum_bf16_portable(uint16_t* dst, const std::byte* const* srcs, int n, size_t count);
bool sum_bf16_by_hand();

// A sum in two parts (across servers: each server's partial sum, then the
// sum of the partials), with the bits of one: fp16 and bf16 partials stay in
// fp32, which is `widening` (2) times their bytes; other dtypes are their own
// partials (1). `bytes` is in the dtype's bytes for both.
size_t widening(DType dtype);
// dst (fp32 for fp16/bf16) = srcs[0] + ... + srcs[n-1] of the dtype, unrounded.
void sum_partial(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes);
// dst (the dtype) = partials srcs[0] + ... + srcs[n-1], rounded once.
void sum_partials(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes);

// Every reduction of reduce_scatter and all_reduce (fastgather/reduce_op.hpp),
// as the schedules' Sum callbacks apply it: sources combined in the order
// given (member order), element by element, so every member gets the same
// bits. fp16/bf16 are combined in fp32 and rounded once (min and max pick
// an input, exactly); integers wrap; bool: sum and max are "or", product and
// min "and". kAvg is the sum divided by `members` (the group's size), once.
struct Reduction {
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kF32;
  int members = 1;

  // dst = the result of srcs[0..n) (dst may be one of them; n >= 1).
  void apply(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) const;
  // In two parts (across servers), with the bits of one: partial() combines
  // sources into a partial result (fp32 for fp16/bf16 sums, averages and
  // products: widening() times their bytes; the dtype otherwise);
  // of_partials() combines partials into the result. `bytes` is in the
  // dtype's bytes for both.
  size_t widening() const;
  void partial(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) const;
  void of_partials(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) const;
};

}  // namespace fastgather::ops
