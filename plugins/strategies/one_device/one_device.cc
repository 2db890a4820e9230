// SPDX-License-Identifier: Apache-2.0
// OneDeviceStrategy: a single replica on one device, run on the caller's
// thread. Options: {"device": "cpu:0" | "gpu:<n>" | "cuda:<n>", "timeout_s":
// 300}. On a GPU the variables live in its memory and the replica's work
// is ordered on the strategy's stream (see LocalStrategy). Reductions over
// the single replica use the SDK's built-in CrossDeviceOps (TF's
// OneDeviceStrategy has none either), so no other plugin is needed.
#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

sdk::LocalStrategyConfig make_config(const char* options_json) {
  const std::string comp = "one_device strategy";
  const nlohmann::json o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o, {"device", "timeout_s"}, comp);
  sdk::LocalStrategyConfig cfg;
  cfg.strategy_name = "one_device";
  const std::string device = sdk::get_option<std::string>(o, "device", "cpu:0", comp);
  sdk::parse_device(device, "device");
  cfg.devices = {device};
  cfg.parameter_device = device;
  cfg.placement = sdk::VariablePlacement::kSingleCopy;
  cfg.require_aggregation = false;
  cfg.default_to_gpus = false;  // the device is named (default "cpu:0")
  sdk::parse_common_options(o, cfg, /*allow_devices=*/false);
  return cfg;
}

class OneDeviceStrategy : public sdk::LocalStrategy {
 public:
  static constexpr const char* kSubsystem = "strategy.one_device";
  OneDeviceStrategy(sdk::Host host, const char* options_json)
      : LocalStrategy(std::move(host), make_config(options_json)) {}
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata one_device strategy", "0.1.0",
              STRATA_STRATEGY_COMPONENT(strata::plugins::OneDeviceStrategy, "one_device", "0.1.0"))
