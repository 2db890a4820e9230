// SPDX-License-Identifier: Apache-2.0
#include "strata/tensor.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "api/kernels.h"
#include "host/cuda_device.h"
#include "strata/sdk/kernels.hpp"

namespace strata {

DLDataType to_dlpack(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return DLDataType{kDLFloat, 32, 1};
    case DType::kFloat64: return DLDataType{kDLFloat, 64, 1};
    case DType::kFloat16: return DLDataType{kDLFloat, 16, 1};
    case DType::kBFloat16: return DLDataType{kDLBfloat, 16, 1};
    case DType::kInt32: return DLDataType{kDLInt, 32, 1};
    case DType::kInt64: return DLDataType{kDLInt, 64, 1};
    case DType::kUInt8: return DLDataType{kDLUInt, 8, 1};
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown DType ", static_cast<int>(dtype));
}

DType dtype_from_dlpack(DLDataType dt) {
  if (dt.lanes == 1) {
    if (dt.code == kDLFloat && dt.bits == 32) return DType::kFloat32;
    if (dt.code == kDLFloat && dt.bits == 64) return DType::kFloat64;
    if (dt.code == kDLFloat && dt.bits == 16) return DType::kFloat16;
    if (dt.code == kDLBfloat && dt.bits == 16) return DType::kBFloat16;
    if (dt.code == kDLInt && dt.bits == 32) return DType::kInt32;
    if (dt.code == kDLInt && dt.bits == 64) return DType::kInt64;
    if (dt.code == kDLUInt && dt.bits == 8) return DType::kUInt8;
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unsupported DLPack dtype (code ", int(dt.code),
               ", bits ", int(dt.bits), ", lanes ", dt.lanes,
               "): use float32, float64, float16, bfloat16, int32, int64 or uint8 with lanes 1");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) { return to_dlpack(dtype).bits / 8; }

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

// The conversions are the SDK's (also used by the plugins' kernels), so the
// host and the plugins round float16/bfloat16 identically.
std::uint16_t float_to_half(float f) { return sdk::kernels::float_to_half(f); }
float half_to_float(std::uint16_t h) { return sdk::kernels::half_to_float(h); }
std::uint16_t float_to_bfloat16(float f) { return sdk::kernels::float_to_bfloat16(f); }
float bfloat16_to_float(std::uint16_t b) { return sdk::kernels::bfloat16_to_float(b); }

std::int64_t shape_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    STRATA_ENFORCE(d >= 0, STRATA_ERR_INVALID_ARGUMENT, "negative dimension ", d,
                   " in a tensor shape; every dimension must be >= 0");
    n *= d;
  }
  return n;
}

// ---------------------------------------------------------------------------
// TensorView

TensorView::TensorView(const Tensor& t) : dl_(t.dl()) {}
TensorView::TensorView(const DLTensor& t) : dl_(t) {}

TensorView::TensorView(void* data, std::vector<std::int64_t> shape, DType dtype)
    : shape_(std::move(shape)) {
  shape_numel(shape_);
  dl_.data = data;
  dl_.device = DLDevice{kDLCPU, 0};
  dl_.ndim = static_cast<int32_t>(shape_.size());
  dl_.dtype = to_dlpack(dtype);
  dl_.strides = nullptr;
  dl_.byte_offset = 0;
  fix_shape_pointer();
}

TensorView::TensorView(const TensorView& o) : dl_(o.dl_), shape_(o.shape_) {
  if (!o.shape_.empty() && o.dl_.shape == o.shape_.data()) fix_shape_pointer();
}

TensorView& TensorView::operator=(const TensorView& o) {
  if (this != &o) {
    const bool owned = !o.shape_.empty() && o.dl_.shape == o.shape_.data();
    dl_ = o.dl_;
    shape_ = o.shape_;
    if (owned) fix_shape_pointer();
  }
  return *this;
}

void TensorView::fix_shape_pointer() { dl_.shape = shape_.empty() ? nullptr : shape_.data(); }

DType TensorView::dtype() const { return dtype_from_dlpack(dl_.dtype); }

