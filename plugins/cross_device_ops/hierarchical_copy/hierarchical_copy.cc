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
//
// Each pack is packed, reduced and unpacked a block at a time, so that the
// packed block is still in cache when it is reduced and copied out. Results
// do not depend on num_packs or the blocks (the reduction is elementwise, in
// replica order). MirroredStrategy cuts large all-reduces into element
// ranges run by every replica thread, each through its own instance (see
// local_strategy.hpp, split_all_reduce); started all-reduces run on the
// instance's worker thread (see local_cross_device_ops.hpp).
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
    if (group_.size() == 1) {
      // One tensor is its own pack: reduce it straight into the outputs
      // (same bits; the elements and their order are the same). This is the
      // usual case under MirroredStrategy's split all-reduce, whose ranges
      // mostly fall inside one tensor.
      const uint32_t t = group_[0];
      ptrs_.resize(nr);
      out_ptrs_.resize(nr);
      for (uint32_t r = 0; r < nr; ++r) {
        ptrs_[r] = sdk::data_ptr(*inputs[t * nr + r]);
        out_ptrs_[r] = sdk::data_ptr(*outputs[t * nr + r]);
      }
      sdk::kernels::reduce_broadcast(op, dtype, nr, ptrs_.data(), nr, out_ptrs_.data(), total,
                                     static_cast<double>(nr));
      return;
    }
    if (packed_.size() < nr) packed_.resize(nr);
    for (uint32_t r = 0; r < nr; ++r) packed_[r].reserve(total * esize);
    ptrs_.resize(nr);
    const size_t packs = std::min<size_t>(num_packs_, total);
    const size_t block = std::max<size_t>(1, kBlockBytes / esize);
    for (size_t k = 0; k < packs; ++k) {
      const size_t pack_lo = total * k / packs;
      const size_t pack_hi = total * (k + 1) / packs;
      for (size_t lo = pack_lo; lo < pack_hi; lo += block) {
        const size_t hi = std::min(pack_hi, lo + block);
        // Pack: elements [lo, hi) of replica r's tensors of the group, back to back.
        for (uint32_t r = 0; r < nr; ++r) copy_range(inputs, nr, r, lo, hi, esize, packed_[r].data(), true);
        for (uint32_t r = 0; r < nr; ++r) ptrs_[r] = static_cast<const char*>(packed_[r].data()) + lo * esize;
        char* dst = static_cast<char*>(packed_[0].data()) + lo * esize;
        sdk::kernels::reduce(op, dtype, nr, ptrs_.data(), dst, hi - lo, static_cast<double>(nr));
        // Unpack into every replica's outputs.
        for (uint32_t r = 0; r < nr; ++r)
          copy_range(outputs, nr, r, lo, hi, esize, packed_[0].data(), false);
      }
    }
  }

  // Copy elements [lo, hi) of the concatenation of replica r's tensors of
  // the group between the tensors and `packed` (at the same offsets).
  void copy_range(const DLTensor* const* tensors, uint32_t nr, uint32_t r, size_t lo, size_t hi, size_t esize,
                  void* packed, bool to_packed) const {
    size_t off = 0;
    for (uint32_t t : group_) {
      const DLTensor& x = *tensors[t * nr + r];
      const size_t n = static_cast<size_t>(sdk::element_count(x));
      const size_t a = std::max(lo, off), b = std::min(hi, off + n);
      if (a < b) {
        char* tensor_bytes = static_cast<char*>(sdk::data_ptr(x)) + (a - off) * esize;
        char* packed_bytes = static_cast<char*>(packed) + a * esize;
        if (to_packed) std::memcpy(packed_bytes, tensor_bytes, (b - a) * esize);
        else std::memcpy(tensor_bytes, packed_bytes, (b - a) * esize);
      }
      off += n;
      if (off >= hi) break;
    }
  }

  // Bytes of each replica per block: the replicas' packed blocks stay in the
  // 1 MiB L2 with 4 replicas.
  static constexpr size_t kBlockBytes = 64 << 10;
  uint32_t num_packs_ = 1;
  std::vector<sdk::AlignedBuffer> packed_;
  std::vector<uint32_t> group_;
  std::vector<char> done_;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata hierarchical_copy cross_device_ops", "0.1.0",
              STRATA_CROSS_DEVICE_OPS_COMPONENT(strata::plugins::HierarchicalCopy, "hierarchical_copy", "0.1.0"))
