#include "ops/sum.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/convert.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// What an average divides each block's sum by while the block is in L1 (a
// second pass over the result would read it back from memory): `by` members,
// or where they are a power of two, times `inverse` = 1/by, which is exact, so
// that x * inverse is x / by to the bit (the same real number, rounded once)
// at a fraction of a division's cost. by == 0: the sum itself.
template <typename T>
struct Divide {
  T by = 0;
  T inverse = 0;
};

template <typename T>
Divide<T> divide_by(int members) {
  Divide<T> d;
  d.by = static_cast<T>(members);
  if (std::has_single_bit(static_cast<unsigned>(members))) d.inverse = T(1) / d.by;
  return d;
}

template <typename T>
inline void store(T* o, const T* acc, size_t m, Divide<T> d) {
  if (d.inverse != 0) {
    for (size_t i = 0; i < m; ++i) o[i] = acc[i] * d.inverse;
  } else if (d.by != 0) {
    for (size_t i = 0; i < m; ++i) o[i] = acc[i] / d.by;
  } else {
    for (size_t i = 0; i < m; ++i) o[i] = acc[i];
  }
}

// n >= 2.
FG_VECTOR_CLONES void sum_f32(float* dst, const std::byte* const* s, int n, size_t count, Divide<float> d = {}) {
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
    store(dst + at, acc, m, d);
  }
}

inline float from_bf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline uint16_t to_bf16(float f) {  // as float_to_bf16 (tensor.hpp), branch-free
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

FG_VECTOR_CLONES void sum_bf16(uint16_t* dst, const std::byte* const* s, int n, size_t count, Divide<uint16_t>) {
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

#if defined(__x86_64__)
// GCC 12's AVX-512 headers start some intrinsics from an undefined register
// (-Wmaybe-uninitialized), and a vector return under a target attribute
// notes the ABI (-Wpsabi): neither is about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"
// The bf16 sum 16 elements at a time with AVX-512 (F and BW), by hand: the
// compiler's loop above widens and rounds at 256 bits, 3-5x slower per byte
// than the fp32 sum here. The same arithmetic as from_bf16 / to_bf16 (fp32
// additions in source order, then round to nearest even, NaN made quiet),
// so every bit equals the portable loop's; the tail element by element
// through those two.
__attribute__((target("avx512f,avx512bw"))) inline __m512 widen(const std::byte* p, size_t i) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(as<uint16_t>(p) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw"))) void sum_bf16_avx512(uint16_t* dst, const std::byte* const* s, int n,
                                                                 size_t count) {
  const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m512 acc = _mm512_add_ps(widen(s[0], i), widen(s[1], i));
    for (int j = 2; j < n; ++j) acc = _mm512_add_ps(acc, widen(s[j], i));
    const __m512i x = _mm512_castps_si512(acc);
    const __m512i high = _mm512_srli_epi32(x, 16);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, half), _mm512_and_si512(high, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, magnitude), inf);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < count; ++i) {
    float acc = from_bf16(as<uint16_t>(s[0])[i]) + from_bf16(as<uint16_t>(s[1])[i]);
    for (int j = 2; j < n; ++j) acc += from_bf16(as<uint16_t>(s[j])[i]);
    dst[i] = to_bf16(acc);
  }
}

#pragma GCC diagnostic pop

bool avx512bw_supported() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return yes;
}
#endif

// The bf16 sum: by hand where the CPU has AVX-512BW, else the compiler's loop.
void sum_bf16_best(uint16_t* dst, const std::byte* const* s, int n, size_t count, Divide<uint16_t> d) {
#if defined(__x86_64__)
  if (avx512bw_supported()) return sum_bf16_avx512(dst, s, n, count);
#endif
  sum_bf16(dst, s, n, count, d);
}

FG_VECTOR_CLONES void add_f32(float* acc, const float* s, size_t m) {
  for (size_t i = 0; i < m; ++i) acc[i] += s[i];
}

