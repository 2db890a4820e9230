// SPDX-License-Identifier: Apache-2.0
// Cluster specs, TF_CONFIG and the tf.distribute multi_worker_util rules,
// shared by the tf_config and simple resolvers, strata-info and the
// TF_CONFIG fuzzer. Plain functions over values; no I/O, no environment
// access (callers pass the TF_CONFIG text), no globals, so every function is
// thread-safe and reentrant.
//
// Errors: every malformed input throws strata::InvalidArgumentError whose
// message names where the value came from (`origin`, e.g. "TF_CONFIG" or
// "option 'cluster_spec' of the simple resolver") and how to fix it. Nothing
// else is thrown except std::bad_alloc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata::resolvers {

/// A validated cluster spec: job name -> (task index -> "host:port").
/// `json` keeps the spec as given (lists stay lists, sparse dicts stay dicts
/// with decimal-string keys), which is what describe() reports.
struct ClusterSpec {
  std::map<std::string, std::map<int32_t, std::string>> jobs;
  nlohmann::json json = nlohmann::json::object();

  bool has_job(const std::string& job) const { return jobs.count(job) != 0; }
  /// Number of tasks of `job` (0 when absent).
  std::size_t num_tasks(const std::string& job) const;
  /// Address of (job, index), or nullptr when that task does not exist.
  const std::string* task_address(const std::string& job, int32_t index) const;
};

/// Parse and validate a cluster spec: an object whose values are lists of
/// address strings or objects {"<non-negative index>": address}.
ClusterSpec parse_cluster_spec(const nlohmann::json& spec, const std::string& origin);

/// The fields of TF_CONFIG that Strata reads; absent ones are nullopt.
struct TfConfig {
  ClusterSpec cluster;                       ///< {} when "cluster" is absent
  std::optional<std::string> task_type;      ///< task.type
  std::optional<int32_t> task_id;            ///< task.index
  std::optional<std::string> rpc_layer;      ///< rpc_layer
  std::optional<std::string> session_master; ///< session_master
  /// environment ("cloud", "google", ...) when a string. Only reported: the
  /// tf_config resolver ignores it, as TFConfigClusterResolver does.
  std::optional<std::string> environment;
};

/// Parse TF_CONFIG text (a JSON object with optional "cluster", "task",
/// "rpc_layer", "session_master", "environment"; other keys are ignored, as
/// TensorFlow does). Does not check the task against the cluster: see
/// Resolution::validate.
TfConfig parse_tf_config(std::string_view text);

/// Everything a resolver resolved: the data behind describe() and master().
struct Resolution {
  ClusterSpec cluster;
  std::optional<std::string> task_type;
  std::optional<int32_t> task_id;
  std::optional<std::string> rpc_layer;
  std::optional<std::string> session_master;
  std::optional<std::string> environment;
  nlohmann::json num_accelerators = nlohmann::json::object();  ///< {"GPU": 2}

  /// Check the task against the cluster (multi_worker_util rules): the task
  /// type is a job of the cluster (an "evaluator" may be absent, it runs
  /// outside the cluster), the index exists in that job, and there is at
  /// most one chief and one evaluator. `origin` names the source in errors.
  void validate(const std::string& origin) const;

  /// master(task_type, task_id, rpc_layer) as in TFConfigClusterResolver:
  /// with no task_type, session_master when set, else this task's address,
  /// else "" (this process has no task); a negative task_id means this
  /// task's index. The address is prefixed "<layer>://" when a layer
  /// applies (`rpc_layer` when non-empty, else the resolved one). Throws
  /// NotFoundError when the task is not in the cluster (e.g. an evaluator
  /// that runs outside it) and InvalidArgumentError for a bad request.
  /// `use_session_master` false skips session_master; `own_layer` false
  /// uses only `rpc_layer`, never the resolved one.
  std::string master(const char* task_type, int32_t task_id, const char* rpc_layer,
                     const std::string& origin, bool use_session_master = true, bool own_layer = true) const;

  /// master() as TFConfigClusterResolver answers it: session_master whenever
  /// it is set, whatever the arguments; "" for an empty cluster or a cluster
  /// of a single task; else the task's address as master() gives it, except
  /// that a non-null `rpc_layer` replaces the resolved layer even when it is
  /// "" (no prefix). Throws NotFoundError when this process has no task and
  /// no task type is passed, or the task is not in the cluster.
  std::string tf_config_master(const char* task_type, int32_t task_id, const char* rpc_layer) const;

  /// The shared describe() object: {"cluster_spec", "task_type", "task_id",
  /// "rpc_layer", "environment", "num_accelerators", "env_after": {}}.
  nlohmann::json describe() const;
};

/// Validate a num_accelerators option: an object of non-negative integers.
nlohmann::json parse_num_accelerators(const nlohmann::json& value, const std::string& origin);

// ---- multi_worker_util ------------------------------------------------------
// The rules of tf.distribute's multi_worker_util (is_chief, worker_count,
// id_in_cluster and the validation behind them). They apply only to clusters
// whose jobs are "chief", "worker", "evaluator" and "ps": any other job name
// is refused, as TF refuses it, although the resolvers themselves accept any
// job name. Each function throws InvalidArgumentError (naming the problem and
// the fix) where TF raises ValueError. Sparse jobs are numbered densely:
// worker tasks {1, 3} have ranks chief-count + 0 and + 1.

/// Check `spec` and the task against the multi_worker_util rules: only the
/// four job names, at most one chief and one evaluator, the task type one of
/// them (or null) and a job of the cluster (an evaluator may run outside
/// it), and the task id a task of that job.
void validate_multi_worker(const ClusterSpec& spec, const std::optional<std::string>& task_type,
                           std::optional<int32_t> task_id);

/// Whether the task is its cluster's chief: the chief; the evaluator (the
/// chief of its own cluster); the first worker when there is no chief job.
bool is_chief(const ClusterSpec& spec, const std::string& task_type, int32_t task_id);

/// Number of workers in the task type's cluster: chief + worker tasks for a
/// chief or worker, the evaluator tasks for an evaluator (1 when it runs
/// outside the cluster). A ps task (or any other type) is refused.
int32_t worker_count(const ClusterSpec& spec, const std::string& task_type);

/// The task's rank in [0, worker_count): chief 0, workers after the chief,
/// an evaluator its own index. A ps task (or any other type) is refused.
int32_t id_in_cluster(const ClusterSpec& spec, const std::string& task_type, int32_t task_id);

/// A task's place in the collective group, for strata-info: the three
/// functions above, each null where it refuses the task.
struct ClusterRole {
  std::optional<bool> is_chief;         ///< null when the task is unknown or refused
  std::optional<int32_t> id_in_cluster; ///< null for ps, unknown or refused tasks
  std::optional<int32_t> worker_count;  ///< null for ps, unknown or refused tasks
};

/// Roles from a describe() object. An empty cluster without a task is a
/// single-process job (chief, rank 0, one worker), as TF's strategies treat
/// it. Throws InvalidArgumentError when `describe` is not a valid describe()
/// object.
ClusterRole cluster_role(const nlohmann::json& describe);

}  // namespace strata::resolvers
