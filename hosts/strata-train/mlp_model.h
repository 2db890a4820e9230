// SPDX-License-Identifier: Apache-2.0
// The example MLP (mlp.h) as a strata::Model, for strata::Trainer: its four
// parameters are Variables of the current strategy (create it inside
// strategy.scope()), initialised exactly as strata-train's hand-written loop
// initialises them.
#pragma once

#include <vector>

#include "mlp.h"
#include "strata/strata.hpp"

namespace strata::train {

class MlpModel : public Model {
 public:
  MlpModel(const ModelShape& m, std::uint64_t seed) : m_(m) {
    for (int i = 0; i < 4; ++i)
      vars_.emplace_back(Tensor::from_vector(initial_param(m, i, seed), param_shape(m, i)),
                         VariableOptions{param_name(i), true, Synchronization::ON_WRITE, Aggregation::ONLY_FIRST_REPLICA});
  }
  std::vector<Variable*> trainable_variables() override {
    std::vector<Variable*> out;
    for (Variable& v : vars_) out.push_back(&v);
    return out;
  }
  std::vector<Variable>& variables() { return vars_; }

  ForwardResult forward_backward(const Features& batch, double loss_scale, std::vector<Tensor>& grads) override {
    return forward_backward(batch, loss_scale, grads, nullptr);
  }
  /// As above; also `*scaled_loss` = loss_scale * the sum of the per-example
  /// losses, accumulated in double (what strata-train all-reduces as the
  /// step's loss; per_example_loss holds them rounded to float).
  ForwardResult forward_backward(const Features& batch, double loss_scale, std::vector<Tensor>& grads,
                                 double* scaled_loss) {
    float* g[4];
    for (int i = 0; i < 4; ++i) g[i] = grads[static_cast<std::size_t>(i)].data<float>();
    return run(batch, loss_scale, g, true, scaled_loss);
  }
  ForwardResult forward(const Features& batch) override { return run(batch, 1.0, nullptr, batch.contains("y")); }

 private:
  ForwardResult run(const Features& batch, double scale, float* const* grads, bool labelled,
                    double* scaled_loss = nullptr) {
    const Tensor& x = batch["x"];
    const std::int64_t rows = batch.batch_size();
    // This replica's copy of the weights, without a copy where the strategy allows.
    std::vector<Tensor> copies;
    const float* params[4];
    for (int i = 0; i < 4; ++i) {
      if (auto view = vars_[static_cast<std::size_t>(i)].read_view()) {
        params[i] = view->data<float>();
      } else {
        copies.push_back(vars_[static_cast<std::size_t>(i)].value());
        params[i] = copies.back().data<float>();
      }
    }
    ForwardResult out;
    out.predictions = Tensor::zeros({rows, m_.classes}, DType::kFloat32);
    Tensor losses = Tensor::zeros({rows}, DType::kFloat32);
    std::vector<std::int32_t> no_labels;
    const std::int32_t* y = nullptr;
    if (labelled) {
      y = batch["y"].data<std::int32_t>();
    } else {
      no_labels.assign(static_cast<std::size_t>(rows), 0);
      y = no_labels.data();
    }
    const double loss = train::forward_backward(m_, params, x.data<float>(), y, rows, scale, grads,
                                                out.predictions.data<float>(), losses.data<float>());
    if (scaled_loss != nullptr) *scaled_loss = loss;
    if (labelled) out.per_example_loss = std::move(losses);
    return out;
  }
  ModelShape m_;
  std::vector<Variable> vars_;
};

}  // namespace strata::train
