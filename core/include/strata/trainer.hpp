// SPDX-License-Identifier: Apache-2.0
// strata::Trainer: Keras' Model.fit / evaluate / predict for a C++ model, on
// any strategy.
//
//   auto scope = strategy.scope();
//   MyModel model;                                   // creates its Variables here
//   strata::Adam opt(1e-3);
//   strata::Trainer trainer(strategy, model, opt, {"accuracy"});
//   scope.reset();                                   // (or keep it: either works)
//   strata::History h = trainer.fit(train.batch(256), {.epochs = 5, .validation_data = test.batch(256)});
//   auto logs = trainer.evaluate(test.batch(256));   // {"loss": ..., "accuracy": ...}
//
// The model is the user's (no autodiff here): a Model gives its trainable
// variables and computes, for one replica's share of a batch, predictions,
// per-example losses and the gradients of loss_scale * sum(per-example
// loss). The default train_step (each replica, inside strategy.run):
// forward_backward with loss_scale = 1 / global batch (tf.nn.
// compute_average_loss), optimizer.apply_gradients (one batched all-reduce
// of every gradient, then one update), then the metrics. test_step:
// forward, then the metrics. Both are virtual: subclass Trainer to write
// your own, as Keras users override train_step.
//
// Layer by layer: a model whose reports_gradients_by_layer() is true has
// forward_backward_layers called instead, and hands each layer's gradients
// to a GradientSink as soon as they are final (last layer first). The
// default train_step packs the reported gradients into buckets
// (gradient_reduction.bucket_bytes) and starts each bucket's all-reduce on
// a reduction thread of that replica at once, while the backward pass
// computes the earlier layers (as PyTorch DDP's buckets do); after the
// backward pass it waits for the buckets (bounded by the strategy's
// collective timeout per bucket) and applies the reduced gradients in one
// optimizer update in a merge_call. The replica thread makes no collective
// while its buckets are in flight. gradient_reduction.overlap = false runs
// the same buckets after the backward pass. Results are bit-identical with
// and without overlap (the same collectives in the same order), and equal
// to the one-collective step whenever the reduction's summation order does
// not depend on where a gradient sits in the packed buffer: one worker, two
// workers, or payloads on the ring's direct path (<= direct_max_bytes);
// otherwise they differ by float rounding only.
//
// Data: datasets are batched by the GLOBAL batch size and distributed with
// strategy.distribute_dataset (sharded across workers by their
// AutoShardPolicy). Every component the model's input_keys() names must be
// in the dataset (InvalidArgumentError naming the missing one, before any
// step). Labels are the component `label_key` (default "y").
//
// Metrics: "loss" (the mean per-example loss) always; compiled metrics by
// name: "accuracy" / "sparse_categorical_accuracy" (integer labels,
// [batch, classes] predictions), "sparse_categorical_crossentropy" (of
// probabilities) and "sparse_categorical_crossentropy_from_logits". They
// are metrics.hpp's sync-on-read metrics, so the epoch values are over the
// whole global data on every worker. Validation logs are prefixed "val_".
// Logs also carry "learning_rate".
//
// Callbacks see Keras' hooks with Keras' logs (std::map<std::string,
// double>). Epoch-end logs hold the epoch's metrics; batch-end logs hold the
// running metrics only on the batches a callback asks for
// (Callback::wants_batch_logs), because reading a metric is a collective
// across workers: that decision must be the same on every worker (it
// depends only on the batch number). Every worker runs every callback;
// callbacks that write or print (ProgressBar, CSVLogger, TensorBoard,
// ModelCheckpoint) do so on the chief only.
//
// Models by name: STRATA_REGISTER_MODEL("name", factory) registers a
// factory returning ModelParts (model + optimizer); Trainer(strategy,
// "name") builds and owns them inside the strategy's scope. It works on
// every strategy, so one program runs unchanged on all of them.
//
// parameter_server (Keras' fit with ParameterServerStrategy): on the chief,
// make the ClusterCoordinator first, then Trainer(strategy, "name"), then
// fit(DatasetCreator{"fn"}, options) with options.steps_per_epoch > 0.
// While the factory and optimizer.build run, the chief records every
// variable it creates on the ps tasks (model, then the optimizer's
// iterations and slots: one copy, shared by every worker). Each worker runs
// the registered dataset function "fn" once (its own input, batched by ONE
// worker step's batch) and, on its first step, builds the same model with
// the same factory under its own parameter_server strategy (the job
// config's options, e.g. its "devices"), each variable attached to the
// chief's in creation order; a different count, name, shape or dtype is
// InvalidArgumentError naming both sides. The chief schedules one closure
// per step; a worker trains on its next batch over its local replicas
// (loss scale 1 / rows of its batch, gradients summed across its replicas,
// one update applied on the ps) and returns its metrics' state; the chief
// adds every step's state into its own metrics, so an epoch's logs cover
// each step of the epoch exactly once. Workers train asynchronously (no
// collective spans workers; Adam's slots are read and written without a
// lock across workers, as in TF). Callbacks run on the chief only: batch
// hooks as each step is scheduled, with empty logs (as Keras under
// ParameterServerStrategy); epoch hooks after coordinator.join(), with the
// epoch's logs and validation_data evaluated on the chief (a normal
// Dataset; the model reads the ps variables). evaluate()/predict() run on
// the chief. A worker's input ending (OutOfRangeError) ends training with
// a warning; steps already queued are cancelled. Metrics are local to each
// process (the Default strategy's), never on the ps. Refused under
// parameter_server: fit(Dataset) (InvalidArgumentError: pass a
// DatasetCreator), steps_per_epoch unset (InvalidArgumentError), no
// ClusterCoordinator (FailedPreconditionError), a Trainer built from a
// Model reference (workers need the name), ModelCheckpoint and
// BackupAndRestoreCallback (UnimplementedError: Checkpoint holds local
// variables only). A model a worker does not know: its closure's
// NotFoundError, raised by fit on the chief. Worker and ps tasks run
// strata::Server::from_env().join(); a worker's model and strategy are
// dropped when its server stops.
//
// Errors: a model whose gradients do not match its variables, a dataset
// without the model's components, fit with epochs <= initial_epoch (then
// nothing runs, as Keras), steps_per_epoch == 0, validation_freq < 1, a
// layered model that reports a gradient twice, outside its variables or
// not at all, gradient_reduction.bucket_bytes < 0: InvalidArgumentError. A
// metric read inside a replica function (e.g. metric_logs() in a custom
// train_step): FailedPreconditionError naming the metric. Every call of fit/evaluate/predict is made by every
// worker (they are collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/data.hpp"
#include "strata/export.hpp"
#include "strata/metrics.hpp"
#include "strata/optimizers.hpp"
#include "strata/strategy.hpp"
#include "strata/tensor.hpp"
#include "strata/variable.hpp"

