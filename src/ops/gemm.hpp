// The fused op's GEMM: x2 converted to fp32 and packed once per call, rows of
// x1 converted in cache-sized tiles inside the multiply (no fp32 copy of a
// whole piece, no per-piece re-packing of x2 as a library GEMM call does).
//
// Layout: x2 (k x n, row-major) becomes ceil(n/16) panels of k x 16 fp32,
// the last one zero-padded. A 6 x 16 register kernel (AVX2 + FMA) walks one
// panel over kKc values of k at a time, so the panel's slice (16 KB) stays in
// L1 while every 6-row tile of the piece passes over it; where the CPU has
// AVX-512, a 6 x 32 kernel walks two panels at once (an odd last panel takes
// the AVX2 kernel).
#pragma once

#include <cstddef>

#include "fastgather/settings.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather::ops {

// The CPU has what the kernel needs (AVX2, FMA, F16C).
bool packed_gemm_supported();

// Which GEMM the fused ops run: the packed kernel where the CPU has it and
// one thread multiplies, its AVX-512 form where the CPU has that too (unless
// FG_FUSED_GEMM=avx2); OpenBLAS's sgemm on fp32 copies otherwise, or where
// the settings ask for it (FG_FUSED_GEMM=openblas).
enum class GemmKernel { kOpenBlas, kAvx2, kAvx512 };
GemmKernel gemm_kernel(int gemm_threads, const Settings& settings);
// OpenBLAS's thread count is one setting for the whole process: compared
// with it, not with a per-thread memory of what this thread last set (two
// threads asking for different counts would get out of step).
void set_blas_threads(int threads);

// Whether a fused op multiplies all m rows of x1 (m x k) @ x2 (k x n) in
// one call of OpenBLAS's sgemm - the matmul + reduce-scatter before any row
// is sent, the all-gather + matmul once every row is gathered - rather than
// a piece at a time with the packed kernel, straight into the ring or from
// it. A piece at a time saves the product's (or the rows') trip through
// memory and overlaps the GEMM with the transfer, but x2 must be
// packed for the pieces and streamed past every piece's few rows: where x2
// does not stay in L2 (over half of it), or there are too few rows to pay
// for packing it (kWholeBelowRows, fp32 only), the one call is faster. Other
// dtypes are converted to fp32 for it, x2 and x1 whole, as the unfused op
// does; where x2 stays in L2 pieces of the packed kernel, which converts x1
// in tiles, are as fast or faster (docs/benchmarks.md, "matmul_reduce_scatter"
// and "The fused ops' GEMM with AVX-512"). Not where the product, or x1's
// fp32 copy, would pass kWholeMaxBytes: the op keeps them in the group's
// scratch for the next call.
inline constexpr size_t kWholeBelowRows = 64;
inline constexpr size_t kWholeMaxBytes = size_t{64} << 20;
bool multiply_whole(DType dtype, size_t m, size_t k, size_t n);

class PackedGemm {
 public:
  // floats of scratch pack() and multiply() need for this shape.
  static size_t scratch_floats(size_t k, size_t n);

  // Converts and packs b (k x n of dtype) and bias (n of dtype, or null)
  // into scratch, which must hold scratch_floats(k, n) and outlive this.
  // kernel: kAvx2 or kAvx512 (gemm_kernel()).
  PackedGemm(GemmKernel kernel, DType dtype, const void* b, size_t k, size_t n, const void* bias, float* scratch);

  // c (rows x n of dtype) = a (rows x k of dtype, row stride k) @ b + bias.
  // a may be null when k == 0.
  void multiply(const void* a, size_t rows, void* c) { multiply(a, rows, c, dtype_); }
  // The same with c in c_dtype (fp32: the sums before rounding).
  void multiply(const void* a, size_t rows, void* c, DType c_dtype);

 private:
  GemmKernel kernel_;
  DType dtype_;
  size_t k_, n_, panels_;
  float* b_;     // panels_ * k_ * 16
  float* bias_;  // panels_ * 16, zero when there is no bias
  float* tile_;  // kRows x kKc: a tile of a converted to fp32
  float* acc_;   // kChunk x panels_ * 16: the accumulators of a chunk of rows
};

}  // namespace fastgather::ops
