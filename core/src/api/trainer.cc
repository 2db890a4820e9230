// SPDX-License-Identifier: Apache-2.0
// strata::Trainer (see strata/trainer.hpp): Keras' fit loop over a
// distributed dataset, with the default train_step written as the README's
// hand-written loop is (one batched all-reduce, one optimizer update).
#include "strata/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/strategy_impl.h"
#include "api/variable_capture.h"
#include "data/dataset_internal.h"
#include "log.h"
#include "ps/ps_internal.h"
#include "strata/callbacks.hpp"
#include "strata/config.hpp"
#include "strata/coordinator.hpp"
#include "strata/distribute.hpp"
#include "strata/distributed_data.hpp"
#include "strata/error.hpp"
#include "strata/plugin_host.hpp"

namespace strata {

// ---------------------------------------------------------------- Features, History

Features::Features(const std::vector<std::string>* names, std::vector<const Tensor*> tensors)
    : names_(names), tensors_(std::move(tensors)) {}

const Tensor& Features::operator[](const std::string& name) const {
  for (std::size_t i = 0; i < names_->size(); ++i)
    if ((*names_)[i] == name) return *tensors_[i];
  std::string all;
  for (const std::string& n : *names_) all += (all.empty() ? "" : ", ") + n;
  STRATA_THROW(STRATA_ERR_NOT_FOUND, "the batch has no component '", name, "'; it has: ", all);
}

bool Features::contains(const std::string& name) const {
  return std::find(names_->begin(), names_->end(), name) != names_->end();
}

std::int64_t Features::batch_size() const {
  if (tensors_.empty() || tensors_[0]->ndim() == 0) return 0;
  return tensors_[0]->shape()[0];
}

double History::last(const std::string& key) const {
  auto it = history.find(key);
  STRATA_ENFORCE(it != history.end() && !it->second.empty(), STRATA_ERR_NOT_FOUND, "History has no '", key, "'");
  return it->second.back();
}

Model::~Model() = default;
Callback::~Callback() = default;
GradientSink::~GradientSink() = default;

ForwardResult Model::forward_backward_layers(const Features& batch, double loss_scale, std::vector<Tensor>& grads,
                                             GradientSink& sink) {
  ForwardResult r = forward_backward(batch, loss_scale, grads);
  if (!grads.empty()) sink.ready(0, grads.size());
  return r;
}

// ---------------------------------------------------------------- layer-by-layer reduction

// One local replica's reduction thread. The replica thread hands it the
// all-reduce of each bucket as the backward pass makes the bucket's
// gradients final and goes on computing; the jobs run in order, so every
// replica issues the same collectives in the same order. The strategy's
// replica all-reduce takes the replica's handle, not its thread, so it may
// be called from here while the replica thread makes no other collective.
namespace detail {
struct GradientReducer {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  std::size_t pending = 0;  // queued or running
  std::exception_ptr error;
  bool cancel = false;  // the step failed: skip what is queued
  bool stop = false;
  std::thread thread;

  GradientReducer() : thread([this] { loop(); }) {}
  ~GradientReducer() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }

  void loop() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return stop || !jobs.empty(); });
      if (jobs.empty()) return;
      std::function<void()> job = std::move(jobs.front());
      jobs.pop_front();
      if (!error && !cancel) {
        l.unlock();
        std::exception_ptr failed;
        try {
          job();
        } catch (...) {
          failed = std::current_exception();
        }
        l.lock();
        if (failed && !error) error = failed;
      }
      --pending;
      cv.notify_all();
    }
  }

  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu);
      jobs.push_back(std::move(job));
      ++pending;
    }
    cv.notify_all();
  }

  // Wait until every submitted job is done. Each all-reduce is bounded by
  // the strategy's collective timeout, so this wait is bounded by that
  // many timeouts (plus slack) and reports a stuck reduction otherwise.
  // `abandon`: the step failed; skip the queued jobs, forget their errors.
  void drain(double timeout_s, bool abandon) {
    std::unique_lock<std::mutex> l(mu);
    if (abandon) cancel = true;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(timeout_s * static_cast<double>(pending + 1) + 5.0);
    if (!cv.wait_until(l, deadline, [&] { return pending == 0; }))
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "Trainer: the layer-by-layer gradient all-reduce did not finish within ",
                   timeout_s, " s per collective; a replica or worker stopped taking part in it");
    cancel = false;
    std::exception_ptr e = std::move(error);
    error = nullptr;
    if (e && !abandon) std::rethrow_exception(e);
  }
};
}  // namespace detail

namespace {

// The GradientSink of one replica's step: packs the reported ranges into
// buckets and reduces each full bucket in place, on the replica's reducer
// (overlap) or after the backward pass. Jobs hold it by shared_ptr.
class LayeredStep final : public GradientSink, public std::enable_shared_from_this<LayeredStep> {
 public:
  LayeredStep(ReplicaContext& ctx, std::vector<Tensor>& grads, const std::vector<Variable*>& vars,
              const GradientReduction& options, detail::GradientReducer* reducer)
      : ctx_(ctx), grads_(grads), vars_(vars), options_(options), reducer_(reducer), reported_(vars.size(), 0),
        reduced_(new std::atomic<bool>[vars.size()]) {
    for (std::size_t i = 0; i < vars.size(); ++i) reduced_[i].store(false, std::memory_order_relaxed);
  }

  void ready(std::size_t first, std::size_t count) override {
    const std::size_t n = vars_.size();
    STRATA_ENFORCE(count >= 1 && first < n && count <= n - first, STRATA_ERR_INVALID_ARGUMENT,
                   "GradientSink::ready(", first, ", ", count, "): the model has ", n,
                   " trainable variables; report a non-empty range inside [0, ", n, ")");
    for (std::size_t i = first; i < first + count; ++i) {
      STRATA_ENFORCE(!reported_[i], STRATA_ERR_INVALID_ARGUMENT, "GradientSink::ready: the gradient of variable '",
                     vars_[i]->name(), "' (index ", i, ") was reported twice in one step; report each once");
      reported_[i] = 1;
      bucket_.push_back(i);
      bucket_bytes_ += static_cast<std::int64_t>(grads_[i].nbytes());
    }
    if (bucket_bytes_ >= options_.bucket_bytes) close_bucket();
  }

