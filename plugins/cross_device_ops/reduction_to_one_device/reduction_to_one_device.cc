// SPDX-License-Identifier: Apache-2.0
// ReductionToOneDevice (tf.distribute.ReductionToOneDevice): every tensor
// group is reduced onto one destination device and the result copied to
// every replica's output. Options: {"reduce_to_device": "cpu:0"}.
//
// The replicas here are CPU devices of one process, so every device's
// memory is the same host memory: the "destination" is a block-sized buffer
// (in L1) that each block of the result is reduced into and stored from into
// every output (kernels::reduce_broadcast), so each input is read once and
// each output written once, with no destination array written out to
// memory and read back. MirroredStrategy cuts large all-reduces into element
// ranges and has every replica thread run some of them, each through its
// own instance (see local_strategy.hpp, split_all_reduce); started
// all-reduces run on the instance's worker thread (see
// local_cross_device_ops.hpp).
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
    sdk::parse_device(dev, "reduce_to_device");  // validated; host memory like every replica here
  }

  // batch_all_reduce: LocalCrossDeviceOps' (kernels::reduce_broadcast).
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata reduction_to_one_device cross_device_ops", "0.1.0",
              STRATA_CROSS_DEVICE_OPS_COMPONENT(strata::plugins::ReductionToOneDevice,
                                                "reduction_to_one_device", "0.1.0"))
