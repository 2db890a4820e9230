// SPDX-License-Identifier: Apache-2.0
// Tensor checks and reduction kernels shared by every CPU plugin.
//
// Supported element types (v1, kDLCPU only): float32, float64, float16,
// bfloat16, int32, int64. Everything else is rejected with INVALID_ARGUMENT
// naming the dtype. All functions are thread-safe (no shared state); the
// checks throw strata::Error, the kernels never allocate on the heap.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/c/common.h"
#include "strata/c/strategy.h"

namespace strata::sdk {

/// DLPack dtype constants.
inline constexpr DLDataType kFloat32{kDLFloat, 32, 1};
inline constexpr DLDataType kFloat64{kDLFloat, 64, 1};
inline constexpr DLDataType kFloat16{kDLFloat, 16, 1};
inline constexpr DLDataType kBFloat16{kDLBfloat, 16, 1};
inline constexpr DLDataType kInt32{kDLInt, 32, 1};
inline constexpr DLDataType kInt64{kDLInt, 64, 1};

inline bool dtype_equal(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
/// True for the six dtypes the kernels handle.
bool dtype_supported(DLDataType dtype);
/// "float32", "bfloat16", ... also for unsupported ones ("uint8", "float32x4", "code7_bits12").
std::string dtype_name(DLDataType dtype);
/// Bytes per element; throws INVALID_ARGUMENT for an unsupported dtype.
size_t dtype_size(DLDataType dtype);
/// Throws INVALID_ARGUMENT "<what> has dtype X; supported: ..." when unsupported.
void check_dtype_supported(DLDataType dtype, const std::string& what);

/// Product of the shape (1 for a scalar). Throws INVALID_ARGUMENT for a negative dim.
int64_t element_count(const DLTensor& t);
/// element_count * dtype_size.
size_t byte_size(const DLTensor& t);
/// Start of the elements (data + byte_offset).
inline void* data_ptr(const DLTensor& t) {
  return static_cast<char*>(t.data) + t.byte_offset;
}
/// strides NULL or compact row-major (size-1 dims may have any stride).
bool is_contiguous(const DLTensor& t);
/// "[2, 3]" for messages.
std::string shape_string(const DLTensor& t);
/// "float32[2, 3]" for messages.
std::string tensor_string(const DLTensor& t);
bool same_shape(const DLTensor& a, const DLTensor& b);

/// Throws INVALID_ARGUMENT naming `what` when `t` is not contiguous.
void check_contiguous(const DLTensor& t, const std::string& what);
/// Throws UNIMPLEMENTED when `t` is not on kDLCPU.
void check_cpu(const DLTensor& t, const std::string& what);
/// cpu + supported dtype + contiguous + non-NULL data for non-empty tensors.
void check_tensor(const DLTensor& t, const std::string& what);
/// Throws INVALID_ARGUMENT naming both tensors and both shapes when they differ.
void check_same_shape(const DLTensor& a, const std::string& a_name, const DLTensor& b,
                      const std::string& b_name);
/// Same dtype and shape, with a message naming both.
void check_same_type_and_shape(const DLTensor& a, const std::string& a_name, const DLTensor& b,
                               const std::string& b_name);

/// Name of a reduce op ("SUM"...); "op<N>" for an unknown value.
const char* reduce_op_name(uint32_t op);
/// Throws INVALID_ARGUMENT for a value that is not a strata_reduce_op.
strata_reduce_op check_reduce_op(uint32_t op);

namespace kernels {

/// IEEE binary16 <-> binary32 (round to nearest even; subnormals, inf and NaN kept).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
/// bfloat16 <-> binary32 (round to nearest even; NaN stays NaN).
float bfloat16_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);

/**
 * output[i] = op(inputs[0][i], inputs[1][i], ..., inputs[n-1][i]) for i < count.
 * Order is fixed left to right, so results are bitwise deterministic. MEAN sums
 * and then divides by `divisor` (integers: truncating division). float16 and
 * bfloat16 accumulate in float32. Integer SUM/PROD wrap around on overflow.
 * `output` may alias any input (elementwise, same offset). Throws
 * INVALID_ARGUMENT for n_inputs == 0, an unsupported dtype or op, or a MEAN
 * divisor <= 0.
 */
void reduce(strata_reduce_op op, DLDataType dtype, size_t n_inputs, const void* const* inputs,
            void* output, size_t count, double divisor = 1.0);

/**
 * reduce() into every outputs[0..n_outputs) at once: each block of the
 * result is computed once in a small (L1-resident) buffer and stored into
 * every output, so an all-reduce reads each input once and writes each
 * output once, with no intermediate array. Outputs get reduce()'s bits.
 * Any output may alias any input (elementwise, same offset); outputs that
 * alias each other get the same bits.
 */
void reduce_broadcast(strata_reduce_op op, DLDataType dtype, size_t n_inputs, const void* const* inputs,
                      size_t n_outputs, void* const* outputs, size_t count, double divisor = 1.0);

/**
 * The balanced pairwise tree of recursive doubling, in one pass over memory.
 * There are n_leaves leaves (a power of two); leaf g is pairs[2g][i], or
 * op(pairs[2g][i], pairs[2g + 1][i]) when pairs[2g + 1] is not null; then
 * neighbouring values combine level by level, lower index first:
 * op(op(leaf0, leaf1), op(leaf2, leaf3)) for four leaves. Every two-input
 * op rounds to `dtype`, as each message of recursive doubling does, so
 * float16 and bfloat16 results equal that chain of two-input reduce() calls
 * (and not reduce()'s single float32 accumulation). Two levels go through
 * the data per pass, in L1-sized blocks. MEAN combines as SUM and divides
 * the result by `divisor`. `output` may alias any input (elementwise, same
 * offset). Throws INVALID_ARGUMENT as reduce() does, and for n_leaves that
 * is not a power of two or a null pairs[2g].
 */
void reduce_tree(strata_reduce_op op, DLDataType dtype, size_t n_leaves, const void* const* pairs,
                 void* output, size_t count, double divisor = 1.0);

/// dst = src (ASSIGN), dst += src (ASSIGN_ADD) or dst -= src (ASSIGN_SUB), elementwise.
void apply_update(strata_var_update_op op, DLDataType dtype, void* dst, const void* src,
                  size_t count);

/// data[i] /= divisor (integers: truncating division).
void divide(DLDataType dtype, void* data, size_t count, double divisor);

}  // namespace kernels
}  // namespace strata::sdk
