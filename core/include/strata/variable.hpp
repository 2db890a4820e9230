// SPDX-License-Identifier: Apache-2.0
// strata::Variable (tf.Variable under a distribution strategy).
//
// A Variable is created from an initial value under the current strategy:
// inside strategy.scope() it belongs to that strategy (mirrored copies,
// central storage, ... per its placement policy); outside any scope to the
// Default strategy (one copy). Creating one inside run() (replica context)
// is a FailedPreconditionError: create variables under scope() instead.
//
// Semantics follow TF's MirroredVariable / SyncOnReadVariable and are
// enforced by the strategy plugin (errors surface where TF raises them):
//  - ON_WRITE (AUTO): copies are kept equal. In replica context, an update
//    is a collective that aggregates every replica's value per the
//    aggregation (NONE: FailedPreconditionError) and applies it to every
//    copy. In cross-replica context an update applies to every copy.
//  - ON_READ: each replica updates its own copy; a cross-replica read
//    aggregates the copies (SUM/MEAN/ONLY_FIRST_REPLICA; NONE:
//    FailedPreconditionError). A cross-replica assign of a SUM variable
//    stores value / num_replicas per copy; assign_add/assign_sub there are
//    FailedPreconditionError. ON_READ variables cannot be trainable.
//  - NONE synchronization is rejected (InvalidArgumentError), as in TF.
// value()/read_value() return copies: in replica context that replica's
// copy, in cross-replica context the primary (ON_WRITE) or the aggregate
// (ON_READ). On a GPU strategy a replica-context read is a tensor on the
// copy's GPU (use it in kernels, or .to("cpu:0")); a cross-replica read
// is a host tensor (as .numpy() in TF). read_view() is nullopt for a copy
// in GPU memory. read_view() borrows the memory without copying where the
// plugin supports it.
//
// Ownership: move-only; keeps its strategy instance alive. Thread-safety:
// as TF variables, updates from several replicas follow the collective
// rules above; cross-replica accesses are serialised with the strategy's
// other cross-replica calls.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/c/strategy.h"
#include "strata/export.hpp"
#include "strata/strategy.hpp"
#include "strata/tensor.hpp"

namespace strata {

class RemoteVariable;

/// tf.VariableSynchronization.
enum class Synchronization { AUTO, ON_WRITE, ON_READ, NONE };
/// tf.VariableAggregation.
enum class Aggregation { NONE, SUM, MEAN, ONLY_FIRST_REPLICA };

STRATA_API const char* synchronization_name(Synchronization s);
STRATA_API const char* aggregation_name(Aggregation a);
/// tf.distribute.ReduceOp.from_variable_aggregation: SUM and MEAN map to
/// themselves; NONE and ONLY_FIRST_REPLICA have no reduce op
/// (InvalidArgumentError, TF's ValueError).
STRATA_API ReduceOp reduce_op_from_aggregation(Aggregation a);

struct VariableOptions {
  std::string name;
  bool trainable = true;
  Synchronization synchronization = Synchronization::AUTO;
  Aggregation aggregation = Aggregation::NONE;
};

class STRATA_API Variable {
 public:
  /// Create under the current strategy (see the file comment) with a copy
  /// of `initial`.
  explicit Variable(const TensorView& initial, VariableOptions options = {});
  /// parameter_server strategy, on a worker: this process's handle on a
  /// variable the chief created under the strategy's scope and passed to a
  /// scheduled function (get_arg<RemoteVariable>). Under the current
  /// strategy (a parameter_server strategy), outside run(); name,
  /// synchronization, aggregation and trainable are the chief's. Updates in
  /// replica context aggregate the local replicas' values per the
  /// aggregation and apply the result once on the ps task.
  /// InvalidArgumentError when the current strategy keeps its variables in
  /// this process.
  explicit Variable(const RemoteVariable& remote);
  Variable(Variable&& o) noexcept;
  Variable& operator=(Variable&& o) noexcept;
  Variable(const Variable&) = delete;
  Variable& operator=(const Variable&) = delete;
  ~Variable();

  /// A copy of the value as seen from the calling context.
  Tensor value() const;
  Tensor read_value() const { return value(); }
  /// Borrow the current context's copy (cross-replica: the primary copy)
  /// without copying; nullopt when the strategy plugin cannot. Valid until
  /// the next update of this variable.
  std::optional<TensorView> read_view() const;

  void assign(const TensorView& value);
  void assign_add(const TensorView& value);
  void assign_sub(const TensorView& value);

  const std::string& name() const;
  DType dtype() const;
  const std::vector<std::int64_t>& shape() const;
  Synchronization synchronization() const;
  Aggregation aggregation() const;
  bool trainable() const;
  /// parameter_server strategy: the variable as a RemoteVariable, to pass
  /// to ClusterCoordinator::schedule. FailedPreconditionError naming the
  /// strategy when its variables live in this process only.
  RemoteVariable remote() const;
  /// The strategy the variable belongs to (a non-owning handle).
  Strategy& strategy() const;

  /// Internal: the instance and C handle.
  detail::StrategyImpl* strategy_impl() const;
  strata_variable_t handle() const;

 private:
  struct State;
  void attach(const RemoteVariable& remote);
  void update(strata_var_update_op op, const TensorView& value);
  std::unique_ptr<State> state_;
};

}  // namespace strata
