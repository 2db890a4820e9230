// SPDX-License-Identifier: Apache-2.0
// strata-train's Trainer: strata::Trainer with the train_step this program
// has always run, so that fit() reproduces its earlier hand-written loop
// bit for bit (tests/train pins that against a weights file of the loop).
//
// The step (each replica, inside strategy.run): the MLP's gradients of its
// share of the global batch, with the loss scaled by 1 / global batch
// (compute_average_loss); ONE all-reduce (SUM) of the four gradients and
// the step's loss together, so the loss of every step is known on every
// worker without a second collective (the NaN check, --log-every lines, the
// checkpointed and saved "final loss" use it); then the optimizer applies
// the summed gradients once, in a merge_call (cross-replica context: the
// update is made once and written to every copy); then the compiled metrics.
//
// LoopSgd is plain SGD, w -= lr * g, with the product taken in double and
// rounded once to float, as the loop did. strata::SGD rounds lr to float
// first (Keras' arithmetic): the same up to one ulp per update, which would
// change the bits of every run with an --lr that is not a power of two.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mlp_model.h"
#include "strata/strata.hpp"

namespace strata::train {

class LoopSgd : public Optimizer {
 public:
  explicit LoopSgd(double lr) : Optimizer(lr, {}) {}
  const char* name() const override { return "SGD"; }

 protected:
  std::vector<std::string> slot_names() const override { return {}; }
  void update(Variable& var, const Tensor& grad, std::vector<Variable*>&, double lr, std::int64_t) override {
    STRATA_ENFORCE(var.dtype() == DType::kFloat32, STRATA_ERR_UNIMPLEMENTED, "LoopSgd: variable '", var.name(),
                   "' is not float32");
    Tensor w = var.value();
    float* wp = w.data<float>();
    const float* g = grad.data<float>();
    for (std::int64_t j = 0; j < w.numel(); ++j) wp[j] = wp[j] - static_cast<float>(lr * g[j]);
    var.assign(w);
  }
};

class MlpTrainer : public Trainer {
 public:
  MlpTrainer(Strategy& strategy, MlpModel& model, Optimizer& optimizer, std::vector<std::string> metrics)
      : Trainer(strategy, model, optimizer, std::move(metrics)), mlp_(&model), vars_(model.trainable_variables()) {
    buffers_.resize(static_cast<std::size_t>(strategy.num_local_replicas()));
    for (auto& b : buffers_) {
      for (const Variable* v : vars_) b.push_back(Tensor::zeros(v->shape(), DType::kFloat32));
      b.push_back(Tensor::zeros({1}, DType::kFloat32));  // the step's loss rides along
    }
  }
  /// The mean loss over the global batch of the last step (NaN before any);
  /// checkpoints save and restore it.
  double* last_loss() { return &last_loss_; }

 protected:
  void train_step(ReplicaContext& ctx, const Features& batch) override {
    const std::size_t local = static_cast<std::size_t>(ctx.local_replica_id());
    std::vector<Tensor>& buf = buffers_.at(local);
    for (Tensor& t : buf) std::memset(t.raw_data(), 0, t.nbytes());
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i < vars_.size(); ++i) grads.push_back(Tensor::borrow(buf[i]));
    double loss = 0;
    const ForwardResult r =
        mlp_->forward_backward(batch, 1.0 / static_cast<double>(global_batch_size()), grads, &loss);
    buf.back().data<float>()[0] = static_cast<float>(loss);
    ctx.all_reduce_in_place(ReduceOp::SUM, buf);  // one collective: gradients and loss
    ctx.merge_call([&](Strategy&) { optimizer().apply_gradients(grads, vars_); });
    if (local == 0) last_loss_ = buf.back().data<float>()[0];
    update_metrics(batch, r);
  }

 private:
  MlpModel* mlp_;
  std::vector<Variable*> vars_;
  std::vector<std::vector<Tensor>> buffers_;  // per local replica: the gradients, then the loss
  double last_loss_ = std::nan("");
};

}  // namespace strata::train
