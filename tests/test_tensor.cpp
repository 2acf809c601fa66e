#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>
#include <cmath>
#include <random>

#include "fastgather/status.hpp"
#include "fastgather/ops.hpp"
#include "fastgather/tensor.hpp"
#include "ops/convert.hpp"
#include "ops/sum.hpp"

using namespace fastgather;

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Half, RoundsToNearestEvenLikeTheCompiler) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    float f = std::bit_cast<float>(bits(gen));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    ASSERT_EQ(float_to_half(f), std::bit_cast<uint16_t>(ref)) << f;
  }
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_half(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(2.9802322e-8f), 0x0000);  // half of it: ties to even
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), b);
    }
  }
}

// The bf16 sum the reductions run (by hand with AVX-512BW where the CPU has
// it) gives every bit the portable loop gives (a NaN for a NaN): random bits with NaNs,
// infinities, denormals and ties to even among them, 2 to 5 sources, counts
// with and without a tail of the 16-element steps, in place too.
TEST(Sum, Bf16ByHandMatchesThePortableLoopBitForBit) {
  if (!ops::sum_bf16_by_hand()) GTEST_SKIP() << "no AVX-512BW on this CPU: sum() runs the portable loop itself";
  std::mt19937 rng(7);
  const uint16_t special[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff, 0x0001, 0x8001, 0x007f, 0x0000, 0x8000, 0x7f7f, 0x3f80};
  for (int n = 2; n <= 5; ++n) {
    for (size_t count : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000}, size_t{4099}}) {
      std::vector<std::vector<uint16_t>> src(static_cast<size_t>(n), std::vector<uint16_t>(count));
      for (auto& v : src) {
        for (auto& x : v) {
          const uint32_t r = rng();
          // A quarter special values, the rest random bits near one exponent (sums that round).
          x = (r & 3) == 0 ? special[(r >> 2) % std::size(special)] : static_cast<uint16_t>(0x3f00 | ((r >> 8) & 0xff) | ((r >> 16) & 0x8000));
        }
      }
      std::vector<const std::byte*> ptrs;
      for (auto& v : src) ptrs.push_back(reinterpret_cast<const std::byte*>(v.data()));
      std::vector<uint16_t> by_hand(count), portable(count);
      ops::sum(DType::kBF16, reinterpret_cast<std::byte*>(by_hand.data()), ptrs.data(), n, count * 2);
      ops::sum_bf16_portable(portable.data(), ptrs.data(), n, count);
      // A NaN is a NaN on both; its payload and sign are x86's choice of operand (the first of
      // two NaNs), and the compiler may order a commutative add either way.
      auto nan = [](uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; };
      auto same = [&](const std::vector<uint16_t>& got, const char* how) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(got[i] == portable[i] || (nan(got[i]) && nan(portable[i])))
              << how << ", " << n << " sources, " << count << " elements: element " << i << ": " << got[i] << " against "
              << portable[i];
        }
      };
      same(by_hand, "by hand");
      // In place: the result over the first source.
      std::vector<uint16_t> first = src[0];
      ptrs[0] = reinterpret_cast<const std::byte*>(first.data());
      ops::sum(DType::kBF16, reinterpret_cast<std::byte*>(first.data()), ptrs.data(), n, count * 2);
      same(first, "in place");
    }
  }
}

TEST(Convert, BulkMatchesScalarForEveryDtype) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-70000, 70000);
  std::vector<float> src(1003);
  for (float& x : src) x = u(gen);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint32_t> packed(src.size());
    std::vector<float> back(src.size());
    ops::from_float(d, src.data(), packed.data(), src.size());
    ops::to_float(d, packed.data(), back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      float expect = src[i];
      if (d == DType::kF16) expect = half_to_float(float_to_half(src[i]));
      if (d == DType::kBF16) expect = bf16_to_float(float_to_bf16(src[i]));
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(expect)) << dtype_name(d) << " " << i;
    }
  }
}

// Empty views may hold no memory at all (a null pointer, as an empty
// Tensor's): converting them is nothing to do, not undefined behaviour (the
// sanitizer build checks); a null view with elements is refused.
TEST(Convert, EmptyViewsWithoutMemoryAreFineAndNullOnesWithElementsRefused) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_TRUE(convert(TensorView(nullptr, DType::kF32, {0, 7}), TensorView(nullptr, d, {7, 0})).ok()) << dtype_name(d);
  }
  std::vector<float> four(4, 1.0f);
  const Status s = convert(TensorView(nullptr, DType::kF32, {4}), TensorView(four.data(), DType::kF32, {4}));
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("null"), std::string::npos) << s.message();
}

TEST(Tensor, ShapesSizesAndNames) {
  Tensor t = Tensor::zeros(DType::kBF16, {3, 5});
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(t.view().describe(), "bf16[3, 5]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  DType d{};
  EXPECT_TRUE(parse_dtype("float16", &d));
  EXPECT_EQ(d, DType::kF16);
  EXPECT_FALSE(parse_dtype("fp8", &d));
  EXPECT_EQ(TensorView(nullptr, DType::kF32, {0, 7}).nbytes(), 0u);
}

// The AnonHugePages (kB) of the mapping that holds p, from /proc/self/smaps.
long anon_huge_kb(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stol(line.substr(14));
    }
  }
  return -1;
}

// Tensors of 1 MiB and more are on huge pages (what single copy's offer
// relies on) even when the allocator holds freed memory that was faulted in
// with 4 KiB pages - which glibc hands out again for large blocks after a
// large free, and MADV_HUGEPAGE does not convert.
TEST(Tensor, LargeTensorsAreOnHugePagesAfterSmallerOnesWereFreed) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (mode.find("[never]") != std::string::npos || mode.empty()) GTEST_SKIP() << "transparent huge pages are off";
  for (int round = 0; round < 4; ++round) {  // leave 4 KiB-faulted memory behind in malloc
    std::vector<void*> blocks;
    for (size_t b : {size_t{3} << 20, size_t{6} << 20, size_t{1} << 20}) {
      void* q = std::malloc(b);
      std::memset(q, 1, b);
      blocks.push_back(q);
    }
    for (void* q : blocks) std::free(q);
  }
  for (int64_t bytes : {int64_t{1} << 20, int64_t{3} << 19, int64_t{5} << 20}) {
    Tensor t = Tensor::empty(DType::kU8, {bytes});
    std::memset(t.data(), 2, t.nbytes());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % (2 << 20), 0u);
    EXPECT_GE(anon_huge_kb(t.data()), 2048) << bytes << "-byte tensor is not on huge pages";
  }
}

// A Result read without checking ok() says why it has no value.
TEST(Status, ResultWithoutAValueThrowsTheReason) {
  fastgather::Result<int> r = fastgather::Status{fastgather::ErrorKind::kTimeout, "rank 3 did not arrive", 3};
  EXPECT_EQ(r.status().peer(), 3);
  try {
    (void)r.value();
    FAIL() << "value() of an error returned";
  } catch (const fastgather::BadResultAccess& e) {
    EXPECT_NE(std::string(e.what()).find("Timeout: rank 3 did not arrive"), std::string::npos) << e.what();
    EXPECT_EQ(e.status().kind(), fastgather::ErrorKind::kTimeout);
  }
  fastgather::Result<int> ok = 7;
  EXPECT_EQ(ok.value(), 7);
  EXPECT_EQ(ok.status().peer(), -1);
}
