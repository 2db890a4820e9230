// SPDX-License-Identifier: Apache-2.0
// LocalStrategy: a complete StrategyBase for strategies whose replicas are
// threads of this process (one_device, mirrored, central_storage).
//
// Execution. A persistent pool of worker threads, one per replica beyond the
// first; `run` executes replica 0 on the caller's thread and wakes the
// workers through a generation counter (short spin, then a condition
// variable), so a run allocates nothing. run from inside a replica function
// is FAILED_PRECONDITION.
//
// Collectives. Replica-context calls (all_reduce, all_gather, merge_call,
// ON_WRITE updates) meet at a rendezvous: each replica deposits its
// arguments, the last to arrive validates that every replica issued the same
// collective (same kind, op, dtypes, counts; INVALID_ARGUMENT naming both
// replicas otherwise) and performs it for all with the CrossDeviceOps, then
// releases the others; with split_all_reduce, a large all-reduce is instead
// shared out among all the replica threads (see LocalStrategyConfig). A replica that does not arrive within timeout_s fails
// the waiting ones with DEADLINE_EXCEEDED naming the missing replica ids.
// When a replica function fails, pending and later collectives of that run
// fail with ABORTED and run returns the first failure.
//
// Variables follow tf.distribute (see strata/c/strategy.h): ON_WRITE
// variables get one copy per replica (VariablePlacement::kPerReplica,
// mirrored) or one copy on the parameter device (kSingleCopy,
// central_storage, one_device); ON_READ variables always get one copy per
// replica (they are per-replica accumulators, as in TF).
//
// Several workers (num_workers > 1, multi_worker_mirrored). Every process
// runs one LocalStrategy with the same number of local replicas; replica ids
// are global (worker_index * local + local id) and every CrossDeviceOps call
// spans all workers, so: replica all_reduce, reduce_to and SUM/MEAN variable
// updates reduce over all replicas in sync; all_gather and gather_to
// concatenate every worker's replicas in replica_id_in_sync_group order
// (the sizes along the axis are exchanged first); cross-replica reads of
// ON_READ variables aggregate across workers (ONLY_FIRST_REPLICA reads
// global replica 0's copy), so such reads are collectives too; variable
// initial values are broadcast from worker 0 at creation, so every worker
// starts from the chief's values (as TF's MultiWorkerMirroredStrategy
// does), and variable creation is a collective. ONLY_FIRST_REPLICA updates
// in replica context apply each worker's first local replica's value (as
// in TF, where the value is identical after an all-reduce). Every worker
// must issue the same collectives in the same order; the CrossDeviceOps
// detects mismatches and dead peers within its timeout.
//
// GPU replicas ("gpu:<n>" / "cuda:<n>", ABI 1.4; the SDK reaches CUDA
// through the host services only). Creation checks the devices with the
// host: FAILED_PRECONDITION "no CUDA device visible: ..." without a GPU,
// INVALID_ARGUMENT naming the ordinal and the visible count when one is out
// of range. Each GPU replica owns a non-blocking stream (replica_stream),
// created with the strategy, and its thread makes the device current once.
// A collective first waits for the arriving replica's stream, and run waits
// for every replica's stream before it returns, so host code and other
// streams see finished tensors. A variable copy on a GPU lives in that
// GPU's memory; an update stages it through host memory (copy to host,
// apply the host kernel, copy back, synchronously): correct, not fast (two
// PCIe copies per copy per update). Reads in replica context return a
// tensor on the copy's device; reads in cross-replica context return a host
// tensor (as .numpy() does in TF). Collectives of GPU tensors go to the
// cross_device_ops as they are: the SDK's LocalCrossDeviceOps (and its
// subclasses) stage them through pinned host memory, giving the same bits
// as host replicas; the split all-reduce handles host tensors only (GPU
// tensors take one staged call). A replica all_gather of a GPU tensor
// returns a tensor on that GPU; gather_to (cross-replica) of GPU tensors
// returns a host tensor.
//
// Thread-safety: cross-replica methods are serialised by the host (ABI
// contract); replica-context methods are called concurrently by the replica
// threads of the current run. save_state/restore_state are not provided
// (these strategies keep no private state besides variables).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/sdk/plugin.hpp"

