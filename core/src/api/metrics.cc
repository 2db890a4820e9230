// SPDX-License-Identifier: Apache-2.0
// Metrics (see strata/metrics.hpp). Each update reduces its examples to two
// numbers (a total and a count) on the calling replica, and only those go
// into the sync-on-read variables, so a replica's update never waits for the
// others; the cross-replica read does the aggregation.
#include "strata/metrics.hpp"

#include <algorithm>
#include <cmath>

#include "api/kernels.h"
#include "strata/checkpoint.hpp"
#include "strata/distribute.hpp"
#include "strata/error.hpp"
#include "strata/strategy.hpp"

namespace strata {

namespace {

std::vector<double> doubles(const TensorView& v) { return Tensor::copy_of(v).to_doubles(); }

bool in_replica_context() { return has_strategy() && !in_cross_replica_context(); }

Variable make_state(const std::string& metric, const char* what) {
  return Variable(Tensor::scalar<double>(0.0),
                  VariableOptions{metric + "/" + what, false, Synchronization::ON_READ, Aggregation::SUM});
}

// Integer labels of shape [batch] or [batch, 1].
std::vector<std::int64_t> labels(const std::string& metric, const TensorView& y_true, std::int64_t batch,
                                 std::int64_t classes) {
  const std::vector<std::int64_t> shape = y_true.shape();
  STRATA_ENFORCE(y_true.dtype() == DType::kInt32 || y_true.dtype() == DType::kInt64, STRATA_ERR_INVALID_ARGUMENT,
                 metric, ": labels must be int32 or int64; got ", dtype_name(y_true.dtype()));
  STRATA_ENFORCE((shape.size() == 1 && shape[0] == batch) || (shape.size() == 2 && shape[0] == batch && shape[1] == 1),
                 STRATA_ERR_INVALID_ARGUMENT, metric, ": labels of shape ", detail::shape_string(shape),
                 " do not match predictions for ", batch, " examples (expected [", batch, "] or [", batch, ", 1])");
  std::vector<std::int64_t> out;
  for (double d : doubles(y_true)) {
    const auto l = static_cast<std::int64_t>(d);
    STRATA_ENFORCE(l >= 0 && l < classes, STRATA_ERR_INVALID_ARGUMENT, metric, ": label ", l,
                   " is outside [0, ", classes, ")");
    out.push_back(l);
  }
  return out;
}

// [batch, classes] predictions as rows of doubles.
std::vector<double> predictions(const std::string& metric, const TensorView& y_pred, std::int64_t* batch,
                                std::int64_t* classes) {
  const std::vector<std::int64_t> shape = y_pred.shape();
  STRATA_ENFORCE(shape.size() == 2 && shape[1] > 0, STRATA_ERR_INVALID_ARGUMENT, metric,
                 ": predictions must be [batch, classes]; got ", detail::shape_string(shape));
  *batch = shape[0];
  *classes = shape[1];
  return doubles(y_pred);
}

}  // namespace

Metric::Metric(std::string name)
    : name_(std::move(name)),
      total_(std::make_unique<Variable>(make_state(name_, "total"))),
      count_(std::make_unique<Variable>(make_state(name_, "count"))) {
  STRATA_ENFORCE(!name_.empty(), STRATA_ERR_INVALID_ARGUMENT, "a metric needs a name");
}

Metric::~Metric() = default;

void Metric::add(double total, double count) {
  if (in_replica_context()) {
    total_->assign_add(Tensor::scalar(total));
    count_->assign_add(Tensor::scalar(count));
    return;
  }
  total_->assign(Tensor::scalar(total_->value().data<double>()[0] + total));
  count_->assign(Tensor::scalar(count_->value().data<double>()[0] + count));
}

double Metric::result() const {
  STRATA_ENFORCE(!in_replica_context(), STRATA_ERR_FAILED_PRECONDITION, "metric '", name_,
                 "' was read inside a replica function, which sees only its own replica's part; read result() in "
                 "cross-replica context (outside run), where it is aggregated over every replica and worker");
  const double total = total_->value().data<double>()[0];
  if (is_sum()) return total;
  const double count = count_->value().data<double>()[0];
  return count == 0 ? 0.0 : total / count;
}

double Metric::count() const {
  STRATA_ENFORCE(!in_replica_context(), STRATA_ERR_FAILED_PRECONDITION, "metric '", name_,
                 "': count() inside a replica function; read it in cross-replica context (outside run)");
  return count_->value().data<double>()[0];
}

void Metric::reset_state() {
  STRATA_ENFORCE(!in_replica_context(), STRATA_ERR_FAILED_PRECONDITION, "metric '", name_,
                 "': reset_state() inside a replica function; reset in cross-replica context (outside run)");
  total_->assign(Tensor::scalar(0.0));
  count_->assign(Tensor::scalar(0.0));
}

void Metric::track(Checkpoint& checkpoint, const std::string& prefix) {
  const std::string p = prefix.empty() ? name_ : prefix;
  checkpoint.track(p + "/total", *total_).track(p + "/count", *count_);
}

Mean::Mean(std::string name) : Metric(std::move(name)) {}

void Mean::update_state(const TensorView& values, const std::optional<TensorView>& sample_weight) {
  const std::vector<double> v = doubles(values);
  if (!sample_weight) {
    double total = 0;
    for (double x : v) total += x;
    add(total, static_cast<double>(v.size()));
    return;
  }
  const std::vector<double> w = doubles(*sample_weight);
  const std::vector<std::int64_t> vs = values.shape(), ws = sample_weight->shape();
  double total = 0, count = 0;
  if (w.size() == 1 && ws.empty()) {
    for (double x : v) total += x * w[0];
    count = w[0] * static_cast<double>(v.size());
  } else if (ws == vs) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      total += v[i] * w[i];
      count += w[i];
    }
  } else if (ws.size() == 1 && !vs.empty() && ws[0] == vs[0]) {
    const std::size_t per_row = vs[0] == 0 ? 0 : v.size() / static_cast<std::size_t>(vs[0]);
    for (std::size_t i = 0; i < v.size(); ++i) {
      total += v[i] * w[i / per_row];
      count += w[i / per_row];
    }
  } else {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, name(), ": sample_weight of shape ", detail::shape_string(ws),
                 " does not fit values of shape ", detail::shape_string(vs), " (a scalar, the values' shape, or [",
                 vs.empty() ? 1 : vs[0], "])");
  }
  add(total, count);
}

