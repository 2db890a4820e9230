// SPDX-License-Identifier: Apache-2.0
// Parameter-server training: tf.distribute.Server, ClusterCoordinator and
// variables that live on parameter-server ("ps") tasks, over real processes.
//
// Roles. A cluster (TF_CONFIG, or any cluster resolver) has one "chief" (the
// coordinator: it runs the user's program), "worker" tasks that run
// scheduled functions, and "ps" tasks that hold variables. Workers and ps
// tasks run a Server: `strata-server --job ps --index 0`, or the user's own
// program calling `strata::Server::from_env().join()`, which is how a worker
// gets the user's functions: it runs the same binary (or a binary linking
// the same library), whose STRATA_REGISTER_FUNCTION lines register them by
// name at load time. C++ cannot ship a closure; the coordinator ships the
// function's name and its serialised arguments.
//
// Data path. Every connection (coordinator -> worker, coordinator -> ps,
// worker -> ps) is a two-rank communicator of a Strata transport plugin
// ("tcp" unless the job config's /transport/name says otherwise), created
// through the rendezvous store that the chief serves on its cluster address.
// Requests and responses are framed messages (a fixed header on tag 1, the
// payload on tag 2); one request is outstanding per connection at a time.
//
// Variables. ClusterCoordinator::create_variable places each variable on a ps
// task round robin in creation order; with a partitioner it is split along
// axis 0 (strata/partitioners.hpp) and every shard counts as one variable.
// read/assign/assign_add/assign_sub are atomic per shard: the ps applies
// updates of one shard one at a time, so no update from any worker is lost.
// An update of a sharded variable is atomic per shard, not across shards, as
// in tf.distribute.
//
// Per-worker values. create_per_worker_dataset(fn) has every worker build
// its own input by running the dataset function registered under `fn`
// (STRATA_REGISTER_DATASET_FN) with its own InputContext; iter() makes a
// fresh iterator on every worker; create_per_worker_values(fn) keeps fn's
// result on every worker. Passed to schedule(), such a value resolves on the
// worker to that worker's own (get_iterator, get_per_worker_value). They are
// created on each worker before any closure scheduled after them runs there,
// and again when the worker restarts (its dataset starts over).
//
// A ps blip. A ps call whose connection fails or that passes the operation
// deadline is resent on a new connection until ps_grace_s has passed since
// the first failure; updates carry a request id the ps remembers, so none is
// applied twice. A ps away longer (or restarted: it lost its variables) is
// UnavailableError naming it.
//
// Failures. A worker whose connection fails while it runs a closure (killed,
// host gone) gets no more work; its closure goes back to the queue and runs
// on another worker, and the coordinator keeps trying to reconnect to it
// (a restarted worker gets work again). A ps task that fails is reported by
// the next join(), done() or fetch() as UnavailableError naming it. An error
// thrown by a scheduled function is reported once, with its type, by the next
// schedule(), join(), done() or fetch(); closures still queued then are
// cancelled (state kAborted) and the coordinator is usable again. A server
// whose coordinator has not been heard from for coordinator_timeout_s stops
// and exits (no orphans).
//
// Threads. ClusterCoordinator's methods may be called from any thread.
// RemoteVariable operations may be called from any thread of a coordinator
// or a server process, including inside a scheduled function.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "strata/data.hpp"
#include "strata/error.hpp"
#include "strata/export.hpp"
#include "strata/partitioners.hpp"
#include "strata/tensor.hpp"

