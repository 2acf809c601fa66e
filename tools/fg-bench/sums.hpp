// Values whose sums are known bit for bit, for the reductions' check mode
// (and the fused ops' inputs): every reduction fg-bench runs, fastgather's
// and MPI's, is checked against the same expected sums; and the fp32 GEMM
// the fused ops are checked and timed against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fastgather/fastgather.hpp"
#include "pattern.hpp"

namespace fastgather::bench {

// Values k/8 for k in -8..7: exact in fp16 and bf16; a sum of up to 32 of
// them, and a dot product over up to 2^12, is exact in fp32 in any order.
inline float exact_value(int rank, uint64_t it, size_t index) {
  return static_cast<float>(static_cast<int>(pattern::word(rank, it, index) & 15u) - 8) * 0.125f;
}

// Element i of dst (count of dtype: fp32, fp16, bf16 or fp64) = exact_value(rank, it, i).
void fill_exact(DType dtype, void* dst, size_t count, int rank, uint64_t it);
// One store to every cache line of [data, data + bytes), each byte kept.
void rewrite_lines(void* data, size_t bytes);
// "" when out[j] is the sum over `ranks` of exact_value(r, it, first + j) for
// every j < count (or their minimum, maximum: exact too; their average: the
// sum over their number, within the dtype's rounding); else the first wrong
// element, in words.
std::string check_exact_sums(DType dtype, const void* out, size_t first, size_t count, const std::vector<int>& ranks,
                             uint64_t it, const std::string& what, ReduceOp op = ReduceOp::kSum);

// count floats as `dtype` (fp32, fp16 or bf16; round to nearest even).
void store_floats(DType dtype, const float* src, void* dst, size_t count);
// c (rows x n) = a (rows x k) @ b (k x n), row-major fp32: OpenBLAS, the
// reference the fused ops' checks and their unfused rows use.
void sgemm_f32(int64_t rows, int64_t n, int64_t k, const float* a, const float* b, float* c);
// The best of five such GEMMs (a of 0.5s), in us: this machine's
// single-thread floor for the fused ops' limit (0 when there is nothing to multiply).
double sgemm_floor_us(int64_t rows, int64_t n, int64_t k, const float* b);

}  // namespace fastgather::bench