namespace strata::sdk {

enum class VariablePlacement { kPerReplica, kSingleCopy };

struct LocalStrategyConfig {
  std::string strategy_name = "local";          ///< for messages and describe
  /// One replica per device, in order: "cpu:<n>", "gpu:<n>" or "cuda:<n>".
  std::vector<std::string> devices{"cpu:0"};
  /// Set by parse_common_options when the options named "devices".
  bool devices_given = false;
  /// true: without a "devices" option (devices_given false, devices still
  /// the default {"cpu:0"}) and with one worker, use every visible GPU
  /// ("gpu:0".."gpu:<k-1>"), as tf.distribute's MirroredStrategy does; with
  /// none visible, "cpu:0". one_device sets it false (it names its device);
  /// multi_worker_mirrored is left out until its plugin opts in.
  bool default_to_gpus = true;
  VariablePlacement placement = VariablePlacement::kPerReplica;
  std::string parameter_device;                 ///< kSingleCopy; "" = devices[0]
  /// CrossDeviceOps plugin; "" = the SDK's built-in LocalCrossDeviceOps.
  std::string cross_device_ops;
  /// When not empty and every replica ends up on a GPU (named, or the
  /// every-visible-GPU default), this replaces cross_device_ops and the
  /// all-reduce is not split (mirrored: "nccl" in a CUDA build, unless the
  /// options named a cross_device_ops).
  std::string gpu_cross_device_ops;
  std::string cross_device_ops_options = "{}";
  double timeout_s = 300;                       ///< collective deadline
  /// true: the cross_device_ops works within this process only and its
  /// instances are independent, so the strategy makes one per local replica
  /// and cuts a large replica all-reduce (at least 128 KiB per replica) into
  /// element ranges that the replica threads take in turn, each reducing
  /// its ranges through its own instance: every replica thread reduces, none
  /// does it all. Elementwise, in replica order, so the results are the same
  /// bits as one call would give. Used only with one worker; false (the
  /// default) for a cross_device_ops that spans processes or keeps state.
  bool split_all_reduce = false;
  /// true: an ON_WRITE update in replica context with aggregation NONE is
  /// FAILED_PRECONDITION (mirrored, central_storage). false (one_device):
  /// with a single replica the value is applied as is, as TF's plain variables do.
  bool require_aggregation = true;

  // ---- several workers (multi_worker_mirrored) ----
  /// This process's rank in the collective group, in [0, num_workers).
  uint32_t worker_index = 0;
  /// Processes (workers) in the collective group, each with devices.size()
  /// replicas (every worker must have the same number). With more than one,
  /// cross_device_ops must name a CrossDeviceOps that spans processes and is
  /// configured with this rank and world size (e.g. "ring"): it must reduce
  /// across all workers (MEAN dividing by the global replica count itself),
  /// all_gather in (rank, local replica) order, and broadcast rank 0's value.
  uint32_t num_workers = 1;
  /// Reported by describe(); the chief writes checkpoints and summaries.
  bool is_chief = true;
  /// Extra fields merged into describe()'s JSON object (e.g. the task).
  nlohmann::json describe_extra = nlohmann::json::object();
};

/// "cpu:<n>", "gpu:<n>" or "cuda:<n>" -> n (syntax only: whether the GPU
/// exists is checked when the strategy is created, through the host);
/// anything else INVALID_ARGUMENT naming `option`. See parse_device_spec.
int parse_device(const std::string& device, const std::string& option);
/// Validate a JSON array of unique device names (non-empty).
std::vector<std::string> parse_device_list(const nlohmann::json& value, const std::string& option);
/// Read the common options into `cfg`: "devices" (when allow_devices),
/// "cross_device_ops" ({"name", "options"} or a name string) and "timeout_s".
void parse_common_options(const nlohmann::json& options, LocalStrategyConfig& cfg, bool allow_devices);

class LocalStrategy : public StrategyBase {
 public:
  LocalStrategy(Host host, LocalStrategyConfig config);
  ~LocalStrategy() override;

  std::string describe() override;
  void run(strata_replica_fn fn, void* user) override;
  int32_t replica_id_in_sync_group(strata_replica_t r) override;
  void replica_all_reduce(strata_replica_t r, strata_reduce_op op, uint32_t num_tensors,
                          const DLTensor* const* inputs, DLTensor* const* outputs) override;
  DLManagedTensor* replica_all_gather(strata_replica_t r, const DLTensor& input, int32_t axis) override;
  void replica_merge_call(strata_replica_t r, strata_merge_fn fn, void* merge_user, void* replica_arg) override;
  void reduce_to(strata_reduce_op op, uint32_t num_values, const DLTensor* const* values,
                 DLTensor& output) override;
  DLManagedTensor* gather_to(uint32_t num_values, const DLTensor* const* values, int32_t axis) override;
  strata_variable_t variable_create(const strata_variable_desc& desc, const DLTensor& initial) override;
  void variable_destroy(strata_variable_t v) noexcept override;
  DLManagedTensor* variable_read(strata_variable_t v, strata_replica_t r) override;
  void variable_update(strata_variable_t v, strata_replica_t r, strata_var_update_op op,
                       const DLTensor& value) override;
  /// ABI 1.4: replica r's CUDA stream, NULL for a host replica.
  void* replica_stream(strata_replica_t r) noexcept;
  /// ABI 1.1 variable_view: a borrowed view of replica r's (or the primary)
  /// copy, in device memory (kDLCUDA) for a copy on a GPU.
  DLTensor variable_view(strata_variable_t v, strata_replica_t r);
  /// Hand an ABI 1.2 set_transport to the cross_device_ops plugin (a
  /// subclass that spans processes declares set_transport and calls this;
  /// LocalStrategy itself does not declare it, so the single-process
  /// strategies keep the slot NULL). UNIMPLEMENTED naming the strategy when
  /// the cross_device_ops is the built-in one (it has no transport) or its
  /// plugin has no set_transport. Cross-replica context only; blocks as the
  /// plugin's set_transport does (see strata/c/cross_device_ops.h).
  void forward_set_transport(const std::string& name, const std::string& options_json);

  /// Local replicas (devices) of this process.
  uint32_t num_replicas() const;
  /// Replicas in sync across all workers (num_workers * local).
  uint32_t num_replicas_in_sync() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::sdk
