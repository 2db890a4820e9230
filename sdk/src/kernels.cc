// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/kernels.hpp"

#include "strata/sdk/float16.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <vector>

#include "strata/error.hpp"

namespace strata::sdk {

bool dtype_supported(DLDataType d) {
  if (d.lanes != 1) return false;
  switch (d.code) {
    case kDLFloat: return d.bits == 16 || d.bits == 32 || d.bits == 64;
    case kDLBfloat: return d.bits == 16;
    case kDLInt: return d.bits == 32 || d.bits == 64;
    default: return false;
  }
}

std::string dtype_name(DLDataType d) {
  std::string base;
  switch (d.code) {
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLComplex: base = "complex"; break;
    case kDLOpaqueHandle: base = "opaque"; break;
    default: base = "code" + std::to_string(d.code) + "_bits"; break;
  }
  std::string s = base + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

size_t dtype_size(DLDataType d) {
  check_dtype_supported(d, "tensor");
  return d.bits / 8;
}

void check_dtype_supported(DLDataType d, const std::string& what) {
  if (!dtype_supported(d))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " has dtype ", dtype_name(d),
                 ", which is not supported; use one of float32, float64, float16, bfloat16, "
                 "int32, int64");
}

int64_t element_count(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "tensor shape ", shape_string(t),
                   " has a negative dimension; pass a valid DLPack shape");
    n *= t.shape[i];
  }
  return n;
}

size_t byte_size(const DLTensor& t) {
  return static_cast<size_t>(element_count(t)) * dtype_size(t.dtype);
}

bool is_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::string shape_string(const DLTensor& t) {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.shape[i];
  os << ']';
  return os.str();
}

std::string tensor_string(const DLTensor& t) { return dtype_name(t.dtype) + shape_string(t); }

bool same_shape(const DLTensor& a, const DLTensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

void check_contiguous(const DLTensor& t, const std::string& what) {
  if (!is_contiguous(t))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " (", tensor_string(t),
                 ") is not contiguous row-major; pass strides NULL or compact strides "
                 "(make a contiguous copy first)");
}

void check_cpu(const DLTensor& t, const std::string& what) {
  if (t.device.device_type != kDLCPU)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, what, " is on DLPack device type ",
                 static_cast<int>(t.device.device_type),
                 "; this component handles only host (kDLCPU) memory: copy it to the host "
                 "or use a CUDA-enabled component");
}

void check_tensor(const DLTensor& t, const std::string& what) {
  check_cpu(t, what);
  check_dtype_supported(t.dtype, what);
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " has ndim ", t.ndim,
                 " but no shape; fill DLTensor.shape");
  check_contiguous(t, what);
  if (t.data == nullptr && element_count(t) > 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " (", tensor_string(t),
                 ") has NULL data; pass allocated memory");
}

void check_same_shape(const DLTensor& a, const std::string& a_name, const DLTensor& b,
                      const std::string& b_name) {
  if (!same_shape(a, b))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "shape mismatch: ", a_name, " has shape ",
                 shape_string(a), " but ", b_name, " has shape ", shape_string(b),
                 "; pass tensors of the same shape");
}

void check_same_type_and_shape(const DLTensor& a, const std::string& a_name, const DLTensor& b,
                               const std::string& b_name) {
  if (!dtype_equal(a.dtype, b.dtype))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "dtype mismatch: ", a_name, " is ",
                 tensor_string(a), " but ", b_name, " is ", tensor_string(b),
                 "; pass tensors of the same dtype");
  check_same_shape(a, a_name, b, b_name);
}

const char* reduce_op_name(uint32_t op) {
  switch (op) {
    case STRATA_REDUCE_SUM: return "SUM";
    case STRATA_REDUCE_MEAN: return "MEAN";
    case STRATA_REDUCE_MIN: return "MIN";
    case STRATA_REDUCE_MAX: return "MAX";
    case STRATA_REDUCE_PROD: return "PROD";
    default: return "UNKNOWN";
  }
}