namespace strata {

class Trainer;
class DistributedIterator;
class DistributedDataset;
class RemoteVariable;
namespace detail {
struct GradientReducer;
struct TrainerPs;
}

using Logs = std::map<std::string, double>;

/// One replica's share of a step's batch: named tensors.
class STRATA_API Features {
 public:
  Features(const std::vector<std::string>* names, std::vector<const Tensor*> tensors);
  /// The component `name` (NotFoundError listing the names).
  const Tensor& operator[](const std::string& name) const;
  bool contains(const std::string& name) const;
  /// Rows in this share (first dimension of the first component; 0 for a
  /// replica that got no rows this step).
  std::int64_t batch_size() const;
  const std::vector<std::string>& names() const { return *names_; }

 private:
  const std::vector<std::string>* names_;
  std::vector<const Tensor*> tensors_;
};

/// What a model computes for one replica's share.
struct ForwardResult {
  /// [batch, ...]: what compiled metrics compare with the labels, and what
  /// predict() returns.
  Tensor predictions;
  /// [batch]: the loss of every example (empty in predict when there are
  /// no labels).
  Tensor per_example_loss;
};

/// Where a layered model's backward pass hands over gradients as soon as
/// they are final (Model::forward_backward_layers), so that the Trainer
/// reduces them across replicas while the model computes the gradients of
/// the layers before them. Made by the Trainer for one replica's step and
/// used on that replica's thread (reduced() may be called from any thread).
class STRATA_API GradientSink {
 public:
  virtual ~GradientSink();
  /// grads[first .. first + count) are final. The Trainer may start
  /// reducing them at once, in place and on another thread: the model must
  /// neither read nor write them again in this step. Report every variable
  /// exactly once per step, in the same order on every replica and worker
  /// (the reports decide the collectives). A range outside the variables or
  /// a variable reported twice is InvalidArgumentError.
  virtual void ready(std::size_t first, std::size_t count) = 0;
  /// Whether the gradient of variable `index` has already been summed over
  /// every replica in sync (never blocks). For models and tests that want
  /// to see the overlap happen.
  virtual bool reduced(std::size_t index) const = 0;
};

/// How the default train_step reduces a layered model's gradients
/// (Model::reports_gradients_by_layer). Every worker must use the same.
struct GradientReduction {
  /// Start each bucket's all-reduce while the backward pass goes on (as
  /// PyTorch DDP does); false: the same collectives, after the backward
  /// pass. Results are bit-identical either way.
  bool overlap = true;
  /// Reported ranges are packed into one collective until it holds at
  /// least this many bytes (0: one collective per ready() call). The last
  /// bucket is sent when forward_backward_layers returns.
  std::int64_t bucket_bytes = std::int64_t{1} << 20;
};

/// The user's model.
class STRATA_API Model {
 public:
  virtual ~Model();
  /// The trainable variables, created in the strategy's scope, in a fixed
  /// order (the order of the gradients).
  virtual std::vector<Variable*> trainable_variables() = 0;
  /// Components of the input the model reads (the labels included).
  virtual std::vector<std::string> input_keys() const { return {"x", "y"}; }
  /// Forward and backward pass: predictions, per-example losses, and into
  /// `grads` (zeros, one per variable, shaped like it) the gradient of
  /// loss_scale * sum(per_example_loss). Called on every replica thread at
  /// once: read variables with value()/read_view() only.
  virtual ForwardResult forward_backward(const Features& batch, double loss_scale, std::vector<Tensor>& grads) = 0;
  /// Forward pass only. `batch` may lack the labels (predict).
  virtual ForwardResult forward(const Features& batch) = 0;
  /// True when the model implements forward_backward_layers: the default
  /// train_step then reduces gradients layer by layer, overlapped with the
  /// backward pass (Trainer::gradient_reduction).
  virtual bool reports_gradients_by_layer() const { return false; }
  /// forward_backward that calls sink.ready(first, count) for each layer's
  /// gradients as soon as they are final, last layer first (see
  /// GradientSink). The default calls forward_backward, then reports every
  /// variable at once.
  virtual ForwardResult forward_backward_layers(const Features& batch, double loss_scale, std::vector<Tensor>& grads,
                                                GradientSink& sink);
};

/// Keras' Callback. Every hook runs on every worker, in cross-replica
/// context, in the order the callbacks were given.
class STRATA_API Callback {
 public:
  virtual ~Callback();
  virtual void on_train_begin(const Logs&) {}
  virtual void on_train_end(const Logs&) {}
  virtual void on_epoch_begin(int /*epoch*/, const Logs&) {}
  virtual void on_epoch_end(int /*epoch*/, const Logs&) {}
  virtual void on_train_batch_begin(std::int64_t /*batch*/, const Logs&) {}
  virtual void on_train_batch_end(std::int64_t /*batch*/, const Logs&) {}
  virtual void on_test_begin(const Logs&) {}
  virtual void on_test_end(const Logs&) {}
  virtual void on_test_batch_end(std::int64_t /*batch*/, const Logs&) {}
  /// Whether on_train_batch_end(batch) needs the running metrics. Must
  /// depend only on `batch` and the callback's settings (see the file
  /// comment).
  virtual bool wants_batch_logs(std::int64_t /*batch*/) const { return false; }
  /// The trainer running this callback (set by fit/evaluate).
  Trainer* trainer() const { return trainer_; }

