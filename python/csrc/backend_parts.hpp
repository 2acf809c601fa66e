// What the backend's ops share (backend.cpp, reductions.cpp, exchanges.cpp):
// not a header for anyone else.
#pragma once

#include <functional>
#include <utility>

#include "backend.hpp"

namespace fastgather_torch {

// The ops this backend serves, for the words of a refusal.
extern const char* const kOnlyThese;

// The library's reduction for torch's, for a tensor of this dtype: or a
// NotImplementedError naming the op, the reduction and the dtype (checks the
// tensor first: check_tensor).
fg::ReduceOp check_reduce(const char* op, const at::Tensor& t, const char* what, const c10d::ReduceOp& reduce_op);

// Once the requests are done: the user's tensor gets the contiguous buffer's bytes.
void chain_copy(FastgatherWork& work, at::Tensor user, at::Tensor buf);

// Runs fn with the GIL released where this thread holds it (a wait that
// other ranks' Python, or Python callbacks, may need to move on).
void without_gil(const std::function<void()>& fn);

// Starts one library request of the work (the flight is not shared yet).
template <class Start>
void start(FastgatherWork& work, fg::Group& g, Start&& how) {
  work.flight().requests.push_back(std::forward<Start>(how)(g));
}

}  // namespace fastgather_torch
