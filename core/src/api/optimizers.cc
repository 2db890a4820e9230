// SPDX-License-Identifier: Apache-2.0
// Optimizers and learning-rate schedules (see strata/optimizers.hpp). The
// update formulas are Keras 3's (keras/src/optimizers/{sgd,adam,adamw}.py),
// written element by element in the variable's dtype in the same operation
// order; the distribution follows tf.distribute's optimizer path: reduce the
// gradients across replicas, then update every copy once from cross-replica
// context.
#include "strata/optimizers.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "api/kernels.h"
#include "strata/checkpoint.hpp"
#include "strata/distribute.hpp"
#include "strata/error.hpp"
#include "strata/strategy.hpp"

namespace strata {

// ---------------------------------------------------------------- schedules

LearningRate::LearningRate(double constant) : description_(std::to_string(constant)) {
  STRATA_ENFORCE(std::isfinite(constant) && constant >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "learning rate must be a finite number >= 0; got ", constant);
  fn_ = [constant](std::int64_t) { return constant; };
}

LearningRate::LearningRate(std::function<double(std::int64_t)> schedule, std::string description)
    : fn_(std::move(schedule)), description_(std::move(description)) {
  STRATA_ENFORCE(static_cast<bool>(fn_), STRATA_ERR_INVALID_ARGUMENT, "learning rate schedule is empty");
}

LearningRate PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values) {
  STRATA_ENFORCE(values.size() == boundaries.size() + 1, STRATA_ERR_INVALID_ARGUMENT,
                 "PiecewiseConstantDecay: values must have one more element than boundaries; got ", values.size(),
                 " values and ", boundaries.size(), " boundaries");
  for (std::size_t i = 1; i < boundaries.size(); ++i)
    STRATA_ENFORCE(boundaries[i - 1] < boundaries[i], STRATA_ERR_INVALID_ARGUMENT,
                   "PiecewiseConstantDecay: boundaries must increase; boundary ", i, " (", boundaries[i],
                   ") is not above ", boundaries[i - 1]);
  std::ostringstream d;
  d << "PiecewiseConstantDecay(" << boundaries.size() << " boundaries)";
  return LearningRate(
      [b = std::move(boundaries), v = std::move(values)](std::int64_t step) {
        for (std::size_t i = 0; i < b.size(); ++i)
          if (step <= b[i]) return v[i];
        return v.back();
      },
      d.str());
}

LearningRate ExponentialDecay(double initial, std::int64_t decay_steps, double decay_rate, bool staircase) {
  STRATA_ENFORCE(decay_steps > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "ExponentialDecay: decay_steps must be > 0; got ", decay_steps);
  STRATA_ENFORCE(initial >= 0 && decay_rate > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "ExponentialDecay: initial_learning_rate must be >= 0 and decay_rate > 0; got ", initial, " and ",
                 decay_rate);
  return LearningRate(
      [=](std::int64_t step) {
        double p = static_cast<double>(step) / static_cast<double>(decay_steps);
        if (staircase) p = std::floor(p);
        return initial * std::pow(decay_rate, p);
      },
      "ExponentialDecay");
}

LearningRate CosineDecay(double initial, std::int64_t decay_steps, double alpha, std::optional<double> warmup_target,
                         std::int64_t warmup_steps) {
  STRATA_ENFORCE(decay_steps > 0, STRATA_ERR_INVALID_ARGUMENT, "CosineDecay: decay_steps must be > 0; got ",
                 decay_steps);
  STRATA_ENFORCE(warmup_steps >= 0, STRATA_ERR_INVALID_ARGUMENT, "CosineDecay: warmup_steps must be >= 0; got ",
                 warmup_steps);
  STRATA_ENFORCE(!warmup_target || warmup_steps > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "CosineDecay: a warmup_target needs warmup_steps > 0");
  auto decay = [decay_steps, alpha](double step, double from) {
    const double fraction = step / static_cast<double>(decay_steps);
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * fraction));
    return from * ((1 - alpha) * cosine + alpha);
  };
  return LearningRate(
      [=](std::int64_t step) {
        double s = static_cast<double>(step);
        if (!warmup_target) return decay(std::min(s, static_cast<double>(decay_steps)), initial);
        s = std::min(s, static_cast<double>(decay_steps + warmup_steps));
        if (s < static_cast<double>(warmup_steps))
          return (*warmup_target - initial) * (s / static_cast<double>(warmup_steps)) + initial;
        return decay(s - static_cast<double>(warmup_steps), *warmup_target);
      },
      "CosineDecay");
}

// ---------------------------------------------------------------- Optimizer