  bool reduced(std::size_t index) const override {
    return index < vars_.size() && reduced_[index].load(std::memory_order_acquire);
  }

  // After forward_backward_layers returned: every variable must have been
  // reported; the last bucket goes out, and without overlap every bucket is
  // reduced now, in the order the reports made them.
  void finish() {
    for (std::size_t i = 0; i < vars_.size(); ++i)
      STRATA_ENFORCE(reported_[i], STRATA_ERR_INVALID_ARGUMENT, "Trainer: the model's forward_backward_layers did ",
                     "not report the gradient of variable '", vars_[i]->name(), "' (index ", i,
                     "); call sink.ready() for every trainable variable");
    close_bucket();
    for (const std::vector<std::size_t>& b : deferred_) reduce(b);
  }

 private:
  void close_bucket() {
    if (bucket_.empty()) return;
    std::vector<std::size_t> b = std::move(bucket_);
    bucket_.clear();
    bucket_bytes_ = 0;
    if (!options_.overlap) {
      deferred_.push_back(std::move(b));
      return;
    }
    std::shared_ptr<LayeredStep> keep = shared_from_this();
    reducer_->submit([keep, b = std::move(b)] { keep->reduce(b); });
  }

  void reduce(const std::vector<std::size_t>& bucket) {
    std::vector<TensorView> views;
    views.reserve(bucket.size());
    for (std::size_t i : bucket) views.emplace_back(grads_[i]);
    ctx_.all_reduce_in_place(ReduceOp::SUM, views);
    for (std::size_t i : bucket) reduced_[i].store(true, std::memory_order_release);
  }

  ReplicaContext& ctx_;
  std::vector<Tensor>& grads_;
  const std::vector<Variable*> vars_;  // a copy: for names in errors only
  GradientReduction options_;
  detail::GradientReducer* reducer_;
  std::vector<char> reported_;
  std::unique_ptr<std::atomic<bool>[]> reduced_;
  std::vector<std::size_t> bucket_;
  std::int64_t bucket_bytes_ = 0;
  std::vector<std::vector<std::size_t>> deferred_;
};

}  // namespace

struct Trainer::CompiledMetric {
  std::string name;
  std::unique_ptr<Metric> metric;
  std::function<void(const TensorView& y, const TensorView& pred)> update;
};

// ---------------------------------------------------------------- model registry

