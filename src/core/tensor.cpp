#include "fastgather/tensor.hpp"

#include "base/env.hpp"
#include "base/huge_pages.hpp"
#include "core/tensor_access.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <new>

#include <fmt/format.h>

namespace fastgather {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::describe() const { return fmt::format("{}[{}]", dtype_name(dtype), fmt::join(shape, ", ")); }

namespace {

constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kHugeFrom = size_t{1} << 20;  // rounded up to kHuge: padding is at most about half

// A fresh mapping of `bytes` (a multiple of kHuge) on a kHuge boundary,
// advised before anything touches it. Not from malloc: glibc hands large
// blocks back from memory an earlier tensor already faulted in with 4 KiB
// pages, which MADV_HUGEPAGE does not change, and single copy reads such a
// tensor at about half the speed (docs/benchmarks.md, "huge pages and
// single copy").
void* map_huge(size_t bytes) {
  const size_t span = bytes + kHuge;
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (begin + kHuge - 1) / kHuge * kHuge;
  if (aligned != begin) ::munmap(m, aligned - begin);
  const uintptr_t end = aligned + bytes;
  if (begin + span != end) ::munmap(reinterpret_cast<void*>(end), begin + span - end);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

}  // namespace

void Tensor::Free::operator()(void* p) const {
  if (owner != nullptr) return owner->release(p);
  // Only huge-page tensors were noted, and they start on a 2 MiB boundary.
  if (reinterpret_cast<uintptr_t>(p) % kHuge == 0) {
    if (const size_t bytes = base::forget_huge_range(p); bytes != 0) {
      ::munmap(p, bytes);
      return;
    }
  }
  std::free(p);
}

Result<size_t> TensorAccess::bytes_of(DType dtype, const std::vector<int64_t>& shape) {
  // A negative or overflowing shape would wrap into a huge or tiny size.
  unsigned __int128 total = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return Status{ErrorKind::kInvalidArgument, fmt::format("negative dimension in {}", TensorView(nullptr, dtype, shape).describe())};
    total *= static_cast<uint64_t>(d);
    if (total > (static_cast<unsigned __int128>(1) << 62)) {
      return Status{ErrorKind::kInvalidArgument, fmt::format("{} does not fit the address space", TensorView(nullptr, dtype, shape).describe())};
    }
  }
  return static_cast<size_t>(total);
}

Tensor Tensor::empty(DType dtype, std::vector<int64_t> shape) {
  auto t = allocate(dtype, std::move(shape));
  if (t.ok()) return std::move(t).value();
  if (t.status().kind() == ErrorKind::kResourceExhausted) throw std::bad_alloc();
  throw std::length_error("Tensor::empty: " + t.status().message());
}

Result<Tensor> Tensor::allocate(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  auto checked = TensorAccess::bytes_of(dtype, t.shape_);
  if (!checked.ok()) return Status{ErrorKind::kInvalidArgument, checked.status().message()};
  size_t bytes = (checked.value() + 63) / 64 * 64;
  // Large tensors on 2 MiB boundaries, offered to transparent huge pages (as
  // PyTorch 2.1+'s CPU allocator does with THP_MEM_ALLOC_ENABLE=1; 1.13 does
  // not): fewer TLB misses when a collective streams them, and single copy
  // pins them cheaply (base/huge_pages.hpp).
  const bool huge = bytes >= kHugeFrom && !base::env_flag("FG_NO_HUGEPAGES");
  if (huge) bytes = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = huge ? map_huge(bytes) : std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) {
    return Status{ErrorKind::kResourceExhausted,
                  fmt::format("no memory for a tensor of {} bytes ({}[{}])", checked.value(), dtype_name(dtype),
                              fmt::join(t.shape_, ", "))};
  }
  if (huge) base::note_huge_range(p, bytes);
  t.data_.reset(static_cast<std::byte*>(p));
  return t;
}

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {                                              // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    // value = m * 2^(e-150); a half subnormal counts units of 2^-24, so q = m * 2^(e-126).
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t sh = 126 - e;  // 14..24
    uint32_t q = m >> sh;
    const uint32_t rem = m & ((1u << sh) - 1);
    const uint32_t half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace fastgather
