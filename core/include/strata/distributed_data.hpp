// SPDX-License-Identifier: Apache-2.0
// Distributed input (tf.distribute's DistributedDataset and
// DistributedIterator): a Dataset written once, split across the replicas in
// sync and sharded across the workers.
//
//   auto ds = strata::Dataset::from_records(files, record_options).shuffle(10000, 7).batch(global_batch);
//   auto dist = strategy.distribute_dataset(ds);
//   for (strata::DistributedElement& batch : dist) {          // one epoch
//     strategy.run([&](strata::ReplicaContext& ctx, const strata::Tensor& x) { ... }, batch["x"]);
//   }
//
// Splitting (Strategy::distribute_dataset) follows tf.distribute's
// rebatching. The dataset must be batched by the GLOBAL batch size G. With
// W workers of L local replicas (N = W * L replicas in sync):
//  - one worker, or FILE, OFF or HINT sharding across workers: each worker
//    reads its own stream of global batches as one sequence of rows and cuts
//    it into sub-batches whose sizes cycle through tf.distribute's
//    batch_sizes_for_worker(G, W, L, w): of the N sizes, the first G % N are
//    ceil(G / N) and the rest floor(G / N), and worker w's list starts at
//    entry w * L. Each step takes L consecutive sub-batches. So G = 10 on 4
//    replicas is 3+3+2+2; G = 7 on 2 workers x 2 replicas is 2+2 | 2+1 at
//    step 1 and 2+1 | 2+2 at step 2 (worker 0 | worker 1); G = 2 on 4
//    workers gives two of them an empty batch each step, in turn. A short
//    last batch fills the sub-batches in order (5 rows on 4 replicas:
//    3+2+0+0).
//  - DATA across workers: every worker reads the same global batches (so
//    the dataset must be deterministic: seeded shuffles, a generator that
//    yields the same sequence on every worker); each batch of b rows is cut
//    into N minibatches of ceil(b / N) rows (the last ones shorter or empty)
//    and local replica i of worker w gets minibatch w + i * W, as
//    tf.distribute's legacy rebatch followed by shard(W, w) gives.
// A step whose sub-batches are all empty counts while the worker's stream
// has rows left; tf.data's rebatch can also emit trailing all-empty steps
// after the last row, which Strata does not (a deliberate difference).
// Every step is in lock-step across workers: when one worker's data ends
// first, its replicas get empty batches (first dimension 0) until every
// worker is exhausted, and iteration ends on all workers at the same step.
// The end is agreed with a small all-reduce per step across workers. A
// worker whose input yields no batch at all takes the element layout (names,
// dtypes, row shapes) from the others, once, and the workers that have one
// check that theirs agree (InvalidArgumentError naming both otherwise).
//
// distribute_datasets_from_function: `fn(InputContext)` builds each
// pipeline's dataset, already batched PER REPLICA (use
// ctx.get_per_replica_batch_size(B)) and sharded as the user likes. With
// InputReplicationMode::PER_WORKER (default) `fn` runs once per worker and
// its local replicas take consecutive elements; with PER_REPLICA it runs
// once per local replica with {num_input_pipelines = R, input_pipeline_id
// = replica_id_in_sync_group}.
//
// Input runs ahead on a background thread per worker (a bounded queue of
// InputOptions::prefetch_depth steps, started by an iterator's first
// next()), so the next step's batch is ready when the training step asks
// for it.
//
// Saving and restoring the input position (checkpoints):
// DistributedIterator::save_state() returns this worker's position after
// the steps consumed (never what the input thread prepared ahead), and
// restore_state() continues a fresh iterator from the states every worker
// saved at the same step. Same worker count: exact on every worker. Another
// worker count: exact global batches for DATA and OFF, refused for FILE,
// HINT and distribute_datasets_from_function (see restore_state).
//
// Lifetime: a DistributedDataset and its iterators keep the strategy's
// instance alive. Iterators are used from one thread in cross-replica
// context (not inside run()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/data.hpp"
#include "strata/export.hpp"
#include "strata/strategy.hpp"
#include "strata/values.hpp"

namespace strata {

/// tf.distribute.InputReplicationMode.
enum class InputReplicationMode { PER_WORKER, PER_REPLICA };

/// tf.distribute.InputOptions.
struct InputOptions {
  /// Steps prepared ahead per worker by the input thread (>= 1).
  int prefetch_depth = 2;
  /// For distribute_datasets_from_function (distribute_dataset is always
  /// per worker).
  InputReplicationMode experimental_replication_mode = InputReplicationMode::PER_WORKER;
  /// Longest a step waits for its input (seconds, > 0): past it, next()
  /// throws DeadlineExceededError instead of hanging on a callback that
  /// blocks. Raise it for input that is slow on purpose (huge batches, a
  /// heavy map()).
  double timeout_s = 600;
};

/// One step of input: for every component, one tensor per local replica.
class STRATA_API DistributedElement {
 public:
  DistributedElement() = default;
  DistributedElement(std::vector<std::string> names, std::vector<PerReplica> values);
  DistributedElement(DistributedElement&&) noexcept = default;
  DistributedElement& operator=(DistributedElement&&) noexcept = default;

