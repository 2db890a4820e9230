// SPDX-License-Identifier: Apache-2.0
#include "host/cuda_device.h"

#include "strata/c/strategy.h"
#include "strata/sdk/kernels.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(STRATA_WITH_CUDA_RUNTIME)
#include <cuda_runtime_api.h>

#include "host/cuda_kernels.h"
#endif

namespace strata::detail::cuda {

namespace {
// device_update's checks that need no GPU, the same in every build.
strata_status_t check_update(uint32_t op, DLDataType d, DLDevice dev, std::string* why) {
  if (!sdk::dtype_supported(d)) {
    if (why)
      *why = "device_update: dtype " + sdk::dtype_name(d) +
             " is not supported; use float16, bfloat16, float32, float64, int32 or int64";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  if (op != STRATA_VAR_ASSIGN && op != STRATA_VAR_ASSIGN_ADD && op != STRATA_VAR_ASSIGN_SUB) {
    if (why) *why = "device_update: op " + std::to_string(op) + " is not ASSIGN(0), ASSIGN_ADD(1) or ASSIGN_SUB(2)";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  if (dev.device_type != kDLCUDA) {
    if (why) *why = "device_update: the device must be a GPU (kDLCUDA); update host memory on the host";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  return STRATA_OK;
}
}  // namespace

#if !defined(STRATA_WITH_CUDA_RUNTIME)

namespace {
strata_status_t unimplemented(std::string* why, const char* what) {
  if (why)
    *why = std::string(what) +
           ": using a GPU needs a build with CUDA (configure with -DSTRATA_WITH_CUDA=ON); this build "
           "has host devices \"cpu:<n>\" only";
  return STRATA_ERR_UNIMPLEMENTED;
}
}  // namespace

bool built_with_cuda() { return false; }
std::string no_device_message() {
  std::string why;
  unimplemented(&why, "no CUDA device visible");
  return why;
}
strata_status_t device_count(int32_t* count, std::string* why) {
  if (count) *count = 0;
  return unimplemented(why, "device_count");
}
strata_status_t check_device(DLDevice, std::string* why) { return unimplemented(why, "CUDA device"); }
strata_status_t set_device(DLDevice dev, std::string* why) {
  return dev.device_type == kDLCPU ? STRATA_OK : unimplemented(why, "set_device");
}
strata_status_t stream_create(DLDevice, void** stream, std::string* why) {
  if (stream) *stream = nullptr;
  return unimplemented(why, "stream_create");
}
void stream_destroy(void*) {}
strata_status_t stream_synchronize(void*, int64_t, const std::function<bool()>&, std::string* why) {
  return unimplemented(why, "stream_synchronize");
}
strata_status_t memcpy_async(void*, DLDevice, const void*, DLDevice, uint64_t, void*, std::string* why) {
  return unimplemented(why, "memcpy_async");
}
strata_status_t update(uint32_t op, DLDataType dtype, void*, const void*, uint64_t, DLDevice dev, void*, int64_t,
                       const std::function<bool()>&, std::string* why) {
  const strata_status_t st = check_update(op, dtype, dev, why);
  return st != STRATA_OK ? st : unimplemented(why, "device_update");
}
void* allocate(DLDevice, uint64_t, std::string* why) {
  unimplemented(why, "allocate");
  return nullptr;
}
void free_memory(DLDevice, void*) {}

#else  // STRATA_WITH_CUDA_RUNTIME

namespace {

std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// What cudaGetDeviceCount said the first time (the answer does not change
// within a process: CUDA reads CUDA_VISIBLE_DEVICES once).
struct CountResult {
  cudaError_t error = cudaSuccess;
  int count = 0;
};
const CountResult& count_result() {
  static const CountResult r = [] {
    CountResult c;
    c.error = cudaGetDeviceCount(&c.count);
    if (c.error != cudaSuccess) {
      c.count = 0;
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
    }
    return c;
  }();
  return r;
}

std::string visible_devices_hint() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string("CUDA_VISIBLE_DEVICES is '") + v + "'" : std::string("CUDA_VISIBLE_DEVICES is unset");
}

// Restores the caller's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != dev) {
      ok_ = cudaSetDevice(dev);
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_ && prev_ >= 0) cudaSetDevice(prev_);
  }
  cudaError_t status() const { return ok_; }

