// SPDX-License-Identifier: Apache-2.0
// HierarchicalCopyAllReduce (tf.distribute.HierarchicalCopyAllReduce): a
// batch all-reduce that first packs the batch's tensors into `num_packs`
// contiguous buffers per replica (tensors grouped by dtype, concatenated in
// order, the concatenation split into num_packs near-equal element ranges),
// reduces each pack once and unpacks the result into every output.
// Options: {"num_packs": 1} (0 = no packing: each tensor reduced alone).
//
// TF's version also arranges the copies along the NVLink topology of DGX-1
// style GPU boxes; replicas here share host memory, which has no link
// topology, so the hierarchy is a single level and only the packing remains.
#include <algorithm>
#include <cstring>
#include <vector>

#include "strata/sdk/local_cross_device_ops.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

class HierarchicalCopy : public sdk::LocalCrossDeviceOps {
 public:
  static constexpr const char* kSubsystem = "cross_device_ops.hierarchical_copy";

  HierarchicalCopy(sdk::Host host, const char* options_json) : LocalCrossDeviceOps(std::move(host)) {
    const std::string comp = "hierarchical_copy cross_device_ops";
    const nlohmann::json o = sdk::parse_options(options_json, comp);
    sdk::check_known_keys(o, {"num_packs"}, comp);
    num_packs_ = sdk::get_option<uint32_t>(o, "num_packs", 1u, comp);
  }

 protected:
  void batch_all_reduce(strata_reduce_op op, uint32_t nt, uint32_t nr, const DLTensor* const* inputs,
                        DLTensor* const* outputs) override {
    if (num_packs_ == 0) return LocalCrossDeviceOps::batch_all_reduce(op, nt, nr, inputs, outputs);
    // Group the batch's tensors by dtype, keeping their order within a group.
    done_.assign(nt, 0);
    for (uint32_t t0 = 0; t0 < nt; ++t0) {
      if (done_[t0]) continue;
      const DLDataType dtype = inputs[t0 * nr]->dtype;
      group_.clear();
      for (uint32_t t = t0; t < nt; ++t)
        if (!done_[t] && sdk::dtype_equal(inputs[t * nr]->dtype, dtype)) {
          group_.push_back(t);
          done_[t] = 1;
        }
      reduce_group(op, dtype, nr, inputs, outputs);
    }
  }

 private:
  void reduce_group(strata_reduce_op op, DLDataType dtype, uint32_t nr, const DLTensor* const* inputs,
                    DLTensor* const* outputs) {
    const size_t esize = sdk::dtype_size(dtype);
    size_t total = 0;
    for (uint32_t t : group_) total += static_cast<size_t>(sdk::element_count(*inputs[t * nr]));
    if (total == 0) return;
    // Pack: replica r's tensors of the group, back to back.
    if (packed_.size() < nr) packed_.resize(nr);
    for (uint32_t r = 0; r < nr; ++r) {
      packed_[r].reserve(total * esize);
      char* dst = static_cast<char*>(packed_[r].data());
      for (uint32_t t : group_) {
        const size_t b = sdk::byte_size(*inputs[t * nr + r]);
        if (b) std::memcpy(dst, sdk::data_ptr(*inputs[t * nr + r]), b);
        dst += b;
      }
    }
    // Reduce each pack once, into replica 0's packed buffer.
    const size_t packs = std::min<size_t>(num_packs_, total);
    ptrs_.resize(nr);
    for (size_t k = 0; k < packs; ++k) {
      const size_t lo = total * k / packs;
      const size_t hi = total * (k + 1) / packs;
      for (uint32_t r = 0; r < nr; ++r) ptrs_[r] = static_cast<const char*>(packed_[r].data()) + lo * esize;
      sdk::kernels::reduce(op, dtype, nr, ptrs_.data(), static_cast<char*>(packed_[0].data()) + lo * esize,
                           hi - lo, static_cast<double>(nr));
    }
    // Unpack into every replica's outputs.
    for (uint32_t r = 0; r < nr; ++r) {
      const char* src = static_cast<const char*>(packed_[0].data());
      for (uint32_t t : group_) {
        const size_t b = sdk::byte_size(*outputs[t * nr + r]);
        if (b) std::memcpy(sdk::data_ptr(*outputs[t * nr + r]), src, b);
        src += b;
      }
    }
  }

  uint32_t num_packs_ = 1;
  std::vector<sdk::AlignedBuffer> packed_;
  std::vector<uint32_t> group_;
  std::vector<char> done_;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata hierarchical_copy cross_device_ops", "0.1.0",
              STRATA_CROSS_DEVICE_OPS_COMPONENT(strata::plugins::HierarchicalCopy, "hierarchical_copy", "0.1.0"))
