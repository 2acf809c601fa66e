// The steps the sums are made of, for the schedules within a server
// (reduce.cpp) and across servers (across.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "algo/lockstep.hpp"
#include "algo/reduce.hpp"

namespace fastgather::algo {

// The sources of one sum, one per member: in place for the usual group
// sizes, so that a call does not allocate on its hot path.
class Sources {
 public:
  explicit Sources(int n) : heap_(n > kInPlace ? static_cast<size_t>(n) : 0) {}
  const std::byte** data() { return heap_.empty() ? in_place_.data() : heap_.data(); }
  const std::byte*& operator[](size_t i) { return data()[i]; }

 private:
  static constexpr int kInPlace = 16;
  std::array<const std::byte*, kInPlace> in_place_{};
  std::vector<const std::byte*> heap_;
};

// Every member sends each peer its piece of the peer's chunk, a piece per
// peer in each step, and sums the pieces of its own chunk as they come:
// chunk m of every input (first(m), size(m)) is summed by member m, its
// result at `at` + offset within the chunk (sum's offset). The own chunk
// never enters the ring. With `produce`, the pieces are made as they are
// sent (see reduce_scatter_produced), the own ones into `scratch`
// (plan.piece bytes), instead of read from call.input.
engine::Task<Status> scatter_sums(CallState& st, const Chunks& chunks, size_t at, Sum sum,
                                  const Produce* produce = nullptr, std::byte* scratch = nullptr);

// Every member sums all of everyone's input, a step at a time: the result
// at sum's offset in the input. `out` is where the result goes: where it is
// not the input, peers may read the input where it lies.
engine::Task<Status> sum_everything(CallState& st, const std::byte* out, Sum sum);

// Two-shot's second half: each member's summed chunk (at out + its first())
// to every peer, which copies it to the same place of its own out.
engine::Task<Status> share_sums(CallState& st, const Chunks& chunks, std::byte* out);

}  // namespace fastgather::algo
