// SPDX-License-Identifier: Apache-2.0
#include "api/kernels.h"

#include "strata/sdk/kernels.hpp"

#include <cmath>
#include <cstring>

namespace strata::detail {

std::int64_t numel(const DLTensor& t) { return sdk::element_count(t); }

bool is_contiguous(const DLTensor& t) { return sdk::is_contiguous(t); }

std::string shape_string(const DLTensor& t) { return sdk::shape_string(t); }
std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string r = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}

void check_host_compact(const DLTensor& t, const char* what) {
  dtype_from_dlpack(t.dtype);
  STRATA_ENFORCE(t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost,
                 STRATA_ERR_INVALID_ARGUMENT, what, " lives on DLPack device type ",
                 int(t.device.device_type), "; this operation needs host (kDLCPU) memory");
  STRATA_ENFORCE(is_contiguous(t), STRATA_ERR_INVALID_ARGUMENT, what,
                 " is not compact row-major; pass a compact copy (Tensor::copy_of)");
}

void check_same_layout(const DLTensor& a, const DLTensor& b, const char* what) {
  const DType da = dtype_from_dlpack(a.dtype), db = dtype_from_dlpack(b.dtype);
  STRATA_ENFORCE(da == db, STRATA_ERR_INVALID_ARGUMENT, what, ": dtype ", dtype_name(db),
                 " does not match ", dtype_name(da), "; pass tensors of the same dtype");
  bool same = a.ndim == b.ndim;
  for (int i = 0; same && i < a.ndim; ++i) same = a.shape[i] == b.shape[i];
  STRATA_ENFORCE(same, STRATA_ERR_INVALID_ARGUMENT, what, ": shape ", shape_string(b),
                 " does not match ", shape_string(a), "; pass tensors of the same shape");
}

namespace {

char* base(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

}  // namespace

double load_double(const DLTensor& t, std::int64_t i) {
  char* p = base(t);
  switch (dtype_from_dlpack(t.dtype)) {
    case DType::kFloat32: return reinterpret_cast<const float*>(p)[i];
    case DType::kFloat64: return reinterpret_cast<const double*>(p)[i];
    case DType::kFloat16: return half_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::kBFloat16: return bfloat16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::kInt32: return reinterpret_cast<const std::int32_t*>(p)[i];
    case DType::kInt64: return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
    case DType::kUInt8: return reinterpret_cast<const std::uint8_t*>(p)[i];
  }
  return 0;
}

void store_double(DLTensor& t, std::int64_t i, double v) {
  char* p = base(t);
  switch (dtype_from_dlpack(t.dtype)) {
    case DType::kFloat32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::kFloat64: reinterpret_cast<double*>(p)[i] = v; return;
    case DType::kFloat16:
      reinterpret_cast<std::uint16_t*>(p)[i] = float_to_half(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      reinterpret_cast<std::uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(v));
      return;
    case DType::kInt32: reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v); return;
    case DType::kInt64: reinterpret_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v); return;
    case DType::kUInt8: reinterpret_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(v); return;
  }
}

void copy_into(DLTensor& dst, const DLTensor& src) {
  check_host_compact(dst, "destination");
  check_host_compact(src, "source");
  check_same_layout(dst, src, "copy");
  const std::size_t bytes = static_cast<std::size_t>(numel(src)) * (src.dtype.bits / 8u);
  if (bytes && base(dst) != base(src)) std::memmove(base(dst), base(src), bytes);
}

void add_into(DLTensor& dst, const DLTensor& src, int sign) {
  check_host_compact(dst, "destination");
  check_host_compact(src, "update value");
  check_same_layout(dst, src, "update");
  const std::int64_t n = numel(dst);
  const DType dt = dtype_from_dlpack(dst.dtype);
  // Integers stay exact (no trip through double, which loses int64 bits).
  if (dt == DType::kInt64) {
    auto* d = reinterpret_cast<std::int64_t*>(base(dst));
    auto* s = reinterpret_cast<const std::int64_t*>(base(src));
    for (std::int64_t i = 0; i < n; ++i) d[i] += sign * s[i];
    return;
  }
  if (dt == DType::kInt32) {
    auto* d = reinterpret_cast<std::int32_t*>(base(dst));
    auto* s = reinterpret_cast<const std::int32_t*>(base(src));
    for (std::int64_t i = 0; i < n; ++i) d[i] += sign * s[i];
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    store_double(dst, i, load_double(dst, i) + sign * load_double(src, i));
}

void divide_by(DLTensor& dst, double divisor) {
  check_host_compact(dst, "tensor");
  const std::int64_t n = numel(dst);
  const DType dt = dtype_from_dlpack(dst.dtype);
  if (dt == DType::kInt64) {
    auto* d = reinterpret_cast<std::int64_t*>(base(dst));
    const auto q = static_cast<std::int64_t>(divisor);
    STRATA_ENFORCE(q != 0, STRATA_ERR_INVALID_ARGUMENT, "integer division by zero");
    for (std::int64_t i = 0; i < n; ++i) d[i] /= q;
    return;
  }
  if (dt == DType::kInt32) {
    auto* d = reinterpret_cast<std::int32_t*>(base(dst));
    const auto q = static_cast<std::int32_t>(divisor);
    STRATA_ENFORCE(q != 0, STRATA_ERR_INVALID_ARGUMENT, "integer division by zero");
    for (std::int64_t i = 0; i < n; ++i) d[i] /= q;
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store_double(dst, i, load_double(dst, i) / divisor);
}

Tensor sum_along_axis(const DLTensor& t, int axis) {
  check_host_compact(t, "value");
  STRATA_ENFORCE(axis >= 0 && axis < t.ndim, STRATA_ERR_INVALID_ARGUMENT, "axis ", axis,
                 " is out of range for a tensor of rank ", t.ndim);
  std::vector<std::int64_t> out_shape;
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (i != axis) out_shape.push_back(t.shape[i]);
    if (i < axis) outer *= t.shape[i];
    if (i > axis) inner *= t.shape[i];
  }
  const std::int64_t len = t.shape[axis];
  const DType dt = dtype_from_dlpack(t.dtype);
  Tensor out = Tensor::zeros(out_shape, dt);
  DLTensor& o = out.mutable_dl();
  for (std::int64_t a = 0; a < outer; ++a) {
    for (std::int64_t b = 0; b < inner; ++b) {
      if (dt == DType::kInt64 || dt == DType::kInt32) {
        std::int64_t acc = 0;
        for (std::int64_t k = 0; k < len; ++k) {
          const std::int64_t idx = (a * len + k) * inner + b;
          acc += dt == DType::kInt64 ? reinterpret_cast<const std::int64_t*>(base(t))[idx]
                                     : reinterpret_cast<const std::int32_t*>(base(t))[idx];
        }
        if (dt == DType::kInt64)
          reinterpret_cast<std::int64_t*>(base(o))[a * inner + b] = acc;
        else
          reinterpret_cast<std::int32_t*>(base(o))[a * inner + b] = static_cast<std::int32_t>(acc);
      } else {
        double acc = 0;
        for (std::int64_t k = 0; k < len; ++k) acc += load_double(t, (a * len + k) * inner + b);
        store_double(o, a * inner + b, acc);
      }
    }
  }
  return out;
}

double sum_all(const DLTensor& t) {
  check_host_compact(t, "value");
  double acc = 0;
  const std::int64_t n = numel(t);
  for (std::int64_t i = 0; i < n; ++i) acc += load_double(t, i);
  return acc;
}

}  // namespace strata::detail
