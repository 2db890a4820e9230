// SPDX-License-Identifier: Apache-2.0
// CentralStorageStrategy: compute is replicated over "devices" (one thread
// per replica) while every ON_WRITE variable has a single copy on the
// parameter device; replica-context updates are aggregated across replicas
// before being applied once. ON_READ variables stay per replica, as in TF.
// Options: {"devices": [...] (default: every visible GPU, else ["cpu:0"]),
// "parameter_device":
// "cpu:0", "cross_device_ops": {...} (default reduction_to_one_device onto
// the parameter device), "timeout_s": 300}.
#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

sdk::LocalStrategyConfig make_config(const char* options_json) {
  const std::string comp = "central_storage strategy";
  const nlohmann::json o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o, {"devices", "parameter_device", "cross_device_ops", "timeout_s"}, comp);
  sdk::LocalStrategyConfig cfg;
  cfg.strategy_name = "central_storage";
  cfg.placement = sdk::VariablePlacement::kSingleCopy;
  cfg.parameter_device = sdk::get_option<std::string>(o, "parameter_device", "cpu:0", comp);
  sdk::parse_device(cfg.parameter_device, "parameter_device");
  cfg.cross_device_ops = "reduction_to_one_device";
  cfg.cross_device_ops_options = nlohmann::json{{"reduce_to_device", cfg.parameter_device}}.dump();
  sdk::parse_common_options(o, cfg, /*allow_devices=*/true);
  return cfg;
}

class CentralStorageStrategy : public sdk::LocalStrategy {
 public:
  static constexpr const char* kSubsystem = "strategy.central_storage";
  CentralStorageStrategy(sdk::Host host, const char* options_json)
      : LocalStrategy(std::move(host), make_config(options_json)) {}
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata central_storage strategy", "0.1.0",
              STRATA_STRATEGY_COMPONENT(strata::plugins::CentralStorageStrategy, "central_storage", "0.1.0"))
