// SPDX-License-Identifier: Apache-2.0
// strata::Strategy (tf.distribute.Strategy), its Scope, StrategyExtended and
// ReplicaContext.
//
// A Strategy is a plugin instance (one_device, mirrored, central_storage,
// ...; "default" is built into core) driven through the C strategy vtable.
// Code is written once against this API:
//
//   auto strategy = strata::Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
//   auto scope = strategy.scope();                 // variables created now are the strategy's
//   strata::Variable w(strata::Tensor::zeros({4}, strata::DType::kFloat32),
//                      {"w", true, strata::Synchronization::ON_WRITE, strata::Aggregation::MEAN});
//   strata::PerReplica losses = strategy.run([&](strata::ReplicaContext& ctx) {
//     ...  // runs once per replica, each on its own thread
//     return loss_tensor;
//   });
//   strata::Tensor total = strategy.reduce(strata::ReduceOp::SUM, losses);
//
// Contexts (thread-local, as in TF): outside any scope a thread uses the
// Default strategy in its default replica context. Inside scope() the
// thread is in cross-replica context of that strategy. Inside run() every
// replica thread is in replica context (get_replica_context() is its
// ReplicaContext); inside merge_call() the merge function runs in
// cross-replica context. See distribute.hpp for the free functions.
//
// Ownership: a Strategy is a move-only handle; variables and scopes keep
// the underlying instance alive, so it is destroyed after the last of them.
// get_strategy() returns a non-owning handle valid while the instance lives.
//
// Threads and blocking: cross-replica calls (run, reduce, gather, variable
// creation, cross-replica variable access, ...) are serialised per strategy
// instance, so several user threads may share one Strategy. Replica-context
// collectives (all_reduce, all_gather, merge_call, ON_WRITE variable
// updates) must be called by every replica in the same order and block
// until all arrive, bounded by the strategy's collective timeout
// ("timeout_s", default 300 s); a missing replica is a
// DeadlineExceededError naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/c/strategy.h"
#include "strata/error.hpp"
#include "strata/export.hpp"
#include "strata/tensor.hpp"
#include "strata/values.hpp"

namespace strata {

class Config;
class Dataset;
class DistributedDataset;
struct InputOptions;
class Strategy;
class ReplicaContext;
class Variable;
namespace detail {
struct StrategyImpl;
}

/// What experimental_distribute_values_from_function passes to its function.
struct ValueContext {
  std::int32_t replica_id_in_sync_group = 0;
  std::int32_t num_replicas_in_sync = 1;
};

/// tf.distribute.InputContext: how this process's input relates to the job.
/// One input pipeline per worker process: a multi-worker strategy on worker
/// i of w gives {w, i, replicas in sync}; shard the data by
/// input_pipeline_id (e.g. take every num_input_pipelines-th file).
struct InputContext {
  int num_input_pipelines = 1;
  int input_pipeline_id = 0;
  int num_replicas_in_sync = 1;
  /// global_batch_size / num_replicas_in_sync; throws InvalidArgumentError
  /// when it does not divide evenly (as TF does).
  std::int64_t get_per_replica_batch_size(std::int64_t global_batch_size) const {
    STRATA_ENFORCE(num_replicas_in_sync > 0 && global_batch_size % num_replicas_in_sync == 0,
                   STRATA_ERR_INVALID_ARGUMENT, "the global batch size ", global_batch_size,
                   " is not divisible by num_replicas_in_sync ", num_replicas_in_sync,
                   "; pick a multiple of the replica count");
    return global_batch_size / num_replicas_in_sync;
  }
};

/// RAII guard returned by Strategy::scope(): the thread is in the
/// strategy's cross-replica context until it is destroyed. Move-only;
/// destroy it on the thread that created it, innermost first.
class STRATA_API Scope {
 public:
  Scope(Scope&& o) noexcept;
  Scope& operator=(Scope&&) = delete;
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope();

 private:
  friend class Strategy;
  explicit Scope(std::shared_ptr<detail::StrategyImpl> impl);
  std::shared_ptr<detail::StrategyImpl> impl_;
};

/// tf.distribute.StrategyExtended: placement facts and the cross-replica
/// building blocks. Obtained from Strategy::extended(); lives as long as
/// the strategy instance.
class STRATA_API StrategyExtended {
 public:
  explicit StrategyExtended(detail::StrategyImpl* impl) : impl_(impl) {}
  StrategyExtended(const StrategyExtended&) = delete;
  StrategyExtended& operator=(const StrategyExtended&) = delete;