namespace {

std::mutex& model_registry_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, ModelFactory>& model_registry() {
  static std::map<std::string, ModelFactory> r;
  return r;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

ModelFactory find_model(const std::string& name) {
  {
    std::lock_guard<std::mutex> l(model_registry_mu());
    auto it = model_registry().find(name);
    if (it != model_registry().end()) return it->second;
  }
  const std::vector<std::string> names = registered_models();
  STRATA_THROW(STRATA_ERR_NOT_FOUND, "no model is registered as '", name, "' in this process (registered: ",
               names.empty() ? std::string("none") : joined(names),
               "); register it with STRATA_REGISTER_MODEL(\"", name,
               "\", factory) in the program every role runs");
}

// Leaves every strategy scope of this thread for its lifetime, so that
// what is created meanwhile belongs to the Default strategy (the metrics
// under parameter_server: they are local to each process, not on the ps).
class OutsideScopes {
 public:
  OutsideScopes() { saved_.swap(detail::tls().scopes); }
  ~OutsideScopes() { detail::tls().scopes.swap(saved_); }
  OutsideScopes(const OutsideScopes&) = delete;
  OutsideScopes& operator=(const OutsideScopes&) = delete;

 private:
  std::vector<detail::StrategyImpl*> saved_;
};

}  // namespace

void register_model(const std::string& name, ModelFactory factory) {
  STRATA_ENFORCE(!name.empty(), STRATA_ERR_INVALID_ARGUMENT, "a model needs a non-empty name");
  STRATA_ENFORCE(static_cast<bool>(factory), STRATA_ERR_INVALID_ARGUMENT, "model factory '", name, "' is empty");
  std::lock_guard<std::mutex> l(model_registry_mu());
  STRATA_ENFORCE(model_registry().count(name) == 0, STRATA_ERR_ALREADY_EXISTS, "model '", name,
                 "' is registered twice; give each STRATA_REGISTER_MODEL its own name");
  model_registry()[name] = std::move(factory);
}

std::vector<std::string> registered_models() {
  std::lock_guard<std::mutex> l(model_registry_mu());
  std::vector<std::string> out;
  for (const auto& [k, v] : model_registry()) out.push_back(k);
  return out;
}

// ---------------------------------------------------------------- Trainer

Trainer::Trainer(Strategy& strategy, Model& model, Optimizer& optimizer, std::vector<std::string> metrics,
                 std::string label_key)
    : strategy_(&strategy), model_(&model), optimizer_(&optimizer), label_key_(std::move(label_key)) {
  init(std::move(metrics));
}

Trainer::Trainer(Strategy& strategy, const std::string& model_name, std::vector<std::string> metrics,
                 std::string label_key)
    : Trainer(strategy, model_name, std::move(metrics), std::move(label_key), nullptr) {}

Trainer::Trainer(Strategy& strategy, const std::string& model_name, std::vector<std::string> metrics,
                 std::string label_key, std::vector<RemoteVariable>* bind)
    : strategy_(&strategy), model_(nullptr), optimizer_(nullptr), label_key_(std::move(label_key)),
      model_name_(model_name) {
  const ModelFactory factory = find_model(model_name);
  {
    std::optional<Scope> scope;
    if (get_strategy() != strategy) scope.emplace(strategy.scope());
    // Under parameter_server the chief records its variables (model, then
    // the optimizer's iterations and slots) in creation order; a worker
    // binds the same construction to them.
    const bool remote = detail::keeps_variables_remotely(*strategy.impl());
    std::optional<detail::VariableCapture> capture;
    if (remote) {
      remotes_ = std::make_unique<std::vector<RemoteVariable>>();
      if (bind != nullptr) *remotes_ = *bind;
      capture.emplace(bind != nullptr ? detail::VariableCapture::Mode::kBind : detail::VariableCapture::Mode::kRecord,
                      remotes_.get());
    }
    ModelParts parts = factory();
    STRATA_ENFORCE(parts.model != nullptr && parts.optimizer != nullptr, STRATA_ERR_INVALID_ARGUMENT,
                   "the factory of model '", model_name, "' returned no ", parts.model ? "optimizer" : "model",
                   "; return ModelParts{std::make_unique<MyModel>(), std::make_unique<strata::SGD>(...)}");
    owned_model_ = std::move(parts.model);
    owned_optimizer_ = std::move(parts.optimizer);
    model_ = owned_model_.get();
    optimizer_ = owned_optimizer_.get();
    std::vector<Variable*> vars = model_->trainable_variables();
    STRATA_ENFORCE(!vars.empty(), STRATA_ERR_INVALID_ARGUMENT, "Trainer: model '", model_name,
                   "' has no trainable variables");
    optimizer_->build(vars);  // slots and iterations: recorded / bound too
    if (capture && bind != nullptr) capture->check_all_bound();
  }
  init(std::move(metrics));
}

std::vector<RemoteVariable> Trainer::ps_variables() const {
  return remotes_ ? *remotes_ : std::vector<RemoteVariable>();
}

bool Trainer::parameter_server() const { return detail::keeps_variables_remotely(*strategy_->impl()); }

void Trainer::init(std::vector<std::string> metrics) {
  Strategy& strategy = *strategy_;
  Model& model = *model_;
  Optimizer& optimizer = *optimizer_;
  metric_names_ = metrics;
  std::vector<Variable*> vars = model.trainable_variables();
  STRATA_ENFORCE(!vars.empty(), STRATA_ERR_INVALID_ARGUMENT, "Trainer: the model has no trainable variables");
  for (Variable* v : vars)
    STRATA_ENFORCE(v != nullptr && v->strategy() == strategy, STRATA_ERR_INVALID_ARGUMENT, "Trainer: variable '",
                   v ? v->name() : std::string("(null)"), "' does not belong to strategy '", strategy.name(),
                   "'; create the model's variables inside strategy.scope()");
  std::optional<Scope> scope;
  std::optional<OutsideScopes> outside;
  // Under parameter_server every process keeps its own metrics (the Default
  // strategy's): a worker returns each step's state, the chief merges it.
  if (parameter_server()) {
    outside.emplace();
  } else if (get_strategy() != strategy) {
    scope.emplace(strategy.scope());
  }
  loss_ = std::make_unique<Mean>("loss");
  for (const std::string& name : metrics) {
    auto c = std::make_unique<CompiledMetric>();
    c->name = name;
    if (name == "accuracy" || name == "sparse_categorical_accuracy") {
      auto* m = new SparseCategoricalAccuracy(name);
      c->metric.reset(m);
      c->update = [m](const TensorView& y, const TensorView& p) { m->update_state(y, p); };
    } else if (name == "sparse_categorical_crossentropy" || name == "sparse_categorical_crossentropy_from_logits") {
      auto* m = new SparseCategoricalCrossentropy(name, name.find("logits") != std::string::npos);
      c->metric.reset(m);
      c->update = [m](const TensorView& y, const TensorView& p) { m->update_state(y, p); };
    } else {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "Trainer: unknown metric '", name,
                   "'; use accuracy, sparse_categorical_accuracy, sparse_categorical_crossentropy or "
                   "sparse_categorical_crossentropy_from_logits");
    }
    for (const auto& other : compiled_)
      STRATA_ENFORCE(other->name != name, STRATA_ERR_INVALID_ARGUMENT, "Trainer: metric '", name, "' given twice");
    compiled_.push_back(std::move(c));
  }
  optimizer.build(vars);
}

Trainer::~Trainer() = default;

std::vector<Metric*> Trainer::metrics() {
  std::vector<Metric*> out{loss_.get()};
  for (auto& c : compiled_) out.push_back(c->metric.get());
  return out;
}

Logs Trainer::metric_logs(const std::string& prefix) {
  Logs logs;
  for (Metric* m : metrics()) logs[prefix + m->name()] = m->result();
  return logs;
}

void Trainer::reset_metrics() {
  for (Metric* m : metrics()) m->reset_state();
}

struct Trainer::DeferredUpdate {
  Tensor loss, labels, predictions;
};

void Trainer::update_metrics(const Features& batch, const ForwardResult& result) {
  if (parameter_server()) {
    ReplicaContext* ctx = get_replica_context();
    const std::size_t r = ctx != nullptr && !in_cross_replica_context() ? ctx->local_replica_id() : 0;
    DeferredUpdate u;
    if (result.per_example_loss.defined()) u.loss = Tensor::copy_of(result.per_example_loss);
    if (!compiled_.empty() && batch.contains(label_key_) && result.predictions.defined()) {
      u.labels = Tensor::copy_of(batch[label_key_]);
      u.predictions = Tensor::copy_of(result.predictions);
    }
    if (ctx == nullptr || in_cross_replica_context()) {
      deferred_.resize(std::max<std::size_t>(deferred_.size(), 1));
      deferred_[0].push_back(std::move(u));
      flush_metrics();
      return;
    }
    deferred_.at(r).push_back(std::move(u));  // sized by the caller of run; each replica its own slot
    return;
  }
  if (result.per_example_loss.defined()) loss_->update_state(result.per_example_loss);
  if (compiled_.empty() || !batch.contains(label_key_) || !result.predictions.defined()) return;
  for (auto& c : compiled_) c->update(batch[label_key_], result.predictions);
}