namespace {

// A variable's current value in cross-replica context (the primary copy).
Tensor current(const Variable& v) { return v.value(); }

template <class T>
void for_each_dtype(DType dt, const char* who, T&& fn) {
  switch (dt) {
    case DType::kFloat32: fn(float{}); return;
    case DType::kFloat64: fn(double{}); return;
    default:
      STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, who, ": variables of dtype ", dtype_name(dt),
                   " are not supported; keep float32 or float64 master weights");
  }
}

}  // namespace

struct Optimizer::Impl {
  LearningRate lr;
  OptimizerOptions options;
  std::unique_ptr<Variable> iterations;
  // Slots per variable (by address), in slot_names() order.
  std::map<const Variable*, std::vector<std::unique_ptr<Variable>>> slots;
  Impl(LearningRate l, OptimizerOptions o) : lr(std::move(l)), options(o) {}
};

Optimizer::Optimizer(LearningRate lr, OptimizerOptions options)
    : impl_(std::make_unique<Impl>(std::move(lr), options)) {
  STRATA_ENFORCE(!(options.clipnorm && options.global_clipnorm), STRATA_ERR_INVALID_ARGUMENT,
                 "only one of clipnorm and global_clipnorm can be set (as in Keras)");
  STRATA_ENFORCE(!options.clipnorm || *options.clipnorm > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "clipnorm must be > 0; got ", options.clipnorm.value_or(0));
  STRATA_ENFORCE(!options.global_clipnorm || *options.global_clipnorm > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "global_clipnorm must be > 0; got ", options.global_clipnorm.value_or(0));
}

Optimizer::~Optimizer() = default;

void Optimizer::build(const std::vector<Variable*>& vars) {
  for (Variable* v : vars) {
    STRATA_ENFORCE(v != nullptr, STRATA_ERR_INVALID_ARGUMENT, name(), ": a variable is null");
    STRATA_ENFORCE(v->trainable(), STRATA_ERR_INVALID_ARGUMENT, name(), ": variable '", v->name(),
                   "' is not trainable");
    STRATA_ENFORCE(v->synchronization() != Synchronization::ON_READ, STRATA_ERR_INVALID_ARGUMENT, name(),
                   ": variable '", v->name(), "' is ON_READ (sync-on-read), which cannot be trained");
    for_each_dtype(v->dtype(), name(), [](auto) {});
    // Slots belong to the variable's strategy: enter its scope unless this
    // thread is already in it (or in its merge_call).
    std::optional<Scope> scope;
    if (get_strategy() != v->strategy()) scope.emplace(v->strategy().scope());
    if (!impl_->iterations) {
      impl_->iterations = std::make_unique<Variable>(
          Tensor::scalar<std::int64_t>(0),
          VariableOptions{std::string(name()) + "/iterations", false, Synchronization::ON_WRITE,
                          Aggregation::ONLY_FIRST_REPLICA});
    }
    auto& s = impl_->slots[v];
    if (!s.empty() || slot_names().empty()) continue;
    for (const std::string& slot : slot_names())
      s.push_back(std::make_unique<Variable>(Tensor::zeros(v->shape(), v->dtype()),
                                             VariableOptions{v->name() + "/" + slot, false, Synchronization::ON_WRITE,
                                                             Aggregation::ONLY_FIRST_REPLICA}));
  }
}

std::int64_t Optimizer::iterations() const {
  return impl_->iterations ? impl_->iterations->value().data<std::int64_t>()[0] : 0;
}

double Optimizer::learning_rate() const { return impl_->lr(iterations()); }

void Optimizer::set_learning_rate(LearningRate lr) { impl_->lr = std::move(lr); }

void Optimizer::track(Checkpoint& checkpoint, const std::string& prefix) {
  STRATA_ENFORCE(impl_->iterations != nullptr, STRATA_ERR_FAILED_PRECONDITION, name(),
                 ": build(variables) before track(), so that its slots exist");
  checkpoint.track(prefix + "/iterations", *impl_->iterations);
  for (auto& [var, slots] : impl_->slots)
    for (auto& s : slots) checkpoint.track(prefix + "/" + s->name(), *s);
}

Variable& Optimizer::slot(const Variable& var, const std::string& slot) {
  auto it = impl_->slots.find(&var);
  const std::vector<std::string> names = slot_names();
  if (it != impl_->slots.end())
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == slot) return *it->second[i];
  STRATA_THROW(STRATA_ERR_NOT_FOUND, name(), " has no slot '", slot, "' for variable '", var.name(),
               "' (slots are made by build() or the first apply_gradients)");
}

