// SPDX-License-Identifier: Apache-2.0
// The example model of strata-train: a two-layer perceptron (tanh hidden
// layer, softmax output) trained on a deterministic synthetic
// classification set whose labels come from a fixed random "teacher"
// network. Plain C++, no tensor library: Strata only sees the weights and
// gradients as DLPack tensors.
//
// Everything is a pure function of the seed, so every process and every
// strategy sees identical data and initial weights: that is what lets the
// tests compare strategies weight for weight.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::train {

struct ModelShape {
  int features = 64;
  int hidden = 128;
  int classes = 8;
  std::int64_t num_params(int i) const;  // element count of parameter i (W1, b1, W2, b2)
};

/// Names and shapes of the four parameters, in order W1 [F,H], b1 [H], W2 [H,C], b2 [C].
const char* param_name(int i);
std::vector<std::int64_t> param_shape(const ModelShape& m, int i);

/// The synthetic data set: `size` examples of `features` floats in [-1, 1)
/// and a label in [0, classes).
class SyntheticData {
 public:
  /// The teacher (the labelling rule) comes from `seed`; the inputs from
  /// `seed` and `stream`, so stream 1 is a held-out set of the same task.
  SyntheticData(const ModelShape& m, std::int64_t size, std::uint64_t seed, std::uint64_t stream = 0);
  std::int64_t size() const { return size_; }
  /// [size, features] row-major.
  const std::vector<float>& features() const { return x_; }
  /// [size].
  const std::vector<std::int32_t>& labels() const { return labels_; }

 private:
  std::int64_t size_;
  std::vector<float> x_;
  std::vector<std::int32_t> labels_;
};

/// Deterministic initial value of parameter i (Glorot-uniform weights, zero biases).
std::vector<float> initial_param(const ModelShape& m, int i, std::uint64_t seed);

/// Forward and backward pass over `count` examples: x [count, features]
/// row-major and their labels. Adds d(loss)/d(param) * scale into grads[0..3] (float, same shapes as the
/// parameters; accumulated in double internally) and returns the sum of the
/// per-example cross-entropy losses times `scale`. params[i] point at the
/// four parameters. grads == nullptr: forward only. logits_out ([count,
/// classes]) and losses_out ([count], unscaled) receive the forward pass
/// when not null.
double forward_backward(const ModelShape& m, const float* const params[4], const float* x,
                        const std::int32_t* labels, std::int64_t count, double scale, float* const grads[4],
                        float* logits_out = nullptr, float* losses_out = nullptr);

/// The fraction of `data` the model `params` classifies right (arg-max of
/// the logits, the first maximum winning).
double accuracy(const ModelShape& m, const float* const params[4], const SyntheticData& data);

}  // namespace strata::train
