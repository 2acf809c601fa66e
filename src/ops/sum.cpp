#include "ops/sum.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "ops/convert.hpp"

namespace fastgather::ops {
namespace {

// One copy of each loop per instruction set, picked when the library loads.
#if defined(__x86_64__) && !defined(__clang__)
#define FG_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FG_VECTOR_CLONES
#endif

template <typename T>
const T* as(const std::byte* p) {
  return reinterpret_cast<const T*>(p);
}

// Accumulators for this many elements stay in L1 while every source adds to them.
constexpr size_t kBlock = 1024;

FG_VECTOR_CLONES void sum_f32(float* dst, const std::byte* const* s, int n, size_t count) {
  float acc[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const float* a = as<float>(s[0]) + at;
    const float* b = as<float>(s[1]) + at;
    for (size_t i = 0; i < m; ++i) acc[i] = a[i] + b[i];
    for (int j = 2; j < n; ++j) {
      const float* c = as<float>(s[j]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] += c[i];
    }
    float* o = dst + at;
    for (size_t i = 0; i < m; ++i) o[i] = acc[i];
  }
}

inline float from_bf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline uint16_t to_bf16(float f) {  // as float_to_bf16 (tensor.hpp), branch-free
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

FG_VECTOR_CLONES void sum_bf16(uint16_t* dst, const std::byte* const* s, int n, size_t count) {
  float acc[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const uint16_t* a = as<uint16_t>(s[0]) + at;
    const uint16_t* b = as<uint16_t>(s[1]) + at;
    for (size_t i = 0; i < m; ++i) acc[i] = from_bf16(a[i]) + from_bf16(b[i]);
    for (int j = 2; j < n; ++j) {
      const uint16_t* c = as<uint16_t>(s[j]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] += from_bf16(c[i]);
    }
    uint16_t* o = dst + at;
    for (size_t i = 0; i < m; ++i) o[i] = to_bf16(acc[i]);
  }
}

FG_VECTOR_CLONES void add_f32(float* acc, const float* s, size_t m) {
  for (size_t i = 0; i < m; ++i) acc[i] += s[i];
}

// fp16 through the conversions the fused op uses (F16C where the CPU has it).
void sum_f16(uint16_t* dst, const std::byte* const* s, int n, size_t count) {
  float acc[kBlock], next[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    to_float(DType::kF16, as<uint16_t>(s[0]) + at, acc, m);
    for (int j = 1; j < n; ++j) {
      to_float(DType::kF16, as<uint16_t>(s[j]) + at, next, m);
      add_f32(acc, next, m);
    }
    from_float(DType::kF16, acc, dst + at, m);
  }
}

// fp64 and the integers (as unsigned: they wrap rather than overflow).
template <typename T>
void sum_plain(T* dst, const std::byte* const* s, int n, size_t count) {
  T acc[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const T* a = as<T>(s[0]) + at;
    for (size_t i = 0; i < m; ++i) acc[i] = a[i];
    for (int j = 1; j < n; ++j) {
      const T* c = as<T>(s[j]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] += c[i];
    }
    std::memcpy(dst + at, acc, m * sizeof(T));
  }
}

template <typename T>
void sum_as(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes,
            void (*f)(T*, const std::byte* const*, int, size_t)) {
  f(reinterpret_cast<T*>(dst), srcs, n, bytes / sizeof(T));
}

// fp16/bf16 summed into fp32 (to_float: bf16 exactly, fp16 as sum_f16 does).
void sum_widened(DType dtype, float* dst, const std::byte* const* s, int n, size_t count) {
  float next[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    float* acc = dst + at;
    to_float(dtype, as<uint16_t>(s[0]) + at, acc, m);
    for (int j = 1; j < n; ++j) {
      to_float(dtype, as<uint16_t>(s[j]) + at, next, m);
      add_f32(acc, next, m);
    }
  }
}

// fp32 partials summed and rounded once to fp16/bf16.
void sum_narrowed(DType dtype, uint16_t* dst, const std::byte* const* s, int n, size_t count) {
  float acc[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    std::memcpy(acc, as<float>(s[0]) + at, m * sizeof(float));
    for (int j = 1; j < n; ++j) add_f32(acc, as<float>(s[j]) + at, m);
    from_float(dtype, acc, dst + at, m);
  }
}

bool half(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

}  // namespace

size_t widening(DType dtype) { return half(dtype) ? 2 : 1; }

void sum_partial(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) {
  if (!half(dtype)) return sum(dtype, dst, srcs, n, bytes);
  sum_widened(dtype, reinterpret_cast<float*>(dst), srcs, n, bytes / 2);
}

void sum_partials(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) {
  if (!half(dtype)) return sum(dtype, dst, srcs, n, bytes);
  sum_narrowed(dtype, reinterpret_cast<uint16_t*>(dst), srcs, n, bytes / 2);
}

bool summable(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF64: case DType::kI32: case DType::kI64:
      return true;
    default:
      return false;
  }
}

void sum(DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) {
  if (n == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], bytes);
    return;
  }
  switch (dtype) {
    case DType::kF32: return sum_as<float>(dst, srcs, n, bytes, sum_f32);
    case DType::kBF16: return sum_as<uint16_t>(dst, srcs, n, bytes, sum_bf16);
    case DType::kF16: return sum_as<uint16_t>(dst, srcs, n, bytes, sum_f16);
    case DType::kF64: return sum_as<double>(dst, srcs, n, bytes, sum_plain<double>);
    case DType::kI32: return sum_as<uint32_t>(dst, srcs, n, bytes, sum_plain<uint32_t>);
    case DType::kI64: return sum_as<uint64_t>(dst, srcs, n, bytes, sum_plain<uint64_t>);
    default: return;
  }
}

}  // namespace fastgather::ops
