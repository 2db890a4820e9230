// SPDX-License-Identifier: Apache-2.0
// Optimizers and learning-rate schedules (Keras' SGD, Adam, AdamW and
// keras.optimizers.schedules), strategy-aware as tf.distribute's are.
//
//   auto scope = strategy.scope();
//   strata::Variable w(init, {"w"});
//   strata::Adam opt(strata::CosineDecay(1e-3, /*decay_steps=*/1000));
//   strategy.run([&](strata::ReplicaContext& ctx) {
//     std::vector<strata::Tensor> grads = ...;          // this replica's gradients
//     opt.apply_gradients(grads, {&w});                  // all-reduce SUM, then one update
//   });
//
// apply_gradients follows Keras' Optimizer.apply_gradients under a
// tf.distribute strategy:
//  - In replica context (inside run) the gradients are this replica's: they
//    are summed across all replicas in sync with one batched all-reduce
//    (scale the loss by the global batch, as compute_average_loss does, so
//    the sum is the gradient of the mean), then the update runs once, in a
//    merge_call, in cross-replica context: every copy of every variable and
//    slot gets the same new value. Every replica must call it with the same
//    variables in the same order (it is a collective).
//  - In cross-replica context the gradients are taken as already reduced
//    and applied once.
// Per step, in Keras' order: gradient clipping (clipnorm per tensor, then
// global_clipnorm over all of them, Keras' clip_by_global_norm, NaN kept),
// AdamW's decoupled weight decay (w -= w * wd * lr), the optimizer's update,
// then iterations() += 1. The learning rate of a step is the schedule's
// value at iterations() before the increment. The arithmetic is done in the
// variable's dtype (float32 or float64; other dtypes are
// UnimplementedError), in Keras' operation order, so results match Keras'
// to the last bit where the platform's float math agrees.
//
// Slots (SGD's momentum, Adam's m, v and v_hat) are Variables created on
// the first apply_gradients, in the strategy of the variable they belong
// to, with its shape and dtype, non-trainable, mirrored like it. Their names
// are "<variable name>/<slot>". iterations() is an int64 Variable too, so
// track(checkpoint) saves and restores the whole optimizer state (call
// build() first so that the slots exist before a restore).
//
// Errors: a gradient whose shape or dtype differs from its variable's, a
// count mismatch, an ON_READ or non-trainable variable: InvalidArgumentError
// naming it; bad hyper-parameters (negative learning rate, momentum outside
// [0, 1], beta outside [0, 1)): InvalidArgumentError naming them.
//
// Threads: an optimizer is used from one training loop; apply_gradients in
// replica context is called by every replica thread of one run().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/export.hpp"
#include "strata/tensor.hpp"
#include "strata/variable.hpp"

namespace strata {

class Checkpoint;

/// A learning rate as a function of the optimizer's step (iterations(),
/// from 0). A plain number converts to a constant schedule.
class STRATA_API LearningRate {
 public:
  LearningRate(double constant);  // NOLINT: implicit, as Keras takes a float
  explicit LearningRate(std::function<double(std::int64_t)> schedule, std::string description);
  double operator()(std::int64_t step) const { return fn_(step); }
  const std::string& description() const { return description_; }

 private:
  std::function<double(std::int64_t)> fn_;
  std::string description_;
};

/// keras.optimizers.schedules.PiecewiseConstantDecay: values[0] while
/// step <= boundaries[0], values[i] while boundaries[i-1] < step <=
/// boundaries[i], values.back() after the last boundary. values.size() must
/// be boundaries.size() + 1 and the boundaries increasing.
STRATA_API LearningRate PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values);
/// keras.optimizers.schedules.ExponentialDecay: initial * rate ^ (step /
/// decay_steps), the exponent floored when staircase.
STRATA_API LearningRate ExponentialDecay(double initial, std::int64_t decay_steps, double decay_rate,
                                         bool staircase = false);
/// keras.optimizers.schedules.CosineDecay: without warm-up, initial *
/// ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps))
/// + alpha); with warmup_target, a linear ramp from initial to warmup_target
/// over warmup_steps, then the cosine decay from warmup_target over
/// decay_steps.
STRATA_API LearningRate CosineDecay(double initial, std::int64_t decay_steps, double alpha = 0.0,
                                    std::optional<double> warmup_target = std::nullopt,
                                    std::int64_t warmup_steps = 0);

