// The element-wise sum of the reductions (ops::sum) alone, in one process:
// two sources summed into a third, fp32 and bf16, from L1-sized to
// beyond-L2 blocks; the best of 5 rounds of back-to-back calls. A hash of
// each result, so that two builds can be seen to give the same bits.
//
//   build/tools/sum-bench/fg-sum-bench
//
// Against an older commit's library (ops/sum.hpp has not changed its
// interface): g++ -O2 -std=c++20 -Isrc -Iinclude -Ibuild/include
//   tools/sum-bench/sum_bench.cpp build/libfastgather.a $(pkg-config --libs openblas fmt) -ldl -lrt -lpthread
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ops/sum.hpp"

using namespace fastgather;

int main() {
  std::printf("| bytes | dtype | us per sum | GB/s of output | hash |\n|---:|---|---:|---:|---|\n");
  for (size_t bytes : {size_t{2048}, size_t{8192}, size_t{786432}, size_t{3145728}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      std::vector<std::byte> a(bytes), b(bytes), d(bytes);
      for (size_t i = 0; i < bytes; ++i) {
        a[i] = std::byte(i * 7 + 3);
        b[i] = std::byte(i * 13 + 1);
      }
      const std::byte* s[2] = {a.data(), b.data()};
      const int iters = static_cast<int>(std::max<size_t>(50, size_t{20000000} / bytes));
      for (int i = 0; i < 10; ++i) ops::sum(dt, d.data(), s, 2, bytes);
      double best = 1e30;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) ops::sum(dt, d.data(), s, 2, bytes);
        best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      uint64_t h = 0;
      for (std::byte x : d) h = h * 31 + static_cast<uint8_t>(x);
      std::printf("| %zu | %s | %.2f | %.2f | %016llx |\n", bytes, dt == DType::kF32 ? "fp32" : "bf16", best,
                  static_cast<double>(bytes) / best / 1e3, static_cast<unsigned long long>(h));
    }
  }
}
