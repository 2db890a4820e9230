// SPDX-License-Identifier: Apache-2.0
// What distribution (core/src/data/distributed_*.cc) needs from a Dataset
// recipe: its batching, its source's sharding capability, and a way to open
// a stream of it with the sharding a policy decided.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strata/c/input.h"
#include "strata/data.hpp"

namespace strata::detail {

/// The last batch() of a recipe (what distribute_dataset splits).
struct BatchInfo {
  bool batched = false;          ///< the recipe has a batch()
  std::int64_t batch_size = 0;   ///< of the last batch()
  bool drop_remainder = false;   ///< of the last batch()
  bool has_shard_hint = false;   ///< shard(SHARD_HINT, SHARD_HINT) appears
};
BatchInfo batch_info(const Dataset& ds);

/// The recipe's answer to shard_info(), as tf's auto-shard rewrite looks for
/// readers: through pass-through transformations and into every branch of
/// zip()/concatenate(), a reader being a file-based source or an
/// interleave()/flat_map() over list_files(). flags STRATA_INPUT_CAN_SHARD_*
/// (BY_FILE only when every branch has a reader), the smallest reader's
/// files, and otherwise why there is no reader. Opens each source once for
/// `ctx` (cheap: no element is read).
struct SourceShardInfo {
  std::uint32_t flags = 0;
  std::vector<std::string> files;
  /// Why the recipe has no file reader to shard (empty when it has one).
  std::string not_file_based;
};
SourceShardInfo source_shard_info(const Dataset& ds, const InputContext& ctx);

/// How to open a stream: sharding decided by distribution.
struct StreamRequest {
  /// Applied to the source right after open (plugin shard()): OFF, FILE or
  /// DATA with num_shards/index.
  strata_shard_policy source_policy = STRATA_SHARD_OFF;
  std::int32_t num_shards = 1;
  std::int32_t index = 0;
  /// When set, shard(SHARD_HINT, SHARD_HINT) placeholders become
  /// shard(hint_num_shards, hint_index); when unset a placeholder is an
  /// InvalidArgumentError ("SHARD_HINT needs AutoShardPolicy::HINT").
  std::optional<std::pair<std::int64_t, std::int64_t>> hint;
  /// Pass number (epoch) for reshuffle_each_iteration.
  std::int64_t pass = 0;
};

// ------------------------------------------------------ iterator state ---

/// Builds the payload of an iterator state (little-endian, length-prefixed
/// fields). seal() frames it: magic, format version, payload length and a
/// CRC32C of the payload, so that truncated or garbled bytes are caught
/// before any field is read.
class StateWriter {
 public:
  void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void boolean(bool v) { u8(v ? 1 : 0); }
  void u64(std::uint64_t v);
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void str(const std::string& s);
  void strings(const std::vector<std::string>& v);
  void tensor(const Tensor& t);  ///< dtype, shape, raw bytes
  void element(const Element& e);
  /// The framed bytes; `kind` says what wrote them ("dataset", ...).
  std::string seal(const std::string& kind) const;

 private:
  std::string buf_;
};

/// Reads what StateWriter wrote. Every read is bounds-checked: running off
/// the end is DataLossError (the CRC makes that rare: it means a state
/// written by a different build that kept the format number).
class StateReader {
 public:
  /// Checks the frame (DataLossError for wrong magic, length or CRC;
  /// InvalidArgumentError for another format version or kind).
  StateReader(const std::string& bytes, const std::string& kind);
  std::uint8_t u8();
  bool boolean() { return u8() != 0; }
  std::uint64_t u64();
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string str();
  std::vector<std::string> strings();
  Tensor tensor();
  Element element();
  /// Count of a list about to be read, bounded by the bytes left (each
  /// entry takes at least `min_bytes`), so a bad count cannot allocate.
  std::uint64_t count(std::size_t min_bytes = 1);
  bool at_end() const { return pos_ == data_.size(); }
  /// DataLossError unless every byte was read.
  void expect_end() const;