 private:
  friend class Trainer;
  Trainer* trainer_ = nullptr;
};

struct FitOptions {
  int epochs = 1;
  /// Steps per epoch; -1: until the data ends (a new pass every epoch).
  /// With a number, one pass continues across epochs (repeat() the dataset
  /// for more); data ending early stops training with a warning.
  std::int64_t steps_per_epoch = -1;
  std::optional<Dataset> validation_data;
  /// Validate after every validation_freq-th epoch (>= 1).
  int validation_freq = 1;
  /// Epoch to start from (epochs are numbered from 0; fit runs
  /// initial_epoch .. epochs - 1).
  int initial_epoch = 0;
  std::vector<Callback*> callbacks;
  /// Add a ProgressBar (chief only) unless one is in `callbacks`.
  bool verbose = true;
};

/// Keras' History: every epoch's logs.
struct STRATA_API History {
  std::vector<int> epochs;
  std::map<std::string, std::vector<double>> history;
  /// The last value of `key` (NotFoundError when it was never logged).
  double last(const std::string& key) const;
};

/// What a registered model factory makes: the model and its optimizer.
struct ModelParts {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
};

/// Builds a model and its optimizer. Called by the Trainer inside the
/// strategy's scope (so the model's variables belong to the strategy), on
/// the chief and, under parameter_server, again on every worker: it must
/// build the same variables (names, shapes, dtypes, order) everywhere.
using ModelFactory = std::function<ModelParts()>;

/// Register `factory` under `name` in this process (at load time through
/// STRATA_REGISTER_MODEL). AlreadyExistsError when the name is taken.
STRATA_API void register_model(const std::string& name, ModelFactory factory);
/// The names registered in this process, sorted.
STRATA_API std::vector<std::string> registered_models();

#define STRATA_TRAINER_CONCAT_INNER_(a, b) a##b
#define STRATA_TRAINER_CONCAT_(a, b) STRATA_TRAINER_CONCAT_INNER_(a, b)
/// STRATA_REGISTER_MODEL("mlp", make_mlp); at namespace scope. Variadic so
/// that a lambda with unparenthesised commas (ModelParts{a, b}) passes.
#define STRATA_REGISTER_MODEL(name, ...)                                          \
  static const bool STRATA_TRAINER_CONCAT_(strata_registered_model_, __LINE__) = \
      (::strata::register_model((name), ::strata::ModelFactory(__VA_ARGS__)), true)

/// Keras' DatasetCreator: the name of a dataset function registered with
/// STRATA_REGISTER_DATASET_FN (strata/coordinator.hpp). Under
/// parameter_server every worker builds its own input with it
/// (InputContext: num_input_pipelines = workers, input_pipeline_id = this
/// worker, num_replicas_in_sync = 1), batched by the batch ONE worker step
/// takes; under the other strategies it goes through
/// strategy.distribute_datasets_from_function (batched per replica, as
/// InputContext::get_per_replica_batch_size says).
struct DatasetCreator {
  std::string dataset_fn;
};

class STRATA_API Trainer {
 public:
  /// `model` and `optimizer` must outlive the trainer; the model's
  /// variables must belong to `strategy` (InvalidArgumentError naming one
  /// that does not). Metrics are created in the strategy.
  Trainer(Strategy& strategy, Model& model, Optimizer& optimizer, std::vector<std::string> metrics = {},
          std::string label_key = "y");
  /// Build the model registered as `model_name` (STRATA_REGISTER_MODEL)
  /// and its optimizer inside the strategy's scope, and own them; then as
  /// the constructor above. Works on every strategy; under
  /// parameter_server it is the one fit(DatasetCreator) needs (workers
  /// build the same model by name). NotFoundError naming the name and the
  /// registered names when unknown.
  Trainer(Strategy& strategy, const std::string& model_name, std::vector<std::string> metrics = {},
          std::string label_key = "y");
  virtual ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  History fit(const Dataset& dataset, const FitOptions& options = {});
  /// fit with per-worker input (Keras' fit(DatasetCreator)); see
  /// DatasetCreator and the file comment's "parameter_server" section.
  History fit(const DatasetCreator& creator, const FitOptions& options = {});
  /// The mean loss and metrics over the whole dataset (one pass).
  Logs evaluate(const Dataset& dataset, const std::vector<Callback*>& callbacks = {});
  /// Every example's predictions, in dataset order, concatenated (this
  /// worker's share under multi-worker sharding; rows of all workers on
  /// the chief via gather would need a collective, so each worker returns
  /// what it saw).
  Tensor predict(const Dataset& dataset);