namespace strata {

namespace ps_detail {
struct VariableInfo;
struct ClosureState;
class CoordinatorCore;
class ServerCore;
}  // namespace ps_detail

/// What a per-worker value is on each worker (see PerWorkerValues).
enum class PerWorkerKind : std::uint8_t { kValue = 0, kDataset = 1, kIterator = 2 };

/// The wire handle of a per-worker value (tf's PerWorkerValues as an
/// argument): on a worker, a scheduled function resolves it to that
/// worker's own value with get_per_worker_value() or get_iterator().
struct PerWorkerRef {
  std::uint64_t id = 0;
  PerWorkerKind kind = PerWorkerKind::kValue;
};

/// A variable held on parameter-server tasks (one shard per ps-held part).
/// Copyable handle; the variable lives as long as its ps tasks do. Passed as
/// an argument to a scheduled function, it refers to the same shards there.
class STRATA_API RemoteVariable {
 public:
  RemoteVariable() = default;
  const std::string& name() const;
  DType dtype() const;
  std::vector<std::int64_t> shape() const;
  /// Shards along axis 0 (1 for an unsharded variable).
  std::int64_t num_shards() const;
  /// The ps task holding shard `i`.
  int shard_ps_task(std::int64_t i) const;
  /// Pull every shard and concatenate them along axis 0. Blocks up to the
  /// operation deadline; UnavailableError naming the ps task when it is gone.
  Tensor read() const;
  /// Replace / add to / subtract from the value (shape and dtype must
  /// match). Each shard's update is applied atomically on its ps task.
  void assign(const Tensor& value) const;
  void assign_add(const Tensor& delta) const;
  void assign_sub(const Tensor& delta) const;
  /// tf.Variable.scatter_add / scatter_sub / scatter_update with a
  /// tf.IndexedSlices (strata/values.hpp): update rows `slices.indices`
  /// (int64 [n], along axis 0, across shards) with the rows of
  /// `slices.values` ([n] + the variable's shape[1:]); `dense_shape`, when
  /// set, must be the variable's shape. Each shard's rows are updated atomically on its ps
  /// task (not across shards, as in tf.distribute); duplicate indices are
  /// applied in order (added twice; the last one wins for scatter_update).
  /// InvalidArgumentError naming the index and the variable's shape when an
  /// index is outside [0, shape[0]), or naming both shapes when the values'
  /// shape is not [indices.size()] + shape[1:]; nothing is sent then.
  void scatter_add(const IndexedSlices& slices) const;
  void scatter_sub(const IndexedSlices& slices) const;
  void scatter_update(const IndexedSlices& slices) const;
  bool defined() const { return info_ != nullptr; }

  // Internal.
  explicit RemoteVariable(std::shared_ptr<const ps_detail::VariableInfo> info) : info_(std::move(info)) {}
  const std::shared_ptr<const ps_detail::VariableInfo>& info() const { return info_; }

 private:
  void update(std::uint32_t op, const Tensor& value) const;
  void scatter(std::uint32_t op, const IndexedSlices& slices) const;
  std::shared_ptr<const ps_detail::VariableInfo> info_;
};

/// A scheduled function's argument or result: nothing, an integer, a real
/// number, a string, a host tensor, a remote variable or a per-worker value
/// (an argument only). Move-only (Tensor).
using Value =
    std::variant<std::monostate, std::int64_t, double, std::string, Tensor, RemoteVariable, PerWorkerRef>;
using Args = std::vector<Value>;

class PerWorkerValues;

/// Make a Value from a C++ value (integers -> int64, floating -> double).
template <class T>
Value to_value(T&& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Value>) return std::forward<T>(v);
  else if constexpr (std::is_same_v<D, bool> || std::is_integral_v<D>) return Value(static_cast<std::int64_t>(v));
  else if constexpr (std::is_floating_point_v<D>) return Value(static_cast<double>(v));
  else if constexpr (std::is_convertible_v<D, std::string>) return Value(std::string(v));
  else if constexpr (std::is_base_of_v<PerWorkerValues, D>) return Value(v.ref());
  else return Value(std::forward<T>(v));
}

/// The name of a Value's kind ("int64", "tensor", ...), for messages.
STRATA_API const char* value_kind_name(const Value& v);

/// Argument `i` of a scheduled function as T (std::int64_t, double,
/// std::string, Tensor, RemoteVariable). InvalidArgumentError naming the
/// argument and both kinds when it is missing or of another kind.
template <class T>
const T& get_arg(const Args& args, std::size_t i) {
  STRATA_ENFORCE(i < args.size(), STRATA_ERR_INVALID_ARGUMENT, "the function was given ", args.size(),
                 " argument(s) but reads argument ", i, "; pass it to schedule()");
  const T* p = std::get_if<T>(&args[i]);
  if (p == nullptr) {
    const Value probe{T{}};
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "argument ", i, " is a ", value_kind_name(args[i]), ", not a ",
                 value_kind_name(probe), "; pass a ", value_kind_name(probe), " to schedule()");
  }
  return *p;
}

