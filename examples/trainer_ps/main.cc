// SPDX-License-Identifier: Apache-2.0
// Model.fit with the parameter_server strategy (Keras' fit with
// ParameterServerStrategy): one program for every role. The chief builds
// the registered model, the ps tasks hold its variables, each worker builds
// the same model by name, bound to them, and trains on its own input
// asynchronously; callbacks run on the chief. Alone (no cluster) the same
// program trains on one_device.
//
//   build/bin/strata-run --chief 1 --workers 2 --ps 1 -- build/bin/strata-trainer-ps-example
//   build/bin/strata-trainer-ps-example
#include <strata/config.hpp>
#include <strata/coordinator.hpp>
#include <strata/plugin_host.hpp>
#include <strata/strata.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
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
  strata::ForwardResult pass(const strata::Features& batch, double loss_scale, std::vector<strata::Tensor>* grads) {
    const std::int64_t rows = batch.batch_size();
    const float* x = batch["x"].data<float>();
    const strata::Tensor w = w_.value(), b = b_.value();  // under parameter_server: read from the ps tasks
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

// Every role registers the model (built inside the strategy's scope) and the input.
STRATA_REGISTER_MODEL("softmax", [] {
  return strata::ModelParts{std::make_unique<Softmax>(), std::make_unique<strata::SGD>(0.1, /*momentum=*/0.9)};
});
// Each worker's own input: its shard, repeated; 64 rows per step.
STRATA_REGISTER_DATASET_FN("train", [](const strata::InputContext& ctx) {
  return blobs(4096, 1)
      .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
      .shuffle(4096, /*seed=*/7)
      .repeat()
      .batch(ctx.get_per_replica_batch_size(64));
});

int main() {
  try {
    strata::Config config;
    config.apply_env();
    strata::PluginHost::global().set_config(config.json());
    const std::string role = strata::current_task_type();  // set by strata-run (TF_CONFIG)
    if (role == "worker" || role == "ps") {
      strata::Server::from_env().join();  // run the chief's steps / hold the variables until stopped
      return 0;
    }
    config.set("/strategy/name", role == "chief" ? "\"parameter_server\"" : "\"one_device\"");
    strata::Strategy strategy = strata::Strategy::from_config(config);
    std::optional<strata::ClusterCoordinator> coordinator;
    if (role == "chief") coordinator.emplace();  // before the model: it places the variables on the ps tasks

    strata::Trainer trainer(strategy, "softmax", {"accuracy"});
    strata::EarlyStopping early_stopping("val_loss", /*min_delta=*/1e-3, /*patience=*/2);
    strata::FitOptions options;
    options.epochs = 10;
    options.steps_per_epoch = 50;  // required under parameter_server, as in Keras
    options.validation_data = blobs(512, 2).batch(128);  // evaluated on the chief
    options.callbacks = {&early_stopping};
    strata::History history = trainer.fit(strata::DatasetCreator{"train"}, options);

    strata::Logs test = trainer.evaluate(blobs(1024, 3).batch(256));
    std::printf("%zu epochs on %s, final loss %.4f, test loss %.4f, test accuracy: %.4f\n", history.epochs.size(),
                strategy.name().c_str(), history.last("loss"), test["loss"], test["accuracy"]);
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-trainer-ps-example: %s\n", e.what());
    return 1;
  }
}
