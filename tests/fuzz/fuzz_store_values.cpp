// libFuzzer target for the parsers of values a rank reads from the store
// (bootstrap/store_values.hpp) and of the numbers it reads from variables:
// whatever a stranger wrote, each must return a value or an error, never
// crash, and what it accepts must be what it was asked for.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/env.hpp"
#include "bootstrap/store_values.hpp"
#include "bootstrap/tcp_store.hpp"

namespace b = fastgather::bootstrap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string prefix = "/fg-job-";

  if (auto n = b::parse_number("key", text, 0xffff); n.ok() && (n.value() > 0xffff || text.empty())) __builtin_trap();
  (void)fastgather::base::parse_count(std::string(text), 1, 1 << 20, "variable");

  if (auto id = b::parse_rank_identity(text, 4096); id.ok()) {
    const auto [rank, world] = id.value();
    if (rank < 0 || rank >= world || world > 4096) __builtin_trap();
  }
  if (b::check_job_id("key", text).ok() && (text.empty() || text.find('/') != std::string_view::npos)) __builtin_trap();
  if (b::check_segment_name("key", text, prefix).ok()) {
    if (text.rfind(prefix, 0) != 0 || text.find('/', 1) != std::string_view::npos || text.find("..") != std::string_view::npos) {
      __builtin_trap();
    }
  }
  if (auto heap = b::parse_heap_value("key", text, prefix, uint64_t{1} << 40); heap.ok() && heap.value()) {
    if (heap.value()->region > (uint64_t{1} << 40) || heap.value()->name.rfind(prefix, 0) != 0) __builtin_trap();
  }
  if (auto f = b::failure_in(text); f.has_value() && (f->ok() || text.empty() || text[0] != '!')) __builtin_trap();
  if (auto s = b::decode_status(text); s.has_value() && s->ok()) __builtin_trap();
  if (b::excerpt(text).size() > 4 * 40 + 3) __builtin_trap();
  if (b::check_blob("key", text, 64).ok() && (text.empty() || text.size() > 64)) __builtin_trap();
  return 0;
}
