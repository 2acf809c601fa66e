#include "base/caches.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <string>

namespace fastgather::base {

namespace {

size_t read_cache_bytes(int level) {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream size_file(dir + "size"), level_file(dir + "level"), type_file(dir + "type");
    size_t v = 0;
    int l = 0;
    std::string unit, type;
    if (!(size_file >> v) || !(level_file >> l)) continue;
    size_file >> unit;
    type_file >> type;
    if (type == "Instruction") continue;
    const size_t bytes = v << (unit == "K" ? 10 : unit == "M" ? 20 : 0);
    if (level == 0 || l == level) best = std::max(best, bytes);
  }
  return best;
}

}  // namespace

size_t cache_bytes(int level) {
  // Read from sysfs once per process: callers ask on hot paths.
  static const auto sizes = [] {
    std::array<size_t, 5> s{};
    for (int l = 0; l < static_cast<int>(s.size()); ++l) s[static_cast<size_t>(l)] = read_cache_bytes(l);
    return s;
  }();
  return level >= 0 && level < static_cast<int>(sizes.size()) ? sizes[static_cast<size_t>(level)] : read_cache_bytes(level);
}

size_t counted_llc_bytes(size_t llc) { return llc == 0 ? kUnknownLlcBytes : std::min(llc, kMostCountedLlcBytes); }

size_t l2_bytes() {
  const size_t l2 = cache_bytes(2);
  return l2 != 0 ? l2 : size_t{1} << 20;
}

}  // namespace fastgather::base
