// SPDX-License-Identifier: Apache-2.0
// MultiWorkerMirroredStrategy (tf.distribute.MultiWorkerMirroredStrategy):
// synchronous data parallelism over several processes ("workers"), each
// with one replica per local device. Variables are mirrored on every
// replica of every worker and kept equal by all-reducing across all of them
// through a CrossDeviceOps that spans processes ("ring" over a transport,
// "auto" by default: same-host peers over shared memory, others over tcp or RDMA).
//
// Options:
//   {"devices": ["cpu:0", ...]          local devices (default: every GPU this process
//                                       sees, as tf.distribute's MultiWorkerMirroredStrategy
//                                       uses every local GPU, else ["cpu:0"]; strata-run
//                                       gives each local worker its own GPUs through
//                                       CUDA_VISIBLE_DEVICES, see its --gpus),
//    "cluster": {...}                   a cluster resolver's describe() JSON
//                                       ({"cluster_spec", "task_type", "task_id", ...});
//                                       core injects it; absent = one worker,
//    "communication": {"implementation": "AUTO" | "RING" | "NCCL",
//                      "bytes_per_pack": 0, "timeout_seconds": null}
//                                       (tf.distribute.experimental.CommunicationOptions;
//                                       RING: the "ring" cross_device_ops over "transport";
//                                       NCCL: the "nccl" cross_device_ops over the "nccl"
//                                       transport, CUDA builds only, every device a GPU;
//                                       AUTO: NCCL when this is a CUDA build and every
//                                       device is "gpu:N"/"cuda:N", else RING; RING too
//                                       when STRATA_GPUS_SHARED=1 (strata-run's word that
//                                       local workers share GPUs, which NCCL refuses).
//                                       describe() reports the choice as "communication"),
//    "cross_device_ops": {"name", "options"}   override (must span processes),
//    "transport": {"name": "auto", "options": {...}}  what the ring runs over (default auto),
//    "timeout_s": 300}                  collective deadline
//
// Ranks (the collective group): the chief task (if any) is rank 0, then the
// worker tasks in index order; world size = chiefs + workers. An evaluator
// task does not join the group: it gets a one-worker strategy over its
// local devices and is its chief, as TF's evaluator runs standalone. A ps
// task is an error (use parameter_server), and so is a cluster spec that
// names no task for this process. The rendezvous store must
// already reach the chief when there is more than one worker: core's
// Strategy::create / from_config connects it before creating this strategy.
//
// Each instance gets its own communicator, "mwms/<n>" where n counts the
// instances created in this process, so every worker must create its
// multi_worker_mirrored strategies in the same order (as in TF).
//
// set_transport (ABI 1.2) is forwarded to the cross_device_ops ("ring"
// implements it); the single-process strategies (one_device, mirrored,
// central_storage) leave it NULL, which callers report as UNIMPLEMENTED.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/config.h"
#include "strata/sdk/device.hpp"
#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

using nlohmann::json;

constexpr const char* kComp = "multi_worker_mirrored strategy";

std::atomic<uint64_t> g_instances{0};

// True when STRATA_GPUS_SHARED=1: strata-run started more local workers than
// there are GPUs, so they share them (see its --gpus).
bool gpus_shared() {
  const char* v = std::getenv("STRATA_GPUS_SHARED");
  return v != nullptr && std::string(v) == "1";
}

// True when option 'devices' lists only GPUs ("gpu:N" / "cuda:N"). Decided
// from the names, so the choice does not depend on how the SDK parses them.
bool all_gpu_devices(const json& o) {
  const auto it = o.find("devices");
  if (it == o.end() || !it->is_array() || it->empty()) return false;
  for (const auto& d : *it) {
    if (!d.is_string()) return false;
    const std::string s = d.get<std::string>();
    if (s.rfind("gpu:", 0) != 0 && s.rfind("cuda:", 0) != 0) return false;
  }
  return true;
}

// This process's place in the collective group.
struct Placement {
  uint32_t rank = 0;
  uint32_t world = 1;
  bool is_chief = true;
  json task_type;  // null when the cluster is a single process
  json task_id;
};

// Sorted task indices of one job of a cluster spec (list or sparse dict).
std::vector<int64_t> job_indices(const json& spec, const std::string& job) {
  std::vector<int64_t> out;
  if (!spec.contains(job)) return out;
  const json& j = spec.at(job);
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) out.push_back(static_cast<int64_t>(i));
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k.empty() || k.size() > 9 || k.find_first_not_of("0123456789") != std::string::npos)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": option 'cluster': job '", job, "' has task index '", k,
                     "', which is not a non-negative integer");
      out.push_back(std::stoll(k));
    }
    std::sort(out.begin(), out.end());
  } else {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": option 'cluster': job '", job,
                 "' must be a list of addresses or an {index: address} object; got ", j.dump());
  }
  return out;
}