strata_reduce_op check_reduce_op(uint32_t op) {
  if (op > STRATA_REDUCE_PROD)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce op ", op,
                 " is not a strata_reduce_op; use SUM(0), MEAN(1), MIN(2), MAX(3) or PROD(4)");
  return static_cast<strata_reduce_op>(op);
}

namespace kernels {
namespace {

// Elements per block: the float32 staging buffers of two blocks fit in L1.
constexpr size_t kBlock = 1024;

// Integer add/mul wrap (two's complement) instead of signed-overflow UB.
template <class T>
struct Wrap {
  using U = std::make_unsigned_t<T>;
  static T add(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
  static T sub(T a, T b) { return static_cast<T>(static_cast<U>(a) - static_cast<U>(b)); }
  static T mul(T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); }
};

template <class T>
T op_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) return Wrap<T>::add(a, b); else return a + b;
}
template <class T>
T op_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) return Wrap<T>::mul(a, b); else return a * b;
}
// NaN propagates through MIN/MAX as in NumPy's minimum/maximum.
template <class T>
bool is_nan(T a) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(a); else return false;
}
template <class T>
T op_min(T a, T b) { return (a < b || is_nan(a)) ? a : b; }
template <class T>
T op_max(T a, T b) { return (a > b || is_nan(a)) ? a : b; }

// acc = (acc op a) op b, acc = acc op a: the vectorisable inner loops.
template <class T, T (*Op)(T, T)>
void fold2(T* __restrict acc, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op(Op(acc[i], a[i]), b[i]);
}
template <class T, T (*Op)(T, T)>
void fold1(T* __restrict acc, const T* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op(acc[i], a[i]);
}
template <class T, T (*Op)(T, T)>
void init2(T* __restrict acc, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op(a[i], b[i]);
}

// Reduce one block of n_inputs arrays (each `n` long) into acc, left to right.
template <class T, T (*Op)(T, T)>
void reduce_block(size_t n_inputs, const T* const* in, size_t off, T* __restrict acc, size_t n) {
  size_t k;
  if (n_inputs >= 2) {
    init2<T, Op>(acc, in[0] + off, in[1] + off, n);
    k = 2;
  } else {
    std::memcpy(acc, in[0] + off, n * sizeof(T));
    k = 1;
  }
  for (; k + 1 < n_inputs; k += 2) fold2<T, Op>(acc, in[k] + off, in[k + 1] + off, n);
  if (k < n_inputs) fold1<T, Op>(acc, in[k] + off, n);
}

template <class T>
void divide_n(T* __restrict x, size_t n, double divisor) {
  if constexpr (std::is_integral_v<T>) {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / d);
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) x[i] = x[i] / d;
  }
}

// Native types: accumulate a block in a stack buffer, then store, so that the
// output may alias any input (every input's block is read before the store).
// Every output gets the block (reduce_broadcast); one output for reduce().
template <class T, T (*Op)(T, T)>
void reduce_native(size_t n_inputs, const void* const* inputs, size_t n_outputs, void* const* outputs,
                   size_t count, bool mean, double divisor) {
  const T* const* in = reinterpret_cast<const T* const*>(inputs);
  alignas(64) T acc[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t n = std::min(kBlock, count - off);
    reduce_block<T, Op>(n_inputs, in, off, acc, n);
    if (mean) divide_n<T>(acc, n, divisor);
    for (size_t o = 0; o < n_outputs; ++o) std::memcpy(static_cast<T*>(outputs[o]) + off, acc, n * sizeof(T));
  }
}

template <float (*Load)(uint16_t)>
void load_block(const uint16_t* __restrict src, float* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Load(src[i]);
}