  Strategy& strategy() const { return *strategy_; }
  Model& model() const { return *model_; }
  Optimizer& optimizer() const { return *optimizer_; }
  /// Set by a callback to end fit(), as Keras' Model.stop_training: set in
  /// on_train_batch_end it ends the epoch after that batch (TerminateOnNaN),
  /// set in on_epoch_end it ends fit() after that epoch (EarlyStopping); the
  /// epoch that stops still gets its metrics, validation and on_epoch_end.
  /// Across workers every worker must set it at the same batch (decide from
  /// logs, which are the same everywhere, not from local state), or the
  /// workers that go on fail at their next collective's deadline.
  bool stop_training = false;
  /// How a layered model's gradients are reduced (set before fit).
  GradientReduction gradient_reduction;
  /// parameter_server, Trainer(strategy, "name"): the variables created on
  /// the ps tasks (the model's, then the optimizer's iterations and slots),
  /// in creation order, as workers bind to them; empty otherwise.
  std::vector<RemoteVariable> ps_variables() const;
  /// The metrics (loss first), for callbacks and custom steps.
  std::vector<Metric*> metrics();
  /// The current logs of every metric (a collective across workers).
  Logs metric_logs(const std::string& prefix = "");
  /// The epoch fit() is in (or last ran).
  int epoch() const { return epoch_; }
  /// Training steps run by fit() so far (across epochs).
  std::int64_t global_step() const { return global_step_; }
  /// Steps run in the current epoch.
  std::int64_t step_in_epoch() const { return step_in_epoch_; }
  /// The training input's iterator while fit() runs (nullptr otherwise):
  /// for callbacks that checkpoint the input position. In on_train_begin it
  /// is the fresh iterator the first epoch will read (restore_state into it
  /// there); with steps_per_epoch = -1 later epochs get new ones.
  DistributedIterator* input_iterator() { return input_; }
  /// For a callback's on_train_begin that restored a backup (Keras'
  /// BackupAndRestore): fit continues at `epoch`, `step_in_epoch` steps into
  /// it, with `global_step` steps done, keeping the restored metric state of
  /// that epoch. `epoch_done`: the backup was taken after the epoch ended,
  /// so fit starts epoch + 1 afresh.
  void resume_at(int epoch, std::int64_t step_in_epoch, std::int64_t global_step, bool epoch_done);