std::vector<std::int64_t> TensorView::shape() const {
  return std::vector<std::int64_t>(dl_.shape, dl_.shape + dl_.ndim);
}

std::int64_t TensorView::numel() const { return detail::numel(dl_); }
std::size_t TensorView::nbytes() const {
  return static_cast<std::size_t>(numel()) * (dl_.dtype.bits / 8u) * dl_.dtype.lanes;
}
bool TensorView::is_contiguous() const { return detail::is_contiguous(dl_); }

void* TensorView::raw_data() const {
  STRATA_ENFORCE(dl_.device.device_type != kDLCUDA, STRATA_ERR_FAILED_PRECONDITION, "tensor lives on ",
                 device_name(dl_.device),
                 "; element access (data, to_vector, to_doubles) needs host memory: call .to(\"cpu:0\") "
                 "first");
  STRATA_ENFORCE(dl_.device.device_type == kDLCPU || dl_.device.device_type == kDLCUDAHost,
                 STRATA_ERR_INVALID_ARGUMENT, "tensor lives on device type ",
                 int(dl_.device.device_type),
                 "; element access needs host memory (kDLCPU): copy it to the host first");
  return static_cast<char*>(dl_.data) + dl_.byte_offset;
}

void TensorView::check_element_type(DType want) const {
  const DType have = dtype();
  STRATA_ENFORCE(have == want, STRATA_ERR_INVALID_ARGUMENT, "tensor has dtype ", dtype_name(have),
                 " but was accessed as ", dtype_name(want), "; use data<T>() with the matching T");
  STRATA_ENFORCE(is_contiguous(), STRATA_ERR_INVALID_ARGUMENT,
                 "element access needs a compact row-major tensor; make a copy with "
                 "Tensor::copy_of(view) first");
}

// ---------------------------------------------------------------------------
// Tensor

namespace {

// One allocation per tensor: the DLManagedTensor, its shape/strides and, for
// owned tensors, a pointer to the 64-byte aligned buffer.
struct Holder {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  void* buffer = nullptr;  // owned; NULL for borrowed tensors
  std::size_t alloc = 0;   // its size
  DLDevice device{kDLCPU, 0};  // where buffer lives (kDLCUDA: freed through CUDA)
};

// Large buffers of freed tensors are kept for the next tensor of the same
// size (a few, bounded), as frameworks' CPU allocators do. glibc gives a
// block of megabytes back to the kernel on free (munmap, or a heap trim),
// and the next one then costs a page fault per 4 KiB on its first write:
// about 4,000 faults, 2-4 ms on these machines, for a 16 MiB tensor, more
// than a parameter-server pull of it takes. Off under AddressSanitizer, so
// that it still sees every use after free.
class BufferCache {
 public:
  static constexpr std::size_t kMinBytes = std::size_t{1} << 20;
  static constexpr std::size_t kMaxBytes = std::size_t{256} << 20;  // in all
  static constexpr std::size_t kMaxBuffers = 8;

  void* take(std::size_t n) {
    if (!kEnabled || n < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> l(mu_);
    for (std::size_t i = free_.size(); i-- > 0;) {
      if (free_[i].first != n) continue;
      void* p = free_[i].second;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      total_ -= n;
      return p;
    }
    return nullptr;
  }

  void give(void* p, std::size_t n) {
    if (!kEnabled || n < kMinBytes || n > kMaxBytes) {
      std::free(p);
      return;
    }
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> l(mu_);
      while (!free_.empty() && (free_.size() >= kMaxBuffers || total_ + n > kMaxBytes)) {  // oldest first
        evicted.push_back(free_.front().second);
        total_ -= free_.front().first;
        free_.erase(free_.begin());
      }
      free_.emplace_back(n, p);
      total_ += n;
    }
    for (void* e : evicted) std::free(e);
  }

