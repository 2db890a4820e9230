// SPDX-License-Identifier: Apache-2.0
// Owned DLPack tensors and tensor copies for plugins.
//
// make_tensor allocates a DLManagedTensor whose deleter frees everything it
// owns (struct, shape and 64-byte aligned data). The deleter is code of the
// library that made the tensor; the host never unloads a library before exit,
// so such tensors may be handed to the caller across the C ABI.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace strata::sdk {

struct ManagedTensorDeleter {
  void operator()(DLManagedTensor* t) const noexcept {
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
};
/// Owning pointer to a DLManagedTensor; release() it to hand it across the ABI.
using ManagedTensorPtr = std::unique_ptr<DLManagedTensor, ManagedTensorDeleter>;

/// A 64-byte aligned, growable host byte buffer (contents undefined after grow).
/// Move-only; not thread-safe.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { reserve(bytes); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr; o.size_ = 0; }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();
  /// Ensure at least `bytes` of capacity; throws std::bad_alloc.
  void reserve(size_t bytes);
  void* data() const { return ptr_; }
  size_t capacity() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

/// A new contiguous host tensor of `dtype` and `shape`, uninitialised.
/// Throws INVALID_ARGUMENT for an unsupported dtype or negative dim.
ManagedTensorPtr make_tensor(DLDataType dtype, const std::vector<int64_t>& shape,
                             DLDevice device = DLDevice{kDLCPU, 0});
/// A new tensor with a copy of `src`'s elements (src must pass check_tensor).
ManagedTensorPtr clone_tensor(const DLTensor& src);
/// Copy `src` into `dst` (same dtype and shape, both contiguous host tensors).
void copy_tensor(const DLTensor& src, DLTensor& dst);

/// Shape of concatenating `inputs[0..n)` along `axis` (negative counts from
/// the end). Throws INVALID_ARGUMENT naming the inputs when dtypes, ranks or
/// the other dims differ, or the axis is out of range.
std::vector<int64_t> concat_shape(const DLTensor* const* inputs, uint32_t n, int32_t axis);
/// Concatenate `inputs` along `axis` into `output` (shape = concat_shape).
void concat(const DLTensor* const* inputs, uint32_t n, int32_t axis, DLTensor& output);

}  // namespace strata::sdk
