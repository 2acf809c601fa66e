// Argument checks shared by the collectives: each failure names the rank,
// the group and what was wrong.
#pragma once

#include <string>

#include <fmt/format.h>

#include "fastgather/communicator.hpp"
#include "fastgather/status.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather::ops {

inline Status invalid(const Group& g, const char* op, const std::string& why) {
  return {ErrorKind::kInvalidArgument,
          fmt::format("{} on {} (rank {}): {}", op, g.describe(), g.ranks()[g.rank()], why)};
}

inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return an != 0 && bn != 0 && pa < pb + bn && pb < pa + an;
}

// A buffer holding `bytes` must have a pointer unless it is empty.
inline Status need_data(const Group& g, const char* op, const char* what, const TensorView& t) {
  if (t.data == nullptr && t.nbytes() != 0) return invalid(g, op, fmt::format("{} is null but holds {} bytes", what, t.nbytes()));
  for (int64_t d : t.shape) {
    if (d < 0) return invalid(g, op, fmt::format("{} has a negative dimension: {}", what, t.describe()));
  }
  return Status::Ok();
}

}  // namespace fastgather::ops