Placement place(const json& cluster) {
  Placement p;
  if (cluster.is_null()) return p;
  if (!cluster.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp,
                 ": option 'cluster' must be a cluster resolver's describe() object; got ", cluster.dump());
  const json spec = cluster.value("cluster_spec", json::object());
  if (!spec.is_object() && !spec.is_null())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": option 'cluster': cluster_spec must be an object; got ",
                 spec.dump());
  p.task_type = cluster.value("task_type", json());
  p.task_id = cluster.value("task_id", json());
  if (spec.is_null() || spec.empty()) return p;  // a single process
  if (p.task_type.is_null())
    // As tf.distribute's CollectiveAllReduceExtended: a cluster without this
    // process's task cannot say which worker it is.
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": the cluster spec ", spec.dump(),
                 " names no task for this process; set \"task\": {\"type\": ..., \"index\": N} in TF_CONFIG "
                 "(or the resolver's task_type/task_id), or remove the cluster to run as one process");
  if (!p.task_type.is_string())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": option 'cluster': task_type must be a string; got ",
                 p.task_type.dump());
  if (!p.task_id.is_number_integer() || p.task_id.get<int64_t>() < 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": option 'cluster': task_id must be a non-negative integer; got ",
                 p.task_id.dump(), " (set \"task\": {\"type\": ..., \"index\": N} in TF_CONFIG)");
  const std::string type = p.task_type.get<std::string>();
  const int64_t id = p.task_id.get<int64_t>();
  if (type == "ps")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp,
                 ": this process is a parameter server task (ps ", id,
                 "); multi_worker_mirrored has no parameter servers: use the parameter_server strategy, "
                 "or remove the \"ps\" job from the cluster spec");
  if (type == "evaluator") {
    // A standalone evaluator: its own one-worker group, and (as in
    // multi_worker_util.is_chief) the chief of it.
    return p;
  }
  if (type != "chief" && type != "worker")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": task type '", type,
                 "' cannot join multi_worker_mirrored; its tasks are \"chief\" (at most one) and \"worker\" "
                 "(plus a standalone \"evaluator\")");
  const std::vector<int64_t> chiefs = job_indices(spec, "chief");
  const std::vector<int64_t> workers = job_indices(spec, "worker");
  if (chiefs.size() > 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": option 'cluster': the \"chief\" job has ", chiefs.size(),
                 " tasks; there must be at most one chief");
  const std::vector<int64_t>& mine = type == "chief" ? chiefs : workers;
  const auto it = std::find(mine.begin(), mine.end(), id);
  if (it == mine.end())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": this task (", type, " ", id,
                 ") is not in the cluster spec ", spec.dump(), "; fix the task index or the cluster");
  p.world = static_cast<uint32_t>(chiefs.size() + workers.size());
  p.rank = type == "chief" ? 0 : static_cast<uint32_t>(chiefs.size() + (it - mine.begin()));
  p.is_chief = p.rank == 0;
  return p;
}

sdk::LocalStrategyConfig make_config(const sdk::Host& host, const char* options_json) {
  json o = sdk::parse_options(options_json, kComp);
  // Without "devices": every visible GPU, else the host (decided here, not
  // in LocalStrategy, because AUTO below depends on it).
  if (!o.contains("devices")) {
    const int32_t gpus = sdk::visible_gpu_count(host);
    if (gpus > 0) {
      json devs = json::array();
      for (int32_t g = 0; g < gpus; ++g) devs.push_back("gpu:" + std::to_string(g));
      o["devices"] = devs;
      host.info(kComp, ": no \"devices\" option, so every visible GPU is a replica: ", devs.dump(),
                gpus_shared() ? " (shared with other local workers: STRATA_GPUS_SHARED=1)" : "");
    }
  }
  sdk::check_known_keys(o, {"devices", "cluster", "communication", "cross_device_ops", "transport", "timeout_s"},
                        kComp);
  sdk::LocalStrategyConfig cfg;
  cfg.strategy_name = "multi_worker_mirrored";
  cfg.placement = sdk::VariablePlacement::kPerReplica;
  sdk::parse_common_options(o, cfg, /*allow_devices=*/true);
  const bool cdo_override = o.contains("cross_device_ops");

  // CommunicationOptions.
  std::string impl = "AUTO";
  int64_t bytes_per_pack = 0;
  const json comm = o.value("communication", json::object());
  if (!comm.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'communication' of ", kComp,
                 " must be an object like {\"implementation\": \"RING\", \"bytes_per_pack\": 0}; got ", comm.dump());
  sdk::check_known_keys(comm, {"implementation", "bytes_per_pack", "timeout_seconds"},
                        "option 'communication' of " + std::string(kComp));
  impl = sdk::get_option<std::string>(comm, "implementation", impl, kComp);
  for (auto& c : impl) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  bytes_per_pack = sdk::get_option<int64_t>(comm, "bytes_per_pack", 0, kComp);
  if (bytes_per_pack < 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'communication.bytes_per_pack' of ", kComp,
                 " must be >= 0 (0 = the cross_device_ops default); got ", bytes_per_pack);
  if (comm.contains("timeout_seconds") && !comm.at("timeout_seconds").is_null()) {
    cfg.timeout_s = sdk::get_option<double>(comm, "timeout_seconds", cfg.timeout_s, kComp);
    if (!(cfg.timeout_s > 0) || cfg.timeout_s > 1e7)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'communication.timeout_seconds' of ", kComp,
                   " must be a number of seconds in (0, 1e7] or null; got ", comm.at("timeout_seconds").dump());
  }
  if (impl != "AUTO" && impl != "RING" && impl != "NCCL")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'communication.implementation' of ", kComp,
                 " must be \"AUTO\", \"RING\" or \"NCCL\"; got \"", impl, "\"");
  const bool all_gpu = all_gpu_devices(o);