  const std::vector<std::string>& names() const { return names_; }
  std::size_t size() const { return values_.size(); }
  /// The component called `name` (NotFoundError listing the names).
  PerReplica& operator[](const std::string& name);
  const PerReplica& operator[](const std::string& name) const;
  PerReplica& operator[](std::size_t i) { return values_.at(i); }
  /// Rows (first dimension) each local replica got this step.
  std::vector<std::int64_t> local_batch_sizes() const;

 private:
  std::vector<std::string> names_;
  std::vector<PerReplica> values_;
};

namespace detail {
struct DistributedDatasetImpl;
struct DistributedIteratorImpl;
}  // namespace detail

/// One pass (epoch) over a distributed dataset.
class STRATA_API DistributedIterator {
 public:
  DistributedIterator();
  explicit DistributedIterator(std::unique_ptr<detail::DistributedIteratorImpl> impl);
  DistributedIterator(DistributedIterator&&) noexcept;
  DistributedIterator& operator=(DistributedIterator&&) noexcept;
  ~DistributedIterator();

  /// The next step's input; OutOfRangeError once every worker is
  /// exhausted. A dataset with no elements at all is InvalidArgumentError.
  DistributedElement next();
  /// As next(), but nullopt at the end (tf's get_next_as_optional).
  std::optional<DistributedElement> get_next_as_optional();

  /// This worker's position (cross-replica context; no collective): what
  /// the user has consumed through next(), NOT what the input thread
  /// prepared ahead. The thread is paused between two steps (not stopped),
  /// and the steps it prepared ahead are stored in the state with the
  /// pipeline's own position after them (see DatasetIterator::save_state
  /// for what each stage saves and what is exact), together with the
  /// split's cycle and leftover rows, the end-of-data agreement (steps
  /// taken, whether this worker's input ended, the element layout), the
  /// worker count and index, the replicas per worker, the applied policy
  /// and the pass (epoch). Save at the same step on every worker and keep
  /// each worker's bytes (e.g. in the checkpoint); the state holds element
  /// data (queued steps, shuffle and prefetch buffers), so it grows with
  /// them. DeadlineExceededError
  /// when the input thread is stuck in a callback past
  /// InputOptions::timeout_s; FailedPreconditionError when the input it
  /// read ahead failed.
  std::string save_state();
  /// Restore from the states every worker saved at the same step, in
  /// worker-index order (states_by_worker.size() = number of workers at
  /// save time). Fresh iterator only (next() never called), else
  /// FailedPreconditionError. Every worker calls it with the same vector;
  /// no collective is made. With the same worker count (and replicas per
  /// worker) each worker continues from states_by_worker[its index] and
  /// every later step is exactly what the saved run would have produced.
  /// With another count, DATA and OFF (whose workers read one global
  /// stream) continue from worker 0's state: the sequence of global batches
  /// continues exactly and only its split over the new replicas differs
  /// (under OFF every new worker continues worker 0's stream of rows; a
  /// state of a worker that cut rows across global batches, i.e. one
  /// worker or OFF, continues as multi-worker DATA only from a
  /// global-batch boundary and is refused elsewhere). FILE, HINT and
  /// FUNCTION with another
  /// topology, a state of another recipe, policy or global batch, and
  /// states out of worker order are InvalidArgumentError saying what
  /// differs and what to do (restore with the same worker count, or
  /// restore without the iterator to restart the input); damaged bytes
  /// are DataLossError. The restored pass keeps its epoch number, and later
  /// make_iterator() calls continue from it + 1.
  void restore_state(const std::vector<std::string>& states_by_worker);

  class RangeIter {
   public:
    RangeIter() = default;
    explicit RangeIter(DistributedIterator* it);
    DistributedElement& operator*() { return *cur_; }
    RangeIter& operator++();
    bool operator!=(const RangeIter& o) const { return cur_.has_value() != o.cur_.has_value(); }

   private:
    DistributedIterator* it_ = nullptr;
    std::optional<DistributedElement> cur_;
  };

 private:
  std::unique_ptr<detail::DistributedIteratorImpl> impl_;
};

/// A dataset distributed by a strategy. Iterating it again starts a new
/// epoch (reshuffled when the dataset asks for it).
class STRATA_API DistributedDataset {
 public:
  explicit DistributedDataset(std::shared_ptr<detail::DistributedDatasetImpl> impl);
  DistributedDataset(DistributedDataset&&) noexcept;
  DistributedDataset& operator=(DistributedDataset&&) noexcept;
  ~DistributedDataset();

  /// A new pass. Every worker must make and step its passes in the same
  /// order (the end of a pass is agreed by a collective).
  DistributedIterator make_iterator() const;
  /// Range-for: `for (DistributedElement& e : dist)` runs one epoch.
  DistributedIterator::RangeIter begin();
  DistributedIterator::RangeIter end() { return {}; }
  /// The sharding policy applied ("FILE", "DATA", "OFF", "HINT", or
  /// "FUNCTION" for distribute_datasets_from_function) and why.
  const std::string& applied_policy() const;
  const std::string& policy_reason() const;

 private:
  std::shared_ptr<detail::DistributedDatasetImpl> impl_;
  std::optional<DistributedIterator> range_;  // the pass a range-for runs
};

}  // namespace strata