 protected:
  /// One replica's training step (runs inside strategy.run).
  virtual void train_step(ReplicaContext& ctx, const Features& batch);
  /// One replica's evaluation step.
  virtual void test_step(ReplicaContext& ctx, const Features& batch);
  /// Update the compiled metrics from labels and predictions.
  void update_metrics(const Features& batch, const ForwardResult& result);
  std::int64_t global_batch_size() const { return global_batch_; }

 private:
  struct CompiledMetric;
  friend struct detail::TrainerPs;
  // The worker side (parameter_server): bind to the chief's variables.
  Trainer(Strategy& strategy, const std::string& model_name, std::vector<std::string> metrics, std::string label_key,
          std::vector<RemoteVariable>* bind);
  void init(std::vector<std::string> metrics);
  bool parameter_server() const;
  // What both fit paths do first: check the options they share, and list
  // the callbacks, with a ProgressBar (kept in *bar) first unless one is
  // there or options.verbose is false.
  std::vector<Callback*> begin_fit(const FitOptions& options, std::unique_ptr<Callback>* bar);
  History fit_loop(DistributedDataset* dist, const FitOptions& options);
  History fit_ps(const DatasetCreator& creator, const FitOptions& options);
  void fit_ps_epochs(class ClusterCoordinator* coordinator, const class PerWorkerIterator& it,
                     const std::vector<Callback*>& callbacks, const FitOptions& options, History& history, Logs& logs);
  void prepare_steps();
  // One worker step (parameter_server): train on `batch` over the local
  // replicas; the metrics' state [total, count] per metric, then reset.
  Tensor ps_worker_step(const Element& batch);
  void check_dataset(const Dataset& dataset, const char* what) const;
  void run_step(DistributedIterator& it, bool training, bool* ended);
  void reset_metrics();
  Strategy* strategy_;
  Model* model_;
  Optimizer* optimizer_;
  std::string label_key_;
  std::unique_ptr<Mean> loss_;
  std::vector<std::unique_ptr<CompiledMetric>> compiled_;
  std::int64_t global_batch_ = 0;
  std::vector<std::vector<Tensor>> grads_;  // per local replica, reused by train_step
  // Per local replica: the thread that reduces a layered model's buckets.
  std::vector<std::unique_ptr<detail::GradientReducer>> reducers_;
  double collective_timeout_s_ = 300;
  void train_step_layered(ReplicaContext& ctx, const Features& batch, std::vector<Tensor>& grads,
                          const std::vector<Variable*>& vars);
  int epoch_ = 0;
  std::int64_t global_step_ = 0, step_in_epoch_ = 0;
  DistributedIterator* input_ = nullptr;
  struct Resume {
    int epoch;
    std::int64_t step_in_epoch;
    bool epoch_done;
  };
  std::optional<Resume> resume_;
  // Set by the model-name constructor.
  std::string model_name_;
  std::unique_ptr<Model> owned_model_;
  std::unique_ptr<Optimizer> owned_optimizer_;
  // parameter_server: the chief's variables on the ps tasks, in creation
  // order (what workers bind to).
  std::unique_ptr<std::vector<RemoteVariable>> remotes_;
  std::vector<std::string> metric_names_;
  // fit(DatasetCreator) under the synchronous strategies: the loss scale
  // comes from each step's per-replica rows.
  bool batch_from_step_ = false;
  // parameter_server: the metrics are this process's (Default strategy),
  // which a replica function of another strategy cannot update in place;
  // update_metrics keeps each replica's labels and results here and
  // flush_metrics applies them after run, in replica order.
  struct DeferredUpdate;
  std::vector<std::vector<DeferredUpdate>> deferred_;
  void flush_metrics();
};

}  // namespace strata