/// A function that workers run by name.
using RemoteFunction = std::function<Value(const Args&)>;

/// Register `fn` under `name` in this process (at load time through
/// STRATA_REGISTER_FUNCTION). AlreadyExistsError when the name is taken.
STRATA_API void register_function(const std::string& name, RemoteFunction fn);
/// The names registered in this process, sorted.
STRATA_API std::vector<std::string> registered_functions();

#define STRATA_PS_CONCAT_INNER_(a, b) a##b
#define STRATA_PS_CONCAT_(a, b) STRATA_PS_CONCAT_INNER_(a, b)
/// STRATA_REGISTER_FUNCTION("train_step", train_step); at namespace scope.
#define STRATA_REGISTER_FUNCTION(name, fn)                                              \
  static const bool STRATA_PS_CONCAT_(strata_registered_function_, __LINE__) =          \
      (::strata::register_function((name), ::strata::RemoteFunction(fn)), true)

/// A function that builds one worker's input: called on every worker with
/// InputContext{num_input_pipelines = number of workers, input_pipeline_id
/// = this worker's index, num_replicas_in_sync = 1}, as tf.distribute's
/// ParameterServerStrategy calls a dataset function.
using DatasetFunction = std::function<Dataset(const InputContext&)>;

/// Register `fn` under `name` for ClusterCoordinator::create_per_worker_dataset
/// (at load time through STRATA_REGISTER_DATASET_FN). AlreadyExistsError
/// when the name is taken.
STRATA_API void register_dataset_function(const std::string& name, DatasetFunction fn);
/// The dataset functions registered in this process, sorted.
STRATA_API std::vector<std::string> registered_dataset_functions();

/// STRATA_REGISTER_DATASET_FN("train_input", make_input); at namespace scope.
#define STRATA_REGISTER_DATASET_FN(name, fn)                                            \
  static const bool STRATA_PS_CONCAT_(strata_registered_dataset_fn_, __LINE__) =        \
      (::strata::register_dataset_function((name), ::strata::DatasetFunction(fn)), true)

/// On a worker, inside a scheduled function: this worker's own pass over
/// its per-worker dataset (argument `i` is a PerWorkerIterator on the
/// coordinator). Copyable handle; closures on one worker run one at a time,
/// so each element of the worker's input goes to exactly one closure.
class STRATA_API LocalIterator {
 public:
  /// The next element; OutOfRangeError ("end of data", tf's OutOfRangeError)
  /// when this worker's input is exhausted. Raised from a scheduled function,
  /// it surfaces at the coordinator's join()/fetch() as OutOfRangeError.
  Element get_next();
  /// The next element, or nullopt at the end (tf's get_next_as_optional).
  std::optional<Element> get_next_as_optional();

  struct Impl;
  explicit LocalIterator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

/// Argument `i` of a scheduled function, a per-worker iterator, resolved to
/// this worker's iterator. InvalidArgumentError when the argument is not a
/// per-worker iterator; FailedPreconditionError when called outside a
/// worker or the iterator was not created on this worker.
STRATA_API LocalIterator get_iterator(const Args& args, std::size_t i);
/// Argument `i` of a scheduled function, a PerWorkerValues, resolved to the
/// value this worker computed for it. Errors as get_iterator.
STRATA_API const Value& get_per_worker_value(const Args& args, std::size_t i);

/// tf.distribute's RemoteValue states.
enum class RemoteValueStatus { kScheduled, kRunning, kReady, kAborted, kError };
STRATA_API const char* remote_value_status_name(RemoteValueStatus s);

/// The future result of one scheduled function. Copyable handle.
class STRATA_API RemoteValue {
 public:
  RemoteValue() = default;
  RemoteValueStatus status() const;
  /// Wait (up to the coordinator's fetch deadline) and return the result.
  /// Throws the function's error (its own type), CancelledError when the
  /// closure was cancelled, UnavailableError when a ps task failed,
  /// DeadlineExceededError when it did not finish in time.
  const Value& fetch() const;
  template <class T>
  const T& fetch_as() const {
    const Value& v = fetch();
    const T* p = std::get_if<T>(&v);
    STRATA_ENFORCE(p != nullptr, STRATA_ERR_INVALID_ARGUMENT, "the result is a ", value_kind_name(v),
                   ", not the kind asked for");
    return *p;
  }
  /// Which worker ran it (-1 while not run).
  int worker() const;
  bool defined() const { return s_ != nullptr; }

