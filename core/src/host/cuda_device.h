// SPDX-License-Identifier: Apache-2.0
// CUDA device services of the core (ABI 1.4): the one place that calls the
// CUDA runtime. The host services table (host_services.cc) and the C++ API
// (Tensor::to) both go through here, so plugins and user code never need a
// CUDA link of their own. Built without CUDA (STRATA_WITH_CUDA_RUNTIME
// undefined) every entry fails with UNIMPLEMENTED "needs a build with CUDA".
//
// Thread-safety: every function may be called from any thread. Functions
// that take a DLDevice make it current for the call and restore the
// caller's current device afterwards, except set_device.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <dlpack/dlpack.h>

#include "strata/c/common.h"

namespace strata::detail::cuda {

/// True when the core was built with the CUDA runtime.
bool built_with_cuda();

/// Visible CUDA devices; 0 plus FAILED_PRECONDITION (message: why, what to
/// check) when there are none; UNIMPLEMENTED without CUDA.
strata_status_t device_count(int32_t* count, std::string* why);

/// The message for "no GPU": starts with "no CUDA device visible".
std::string no_device_message();

/// Validate `dev` (kDLCUDA ordinal below the visible count); returns a
/// status and fills `why`.
strata_status_t check_device(DLDevice dev, std::string* why);

strata_status_t set_device(DLDevice dev, std::string* why);
strata_status_t stream_create(DLDevice dev, void** stream, std::string* why);
void stream_destroy(void* stream);
/// Poll `stream` until idle, `timeout_ms` passes or `aborted()` says stop.
strata_status_t stream_synchronize(void* stream, int64_t timeout_ms, const std::function<bool()>& aborted,
                                   std::string* why);
strata_status_t memcpy_async(void* dst, DLDevice dst_dev, const void* src, DLDevice src_dev, uint64_t bytes,
                             void* stream, std::string* why);

/// dst = src, dst += src or dst -= src (strata_var_update_op `op`) on
/// `count` elements of `dtype` in `dev`'s memory, ordered on `stream` (NULL:
/// synchronous, waiting at most `timeout_ms` or until `aborted()`). Checks
/// the dtype, the op, that both buffers are `dev`'s memory and that they do
/// not partly overlap, before anything runs.
strata_status_t update(uint32_t op, DLDataType dtype, void* dst, const void* src, uint64_t count, DLDevice dev,
                       void* stream, int64_t timeout_ms, const std::function<bool()>& aborted, std::string* why);

/// kDLCUDA (stream-ordered pool, usable on return) or kDLCUDAHost (pinned).
/// NULL on failure with `why` filled (when non-NULL).
void* allocate(DLDevice dev, uint64_t bytes, std::string* why);
void free_memory(DLDevice dev, void* ptr);

}  // namespace strata::detail::cuda
