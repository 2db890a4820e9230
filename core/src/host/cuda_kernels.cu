// SPDX-License-Identifier: Apache-2.0
// dst += sign * src on a GPU with the host kernels' arithmetic (sdk/src/kernels.cc):
// a variable update gives the same bits on a GPU copy as on a host copy,
// so mirrored replicas on GPUs stay equal to replicas on the host.
#include "host/cuda_kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace strata::detail::cuda {
namespace {

// float16/bfloat16 <-> float32 exactly as the host converts (NaN payloads
// kept, round to nearest even, overflow to infinity), not CUDA's
// intrinsics, which return a canonical NaN.
__device__ float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise into a float32 normal
      std::uint32_t e = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return __uint_as_float(bits);
}

__device__ std::uint16_t float_to_half(float f) {
  std::uint32_t x = __float_as_uint(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {
    if (x == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;
  if (x < 0x38800000u) {
    if (x <= 0x33000000u) return sign;
    const std::uint32_t e = x >> 23;
    const std::uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (x - 0x38000000u) >> 13;
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

__device__ float bfloat16_to_float(std::uint16_t h) { return __uint_as_float(static_cast<std::uint32_t>(h) << 16); }

__device__ std::uint16_t float_to_bfloat16(float f) {
  std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

// One element: float types in their own precision (IEEE, round to nearest;
// __fadd_rn/__dadd_rn keep nvcc from contracting), integers wrapping in
// their unsigned type, 16-bit floats through float32.
struct AddF32 {
  using T = float;
  __device__ static T apply(T d, T s, int sign) { return sign > 0 ? __fadd_rn(d, s) : __fsub_rn(d, s); }
};
struct AddF64 {
  using T = double;
  __device__ static T apply(T d, T s, int sign) { return sign > 0 ? __dadd_rn(d, s) : __dsub_rn(d, s); }
};
template <class I>
struct AddInt {
  using T = I;
  __device__ static T apply(T d, T s, int sign) {
    using U = std::make_unsigned_t<I>;
    return static_cast<T>(sign > 0 ? static_cast<U>(d) + static_cast<U>(s) : static_cast<U>(d) - static_cast<U>(s));
  }
};
template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
struct Add16 {
  using T = std::uint16_t;
  __device__ static T apply(T d, T s, int sign) {
    return Store(__fadd_rn(Load(d), sign > 0 ? Load(s) : -Load(s)));
  }
};

template <class Op>
__global__ void add_kernel(typename Op::T* __restrict__ dst, const typename Op::T* __restrict__ src,
                           std::uint64_t count, int sign) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = Op::apply(dst[i], src[i], sign);
}

// dst == src (x += x, x -= x) is allowed: each element reads itself first.
template <class Op>
__global__ void add_self_kernel(typename Op::T* dst, std::uint64_t count, int sign) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = Op::apply(dst[i], dst[i], sign);
}

template <class Op>
int launch(int sign, void* dst, const void* src, std::uint64_t count, void* stream) {
  using T = typename Op::T;
  constexpr unsigned kThreads = 256;
  // Enough blocks to fill any current GPU; the grid-stride loop does the rest.
  const std::uint64_t blocks = std::min<std::uint64_t>((count + kThreads - 1) / kThreads, 8192);
  auto* s = static_cast<cudaStream_t>(stream);
  if (dst == src)
    add_self_kernel<Op><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<T*>(dst), count, sign);
  else
    add_kernel<Op><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<T*>(dst),
                                                                      static_cast<const T*>(src), count, sign);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_add(ElemType type, int sign, void* dst, const void* src, std::uint64_t count, void* stream) {
  if (count == 0) return 0;
  switch (type) {
    case ElemType::kF16: return launch<Add16<half_to_float, float_to_half>>(sign, dst, src, count, stream);
    case ElemType::kBF16: return launch<Add16<bfloat16_to_float, float_to_bfloat16>>(sign, dst, src, count, stream);
    case ElemType::kF32: return launch<AddF32>(sign, dst, src, count, stream);
    case ElemType::kF64: return launch<AddF64>(sign, dst, src, count, stream);
    case ElemType::kI32: return launch<AddInt<std::int32_t>>(sign, dst, src, count, stream);
    case ElemType::kI64: return launch<AddInt<std::int64_t>>(sign, dst, src, count, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace strata::detail::cuda
