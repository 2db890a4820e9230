// SPDX-License-Identifier: Apache-2.0
// Deterministic examples for the metrics tests and the direct computations
// the metrics must equal (Keras' definitions, written out plainly).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "strata/tensor.hpp"

namespace strata::test {

struct MetricsData {
  std::int64_t batch = 0, classes = 0;
  std::vector<float> x, probs_, logits_;
  std::vector<std::int32_t> y, guess;

  static MetricsData make(std::int64_t batch, std::int64_t classes, unsigned seed) {
    MetricsData d;
    d.batch = batch;
    d.classes = classes;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.01f, 1.0f), n(-3.0f, 3.0f);
    for (std::int64_t i = 0; i < batch; ++i) {
      d.x.push_back(n(rng));
      d.y.push_back(static_cast<std::int32_t>(rng() % static_cast<unsigned>(classes)));
      d.guess.push_back(rng() % 3 == 0 ? d.y.back() + 1 : d.y.back());
      for (std::int64_t c = 0; c < classes; ++c) {
        d.probs_.push_back(u(rng));
        d.logits_.push_back(n(rng));
      }
    }
    return d;
  }
  Tensor values(std::int64_t lo, std::int64_t hi) const {
    return Tensor::from_vector(std::vector<float>(x.begin() + lo, x.begin() + hi), {hi - lo});
  }
  Tensor labels(std::int64_t lo, std::int64_t hi) const {
    return Tensor::from_vector(std::vector<std::int32_t>(y.begin() + lo, y.begin() + hi), {hi - lo});
  }
  Tensor guesses(std::int64_t lo, std::int64_t hi) const {
    return Tensor::from_vector(std::vector<std::int32_t>(guess.begin() + lo, guess.begin() + hi), {hi - lo});
  }
  Tensor probs(std::int64_t lo, std::int64_t hi) const {
    return Tensor::from_vector(std::vector<float>(probs_.begin() + lo * classes, probs_.begin() + hi * classes),
                               {hi - lo, classes});
  }
  Tensor logits(std::int64_t lo, std::int64_t hi) const {
    return Tensor::from_vector(std::vector<float>(logits_.begin() + lo * classes, logits_.begin() + hi * classes),
                               {hi - lo, classes});
  }
  double sum() const {
    double s = 0;
    for (float v : x) s += v;
    return s;
  }
  double mean() const { return sum() / static_cast<double>(batch); }
  double accuracy() const {
    double hits = 0;
    for (std::size_t i = 0; i < y.size(); ++i) hits += y[i] == guess[i];
    return hits / static_cast<double>(batch);
  }
  double sparse_accuracy() const {
    double hits = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      const float* row = probs_.data() + i * classes;
      hits += (std::max_element(row, row + classes) - row) == y[static_cast<std::size_t>(i)];
    }
    return hits / static_cast<double>(batch);
  }
  // -log(softmax(logits)[y])
  double crossentropy_logits() const {
    double total = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      double z = 0;
      for (std::int64_t c = 0; c < classes; ++c) z += std::exp(static_cast<double>(logits_[static_cast<std::size_t>(i * classes + c)]));
      total += std::log(z) - logits_[static_cast<std::size_t>(i * classes + y[static_cast<std::size_t>(i)])];
    }
    return total / static_cast<double>(batch);
  }
  // -log(p[y] / sum(p)), no clipping needed for these probabilities
  double crossentropy_probs() const {
    double total = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      double s = 0;
      for (std::int64_t c = 0; c < classes; ++c) s += probs_[static_cast<std::size_t>(i * classes + c)];
      total += -std::log(probs_[static_cast<std::size_t>(i * classes + y[static_cast<std::size_t>(i)])] / s);
    }
    return total / static_cast<double>(batch);
  }
};

}  // namespace strata::test