 private:
#if defined(__SANITIZE_ADDRESS__)
  static constexpr bool kEnabled = false;
#else
  static constexpr bool kEnabled = true;
#endif
  std::mutex mu_;
  std::vector<std::pair<std::size_t, void*>> free_;
  std::size_t total_ = 0;
};

// Never destroyed: tensors may be freed during static destruction.
BufferCache& buffer_cache() {
  static BufferCache* cache = new BufferCache;
  return *cache;
}

void holder_deleter(DLManagedTensor* self) {
  auto* h = static_cast<Holder*>(self->manager_ctx);
  if (h->buffer && h->device.device_type == kDLCUDA)
    detail::cuda::free_memory(h->device, h->buffer);
  else if (h->buffer)
    buffer_cache().give(h->buffer, h->alloc);
  delete h;
}

// `zero`: clear the bytes; false when the caller writes every byte next.
DLManagedTensor* make_managed(const std::vector<std::int64_t>& shape, DType dtype, bool zero = true) {
  const std::int64_t n = shape_numel(shape);
  auto h = std::make_unique<Holder>();
  h->shape = shape;
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  // aligned_alloc needs a size that is a multiple of the alignment; large
  // ones are whole pages (BufferCache matches sizes exactly).
  const std::size_t align = bytes >= BufferCache::kMinBytes ? 4096 : 64;
  const std::size_t alloc = bytes == 0 ? 64 : ((bytes + align - 1) / align) * align;
  h->buffer = buffer_cache().take(alloc);
  if (h->buffer == nullptr) h->buffer = std::aligned_alloc(64, alloc);
  if (h->buffer == nullptr) throw std::bad_alloc();
  h->alloc = alloc;
  if (zero) std::memset(h->buffer, 0, alloc);
  DLTensor& t = h->managed.dl_tensor;
  t.data = h->buffer;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = to_dlpack(dtype);
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &holder_deleter;
  return &h.release()->managed;
}

}  // namespace

Tensor::Tensor(Tensor&& o) noexcept : m_(std::exchange(o.m_, nullptr)) {}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    if (m_ && m_->deleter) m_->deleter(m_);
    m_ = std::exchange(o.m_, nullptr);
  }
  return *this;
}

Tensor::~Tensor() {
  if (m_ && m_->deleter) m_->deleter(m_);
}

Tensor Tensor::zeros(const std::vector<std::int64_t>& shape, DType dtype) {
  Tensor t;
  t.m_ = make_managed(shape, dtype);
  return t;
}

namespace detail {
Tensor uninitialized_tensor(const std::vector<std::int64_t>& shape, DType dtype) {
  return Tensor::adopt(make_managed(shape, dtype, /*zero=*/false));
}
}  // namespace detail

Tensor Tensor::from_bytes(const void* data, std::size_t nbytes,
                          const std::vector<std::int64_t>& shape, DType dtype) {
  const std::int64_t n = shape_numel(shape);
  STRATA_ENFORCE(static_cast<std::size_t>(n) * dtype_size(dtype) == nbytes,
                 STRATA_ERR_INVALID_ARGUMENT, "shape holds ", n, " elements of ", dtype_name(dtype),
                 " but ", nbytes / dtype_size(dtype),
                 " were given; make the shape's product equal the number of values");
  Tensor t;
  t.m_ = make_managed(shape, dtype, /*zero=*/false);
  if (nbytes) std::memcpy(t.m_->dl_tensor.data, data, nbytes);
  return t;
}

Tensor Tensor::from_doubles(const std::vector<double>& values,
                            const std::vector<std::int64_t>& shape, DType dtype) {
  const std::int64_t n = shape_numel(shape);
  STRATA_ENFORCE(static_cast<std::size_t>(n) == values.size(), STRATA_ERR_INVALID_ARGUMENT,
                 "shape holds ", n, " elements but ", values.size(),
                 " values were given; make the shape's product equal the number of values");
  Tensor t = zeros(shape, dtype);
  for (std::int64_t i = 0; i < n; ++i) detail::store_double(t.mutable_dl(), i, values[i]);
  return t;
}

