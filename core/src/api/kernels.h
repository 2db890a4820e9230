// SPDX-License-Identifier: Apache-2.0
// The few element loops the API needs (copies, sums along an axis, the
// update arithmetic of variables). Strata is not a DL library: these exist
// for reductions with an axis, the Default strategy and loss helpers, on
// compact host tensors of the dtypes in tensor.hpp. Every function throws
// InvalidArgumentError on a dtype/shape mismatch or a non-host,
// non-compact tensor. Stateless; thread-safe.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/tensor.hpp"

namespace strata::detail {

std::int64_t numel(const DLTensor& t);
bool is_contiguous(const DLTensor& t);
/// Throws unless `t` is a compact host tensor of a supported dtype;
/// `what` names it in the message.
void check_host_compact(const DLTensor& t, const char* what);
/// Throws unless `a` and `b` have the same dtype and shape.
void check_same_layout(const DLTensor& a, const DLTensor& b, const char* what);
std::string shape_string(const DLTensor& t);
/// "[2, 3]".
std::string shape_string(const std::vector<std::int64_t>& shape);

/// Element `i` of a compact host tensor as double, and the reverse
/// (float16/bfloat16 round to nearest even, integers truncate).
double load_double(const DLTensor& t, std::int64_t i);
void store_double(DLTensor& t, std::int64_t i, double v);

/// A host tensor whose bytes are NOT cleared, for a caller that writes every
/// byte next (a copy, a receive): saves Tensor::zeros' pass over memory.
Tensor uninitialized_tensor(const std::vector<std::int64_t>& shape, DType dtype);
// A tensor on `device` (kDLCUDA: device memory, uninitialised; otherwise as
// uninitialized_tensor). Throws the no-GPU / bad-ordinal errors.
Tensor device_tensor(const std::vector<std::int64_t>& shape, DType dtype, DLDevice device);

/// dst = src (same dtype and shape, both compact; may alias).
void copy_into(DLTensor& dst, const DLTensor& src);
/// dst += sign * src elementwise (integers in int64 arithmetic).
void add_into(DLTensor& dst, const DLTensor& src, int sign);
/// dst /= divisor elementwise (integers truncate toward zero, like
/// integer tf.reduce_mean).
void divide_by(DLTensor& dst, double divisor);
/// Sum of `t` along `axis` (already normalised to [0, ndim)); the result
/// drops that axis and keeps t's dtype.
Tensor sum_along_axis(const DLTensor& t, int axis);
/// Sum of every element, accumulated in double.
double sum_all(const DLTensor& t);

}  // namespace strata::detail