  const std::vector<std::string>& worker_devices() const;
  const std::vector<std::string>& parameter_devices() const;
  int num_local_replicas() const;
  int worker_index() const;
  int num_workers() const;
  bool is_chief() const;
  /// The plugin's describe() JSON, verbatim.
  const std::string& describe_json() const;
  /// The InputContext of this process: {num_workers, worker_index,
  /// num_replicas_in_sync} (tf's distribute_datasets_from_function context).
  InputContext input_context() const;

  /// Cross-replica reduce of a value per local replica across all replicas
  /// in sync. Returns a host tensor.
  Tensor reduce_to(ReduceOp op, const DistributedValues& value);
  /// reduce_to for several values (one reduction each, in order).
  std::vector<Tensor> batch_reduce_to(ReduceOp op, const std::vector<const DistributedValues*>& values);
  /// A copy of `value` for every local replica.
  Mirrored broadcast_to(const TensorView& value);
  /// True when `v` was created under this strategy.
  bool variable_created_in_scope(const Variable& v) const;

  /// Switch the running job to transport `name` (a transport plugin, e.g.
  /// "tcp" or "libfabric") with `options_json`, e.g.
  /// set_transport("libfabric", R"({"provider": "tcp;ofi_rxm"})").
  /// Collective: every worker calls it at the same point of its program, in
  /// cross-replica context (FailedPreconditionError inside a replica
  /// function). Blocks until every worker has agreed and connected, bounded
  /// by a few collective timeouts. All or nothing: when the workers asked
  /// for different transports, or the transport cannot be created or
  /// connected on some worker, every worker throws the same error naming the
  /// workers and the cause, and the job keeps training on its old transport.
  /// Results do not depend on the transport. Strategies without a transport
  /// (one_device, mirrored, central_storage, default) and plugins built
  /// before ABI 1.2 throw UnimplementedError naming the strategy.
  void set_transport(const std::string& name, const std::string& options_json = "{}");

 private:
  detail::StrategyImpl* impl_;
};

class STRATA_API Strategy {
 public:
  /// Create strategy plugin `name` with `options_json` ("default" always
  /// gives the Default singleton, after validating the options), e.g.
  /// create("mirrored", R"({"devices":["cpu:0","cpu:1"]})"). Throws
  /// NotFoundError (listing the available strategies) for an unknown name
  /// and the plugin's InvalidArgumentError for bad options. Multi-process
  /// strategies are wired to their cluster first (see from_config).
  static Strategy create(const std::string& name, const std::string& options_json = "{}");
  /// Strategies that span processes (multi_worker_mirrored,
  /// parameter_server) are wired to the cluster first, unless the options
  /// already hold "cluster": the cluster resolver named in the job config's
  /// /cluster_resolver (default: "tf_config" when TF_CONFIG is set, else a
  /// single process) is described into option "cluster"; when the cluster
  /// has more than one chief/worker task, this process connects the
  /// rendezvous store (PluginHost::connect_store) once: the chief (chief 0,
  /// else worker 0) serves it on its cluster address, the others connect
  /// (auth token from STRATA_AUTH_TOKEN, deadline /timeouts/rendezvous_s,
  /// default 120 s), which blocks until the chief is up or the deadline
  /// passes. The job config's /transport becomes option "transport".
  ///
  /// Create the strategy a job config describes: /strategy/name (default
  /// "default") with /strategy/options, plus "cross_device_ops":
  /// {"name","options"} from /cross_device_ops and "timeout_s" from
  /// /timeouts/collective_s when present. Installs the config in the plugin
  /// host first (so plugins see it through get_config).
  static Strategy from_config(const Config& config);

  Strategy(Strategy&& o) noexcept;
  Strategy& operator=(Strategy&& o) noexcept;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;
  ~Strategy();

  /// Enter this strategy's cross-replica context on this thread. Nesting
  /// the same strategy is fine; entering while a different strategy is
  /// active throws FailedPreconditionError ("Mixing different strategies").
  Scope scope();

