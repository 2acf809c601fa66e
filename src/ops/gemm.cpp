#include "ops/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/caches.hpp"
#include "ops/convert.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastgather::ops {
namespace {

constexpr size_t kRows = 6;     // rows of the register kernel
constexpr size_t kCols = 16;    // columns of a panel: two 8-float registers
constexpr size_t kKc = 256;     // values of k per pass: a panel slice of 16 KB
constexpr size_t kMostTiles = 16;     // tiles of kRows rows in a chunk of rows, at most

size_t panels_of(size_t n) { return (n + kCols - 1) / kCols; }

// Rows per chunk: a multiple of kRows whose accumulators fill at most a
// quarter of this core's L2 (at least one tile, whatever n is). Every chunk
// streams all of x2's panels past its rows once: where x2 outgrows L2 they
// come from memory, so the more rows they meet the better, as long as the
// accumulators stay in L2 beside the panels' slices (docs/benchmarks.md,
// "The fused ops' GEMM with AVX-512").
size_t chunk_rows(size_t n) {
  const size_t width = std::max<size_t>(panels_of(n) * kCols, kCols);
  const size_t acc_floats = base::l2_bytes() / 4 / sizeof(float);
  return std::clamp<size_t>(acc_floats / width / kRows, 1, kMostTiles) * kRows;
}

#if defined(__x86_64__)
// Adds a (R x kc, row stride lda) @ b (kc x 16) to c (R x 16, row stride ldc).
// Named registers, not arrays: GCC spills an accumulator array to the stack
// on every iteration, which halves the speed.
#define FG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
template <int R>
__attribute__((target("avx2,fma"))) void kernel(const float* __restrict a, size_t lda, const float* __restrict b,
                                                 size_t kc, float* __restrict c, size_t ldc) {
#define FG_LOAD(r)                                                 \
  __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps(); \
  if constexpr (R > r) {                                           \
    c##r##0 = _mm256_loadu_ps(c + r * ldc);                        \
    c##r##1 = _mm256_loadu_ps(c + r * ldc + 8);                    \
  }
  FG_ROWS(FG_LOAD)
  for (size_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * kCols), b1 = _mm256_loadu_ps(b + kk * kCols + 8);
#define FG_FMA(r)                                           \
  if constexpr (R > r) {                                    \
    const __m256 av = _mm256_broadcast_ss(a + r * lda + kk); \
    c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);             \
    c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);             \
  }
    FG_ROWS(FG_FMA)
  }