 private:
  int prev_ = -1;
  bool changed_ = false;
  cudaError_t ok_ = cudaSuccess;
};

// Per device: the stream on which allocate/free are ordered and whether the
// device supports stream-ordered pools (else plain cudaMalloc/cudaFree).
struct DevicePool {
  std::once_flag once;
  cudaError_t init_error = cudaSuccess;
  cudaStream_t stream = nullptr;
  bool pools = false;
};
DevicePool& pool(int dev) {
  // Never destroyed: memory may be freed during static destruction.
  static std::vector<DevicePool>* pools = new std::vector<DevicePool>(
      static_cast<std::size_t>(std::max(count_result().count, 0)));
  return (*pools)[static_cast<std::size_t>(dev)];
}

bool init_pool(int dev, std::string* why) {
  DevicePool& p = pool(dev);
  std::call_once(p.once, [&] {
    DeviceGuard g(dev);
    if ((p.init_error = g.status()) != cudaSuccess) return;
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) supported = 0;
    p.pools = supported != 0;
    p.init_error = cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking);
  });
  if (p.init_error != cudaSuccess) {
    if (why) *why = "cannot set up memory for gpu:" + std::to_string(dev) + ": " + error_text(p.init_error);
    return false;
  }
  return true;
}

strata_status_t fail(std::string* why, const std::string& what, cudaError_t e) {
  cudaGetLastError();  // a non-sticky error must not leak into the next call
  if (why) *why = what + " failed: " + error_text(e);
  return e == cudaErrorInvalidValue || e == cudaErrorInvalidDevice ? STRATA_ERR_INVALID_ARGUMENT
                                                                   : STRATA_ERR_INTERNAL;
}

}  // namespace

bool built_with_cuda() { return true; }

std::string no_device_message() {
  const CountResult& r = count_result();
  std::string cause = r.error != cudaSuccess
                          ? "cudaGetDeviceCount failed with " + error_text(r.error)
                          : std::string("cudaGetDeviceCount reported 0 devices");
  return "no CUDA device visible: " + cause +
         ". Check that `nvidia-smi` lists a GPU, that the NVIDIA driver is installed and loaded (libcuda.so.1), "
         "and that CUDA_VISIBLE_DEVICES names a GPU (" +
         visible_devices_hint() + "); or use host devices \"cpu:<n>\"";
}

strata_status_t device_count(int32_t* count, std::string* why) {
  const CountResult& r = count_result();
  if (count) *count = r.count;
  if (r.count > 0) return STRATA_OK;
  if (why) *why = no_device_message();
  return STRATA_ERR_FAILED_PRECONDITION;
}