void Trainer::flush_metrics() {
  for (std::vector<DeferredUpdate>& replica : deferred_) {
    for (DeferredUpdate& u : replica) {
      if (u.loss.defined()) loss_->update_state(u.loss);
      if (u.labels.defined())
        for (auto& c : compiled_) c->update(u.labels, u.predictions);
    }
    replica.clear();
  }
}

void Trainer::train_step(ReplicaContext& ctx, const Features& batch) {
  const std::vector<Variable*> vars = model_->trainable_variables();
  // Gradient buffers per local replica, kept across steps and zeroed here.
  std::vector<Tensor>& grads = grads_.at(ctx.local_replica_id());
  if (grads.size() != vars.size()) {
    grads.clear();
    for (Variable* v : vars) grads.push_back(Tensor::zeros(v->shape(), v->dtype()));
  } else {
    for (Tensor& g : grads) std::memset(g.raw_data(), 0, g.nbytes());
  }
  if (model_->reports_gradients_by_layer()) {
    train_step_layered(ctx, batch, grads, vars);
    return;
  }
  const ForwardResult r = model_->forward_backward(batch, 1.0 / static_cast<double>(global_batch_), grads);
  optimizer_->apply_gradients(grads, vars);
  update_metrics(batch, r);
}

// The default train_step of a layered model: the buckets' all-reduces run
// on this replica's reducer while the backward pass goes on; then one
// update from the reduced gradients (the optimizer's merge_call, as in
// apply_gradients, with the reduction already done).
void Trainer::train_step_layered(ReplicaContext& ctx, const Features& batch, std::vector<Tensor>& grads,
                                 const std::vector<Variable*>& vars) {
  STRATA_ENFORCE(ctx.local_replica_id() < reducers_.size(), STRATA_ERR_FAILED_PRECONDITION,
                 "Trainer::train_step: a layered model's step runs inside fit()");
  detail::GradientReducer& reducer = *reducers_[ctx.local_replica_id()];
  auto step = std::make_shared<LayeredStep>(ctx, grads, vars, gradient_reduction, &reducer);
  ForwardResult r;
  try {
    r = model_->forward_backward_layers(batch, 1.0 / static_cast<double>(global_batch_), grads, *step);
    step->finish();
  } catch (...) {
    // Reductions already started use `grads` and this replica's context:
    // they end before the error leaves the replica function.
    reducer.drain(collective_timeout_s_, /*abandon=*/true);
    throw;
  }
  reducer.drain(collective_timeout_s_, /*abandon=*/false);
  ctx.merge_call([&](Strategy&) { optimizer_->apply_gradients(grads, vars); });
  update_metrics(batch, r);
}

void Trainer::test_step(ReplicaContext& ctx, const Features& batch) {
  update_metrics(batch, model_->forward(batch));
  (void)ctx;
}

void Trainer::check_dataset(const Dataset& dataset, const char* what) const {
  const detail::BatchInfo bi = detail::batch_info(dataset);
  STRATA_ENFORCE(bi.batched, STRATA_ERR_INVALID_ARGUMENT, "Trainer::", what,
                 ": the dataset is not batched; call .batch(global_batch_size) on it");
}

// One step: the next distributed batch through train_step/test_step on
// every replica. *ended when the data is over (on every worker at once).
void Trainer::run_step(DistributedIterator& it, bool training, bool* ended) {
  std::optional<DistributedElement> e = it.get_next_as_optional();
  if (!e) {
    *ended = true;
    return;
  }
  const std::vector<std::string>& names = e->names();
  for (const std::string& key : model_->input_keys())
    if (training || key != label_key_)
      STRATA_ENFORCE(std::find(names.begin(), names.end(), key) != names.end(), STRATA_ERR_INVALID_ARGUMENT,
                     "Trainer: the dataset has no component '", key, "' that the model reads (it has ",
                     [&] {
                       std::string s;
                       for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
                       return s;
                     }(),
                     "); map() the dataset to name it so");
  if (training && batch_from_step_) {
    // Per-replica batches (fit(DatasetCreator)): the global batch is this
    // step's first replica's rows times the replicas in sync (as Keras
    // assumes equal per-replica batches). A replica with no rows in a
    // final partial step falls back to the previous step's.
    const Tensor& first = (*e)[0][0];
    if (first.ndim() > 0 && first.shape()[0] > 0)
      global_batch_ = first.shape()[0] * strategy_->num_replicas_in_sync();
    STRATA_ENFORCE(global_batch_ > 0, STRATA_ERR_INVALID_ARGUMENT,
                   "Trainer::fit: the first step's batch is empty on replica 0");
  }
  deferred_.resize(static_cast<std::size_t>(strategy_->num_local_replicas()));
  strategy_->run([&](ReplicaContext& ctx) {
    std::vector<const Tensor*> ts;
    for (std::size_t i = 0; i < e->size(); ++i) ts.push_back(&(*e)[i][ctx.local_replica_id()]);
    const Features f(&names, std::move(ts));
    if (training) {
      train_step(ctx, f);
    } else {
      test_step(ctx, f);
    }
  });
  flush_metrics();
}

History Trainer::fit(const Dataset& dataset, const FitOptions& options) {
  STRATA_ENFORCE(!parameter_server(), STRATA_ERR_INVALID_ARGUMENT, "Trainer::fit under strategy '",
                 strategy_->name(), "': workers build their own input, so fit takes a strata::DatasetCreator naming "
                 "a dataset function registered with STRATA_REGISTER_DATASET_FN (fit(strata::DatasetCreator{\"name\"}, "
                 "options), with options.steps_per_epoch set), not a Dataset");
  check_dataset(dataset, "fit");
  global_batch_ = detail::batch_info(dataset).batch_size;
  batch_from_step_ = false;
  DistributedDataset dist = strategy_->distribute_dataset(dataset);
  return fit_loop(&dist, options);
}

