// SPDX-License-Identifier: Apache-2.0
// Metrics (Keras' keras.metrics: Mean, Sum, Accuracy,
// SparseCategoricalAccuracy, SparseCategoricalCrossentropy) whose state is
// sync-on-read variables, as tf.distribute's metrics are.
//
//   auto scope = strategy.scope();
//   strata::SparseCategoricalAccuracy acc;            // its variables live in the strategy
//   strategy.run([&](strata::ReplicaContext& ctx) {
//     acc.update_state(labels[ctx.local_replica_id()], logits);   // this replica's copy only
//   });
//   double a = acc.result();                          // aggregated over replicas and workers
//   acc.reset_state();                                // next epoch
//
// State: `total` and `count`, float64 ON_READ variables with SUM
// aggregation, created in the current strategy when the metric is built
// (create metrics inside strategy.scope(); outside it they belong to the
// Default strategy). Totals are float64 sums of per-example values
// computed in double, so the result equals a single-device computation
// over the same examples to double rounding (the sums' order differs).
//
// Contexts:
//  - update_state inside run() (replica context) adds to that replica's
//    copy: no communication. In cross-replica context (or under the Default
//    strategy) it adds to the aggregate (a read and an assign).
//  - result() aggregates every replica's copy on every worker (for
//    multi_worker_mirrored a collective: every worker calls it), and must
//    be called in cross-replica context: inside run() it is
//    FailedPreconditionError naming the metric (a replica sees only its
//    own part).
//  - reset_state() zeroes every copy (cross-replica context).
// Bad input (mismatched shapes, a label outside [0, classes), a dtype the
// metric cannot read) is InvalidArgumentError naming the metric.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/export.hpp"
#include "strata/tensor.hpp"
#include "strata/variable.hpp"

namespace strata {

class Checkpoint;
class Trainer;

class STRATA_API Metric {
 public:
  virtual ~Metric();
  Metric(const Metric&) = delete;
  Metric& operator=(const Metric&) = delete;

  /// The metric's value over everything since the last reset, aggregated
  /// across replicas and workers (see the file comment). 0 before any
  /// update (Keras' divide_no_nan).
  double result() const;
  /// Zero the state (e.g. at the start of every epoch).
  void reset_state();
  /// The count behind result() (Keras' Mean.count): examples seen since
  /// the last reset, aggregated as result() is.
  double count() const;
  const std::string& name() const { return name_; }
  /// Track the state as "<prefix>/total" and "<prefix>/count" (prefix
  /// defaults to the metric's name).
  void track(Checkpoint& checkpoint, const std::string& prefix = "") ;

 protected:
  explicit Metric(std::string name);
  /// Add `total` and `count` (already summed over this call's examples).
  void add(double total, double count);
  /// Sum metrics return total; means return total / count.
  virtual bool is_sum() const { return false; }

 private:
  friend class Trainer;  // merges the state workers return under parameter_server
  std::string name_;
  std::unique_ptr<Variable> total_, count_;
};

/// keras.metrics.Mean: the (weighted) mean of every value seen.
/// sample_weight: a scalar, or one weight per value (same shape), or one
/// per row ([values.shape[0]]).
class STRATA_API Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean");
  void update_state(const TensorView& values, const std::optional<TensorView>& sample_weight = std::nullopt);
};

/// keras.metrics.Sum: the sum of every value seen.
class STRATA_API Sum : public Metric {
 public:
  explicit Sum(std::string name = "sum");
  void update_state(const TensorView& values);

 protected:
  bool is_sum() const override { return true; }
};

/// keras.metrics.Accuracy: how often y_pred equals y_true (same shape,
/// compared element by element after conversion to double).
class STRATA_API Accuracy : public Metric {
 public:
  explicit Accuracy(std::string name = "accuracy");
  void update_state(const TensorView& y_true, const TensorView& y_pred);
};

/// keras.metrics.SparseCategoricalAccuracy: how often the arg-max of y_pred
/// ([batch, classes], the first maximum wins) equals the integer label
/// y_true ([batch] or [batch, 1], int32 or int64).
class STRATA_API SparseCategoricalAccuracy : public Metric {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy");
  void update_state(const TensorView& y_true, const TensorView& y_pred);
};

/// keras.metrics.SparseCategoricalCrossentropy: the mean cross-entropy of
/// integer labels y_true against y_pred ([batch, classes]): logits when
/// from_logits (log-sum-exp minus the label's logit), else probabilities
/// (each row divided by its sum, clipped to [1e-7, 1 - 1e-7], then -log).
class STRATA_API SparseCategoricalCrossentropy : public Metric {
 public:
  explicit SparseCategoricalCrossentropy(std::string name = "sparse_categorical_crossentropy",
                                         bool from_logits = false);
  void update_state(const TensorView& y_true, const TensorView& y_pred);

 private:
  bool from_logits_;
};

}  // namespace strata
