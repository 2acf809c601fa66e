#include "base/huge_pages.hpp"

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace fastgather::base {
namespace {

struct Ranges {
  std::mutex mu;
  std::map<uintptr_t, uintptr_t> by_begin;  // begin -> end
};

Ranges& ranges() {
  static Ranges* r = new Ranges();  // never destroyed: tensors may be freed during exit
  return *r;
}

}  // namespace

void note_huge_range(const void* begin, size_t bytes) {
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto b = reinterpret_cast<uintptr_t>(begin);
  r.by_begin[b] = b + bytes;
}

size_t forget_huge_range(const void* begin) {
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_begin.find(reinterpret_cast<uintptr_t>(begin));
  if (it == r.by_begin.end()) return 0;
  const size_t bytes = it->second - it->first;
  r.by_begin.erase(it);
  return bytes;
}

bool in_huge_range(const void* p, size_t bytes) {
  Ranges& r = ranges();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_begin.upper_bound(a);
  if (it == r.by_begin.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->second;
}

}  // namespace fastgather::base