Tensor Tensor::adopt(DLManagedTensor* m) {
  STRATA_ENFORCE(m != nullptr, STRATA_ERR_INVALID_ARGUMENT,
                 "Tensor::adopt was given NULL; pass a DLManagedTensor*");
  dtype_from_dlpack(m->dl_tensor.dtype);
  STRATA_ENFORCE(m->dl_tensor.ndim >= 0 && (m->dl_tensor.ndim == 0 || m->dl_tensor.shape),
                 STRATA_ERR_INVALID_ARGUMENT, "DLManagedTensor has ndim ", m->dl_tensor.ndim,
                 " and a ", m->dl_tensor.shape ? "non-NULL" : "NULL",
                 " shape; a tensor needs ndim >= 0 and a shape array when ndim > 0");
  Tensor t;
  t.m_ = m;
  return t;
}

Tensor Tensor::borrow(const TensorView& view) {
  const DLTensor& src = view.dl();
  dtype_from_dlpack(src.dtype);
  auto h = std::make_unique<Holder>();
  h->shape.assign(src.shape, src.shape + src.ndim);
  if (src.strides) h->strides.assign(src.strides, src.strides + src.ndim);
  DLTensor& t = h->managed.dl_tensor;
  t = src;
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  t.strides = src.strides ? h->strides.data() : nullptr;
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &holder_deleter;
  Tensor out;
  out.m_ = &h.release()->managed;
  return out;
}

Tensor Tensor::copy_of(const TensorView& view) {
  const DLTensor& src = view.dl();
  if (src.device.device_type == kDLCUDA) return borrow(view).to(src.device);  // a copy on the same GPU
  Tensor t = detail::uninitialized_tensor(view.shape(), view.dtype());  // copy_into writes every element
  detail::copy_into(t.mutable_dl(), src);
  return t;
}

Tensor Tensor::clone() const { return copy_of(*this); }

DLManagedTensor* Tensor::to_dlpack() {
  STRATA_ENFORCE(m_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "to_dlpack() on an empty Tensor; create it with zeros/from_vector/adopt first");
  return std::exchange(m_, nullptr);
}

bool Tensor::is_borrowed() const {
  return m_ && m_->deleter == &holder_deleter &&
         static_cast<Holder*>(m_->manager_ctx)->buffer == nullptr;
}

const DLTensor& Tensor::dl() const {
  STRATA_ENFORCE(m_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "use of an empty (default-constructed or moved-from) Tensor; assign a value first");
  return m_->dl_tensor;
}

DLTensor& Tensor::mutable_dl() {
  STRATA_ENFORCE(m_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "use of an empty (default-constructed or moved-from) Tensor; assign a value first");
  return m_->dl_tensor;
}

DType Tensor::dtype() const { return dtype_from_dlpack(dl().dtype); }
std::vector<std::int64_t> Tensor::shape() const { return TensorView(*this).shape(); }
std::int64_t Tensor::ndim() const { return dl().ndim; }
std::int64_t Tensor::numel() const { return detail::numel(dl()); }
std::size_t Tensor::nbytes() const { return TensorView(*this).nbytes(); }

std::vector<double> Tensor::to_doubles() const {
  const DLTensor& t = dl();
  TensorView(*this).raw_data();  // host memory only: the .to("cpu:0") message
  STRATA_ENFORCE(detail::is_contiguous(t), STRATA_ERR_INVALID_ARGUMENT,
                 "to_doubles needs a compact tensor; make a copy with Tensor::copy_of first");
  const std::int64_t n = numel();
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = detail::load_double(t, i);
  return out;
}

// ---------------------------------------------------------------------------
// Devices

DLDevice parse_device(const std::string& name) {
  auto ordinal = [&](std::size_t prefix) -> int {
    const std::string rest = name.substr(prefix);
    if (rest.empty() || rest.size() > 6 || rest.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(rest);
  };
  int n = -1;
  DLDeviceType type = kDLCPU;
  if (name.rfind("cpu:", 0) == 0) {
    n = ordinal(4);
  } else if (name.rfind("gpu:", 0) == 0) {
    n = ordinal(4);
    type = kDLCUDA;
  } else if (name.rfind("cuda:", 0) == 0) {
    n = ordinal(5);
    type = kDLCUDA;
  }
  STRATA_ENFORCE(n >= 0, STRATA_ERR_INVALID_ARGUMENT, "device '", name,
                 "' is not of the form \"cpu:<n>\", \"gpu:<n>\" or \"cuda:<n>\" (e.g. \"gpu:0\")");
  return DLDevice{type, n};
}

std::string device_name(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return "cpu:" + std::to_string(d.device_id);
    case kDLCUDA: return "gpu:" + std::to_string(d.device_id);
    case kDLCUDAHost: return "cuda_host:" + std::to_string(d.device_id);
    default: return "device_type_" + std::to_string(int(d.device_type)) + ":" + std::to_string(d.device_id);
  }
}

