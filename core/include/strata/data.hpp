// SPDX-License-Identifier: Apache-2.0
// strata::Dataset (tf.data.Dataset, the parts distributed training needs).
//
// A Dataset is an immutable recipe: a source (an InputPipeline plugin:
// "memory", "records", "generator" or any third-party one, or list_files)
// followed by transformations (shuffle, batch, repeat, take, skip, map,
// prefetch, shard, interleave, flat_map, unique, assert_cardinality,
// rebatch) and combinations (zip, concatenate). Nothing is read until the
// dataset is iterated; every iteration
// opens the source afresh, so one Dataset can be iterated many times and
// distributed by a Strategy (see distributed_data.hpp), which opens one
// pipeline per worker with its InputContext and inserts the sharding.
//
//   auto ds = strata::Dataset::from_records({"train-0.rec", "train-1.rec"},
//                                           {{{"x", strata::DType::kFloat32, {16}},
//                                             {"y", strata::DType::kFloat32, {1}}}})
//                 .shuffle(10000, /*seed=*/42)
//                 .batch(64)
//                 .prefetch(2);
//   for (strata::Element& batch : ds) { ... batch["x"] ... }
//
// Checkpoints: DatasetIterator::save_state() captures a pass's exact
// position (every stage's own state, as tf.data's iterator checkpoints do)
// and restore_state() continues a fresh iterator of the same recipe from
// it, also in a restarted process:
//
//   std::string pos = it.save_state();           // store with the model
//   ...                                          // later, maybe elsewhere
//   strata::DatasetIterator it2 = ds.make_iterator();
//   it2.restore_state(pos);                      // same elements from here on
//
// Errors: a missing file is NotFoundError naming it, a corrupt record is
// DataLossError naming the file and byte offset (see RecordOptions), a
// callback's exception (generator, map) propagates to the iterating thread
// with its own type, also across prefetch(). Invalid arguments to a
// transformation throw InvalidArgumentError when the recipe is built.
//
// Threads: a Dataset is immutable and may be shared and iterated from
// several threads at once (each iterator is its own pass). An iterator is
// used by one thread at a time. Callbacks run on the thread that pulls the
// element: the iterating thread, or prefetch()'s background thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/export.hpp"
#include "strata/strategy.hpp"
#include "strata/tensor.hpp"

namespace strata {

/// One element of a dataset: named tensors (a "tuple" with names), at most
/// 16 components. After batch() every component gains a leading batch
/// dimension.
struct STRATA_API Element {
  std::vector<std::string> names;
  std::vector<Tensor> tensors;

  Element() = default;
  Element(Element&&) noexcept = default;
  Element& operator=(Element&&) noexcept = default;

  /// Append a component (InvalidArgumentError for a duplicate name or a
  /// 17th component).
  Element& add(std::string name, Tensor t);
  /// The component called `name`; NotFoundError listing the names.
  Tensor& operator[](const std::string& name);
  const Tensor& operator[](const std::string& name) const;
  std::size_t size() const { return tensors.size(); }
  /// Deep copy.
  Element clone() const;
};

/// tf.data.experimental.AutoShardPolicy: how distribute_dataset splits the
/// input across workers. AUTO tries FILE, and falls back to DATA when the
/// pipeline has no file reader or a reader has fewer files than workers;
/// FILE gives each worker every num_workers-th file of every reader;
/// DATA has every worker read everything and keep its share; OFF gives
/// every worker all the data; HINT replaces shard(SHARD_HINT, SHARD_HINT)
/// placeholders (in any branch) by shard(num_workers, worker_index).
///
/// Readers are found as tf's auto-shard rewrite finds them, walking from
/// the output through shuffle, batch, rebatch, repeat, take, skip, map,
/// prefetch, shard and assert_cardinality (dropped under FILE, as tf
/// drops it) and into every input of zip and concatenate: a file-based
/// source (from_records, a plugin that shards by file) or an interleave /
/// flat_map over list_files (the list is sharded, before list_files'
/// shuffle). An in-memory source, a generator, list_files read directly
/// and unique() are not readers. FILE without a reader is NotFoundError
/// (tf's kind), FILE with a reader of fewer files than workers is
/// InvalidArgumentError; both are raised by distribute_dataset, also for
/// a single worker.
enum class AutoShardPolicy { AUTO, FILE, DATA, OFF, HINT };
STRATA_API const char* auto_shard_policy_name(AutoShardPolicy p);

/// Placeholder for Dataset::shard under AutoShardPolicy::HINT.
constexpr std::int64_t SHARD_HINT = -1;

/// Dataset::cardinality() results (tf.data.UNKNOWN_CARDINALITY and
/// tf.data.INFINITE_CARDINALITY); INFINITE_CARDINALITY is also what
/// assert_cardinality takes for "never ends".
constexpr std::int64_t UNKNOWN_CARDINALITY = -1;
constexpr std::int64_t INFINITE_CARDINALITY = -2;

/// tf.data.Options, the parts Strata honours.
struct DatasetOptions {
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::AUTO;
  /// Deadline for one next() of the source plugin (a stuck reader is an
  /// error naming the pipeline, never a hang).
  double source_timeout_s = 300;
  /// Longest next() waits on a prefetch() stage (seconds, > 0): a map() or
  /// generator callback before it that blocks is DeadlineExceededError.
  double prefetch_timeout_s = 600;
};

/// One fixed-size component of a record's payload (see RecordOptions).
struct FeatureSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
};

