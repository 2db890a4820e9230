// SPDX-License-Identifier: Apache-2.0
// ClusterResolver "simple": tf.distribute.cluster_resolver.
// SimpleClusterResolver. The cluster comes from the options, not the
// environment:
//
//   {"cluster_spec": {"worker": ["h1:2222", "h2:2222"]}, "task_type": "worker",
//    "task_id": 0, "rpc_layer": "grpc", "num_accelerators": {"GPU": 2},
//    "environment": "cloud", "master": "grpc://h1:2222"}
//
// Every option is optional; without "cluster_spec" the job is a single
// process. "master" plays the role of TF_CONFIG's session_master: master()
// with no task type returns it. Validation is the tf_config resolver's. The
// instance is immutable after create; describe() and master() never block.
#include <string>

#include <nlohmann/json.hpp>

#include "cluster_spec.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace {

constexpr const char* kComponent = "cluster resolver 'simple'";
constexpr const char* kOrigin = "the simple resolver's options";

class SimpleResolver final : public strata::sdk::ResolverBase {
 public:
  static constexpr const char* kSubsystem = "resolver.simple";

  SimpleResolver(strata::sdk::Host, const char* options_json) {
    const nlohmann::json opts = strata::sdk::parse_options(options_json, kComponent);
    strata::sdk::check_known_keys(
        opts, {"cluster_spec", "task_type", "task_id", "rpc_layer", "num_accelerators", "environment", "master"},
        kComponent);
    r_.cluster = strata::resolvers::parse_cluster_spec(opts.value("cluster_spec", nlohmann::json()),
                                                       "option 'cluster_spec' of the simple resolver");
    auto text = [&](const char* key) -> std::optional<std::string> {
      if (!opts.contains(key) || opts[key].is_null()) return std::nullopt;
      return strata::sdk::get_option<std::string>(opts, key, "", kComponent);
    };
    r_.task_type = text("task_type");
    if (opts.contains("task_id") && !opts["task_id"].is_null())
      r_.task_id = strata::sdk::get_option<int32_t>(opts, "task_id", 0, kComponent);
    r_.rpc_layer = text("rpc_layer");
    r_.environment = text("environment");
    r_.session_master = text("master");
    r_.num_accelerators = strata::resolvers::parse_num_accelerators(
        opts.value("num_accelerators", nlohmann::json()), "option 'num_accelerators' of the simple resolver");
    r_.validate(kOrigin);
  }

  std::string describe() override { return r_.describe().dump(); }

  std::string master(const char* task_type, int32_t task_id, const char* rpc_layer) override {
    return r_.master(task_type, task_id, rpc_layer, kOrigin);
  }

 private:
  strata::resolvers::Resolution r_;
};

}  // namespace

STRATA_PLUGIN("strata simple cluster resolver", "1.0.0",
              STRATA_RESOLVER_COMPONENT(SimpleResolver, "simple", "1.0.0"))