int num_gpus() noexcept {
  try {
    int32_t n = 0;
    std::string why;
    return detail::cuda::device_count(&n, &why) == STRATA_OK ? n : 0;
  } catch (...) {
    return 0;
  }
}

std::string gpu_unavailable_reason() {
  int32_t n = 0;
  std::string why;
  return detail::cuda::device_count(&n, &why) == STRATA_OK ? std::string() : why;
}

namespace detail {
Tensor device_tensor(const std::vector<std::int64_t>& shape, DType dtype, DLDevice device) {
  if (device.device_type != kDLCUDA) return uninitialized_tensor(shape, dtype);
  std::string why;
  const strata_status_t st = cuda::check_device(device, &why);
  if (st != STRATA_OK) throw_status(st, why);
  auto h = std::make_unique<Holder>();
  h->shape = shape;
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  h->buffer = cuda::allocate(device, bytes, &why);
  if (h->buffer == nullptr) throw_status(STRATA_ERR_INTERNAL, why);
  h->alloc = bytes;
  h->device = device;
  DLTensor& t = h->managed.dl_tensor;
  t.data = h->buffer;
  t.device = device;
  t.ndim = static_cast<int32_t>(h->shape.size());
  t.dtype = to_dlpack(dtype);
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &holder_deleter;
  return Tensor::adopt(&h.release()->managed);
}
}  // namespace detail

DLDevice Tensor::device() const { return dl().device; }
std::string Tensor::device_string() const { return device_name(device()); }

Tensor Tensor::to(const std::string& device) const { return to(parse_device(device)); }

Tensor Tensor::to(DLDevice dst) const {
  const DLTensor& src = dl();
  const bool src_host = src.device.device_type == kDLCPU || src.device.device_type == kDLCUDAHost;
  STRATA_ENFORCE(dst.device_type == kDLCPU || dst.device_type == kDLCUDA, STRATA_ERR_INVALID_ARGUMENT,
                 "Tensor::to(", device_name(dst), "): only \"cpu:<n>\" and \"gpu:<n>\" are supported");
  STRATA_ENFORCE(src_host || src.device.device_type == kDLCUDA, STRATA_ERR_INVALID_ARGUMENT,
                 "Tensor::to: the tensor lives on ", device_name(src.device), ", which Strata cannot copy from");
  if (dst.device_type == kDLCPU && src_host) return clone();
  STRATA_ENFORCE(detail::is_contiguous(src), STRATA_ERR_INVALID_ARGUMENT,
                 "Tensor::to(", device_name(dst), ") needs a compact tensor; make a copy with Tensor::copy_of first");
  std::string why;
  for (DLDevice d : {src.device, dst})
    if (d.device_type == kDLCUDA) {
      const strata_status_t st = detail::cuda::check_device(d, &why);
      if (st != STRATA_OK) detail::throw_status(st, "Tensor::to(" + device_name(dst) + "): " + why);
    }
  const std::size_t bytes = nbytes();
  Tensor out = detail::device_tensor(shape(), dtype(), dst);
  const void* from = static_cast<const char*>(src.data) + src.byte_offset;
  const strata_status_t st =
      detail::cuda::memcpy_async(out.m_->dl_tensor.data, out.m_->dl_tensor.device, from, src.device, bytes,
                                 /*stream=*/nullptr, &why);  // NULL stream: synchronous
  if (st != STRATA_OK) detail::throw_status(st, "Tensor::to(" + device_name(dst) + "): " + why);
  return out;
}

}  // namespace strata