strata_status_t check_device(DLDevice dev, std::string* why) {
  if (dev.device_type != kDLCUDA) {
    if (why) *why = "device type " + std::to_string(int(dev.device_type)) + " is not a CUDA device (kDLCUDA)";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  int32_t n = 0;
  strata_status_t st = device_count(&n, why);
  if (st != STRATA_OK) return st;
  if (dev.device_id < 0 || dev.device_id >= n) {
    if (why)
      *why = "gpu:" + std::to_string(dev.device_id) + " does not exist: " + std::to_string(n) +
             " CUDA device(s) are visible (gpu:0 .. gpu:" + std::to_string(n - 1) + "; " + visible_devices_hint() +
             ")";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  return STRATA_OK;
}

strata_status_t set_device(DLDevice dev, std::string* why) {
  if (dev.device_type == kDLCPU) return STRATA_OK;
  strata_status_t st = check_device(dev, why);
  if (st != STRATA_OK) return st;
  const cudaError_t e = cudaSetDevice(dev.device_id);
  return e == cudaSuccess ? STRATA_OK : fail(why, "cudaSetDevice(" + std::to_string(dev.device_id) + ")", e);
}

strata_status_t stream_create(DLDevice dev, void** stream, std::string* why) {
  if (stream == nullptr) {
    if (why) *why = "stream_create: stream is NULL";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  *stream = nullptr;
  strata_status_t st = check_device(dev, why);
  if (st != STRATA_OK) return st;
  DeviceGuard g(dev.device_id);
  if (g.status() != cudaSuccess) return fail(why, "cudaSetDevice", g.status());
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return fail(why, "cudaStreamCreateWithFlags on gpu:" + std::to_string(dev.device_id), e);
  *stream = s;
  return STRATA_OK;
}

void stream_destroy(void* stream) {
  if (stream == nullptr) return;
  // No wait: CUDA releases the stream once its pending work is done, so a
  // stuck kernel cannot hang the caller here.
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  cudaGetLastError();
}

strata_status_t stream_synchronize(void* stream, int64_t timeout_ms, const std::function<bool()>& aborted,
                                   std::string* why) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Spin briefly (a short copy finishes in microseconds), then sleep between
  // polls so that a long kernel does not burn a core.
  for (int i = 0;; ++i) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return STRATA_OK;
    if (e != cudaErrorNotReady) return fail(why, "work on the CUDA stream", e);
    if (aborted && aborted()) {
      if (why) *why = "stream_synchronize aborted: the job was asked to stop";
      return STRATA_ERR_ABORTED;
    }
    if (Clock::now() >= deadline) {
      if (why)
        *why = "stream_synchronize timed out after " + std::to_string(timeout_ms) +
               " ms with work still pending on the stream (a kernel that never ends, or a peer that never "
               "arrives); raise /timeouts/collective_s if the work is just slow";
      return STRATA_ERR_DEADLINE_EXCEEDED;
    }
    if (i < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

strata_status_t memcpy_async(void* dst, DLDevice dst_dev, const void* src, DLDevice src_dev, uint64_t bytes,
                             void* stream, std::string* why) {
  if (bytes == 0) return STRATA_OK;
  if (dst == nullptr || src == nullptr) {
    if (why) *why = "memcpy_async: dst or src is NULL";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  auto ok_type = [](DLDevice d) {
    return d.device_type == kDLCPU || d.device_type == kDLCUDAHost || d.device_type == kDLCUDA;
  };
  if (!ok_type(dst_dev) || !ok_type(src_dev)) {
    if (why) *why = "memcpy_async: only kDLCPU, kDLCUDAHost and kDLCUDA memory can be copied";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  for (DLDevice d : {dst_dev, src_dev})
    if (d.device_type == kDLCUDA) {
      strata_status_t st = check_device(d, why);
      if (st != STRATA_OK) return st;
    }
  // The device whose context issues the copy: the stream's, else a GPU side.
  const int dev = src_dev.device_type == kDLCUDA ? src_dev.device_id
                  : dst_dev.device_type == kDLCUDA ? dst_dev.device_id
                                                   : -1;
  cudaError_t e;
  if (dev < 0 && stream == nullptr) {
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));  // host to host
    return STRATA_OK;
  }
  if (dev >= 0 && stream == nullptr) {  // synchronous (see host.h)
    DeviceGuard g(dev);
    e = cudaMemcpy(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault);
    // From pageable host memory cudaMemcpy may return once the bytes are
    // staged, before they land; work on a replica's (non-blocking) stream
    // is not ordered after it, so wait for the legacy stream that runs it.
    if (e == cudaSuccess && src_dev.device_type != kDLCUDA) e = cudaStreamSynchronize(cudaStreamLegacy);
  } else {
    e = cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault,
                        static_cast<cudaStream_t>(stream));
  }
  if (e != cudaSuccess) return fail(why, "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes", e);
  return STRATA_OK;
}

namespace {
// The kernels' element type of a dtype check_update accepted.
ElemType elem_type(DLDataType d) {
  if (d.code == kDLBfloat) return ElemType::kBF16;
  if (d.code == kDLInt) return d.bits == 32 ? ElemType::kI32 : ElemType::kI64;
  return d.bits == 16 ? ElemType::kF16 : d.bits == 32 ? ElemType::kF32 : ElemType::kF64;
}

// Whether [p, p + bytes) is memory that `dev`'s kernels may use: its own
// device memory, or managed memory. A kernel that touched anything else
// would fail with an illegal address, which ruins the whole CUDA context.
strata_status_t check_device_memory(const void* p, uint64_t bytes, int dev, const char* role, std::string* why) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(why, std::string("device_update: cannot tell what memory the ") + role + " buffer is", e);
  }
  if (a.type == cudaMemoryTypeManaged) return STRATA_OK;
  if (a.type != cudaMemoryTypeDevice || a.device != dev) {
    if (why)
      *why = std::string("device_update: the ") + role + " buffer (" + std::to_string(bytes) + " bytes) is " +
             (a.type == cudaMemoryTypeDevice ? "memory of gpu:" + std::to_string(a.device)
              : a.type == cudaMemoryTypeHost ? std::string("pinned host memory")
                                             : std::string("host memory")) +
             ", not memory of gpu:" + std::to_string(dev) + "; copy it there first (memcpy_async)";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  return STRATA_OK;
}
}  // namespace

strata_status_t update(uint32_t op, DLDataType dtype, void* dst, const void* src, uint64_t count, DLDevice dev,
                       void* stream, int64_t timeout_ms, const std::function<bool()>& aborted, std::string* why) {
  strata_status_t st = check_update(op, dtype, dev, why);
  if (st != STRATA_OK) return st;
  const ElemType type = elem_type(dtype);
  if ((st = check_device(dev, why)) != STRATA_OK || count == 0) return st;
  if (dst == nullptr || src == nullptr) {
    if (why) *why = "device_update: dst or src is NULL";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  const uint64_t bytes = count * (dtype.bits / 8);
  const auto* d = static_cast<const char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d != s && d < s + bytes && s < d + bytes) {
    if (why) *why = "device_update: dst and src overlap without being the same buffer; pass separate buffers";
    return STRATA_ERR_INVALID_ARGUMENT;
  }
  DeviceGuard g(dev.device_id);
  if (g.status() != cudaSuccess) return fail(why, "device_update: making gpu:" + std::to_string(dev.device_id) +
                                                      " current", g.status());
  if ((st = check_device_memory(dst, bytes, dev.device_id, "destination", why)) != STRATA_OK) return st;
  if ((st = check_device_memory(src, bytes, dev.device_id, "source", why)) != STRATA_OK) return st;
  cudaError_t e;
  if (op == STRATA_VAR_ASSIGN) {
    e = dst == src ? cudaSuccess
                   : cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream));
  } else {
    e = static_cast<cudaError_t>(
        launch_add(type, op == STRATA_VAR_ASSIGN_ADD ? 1 : -1, dst, src, count, stream));
  }
  if (e != cudaSuccess) return fail(why, "device_update of " + std::to_string(count) + " elements", e);
  // Synchronous: wait (with the deadline) for the legacy stream of `dev`,
  // current while the guard holds.
  return stream == nullptr ? stream_synchronize(nullptr, timeout_ms, aborted, why) : STRATA_OK;
}

