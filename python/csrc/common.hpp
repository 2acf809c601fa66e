// What every part of the torch binding uses: the library's errors as
// Python's, and torch tensors as the library's views.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <utility>

#include "fastgather/fastgather.hpp"

namespace fastgather_torch {

namespace fg = fastgather;
using Clock = std::chrono::steady_clock;

// The library's errors as Python's: arguments that are wrong on this rank or
// disagree between ranks are ValueErrors, what the library does not serve is
// a NotImplementedError (a RuntimeError), a lost peer, a timeout or an abort
// is torch's DistBackendError.
[[noreturn]] void raise(const fg::Status& s);
std::exception_ptr exception_of(const fg::Status& s);

// The library's dtype for a torch tensor's bytes, and how many elements of it.
// Complex numbers move as pairs of reals; dtypes the library has no name for
// move as bytes (ranks that disagree on them are then told about bytes).
std::pair<fg::DType, int64_t> library_dtype(const at::Tensor& t);

// Defined, on the CPU, dense: or a ValueError naming the op and the tensor.
void check_tensor(const at::Tensor& t, const char* op, const char* what);

// A contiguous 1-D view of t's bytes for the library (t must be contiguous).
fg::TensorView view_of(const at::Tensor& t);

}  // namespace fastgather_torch