Sum::Sum(std::string name) : Metric(std::move(name)) {}

void Sum::update_state(const TensorView& values) {
  double total = 0;
  for (double x : doubles(values)) total += x;
  add(total, 0);
}

Accuracy::Accuracy(std::string name) : Metric(std::move(name)) {}

void Accuracy::update_state(const TensorView& y_true, const TensorView& y_pred) {
  STRATA_ENFORCE(y_true.shape() == y_pred.shape(), STRATA_ERR_INVALID_ARGUMENT, name(), ": y_true ",
                 detail::shape_string(y_true.shape()), " and y_pred ", detail::shape_string(y_pred.shape()), " differ in shape");
  const std::vector<double> t = doubles(y_true), p = doubles(y_pred);
  double hits = 0;
  for (std::size_t i = 0; i < t.size(); ++i) hits += t[i] == p[i] ? 1 : 0;
  add(hits, static_cast<double>(t.size()));
}

SparseCategoricalAccuracy::SparseCategoricalAccuracy(std::string name) : Metric(std::move(name)) {}

void SparseCategoricalAccuracy::update_state(const TensorView& y_true, const TensorView& y_pred) {
  std::int64_t batch = 0, classes = 0;
  const std::vector<double> p = predictions(name(), y_pred, &batch, &classes);
  const std::vector<std::int64_t> l = labels(name(), y_true, batch, classes);
  double hits = 0;
  for (std::int64_t i = 0; i < batch; ++i) {
    const double* row = p.data() + i * classes;
    const auto best = std::max_element(row, row + classes) - row;  // the first maximum
    hits += best == l[static_cast<std::size_t>(i)] ? 1 : 0;
  }
  add(hits, static_cast<double>(batch));
}

SparseCategoricalCrossentropy::SparseCategoricalCrossentropy(std::string name, bool from_logits)
    : Metric(std::move(name)), from_logits_(from_logits) {}

void SparseCategoricalCrossentropy::update_state(const TensorView& y_true, const TensorView& y_pred) {
  std::int64_t batch = 0, classes = 0;
  const std::vector<double> p = predictions(name(), y_pred, &batch, &classes);
  const std::vector<std::int64_t> l = labels(name(), y_true, batch, classes);
  constexpr double kEpsilon = 1e-7;  // Keras' backend epsilon
  double total = 0;
  for (std::int64_t i = 0; i < batch; ++i) {
    const double* row = p.data() + i * classes;
    const std::int64_t label = l[static_cast<std::size_t>(i)];
    if (from_logits_) {
      const double mx = *std::max_element(row, row + classes);
      double s = 0;
      for (std::int64_t c = 0; c < classes; ++c) s += std::exp(row[c] - mx);
      total += mx + std::log(s) - row[label];
    } else {
      double s = 0;
      for (std::int64_t c = 0; c < classes; ++c) s += row[c];
      const double q = std::clamp(row[label] / s, kEpsilon, 1 - kEpsilon);
      total += -std::log(q);
    }
  }
  add(total, static_cast<double>(batch));
}

}  // namespace strata