// fp16 through the conversions the fused op uses (F16C where the CPU has it).
void sum_f16(uint16_t* dst, const std::byte* const* s, int n, size_t count, Divide<uint16_t>) {
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
void sum_plain(T* dst, const std::byte* const* s, int n, size_t count, Divide<T> d = {}) {
  T acc[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const T* a = as<T>(s[0]) + at;
    for (size_t i = 0; i < m; ++i) acc[i] = a[i];
    for (int j = 1; j < n; ++j) {
      const T* c = as<T>(s[j]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] += c[i];
    }
    store(dst + at, acc, m, d);
  }
}

template <typename T>
void sum_as(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes,
            void (*f)(T*, const std::byte* const*, int, size_t, Divide<T>)) {
  f(reinterpret_cast<T*>(dst), srcs, n, bytes / sizeof(T), Divide<T>{});
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

// The element-wise step of each reduction but the sum (whose loops are above).
template <typename T>
T combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kProduct: return a * b;
      case ReduceOp::kMin: return (a < b || a != a) ? a : b;  // NaN wins
      case ReduceOp::kMax: return (a > b || a != a) ? a : b;
      default: return a + b;
    }
  } else {
    using U = std::make_unsigned_t<T>;  // sums and products wrap
    switch (op) {
      case ReduceOp::kProduct: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::kMin: return a < b ? a : b;
      case ReduceOp::kMax: return a > b ? a : b;
      case ReduceOp::kBand: return a & b;
      case ReduceOp::kBor: return a | b;
      case ReduceOp::kBxor: return a ^ b;
      default: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    }
  }
}

// dst = srcs[0] op ... op srcs[n-1] (n >= 2), the op fixed per instantiation
// so that the compiler vectorises each loop; the first two sources combined
// straight into the block's accumulators, as the sum's loop does.
template <ReduceOp kOp, typename T>
FG_VECTOR_CLONES void fold_as(T* dst, const std::byte* const* s, int n, size_t count) {
  T acc[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const T* a = as<T>(s[0]) + at;
    const T* b = as<T>(s[1]) + at;
    for (size_t i = 0; i < m; ++i) acc[i] = combine(kOp, a[i], b[i]);
    for (int j = 2; j < n; ++j) {
      const T* c = as<T>(s[j]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] = combine(kOp, acc[i], c[i]);
    }
    std::memcpy(dst + at, acc, m * sizeof(T));
  }
}

template <typename T>
void fold_plain(ReduceOp op, T* dst, const std::byte* const* s, int n, size_t count) {
  switch (op) {
    case ReduceOp::kProduct: return fold_as<ReduceOp::kProduct>(dst, s, n, count);
    case ReduceOp::kMin: return fold_as<ReduceOp::kMin>(dst, s, n, count);
    case ReduceOp::kMax: return fold_as<ReduceOp::kMax>(dst, s, n, count);
    case ReduceOp::kBand: return fold_as<ReduceOp::kBand>(dst, s, n, count);
    case ReduceOp::kBor: return fold_as<ReduceOp::kBor>(dst, s, n, count);
    case ReduceOp::kBxor: return fold_as<ReduceOp::kBxor>(dst, s, n, count);
    default: return fold_as<ReduceOp::kSum>(dst, s, n, count);
  }
}

// Where the sources are fp16/bf16 (`wide`: fp32 partials instead) and the
// result fp32 (`narrow`: rounded once to the dtype), combined in fp32 and,
// with `divide`, divided at the end.
void fold_half(ReduceOp op, DType dtype, std::byte* dst, const std::byte* const* s, int n, size_t count, bool wide,
               bool narrow, Divide<float> divide) {
  float acc[kBlock], next[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    auto load = [&](int j, float* out) {
      if (wide) std::memcpy(out, as<float>(s[j]) + at, m * sizeof(float));
      else to_float(dtype, as<uint16_t>(s[j]) + at, out, m);
    };
    load(0, acc);
    for (int j = 1; j < n; ++j) {
      load(j, next);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
        add_f32(acc, next, m);
      } else {
        for (size_t i = 0; i < m; ++i) acc[i] = combine(op, acc[i], next[i]);
      }
    }
    if (divide.by != 0) store(acc, acc, m, divide);
    if (narrow) from_float(dtype, acc, reinterpret_cast<uint16_t*>(dst) + at, m);
    else std::memcpy(reinterpret_cast<float*>(dst) + at, acc, m * sizeof(float));
  }
}

// bool: "or" for sum and max, "and" for product and min (inputs are 0 or 1).
ReduceOp on_bool(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kMax: return ReduceOp::kBor;
    case ReduceOp::kProduct: case ReduceOp::kMin: return ReduceOp::kBand;
    default: return op;
  }
}

