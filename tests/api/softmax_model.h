// SPDX-License-Identifier: Apache-2.0
// A softmax-regression strata::Model for the Trainer tests (logits = x W +
// b, cross-entropy of integer labels), with its data: `classes` Gaussian
// clusters in `features` dimensions, which the model learns to well above
// chance in a few epochs.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "strata/strata.hpp"

namespace strata::test {

class SoftmaxModel : public Model {
 public:
  SoftmaxModel(std::int64_t features, std::int64_t classes, unsigned seed = 1)
      : features_(features), classes_(classes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 0.1f);
    std::vector<float> w(static_cast<std::size_t>(features * classes));
    for (float& v : w) v = n(rng);
    w_ = std::make_unique<Variable>(Tensor::from_vector(w, {features, classes}), VariableOptions{"dense/kernel"});
    b_ = std::make_unique<Variable>(Tensor::zeros({classes}, DType::kFloat32), VariableOptions{"dense/bias"});
  }
  std::vector<Variable*> trainable_variables() override { return {w_.get(), b_.get()}; }

  // logits [rows, classes] and, with labels, the per-example losses and
  // d(loss)/d(logits) (softmax - onehot).
  ForwardResult run(const Features& batch, std::vector<float>* dlogits) {
    const Tensor& x = batch["x"];
    const std::int64_t rows = batch.batch_size();
    const Tensor w = w_->value(), b = b_->value();
    const float *xp = x.data<float>(), *wp = w.data<float>(), *bp = b.data<float>();
    Tensor logits = Tensor::zeros({rows, classes_}, DType::kFloat32);
    float* lp = logits.data<float>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < classes_; ++c) {
        float s = bp[c];
        for (std::int64_t f = 0; f < features_; ++f) s += xp[r * features_ + f] * wp[f * classes_ + c];
        lp[r * classes_ + c] = s;
      }
    ForwardResult out;
    if (batch.contains("y")) {
      const std::int32_t* y = batch["y"].data<std::int32_t>();
      Tensor loss = Tensor::zeros({rows}, DType::kFloat32);
      if (dlogits) dlogits->assign(static_cast<std::size_t>(rows * classes_), 0.0f);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = lp + r * classes_;
        float mx = row[0];
        for (std::int64_t c = 1; c < classes_; ++c) mx = std::max(mx, row[c]);
        float z = 0;
        for (std::int64_t c = 0; c < classes_; ++c) z += std::exp(row[c] - mx);
        loss.data<float>()[r] = mx + std::log(z) - row[y[r]];
        if (dlogits)
          for (std::int64_t c = 0; c < classes_; ++c)
            (*dlogits)[static_cast<std::size_t>(r * classes_ + c)] = std::exp(row[c] - mx) / z - (c == y[r] ? 1.0f : 0.0f);
      }
      out.per_example_loss = std::move(loss);
    }
    out.predictions = std::move(logits);
    return out;
  }

  ForwardResult forward_backward(const Features& batch, double loss_scale, std::vector<Tensor>& grads) override {
    std::vector<float> d;
    ForwardResult out = run(batch, &d);
    const Tensor& x = batch["x"];
    const float* xp = x.data<float>();
    float* gw = grads[0].data<float>();
    float* gb = grads[1].data<float>();
    const auto s = static_cast<float>(loss_scale);
    for (std::int64_t r = 0; r < batch.batch_size(); ++r)
      for (std::int64_t c = 0; c < classes_; ++c) {
        const float g = d[static_cast<std::size_t>(r * classes_ + c)] * s;
        gb[c] += g;
        for (std::int64_t f = 0; f < features_; ++f) gw[f * classes_ + c] += xp[r * features_ + f] * g;
      }
    return out;
  }
  ForwardResult forward(const Features& batch) override { return run(batch, nullptr); }

 private:
  std::int64_t features_, classes_;
  std::unique_ptr<Variable> w_, b_;
};

// `n` examples of `classes` clusters: x [n, features] float32, y [n] int32.
// The cluster centres come from `centers_seed`, the samples from `seed`.
inline Element clusters(std::int64_t n, std::int64_t features, std::int64_t classes, unsigned seed,
                        unsigned centers_seed = 7) {
  std::mt19937 crng(centers_seed), rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.7f);
  std::vector<float> centers(static_cast<std::size_t>(classes * features));
  for (float& c : centers) c = noise(crng) * 3.0f;
  std::vector<float> x(static_cast<std::size_t>(n * features));
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(rng() % static_cast<unsigned>(classes));
    for (std::int64_t f = 0; f < features; ++f)
      x[static_cast<std::size_t>(i * features + f)] =
          centers[static_cast<std::size_t>(y[static_cast<std::size_t>(i)] * features + f)] + noise(rng);
  }
  Element e;
  e.add("x", Tensor::from_vector(x, {n, features}));
  e.add("y", Tensor::from_vector(y, {n}));
  return e;
}

}  // namespace strata::test
