// SPDX-License-Identifier: Apache-2.0
#include "test_tensors.h"

#include "strata/sdk/kernels.hpp"

namespace strata::test {

using namespace strata::sdk;

HostTensor::HostTensor(DLDataType d, std::vector<int64_t> s) : dtype(d), shape(std::move(s)) {
  size_t n = 1;
  for (int64_t x : shape) n *= static_cast<size_t>(x);
  bytes.assign(n * (d.bits / 8) + 8, 0);
  t = DLTensor{bytes.data(), {kDLCPU, 0}, static_cast<int32_t>(shape.size()), d,
               shape.empty() ? nullptr : shape.data(), nullptr, 0};
}

size_t HostTensor::count() const {
  size_t n = 1;
  for (int64_t x : shape) n *= static_cast<size_t>(x);
  return n;
}

void HostTensor::set(size_t i, double v) {
  void* p = bytes.data();
  if (dtype_equal(dtype, kFloat32)) static_cast<float*>(p)[i] = static_cast<float>(v);
  else if (dtype_equal(dtype, kFloat64)) static_cast<double*>(p)[i] = v;
  else if (dtype_equal(dtype, kFloat16)) static_cast<uint16_t*>(p)[i] = kernels::float_to_half(static_cast<float>(v));
  else if (dtype_equal(dtype, kBFloat16)) static_cast<uint16_t*>(p)[i] = kernels::float_to_bfloat16(static_cast<float>(v));
  else if (dtype_equal(dtype, kInt32)) static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
  else static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
}

double load(DLDataType d, const void* p, size_t i) {
  if (dtype_equal(d, kFloat32)) return static_cast<const float*>(p)[i];
  if (dtype_equal(d, kFloat64)) return static_cast<const double*>(p)[i];
  if (dtype_equal(d, kFloat16)) return kernels::half_to_float(static_cast<const uint16_t*>(p)[i]);
  if (dtype_equal(d, kBFloat16)) return kernels::bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
  if (dtype_equal(d, kInt32)) return static_cast<const int32_t*>(p)[i];
  return static_cast<double>(static_cast<const int64_t*>(p)[i]);
}

double HostTensor::get(size_t i) const { return load(dtype, bytes.data(), i); }

void HostTensor::fill(const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) set(i, v[i]);
}

std::vector<double> HostTensor::values() const { return values_of(t); }

std::vector<double> values_of(const DLTensor& t) {
  std::vector<double> out(static_cast<size_t>(element_count(t)));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load(t.dtype, data_ptr(t), i);
  return out;
}

std::vector<DLDataType> all_dtypes() { return {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}; }

std::string dtype_label(DLDataType d) { return dtype_name(d); }

void append(void* user, const char* data, uint64_t len) {
  static_cast<std::string*>(user)->append(data, static_cast<size_t>(len));
}

}  // namespace strata::test