void fold(ReduceOp op, DType dtype, std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) {
  switch (dtype) {
    case DType::kF32: return fold_plain<float>(op, reinterpret_cast<float*>(dst), srcs, n, bytes / 4);
    case DType::kF64: return fold_plain<double>(op, reinterpret_cast<double*>(dst), srcs, n, bytes / 8);
    case DType::kF16: case DType::kBF16: return fold_half(op, dtype, dst, srcs, n, bytes / 2, false, true, {});
    case DType::kI8: return fold_plain<int8_t>(op, reinterpret_cast<int8_t*>(dst), srcs, n, bytes);
    case DType::kU8: return fold_plain<uint8_t>(op, reinterpret_cast<uint8_t*>(dst), srcs, n, bytes);
    case DType::kBool: return fold_plain<uint8_t>(on_bool(op), reinterpret_cast<uint8_t*>(dst), srcs, n, bytes);
    case DType::kI16: return fold_plain<int16_t>(op, reinterpret_cast<int16_t*>(dst), srcs, n, bytes / 2);
    case DType::kI32: return fold_plain<int32_t>(op, reinterpret_cast<int32_t*>(dst), srcs, n, bytes / 4);
    case DType::kI64: return fold_plain<int64_t>(op, reinterpret_cast<int64_t*>(dst), srcs, n, bytes / 8);
  }
}

// A partial of fp16/bf16 is fp32 where the reduction rounds (sum, avg, product).
bool widened(ReduceOp op, DType dtype) {
  return half(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kProduct);
}

}  // namespace

void Reduction::apply(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) const {
  // The sum's own loops (vectorised by hand) serve fp32, fp16, bf16, fp64, int32, int64.
  if (op == ReduceOp::kSum && summable(dtype)) return sum(dtype, dst, srcs, n, bytes);
  if (op == ReduceOp::kAvg) {
    if (half(dtype)) return fold_half(op, dtype, dst, srcs, n, bytes / 2, false, true, divide_by<float>(members));
    if (dtype == DType::kF64) {
      return sum_plain<double>(reinterpret_cast<double*>(dst), srcs, n, bytes / 8, divide_by<double>(members));
    }
    if (n == 1) return sum_plain<float>(reinterpret_cast<float*>(dst), srcs, n, bytes / 4, divide_by<float>(members));
    return sum_f32(reinterpret_cast<float*>(dst), srcs, n, bytes / 4, divide_by<float>(members));
  }
  if (n == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], bytes);
    return;
  }
  fold(op, dtype, dst, srcs, n, bytes);
}

size_t Reduction::widening() const { return widened(op, dtype) ? 2 : 1; }

void Reduction::partial(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) const {
  if (widened(op, dtype)) return fold_half(op, dtype, dst, srcs, n, bytes / 2, false, false, {});
  Reduction r = *this;
  if (op == ReduceOp::kAvg) r.op = ReduceOp::kSum;  // divided once, at the end
  r.apply(dst, srcs, n, bytes);
}

void Reduction::of_partials(std::byte* dst, const std::byte* const* srcs, int n, size_t bytes) const {
  if (widened(op, dtype)) {
    return fold_half(op, dtype, dst, srcs, n, bytes / 2, true, true,
                     op == ReduceOp::kAvg ? divide_by<float>(members) : Divide<float>{});
  }
  apply(dst, srcs, n, bytes);  // kAvg: the partials' sum, divided by the members
}

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
    case DType::kBF16: return sum_as<uint16_t>(dst, srcs, n, bytes, sum_bf16_best);
    case DType::kF16: return sum_as<uint16_t>(dst, srcs, n, bytes, sum_f16);
    case DType::kF64: return sum_as<double>(dst, srcs, n, bytes, sum_plain<double>);
    case DType::kI32: return sum_as<uint32_t>(dst, srcs, n, bytes, sum_plain<uint32_t>);
    case DType::kI64: return sum_as<uint64_t>(dst, srcs, n, bytes, sum_plain<uint64_t>);
    default: return;
  }
}

void sum_bf16_portable(uint16_t* dst, const std::byte* const* srcs, int n, size_t count) {
  if (n == 1) {
    if (reinterpret_cast<const std::byte*>(dst) != srcs[0]) std::memmove(dst, srcs[0], count * sizeof(uint16_t));
    return;
  }
  sum_bf16(dst, srcs, n, count, Divide<uint16_t>{});
}

bool sum_bf16_by_hand() {
#if defined(__x86_64__)
  return avx512bw_supported();
#else
  return false;
#endif
}

}  // namespace fastgather::ops
