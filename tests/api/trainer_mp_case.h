// SPDX-License-Identifier: Apache-2.0
// The Trainer runs that trainer_mp_test compares: each case trains a fresh
// model on a given strategy and returns everything it can compare (weights,
// History, evaluate's logs, predict's rows, EarlyStopping's epoch, the
// overlap hook's counts) as named vectors of doubles. The test runs a case
// on one_device in its own process and on multi_worker_mirrored in 1, 2 and
// 4 processes (trainer_mp_worker under strata-run), which write their
// results as text with hex floats, so that the comparison sees every bit.
//
// Cases:
//   fit       SoftmaxModel, SGD with momentum, accuracy and cross-entropy
//             metrics, validation every epoch, EarlyStopping on the
//             training loss (min_delta kEarlyStopDelta), then evaluate and
//             predict.
//   plain     LayeredModel without layer reports: the default train_step's
//             one batched all-reduce.
//   deferred  LayeredModel reporting layers, overlap off: the same buckets,
//             reduced after the backward pass.
//   overlap   LayeredModel reporting layers, overlap on; with one bucket
//             per layer, the hook holds the first layer's backward pass
//             until the last layer is reduced.
#pragma once

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "layered_model.h"
#include "softmax_model.h"
#include "strata/strata.hpp"

namespace strata::test {

using CaseResult = std::map<std::string, std::vector<double>>;

constexpr std::int64_t kMpFeatures = 4, kMpClasses = 3, kMpHidden = 16;
// The fit case stops once an epoch improves the training loss by less than
// this. With one_device its losses fall by more than that up to epoch 2
// and less at epoch 3, far enough from it on both sides that float
// rounding cannot move the epoch (the test checks the margins).
constexpr double kEarlyStopDelta = 0.004;
constexpr std::int64_t kPredictRows = 96, kPredictBatch = 32;

inline Dataset mp_train_data() {
  return Dataset::from_tensor_slices(clusters(512, kMpFeatures, kMpClasses, 21)).batch(32);
}
inline Dataset mp_test_data() {
  return Dataset::from_tensor_slices(clusters(256, kMpFeatures, kMpClasses, 22)).batch(64);
}
inline Element mp_predict_rows() { return clusters(kPredictRows, kMpFeatures, kMpClasses, 23); }

inline void add_weights(CaseResult& out, Model& model) {
  for (Variable* v : model.trainable_variables()) {
    const std::vector<float> w = v->value().to_vector<float>();
    out["w:" + v->name()] = std::vector<double>(w.begin(), w.end());
  }
}

inline void add_history(CaseResult& out, const History& h) {
  for (const auto& [k, v] : h.history) out["hist:" + k] = v;
  out["epochs"] = std::vector<double>(h.epochs.begin(), h.epochs.end());
}

/// Run case `name` on `strategy` (every worker calls it alike). The
/// layered cases pack `bucket_bytes` per collective (0: one per layer).
inline CaseResult run_case(Strategy& strategy, const std::string& name, std::int64_t bucket_bytes = 0) {
  CaseResult out;
  std::optional<Scope> scope(strategy.scope());
  if (name == "fit") {
    SoftmaxModel model(kMpFeatures, kMpClasses, 3);
    SGD opt(0.05, 0.9);
    Trainer trainer(strategy, model, opt, {"accuracy", "sparse_categorical_crossentropy_from_logits"});
    scope.reset();
    EarlyStopping stop("loss", kEarlyStopDelta, 0);
    FitOptions o;
    o.epochs = 10;
    o.validation_data = mp_test_data();
    o.callbacks = {&stop};
    o.verbose = false;
    add_history(out, trainer.fit(mp_train_data(), o));
    out["stopped_epoch"] = {static_cast<double>(stop.stopped_epoch())};
    add_weights(out, model);
    for (const auto& [k, v] : trainer.evaluate(mp_test_data())) out["eval:" + k] = {v};
    const Tensor p = trainer.predict(Dataset::from_tensor_slices(mp_predict_rows()).batch(kPredictBatch));
    const std::vector<float> pv = p.to_vector<float>();
    out["predict"] = std::vector<double>(pv.begin(), pv.end());
    return out;
  }
  if (name == "plain" || name == "deferred" || name == "overlap") {
    LayeredModel model(kMpFeatures, kMpHidden, kMpClasses);
    model.by_layer = name != "plain";
    // The hook can wait only when the output layer's report closes a
    // bucket; with larger buckets everything goes out at the end.
    model.wait_for_output_layer = name == "overlap" && bucket_bytes == 0;
    Adam opt(0.02);
    Trainer trainer(strategy, model, opt, {"accuracy"});
    scope.reset();
    trainer.gradient_reduction.overlap = name == "overlap";
    trainer.gradient_reduction.bucket_bytes = bucket_bytes;
    FitOptions o;
    o.epochs = 2;
    o.verbose = false;
    add_history(out, trainer.fit(mp_train_data(), o));
    add_weights(out, model);
    out["seen_reduced"] = {static_cast<double>(model.seen_reduced.load())};
    out["backward_steps"] = {static_cast<double>(model.backward_steps.load())};
    return out;
  }
  if (name == "nan") {
    // One row of global batch 5 is NaN: only the worker whose share holds
    // it computes a NaN loss, but the loss metric is reduced across
    // workers, so TerminateOnNaN stops every worker after the same batch.
    Element e = clusters(512, kMpFeatures, kMpClasses, 21);
    e["x"].data<float>()[(32 * 5 + 7) * kMpFeatures + 1] = std::nanf("");
    SoftmaxModel model(kMpFeatures, kMpClasses, 3);
    SGD opt(0.05);
    Trainer trainer(strategy, model, opt);
    scope.reset();
    TerminateOnNaN nan_stop;
    FitOptions o;
    o.epochs = 3;
    o.callbacks = {&nan_stop};
    o.verbose = false;
    add_history(out, trainer.fit(Dataset::from_tensor_slices(std::move(e)).batch(32), o));
    out["stopped"] = {static_cast<double>(nan_stop.stopped_epoch()), static_cast<double>(nan_stop.stopped_batch()),
                      static_cast<double>(trainer.global_step())};
    return out;
  }
  throw std::invalid_argument("unknown case '" + name + "'; use fit, plain, deferred, overlap or nan");
}

/// One line per entry: "name count v..." with hex floats (exact).
inline std::string serialize(const CaseResult& r) {
  std::string s;
  char buf[64];
  for (const auto& [k, v] : r) {
    s += k + " " + std::to_string(v.size());
    for (double x : v) {
      std::snprintf(buf, sizeof buf, " %a", x);
      s += buf;
    }
    s += "\n";
  }
  return s;
}

inline CaseResult parse(const std::string& text) {
  CaseResult r;
  std::istringstream in(text);
  std::string key;
  std::size_t n = 0;
  while (in >> key >> n) {
    std::vector<double>& v = r[key];
    for (std::size_t i = 0; i < n; ++i) {
      std::string tok;
      in >> tok;
      v.push_back(std::strtod(tok.c_str(), nullptr));
    }
  }
  return r;
}

}  // namespace strata::test
