// Values whose sums are known bit for bit, for the reductions' check mode
// (and the fused op's inputs): every reduction fg-bench runs, fastgather's
// and MPI's, is checked against the same expected sums.
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
// "" when out[j] is the sum over `ranks` of exact_value(r, it, first + j) for
// every j < count; else the first wrong element, in words.
std::string check_exact_sums(DType dtype, const void* out, size_t first, size_t count, const std::vector<int>& ranks,
                             uint64_t it, const std::string& what);

}  // namespace fastgather::bench
