// SPDX-License-Identifier: Apache-2.0
// ClusterResolver "slurm": tf.distribute.cluster_resolver.
// SlurmClusterResolver. Reads the job step's environment once, at create
// time: SLURM_PROCID (this task's rank), SLURM_STEP_NUM_TASKS (else
// SLURM_NTASKS), SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) and
// SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE); ranks are laid out
// over the nodes in Slurm's default block order.
//
// Options (the constructor arguments):
//   "jobs":           {"ps": 1, "worker": 3}; default {"worker": <all tasks>};
//                     jobs take consecutive ranks in name order
//   "port_base":      8888; a task listens on port_base + its index on its node
//   "gpus_per_node":  default: entries of CUDA_VISIBLE_DEVICES, else the
//                     driver's count, else 0
//   "gpus_per_task":  default: gpus_per_node / tasks on this node
//   "tasks_per_node": instead of the environment's counts, as in TF: an
//                     integer (that many tasks on every node of the step's
//                     node list), or {"node1": 2, ...}, which names the nodes
//                     itself and needs no node list (nodes in name order
//                     then, in the node list's order when there is one)
//   "auto_set_gpu":   true: env_after sets CUDA_VISIBLE_DEVICES to this
//                     task's GPUs
//   "rpc_layer":      "grpc"
// Option "gpu_probe_timeout_s" is not a TF argument: the deadline of the
// `nvidia-smi -L` fallback (default 10). The instance is immutable after
// create, so describe() and master() never block.
#include <nlohmann/json.hpp>
#include <string>

#include "slurm.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace {

constexpr const char* kComponent = "cluster resolver 'slurm'";

class SlurmResolver final : public strata::sdk::ResolverBase {
 public:
  static constexpr const char* kSubsystem = "resolver.slurm";

  SlurmResolver(strata::sdk::Host host, const char* options_json) {
    nlohmann::json opts = strata::sdk::parse_options(options_json, kComponent);
    const double probe_s = strata::sdk::get_option<double>(opts, "gpu_probe_timeout_s", 10.0, kComponent);
    if (!(probe_s > 0 && probe_s <= 3600))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'gpu_probe_timeout_s' of ", kComponent,
                   " must be in (0, 3600] seconds, got ", probe_s);
    opts.erase("gpu_probe_timeout_s");
    r_ = strata::resolvers::resolve_slurm(strata::resolvers::SlurmEnv::from_environment(), opts,
                                          [&] { return strata::resolvers::count_driver_gpus(probe_s); });
    host.debug("rank ", r_.resolution.task_id.value_or(-1), " is ", r_.resolution.task_type.value_or("?"), " ",
               r_.resolution.task_id.value_or(-1), " on node ", r_.node, " (local index ", r_.local_index, ", GPUs '",
               r_.visible_devices, "')");
  }

  std::string describe() override { return r_.describe().dump(); }

  std::string master(const char* task_type, int32_t task_id, const char* rpc_layer) override {
    return r_.resolution.master(task_type, task_id, rpc_layer, "the slurm resolver");
  }

  /// A task of a Slurm job step: srun sets SLURM_PROCID and
  /// SLURM_STEP_NODELIST for every task. A batch script also has
  /// SLURM_PROCID (0) but is not a step: it stays a single process rather
  /// than waiting for peers that srun never started.
  static bool detect(const strata::sdk::Host&) {
    const char* v = std::getenv("SLURM_PROCID");
    const char* step = std::getenv("SLURM_STEP_NODELIST");
    return v != nullptr && v[0] != '\0' && step != nullptr && step[0] != '\0';
  }

 private:
  strata::resolvers::SlurmResult r_;
};

}  // namespace

STRATA_PLUGIN("strata slurm cluster resolver", "1.0.0", STRATA_RESOLVER_COMPONENT(SlurmResolver, "slurm", "1.0.0"))
