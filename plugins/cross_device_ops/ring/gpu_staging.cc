// SPDX-License-Identifier: Apache-2.0
#include "gpu_staging.h"

#if defined(STRATA_WITH_CUDA_RUNTIME) && STRATA_WITH_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

#include "strata/error.hpp"
#include "strata/sdk/kernels.hpp"

namespace strata::plugins::ring {
namespace {

std::string what_of(bool out, size_t i) { return std::string(out ? "output " : "input ") + std::to_string(i); }

#if defined(STRATA_WITH_CUDA_RUNTIME) && STRATA_WITH_CUDA_RUNTIME
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    STRATA_THROW(STRATA_ERR_INTERNAL, "ring cross_device_ops: staging GPU tensors through host memory: ", what,
                 " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}
#endif

}  // namespace

GpuStaging::~GpuStaging() {
#if defined(STRATA_WITH_CUDA_RUNTIME) && STRATA_WITH_CUDA_RUNTIME
  if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
#endif
}

bool GpuStaging::any_gpu(const DLTensor* const* ts, size_t n) {
  if (ts == nullptr) return false;
  for (size_t i = 0; i < n; ++i)
    if (ts[i] != nullptr && ts[i]->device.device_type != kDLCPU) return true;
  return false;
}

size_t GpuStaging::region_of(const DLTensor& t, bool written) {
  void* p = sdk::data_ptr(t);
  const size_t bytes = sdk::byte_size(t);
  for (size_t i = 0; i < regions_.size(); ++i)
    if (regions_[i].data == p && regions_[i].device == t.device.device_id) {
      if (bytes > regions_[i].bytes) regions_[i].bytes = bytes;
      regions_[i].written = regions_[i].written || written;
      return i;
    }
  regions_.push_back(Region{t.device.device_id, p, bytes, 0, written});
  return regions_.size() - 1;
}

GpuStaging::Views GpuStaging::begin(const DLTensor* const* ins, size_t nin, DLTensor* const* outs, size_t nout) {
  regions_.clear();
  views_.clear();
  // Which region each tensor uses (SIZE_MAX: a host or NULL tensor).
  std::vector<size_t> in_region(nin, SIZE_MAX), out_region(nout, SIZE_MAX);
  auto classify = [&](const DLTensor* t, bool out, size_t i) -> size_t {
    if (t == nullptr || t->device.device_type == kDLCPU) return SIZE_MAX;
    if (t->device.device_type != kDLCUDA)
      STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "ring cross_device_ops: ", what_of(out, i), " is on DLPack device type ",
                   int(t->device.device_type), "; the ring handles host (kDLCPU) and CUDA (kDLCUDA) tensors");
#if !(defined(STRATA_WITH_CUDA_RUNTIME) && STRATA_WITH_CUDA_RUNTIME)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "ring cross_device_ops: ", what_of(out, i),
                 " is a CUDA tensor but this build of Strata has no CUDA support; rebuild with "
                 "-DSTRATA_WITH_CUDA=ON or pass host tensors");
#else
    sdk::check_dtype_supported(t->dtype, "ring cross_device_ops " + what_of(out, i));
    sdk::check_contiguous(*t, "ring cross_device_ops " + what_of(out, i));
    if (t->data == nullptr && sdk::element_count(*t) != 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "ring cross_device_ops: ", what_of(out, i), " has NULL data");
    return region_of(*t, out);
#endif
  };
  for (size_t i = 0; i < nin; ++i) in_region[i] = classify(ins ? ins[i] : nullptr, false, i);
  for (size_t i = 0; i < nout; ++i) out_region[i] = classify(outs ? outs[i] : nullptr, true, i);
  Views v;
  v.in.assign(ins, ins + nin);
  v.out.assign(outs, outs + nout);
#if defined(STRATA_WITH_CUDA_RUNTIME) && STRATA_WITH_CUDA_RUNTIME
  size_t total = 0;
  for (Region& r : regions_) {
    r.offset = total;
    total += (r.bytes + 63) & ~size_t(63);
  }
  if (total > pinned_bytes_) {
    if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    cuda_check(cudaMallocHost(&pinned_, total), "cudaMallocHost");
    pinned_bytes_ = total;
  }
  int saved = 0;
  const bool have_saved = cudaGetDevice(&saved) == cudaSuccess;
  try {
    for (const Region& r : regions_) {
      if (r.bytes == 0) continue;
      cuda_check(cudaSetDevice(r.device), "cudaSetDevice");
      cuda_check(cudaMemcpy(static_cast<char*>(pinned_) + r.offset, r.data, r.bytes, cudaMemcpyDeviceToHost),
                 "cudaMemcpy device to host");
    }
  } catch (...) {
    if (have_saved) (void)cudaSetDevice(saved);
    regions_.clear();
    throw;
  }
  if (have_saved) (void)cudaSetDevice(saved);
  auto view = [&](const DLTensor& t, size_t region) {
    DLTensor h = t;
    h.device = DLDevice{kDLCPU, 0};
    h.data = static_cast<char*>(pinned_) + regions_[region].offset;
    h.byte_offset = 0;
    views_.push_back(h);
    return &views_.back();
  };
  for (size_t i = 0; i < nin; ++i)
    if (in_region[i] != SIZE_MAX) v.in[i] = view(*ins[i], in_region[i]);
  for (size_t i = 0; i < nout; ++i)
    if (out_region[i] != SIZE_MAX) v.out[i] = view(*outs[i], out_region[i]);
#endif
  return v;
}

void GpuStaging::finish() {
#if defined(STRATA_WITH_CUDA_RUNTIME) && STRATA_WITH_CUDA_RUNTIME
  int saved = 0;
  const bool have_saved = cudaGetDevice(&saved) == cudaSuccess;
  try {
    for (const Region& r : regions_) {
      if (!r.written || r.bytes == 0) continue;
      cuda_check(cudaSetDevice(r.device), "cudaSetDevice");
      cuda_check(cudaMemcpy(r.data, static_cast<char*>(pinned_) + r.offset, r.bytes, cudaMemcpyHostToDevice),
                 "cudaMemcpy host to device");
    }
  } catch (...) {
    if (have_saved) (void)cudaSetDevice(saved);
    abandon();
    throw;
  }
  if (have_saved) (void)cudaSetDevice(saved);
#endif
  abandon();
}

void GpuStaging::abandon() {
  regions_.clear();
  views_.clear();
}

}  // namespace strata::plugins::ring
