// SPDX-License-Identifier: Apache-2.0
// Slurm's environment as tf.distribute's SlurmClusterResolver reads it:
// hostlists ("t02n13,t03n[01-03]"), tasks-per-node lists ("2(x3),1"), the
// block distribution of ranks over nodes, the jobs split, ports and GPUs.
//
// resolve_slurm() is a pure function of its inputs (an SlurmEnv snapshot,
// the options and a GPU-count callback), so every rule can be tested without
// a Slurm allocation; SlurmEnv::from_environment() and count_driver_gpus()
// are the only parts that touch the process (getenv, /proc, nvidia-smi).
//
// Errors: malformed input throws strata::InvalidArgumentError naming the
// variable or option at fault and the fix; nothing else except bad_alloc
// (count_driver_gpus never throws: no driver means 0 GPUs).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster_spec.h"

namespace strata::resolvers {

/// Expand a Slurm hostlist: comma-separated items (commas inside brackets do
/// not split), each item literal text and bracket groups "[1-3,07,10-12]";
/// several groups expand as a cartesian product, leftmost outermost; a range
/// keeps the zero padding of its lower bound ("[08-10]" -> 08 09 10).
/// `origin` names the source in errors (e.g. "SLURM_STEP_NODELIST").
/// At most kMaxHosts hosts.
std::vector<std::string> expand_hostlist(std::string_view list, const std::string& origin);

/// Expand a tasks-per-node list: "2(x3),1" -> {2, 2, 2, 1}. Every count and
/// repetition is a positive decimal integer.
std::vector<int32_t> expand_tasks_per_node(std::string_view text, const std::string& origin);

/// Where each rank runs: its node index and its index among that node's
/// tasks, for Slurm's node-level distributions. `block`: ranks fill node 0,
/// then node 1, ...; `cyclic`: ranks go round-robin over the nodes that
/// still have room; `plane` with size p: blocks of p consecutive ranks go
/// round-robin. `tasks_per_node` gives each node's capacity.
struct TaskPlace {
  int32_t node = 0;
  int32_t local = 0;
};
std::vector<TaskPlace> lay_out_tasks(const std::vector<int32_t>& tasks_per_node, const std::string& distribution,
                                     int64_t plane_size);

constexpr std::size_t kMaxHosts = 1u << 20;

/// The Slurm variables the resolver reads, with the name each came from.
struct SlurmEnv {
  std::optional<std::string> procid;     ///< SLURM_PROCID
  std::optional<std::string> num_tasks;  ///< SLURM_STEP_NUM_TASKS, else SLURM_NTASKS
  std::string num_tasks_var = "SLURM_STEP_NUM_TASKS";
  std::optional<std::string> nodelist;  ///< SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
  std::string nodelist_var = "SLURM_STEP_NODELIST";
  std::optional<std::string> tasks_per_node;  ///< SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE
  std::string tasks_per_node_var = "SLURM_STEP_TASKS_PER_NODE";
  std::optional<std::string> cuda_visible_devices;  ///< CUDA_VISIBLE_DEVICES
  /// SLURM_DISTRIBUTION (srun -m): how ranks are laid out over the nodes;
  /// "block" (the default), "cyclic" or "plane" (with SLURM_DIST_PLANESIZE).
  /// Only the part before ':' (the node level) matters here.
  std::optional<std::string> distribution;
  std::optional<std::string> plane_size;  ///< SLURM_DIST_PLANESIZE

  /// Snapshot of the current process environment (empty values count as unset).
  static SlurmEnv from_environment();
};

/// GPUs the NVIDIA driver reports: entries of /proc/driver/nvidia/gpus, else
/// the "GPU n:" lines of `nvidia-smi -L` (killed after `timeout_s`), else 0.
int32_t count_driver_gpus(double timeout_s);

/// Everything resolved for this task.
struct SlurmResult {
  Resolution resolution;           ///< cluster, task type/id, rpc_layer, num_accelerators
  std::vector<std::string> hosts;  ///< the expanded node list
  std::vector<int32_t> tasks_per_node;
  std::string node;         ///< this task's node
  int32_t local_index = 0;  ///< this task's index among the tasks of its node
  int32_t gpus_per_node = 0;
  int32_t gpus_per_task = 0;
  std::string visible_devices;  ///< this task's GPUs ("" when none)
  nlohmann::json env_after = nlohmann::json::object();

  /// Resolution::describe() with env_after and a "slurm" object (node,
  /// local_index, gpus_per_node, gpus_per_task, visible_devices).
  nlohmann::json describe() const;
};

/// Resolve with SlurmClusterResolver's constructor arguments as options:
/// jobs, port_base, gpus_per_node, gpus_per_task, tasks_per_node,
/// auto_set_gpu, rpc_layer (see plugins/resolvers/slurm). `driver_gpus` is
/// called only when gpus_per_node is not given and CUDA_VISIBLE_DEVICES is
/// unset.
SlurmResult resolve_slurm(const SlurmEnv& env, const nlohmann::json& options,
                          const std::function<int32_t()>& driver_gpus);

}  // namespace strata::resolvers