void Optimizer::apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable*>& vars) {
  STRATA_ENFORCE(grads.size() == vars.size(), STRATA_ERR_INVALID_ARGUMENT, name(), ": ", grads.size(),
                 " gradients for ", vars.size(), " variables");
  for (std::size_t i = 0; i < vars.size(); ++i) {
    STRATA_ENFORCE(vars[i] != nullptr, STRATA_ERR_INVALID_ARGUMENT, name(), ": variable ", i, " is null");
    STRATA_ENFORCE(grads[i].defined() && grads[i].dtype() == vars[i]->dtype() &&
                       grads[i].shape() == vars[i]->shape(),
                   STRATA_ERR_INVALID_ARGUMENT, name(), ": the gradient of variable '", vars[i]->name(), "' is ",
                   grads[i].defined() ? std::string(dtype_name(grads[i].dtype())) + detail::shape_string(grads[i].shape())
                                      : std::string("empty"),
                   " but the variable is ", dtype_name(vars[i]->dtype()), detail::shape_string(vars[i]->shape()));
  }
  if (vars.empty()) return;
  ReplicaContext* ctx = get_replica_context();
  if (ctx != nullptr && !in_cross_replica_context()) {
    // Replica context: sum across replicas (one batched collective), then
    // one update from cross-replica context. Every replica's sum is the
    // same, so the merge function may use any replica's.
    std::vector<Tensor> reduced = ctx->all_reduce(ReduceOp::SUM, grads);
    ctx->merge_call([&](Strategy&) { apply_reduced(std::move(reduced), vars); });
    return;
  }
  std::vector<Tensor> copies;
  for (const Tensor& g : grads) copies.push_back(Tensor::copy_of(g));
  apply_reduced(std::move(copies), vars);
}

void Optimizer::apply_reduced(std::vector<Tensor> grads, const std::vector<Variable*>& vars) {
  build(vars);
  const std::int64_t step = iterations();
  const double lr = impl_->lr(step);
  // Keras' _clip_gradients: clipnorm per tensor, or global_clipnorm.
  if (impl_->options.clipnorm) {
    const double c = *impl_->options.clipnorm;
    for (Tensor& g : grads)
      for_each_dtype(g.dtype(), name(), [&](auto zero) {
        using T = decltype(zero);
        T* p = g.data<T>();
        T l2sum = 0;
        for (std::int64_t i = 0; i < g.numel(); ++i) l2sum += p[i] * p[i];
        const T l2norm = l2sum > 0 ? std::sqrt(l2sum) : l2sum;
        const T denom = std::max(l2norm, static_cast<T>(c));
        for (std::int64_t i = 0; i < g.numel(); ++i) p[i] = (p[i] * static_cast<T>(c)) / denom;
      });
  } else if (impl_->options.global_clipnorm) {
    const double c = *impl_->options.global_clipnorm;
    double squared = 0;
    for (const Tensor& g : grads)
      for_each_dtype(g.dtype(), name(), [&](auto zero) {
        using T = decltype(zero);
        const T* p = g.data<T>();
        for (std::int64_t i = 0; i < g.numel(); ++i) squared += static_cast<double>(p[i]) * static_cast<double>(p[i]);
      });
    const double use_norm = std::sqrt(squared);
    // NaN or Inf norms propagate, as in tf.clip_by_global_norm.
    const double scale = c * std::min(1.0 / use_norm, 1.0 / c) + (use_norm - use_norm);
    for (Tensor& g : grads)
      for_each_dtype(g.dtype(), name(), [&](auto zero) {
        using T = decltype(zero);
        T* p = g.data<T>();
        for (std::int64_t i = 0; i < g.numel(); ++i) p[i] = p[i] * static_cast<T>(scale);
      });
  }
  // AdamW's decoupled weight decay, before the update (Keras'
  // _apply_weight_decay): w = w - w * wd * lr.
  if (const double wd = weight_decay(); wd != 0) {
    for (Variable* v : vars)
      for_each_dtype(v->dtype(), name(), [&](auto zero) {
        using T = decltype(zero);
        Tensor w = current(*v);
        T* p = w.data<T>();
        const T wdt = static_cast<T>(wd), lrt = static_cast<T>(lr);
        for (std::int64_t i = 0; i < w.numel(); ++i) p[i] = p[i] - p[i] * wdt * lrt;
        v->assign(w);
      });
  }
  for (std::size_t i = 0; i < vars.size(); ++i) {
    std::vector<Variable*> slots;
    for (auto& s : impl_->slots[vars[i]]) slots.push_back(s.get());
    update(*vars[i], grads[i], slots, lr, step);
  }
  // An increment, not an assign of step + 1: under parameter_server workers
  // update asynchronously, and the ps applies each increment atomically, so
  // iterations counts every update exactly once.
  impl_->iterations->assign_add(Tensor::scalar<std::int64_t>(1));
}

