// SPDX-License-Identifier: Apache-2.0
// ClusterResolver "tf_config": tf.distribute.cluster_resolver.
// TFConfigClusterResolver. Reads the TF_CONFIG environment variable once, at
// create time:
//
//   TF_CONFIG='{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]},
//               "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"}'
//
// Options (the constructor arguments; each overrides TF_CONFIG): "task_type",
// "task_id", "rpc_layer", "environment", "num_accelerators" ({"GPU": 2}).
// As in TF: an unset (or empty) TF_CONFIG is an empty cluster with no task;
// "environment" comes only from the option (TF_CONFIG's is ignored); a
// numeric task type names a numeric job; master() follows
// Resolution::tf_config_master. Jobs may be lists or sparse objects
// {"<index>": address}. The instance is immutable after create, so
// describe() and master() never block.
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "cluster_spec.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace {

constexpr const char* kComponent = "cluster resolver 'tf_config'";

class TfConfigResolver final : public strata::sdk::ResolverBase {
 public:
  static constexpr const char* kSubsystem = "resolver.tf_config";

  TfConfigResolver(strata::sdk::Host host, const char* options_json) {
    const nlohmann::json opts = strata::sdk::parse_options(options_json, kComponent);
    strata::sdk::check_known_keys(opts, {"task_type", "task_id", "rpc_layer", "environment", "num_accelerators"},
                                  kComponent);
    // Unset or empty TF_CONFIG is an empty one, as TFConfigClusterResolver
    // reads an unset variable: no cluster, no task, master() "".
    const char* env = std::getenv("TF_CONFIG");
    strata::resolvers::TfConfig tf =
        strata::resolvers::parse_tf_config(env != nullptr && env[0] != '\0' ? env : "{}");
    r_.cluster = std::move(tf.cluster);
    r_.task_type = tf.task_type;
    r_.task_id = tf.task_id;
    r_.rpc_layer = tf.rpc_layer;
    r_.session_master = tf.session_master;
    // Not tf.environment: TFConfigClusterResolver's environment is only its
    // constructor argument, never TF_CONFIG's "environment".
    if (opts.contains("task_type") && !opts["task_type"].is_null())
      r_.task_type = strata::sdk::get_option<std::string>(opts, "task_type", "", kComponent);
    if (opts.contains("task_id") && !opts["task_id"].is_null())
      r_.task_id = strata::sdk::get_option<int32_t>(opts, "task_id", 0, kComponent);
    if (opts.contains("rpc_layer") && !opts["rpc_layer"].is_null())
      r_.rpc_layer = strata::sdk::get_option<std::string>(opts, "rpc_layer", "", kComponent);
    if (opts.contains("environment") && !opts["environment"].is_null())
      r_.environment = strata::sdk::get_option<std::string>(opts, "environment", "", kComponent);
    r_.num_accelerators = strata::resolvers::parse_num_accelerators(
        opts.value("num_accelerators", nlohmann::json()), "option 'num_accelerators' of the tf_config resolver");
    r_.validate("TF_CONFIG");
    host.debug("resolved task ", r_.task_type.value_or("(none)"), " ",
               r_.task_id ? std::to_string(*r_.task_id) : std::string("-"), " from TF_CONFIG");
  }

  std::string describe() override { return r_.describe().dump(); }

  std::string master(const char* task_type, int32_t task_id, const char* rpc_layer) override {
    return r_.tf_config_master(task_type, task_id, rpc_layer);
  }

  /// TF_CONFIG set and non-empty.
  static bool detect(const strata::sdk::Host&) {
    const char* env = std::getenv("TF_CONFIG");
    return env != nullptr && env[0] != '\0';
  }

 private:
  strata::resolvers::Resolution r_;
};

}  // namespace

STRATA_PLUGIN("strata tf_config cluster resolver", "1.0.0",
              STRATA_RESOLVER_COMPONENT(TfConfigResolver, "tf_config", "1.0.0"))