  explicit RemoteValue(std::shared_ptr<ps_detail::ClosureState> s) : s_(std::move(s)) {}

 private:
  std::shared_ptr<ps_detail::ClosureState> s_;
};

/// tf.distribute's PerWorkerValues on the coordinator: one value per
/// worker, computed on that worker (ClusterCoordinator::create_per_worker_*).
/// Passed to schedule(), each worker's closure receives its own worker's
/// value. values()[w] is worker w's RemoteValue (fetch it, or fetch them all
/// with ClusterCoordinator::fetch). A worker that restarts computes its
/// value again before it runs any other closure (its RemoteValue is reset).
/// Copyable handle.
class STRATA_API PerWorkerValues {
 public:
  PerWorkerValues() = default;
  PerWorkerRef ref() const { return ref_; }
  const std::vector<RemoteValue>& values() const { return values_; }
  bool defined() const { return ref_.id != 0; }

  // Internal.
  PerWorkerValues(PerWorkerRef ref, std::vector<RemoteValue> values, std::weak_ptr<ps_detail::CoordinatorCore> c)
      : ref_(ref), values_(std::move(values)), coordinator_(std::move(c)) {}

 protected:
  PerWorkerRef ref_;
  std::vector<RemoteValue> values_;
  std::weak_ptr<ps_detail::CoordinatorCore> coordinator_;
};

/// iter(per_worker_dataset): a fresh pass over every worker's dataset.
class STRATA_API PerWorkerIterator : public PerWorkerValues {
 public:
  PerWorkerIterator() = default;
  explicit PerWorkerIterator(PerWorkerValues v) : PerWorkerValues(std::move(v)) {}
};

/// ClusterCoordinator::create_per_worker_dataset's result (tf's
/// PerWorkerDataset): the dataset built on every worker by its function.
class STRATA_API PerWorkerDataset : public PerWorkerValues {
 public:
  PerWorkerDataset() = default;
  explicit PerWorkerDataset(PerWorkerValues v) : PerWorkerValues(std::move(v)) {}
  /// A new iterator on every worker (each starts at its dataset's start).
  PerWorkerIterator iter() const;
};

struct CoordinatorOptions {
  /// Deadline of one variable operation or control message (seconds).
  double op_timeout_s = 60;
  /// join() and fetch() deadline (seconds).
  double join_timeout_s = 3600;
  /// How often every server is pinged (seconds); servers exit when they
  /// have not heard from the coordinator for their coordinator_timeout_s.
  double heartbeat_s = 0.5;
  /// Stop every server when the coordinator is destroyed.
  bool stop_servers_on_exit = true;
  /// How long a ps task may be unreachable (connection lost, or no answer
  /// within the operation deadline) before it counts as failed (seconds).
  /// Within it, variable operations reconnect and retry; a retried update
  /// is applied once (the ps remembers each request's id). < 0: the job
  /// config's /timeouts/ps_grace_s (env STRATA_PS_GRACE_S), default 5 s.
  /// Workers read the config key. Keep it well below the servers'
  /// coordinator_timeout_s: the heartbeat waits for a missing ps this long.
  /// A ps that restarted (new incarnation) is unavailable at once: it lost
  /// its variables, so there is nothing to reconnect to.
  double ps_grace_s = -1;
};

/// tf.distribute.experimental.coordinator.ClusterCoordinator, for the chief.
/// The constructor resolves the cluster (as Strategy::from_config does),
/// serves the rendezvous store on the chief's address, and connects to every
/// worker and ps task (waiting up to /timeouts/rendezvous_s for them).
class STRATA_API ClusterCoordinator {
 public:
  explicit ClusterCoordinator(CoordinatorOptions options = {});
  ~ClusterCoordinator();
  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  int num_workers() const;
  int num_ps() const;

