// SPDX-License-Identifier: Apache-2.0
// ReductionToOneDevice (tf.distribute.ReductionToOneDevice): every tensor
// group is reduced onto one destination device and the result copied to
// every replica's output. Options: {"reduce_to_device": "cpu:0"}. The
// destination buffer is allocated through the host on that device (falling
// back to plain host memory when the host cannot place it) and reused.
//
// A group is reduced and copied out a block at a time, so that each block
// of the destination is still in cache when it is copied to the replicas
// (reducing all of it first and copying afterwards reads it back from
// memory). MirroredStrategy cuts large all-reduces into element ranges and
// has every replica thread run some of them, each through its own instance
// (see local_strategy.hpp, split_all_reduce); started all-reduces run on
// the instance's worker thread (see local_cross_device_ops.hpp).
#include <algorithm>
#include <cstring>

#include "strata/sdk/local_cross_device_ops.hpp"
#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

class ReductionToOneDevice : public sdk::LocalCrossDeviceOps {
 public:
  static constexpr const char* kSubsystem = "cross_device_ops.reduction_to_one_device";

  ReductionToOneDevice(sdk::Host host, const char* options_json) : LocalCrossDeviceOps(std::move(host)) {
    const std::string comp = "reduction_to_one_device cross_device_ops";
    const nlohmann::json o = sdk::parse_options(options_json, comp);
    sdk::check_known_keys(o, {"reduce_to_device"}, comp);
    const std::string dev = sdk::get_option<std::string>(o, "reduce_to_device", "cpu:0", comp);
    device_ = DLDevice{kDLCPU, sdk::parse_device(dev, "reduce_to_device")};
  }
  ~ReductionToOneDevice() override {
    shutdown();  // the worker may be using dest_
    release();
  }

 protected:
  void batch_all_reduce(strata_reduce_op op, uint32_t nt, uint32_t nr, const DLTensor* const* inputs,
                        DLTensor* const* outputs) override {
    for (uint32_t t = 0; t < nt; ++t) {
      const DLTensor& first = *inputs[t * nr];
      const size_t count = static_cast<size_t>(sdk::element_count(first));
      const size_t bytes = count * sdk::dtype_size(first.dtype);
      const size_t esize = sdk::dtype_size(first.dtype);
      char* dest = static_cast<char*>(destination(bytes));
      ptrs_.resize(nr);
      const size_t block = std::max<size_t>(1, kBlockBytes / esize);
      for (size_t lo = 0; lo < count; lo += block) {
        const size_t n = std::min(block, count - lo);
        for (uint32_t r = 0; r < nr; ++r)
          ptrs_[r] = static_cast<const char*>(sdk::data_ptr(*inputs[t * nr + r])) + lo * esize;
        sdk::kernels::reduce(op, first.dtype, nr, ptrs_.data(), dest + lo * esize, n, static_cast<double>(nr));
        for (uint32_t r = 0; r < nr; ++r)
          std::memcpy(static_cast<char*>(sdk::data_ptr(*outputs[t * nr + r])) + lo * esize, dest + lo * esize,
                      n * esize);
      }
    }
  }

 private:
  // Bytes of each input per block: every replica's block and the
  // destination's stay in the 1 MiB L2 with 4 replicas.
  static constexpr size_t kBlockBytes = 64 << 10;

  void* destination(size_t bytes) {
    if (bytes <= dest_bytes_ && dest_ != nullptr) return dest_;
    release();
    const size_t want = bytes < 4096 ? 4096 : bytes;
    dest_ = host_.allocate(device_, want, 64);
    on_host_ = dest_ != nullptr;
    if (dest_ == nullptr) {
      fallback_.reserve(want);
      dest_ = fallback_.data();
    }
    dest_bytes_ = want;
    return dest_;
  }
  void release() {
    if (on_host_) host_.free_memory(device_, dest_);
    on_host_ = false;
    dest_ = nullptr;
    dest_bytes_ = 0;
  }

  DLDevice device_{kDLCPU, 0};
  void* dest_ = nullptr;
  size_t dest_bytes_ = 0;
  bool on_host_ = false;
  sdk::AlignedBuffer fallback_;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata reduction_to_one_device cross_device_ops", "0.1.0",
              STRATA_CROSS_DEVICE_OPS_COMPONENT(strata::plugins::ReductionToOneDevice,
                                                "reduction_to_one_device", "0.1.0"))
