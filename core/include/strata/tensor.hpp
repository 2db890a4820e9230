// SPDX-License-Identifier: Apache-2.0
// strata::Tensor and strata::TensorView: how user data reaches Strata.
//
// Strata is not a deep-learning library: it moves and reduces the user's
// tensors, which cross every boundary as DLPack. A Tensor owns one
// DLManagedTensor (its deleter runs when the Tensor dies); it is move-only,
// copies are explicit (clone()). A TensorView is a non-owning view of a
// DLTensor (a user's Eigen/libtorch buffer, a Tensor, a plugin's variable):
// nothing is copied, and the viewed memory must outlive the view.
// Tensor::borrow() wraps foreign memory as a Tensor without copying (the
// Tensor then owns only its shape, never the data).
//
// Only host (kDLCPU) memory is supported by the element accessors in this
// release; dtypes are float32, float64, float16, bfloat16, int32 and int64.
// Element accessors require a compact row-major layout (strides NULL or
// compact).
//
// Thread-safety: distinct objects may be used from different threads; one
// object may be read from several threads at once, but not written.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

#include "strata/error.hpp"
#include "strata/export.hpp"

namespace strata {

/// Element types Strata understands.
/// kUInt8 (appended last, so older values keep their numbers) holds raw
/// bytes such as record payloads; collectives accept only the first six.
enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };

/// DLPack type of `dtype` (lanes = 1).
STRATA_API DLDataType to_dlpack(DType dtype);
/// Inverse of to_dlpack; throws InvalidArgumentError for anything else
/// (e.g. int8, complex, vector lanes).
STRATA_API DType dtype_from_dlpack(DLDataType dt);
/// "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8".
STRATA_API const char* dtype_name(DType dtype);
/// Bytes per element.
STRATA_API std::size_t dtype_size(DType dtype);
/// True for the four floating-point dtypes.
STRATA_API bool is_floating(DType dtype);

/// IEEE binary16 <-> float (round to nearest even; NaN/Inf preserved).
STRATA_API std::uint16_t float_to_half(float f);
STRATA_API float half_to_float(std::uint16_t h);
/// bfloat16 <-> float (round to nearest even; NaN preserved).
STRATA_API std::uint16_t float_to_bfloat16(float f);
STRATA_API float bfloat16_to_float(std::uint16_t b);

/// The DType of a C++ element type: float, double, int32_t, int64_t.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::kFloat32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::kFloat64; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::kUInt8; };

class Tensor;

/// A non-owning view of a DLTensor. Cheap to copy. Built from a Tensor, a
/// DLTensor (the shape array is borrowed too) or a raw buffer with a shape
/// (the view keeps its own copy of the shape). Writing through data() is
/// allowed where the API says so (e.g. all_reduce_in_place).
class STRATA_API TensorView {
 public:
  TensorView(const Tensor& t);    // NOLINT(google-explicit-constructor): zero-copy by design
  TensorView(const DLTensor& t);  // NOLINT(google-explicit-constructor)
  /// View `data` (host memory, compact row-major) with `shape` and `dtype`.
  TensorView(void* data, std::vector<std::int64_t> shape, DType dtype);
  TensorView(const TensorView& o);
  TensorView& operator=(const TensorView& o);
  ~TensorView() = default;

  const DLTensor& dl() const { return dl_; }
  /// Where the elements live ({kDLCPU, 0}, {kDLCUDA, n}, ...).
  DLDevice device() const { return dl_.device; }
  DType dtype() const;
  std::vector<std::int64_t> shape() const;
  std::int64_t ndim() const { return dl_.ndim; }
  std::int64_t numel() const;
  std::size_t nbytes() const;
  bool is_contiguous() const;
  /// First element (byte_offset applied). Throws for non-CPU memory.
  void* raw_data() const;
  template <class T>
  T* data() const {
    check_element_type(dtype_of<T>::value);
    return static_cast<T*>(raw_data());
  }

 private:
  void check_element_type(DType want) const;
  void fix_shape_pointer();
  DLTensor dl_{};
  std::vector<std::int64_t> shape_;  // used only when constructed from a raw buffer
};