/// How the "records" pipeline reads TFRecord-format files (8-byte length,
/// masked CRC32C of the length, payload, masked CRC32C of the payload).
struct RecordOptions {
  /// Empty: every element is one component "record" (uint8, the payload
  /// bytes). Otherwise the payload is these features' raw little-endian
  /// bytes back to back (what RecordWriter::write_features writes) and the
  /// element has one component per feature.
  std::vector<FeatureSpec> features;
  /// false (default): a corrupt record is DataLossError naming the file and
  /// byte offset. true: corrupt records are skipped (a corrupt length
  /// skips the rest of that file) and the count is logged per file.
  bool skip_corrupt = false;
  /// Read buffer per file.
  std::int64_t buffer_bytes = 4 << 20;
};

class Dataset;
namespace detail {
struct DatasetNode;  // the recipe (core/src/data)
}

/// A pass over a dataset. Move-only; next() returns nullopt at the end.
class STRATA_API DatasetIterator {
 public:
  DatasetIterator();
  DatasetIterator(DatasetIterator&&) noexcept;
  DatasetIterator& operator=(DatasetIterator&&) noexcept;
  ~DatasetIterator();
  /// The next element, or nullopt at the end of the pass (and on every
  /// call after it). Throws the source's or a callback's error (a
  /// callback's exception with its own type). FailedPreconditionError on a
  /// default-constructed iterator.
  std::optional<Element> next();

  /// This pass's exact position as opaque, versioned bytes (tf.data's
  /// iterator checkpoint). Every stage saves its own state, as tf.data's
  /// iterators do: the source plugin its position (the "memory" and
  /// "records" pipelines save the next row or file and byte offset; a
  /// plugin without save_state, such as a generator, saves the count of
  /// elements it yielded), shuffle its buffer, random generator state and
  /// pass number, repeat its round and that round's state, take, skip,
  /// shard and assert_cardinality their counters, unique its seen set,
  /// rebatch its queued rows, interleave/flat_map its cycle position and
  /// every open child (the input element it was opened from and its
  /// state), zip and concatenate their inputs, list_files its place, and
  /// prefetch pauses its thread between two elements and saves the
  /// elements already read ahead with its input's state. Element tensors
  /// are stored in the state (dtype, shape, raw bytes). Callbacks (map,
  /// interleave functions, generators) are not saved: restoring calls them
  /// again. FailedPreconditionError when prefetch() read ahead into an error;
  /// DeadlineExceededError when the stage before a prefetch() is stuck
  /// past DatasetOptions::prefetch_timeout_s. An ended pass saves "ended".
  std::string save_state();
  /// Continue from `state` (what save_state of an iterator of the same
  /// recipe and InputContext wrote, in this process or another): this
  /// iterator must be fresh (next() never called), else
  /// FailedPreconditionError. A state of a different recipe is
  /// InvalidArgumentError naming the first differing transformation (a
  /// different InputContext is InvalidArgumentError too); truncated or
  /// garbled bytes are DataLossError; a state of a newer format (a newer
  /// Strata) is UnimplementedError. After it, next() yields exactly what
  /// the saved iterator would have yielded next, and the restored pass
  /// keeps the saved pass number (its reshuffles): later make_iterator()
  /// calls on the Dataset continue from saved pass + 1. Exact when the
  /// recipe's callbacks are deterministic; a generator source is exact only
  /// when it yields the same sequence on every call of its make function
  /// (it is restored by reading that many elements again). A map() or
  /// interleave() function cannot be compared, only its place in the
  /// recipe, nor can the contents of in-memory arrays beyond their length,
  /// names, dtypes and shapes. When restoring a stage fails (e.g. a record
  /// file changed), the error propagates and the iterator stays fresh.
  void restore_state(const std::string& state);

  /// Range-for support: `for (Element& e : dataset)` (the RangeIter from
  /// Dataset::begin owns its iterator) and `for (Element& e : iterator)`
  /// (continues this pass).
  class RangeIter {
   public:
    Element& operator*() { return *cur_; }
    Element* operator->() { return &*cur_; }
    RangeIter& operator++();
    bool operator!=(const RangeIter& o) const { return cur_.has_value() != o.cur_.has_value(); }
    bool operator==(const RangeIter& o) const { return !(*this != o); }
    RangeIter() = default;
    explicit RangeIter(DatasetIterator* it);
    explicit RangeIter(std::shared_ptr<DatasetIterator> owned);