 private:
  const char* take(std::size_t n);
  std::string data_;
  std::size_t pos_ = 0;
};

/// The recipe as one line per node, inputs before the node that reads
/// them (source first): what a state is checked against on restore. A map()
/// or interleave() function cannot be compared, only its place.
std::vector<std::string> recipe_signature(const Dataset& ds);
/// InvalidArgumentError naming the first differing line unless equal.
void check_same_recipe(const std::vector<std::string>& saved, const std::vector<std::string>& mine,
                       const char* what);

/// A pass over a recipe. next() returns nullopt at the end and throws the
/// source's or a callback's error. Not thread-safe (one consumer).
///
/// save() writes the stream's position (its own counters and buffers, then
/// its inputs'), as tf.data's iterators checkpoint themselves. restore()
/// reads it into a stream freshly opened from the same recipe, request and
/// pass (one that next() was never called on): it may reopen its inputs
/// (repeat's round, interleave's children) and then restores them.
class ElementStream {
 public:
  virtual ~ElementStream() = default;
  virtual std::optional<Element> next() = 0;
  virtual void save(StateWriter& w) = 0;
  virtual void restore(StateReader& r) = 0;
};

/// save()/restore() of an input that may be gone (a stream releases its
/// input at the end): a presence flag, then the input's state.
void save_input(StateWriter& w, ElementStream* up);
void restore_input(StateReader& r, std::unique_ptr<ElementStream>& up);
std::unique_ptr<ElementStream> open_stream(const Dataset& ds, const InputContext& ctx, const StreamRequest& req);

/// A stream of batches read as one sequence of rows, cut into batches of
/// any size with one copy per component (tf.data's unbatch().batch(n)):
/// what rebatch() and distribute_dataset's split of global batches share.
/// Every batch must have the first batch's components, dtypes and row
/// shapes (InvalidArgumentError naming `op` otherwise). One consumer.
class RowQueue {
 public:
  RowQueue(std::unique_ptr<ElementStream> up, const char* op) : up_(std::move(up)), op_(op) {}
  /// Read until `n` rows are buffered, or the layout is known when n is 0,
  /// or the input ends; true when `n` rows are buffered.
  bool fill(std::int64_t n);
  std::int64_t buffered() const { return buffered_; }
  /// The first batch read (names, dtypes, row shapes); nullptr before.
  const Element* layout() const { return layout_ ? &*layout_ : nullptr; }
  /// The next `n` (<= buffered()) rows; needs a layout when n is 0. A whole
  /// buffered batch is moved out, not copied.
  Element take(std::int64_t n);
  /// Rows taken so far (what a distributed state uses to tell whether its
  /// position falls on a global-batch boundary).
  std::int64_t taken() const { return taken_; }
  /// The buffered rows in order (whole or partial batches, copies) and the
  /// input still to read; for the distributed state.
  std::vector<Element> buffered_rows() const;
  /// Position: rows taken, layout, buffered rows, then the input's state.
  void save(StateWriter& w);
  void restore(StateReader& r);
  /// Restore with these buffered rows (`batches`, in order, each with a
  /// leading batch dimension), layout and count of rows taken, then the
  /// input's state from `r` (what save() wrote after the rows).
  void resume(std::vector<Element> batches, std::optional<Element> layout, std::int64_t taken, StateReader& r);
  /// Put `batches` in front of what is buffered.
  void prepend(std::vector<Element> batches);

 private:
  void check_layout(const Element& b) const;
  std::unique_ptr<ElementStream> up_;
  const char* op_;
  std::deque<Element> pending_;
  std::deque<std::int64_t> rows_;
  std::int64_t offset_ = 0;  // rows of pending_.front() already taken
  std::int64_t buffered_ = 0;
  std::int64_t taken_ = 0;
  std::optional<Element> layout_;
};

/// After restoring pass `pass` of `ds`: later make_iterator() calls on it
/// continue from pass + 1 (a restarted program makes epoch 4's iterator
/// after restoring epoch 3's).
void note_restored_pass(const Dataset& ds, std::int64_t pass);

/// A user-given timeout in seconds as a wait duration, clamped to a year so
/// no conversion can overflow.
inline std::chrono::duration<double> wait_limit(double seconds) {
  return std::chrono::duration<double>(std::min(seconds, 3.2e7));
}

/// Logs that a producer thread was left to finish alone (see stop_producer).
void warn_producer_left(const char* what);

/// Ends a producer thread that shares `st` (fields `mu`, `cv`, `stop`,
/// `done`) through a shared_ptr: sets `stop`, waits up to 2 s for `done`,
/// then joins. Source reads are bounded by source_timeout_s but a map() or
/// generator callback is not, so a thread still busy after that is detached
/// with a warning naming `what`; it finishes on its own, owning its state.
template <class State>
void stop_producer(State& st, std::thread& th, const char* what) {
  std::unique_lock<std::mutex> l(st.mu);
  st.stop = true;
  st.cv.notify_all();
  const bool done = st.cv.wait_for(l, std::chrono::seconds(2), [&] { return st.done; });
  l.unlock();
  if (done) {
    th.join();
  } else {
    warn_producer_left(what);
    th.detach();
  }
}

}  // namespace strata::detail