// 16-bit floats: convert each input block to float32, accumulate in float32,
// round once at the end.
template <float (*Load)(uint16_t), uint16_t (*Store)(float), float (*Op)(float, float)>
void reduce_half(size_t n_inputs, const void* const* inputs, size_t n_outputs, void* const* outputs,
                 size_t count, bool mean, double divisor) {
  const uint16_t* const* in = reinterpret_cast<const uint16_t* const*>(inputs);
  alignas(64) uint16_t res[kBlock];
  alignas(64) float acc[kBlock];
  alignas(64) float a[kBlock];
  alignas(64) float b[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t n = std::min(kBlock, count - off);
    load_block<Load>(in[0] + off, acc, n);
    size_t k = 1;
    for (; k + 1 < n_inputs; k += 2) {
      load_block<Load>(in[k] + off, a, n);
      load_block<Load>(in[k + 1] + off, b, n);
      fold2<float, Op>(acc, a, b, n);
    }
    if (k < n_inputs) {
      load_block<Load>(in[k] + off, a, n);
      fold1<float, Op>(acc, a, n);
    }
    if (mean) divide_n<float>(acc, n, divisor);
    for (size_t i = 0; i < n; ++i) res[i] = Store(acc[i]);
    for (size_t o = 0; o < n_outputs; ++o)
      std::memcpy(static_cast<uint16_t*>(outputs[o]) + off, res, n * sizeof(uint16_t));
  }
}