#define FG_STORE(r)                               \
  if constexpr (R > r) {                          \
    _mm256_storeu_ps(c + r * ldc, c##r##0);       \
    _mm256_storeu_ps(c + r * ldc + 8, c##r##1);   \
  }
  FG_ROWS(FG_STORE)
#undef FG_LOAD
#undef FG_FMA
#undef FG_STORE
#undef FG_ROWS
}

// Two panels at once with AVX-512 (b0: panel p, b1: panel p + 1; c holds
// both, panel p + 1 from c + 16): 12 accumulators of 16 floats, two loads of
// b for twelve FMAs. Twice the AVX2 kernel's floats per instruction, which
// is what OpenBLAS's sgemm has on such a CPU (docs/benchmarks.md).
#define FG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
template <int R>
__attribute__((target("avx512f"))) void kernel2(const float* __restrict a, size_t lda, const float* __restrict b0,
                                                const float* __restrict b1, size_t kc, float* __restrict c, size_t ldc) {
#define FG_LOAD(r)                                                 \
  __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps(); \
  if constexpr (R > r) {                                           \
    c##r##0 = _mm512_loadu_ps(c + r * ldc);                        \
    c##r##1 = _mm512_loadu_ps(c + r * ldc + 16);                   \
  }
  FG_ROWS(FG_LOAD)
  for (size_t kk = 0; kk < kc; ++kk) {
    const __m512 p0 = _mm512_loadu_ps(b0 + kk * kCols), p1 = _mm512_loadu_ps(b1 + kk * kCols);
#define FG_FMA(r)                                           \
  if constexpr (R > r) {                                    \
    const __m512 av = _mm512_set1_ps(a[r * lda + kk]);      \
    c##r##0 = _mm512_fmadd_ps(av, p0, c##r##0);             \
    c##r##1 = _mm512_fmadd_ps(av, p1, c##r##1);             \
  }
    FG_ROWS(FG_FMA)
  }
#define FG_STORE(r)                               \
  if constexpr (R > r) {                          \
    _mm512_storeu_ps(c + r * ldc, c##r##0);       \
    _mm512_storeu_ps(c + r * ldc + 16, c##r##1);  \
  }
  FG_ROWS(FG_STORE)
#undef FG_LOAD
#undef FG_FMA
#undef FG_STORE
#undef FG_ROWS
}

void kernel2_rows(size_t rows, const float* a, size_t lda, const float* b0, const float* b1, size_t kc, float* c,
                  size_t ldc) {
  switch (rows) {
    case 6: return kernel2<6>(a, lda, b0, b1, kc, c, ldc);
    case 5: return kernel2<5>(a, lda, b0, b1, kc, c, ldc);
    case 4: return kernel2<4>(a, lda, b0, b1, kc, c, ldc);
    case 3: return kernel2<3>(a, lda, b0, b1, kc, c, ldc);
    case 2: return kernel2<2>(a, lda, b0, b1, kc, c, ldc);
    default: return kernel2<1>(a, lda, b0, b1, kc, c, ldc);
  }
}

void kernel_rows(size_t rows, const float* a, size_t lda, const float* b, size_t kc, float* c, size_t ldc) {
  switch (rows) {
    case 6: return kernel<6>(a, lda, b, kc, c, ldc);
    case 5: return kernel<5>(a, lda, b, kc, c, ldc);
    case 4: return kernel<4>(a, lda, b, kc, c, ldc);
    case 3: return kernel<3>(a, lda, b, kc, c, ldc);
    case 2: return kernel<2>(a, lda, b, kc, c, ldc);
    default: return kernel<1>(a, lda, b, kc, c, ldc);
  }
}
#else
void kernel_rows(size_t, const float*, size_t, const float*, size_t, float*, size_t) {}
void kernel2_rows(size_t, const float*, size_t, const float*, const float*, size_t, float*, size_t) {}
#endif

bool avx512_supported() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

}  // namespace

bool packed_gemm_supported() {
#if defined(__x86_64__)
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

// The packed panels start on a cache line: a 16-float row of a panel is
// then one line, and no load of the kernel splits across two. (Before,
// where the scratch's allocation happened to fall decided it, and the fused
// op's speed moved with unrelated changes: docs/benchmarks.md.)
constexpr size_t kLineFloats = 64 / sizeof(float);

size_t PackedGemm::scratch_floats(size_t k, size_t n) {
  const size_t width = panels_of(n) * kCols;
  return kLineFloats + width * k + width + kRows * kKc + chunk_rows(n) * width;
}

PackedGemm::PackedGemm(GemmKernel kernel, DType dtype, const void* b, size_t k, size_t n, const void* bias,
                       float* scratch)
    : kernel_(kernel), dtype_(dtype), k_(k), n_(n), panels_(panels_of(n)) {
  const size_t width = panels_ * kCols;
  const auto at = reinterpret_cast<uintptr_t>(scratch);
  b_ = reinterpret_cast<float*>((at + 63) & ~uintptr_t{63});  // scratch holds kLineFloats floats of room for this
  bias_ = b_ + width * k;
  tile_ = bias_ + width;
  acc_ = tile_ + kRows * kKc;
  if (n == kCols) {  // b is one panel already: convert it in one pass
    to_float(dtype, b, b_, k * kCols);
  } else {
    // Row by row: convert a row of b into the accumulators' space (free
    // until multiply()), then deal its 16-column pieces out to the panels.
    const size_t elt = dtype_size(dtype);
    const auto* src = static_cast<const std::byte*>(b);
    float* row = acc_;
    std::fill(row + n, row + width, 0.0f);
    // fp32 rows of whole panels are dealt out from where they lie.
    const bool direct = dtype == DType::kF32 && n % kCols == 0;
    for (size_t kk = 0; kk < k; ++kk) {
      const float* from = reinterpret_cast<const float*>(src + kk * n * elt);
      if (!direct) {
        to_float(dtype, src + kk * n * elt, row, n);
        from = row;
      }
      for (size_t p = 0; p < panels_; ++p) std::memcpy(b_ + (p * k + kk) * kCols, from + p * kCols, kCols * sizeof(float));
    }
  }
  std::fill(bias_, bias_ + width, 0.0f);
  if (bias != nullptr) to_float(dtype, bias, bias_, n);
}

void PackedGemm::multiply(const void* a, size_t rows, void* c, DType c_dtype) {
  const size_t width = panels_ * kCols;
  const size_t elt = dtype_size(dtype_);
  const size_t chunk = chunk_rows(n_);
  const auto* a_bytes = static_cast<const std::byte*>(a);
  auto* c_bytes = static_cast<std::byte*>(c);
  const bool f32 = dtype_ == DType::kF32;
  const bool wide = kernel_ == GemmKernel::kAvx512;
  for (size_t r0 = 0; r0 < rows; r0 += chunk) {
    const size_t rs = std::min(chunk, rows - r0);
    for (size_t r = 0; r < rs; ++r) std::memcpy(acc_ + r * width, bias_, width * sizeof(float));
    for (size_t k0 = 0; k0 < k_; k0 += kKc) {
      const size_t kc = std::min(kKc, k_ - k0);
      for (size_t t0 = 0; t0 < rs; t0 += kRows) {
        const size_t tr = std::min(kRows, rs - t0);
        const std::byte* first = a_bytes + ((r0 + t0) * k_ + k0) * elt;
        const float* tile = reinterpret_cast<const float*>(first);
        size_t lda = k_;
        if (!f32) {  // this tile of a in fp32, hot in L1 for every panel
          for (size_t r = 0; r < tr; ++r) to_float(dtype_, first + r * k_ * elt, tile_ + r * kKc, kc);
          tile = tile_;
          lda = kKc;
        }
        size_t p = 0;
        if (wide) {
          for (; p + 1 < panels_; p += 2) {
            const float* b0 = b_ + (p * k_ + k0) * kCols;
            kernel2_rows(tr, tile, lda, b0, b0 + k_ * kCols, kc, acc_ + t0 * width + p * kCols, width);
          }
        }
        for (; p < panels_; ++p) {
          kernel_rows(tr, tile, lda, b_ + (p * k_ + k0) * kCols, kc, acc_ + t0 * width + p * kCols, width);
        }
      }
    }
    const size_t c_elt = dtype_size(c_dtype);
    for (size_t r = 0; r < rs; ++r) from_float(c_dtype, acc_ + r * width, c_bytes + (r0 + r) * n_ * c_elt, n_);
  }
}

bool multiply_whole(DType dtype, size_t m, size_t k, size_t n) {
  const size_t l2 = base::l2_bytes();
  const size_t x2 = k * n * sizeof(float);
  // The product, and for other dtypes x1's fp32 copy, are held whole.
  if (m * n * sizeof(float) > kWholeMaxBytes) return false;
  if (dtype != DType::kF32 && m * k * sizeof(float) > kWholeMaxBytes) return false;
  return x2 > l2 / 2 || (dtype == DType::kF32 && m < kWholeBelowRows);
}

GemmKernel gemm_kernel(int gemm_threads, const Settings& settings) {
  if (settings.fused_gemm == Settings::FusedGemm::kOpenBlas || gemm_threads > 1 || !packed_gemm_supported()) {
    return GemmKernel::kOpenBlas;
  }
  return settings.fused_gemm != Settings::FusedGemm::kAvx2 && avx512_supported() ? GemmKernel::kAvx512
                                                                                  : GemmKernel::kAvx2;
}

void set_blas_threads(int threads) {
  if (threads < 1) threads = 1;
  if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
}

}  // namespace fastgather::ops
