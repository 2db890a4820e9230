// SPDX-License-Identifier: Apache-2.0
// GPU tensors in the ring cross_device_ops: staged through pinned host
// memory, so that RING works on GPU replicas as in tf.distribute.
//
// A call whose tensors include kDLCUDA ones is run on host views of them:
// begin() copies every GPU tensor it is given into one cached pinned buffer
// (cudaMallocHost, grown as needed, never shrunk; cudaMemcpy device to
// host) and returns the same arrays with each GPU tensor replaced by a
// kDLCPU view of its copy; the host ring runs on the views; finish() copies
// the written views back (host to device). Tensors that share a device
// address (an output aliasing its input) share one view, so in-place calls
// stay in place. Host tensors pass through untouched. Results are therefore
// bit-identical to the same call on host replicas.
//
// Blocking: the copies are synchronous; the caller must have finished the
// work producing the inputs (as the cross_device_ops ABI requires of every
// blocking call) and the outputs are written when finish() returns.
// Threads: one staged call at a time per instance (the ring's API thread).
// Without the CUDA runtime (STRATA_WITH_CUDA_RUNTIME unset) any_gpu() is
// still defined and begin() rejects GPU tensors with UNIMPLEMENTED.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <deque>
#include <vector>

namespace strata::plugins::ring {

class GpuStaging {
 public:
  GpuStaging() = default;
  GpuStaging(const GpuStaging&) = delete;
  GpuStaging& operator=(const GpuStaging&) = delete;
  ~GpuStaging();

  /// True when any non-NULL tensor of `ts[0..n)` is not a host tensor.
  static bool any_gpu(const DLTensor* const* ts, size_t n);

  struct Views {
    std::vector<const DLTensor*> in;
    std::vector<DLTensor*> out;
  };
  /// Host views of `ins` (read: copied to the host) and `outs` (written
  /// back by finish()). Throws INVALID_ARGUMENT for a non-contiguous or
  /// unsupported GPU tensor, INTERNAL naming the CUDA error for a failed copy.
  Views begin(const DLTensor* const* ins, size_t nin, DLTensor* const* outs, size_t nout);
  /// Copy the written views back to their GPU tensors and forget them.
  void finish();
  /// Forget the views without copying (after a failed call).
  void abandon();

 private:
  struct Region {
    int device;
    void* data;      // device address
    size_t bytes;
    size_t offset;   // into the pinned buffer
    bool written;
  };
  size_t region_of(const DLTensor& t, bool written);

  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::vector<Region> regions_;
  std::deque<DLTensor> views_;  // stable addresses
};

}  // namespace strata::plugins::ring
