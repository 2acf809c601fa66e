// How the library's own code makes Tensors over storage it owns (a group's
// symmetric heap); Tensor keeps this private.
#pragma once

#include <memory>
#include <vector>

#include "fastgather/status.hpp"
#include "fastgather/tensor.hpp"

namespace fastgather {

struct TensorAccess {
  // The bytes a tensor of this shape holds; the errors Tensor::empty throws, as a Status.
  static Result<size_t> bytes_of(DType dtype, const std::vector<int64_t>& shape);
  // A tensor over `block`, which `owner` takes back when the tensor is freed.
  static Tensor adopt(void* block, DType dtype, std::vector<int64_t> shape, std::shared_ptr<Tensor::Owner> owner) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.data_ = std::unique_ptr<std::byte[], Tensor::Free>(static_cast<std::byte*>(block), Tensor::Free{std::move(owner)});
    return t;
  }
};

}  // namespace fastgather