  /// Create a variable on the ps tasks (round robin in creation order; with
  /// a partitioner, sharded along axis 0, each shard placed in turn).
  RemoteVariable create_variable(const std::string& name, const Tensor& initial,
                                 const Partitioner& partitioner = nullptr);

  /// Queue `fn` with `args` for any worker. NotFoundError when no worker has
  /// registered `fn`; throws (once) the error of an earlier failed closure.
  RemoteValue schedule(const std::string& fn, Args args);
  template <class... A>
  RemoteValue schedule_fn(const std::string& fn, A&&... a) {
    Args args;
    (args.push_back(to_value(std::forward<A>(a))), ...);
    return schedule(fn, std::move(args));
  }
  /// Block until every scheduled closure finished. Throws (once) the first
  /// error raised by a closure, or UnavailableError naming a failed ps task,
  /// or DeadlineExceededError after join_timeout_s naming what still runs.
  void join();
  /// True when nothing is queued or running; throws as join() does.
  bool done();
  /// remote.fetch(), after checking the ps tasks (UnavailableError).
  const Value& fetch(const RemoteValue& remote);
  /// Every worker's value, by worker index (tf's fetch of PerWorkerValues).
  std::vector<std::reference_wrapper<const Value>> fetch(const PerWorkerValues& values);

  /// tf's create_per_worker_dataset: every worker builds its own dataset by
  /// running the dataset function registered as `dataset_fn` (before any
  /// closure scheduled later runs there). NotFoundError when a worker lacks
  /// it; the function's error surfaces as a closure's error does.
  PerWorkerDataset create_per_worker_dataset(const std::string& dataset_fn);
  /// Run the function registered as `fn` with `args` once on every worker;
  /// each worker keeps its result for the closures it runs (tf's
  /// PerWorkerValues of per-worker resources).
  PerWorkerValues create_per_worker_values(const std::string& fn, Args args = {});

  /// Tell every server to stop (they exit 0). Also done by the destructor
  /// unless options.stop_servers_on_exit is false.
  void stop_servers();

 private:
  std::shared_ptr<ps_detail::CoordinatorCore> core_;
};

/// This process's task type as the cluster resolver sees it (TF_CONFIG,
/// Slurm, ...): "chief", "worker", "ps", "evaluator", or "" when no cluster
/// is configured. Lets one program pick its role:
///   if (strata::current_task_type() == "chief") { ClusterCoordinator c; ... }
///   else strata::Server::from_env().join();
/// Throws the resolver's error when its configuration is malformed.
STRATA_API std::string current_task_type();

struct ServerOptions {
  /// "worker" or "ps", and the task index; empty/-1: from the cluster resolver.
  std::string job;
  int index = -1;
  /// Exit when the coordinator has not been heard from for this long
  /// (seconds; before it first connects, /timeouts/rendezvous_s counts too).
  double coordinator_timeout_s = 30;
};

/// tf.distribute.Server: serves this process's task until stopped.
class STRATA_API Server {
 public:
  /// Resolve this process's task (TF_CONFIG or another resolver; options
  /// override job and index), connect to the chief's rendezvous store and
  /// start serving. InvalidArgumentError when the task is not a worker or ps
  /// task of the cluster.
  static Server from_env(ServerOptions options = {});
  Server(Server&&) noexcept;
  Server& operator=(Server&&) noexcept;
  ~Server();

  const std::string& job() const;
  int index() const;
  /// Serve until the coordinator says stop (returns normally) or has been
  /// gone longer than coordinator_timeout_s (throws UnavailableError saying
  /// so). Every connection thread is finished before it returns.
  void join();
  /// Ask join() to return (from any thread, e.g. a signal watcher).
  void stop();

 private:
  explicit Server(std::shared_ptr<ps_detail::ServerCore> core);
  std::shared_ptr<ps_detail::ServerCore> core_;
};

}  // namespace strata
