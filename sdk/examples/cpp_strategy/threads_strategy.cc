// SPDX-License-Identifier: Apache-2.0
// A Strategy plugin written out of tree with the Strata SDK.
//
// "example_threads" runs N replicas as threads of this process, configured
// by a replica count instead of a device list:
//
//   {"strategy": {"name": "example_threads", "options": {"replicas": 4}}}
//
// It reuses the SDK's LocalStrategy for execution, collectives and
// tf.distribute variable semantics, and shows the three things every C++
// plugin does: parse and validate its options (unknown keys are an error
// naming the key), construct its implementation (errors thrown here become
// a status with the message at the C ABI), and export itself with
// STRATA_PLUGIN, which defines the only exported symbol.
#include <string>
#include <utility>

#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace {

constexpr const char* kName = "example_threads";

strata::sdk::LocalStrategyConfig make_config(const char* options_json) {
  const nlohmann::json options = strata::sdk::parse_options(options_json, kName);
  strata::sdk::check_known_keys(options, {"replicas", "timeout_s", "cross_device_ops"}, kName);
  const int replicas = strata::sdk::get_option<int>(options, "replicas", 2, kName);
  if (replicas < 1 || replicas > 256)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'replicas' of ", kName, " must be in 1..256, got ",
                 replicas);
  strata::sdk::LocalStrategyConfig cfg;
  cfg.strategy_name = kName;
  cfg.devices.clear();
  for (int i = 0; i < replicas; ++i) cfg.devices.push_back("cpu:" + std::to_string(i));
  cfg.placement = strata::sdk::VariablePlacement::kPerReplica;
  // "timeout_s" and "cross_device_ops" mean what they mean for mirrored.
  nlohmann::json common = options;
  common.erase("replicas");
  strata::sdk::parse_common_options(common, cfg, /*allow_devices=*/false);
  return cfg;
}

class ThreadsStrategy : public strata::sdk::LocalStrategy {
 public:
  static constexpr const char* kSubsystem = "strategy.example_threads";
  ThreadsStrategy(strata::sdk::Host host, const char* options_json)
      : LocalStrategy(std::move(host), make_config(options_json)) {}
};

}  // namespace

STRATA_PLUGIN("Strata SDK example: example_threads strategy (C++)", "1.0.0",
              STRATA_STRATEGY_COMPONENT(ThreadsStrategy, "example_threads", "1.0.0"));
