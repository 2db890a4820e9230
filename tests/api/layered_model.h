// SPDX-License-Identifier: Apache-2.0
// A two-layer perceptron strata::Model for the Trainer tests that reports
// its gradients layer by layer (x -> tanh(x W1 + b1) -> logits = h W2 + b2,
// cross-entropy of integer labels): the output layer's gradients go to the
// GradientSink before the hidden layer's are computed. Both backward paths
// (forward_backward and forward_backward_layers) run the same arithmetic.
//
// The overlap hook: with wait_for_output_layer set, the backward pass of
// the hidden (first) layer does not finish until the sink says the output
// (last) layer's gradients have been reduced across every replica, waiting
// at most 60 s (then it throws). A fit that completes with it set has
// therefore reduced the last layer while the first layer's backward pass
// was still running, on every replica of every step: no timing involved.
// Without it, seen_reduced counts the steps in which the output layer was
// already reduced at that point.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "strata/strata.hpp"

namespace strata::test {

class LayeredModel : public Model {
 public:
  LayeredModel(std::int64_t features, std::int64_t hidden, std::int64_t classes, unsigned seed = 5)
      : f_(features), h_(hidden), c_(classes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 0.3f);
    auto init = [&](std::int64_t rows, std::int64_t cols) {
      std::vector<float> v(static_cast<std::size_t>(rows * cols));
      for (float& x : v) x = n(rng);
      return Tensor::from_vector(v, {rows, cols});
    };
    w1_ = std::make_unique<Variable>(init(f_, h_), VariableOptions{"hidden/kernel"});
    b1_ = std::make_unique<Variable>(Tensor::zeros({h_}, DType::kFloat32), VariableOptions{"hidden/bias"});
    w2_ = std::make_unique<Variable>(init(h_, c_), VariableOptions{"output/kernel"});
    b2_ = std::make_unique<Variable>(Tensor::zeros({c_}, DType::kFloat32), VariableOptions{"output/bias"});
  }
  std::vector<Variable*> trainable_variables() override { return {w1_.get(), b1_.get(), w2_.get(), b2_.get()}; }

  bool by_layer = true;
  bool wait_for_output_layer = false;
  std::atomic<int> seen_reduced{0}, backward_steps{0};

  bool reports_gradients_by_layer() const override { return by_layer; }

  ForwardResult forward(const Features& batch) override { return pass(batch, 0, nullptr, nullptr); }
  ForwardResult forward_backward(const Features& batch, double loss_scale, std::vector<Tensor>& grads) override {
    return pass(batch, loss_scale, &grads, nullptr);
  }
  ForwardResult forward_backward_layers(const Features& batch, double loss_scale, std::vector<Tensor>& grads,
                                        GradientSink& sink) override {
    return pass(batch, loss_scale, &grads, &sink);
  }

 private:
  ForwardResult pass(const Features& batch, double loss_scale, std::vector<Tensor>* grads, GradientSink* sink) {
    const Tensor& x = batch["x"];
    const std::int64_t rows = batch.batch_size();
    const Tensor w1 = w1_->value(), b1 = b1_->value(), w2 = w2_->value(), b2 = b2_->value();
    const float *xp = x.data<float>(), *w1p = w1.data<float>(), *b1p = b1.data<float>(), *w2p = w2.data<float>(),
                *b2p = b2.data<float>();
    std::vector<float> hid(static_cast<std::size_t>(rows * h_));
    Tensor logits = Tensor::zeros({rows, c_}, DType::kFloat32);
    float* lp = logits.data<float>();
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < h_; ++j) {
        float s = b1p[j];
        for (std::int64_t i = 0; i < f_; ++i) s += xp[r * f_ + i] * w1p[i * h_ + j];
        hid[static_cast<std::size_t>(r * h_ + j)] = std::tanh(s);
      }
      for (std::int64_t c = 0; c < c_; ++c) {
        float s = b2p[c];
        for (std::int64_t j = 0; j < h_; ++j) s += hid[static_cast<std::size_t>(r * h_ + j)] * w2p[j * c_ + c];
        lp[r * c_ + c] = s;
      }
    }
    ForwardResult out;
    std::vector<float> dl(static_cast<std::size_t>(rows * c_));
    if (batch.contains("y")) {
      const std::int32_t* y = batch["y"].data<std::int32_t>();
      Tensor loss = Tensor::zeros({rows}, DType::kFloat32);
      const auto scale = static_cast<float>(loss_scale);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = lp + r * c_;
        float mx = row[0];
        for (std::int64_t c = 1; c < c_; ++c) mx = std::max(mx, row[c]);
        float z = 0;
        for (std::int64_t c = 0; c < c_; ++c) z += std::exp(row[c] - mx);
        loss.data<float>()[r] = mx + std::log(z) - row[y[r]];
        for (std::int64_t c = 0; c < c_; ++c)
          dl[static_cast<std::size_t>(r * c_ + c)] = (std::exp(row[c] - mx) / z - (c == y[r] ? 1.0f : 0.0f)) * scale;
      }
      out.per_example_loss = std::move(loss);
    }
    out.predictions = std::move(logits);
    if (grads == nullptr) return out;
    // Output layer.
    float *gw1 = (*grads)[0].data<float>(), *gb1 = (*grads)[1].data<float>(), *gw2 = (*grads)[2].data<float>(),
          *gb2 = (*grads)[3].data<float>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < c_; ++c) {
        const float g = dl[static_cast<std::size_t>(r * c_ + c)];
        gb2[c] += g;
        for (std::int64_t j = 0; j < h_; ++j) gw2[j * c_ + c] += hid[static_cast<std::size_t>(r * h_ + j)] * g;
      }
    if (sink) sink->ready(2, 2);
    // Hidden layer (reads W2, never the reported gradients).
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < h_; ++j) {
        float d = 0;
        for (std::int64_t c = 0; c < c_; ++c) d += dl[static_cast<std::size_t>(r * c_ + c)] * w2p[j * c_ + c];
        const float hv = hid[static_cast<std::size_t>(r * h_ + j)];
        d *= 1.0f - hv * hv;
        gb1[j] += d;
        for (std::int64_t i = 0; i < f_; ++i) gw1[i * h_ + j] += xp[r * f_ + i] * d;
      }
    if (sink) {
      ++backward_steps;
      if (wait_for_output_layer) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!(sink->reduced(2) && sink->reduced(3))) {
          if (std::chrono::steady_clock::now() > deadline)
            throw std::runtime_error("LayeredModel: the output layer's gradients were not reduced within 60 s "
                                     "while the hidden layer's backward pass waited for them");
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      if (sink->reduced(2) && sink->reduced(3)) ++seen_reduced;
      sink->ready(0, 2);
    }
    return out;
  }

  std::int64_t f_, h_, c_;
  std::unique_ptr<Variable> w1_, b1_, w2_, b2_;
};

}  // namespace strata::test