  /// Run `fn(ReplicaContext&)` once per local replica (each on its own
  /// thread, or the caller's for one replica) and wait for all. When `fn`
  /// returns a Tensor, run returns them as a PerReplica. An exception thrown
  /// by `fn` on any replica is rethrown here with its original type (the
  /// first one; other replicas' pending collectives are aborted). Calling
  /// run from inside a replica function throws FailedPreconditionError.
  template <class F>
  auto run(F&& fn) {
    using R = std::invoke_result_t<F&, ReplicaContext&>;
    if constexpr (std::is_void_v<R>) {
      run_replicas([&fn](ReplicaContext& ctx) { fn(ctx); });
    } else {
      static_assert(std::is_same_v<std::decay_t<R>, Tensor>,
                    "the replica function must return void or strata::Tensor");
      std::vector<Tensor> out(static_cast<std::size_t>(num_local_replicas()));
      run_replicas([&fn, &out](ReplicaContext& ctx) { out[local_id(ctx)] = fn(ctx); });
      return PerReplica(std::move(out));
    }
  }
  /// run with per-replica arguments (TF's run(fn, args)): replica i calls
  /// fn(ctx, args[i]). `args` must have one component per local replica.
  template <class F>
  auto run(F&& fn, const PerReplica& args) {
    check_per_replica_size(args, "run");
    return run([&fn, &args](ReplicaContext& ctx) { return fn(ctx, args[local_id(ctx)]); });
  }

  /// Reduce a per-replica value across replicas. With `axis`, each
  /// replica's value is first summed along `axis` (sizes may differ by
  /// replica), then summed across replicas; MEAN then divides by the global
  /// number of elements along `axis` (TF semantics). Cross-replica context
  /// only (FailedPreconditionError inside a replica function).
  Tensor reduce(ReduceOp op, const DistributedValues& value, std::optional<int> axis = std::nullopt);
  /// As above over several axes at once (tf.reduce_sum/reduce_mean's list
  /// of axes): each replica sums its value over `axes`, the sums are added
  /// across replicas, and MEAN divides by the number of elements the axes
  /// held on all replicas together. Each axis once; negative counts from
  /// the end.
  Tensor reduce(ReduceOp op, const DistributedValues& value, const std::vector<int>& axes);
  /// Reduce a non-distributed value (TF: the same value on every replica).
  /// One worker: MEAN returns it; SUM returns it with one replica in sync
  /// and throws InvalidArgumentError otherwise. Several workers (as TF's
  /// multi-worker reduce_to): each worker's value counts once, SUM adds them
  /// and MEAN averages them (a collective: every worker must call it). With
  /// `axis`, the value stands for a copy on every replica, reduced as above.
  Tensor reduce(ReduceOp op, const TensorView& value, std::optional<int> axis = std::nullopt);
  /// Reduce sparse rows, one IndexedSlices per local replica, across all
  /// replicas by gathering them (see ReplicaContext::all_reduce).
  IndexedSlices reduce(ReduceOp op, const std::vector<IndexedSlices>& per_replica);
  /// Concatenate every replica's value along `axis` (replica_id_in_sync_group
  /// order, across workers). Cross-replica context only.
  Tensor gather(const DistributedValues& value, int axis);
  /// The components held by this process (copies), in local replica order.
  std::vector<Tensor> experimental_local_results(const DistributedValues& value) const;
  /// A non-distributed value is its own only local result (a copy).
  std::vector<Tensor> experimental_local_results(const TensorView& value) const;
  /// Build a PerReplica by calling `fn` once per local replica (on this
  /// thread) with that replica's ValueContext.
  PerReplica experimental_distribute_values_from_function(
      const std::function<Tensor(const ValueContext&)>& fn);

  /// Split a dataset batched by the GLOBAL batch size across the replicas
  /// in sync and shard it across workers by its AutoShardPolicy
  /// (DatasetOptions). See distributed_data.hpp for the rules. Throws
  /// InvalidArgumentError for an unbatched dataset, FILE sharding with
  /// fewer files than workers, or a global batch smaller than the workers.
  DistributedDataset distribute_dataset(const Dataset& dataset);
  DistributedDataset distribute_dataset(const Dataset& dataset, const InputOptions& options);
  /// Build one dataset per input pipeline with `fn(InputContext)` (batched
  /// per replica, sharded by the function); see distributed_data.hpp.
  DistributedDataset distribute_datasets_from_function(const std::function<Dataset(const InputContext&)>& fn);
  DistributedDataset distribute_datasets_from_function(const std::function<Dataset(const InputContext&)>& fn,
                                                       const InputOptions& options);