   private:
    std::shared_ptr<DatasetIterator> owned_;
    DatasetIterator* it_ = nullptr;
    std::optional<Element> cur_;
  };
  RangeIter begin() { return RangeIter(this); }
  RangeIter end() { return {}; }

  struct Impl;
  explicit DatasetIterator(std::unique_ptr<Impl> impl);

 private:
  friend class Dataset;
  std::unique_ptr<Impl> impl_;
};

class STRATA_API Dataset {
 public:
  /// tf.data.Dataset.from_tensor_slices: element i is row i of every
  /// component (all must share the first dimension). The tensors are kept
  /// alive by the dataset (borrowed tensors must outlive it). Backed by the
  /// "memory" pipeline.
  static Dataset from_tensor_slices(Element components);
  /// from_tensor_slices over .npy files (one per component, read by the
  /// "memory" pipeline): {{"x", "x.npy"}, {"y", "y.npy"}}. Formats 1-3, C
  /// order, dtypes <f4 <f8 <f2 <i4 <i8 |u1. Files are read when iterated
  /// (headers when opened, data on the first element of each pass).
  static Dataset from_npy(const std::vector<std::pair<std::string, std::string>>& files);
  /// A generator: `make` is called once per pass (every epoch, every
  /// repeat, every worker) with that pipeline's InputContext and returns a
  /// function that yields elements and then nullopt. Backed by the
  /// "generator" pipeline. An exception thrown by `make` or the generator
  /// reaches the iterating thread with its own type (including a
  /// strata::OutOfRangeError, which is an error, not the end).
  using Generator = std::function<std::optional<Element>()>;
  static Dataset from_generator(std::function<Generator(const InputContext&)> make);
  /// TFRecord-format files, in the given order ("records" pipeline).
  static Dataset from_records(const std::vector<std::string>& files, const RecordOptions& options = {});
  /// Any input pipeline plugin by name with its options JSON.
  static Dataset from_plugin(const std::string& name, const std::string& options_json = "{}");

  /// tf.data.Dataset.list_files: the files matching any of the glob
  /// `patterns` (POSIX glob(3)), expanded now, sorted by name (duplicates
  /// kept), one element per file. No match at all is InvalidArgumentError
  /// naming the patterns. shuffle: a full shuffle by `seed`, a new order
  /// every pass (seed + pass number, as shuffle() does).
  ///
  /// Strata's Tensor has no string dtype, so a file name is the element's
  /// one component "filename": a uint8 vector of the name's bytes (read it
  /// back with file_name()). Such elements are meant for interleave() or
  /// flat_map(), whose function opens each file (typically with
  /// from_records({file_name(e)})); that pair is what auto-sharding
  /// recognises as a file reader (see AutoShardPolicy).
  static Dataset list_files(const std::vector<std::string>& patterns, bool shuffle = true, std::uint64_t seed = 0);
  /// The file name carried by a list_files() element (InvalidArgumentError
  /// when `e` has no uint8 vector component "filename").
  static std::string file_name(const Element& e);

  /// tf.data.Dataset.zip: element i is the components of element i of every
  /// dataset, in order (Strata elements are flat, so names must be unique
  /// across the datasets: a clash is InvalidArgumentError naming it; rename
  /// with map()). Ends with the shortest dataset. At least one dataset.
  static Dataset zip(const std::vector<Dataset>& datasets);

