// The deterministic data that fg-bench -c and the tests send: a word of
// rank r at iteration it and index j is a hash of (r, it, j), so every byte
// of every output can be checked without keeping a copy of the inputs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fastgather::pattern {

inline uint64_t word(int rank, uint64_t it, size_t j) {
  uint64_t x = (static_cast<uint64_t>(rank) << 48) ^ (it << 32) ^ j;  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline void fill(void* dst, size_t bytes, int rank, uint64_t it) {
  auto* d = static_cast<unsigned char*>(dst);
  for (size_t j = 0; j * 8 < bytes; ++j) {
    const uint64_t w = word(rank, it, j);
    std::memcpy(d + j * 8, &w, std::min<size_t>(8, bytes - j * 8));
  }
}

// First mismatching byte offset, or -1.
inline long long find_mismatch(const void* src, size_t bytes, int rank, uint64_t it) {
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t j = 0; j * 8 < bytes; ++j) {
    const uint64_t w = word(rank, it, j);
    const size_t len = std::min<size_t>(8, bytes - j * 8);
    if (std::memcmp(s + j * 8, &w, len) == 0) continue;
    const auto* wb = reinterpret_cast<const unsigned char*>(&w);
    for (size_t b = 0; b < len; ++b) {
      if (s[j * 8 + b] != wb[b]) return static_cast<long long>(j * 8 + b);
    }
  }
  return -1;
}

// An all_to_all's input: n parts of part_bytes, part j (for rank j) filled
// as rank r's data for j.
inline int part_key(int rank, int to) { return rank * 1024 + to; }
inline void fill_parts(void* dst, size_t part_bytes, int n, int rank, const int* ranks, uint64_t it) {
  for (int j = 0; j < n; ++j) fill(static_cast<unsigned char*>(dst) + static_cast<size_t>(j) * part_bytes, part_bytes,
                                   part_key(rank, ranks[j]), it);
}

}  // namespace fastgather::pattern