  int num_replicas_in_sync() const;
  int num_local_replicas() const;
  StrategyExtended& extended() const;
  /// The plugin name, e.g. "mirrored".
  const std::string& name() const;
  /// Same underlying instance (handles from get_strategy() compare equal to
  /// the owning handle).
  bool operator==(const Strategy& o) const { return impl_ == o.impl_; }
  bool operator!=(const Strategy& o) const { return impl_ != o.impl_; }

  /// Internal: handle construction for core (owning or not).
  Strategy(detail::StrategyImpl* impl, std::shared_ptr<detail::StrategyImpl> owner);
  detail::StrategyImpl* impl() const { return impl_; }

 private:
  void run_replicas(const std::function<void(ReplicaContext&)>& fn);
  void check_per_replica_size(const PerReplica& args, const char* what) const;
  static std::size_t local_id(const ReplicaContext& ctx);
  detail::StrategyImpl* checked() const;
  detail::StrategyImpl* impl_ = nullptr;
  std::shared_ptr<detail::StrategyImpl> owner_;  // empty for non-owning handles
};

/// A replica's view of the strategy during run() (tf.distribute.ReplicaContext).
/// Valid only inside the replica function it was given to (or, for the
/// default replica context, for the life of the process). Not copyable.
class STRATA_API ReplicaContext {
 public:
  /// Internal: made by core for each replica of each run.
  ReplicaContext(detail::StrategyImpl* impl, strata_replica_t replica, std::uint32_t local_id);
  ReplicaContext(const ReplicaContext&) = delete;
  ReplicaContext& operator=(const ReplicaContext&) = delete;

  /// Global replica index in [0, num_replicas_in_sync).
  std::int32_t replica_id_in_sync_group() const { return replica_id_; }
  /// Index among this process's replicas.
  std::uint32_t local_replica_id() const { return local_id_; }
  int num_replicas_in_sync() const;
  Strategy& strategy() const;

  /// All-reduce one tensor across all replicas; returns a new tensor.
  /// Collective (every replica must call it).
  Tensor all_reduce(ReduceOp op, const TensorView& value);
  /// Batch all-reduce: one collective for all `values`.
  std::vector<Tensor> all_reduce(ReduceOp op, const std::vector<Tensor>& values);
  /// Zero-copy batch all-reduce writing the results into the given
  /// tensors' memory (which must be writable host memory).
  void all_reduce_in_place(ReduceOp op, std::vector<Tensor>& values);
  void all_reduce_in_place(ReduceOp op, const std::vector<TensorView>& values);
  /// All-gather along `axis` (sizes along axis may differ by replica).
  Tensor all_gather(const TensorView& value, int axis);
  /// All-reduce of sparse rows as tf.distribute does it: every replica's
  /// values and indices gathered (replica order), not densified; MEAN
  /// divides the values by num_replicas_in_sync. Every replica's dense_shape
  /// must be the same (InvalidArgumentError naming the replica otherwise).
  IndexedSlices all_reduce(ReduceOp op, const IndexedSlices& value);

  /// merge_call: `fn(strategy)` runs once, in cross-replica context, while
  /// every replica waits. Collective.
  void merge_call(const std::function<void(Strategy&)>& fn);
  /// merge_call with a per-replica argument: fn sees every replica's `arg`
  /// (zero-copy, in local replica order) and its result is returned to
  /// every replica (each gets a copy).
  Tensor merge_call(const std::function<Tensor(Strategy&, const PerReplica&)>& fn,
                    const TensorView& arg);
  /// As above, but fn returns a PerReplica and each replica gets its own
  /// component.
  Tensor merge_call_per_replica(
      const std::function<PerReplica(Strategy&, const PerReplica&)>& fn, const TensorView& arg);

  /// The CUDA stream (cudaStream_t, as void*) of this replica's GPU, on
  /// which the strategy orders its own copies for the replica: enqueue
  /// your kernels and copies here (libtorch: c10::cuda::getStreamFromExternal).
  /// The strategy waits for it before a collective reads this replica's
  /// tensors and before run() returns. NULL for a replica on a host device
  /// (and for strategies from before ABI 1.4). The device is already
  /// current on the replica's thread.
  void* stream() const;

  /// Internal: the C handle (NULL never for a live context).
  strata_replica_t handle() const { return replica_; }
  detail::StrategyImpl* impl() const { return impl_; }

 private:
  detail::StrategyImpl* impl_;
  strata_replica_t replica_;
  std::uint32_t local_id_;
  std::int32_t replica_id_;
};

inline std::size_t Strategy::local_id(const ReplicaContext& ctx) { return ctx.local_replica_id(); }

}  // namespace strata
