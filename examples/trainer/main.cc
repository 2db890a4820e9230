// SPDX-License-Identifier: Apache-2.0
// A complete strata::Trainer program (the README's Model.fit example): a
// softmax classifier created in the strategy's scope, a dataset, fit with
// callbacks, evaluate. It runs as one process, or as N workers under
// strata-run (TF_CONFIG set):
//
//   build/bin/strata-trainer-example
//   build/bin/strata-run -n 2 -- build/bin/strata-trainer-example
#include <strata/strata.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

// logits = x W + b; loss = cross-entropy of the integer label y.
class Softmax : public strata::Model {
 public:
  static constexpr std::int64_t kFeatures = 2, kClasses = 3;
  std::vector<strata::Variable*> trainable_variables() override { return {&w_, &b_}; }

  strata::ForwardResult forward(const strata::Features& batch) override { return pass(batch, 0, nullptr); }
  strata::ForwardResult forward_backward(const strata::Features& batch, double loss_scale,
                                         std::vector<strata::Tensor>& grads) override {
    return pass(batch, loss_scale, &grads);
  }

 private:
  // Predictions; with labels, the per-example losses; with `grads`, adds
  // loss_scale * d(sum of losses)/d(W, b) to them.
  strata::ForwardResult pass(const strata::Features& batch, double loss_scale, std::vector<strata::Tensor>* grads) {
    const std::int64_t rows = batch.batch_size();
    const float* x = batch["x"].data<float>();
    const strata::Tensor w = w_.value(), b = b_.value();
    strata::ForwardResult out;
    out.predictions = strata::Tensor::zeros({rows, kClasses}, strata::DType::kFloat32);
    float* logits = out.predictions.data<float>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < kClasses; ++c) {
        float s = b.data<float>()[c];
        for (std::int64_t f = 0; f < kFeatures; ++f) s += x[r * kFeatures + f] * w.data<float>()[f * kClasses + c];
        logits[r * kClasses + c] = s;
      }
    if (!batch.contains("y")) return out;  // predict()
    const std::int32_t* y = batch["y"].data<std::int32_t>();
    out.per_example_loss = strata::Tensor::zeros({rows}, strata::DType::kFloat32);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = logits + r * kClasses;
      float mx = row[0], z = 0;
      for (std::int64_t c = 1; c < kClasses; ++c) mx = std::max(mx, row[c]);
      for (std::int64_t c = 0; c < kClasses; ++c) z += std::exp(row[c] - mx);
      out.per_example_loss.data<float>()[r] = mx + std::log(z) - row[y[r]];
      if (grads == nullptr) continue;
      for (std::int64_t c = 0; c < kClasses; ++c) {
        const float g = (std::exp(row[c] - mx) / z - (c == y[r] ? 1.0f : 0.0f)) * static_cast<float>(loss_scale);
        (*grads)[1].data<float>()[c] += g;
        for (std::int64_t f = 0; f < kFeatures; ++f) (*grads)[0].data<float>()[f * kClasses + c] += x[r * kFeatures + f] * g;
      }
    }
    return out;
  }

  strata::Variable w_{strata::Tensor::zeros({kFeatures, kClasses}, strata::DType::kFloat32), {"dense/kernel"}};
  strata::Variable b_{strata::Tensor::zeros({kClasses}, strata::DType::kFloat32), {"dense/bias"}};
};

// n points around three centres: x [n, 2] float32, y [n] int32.
strata::Dataset blobs(std::int64_t n, unsigned seed) {
  const float centres[3][2] = {{0, 3}, {3, -2}, {-3, -2}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::int32_t>(rng() % 3);
    y.push_back(label);
    x.push_back(centres[label][0] + noise(rng));
    x.push_back(centres[label][1] + noise(rng));
  }
  strata::Element e;
  e.add("x", strata::Tensor::from_vector(x, {n, 2}));
  e.add("y", strata::Tensor::from_vector(y, {n}));
  return strata::Dataset::from_tensor_slices(std::move(e));
}

int main() {
  try {
    // One worker alone, every worker of the cluster under strata-run.
    strata::Config config;
    config.set("/strategy/name", "\"multi_worker_mirrored\"");
    config.apply_env();  // STRATA_STRATEGY=mirrored etc. override it
    strata::Strategy strategy = strata::Strategy::from_config(config);

    std::optional<strata::Scope> scope(strategy.scope());
    Softmax model;                                           // its variables belong to the strategy
    strata::SGD optimizer(strata::ExponentialDecay(0.5, 100, 0.5), /*momentum=*/0.9);
    strata::Trainer trainer(strategy, model, optimizer, {"accuracy"});
    scope.reset();

    strata::EarlyStopping early_stopping("val_loss", /*min_delta=*/1e-3, /*patience=*/2);
    strata::FitOptions options;
    options.epochs = 20;
    options.validation_data = blobs(512, 2).batch(128);
    options.callbacks = {&early_stopping};
    // The GLOBAL batch: each worker's replicas get their share of it.
    strata::History history = trainer.fit(blobs(4096, 1).shuffle(4096, /*seed=*/7).batch(128), options);

    strata::Logs test = trainer.evaluate(blobs(1024, 3).batch(256));
    if (strategy.extended().is_chief())
      std::printf("%zu epochs, final loss %.4f, test loss %.4f, test accuracy: %.4f\n", history.epochs.size(),
                  history.last("loss"), test["loss"], test["accuracy"]);
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-trainer-example: %s\n", e.what());
    return 1;
  }
}