/// Options every optimizer shares (Keras' base Optimizer arguments).
struct OptimizerOptions {
  /// Clip each gradient to this L2 norm (Keras' clipnorm), > 0.
  std::optional<double> clipnorm;
  /// Clip all gradients together to this global L2 norm (Keras'
  /// global_clipnorm, tf.clip_by_global_norm), > 0.
  std::optional<double> global_clipnorm;
};

class STRATA_API Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// See the file comment. `grads[i]` is the gradient of `*vars[i]`.
  void apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable*>& vars);
  /// Create the slots (and iterations) for `vars` now, in cross-replica
  /// context: before a checkpoint restore, or to pay the cost up front.
  void build(const std::vector<Variable*>& vars);
  /// Updates applied so far (Keras' optimizer.iterations).
  std::int64_t iterations() const;
  /// The learning rate the next update uses.
  double learning_rate() const;
  /// Replace the learning rate or schedule (Keras' LearningRateScheduler
  /// callback sets a constant every epoch).
  void set_learning_rate(LearningRate lr);
  /// Track iterations and every slot in `checkpoint` as "<prefix>/iterations"
  /// and "<prefix>/<variable name>/<slot>" (build() first).
  void track(Checkpoint& checkpoint, const std::string& prefix = "optimizer");
  /// The slot `slot` ("momentum", "m", "v", "v_hat") of `var` (NotFoundError
  /// when it has none).
  Variable& slot(const Variable& var, const std::string& slot);
  /// "SGD", "Adam", "AdamW".
  virtual const char* name() const = 0;

 protected:
  Optimizer(LearningRate lr, OptimizerOptions options);
  /// Slot names this optimizer keeps per variable.
  virtual std::vector<std::string> slot_names() const = 0;
  /// Whether weight decay applies (AdamW).
  virtual double weight_decay() const { return 0.0; }
  /// One variable's update from its (clipped) gradient, in cross-replica
  /// context. `slots` in slot_names() order; `lr` the step's learning rate;
  /// `step` iterations() before the increment. float/double arithmetic by
  /// the variable's dtype.
  virtual void update(Variable& var, const Tensor& grad, std::vector<Variable*>& slots, double lr,
                      std::int64_t step) = 0;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  void apply_reduced(std::vector<Tensor> grads, const std::vector<Variable*>& vars);
};

/// keras.optimizers.SGD: with momentum, m = m * momentum - g * lr and
/// w += m (Nesterov: w += m * momentum - g * lr); without, w -= g * lr.
class STRATA_API SGD : public Optimizer {
 public:
  explicit SGD(LearningRate lr = 0.01, double momentum = 0.0, bool nesterov = false, OptimizerOptions options = {});
  const char* name() const override { return "SGD"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update(Variable& var, const Tensor& grad, std::vector<Variable*>& slots, double lr,
              std::int64_t step) override;

 private:
  double momentum_;
  bool nesterov_;
};

/// keras.optimizers.Adam: t = step + 1, alpha = lr * sqrt(1 - beta_2^t) /
/// (1 - beta_1^t), m += (g - m) * (1 - beta_1), v += (g^2 - v) * (1 -
/// beta_2), (amsgrad: v_hat = max(v_hat, v), used for v), w -= m * alpha /
/// (sqrt(v) + epsilon).
class STRATA_API Adam : public Optimizer {
 public:
  explicit Adam(LearningRate lr = 0.001, double beta_1 = 0.9, double beta_2 = 0.999, double epsilon = 1e-7,
                bool amsgrad = false, OptimizerOptions options = {});
  const char* name() const override { return "Adam"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update(Variable& var, const Tensor& grad, std::vector<Variable*>& slots, double lr,
              std::int64_t step) override;

 private:
  double beta_1_, beta_2_, epsilon_;
  bool amsgrad_;
};

/// keras.optimizers.AdamW: Adam after a decoupled weight decay w -= w *
/// weight_decay * lr on every variable.
class STRATA_API AdamW : public Adam {
 public:
  explicit AdamW(LearningRate lr = 0.001, double weight_decay = 0.004, double beta_1 = 0.9, double beta_2 = 0.999,
                 double epsilon = 1e-7, bool amsgrad = false, OptimizerOptions options = {});
  const char* name() const override { return "AdamW"; }

 protected:
  double weight_decay() const override { return weight_decay_; }

 private:
  double weight_decay_;
};

}  // namespace strata
