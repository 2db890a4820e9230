// SPDX-License-Identifier: Apache-2.0
// `strata-info cluster [--resolver NAME] [--option KEY=JSON]...`: resolve the
// cluster this process would join and describe it as one JSON object
//
//   {"resolver", "cluster_spec", "task_type", "task_id", "rpc_layer", "master",
//    "num_accelerators", "environment", "is_chief", "id_in_cluster",
//    "worker_count", "env_after", <resolver-specific keys such as "slurm">,
//    "detection"}
//
// with null where a field does not apply (master when this process has no
// task or its task is outside the cluster; is_chief, id_in_cluster and
// worker_count where tf.distribute's multi_worker_util refuses the task: an
// unknown task, a ps task (is_chief false, the others null), or a cluster
// with a job other than chief, worker, evaluator and ps).
//
// Resolver choice: --resolver, else strata::choose_cluster_resolver() as
// core makes it: /cluster_resolver/name of the config (or
// STRATA_CLUSTER_RESOLVER), else slurm, tf_config, tpu by detection, else
// "local": a single-process job (cluster_spec {}, no task, chief,
// id_in_cluster 0, worker_count 1). Without --resolver the output has
// "detection": {"order": [{"resolver", "found"}...], "chosen", "reason"}.
// Options: the config's /cluster_resolver/options when the config file names the chosen resolver
// (or none), then each --option KEY=JSON on top.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "strata/config.hpp"
#include "strata/plugin_host.hpp"

struct ClusterArgs {
  std::string resolver;
  std::vector<std::string> options;  ///< KEY=JSON
  /// /cluster_resolver/name of the config file before environment overrides:
  /// its options apply only to that resolver (or to any when it names none).
  std::string config_file_resolver;
};

/// Register the `cluster` subcommand on `app`, filling `args`.
CLI::App* add_cluster_command(CLI::App& app, ClusterArgs& args);

/// Build the options object from KEY=JSON strings on top of `base`. Throws
/// InvalidArgumentError naming the offending --option.
nlohmann::json parse_cluster_options(const std::vector<std::string>& options, nlohmann::json base);

/// Resolve and describe the cluster (see file comment). Throws strata::Error.
nlohmann::ordered_json run_cluster_command(strata::PluginHost& host, const strata::Config& cfg,
                                           const ClusterArgs& args);