/// An owned tensor (one DLManagedTensor). Move-only; clone() copies.
/// A default-constructed Tensor is empty (defined() is false).
class STRATA_API Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  /// A zero-filled host tensor (64-byte aligned).
  static Tensor zeros(const std::vector<std::int64_t>& shape, DType dtype);
  /// A host tensor holding a copy of `values` with `shape` (default: 1-D of
  /// values.size()). Throws InvalidArgumentError when the shape's element
  /// count differs from values.size().
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, std::vector<std::int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
    return from_bytes(values.data(), values.size() * sizeof(T), shape, dtype_of<T>::value);
  }
  /// A 0-d tensor holding `v`.
  template <class T>
  static Tensor scalar(T v) {
    return from_bytes(&v, sizeof(T), {}, dtype_of<T>::value);
  }
  /// A tensor of any dtype from doubles (converted element by element; used
  /// for float16/bfloat16). Throws like from_vector.
  static Tensor from_doubles(const std::vector<double>& values,
                             const std::vector<std::int64_t>& shape, DType dtype);
  /// Copy `nbytes` of compact row-major host data.
  static Tensor from_bytes(const void* data, std::size_t nbytes,
                           const std::vector<std::int64_t>& shape, DType dtype);
  /// Take ownership of `m` (its deleter runs when this Tensor dies). Throws
  /// InvalidArgumentError (and leaves `m` to the caller) when `m` is NULL or
  /// its dtype is not supported.
  static Tensor adopt(DLManagedTensor* m);
  /// Wrap foreign memory without copying: the Tensor owns only a copy of the
  /// shape/strides; the caller keeps the memory alive while the Tensor (and
  /// anything borrowing from it) lives.
  static Tensor borrow(const TensorView& view);
  /// A compact copy (deep copy, even of a borrowed tensor): on the host,
  /// or on the same GPU for a GPU tensor (compact ones only).
  static Tensor copy_of(const TensorView& view);

  Tensor clone() const;
  /// Give the DLManagedTensor to the caller (who must call its deleter);
  /// this Tensor becomes empty.
  DLManagedTensor* to_dlpack();

  bool defined() const { return m_ != nullptr; }
  bool is_borrowed() const;
  /// The DLTensor. Throws FailedPreconditionError on an empty Tensor.
  const DLTensor& dl() const;
  /// Mutable access, e.g. to pass as a collective's output.
  DLTensor& mutable_dl();
  DType dtype() const;
  std::vector<std::int64_t> shape() const;
  std::int64_t ndim() const;
  std::int64_t numel() const;
  std::size_t nbytes() const;

  void* raw_data() const { return TensorView(*this).raw_data(); }
  template <class T>
  T* data() const {
    return TensorView(*this).data<T>();
  }
  /// A copy of the elements; T must match dtype() exactly.
  template <class T>
  std::vector<T> to_vector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + numel());
  }
  /// Every element converted to double (any dtype, including float16).
  std::vector<double> to_doubles() const;

  // ---- devices (element access above needs host memory: on a GPU tensor
  // it throws FailedPreconditionError saying to call .to("cpu:0")) ----

  /// Where the elements live: {kDLCPU, 0} for host tensors, {kDLCUDA, n}
  /// for GPU n. Throws FailedPreconditionError on an empty Tensor.
  DLDevice device() const;
  /// "cpu:0", "gpu:1", ... (see device_name).
  std::string device_string() const;
  bool is_cuda() const { return defined() && dl().device.device_type == kDLCUDA; }
  /// A compact copy on `device`: "cpu:0", "gpu:<n>" or "cuda:<n>" (or the
  /// DLDevice). Host to GPU, GPU to host and GPU to GPU copies go through
  /// the CUDA runtime and are finished when to() returns. Always a new
  /// tensor (also when it is already there). Throws FailedPreconditionError
  /// "no CUDA device visible: ..." without a GPU, InvalidArgumentError for
  /// gpu:<n> beyond the visible count, UnimplementedError in a build
  /// without CUDA.
  Tensor to(const std::string& device) const;
  Tensor to(DLDevice device) const;

 private:
  DLManagedTensor* m_ = nullptr;
};

/// Parse "cpu:<n>", "gpu:<n>" or "cuda:<n>" (the alias) into a DLDevice;
/// InvalidArgumentError otherwise. Does not check that the GPU exists.
STRATA_API DLDevice parse_device(const std::string& name);
/// "cpu:0", "gpu:1" (kDLCUDA), "cuda_host:0" (kDLCUDAHost).
STRATA_API std::string device_name(DLDevice device);
/// CUDA devices visible to this process; 0 when there are none or the
/// build has no CUDA. Never throws.
STRATA_API int num_gpus() noexcept;
/// Why no GPU can be used ("no CUDA device visible: <CUDA error>. Check
/// ..."), or "" when num_gpus() > 0.
STRATA_API std::string gpu_unavailable_reason();

/// Number of elements of `shape` (1 for a scalar). Throws
/// InvalidArgumentError on a negative dimension.
STRATA_API std::int64_t shape_numel(const std::vector<std::int64_t>& shape);

}  // namespace strata
