#include "ops/convert.hpp"

#include <cstring>

#include <fmt/format.h>

#include "fastgather/ops.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastgather::ops {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void half_to_float_f16c(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = half_to_float(s[i]);
}

__attribute__((target("avx2,f16c"))) void float_to_half_f16c(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = float_to_half(s[i]);
}

bool have_f16c() {
  static const bool ok = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return ok;
}
#endif

}  // namespace

void to_float(DType dtype, const void* src, float* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      if (n != 0) std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
#if defined(__x86_64__)
      if (have_f16c()) return half_to_float_f16c(s, dst, n);
#endif
      for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);  // a shift: vectorises
      return;
    }
    default:
      return;
  }
}

void from_float(DType dtype, const float* src, void* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      if (n != 0) std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
#if defined(__x86_64__)
      if (have_f16c()) return float_to_half_f16c(src, d, n);
#endif
      for (size_t i = 0; i < n; ++i) d[i] = float_to_half(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
      return;
    }
    default:
      return;
  }
}

}  // namespace fastgather::ops

namespace fastgather {

Status convert(const TensorView& src, const TensorView& dst) {
  auto floating = [](DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; };
  if (!floating(src.dtype) || !floating(dst.dtype)) {
    return {ErrorKind::kInvalidArgument, fmt::format("convert: {} -> {}: only fp32, fp16 and bf16", src.describe(), dst.describe())};
  }
  if (src.numel() != dst.numel()) {
    return {ErrorKind::kInvalidArgument, fmt::format("convert: {} has {} elements, {} has {}", src.describe(), src.numel(),
                                                     dst.describe(), dst.numel())};
  }
  const size_t n = static_cast<size_t>(src.numel());
  if (n == 0) return Status::Ok();  // nothing to convert (empty views may hold no memory at all)
  if (src.data == nullptr || dst.data == nullptr) {
    return {ErrorKind::kInvalidArgument, fmt::format("convert: {} -> {}: a tensor of {} elements is null", src.describe(),
                                                     dst.describe(), n)};
  }
  if (src.dtype == dst.dtype) {
    std::memmove(dst.data, src.data, src.nbytes());
  } else if (dst.dtype == DType::kF32) {
    ops::to_float(src.dtype, src.data, static_cast<float*>(dst.data), n);
  } else if (src.dtype == DType::kF32) {
    ops::from_float(dst.dtype, static_cast<const float*>(src.data), dst.data, n);
  } else {  // fp16 <-> bf16 through fp32, in blocks
    float tmp[1024];
    const size_t es = dtype_size(src.dtype), ed = dtype_size(dst.dtype);
    for (size_t i = 0; i < n; i += 1024) {
      const size_t c = std::min<size_t>(1024, n - i);
      ops::to_float(src.dtype, static_cast<const char*>(src.data) + i * es, tmp, c);
      ops::from_float(dst.dtype, tmp, static_cast<char*>(dst.data) + i * ed, c);
    }
  }
  return Status::Ok();
}

}  // namespace fastgather
