// SPDX-License-Identifier: Apache-2.0
// The core's GPU kernels (compiled by nvcc when the build has CUDA): the
// elementwise update behind strata_host_api.device_update. Plain C++ types
// only, so cuda_device.cc (a .cc file) can call it.
#pragma once

#include <cstdint>

namespace strata::detail::cuda {

/// The element types the kernels know (the dtypes of sdk::kernels).
enum class ElemType { kF16, kBF16, kF32, kF64, kI32, kI64 };

/// Enqueue dst = dst + sign * src on `stream` (a cudaStream_t; the current
/// device's), `count` elements of `type`, in the host kernels' arithmetic
/// (float16/bfloat16 through float32 with the same rounding as the host's
/// conversions, integers wrapping). Returns the cudaError_t of the launch
/// as an int (0: enqueued).
int launch_add(ElemType type, int sign, void* dst, const void* src, std::uint64_t count, void* stream);

}  // namespace strata::detail::cuda
