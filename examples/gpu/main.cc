// SPDX-License-Identifier: Apache-2.0
// strata-gpu-example: MirroredStrategy over every visible GPU, or the host
// when there is none (the same program, unchanged); with
// STRATA_STRATEGY=multi_worker_mirrored under strata-run, several workers,
// each on the GPUs strata-run gives it. Each replica's share of
// a batch arrives on its GPU, the weights live in GPU memory, and the MEAN
// update and the loss are all-reduced there (NCCL for GPU replicas). The
// gradient is computed on the host so that this program needs no kernel
// toolchain: a real model enqueues its kernels on ctx.stream() instead.
#include <strata/strata.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {
constexpr int kFeatures = 8;
constexpr int kRows = 4096;  // training rows; as many again for the test
constexpr int kGlobalBatch = 256;
constexpr int kEpochs = 5;
constexpr float kLearningRate = 0.5f;

// Linearly separable rows: the label is 1 where x . w_true > 0.
void make_rows(std::mt19937& rng, const std::vector<float>& w_true, std::vector<float>& x, std::vector<float>& y) {
  std::normal_distribution<float> normal;
  x.resize(kRows * kFeatures);
  y.resize(kRows);
  for (int i = 0; i < kRows; ++i) {
    float dot = 0;
    for (int j = 0; j < kFeatures; ++j) dot += (x[i * kFeatures + j] = normal(rng)) * w_true[j];
    y[i] = dot > 0 ? 1.0f : 0.0f;
  }
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
}  // namespace

int main() {
  using namespace strata;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> w_true(kFeatures), x_train, y_train, x_test, y_test;
  for (float& w : w_true) w = normal(rng);
  make_rows(rng, w_true, x_train, y_train);
  make_rows(rng, w_true, x_test, y_test);

  // mirrored (every visible GPU, else cpu:0) unless the job config
  // ($STRATA_CONFIG) or $STRATA_STRATEGY names another strategy.
  const char* config_file = std::getenv("STRATA_CONFIG");
  Config config = config_file != nullptr ? Config::from_file(config_file) : Config();
  config.apply_env();
  if (config.name("strategy").empty()) config.set("/strategy/name", "\"mirrored\"");
  Strategy strategy = Strategy::from_config(config);
  std::printf("%s on %d replica(s):", config.name("strategy").c_str(), strategy.num_replicas_in_sync());
  for (const std::string& d : strategy.extended().worker_devices()) std::printf(" %s", d.c_str());
  std::printf("\n");
  Scope scope = strategy.scope();
  VariableOptions vo;
  vo.name = "w";
  vo.aggregation = Aggregation::MEAN;  // replica updates are averaged, as gradients are
  Variable w(Tensor::zeros({kFeatures}, DType::kFloat32), vo);

  Element data;
  data.add("x", Tensor::from_vector(x_train, {kRows, kFeatures}));
  data.add("y", Tensor::from_vector(y_train, {kRows}));
  auto input = strategy.distribute_dataset(
      Dataset::from_tensor_slices(std::move(data)).shuffle(kRows, /*seed=*/1).batch(kGlobalBatch));
  float loss = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    float epoch_loss = 0;
    int steps = 0;
    for (DistributedElement& batch : input) {
      PerReplica losses = strategy.run([&](ReplicaContext& ctx) {
        // This replica's rows, and w.value(), are on its device.
        const Tensor& x_dev = batch["x"][ctx.local_replica_id()];
        const Tensor& y_dev = batch["y"][ctx.local_replica_id()];
        const Tensor x = x_dev.to("cpu:0"), y = y_dev.to("cpu:0"), wv = w.value().to("cpu:0");
        const std::int64_t n = x.shape()[0];
        std::vector<float> grad(kFeatures, 0.0f);
        float local_loss = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          float z = 0;
          for (int j = 0; j < kFeatures; ++j) z += x.data<float>()[i * kFeatures + j] * wv.data<float>()[j];
          const float p = sigmoid(z), label = y.data<float>()[i];
          local_loss -= label * std::log(p + 1e-7f) + (1 - label) * std::log(1 - p + 1e-7f);
          for (int j = 0; j < kFeatures; ++j) grad[j] += (p - label) * x.data<float>()[i * kFeatures + j];
        }
        // Averaged over this replica's rows; MEAN aggregation then
        // averages the replicas' updates.
        for (float& g : grad) g *= kLearningRate / static_cast<float>(n);
        w.assign_sub(Tensor::from_vector(grad, {kFeatures}).to(x_dev.device()));
        // The loss over the global batch, summed on the replicas' devices.
        Tensor l = Tensor::scalar(local_loss / kGlobalBatch).to(x_dev.device());
        return ctx.all_reduce(ReduceOp::SUM, l);
      });
      epoch_loss += losses[0].to("cpu:0").data<float>()[0];
      ++steps;
    }
    loss = epoch_loss / static_cast<float>(steps);
    std::printf("epoch %d: loss %.4f\n", epoch + 1, loss);
  }

  const Tensor wv = w.value();  // cross-replica read: a host tensor
  int correct = 0;
  for (int i = 0; i < kRows; ++i) {
    float z = 0;
    for (int j = 0; j < kFeatures; ++j) z += x_test[i * kFeatures + j] * wv.data<float>()[j];
    correct += (z > 0) == (y_test[i] > 0.5f);
  }
  std::printf("final loss %.4f, test accuracy: %.4f\n", loss, static_cast<float>(correct) / kRows);
  return 0;
}
