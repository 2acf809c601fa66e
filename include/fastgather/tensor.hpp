// A non-owning view of a dense row-major tensor, and a small owning Tensor
// for programs and tests that need storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "fastgather/dtype.hpp"
#include "fastgather/status.hpp"

namespace fastgather {


struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // row-major, contiguous

  TensorView() = default;
  TensorView(void* d, DType t, std::vector<int64_t> s) : data(d), dtype(t), shape(std::move(s)) {}
  // For inputs (x, x1, x2, bias): no const_cast at the call site. The ops
  // never write through an input view.
  TensorView(const void* d, DType t, std::vector<int64_t> s)
      : data(const_cast<void*>(d)), dtype(t), shape(std::move(s)) {}
  TensorView(std::nullptr_t, DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {}

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string describe() const;  // "f16[16, 3072]"
};

// Owning, 64-byte aligned storage.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage for `shape`: an error for a negative or overflowing
  // shape (kInvalidArgument) or when memory runs out (kResourceExhausted),
  // as Group::empty says it.
  static Result<Tensor> allocate(DType dtype, std::vector<int64_t> shape);
  // allocate(), for code that does not handle the error: throws
  // std::length_error for a bad shape, std::bad_alloc when memory runs out.
  static Tensor empty(DType dtype, std::vector<int64_t> shape);
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);

  TensorView view() const { return {data_.get(), dtype_, shape_}; }
  void* data() const { return data_.get(); }
  template <typename T>
  T* data_as() const { return static_cast<T*>(static_cast<void*>(data_.get())); }
  int64_t numel() const { return view().numel(); }
  size_t nbytes() const { return view().nbytes(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }

  // Storage that a library object owns (a group's symmetric heap): the
  // tensor keeps it alive and gives its block back when freed.
  class Owner {
   public:
    virtual ~Owner() = default;
    virtual void release(void* block) noexcept = 0;
  };

 private:
  friend struct TensorAccess;  // the library's own code, not a user's
  struct Free {
    std::shared_ptr<Owner> owner;  // null: from Tensor::empty
    void operator()(void* p) const;
  };
  std::unique_ptr<std::byte[], Free> data_;
  DType dtype_ = DType::kU8;
  std::vector<int64_t> shape_;
};

// Scalar conversions used by the fused op and by tests' references.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);  // round to nearest even

}  // namespace fastgather