#if STRATA_HAVE_CUDA
  if (impl == "NCCL" && !all_gpu)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp,
                 ": communication implementation NCCL needs every replica on a GPU, but option 'devices' is ",
                 o.value("devices", json::array({"cpu:0"})).dump(),
                 "; list GPUs (\"devices\": [\"gpu:0\", ...]) or use \"AUTO\" or \"RING\" for CPU devices");
  const std::string chosen = impl == "AUTO" ? (all_gpu && !gpus_shared() ? "NCCL" : "RING") : impl;
  if (impl == "NCCL" && gpus_shared())
    host.warn(kComp, ": communication NCCL with STRATA_GPUS_SHARED=1: NCCL refuses two ranks on one GPU, so "
              "setup will fail if local workers share one; use \"AUTO\" or \"RING\" to share GPUs");
#else
  if (impl == "NCCL")
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, kComp,
                 ": communication implementation NCCL needs a CUDA build; this build has host devices "
                 "only: use \"AUTO\" or \"RING\"");
  (void)all_gpu;
  const std::string chosen = "RING";
#endif

  // NCCL runs over the "nccl" transport unless one is named.
  json transport = o.value("transport", json{{"name", chosen == "NCCL" ? "nccl" : "auto"}});
  if (transport.is_string()) transport = json{{"name", transport}};
  if (!transport.is_object() || !transport.contains("name") || !transport.at("name").is_string())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'transport' of ", kComp,
                 " must be {\"name\": \"tcp\", \"options\": {...}}; got ", transport.dump());
  sdk::check_known_keys(transport, {"name", "options", "path"}, "option 'transport' of " + std::string(kComp));
  transport.erase("path");  // explicit libraries are loaded by the host from the job config

  const Placement p = place(o.value("cluster", json()));
  cfg.worker_index = p.rank;
  cfg.num_workers = p.world;
  cfg.is_chief = p.is_chief;
  cfg.describe_extra = json{{"task_type", p.task_type},
                            {"task_id", p.task_id},
                            {"communication", chosen}};

  // The cross-process CrossDeviceOps: rank, world size and communicator
  // always come from the cluster; the rest from the options unless the
  // override sets them.
  if (!cdo_override) cfg.cross_device_ops = chosen == "NCCL" ? "nccl" : "ring";
  json cdo = json::parse(cfg.cross_device_ops_options);
  cdo["rank"] = p.rank;
  cdo["world_size"] = p.world;
  cdo["communicator"] = "mwms/" + std::to_string(g_instances.fetch_add(1));
  if (!cdo.contains("timeout_s")) cdo["timeout_s"] = cfg.timeout_s;
  if (!cdo.contains("transport")) cdo["transport"] = transport;
  if (bytes_per_pack > 0 && !cdo.contains("bytes_per_pack")) cdo["bytes_per_pack"] = bytes_per_pack;
  cfg.cross_device_ops_options = cdo.dump();
  return cfg;
}

class MultiWorkerMirroredStrategy : public sdk::LocalStrategy {
 public:
  static constexpr const char* kSubsystem = "strategy.multi_worker_mirrored";
  MultiWorkerMirroredStrategy(sdk::Host host, const char* options_json)
      : LocalStrategy(host, make_config(host, options_json)) {}
  // ABI 1.2: the transport belongs to the cross_device_ops, which runs the
  // agreement among the workers and the switch.
  void set_transport(const std::string& name, const std::string& options_json) {
    forward_set_transport(name, options_json);
  }
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata multi_worker_mirrored strategy", "0.1.0",
              STRATA_STRATEGY_COMPONENT(strata::plugins::MultiWorkerMirroredStrategy, "multi_worker_mirrored",
                                        "0.1.0"))