  /// Fill a buffer of `buffer_size` (>= 1) elements and yield a random one
  /// from it, refilling as it goes (tf semantics; a buffer of the dataset's
  /// size is a full shuffle). Same seed, same order; with
  /// reshuffle_each_iteration each pass uses seed + pass number, where the
  /// pass counts make_iterator()/range-for calls on this Dataset and, under
  /// repeat(), the rounds of every pass.
  Dataset shuffle(std::int64_t buffer_size, std::uint64_t seed, bool reshuffle_each_iteration = true) const;
  /// Stack consecutive elements (same shapes) along a new first dimension.
  /// The last batch is shorter unless drop_remainder. batch_size >= 1.
  /// Different shapes or dtypes within a batch are InvalidArgumentError
  /// naming the component and both shapes.
  Dataset batch(std::int64_t batch_size, bool drop_remainder = false) const;
  /// Repeat `count` times (-1: forever). Every round reopens the source
  /// (a generator's `make` runs again). Repeating a dataset whose round
  /// yields nothing ends instead of spinning.
  Dataset repeat(std::int64_t count = -1) const;
  /// The first `count` elements (-1: all). Never reads beyond them.
  Dataset take(std::int64_t count) const;
  /// Drop the first `count` elements (-1: all of them).
  Dataset skip(std::int64_t count) const;
  /// Apply `fn` to every element (on the pipeline's thread).
  Dataset map(std::function<Element(Element)> fn) const;
  /// Produce up to `buffer_size` elements ahead on a background thread (-1,
  /// tf's AUTOTUNE, means 2), started by the pass's first next(). Order and errors are preserved. Destroying
  /// the iterator stops the thread; one stuck for over 2 s in a user
  /// callback is left to finish on its own (logged), never joined forever.
  Dataset prefetch(std::int64_t buffer_size) const;
  /// Keep elements index, index + num_shards, ... (0 <= index <
  /// num_shards). Both SHARD_HINT: a placeholder that AutoShardPolicy::HINT
  /// replaces with (num_workers, worker_index); iterating it otherwise is
  /// InvalidArgumentError.
  Dataset shard(std::int64_t num_shards, std::int64_t index) const;
  /// tf.data.Dataset.interleave: `fn` turns each input element into a
  /// dataset; `cycle_length` (>= 1) of them are read at once, taking
  /// `block_length` (>= 1) consecutive elements from each in turn. A
  /// finished dataset frees its place in the cycle, which the next input
  /// element fills when the turn comes back to it (tf's order exactly).
  /// `fn` runs on the pipeline's thread; its exception reaches the
  /// iterating thread with its own type. The datasets `fn` returns are
  /// opened with their own options and are never auto-sharded themselves
  /// (auto-sharding shards this dataset's input, see AutoShardPolicy).
  Dataset interleave(std::function<Dataset(Element)> fn, std::int64_t cycle_length,
                     std::int64_t block_length = 1) const;
  /// tf.data.Dataset.flat_map: the datasets `fn` returns, one after the
  /// other (interleave with cycle_length 1).
  Dataset flat_map(std::function<Dataset(Element)> fn) const;
  /// tf.data.Dataset.concatenate: this dataset's elements, then `other`'s
  /// (opened when this one ends). Both must have the same component names
  /// and dtypes (InvalidArgumentError naming the first difference).
  Dataset concatenate(const Dataset& other) const;
  /// tf.data.Dataset.unique: drops elements equal to an earlier one (first
  /// occurrence kept, order kept). The element must have one component of
  /// dtype int32 or int64 (tf), or uint8 (Strata's file names), any shape;
  /// otherwise InvalidArgumentError. Remembers every distinct value.
  Dataset unique() const;
  /// tf.data.Dataset.assert_cardinality: passes elements through and fails
  /// with FailedPreconditionError (tf's kind) as soon as the count is known
  /// to differ from `n`: at element n + 1, or at an end before n elements.
  /// `n` >= 0, or INFINITE_CARDINALITY (the end itself is the error).
  /// cardinality() then reports `n`. Not checked when auto-sharding by
  /// FILE, which changes the count (tf's rewrite removes it too).
  Dataset assert_cardinality(std::int64_t n) const;
  /// tf.data.Dataset.rebatch: this dataset's batches re-cut into batches of
  /// `batch_sizes[0]`, `batch_sizes[1]`, ... (cycled), as
  /// unbatch().batch(sizes) would but with one copy. Sizes >= 0, at least
  /// one positive; a 0 gives an empty batch without reading input. The
  /// last batch is shorter unless drop_remainder. Every component needs a
  /// leading batch dimension, the same in all components of an element.
  Dataset rebatch(std::vector<std::int64_t> batch_sizes, bool drop_remainder = false) const;
  Dataset rebatch(std::int64_t batch_size, bool drop_remainder = false) const {
    return rebatch(std::vector<std::int64_t>{batch_size}, drop_remainder);
  }
  /// The options of the whole pipeline (tf: options are global); later
  /// transformations keep them.
  Dataset with_options(const DatasetOptions& options) const;
  const DatasetOptions& options() const;

  /// Elements per pass if known: -1 unknown, -2 infinite (tf's rules for
  /// batch/repeat/take/skip/shard; shuffle, map and prefetch keep it).
  /// Known for from_tensor_slices; from_npy and from_plugin open the source
  /// to ask it (a missing file throws); a generator is unknown.
  std::int64_t cardinality() const;

  /// One pass, as pipeline `ctx` (default: the only pipeline). Opens the
  /// source now, so a missing file or bad option throws here.
  DatasetIterator make_iterator(const InputContext& ctx = {}) const;
  DatasetIterator::RangeIter begin() const;
  DatasetIterator::RangeIter end() const { return {}; }

  /// Internal: the recipe.
  explicit Dataset(std::shared_ptr<const detail::DatasetNode> node);
  const std::shared_ptr<const detail::DatasetNode>& node() const { return node_; }

 private:
  std::shared_ptr<const detail::DatasetNode> node_;
};

}  // namespace strata
