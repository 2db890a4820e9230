// SPDX-License-Identifier: Apache-2.0
// LocalCrossDeviceOps: a complete CrossDeviceOps for the tensors of replicas
// living in this process (host memory), built on the SDK kernels. It
// validates every call (dtype, element counts, contiguity, host memory),
// implements reduce, broadcast, all_gather, reduce_scatter and the start/wait
// pair, and leaves the batch all-reduce algorithm to subclasses through
// batch_all_reduce (the default reduces each tensor group into the first
// replica's output and copies it to the others).
//
// Threads: one call at a time per instance (as the ABI says); scratch
// buffers are reused between calls, so steady-state calls do not allocate.
// all_reduce_start completes the operation before returning (in-process
// copies have nothing to overlap with), so started operations trivially
// complete in order and request_wait never blocks.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "strata/sdk/kernels.hpp"
#include "strata/sdk/plugin.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::sdk {

class LocalCrossDeviceOps : public CrossDeviceOpsBase {
 public:
  explicit LocalCrossDeviceOps(Host host) : host_(std::move(host)) {}
  /// As a standalone component: accepts no options ({} only).
  LocalCrossDeviceOps(Host host, const char* options_json);
  ~LocalCrossDeviceOps() override;

  void all_reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
                  const DLTensor* const* inputs, DLTensor* const* outputs) override;
  void reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
              const DLTensor* const* inputs, DLTensor* const* outputs) override;
  void broadcast(const DLTensor& src, uint32_t num_replicas, DLTensor* const* dsts) override;
  void all_gather(uint32_t num_replicas, const DLTensor* const* inputs, int32_t axis,
                  DLTensor* const* outputs) override;
  void reduce_scatter(strata_reduce_op op, uint32_t num_replicas, const DLTensor* const* inputs,
                      DLTensor* const* outputs);
  strata_cdo_request_t all_reduce_start(strata_reduce_op op, uint32_t num_tensors,
                                        uint32_t num_replicas, const DLTensor* const* inputs,
                                        DLTensor* const* outputs);
  void request_wait(strata_cdo_request_t request, int64_t timeout_ms);

 protected:
  /// The batch all-reduce after validation (every group checked: same dtype
  /// and count, outputs matching). Outputs may alias inputs.
  virtual void batch_all_reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
                                const DLTensor* const* inputs, DLTensor* const* outputs);
  /// Validate a batch: inputs[t*nr + r] (and outputs with the same layout,
  /// or one output per tensor when `outputs_per_tensor` is 1).
  void validate_batch(const char* what, uint32_t num_tensors, uint32_t num_replicas,
                      const DLTensor* const* inputs, const DLTensor* const* outputs,
                      uint32_t outputs_per_tensor) const;
  /// op over inputs[0..nr) (each `count` elements of `dtype`) into `dst`;
  /// MEAN divides by nr. dst may alias an input.
  void reduce_into(strata_reduce_op op, DLDataType dtype, uint32_t num_replicas,
                   const DLTensor* const* group, void* dst, size_t count);

  Host host_;
  std::vector<const void*> ptrs_;  // reused pointer array for the kernels
  AlignedBuffer scratch_;

 private:
  std::unordered_set<void*> requests_;  // completed, not yet waited for
};

}  // namespace strata::sdk
