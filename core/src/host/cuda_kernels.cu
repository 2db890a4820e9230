// SPDX-License-Identifier: Apache-2.0
// dst += sign * src on a GPU with the host kernels' arithmetic (sdk/src/kernels.cc):
// a variable update gives the same bits on a GPU copy as on a host copy,
// so mirrored replicas on GPUs stay equal to replicas on the host.
#include "host/cuda_kernels.h"

#include "strata/sdk/float16.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace strata::detail::cuda {
namespace {

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
// The host's own conversions (strata/sdk/float16.hpp), not CUDA's
// intrinsics, which return a canonical NaN.
struct Half {
  __device__ static float load(std::uint16_t h) { return sdk::float16::half_to_float(h); }
  __device__ static std::uint16_t store(float f) { return sdk::float16::float_to_half(f); }
};
struct BFloat {
  __device__ static float load(std::uint16_t h) { return sdk::float16::bfloat16_to_float(h); }
  __device__ static std::uint16_t store(float f) { return sdk::float16::float_to_bfloat16(f); }
};
template <class Conv>
struct Add16 {
  using T = std::uint16_t;
  __device__ static T apply(T d, T s, int sign) {
    return Conv::store(__fadd_rn(Conv::load(d), sign > 0 ? Conv::load(s) : -Conv::load(s)));
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
    case ElemType::kF16: return launch<Add16<Half>>(sign, dst, src, count, stream);
    case ElemType::kBF16: return launch<Add16<BFloat>>(sign, dst, src, count, stream);
    case ElemType::kF32: return launch<AddF32>(sign, dst, src, count, stream);
    case ElemType::kF64: return launch<AddF64>(sign, dst, src, count, stream);
    case ElemType::kI32: return launch<AddInt<std::int32_t>>(sign, dst, src, count, stream);
    case ElemType::kI64: return launch<AddInt<std::int64_t>>(sign, dst, src, count, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace strata::detail::cuda