History Trainer::fit(const DatasetCreator& creator, const FitOptions& options) {
  if (parameter_server()) return fit_ps(creator, options);
  DatasetFunction fn = ps_detail::find_dataset_function(creator.dataset_fn);
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_NOT_FOUND, "Trainer::fit: no dataset function is registered as '",
                 creator.dataset_fn, "' (registered: ", joined(registered_dataset_functions()),
                 "); register it with STRATA_REGISTER_DATASET_FN");
  // Batched per replica (tf's distribute_datasets_from_function): each
  // step's loss scale comes from the rows it brings (prepare in run_step).
  DistributedDataset dist = strategy_->distribute_datasets_from_function(fn);
  batch_from_step_ = true;
  global_batch_ = 0;
  try {
    History h = fit_loop(&dist, options);
    batch_from_step_ = false;
    return h;
  } catch (...) {
    batch_from_step_ = false;
    throw;
  }
}

void Trainer::prepare_steps() {
  STRATA_ENFORCE(gradient_reduction.bucket_bytes >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::fit: gradient_reduction.bucket_bytes must be >= 0; got ", gradient_reduction.bucket_bytes);
  grads_.clear();
  grads_.resize(static_cast<std::size_t>(strategy_->num_local_replicas()));
  if (model_->reports_gradients_by_layer()) {
    while (reducers_.size() < grads_.size()) reducers_.push_back(std::make_unique<detail::GradientReducer>());
    // The strategy's collective deadline bounds each bucket's all-reduce.
    const nlohmann::json d = nlohmann::json::parse(strategy_->extended().describe_json(), nullptr, false);
    if (d.is_object() && d.contains("timeout_s") && d["timeout_s"].is_number() && d["timeout_s"].get<double>() > 0)
      collective_timeout_s_ = d["timeout_s"].get<double>();
  }
}

std::vector<Callback*> Trainer::begin_fit(const FitOptions& options, std::unique_ptr<Callback>* bar) {
  STRATA_ENFORCE(options.validation_freq >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::fit: validation_freq must be >= 1; got ", options.validation_freq);
  STRATA_ENFORCE(options.initial_epoch >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::fit: initial_epoch must be >= 0; got ", options.initial_epoch);
  if (options.validation_data) check_dataset(*options.validation_data, "fit (validation_data)");
  std::vector<Callback*> callbacks = options.callbacks;
  if (options.verbose && std::none_of(callbacks.begin(), callbacks.end(),
                                      [](Callback* c) { return dynamic_cast<ProgressBar*>(c) != nullptr; })) {
    *bar = std::make_unique<ProgressBar>();
    callbacks.insert(callbacks.begin(), bar->get());
  }
  for (Callback* c : callbacks) c->trainer_ = this;
  stop_training = false;
  return callbacks;
}

History Trainer::fit_loop(DistributedDataset* distp, const FitOptions& options) {
  DistributedDataset& dist = *distp;
  STRATA_ENFORCE(options.steps_per_epoch == -1 || options.steps_per_epoch > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::fit: steps_per_epoch must be -1 (until the data ends) or > 0; got ",
                 options.steps_per_epoch);
  std::unique_ptr<Callback> bar;
  const std::vector<Callback*> callbacks = begin_fit(options, &bar);
  prepare_steps();
  // The first epoch's iterator exists before on_train_begin, so that a
  // callback restoring a backup can put the input position into it.
  std::optional<DistributedIterator> it(dist.make_iterator());
  input_ = &*it;
  global_step_ = 0;
  resume_.reset();

  History history;
  Logs logs;
  for (Callback* c : callbacks) c->on_train_begin({});
  int first = options.initial_epoch;
  std::int64_t first_step = 0;
  bool fresh_pass = false;  // the first epoch needs a new iterator
  if (resume_) {
    first = resume_->epoch + (resume_->epoch_done ? 1 : 0);
    first_step = resume_->epoch_done ? 0 : resume_->step_in_epoch;
    fresh_pass = resume_->epoch_done;
  }
  for (int epoch = first; epoch < options.epochs && !stop_training; ++epoch) {
    epoch_ = epoch;
    const bool resumed_epoch = resume_ && epoch == first && !resume_->epoch_done;
    if (!resumed_epoch) reset_metrics();  // a resumed epoch keeps its restored running metrics
    if (options.steps_per_epoch < 0 && (epoch != first || fresh_pass)) {
      it.emplace(dist.make_iterator());
      input_ = &*it;
    }
    for (Callback* c : callbacks) c->on_epoch_begin(epoch, {});
    std::int64_t step = epoch == first ? first_step : 0;
    step_in_epoch_ = step;
    bool ended = false;
    while (options.steps_per_epoch < 0 || step < options.steps_per_epoch) {
      for (Callback* c : callbacks) c->on_train_batch_begin(step, {});
      run_step(*it, /*training=*/true, &ended);
      if (ended) break;
      ++global_step_;
      Logs batch_logs;
      if (std::any_of(callbacks.begin(), callbacks.end(), [&](Callback* c) { return c->wants_batch_logs(step); }))
        batch_logs = metric_logs();
      step_in_epoch_ = step + 1;
      for (Callback* c : callbacks) c->on_train_batch_end(step, batch_logs);
      ++step;
      // Keras: a callback that sets stop_training during a batch ends the
      // epoch there; the epoch still ends normally (its metrics, validation
      // and on_epoch_end), then fit() returns.
      if (stop_training) break;
    }
    STRATA_ENFORCE(step > 0 || epoch > first || resume_, STRATA_ERR_INVALID_ARGUMENT,
                   "Trainer::fit: the dataset yielded no batch; check that it is not empty");
    if (ended && options.steps_per_epoch > 0) {
      detail::logger("core")->warn(
          "Trainer::fit: the data ran out after {} of {} steps of epoch {}; training stops (repeat() the "
          "dataset to train for more epochs)",
          step, options.steps_per_epoch, epoch);
      stop_training = true;
    }
    if (step == 0) break;
    logs = metric_logs();
    logs["learning_rate"] = optimizer_->learning_rate();
    if (options.validation_data && (epoch + 1) % options.validation_freq == 0) {
      const Logs val = evaluate(*options.validation_data, callbacks);
      for (const auto& [k, v] : val) logs["val_" + k] = v;
    }
    history.epochs.push_back(epoch);
    for (const auto& [k, v] : logs) history.history[k].push_back(v);
    for (Callback* c : callbacks) c->on_epoch_end(epoch, logs);
  }
  for (Callback* c : callbacks) c->on_train_end(logs);
  for (Callback* c : callbacks) c->trainer_ = nullptr;
  input_ = nullptr;
  resume_.reset();
  return history;
}

void Trainer::resume_at(int epoch, std::int64_t step_in_epoch, std::int64_t global_step, bool epoch_done) {
  STRATA_ENFORCE(input_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "Trainer::resume_at is for a callback's on_train_begin, while fit() runs");
  STRATA_ENFORCE(epoch >= 0 && step_in_epoch >= 0 && global_step >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::resume_at: epoch, step and global step must be >= 0");
  resume_ = Resume{epoch, step_in_epoch, epoch_done};
  global_step_ = global_step;
}

Logs Trainer::evaluate(const Dataset& dataset, const std::vector<Callback*>& callbacks) {
  check_dataset(dataset, "evaluate");
  const std::int64_t saved_batch = global_batch_;
  global_batch_ = detail::batch_info(dataset).batch_size;
  for (Callback* c : callbacks) c->trainer_ = this;
  reset_metrics();
  for (Callback* c : callbacks) c->on_test_begin({});
  DistributedDataset dist = strategy_->distribute_dataset(dataset);
  DistributedIterator it = dist.make_iterator();
  bool ended = false;
  for (std::int64_t step = 0;; ++step) {
    run_step(it, /*training=*/false, &ended);
    if (ended) break;
    for (Callback* c : callbacks) c->on_test_batch_end(step, {});
  }
  Logs logs = metric_logs();
  for (Callback* c : callbacks) c->on_test_end(logs);
  global_batch_ = saved_batch;
  return logs;
}

Tensor Trainer::predict(const Dataset& dataset) {
  check_dataset(dataset, "predict");
  DistributedDataset dist = strategy_->distribute_dataset(dataset);
  DistributedIterator it = dist.make_iterator();
  std::vector<Tensor> parts;  // step-major, local replica order: dataset order
  const std::size_t local = static_cast<std::size_t>(strategy_->num_local_replicas());
  for (;;) {
    std::optional<DistributedElement> e = it.get_next_as_optional();
    if (!e) break;
    const std::vector<std::string>& names = e->names();
    std::vector<Tensor> step(local);
    strategy_->run([&](ReplicaContext& ctx) {
      std::vector<const Tensor*> ts;
      for (std::size_t i = 0; i < e->size(); ++i) ts.push_back(&(*e)[i][ctx.local_replica_id()]);
      step[ctx.local_replica_id()] = std::move(model_->forward(Features(&names, std::move(ts))).predictions);
    });
    for (Tensor& t : step) parts.push_back(std::move(t));
  }
  STRATA_ENFORCE(!parts.empty() && parts[0].defined(), STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::predict: no predictions (an empty dataset, or forward() returned none)");
  std::vector<std::int64_t> shape = parts[0].shape();
  STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::predict: predictions need a batch dimension");
  std::int64_t rows = 0;
  for (const Tensor& t : parts) {
    std::vector<std::int64_t> s = t.shape();
    STRATA_ENFORCE(t.dtype() == parts[0].dtype() && s.size() == shape.size() &&
                       std::equal(s.begin() + 1, s.end(), shape.begin() + 1),
                   STRATA_ERR_INVALID_ARGUMENT, "Trainer::predict: predictions of different steps differ in dtype or row shape");
    rows += s[0];
  }
  shape[0] = rows;
  Tensor out = Tensor::zeros(shape, parts[0].dtype());
  auto* dst = static_cast<unsigned char*>(out.raw_data());
  for (const Tensor& t : parts) {
    const Tensor c = Tensor::copy_of(t);
    std::memcpy(dst, c.raw_data(), c.nbytes());
    dst += c.nbytes();
  }
  return out;
}

// ---------------------------------------------------------------- parameter_server

// Under parameter_server (Keras' fit with ParameterServerStrategy): the
// chief schedules one closure kPsStep per step; the worker that takes it
// builds the registered model once, bound to the chief's variables, trains
// on its next batch over its local replicas (the updates go to the ps
// tasks) and returns its metrics' state, which the chief merges.
namespace {

constexpr const char* kPsStep = "strata.trainer.ps_step";
// Arguments of kPsStep before the chief's variables.
constexpr std::size_t kPsFixedArgs = 5;  // model name, iterator, step, label key, metric names

std::string join_lines(const std::vector<std::string>& v) { return joined(v, "\n"); }

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < s.size()) {
    const std::size_t end = s.find('\n', start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// Rows [lo, hi) of `t` along axis 0, as a compact copy.
Tensor rows_of(const Tensor& t, std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> shape = t.shape();
  STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer: a component of the batch has no batch dimension; batch() the dataset");
  const Tensor c = Tensor::copy_of(t);
  const std::size_t row = shape[0] > 0 ? c.nbytes() / static_cast<std::size_t>(shape[0]) : 0;
  shape[0] = hi - lo;
  Tensor out = Tensor::zeros(shape, c.dtype());
  if (hi > lo)
    std::memcpy(out.raw_data(), static_cast<const unsigned char*>(c.raw_data()) + static_cast<std::size_t>(lo) * row,
                static_cast<std::size_t>(hi - lo) * row);
  return out;
}

// The job config this process was given (PluginHost's), as text.
std::string job_config_text() {
  const strata_host_api* api = PluginHost::global().host_api();
  std::string out;
  strata_error err;
  strata_error_init(&err);
  auto append = [](void* user, const char* data, std::uint64_t len) {
    static_cast<std::string*>(user)->append(data, static_cast<std::size_t>(len));
  };
  if (api == nullptr || api->get_config(api, "", append, &out, &err) != STRATA_OK) return "{}";
  return out;
}

}  // namespace

namespace detail {

// A worker's Trainer, built on its first kPsStep closure (a worker runs
// one closure at a time) and dropped when its strata::Server stops, so
// that the strategy's replica threads end before the process does.
struct TrainerPs {
  std::mutex mu;
  std::optional<Strategy> strategy;
  std::unique_ptr<Trainer> trainer;
  std::string key;  // model name, label key and metrics it was built for

  static TrainerPs& get() {
    static TrainerPs* w = new TrainerPs;  // outlives every Server (reachable, not a leak)
    return *w;
  }

  static void drop() {
    TrainerPs& w = get();
    std::lock_guard<std::mutex> l(w.mu);
    w.trainer.reset();
    w.strategy.reset();
    w.key.clear();
  }

  static Value step(const Args& a) {
    const std::string& model = get_arg<std::string>(a, 0);
    LocalIterator it = get_iterator(a, 1);
    const std::string& label = get_arg<std::string>(a, 3);
    const std::string& metrics = get_arg<std::string>(a, 4);
    TrainerPs& w = get();
    std::lock_guard<std::mutex> l(w.mu);
    const std::string key = model + '\0' + label + '\0' + metrics;
    if (w.trainer == nullptr || w.key != key) {
      w.trainer.reset();
      if (!w.strategy) {
        // The job's config, as the chief's: its strategy options (devices)
        // are this worker's.
        Config cfg = Config::from_json(job_config_text(), "the job config");
        if (cfg.name("strategy") != "parameter_server") cfg.set("/strategy", R"({"name": "parameter_server"})");
        w.strategy.emplace(Strategy::from_config(cfg));
      }
      std::vector<RemoteVariable> remotes;
      for (std::size_t i = kPsFixedArgs; i < a.size(); ++i) remotes.push_back(get_arg<RemoteVariable>(a, i));
      w.trainer.reset(new Trainer(*w.strategy, model, split_lines(metrics), label, &remotes));
      w.trainer->prepare_steps();
      w.key = key;
    }
    return Value(w.trainer->ps_worker_step(it.get_next()));
  }
};

}  // namespace detail

namespace {
STRATA_REGISTER_FUNCTION(kPsStep, &detail::TrainerPs::step);
const bool g_ps_exit_hook = (ps_detail::set_server_exit_hook(&detail::TrainerPs::drop), true);
}  // namespace

Tensor Trainer::ps_worker_step(const Element& batch) {
  for (const std::string& key : model_->input_keys())
    STRATA_ENFORCE(std::find(batch.names.begin(), batch.names.end(), key) != batch.names.end(),
                   STRATA_ERR_INVALID_ARGUMENT, "Trainer: the dataset has no component '", key,
                   "' that the model reads (it has ", joined(batch.names), "); map() the dataset to name it so");
  STRATA_ENFORCE(!batch.tensors.empty() && batch.tensors[0].ndim() > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer: the worker's dataset is not batched; batch() it in the dataset function");
  const std::int64_t rows = batch.tensors[0].shape()[0];
  const int n = strategy_->num_local_replicas();
  // This worker's replicas split its batch; the loss is its mean
  // (loss scale 1 / rows), their gradients summed in apply_gradients.
  std::vector<std::vector<Tensor>> shares(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::int64_t lo = rows * r / n, hi = rows * (r + 1) / n;
    for (const Tensor& t : batch.tensors) shares[static_cast<std::size_t>(r)].push_back(rows_of(t, lo, hi));
  }
  global_batch_ = std::max<std::int64_t>(rows, 1);
  reset_metrics();
  deferred_.clear();
  deferred_.resize(static_cast<std::size_t>(n));
  strategy_->run([&](ReplicaContext& ctx) {
    std::vector<const Tensor*> ts;
    for (const Tensor& t : shares[ctx.local_replica_id()]) ts.push_back(&t);
    train_step(ctx, Features(&batch.names, std::move(ts)));
  });
  flush_metrics();
  std::vector<double> state;
  for (Metric* m : metrics()) {
    state.push_back(m->total_->value().to_doubles()[0]);
    state.push_back(m->count_->value().to_doubles()[0]);
  }
  reset_metrics();
  const auto len = static_cast<std::int64_t>(state.size());
  return Tensor::from_vector(state, {len});
}

History Trainer::fit_ps(const DatasetCreator& creator, const FitOptions& options) {
  STRATA_ENFORCE(!model_name_.empty(), STRATA_ERR_INVALID_ARGUMENT, "Trainer::fit under strategy '", strategy_->name(),
                 "': workers build the model by name; construct the Trainer as Trainer(strategy, \"model name\") "
                 "with a factory registered by STRATA_REGISTER_MODEL, not from a Model reference");
  STRATA_ENFORCE(options.steps_per_epoch > 0, STRATA_ERR_INVALID_ARGUMENT, "Trainer::fit under strategy '",
                 strategy_->name(), "': steps_per_epoch must be set (> 0), as Keras requires with "
                 "ParameterServerStrategy; got ", options.steps_per_epoch);
  STRATA_ENFORCE(!creator.dataset_fn.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "Trainer::fit: the DatasetCreator names no dataset function");
  ClusterCoordinator* coordinator = ps_detail::current_coordinator_object();
  STRATA_ENFORCE(coordinator != nullptr, STRATA_ERR_FAILED_PRECONDITION, "Trainer::fit under strategy '",
                 strategy_->name(), "' needs a strata::ClusterCoordinator: create it on the chief before the "
                 "Trainer (it places the variables on the ps tasks) and keep it alive while fit runs");
  for (Callback* c : options.callbacks)
    STRATA_ENFORCE(dynamic_cast<ModelCheckpoint*>(c) == nullptr && dynamic_cast<BackupAndRestoreCallback*>(c) == nullptr,
                   STRATA_ERR_UNIMPLEMENTED, "Trainer::fit under strategy '", strategy_->name(),
                   "': ModelCheckpoint and BackupAndRestoreCallback are not supported yet (a Checkpoint holds the "
                   "variables of this process, not the ones on the ps tasks); remove them from options.callbacks");
  std::unique_ptr<Callback> bar;
  const std::vector<Callback*> callbacks = begin_fit(options, &bar);
  global_step_ = 0;
  resume_.reset();
  // One pass over every worker's input across epochs (Keras: with
  // steps_per_epoch the iterator is not reset between epochs).
  PerWorkerIterator it = coordinator->create_per_worker_dataset(creator.dataset_fn).iter();

  History history;
  Logs logs;
  try {
    fit_ps_epochs(coordinator, it, callbacks, options, history, logs);
  } catch (...) {
    // Another worker's closure may fail too (the same cause): collect those
    // errors now, so that the coordinator is clean for what comes next.
    for (int i = 0; i <= coordinator->num_workers(); ++i) {
      try {
        coordinator->join();
        break;
      } catch (...) {
      }
    }
    for (Callback* c : callbacks) c->trainer_ = nullptr;
    throw;
  }
  for (Callback* c : callbacks) c->on_train_end(logs);
  for (Callback* c : callbacks) c->trainer_ = nullptr;
  return history;
}

void Trainer::fit_ps_epochs(ClusterCoordinator* coordinator, const PerWorkerIterator& it,
                            const std::vector<Callback*>& callbacks, const FitOptions& options, History& history,
                            Logs& logs) {
  const std::string metric_names = join_lines(metric_names_);
  for (Callback* c : callbacks) c->on_train_begin({});
  for (int epoch = options.initial_epoch; epoch < options.epochs && !stop_training; ++epoch) {
    epoch_ = epoch;
    reset_metrics();
    for (Callback* c : callbacks) c->on_epoch_begin(epoch, {});
    std::vector<RemoteValue> steps;
    bool ended = false;
    auto data_ended = [&](const Error& e) {
      if (e.code() != STRATA_ERR_OUT_OF_RANGE) return false;
      ended = true;
      return true;
    };
    step_in_epoch_ = 0;
    for (std::int64_t step = 0; step < options.steps_per_epoch; ++step) {
      for (Callback* c : callbacks) c->on_train_batch_begin(step, {});
      Args args;
      args.emplace_back(model_name_);
      args.push_back(to_value(it));
      args.emplace_back(global_step_);
      args.emplace_back(label_key_);
      args.emplace_back(metric_names);
      for (const RemoteVariable& r : *remotes_) args.emplace_back(r);
      try {
        steps.push_back(coordinator->schedule(kPsStep, std::move(args)));
      } catch (const Error& e) {
        if (!data_ended(e)) throw;
        break;
      }
      ++global_step_;
      step_in_epoch_ = step + 1;
      // Keras under ParameterServerStrategy: batch hooks run as each step
      // is scheduled, without logs (the step has not run yet).
      for (Callback* c : callbacks) c->on_train_batch_end(step, {});
      if (stop_training) break;
    }
    // join() raises a worker's end of data once, while closures that other
    // workers had already taken may still run: join until none does, so
    // that every step that updated the variables is merged below.
    for (int tries = 0;; ++tries) {
      try {
        coordinator->join();
        break;
      } catch (const Error& e) {
        if (!data_ended(e) || tries > coordinator->num_workers()) throw;
      }
    }
    // Every step that ran adds its state once: the epoch's logs cover all
    // of them (Keras logs one worker's last step).
    std::int64_t done = 0;
    std::vector<Metric*> ms = metrics();
    for (const RemoteValue& r : steps) {
      if (r.status() != RemoteValueStatus::kReady) continue;
      const std::vector<double> st = std::get<Tensor>(r.fetch()).to_doubles();
      STRATA_ENFORCE(st.size() == 2 * ms.size(), STRATA_ERR_INTERNAL, "Trainer::fit: a worker returned ", st.size(),
                     " metric values for ", 2 * ms.size());
      for (std::size_t i = 0; i < ms.size(); ++i) ms[i]->add(st[2 * i], st[2 * i + 1]);
      ++done;
    }
    if (ended) {
      detail::logger("core")->warn(
          "Trainer::fit: a worker's data ran out in epoch {} ({} of {} steps ran); training stops (repeat() the "
          "dataset in the dataset function to train for more epochs)",
          epoch, done, options.steps_per_epoch);
      stop_training = true;
    }
    if (done == 0) break;
    logs = metric_logs();
    logs["learning_rate"] = optimizer_->learning_rate();
    if (options.validation_data && (epoch + 1) % options.validation_freq == 0) {
      const Logs val = evaluate(*options.validation_data, callbacks);  // on the chief, reading the ps
      for (const auto& [k, v] : val) logs["val_" + k] = v;
    }
    history.epochs.push_back(epoch);
    for (const auto& [k, v] : logs) history.history[k].push_back(v);
    for (Callback* c : callbacks) c->on_epoch_end(epoch, logs);
  }
}

}  // namespace strata
