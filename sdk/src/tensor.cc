// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/tensor.hpp"

#include "strata/sdk/device.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "strata/error.hpp"
#include "strata/sdk/kernels.hpp"

namespace strata::sdk {
namespace {

struct Holder {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  void* data = nullptr;
  ~Holder() { std::free(data); }
};

void delete_holder(DLManagedTensor* t) { delete static_cast<Holder*>(t->manager_ctx); }

}  // namespace

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(ptr_);
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(ptr_); }

void AlignedBuffer::reserve(size_t bytes) {
  if (bytes <= size_ && ptr_ != nullptr) return;
  const size_t rounded = ((bytes + 63) / 64) * 64 + 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::free(ptr_);
  ptr_ = p;
  size_ = rounded;
}

ManagedTensorPtr make_tensor(DLDataType dtype, const std::vector<int64_t>& shape,
                             DLDevice device) {
  check_dtype_supported(dtype, "new tensor");
  size_t count = 1;
  for (int64_t d : shape) {
    if (d < 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "cannot make a tensor with negative dimension ",
                   d, "; pass a valid shape");
    count *= static_cast<size_t>(d);
  }
  auto holder = std::make_unique<Holder>();
  holder->shape = shape;
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t bytes = count * (dtype.bits / 8);
  const size_t rounded = ((bytes + 63) / 64) * 64 + 64;
  holder->data = std::aligned_alloc(64, rounded);
  if (holder->data == nullptr) throw std::bad_alloc();
  DLTensor& t = holder->managed.dl_tensor;
  t.data = holder->data;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = holder->shape.empty() ? nullptr : holder->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = &delete_holder;
  Holder* raw = holder.release();
  return ManagedTensorPtr(&raw->managed);
}

ManagedTensorPtr clone_tensor(const DLTensor& src) {
  check_tensor(src, "tensor to copy");
  auto out = make_tensor(src.dtype, std::vector<int64_t>(src.shape, src.shape + src.ndim));
  copy_tensor(src, out->dl_tensor);
  return out;
}

void copy_tensor(const DLTensor& src, DLTensor& dst) {
  check_tensor(src, "source tensor");
  check_tensor(dst, "destination tensor");
  check_same_type_and_shape(src, "source", dst, "destination");
  const void* s = data_ptr(src);
  void* d = data_ptr(dst);
  if (s != d) std::memmove(d, s, byte_size(src));
}

std::vector<int64_t> concat_shape(const DLTensor* const* inputs, uint32_t n, int32_t axis) {
  if (n == 0 || inputs == nullptr)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "gather needs at least one input tensor");
  for (uint32_t r = 0; r < n; ++r) {
    if (inputs[r] == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "gather input ", r, " is NULL");
    check_tensor_metadata(*inputs[r], "gather input " + std::to_string(r));  // shapes only: GPU inputs too
  }
  const DLTensor& first = *inputs[0];
  const int32_t ndim = first.ndim;
  if (ndim == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "cannot gather scalars (rank 0): give each value at least one dimension");
  const int32_t ax = axis < 0 ? axis + ndim : axis;
  if (ax < 0 || ax >= ndim)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "gather axis ", axis, " is out of range for rank ",
                 ndim, " tensors (", shape_string(first), "); use -", ndim, "..", ndim - 1);
  std::vector<int64_t> shape(first.shape, first.shape + ndim);
  shape[ax] = 0;
  for (uint32_t r = 0; r < n; ++r) {
    const DLTensor& t = *inputs[r];
    bool ok = dtype_equal(t.dtype, first.dtype) && t.ndim == ndim;
    for (int32_t d = 0; ok && d < ndim; ++d)
      if (d != ax && t.shape[d] != first.shape[d]) ok = false;
    if (!ok)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "gather inputs differ outside axis ", ax,
                   ": input 0 is ", tensor_string(first), " but input ", r, " is ",
                   tensor_string(t), "; only the size along the gather axis may differ");
    shape[ax] += t.shape[ax];
  }
  return shape;
}

void concat(const DLTensor* const* inputs, uint32_t n, int32_t axis, DLTensor& output) {
  const std::vector<int64_t> shape = concat_shape(inputs, n, axis);
  check_tensor(output, "gather output");
  const DLTensor& first = *inputs[0];
  const int32_t ax = axis < 0 ? axis + first.ndim : axis;
  bool ok = dtype_equal(output.dtype, first.dtype) &&
            output.ndim == static_cast<int32_t>(shape.size());
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = output.shape[d] == shape[d];
  if (!ok)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "gather output is ", tensor_string(output),
                 " but the concatenation of the inputs is ", dtype_name(first.dtype), "[",
                 [&] {
                   std::string s;
                   for (size_t d = 0; d < shape.size(); ++d)
                     s += (d ? ", " : "") + std::to_string(shape[d]);
                   return s;
                 }(),
                 "]; allocate the output with that shape");
  // Row-major: the data is `outer` runs, each the concatenation of each
  // input's contiguous slab of shape[ax..] elements.
  const size_t esize = dtype_size(first.dtype);
  size_t outer = 1, inner = 1;
  for (int32_t d = 0; d < ax; ++d) outer *= static_cast<size_t>(shape[d]);
  for (size_t d = ax + 1; d < shape.size(); ++d) inner *= static_cast<size_t>(shape[d]);
  char* out = static_cast<char*>(data_ptr(output));
  for (size_t o = 0; o < outer; ++o) {
    for (uint32_t r = 0; r < n; ++r) {
      const size_t slab = static_cast<size_t>(inputs[r]->shape[ax]) * inner * esize;
      if (slab == 0) continue;
      const char* src = static_cast<const char*>(data_ptr(*inputs[r])) + o * slab;
      std::memcpy(out, src, slab);
      out += slab;
    }
  }
}

}  // namespace strata::sdk
