// SPDX-License-Identifier: Apache-2.0
// MirroredStrategy: one replica per local device, each on its own thread;
// ON_WRITE variables are mirrored (one copy per replica, kept equal at every
// write). Options: {"devices": ["cpu:0", ...] (default ["cpu:0"]),
// "cross_device_ops": {"name": ..., "options": {...}} (default: "nccl" when
// every replica is on a GPU ("gpu:N" / "cuda:N", or every visible GPU when
// "devices" is left out) in a CUDA build, as tf.distribute's
// MirroredStrategy picks NcclAllReduce on GPUs; else
// "reduction_to_one_device", which is what TF picks when the devices are
// CPUs; an explicit cross_device_ops always wins), "timeout_s": 300}.
//
// With the in-process cross_device_ops (reduction_to_one_device,
// hierarchical_copy, or "" = the SDK's built-in one) a large replica
// all-reduce is shared out among the replica threads, each reducing element
// ranges through its own instance (LocalStrategyConfig::split_all_reduce),
// so no single thread reduces everything. Another cross_device_ops (a third
// party's, or one that spans processes) is called once per all-reduce.
#include "strata/config.h"
#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

sdk::LocalStrategyConfig make_config(const char* options_json) {
  const std::string comp = "mirrored strategy";
  const nlohmann::json o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o, {"devices", "cross_device_ops", "timeout_s"}, comp);
  sdk::LocalStrategyConfig cfg;
  cfg.strategy_name = "mirrored";
  cfg.placement = sdk::VariablePlacement::kPerReplica;
  cfg.cross_device_ops = "reduction_to_one_device";
#if STRATA_HAVE_CUDA
  // Every replica on a GPU (named, or every visible GPU by default): NCCL.
  if (!o.contains("cross_device_ops")) cfg.gpu_cross_device_ops = "nccl";
#endif
  sdk::parse_common_options(o, cfg, /*allow_devices=*/true);  // an explicit cross_device_ops replaces the default
  cfg.split_all_reduce = cfg.cross_device_ops.empty() || cfg.cross_device_ops == "reduction_to_one_device" ||
                         cfg.cross_device_ops == "hierarchical_copy";
  return cfg;
}

class MirroredStrategy : public sdk::LocalStrategy {
 public:
  static constexpr const char* kSubsystem = "strategy.mirrored";
  MirroredStrategy(sdk::Host host, const char* options_json)
      : LocalStrategy(std::move(host), make_config(options_json)) {}
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata mirrored strategy", "0.1.0",
              STRATA_STRATEGY_COMPONENT(strata::plugins::MirroredStrategy, "mirrored", "0.1.0"))