// ---------------------------------------------------------------- SGD

SGD::SGD(LearningRate lr, double momentum, bool nesterov, OptimizerOptions options)
    : Optimizer(std::move(lr), options), momentum_(momentum), nesterov_(nesterov) {
  STRATA_ENFORCE(momentum >= 0 && momentum <= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "SGD: momentum must be in [0, 1]; got ", momentum);
}

std::vector<std::string> SGD::slot_names() const {
  if (momentum_ != 0) return {"momentum"};
  return {};
}

void SGD::update(Variable& var, const Tensor& grad, std::vector<Variable*>& slots, double lr, std::int64_t) {
  for_each_dtype(var.dtype(), name(), [&](auto zero) {
    using T = decltype(zero);
    Tensor w = current(var);
    T* wp = w.data<T>();
    const T* g = grad.data<T>();
    const T lrt = static_cast<T>(lr);
    const std::int64_t n = w.numel();
    if (slots.empty()) {
      for (std::int64_t i = 0; i < n; ++i) wp[i] = wp[i] - g[i] * lrt;
    } else {
      Tensor m = current(*slots[0]);
      T* mp = m.data<T>();
      const T mom = static_cast<T>(momentum_);
      for (std::int64_t i = 0; i < n; ++i) {
        mp[i] = mp[i] * mom - g[i] * lrt;
        wp[i] = nesterov_ ? wp[i] + (mp[i] * mom - g[i] * lrt) : wp[i] + mp[i];
      }
      slots[0]->assign(m);
    }
    var.assign(w);
  });
}

// ---------------------------------------------------------------- Adam, AdamW

Adam::Adam(LearningRate lr, double beta_1, double beta_2, double epsilon, bool amsgrad, OptimizerOptions options)
    : Optimizer(std::move(lr), options), beta_1_(beta_1), beta_2_(beta_2), epsilon_(epsilon), amsgrad_(amsgrad) {
  STRATA_ENFORCE(beta_1 >= 0 && beta_1 < 1 && beta_2 >= 0 && beta_2 < 1, STRATA_ERR_INVALID_ARGUMENT,
                 "Adam: beta_1 and beta_2 must be in [0, 1); got ", beta_1, " and ", beta_2);
  STRATA_ENFORCE(epsilon >= 0, STRATA_ERR_INVALID_ARGUMENT, "Adam: epsilon must be >= 0; got ", epsilon);
}

std::vector<std::string> Adam::slot_names() const {
  if (amsgrad_) return {"m", "v", "v_hat"};
  return {"m", "v"};
}

void Adam::update(Variable& var, const Tensor& grad, std::vector<Variable*>& slots, double lr, std::int64_t step) {
  for_each_dtype(var.dtype(), name(), [&](auto zero) {
    using T = decltype(zero);
    const T lrt = static_cast<T>(lr), b1 = static_cast<T>(beta_1_), b2 = static_cast<T>(beta_2_),
            eps = static_cast<T>(epsilon_);
    const T t = static_cast<T>(step + 1);
    const T b1_power = std::pow(b1, t), b2_power = std::pow(b2, t);
    const T alpha = lrt * std::sqrt(T(1) - b2_power) / (T(1) - b1_power);
    Tensor w = current(var), m = current(*slots[0]), v = current(*slots[1]);
    Tensor v_hat;
    if (amsgrad_) v_hat = current(*slots[2]);
    T *wp = w.data<T>(), *mp = m.data<T>(), *vp = v.data<T>();
    T* hp = amsgrad_ ? v_hat.data<T>() : nullptr;
    const T* g = grad.data<T>();
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      mp[i] = mp[i] + (g[i] - mp[i]) * (T(1) - b1);
      vp[i] = vp[i] + (g[i] * g[i] - vp[i]) * (T(1) - b2);
      T vi = vp[i];
      if (hp) {
        hp[i] = std::max(hp[i], vp[i]);
        vi = hp[i];
      }
      wp[i] = wp[i] - (mp[i] * alpha) / (std::sqrt(vi) + eps);
    }
    slots[0]->assign(m);
    slots[1]->assign(v);
    if (amsgrad_) slots[2]->assign(v_hat);
    var.assign(w);
  });
}

AdamW::AdamW(LearningRate lr, double weight_decay, double beta_1, double beta_2, double epsilon, bool amsgrad,
             OptimizerOptions options)
    : Adam(std::move(lr), beta_1, beta_2, epsilon, amsgrad, options), weight_decay_(weight_decay) {
  STRATA_ENFORCE(weight_decay >= 0, STRATA_ERR_INVALID_ARGUMENT, "AdamW: weight_decay must be >= 0; got ",
                 weight_decay);
}

}  // namespace strata