void* allocate(DLDevice dev, uint64_t bytes, std::string* why) {
  const std::size_t n = static_cast<std::size_t>(std::max<uint64_t>(bytes, 1));
  if (dev.device_type == kDLCUDAHost) {
    int32_t count = 0;
    if (device_count(&count, why) != STRATA_OK) return nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, n);
    if (e != cudaSuccess) {
      fail(why, "cudaMallocHost of " + std::to_string(bytes) + " bytes", e);
      return nullptr;
    }
    return p;
  }
  if (dev.device_type != kDLCUDA) {
    if (why) *why = "allocate: not a CUDA device";
    return nullptr;
  }
  if (check_device(dev, why) != STRATA_OK || !init_pool(dev.device_id, why)) return nullptr;
  DevicePool& p = pool(dev.device_id);
  DeviceGuard g(dev.device_id);
  void* ptr = nullptr;
  cudaError_t e;
  if (p.pools) {
    e = cudaMallocAsync(&ptr, n, p.stream);
    // Usable by any stream once we return.
    if (e == cudaSuccess) e = cudaStreamSynchronize(p.stream);
  } else {
    e = cudaMalloc(&ptr, n);
  }
  if (e != cudaSuccess) {
    fail(why, "allocating " + std::to_string(bytes) + " bytes on gpu:" + std::to_string(dev.device_id), e);
    return nullptr;
  }
  return ptr;
}

void free_memory(DLDevice dev, void* ptr) {
  if (ptr == nullptr) return;
  if (dev.device_type == kDLCUDAHost) {
    cudaFreeHost(ptr);
  } else if (dev.device_type == kDLCUDA && dev.device_id >= 0 && dev.device_id < count_result().count) {
    DevicePool& p = pool(dev.device_id);
    DeviceGuard g(dev.device_id);
    if (p.pools)
      cudaFreeAsync(ptr, p.stream);
    else
      cudaFree(ptr);
  }
  cudaGetLastError();
}

#endif  // STRATA_WITH_CUDA_RUNTIME

}  // namespace strata::detail::cuda
