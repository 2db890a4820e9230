// SPDX-License-Identifier: Apache-2.0
// Context queries and loss helpers (tf.distribute.get_strategy & co.).
//
// The context is per thread: outside any scope it is the Default
// strategy's default replica context; inside Strategy::scope() the
// strategy's cross-replica context; inside run() the replica's context;
// inside merge_call() cross-replica context again. All functions are
// thread-safe and never block.
#pragma once

#include <cstdint>
#include <optional>

#include "strata/export.hpp"
#include "strata/strategy.hpp"
#include "strata/tensor.hpp"

namespace strata {

/// The current strategy: the one whose scope/run/merge_call this thread is
/// in, else the Default strategy (a process-wide singleton, one replica).
STRATA_API Strategy& get_strategy();
/// True when the current strategy is not the Default strategy.
STRATA_API bool has_strategy();
/// True in a non-default strategy's scope (outside run) or inside merge_call.
STRATA_API bool in_cross_replica_context();
/// The replica context inside run(); nullptr in cross-replica context; the
/// Default strategy's replica context outside any scope.
STRATA_API ReplicaContext* get_replica_context();

/// Loss scaled for the global batch (tf.nn.compute_average_loss):
/// sum(per_example_loss * sample_weight) / global_batch_size. Without
/// `global_batch_size` it is the per-replica batch (dimension 0) times
/// num_replicas_in_sync, which needs replica context (or the Default
/// strategy): FailedPreconditionError in cross-replica context.
/// `per_example_loss` must be a floating-point tensor of rank >= 1;
/// `sample_weight` is a scalar, of the loss's shape, or of shape [batch].
/// Returns a scalar of the loss's dtype. An explicit global_batch_size must
/// be positive (InvalidArgumentError); an empty derived batch gives 0.
STRATA_API Tensor compute_average_loss(const TensorView& per_example_loss,
                                       std::optional<std::int64_t> global_batch_size = std::nullopt,
                                       std::optional<TensorView> sample_weight = std::nullopt);
/// sum(loss) / num_replicas_in_sync (tf.nn.scale_regularization_loss).
/// FailedPreconditionError in a non-default cross-replica context.
STRATA_API Tensor scale_regularization_loss(const TensorView& regularization_loss);

}  // namespace strata