template <class T>
void reduce_typed(strata_reduce_op op, size_t n, const void* const* in, size_t no, void* const* out,
                  size_t count, double divisor) {
  switch (op) {
    case STRATA_REDUCE_SUM: return reduce_native<T, op_add<T>>(n, in, no, out, count, false, 1);
    case STRATA_REDUCE_MEAN: return reduce_native<T, op_add<T>>(n, in, no, out, count, true, divisor);
    case STRATA_REDUCE_MIN: return reduce_native<T, op_min<T>>(n, in, no, out, count, false, 1);
    case STRATA_REDUCE_MAX: return reduce_native<T, op_max<T>>(n, in, no, out, count, false, 1);
    case STRATA_REDUCE_PROD: return reduce_native<T, op_mul<T>>(n, in, no, out, count, false, 1);
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_16(strata_reduce_op op, size_t n, const void* const* in, size_t no, void* const* out, size_t count,
               double divisor) {
  switch (op) {
    case STRATA_REDUCE_SUM:
      return reduce_half<Load, Store, op_add<float>>(n, in, no, out, count, false, 1);
    case STRATA_REDUCE_MEAN:
      return reduce_half<Load, Store, op_add<float>>(n, in, no, out, count, true, divisor);
    case STRATA_REDUCE_MIN:
      return reduce_half<Load, Store, op_min<float>>(n, in, no, out, count, false, 1);
    case STRATA_REDUCE_MAX:
      return reduce_half<Load, Store, op_max<float>>(n, in, no, out, count, false, 1);
    case STRATA_REDUCE_PROD:
      return reduce_half<Load, Store, op_mul<float>>(n, in, no, out, count, false, 1);
  }
}

// ------------------------------------------------------------ reduce_tree ---

template <class C>
C keep(C x) { return x; }
// 16-bit floats combine in float32 and round to their own type after each op.
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
float round16(float x) { return Load(Store(x)); }

template <class C, C (*Op)(C, C), C (*Round)(C)>
void pair_pass(C* __restrict d, const C* __restrict a, const C* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Round(Op(a[i], b[i]));
}
// Two levels of the tree in one pass: d = op(op(a, b), op(c, e)).
template <class C, C (*Op)(C, C), C (*Round)(C)>
void quad_pass(C* __restrict d, const C* __restrict a, const C* __restrict b, const C* __restrict c,
               const C* __restrict e, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Round(Op(Round(Op(a[i], b[i])), Round(Op(c[i], e[i]))));
}

// S: the stored type, C: the type ops compute in (S itself, or float for the
// 16-bit floats, whose inputs are converted block by block first). Node
// values of a block live in scratch: the leaves in one half, each next level
// in the other, so no pass writes what it reads.
template <class S, class C, C (*Load)(S), S (*Store)(C), C (*Op)(C, C), C (*Round)(C)>
void tree_typed(size_t n_leaves, const void* const* pairs, void* output, size_t count, bool mean,
                double divisor) {
  constexpr bool kNative = std::is_same_v<S, C>;
  constexpr size_t kScratchBytes = 32 << 10;
  // Slots: n_leaves for the leaves, n_leaves / 2 for the next level, one
  // for the result.
  const size_t slots = n_leaves + n_leaves / 2 + 1;
  const size_t block = std::max<size_t>(16, kScratchBytes / (slots * sizeof(C)) / 16 * 16);
  alignas(64) unsigned char stack[kScratchBytes];
  std::vector<C> heap;
  C* scratch = reinterpret_cast<C*>(stack);
  if (slots * block * sizeof(C) > sizeof(stack)) {
    heap.resize(slots * block);
    scratch = heap.data();
  }
  C* const leaf_area = scratch;
  C* const next_area = scratch + n_leaves * block;
  C* const result = next_area + n_leaves / 2 * block;
  // Each node's block so far (no allocation up to 64 leaves: this runs once
  // per small all-reduce).
  const C* node_stack[64];
  std::vector<const C*> node_heap(n_leaves > 64 ? n_leaves : 0);
  const C** const node = n_leaves > 64 ? node_heap.data() : node_stack;
  auto at = [&](size_t k, size_t off) { return static_cast<const S*>(pairs[k]) + off; };
  for (size_t off = 0; off < count; off += block) {
    const size_t n = std::min(block, count - off);
    for (size_t g = 0; g < n_leaves; ++g) {
      C* slot = leaf_area + g * block;
      if constexpr (kNative) {
        if (pairs[2 * g + 1] == nullptr) {
          node[g] = at(2 * g, off);
        } else {
          pair_pass<C, Op, Round>(slot, at(2 * g, off), at(2 * g + 1, off), n);
          node[g] = slot;
        }
      } else {
        const S* a = at(2 * g, off);
        if (pairs[2 * g + 1] == nullptr) {
          for (size_t i = 0; i < n; ++i) slot[i] = Load(a[i]);
        } else {
          const S* b = at(2 * g + 1, off);
          for (size_t i = 0; i < n; ++i) slot[i] = Round(Op(Load(a[i]), Load(b[i])));
        }
        node[g] = slot;
      }
    }
    size_t m = n_leaves;
    bool into_next = true;
    while (m > 1) {
      C* area = into_next ? next_area : leaf_area;
      const size_t step = m >= 4 ? 4 : 2;
      for (size_t q = 0; q < m / step; ++q) {
        C* d = m == step ? result : area + q * block;
        const C* const* v = node + q * step;
        if (step == 4)
          quad_pass<C, Op, Round>(d, v[0], v[1], v[2], v[3], n);
        else
          pair_pass<C, Op, Round>(d, v[0], v[1], n);
        node[q] = d;
      }
      m /= step;
      into_next = !into_next;
    }
    const C* res = node[0];
    S* out = static_cast<S*>(output) + off;
    if (mean) {
      if (res != result) std::memcpy(result, res, n * sizeof(C));
      divide_n<C>(result, n, divisor);
      res = result;
    }
    if constexpr (kNative) {
      std::memmove(out, res, n * sizeof(S));
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = Store(res[i]);
    }
  }
}

template <class T, T (*Op)(T, T)>
void tree_native(size_t n_leaves, const void* const* pairs, void* output, size_t count, bool mean, double divisor) {
  tree_typed<T, T, keep<T>, keep<T>, Op, keep<T>>(n_leaves, pairs, output, count, mean, divisor);
}

template <class T>
void tree_dispatch(strata_reduce_op op, size_t n_leaves, const void* const* pairs, void* output, size_t count,
                   double divisor) {
  switch (op) {
    case STRATA_REDUCE_SUM: return tree_native<T, op_add<T>>(n_leaves, pairs, output, count, false, 1);
    case STRATA_REDUCE_MEAN: return tree_native<T, op_add<T>>(n_leaves, pairs, output, count, true, divisor);
    case STRATA_REDUCE_MIN: return tree_native<T, op_min<T>>(n_leaves, pairs, output, count, false, 1);
    case STRATA_REDUCE_MAX: return tree_native<T, op_max<T>>(n_leaves, pairs, output, count, false, 1);
    case STRATA_REDUCE_PROD: return tree_native<T, op_mul<T>>(n_leaves, pairs, output, count, false, 1);
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float), float (*Op)(float, float)>
void tree_half(size_t n_leaves, const void* const* pairs, void* output, size_t count, bool mean, double divisor) {
  tree_typed<uint16_t, float, Load, Store, Op, round16<Load, Store>>(n_leaves, pairs, output, count, mean, divisor);
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void tree_dispatch_16(strata_reduce_op op, size_t n_leaves, const void* const* pairs, void* output, size_t count,
                      double divisor) {
  switch (op) {
    case STRATA_REDUCE_SUM: return tree_half<Load, Store, op_add<float>>(n_leaves, pairs, output, count, false, 1);
    case STRATA_REDUCE_MEAN:
      return tree_half<Load, Store, op_add<float>>(n_leaves, pairs, output, count, true, divisor);
    case STRATA_REDUCE_MIN: return tree_half<Load, Store, op_min<float>>(n_leaves, pairs, output, count, false, 1);
    case STRATA_REDUCE_MAX: return tree_half<Load, Store, op_max<float>>(n_leaves, pairs, output, count, false, 1);
    case STRATA_REDUCE_PROD: return tree_half<Load, Store, op_mul<float>>(n_leaves, pairs, output, count, false, 1);
  }
}

template <class T>
void update_typed(strata_var_update_op op, void* dst, const void* src, size_t count) {
  T* __restrict d = static_cast<T*>(dst);
  const T* __restrict s = static_cast<const T*>(src);
  if (op == STRATA_VAR_ASSIGN_ADD) {
    for (size_t i = 0; i < count; ++i) d[i] = op_add<T>(d[i], s[i]);
  } else {
    for (size_t i = 0; i < count; ++i) {
      if constexpr (std::is_integral_v<T>) d[i] = Wrap<T>::sub(d[i], s[i]); else d[i] = d[i] - s[i];
    }
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void update_16(strata_var_update_op op, void* dst, const void* src, size_t count) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  const float sign = op == STRATA_VAR_ASSIGN_ADD ? 1.0f : -1.0f;
  for (size_t i = 0; i < count; ++i) d[i] = Store(Load(d[i]) + sign * Load(s[i]));
}

}  // namespace

float half_to_float(uint16_t h) { return float16::half_to_float(h); }
uint16_t float_to_half(float f) { return float16::float_to_half(f); }
float bfloat16_to_float(uint16_t h) { return float16::bfloat16_to_float(h); }
uint16_t float_to_bfloat16(float f) { return float16::float_to_bfloat16(f); }

void reduce(strata_reduce_op op, DLDataType dtype, size_t n_inputs, const void* const* inputs,
            void* output, size_t count, double divisor) {
  void* const outputs[1] = {output};
  reduce_broadcast(op, dtype, n_inputs, inputs, 1, outputs, count, divisor);
}

void reduce_broadcast(strata_reduce_op op, DLDataType dtype, size_t n_inputs, const void* const* inputs,
                      size_t n_outputs, void* const* outputs, size_t count, double divisor) {
  check_reduce_op(op);
  check_dtype_supported(dtype, "reduction input");
  if (n_inputs == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce needs at least one input; got 0");
  if (op == STRATA_REDUCE_MEAN && !(divisor > 0))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "MEAN divisor must be > 0; got ", divisor);
  if (count == 0) return;
  switch (dtype.code) {
    case kDLFloat:
      if (dtype.bits == 32) return reduce_typed<float>(op, n_inputs, inputs, n_outputs, outputs, count, divisor);
      if (dtype.bits == 64) return reduce_typed<double>(op, n_inputs, inputs, n_outputs, outputs, count, divisor);
      return reduce_16<half_to_float, float_to_half>(op, n_inputs, inputs, n_outputs, outputs, count, divisor);
    case kDLBfloat:
      return reduce_16<bfloat16_to_float, float_to_bfloat16>(op, n_inputs, inputs, n_outputs, outputs, count,
                                                              divisor);
    case kDLInt:
      if (dtype.bits == 32) return reduce_typed<int32_t>(op, n_inputs, inputs, n_outputs, outputs, count, divisor);
      return reduce_typed<int64_t>(op, n_inputs, inputs, n_outputs, outputs, count, divisor);
    default: break;
  }
}

void reduce_tree(strata_reduce_op op, DLDataType dtype, size_t n_leaves, const void* const* pairs,
                 void* output, size_t count, double divisor) {
  check_reduce_op(op);
  check_dtype_supported(dtype, "reduction input");
  if (n_leaves == 0 || (n_leaves & (n_leaves - 1)) != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_tree needs a power of two of leaves; got ", n_leaves);
  for (size_t g = 0; g < n_leaves; ++g)
    if (pairs[2 * g] == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_tree: leaf ", g, " has no first value (pairs[", 2 * g,
                   "] is null)");
  if (op == STRATA_REDUCE_MEAN && !(divisor > 0))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "MEAN divisor must be > 0; got ", divisor);
  if (count == 0) return;
  switch (dtype.code) {
    case kDLFloat:
      if (dtype.bits == 32) return tree_dispatch<float>(op, n_leaves, pairs, output, count, divisor);
      if (dtype.bits == 64) return tree_dispatch<double>(op, n_leaves, pairs, output, count, divisor);
      return tree_dispatch_16<half_to_float, float_to_half>(op, n_leaves, pairs, output, count, divisor);
    case kDLBfloat:
      return tree_dispatch_16<bfloat16_to_float, float_to_bfloat16>(op, n_leaves, pairs, output, count, divisor);
    case kDLInt:
      if (dtype.bits == 32) return tree_dispatch<int32_t>(op, n_leaves, pairs, output, count, divisor);
      return tree_dispatch<int64_t>(op, n_leaves, pairs, output, count, divisor);
    default: break;
  }
}

void apply_update(strata_var_update_op op, DLDataType dtype, void* dst, const void* src,
                  size_t count) {
  const size_t esize = dtype_size(dtype);
  if (op == STRATA_VAR_ASSIGN) {
    if (dst != src && count) std::memmove(dst, src, count * esize);
    return;
  }
  if (op != STRATA_VAR_ASSIGN_ADD && op != STRATA_VAR_ASSIGN_SUB)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable update op ", static_cast<int>(op),
                 " is not ASSIGN(0), ASSIGN_ADD(1) or ASSIGN_SUB(2)");
  switch (dtype.code) {
    case kDLFloat:
      if (dtype.bits == 32) return update_typed<float>(op, dst, src, count);
      if (dtype.bits == 64) return update_typed<double>(op, dst, src, count);
      return update_16<half_to_float, float_to_half>(op, dst, src, count);
    case kDLBfloat: return update_16<bfloat16_to_float, float_to_bfloat16>(op, dst, src, count);
    case kDLInt:
      if (dtype.bits == 32) return update_typed<int32_t>(op, dst, src, count);
      return update_typed<int64_t>(op, dst, src, count);
    default: break;
  }
}

void divide(DLDataType dtype, void* data, size_t count, double divisor) {
  check_dtype_supported(dtype, "tensor to divide");
  if (!(divisor > 0))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "divisor must be > 0; got ", divisor);
  const void* in[1] = {data};
  reduce(STRATA_REDUCE_MEAN, dtype, 1, in, data, count, divisor);
}

}  // namespace kernels
}  // namespace strata::sdk
