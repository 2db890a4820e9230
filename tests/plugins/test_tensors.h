// SPDX-License-Identifier: Apache-2.0
// Host tensors of any supported dtype filled from and read back as doubles.
#pragma once

#include <dlpack/dlpack.h>

#include <string>
#include <vector>

#include "strata/c/strata.h"

namespace strata::test {

struct HostTensor {
  DLDataType dtype{};
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  DLTensor t{};

  HostTensor(DLDataType d, std::vector<int64_t> s);
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  size_t count() const;
  void set(size_t i, double v);
  double get(size_t i) const;
  void fill(const std::vector<double>& v);
  std::vector<double> values() const;
};

double load(DLDataType d, const void* p, size_t i);
std::vector<double> values_of(const DLTensor& t);
std::vector<DLDataType> all_dtypes();
std::string dtype_label(DLDataType d);

/// Collects a strata_write_fn's output.
void append(void* user, const char* data, uint64_t len);

}  // namespace strata::test
