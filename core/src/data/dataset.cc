// SPDX-License-Identifier: Apache-2.0
// strata::Dataset: an immutable recipe (a tree of DatasetNode, one source at
// the bottom) and the element streams that execute it. Every iteration
// opens the recipe afresh: the source plugin is opened through the plugin
// host for the pipeline's InputContext, and each transformation wraps the
// stream below it. tf.data semantics are followed where the API names a tf
// operation (shuffle buffer, batch remainder, repeat, take/skip, shard,
// cardinality arithmetic).
#include "strata/data.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <glob.h>
#include <locale>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "api/kernels.h"
#include "data/dataset_internal.h"
#include "log.h"
#include "strata/plugin_host.hpp"

namespace strata {

struct DatasetIterator::Impl {
  std::unique_ptr<detail::ElementStream> stream;
  bool ended = false;
  bool used = false;  // next() was called: restore_state is refused
  // What opened the stream (restore_state reopens it at the saved pass).
  std::optional<Dataset> dataset;
  InputContext ctx;
  detail::StreamRequest req;
};

namespace detail {

enum class NodeKind {
  kSource,
  kShuffle,
  kBatch,
  kRepeat,
  kTake,
  kSkip,
  kMap,
  kPrefetch,
  kShard,
  kOptions,
  kListFiles,
  kInterleave,
  kZip,
  kConcatenate,
  kUnique,
  kAssertCardinality,
  kRebatch
};

/// How to open the source plugin of a recipe.
struct SourceSpec {
  std::string plugin;        ///< input pipeline plugin name
  std::string options_json;  ///< its options
  std::string label;         ///< for messages: "from_tensor_slices", "from_npy(...)", ...
  /// The C structs (and tensors) whose address is in options_json; kept
  /// alive by every node and stream that may open the source.
  std::shared_ptr<void> keep_alive;
  /// Known without opening the plugin (memory arrays; generator: -1).
  std::optional<std::int64_t> cardinality;
  /// Known without opening the plugin (generator: opening runs user code).
  std::optional<std::uint32_t> shard_flags;
  /// How an iterator state names this source when options_json holds an
  /// address (in-memory sources): what stays the same across processes.
  std::string signature;
};

struct DatasetNode {
  NodeKind kind = NodeKind::kSource;
  std::shared_ptr<const DatasetNode> input;
  SourceSpec source;
  std::int64_t count = 0;  ///< shuffle buffer, batch size, repeat/take/skip count, prefetch depth, num_shards
  std::int64_t index = 0;  ///< shard index
  std::uint64_t seed = 0;
  bool flag = false;  ///< batch: drop_remainder; shuffle: reshuffle_each_iteration
  std::function<Element(Element)> fn;
  /// zip: the datasets after `input`; concatenate: the one after `input`.
  std::vector<std::shared_ptr<const DatasetNode>> inputs;
  std::vector<std::string> files;    ///< list_files: the expanded, sorted file names
  std::vector<std::int64_t> sizes;   ///< rebatch: the batch sizes, cycled
  std::int64_t block = 1;            ///< interleave: block_length (count: cycle_length)
  std::function<Dataset(Element)> dataset_fn;  ///< interleave / flat_map
  DatasetOptions options;
  /// Iterations started through make_iterator (the pass number of the next).
  mutable std::atomic<std::int64_t> passes{0};
};

namespace {

using NodePtr = std::shared_ptr<const DatasetNode>;

std::shared_ptr<spdlog::logger>& data_log() {
  static std::shared_ptr<spdlog::logger> l = logger("data");
  return l;
}

}  // namespace

void warn_producer_left(const char* what) {
  data_log()->warn(
      "{} is still busy 2 s after its consumer went away; its thread is left to finish on its own (a map() or "
      "generator callback that blocks should return promptly)",
      what);
}

namespace {

// ----------------------------------------------- generator exceptions ---

// A user generator runs inside the generator plugin's next(), which is
// called synchronously from SourceStream::next on the same thread. The
// trampoline parks the exception here and SourceStream rethrows it, so
// the caller sees the user's own exception type instead of a status.
thread_local std::exception_ptr t_pending_exception;

std::exception_ptr take_pending() { return std::exchange(t_pending_exception, nullptr); }

void fill_error(strata_error* err, strata_status_t code, const std::string& msg) noexcept {
  if (err == nullptr) return;
  err->code = code;
  std::snprintf(err->message, sizeof err->message, "%s", msg.c_str());
}

/// Inside a catch block: park the exception and describe it in `err`.
strata_status_t park_exception(strata_error* err, const char* what) noexcept {
  t_pending_exception = std::current_exception();
  try {
    throw;
  } catch (const Error& e) {
    const strata_status_t code = e.code() < 0 ? e.code() : STRATA_ERR_INTERNAL;
    fill_error(err, code, str_cat(what, " threw: ", e.what()));
    return code;
  } catch (const std::exception& e) {
    fill_error(err, STRATA_ERR_INTERNAL, str_cat(what, " threw: ", e.what()));
  } catch (...) {
    fill_error(err, STRATA_ERR_INTERNAL, str_cat(what, " threw a non-std::exception"));
  }
  return STRATA_ERR_INTERNAL;
}

struct GeneratorSource {
  std::function<Dataset::Generator(const InputContext&)> make;
  strata_input_generator c{};
};

struct GeneratorPass {
  Dataset::Generator fn;
  std::vector<std::string> names;  // storage for the names handed out
};

strata_status_t gen_start(void* user, const strata_input_context* ctx, void** pass, strata_error* err) {
  try {
    auto* src = static_cast<GeneratorSource*>(user);
    InputContext ic;
    if (ctx != nullptr) {
      ic.num_input_pipelines = ctx->num_input_pipelines;
      ic.input_pipeline_id = ctx->input_pipeline_id;
      ic.num_replicas_in_sync = ctx->num_replicas_in_sync;
    }
    auto p = std::make_unique<GeneratorPass>();
    p->fn = src->make(ic);
    STRATA_ENFORCE(static_cast<bool>(p->fn), STRATA_ERR_INVALID_ARGUMENT,
                   "from_generator: the make function returned an empty Generator; return a callable");
    *pass = p.release();
    return STRATA_OK;
  } catch (...) {
    return park_exception(err, "from_generator: the make function");
  }
}

strata_status_t gen_next(void* pass, strata_element* out, strata_error* err) {
  try {
    auto* p = static_cast<GeneratorPass*>(pass);
    std::optional<Element> e = p->fn();
    if (!e) return STRATA_ERR_OUT_OF_RANGE;
    STRATA_ENFORCE(e->names.size() == e->tensors.size(), STRATA_ERR_INVALID_ARGUMENT,
                   "from_generator: the generator returned an element with ", e->names.size(), " names but ",
                   e->tensors.size(), " tensors; build elements with Element::add");
    STRATA_ENFORCE(!e->tensors.empty() && e->tensors.size() <= STRATA_ELEMENT_MAX_COMPONENTS,
                   STRATA_ERR_INVALID_ARGUMENT, "from_generator: the generator returned an element with ",
                   e->tensors.size(), " components; return 1 to ", STRATA_ELEMENT_MAX_COMPONENTS);
    for (std::size_t i = 0; i < e->tensors.size(); ++i)
      STRATA_ENFORCE(e->tensors[i].defined(), STRATA_ERR_INVALID_ARGUMENT, "from_generator: component '", e->names[i],
                     "' of a generated element is an empty Tensor");
    p->names = e->names;
    out->num_components = static_cast<std::uint32_t>(e->tensors.size());
    for (std::size_t i = 0; i < e->tensors.size(); ++i) {
      out->names[i] = p->names[i].c_str();
      out->tensors[i] = e->tensors[i].to_dlpack();
    }
    return STRATA_OK;
  } catch (...) {
    return park_exception(err, "from_generator: the generator");
  }
}

void gen_finish(void* pass) { delete static_cast<GeneratorPass*>(pass); }

std::string hex_address(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

// ------------------------------------------------------------- streams ---

PluginInstance open_source_plugin(const SourceSpec& s, const InputContext& ic) {
  strata_input_context ctx{};
  STRATA_INIT_HEADER(&ctx, strata_input_context);
  ctx.num_input_pipelines = ic.num_input_pipelines;
  ctx.input_pipeline_id = ic.input_pipeline_id;
  ctx.num_replicas_in_sync = ic.num_replicas_in_sync;
  t_pending_exception = nullptr;
  try {
    return PluginHost::global().create_input_pipeline(s.plugin, s.options_json, ctx);
  } catch (...) {
    if (std::exception_ptr p = take_pending()) std::rethrow_exception(p);
    throw;
  }
}

struct OpenCtx {
  InputContext ictx;
  StreamRequest req;
  DatasetOptions options;                       ///< of the whole recipe (tf: options are global)
};

std::unique_ptr<ElementStream> open_node(const NodePtr& node, const OpenCtx& c, std::int64_t pass);

void free_element(strata_element& e, std::uint32_t from) noexcept {
  for (std::uint32_t i = from; i < e.num_components && i < STRATA_ELEMENT_MAX_COMPONENTS; ++i)
    if (e.tensors[i] != nullptr && e.tensors[i]->deleter != nullptr) e.tensors[i]->deleter(e.tensors[i]);
}

/// A source plugin opened for one pipeline.
class SourceStream : public ElementStream {
 public:
  SourceStream(NodePtr node, const OpenCtx& c) : node_(std::move(node)) {
    const SourceSpec& s = node_->source;
    STRATA_ENFORCE(c.options.source_timeout_s > 0, STRATA_ERR_INVALID_ARGUMENT, "DatasetOptions::source_timeout_s is ",
                   c.options.source_timeout_s, "; pass a positive number of seconds");
    inst_ = open_source_plugin(s, c.ictx);
    vt_ = inst_.vtable_as<strata_input_vtable>();
    // Clamp absurd timeouts (a year) so the conversion cannot overflow.
    timeout_ms_ = static_cast<std::int64_t>(wait_limit(c.options.source_timeout_s).count() * 1000.0);
    if (c.req.source_policy != STRATA_SHARD_OFF) {
      strata_error err;
      strata_error_init(&err);
      const strata_status_t st = vt_->shard(static_cast<strata_input_t>(inst_.handle()), c.req.source_policy,
                                            c.req.num_shards, c.req.index, &err);
      check_status(st, err,
                   str_cat("input pipeline '", s.plugin, "' (", s.label, "): shard(",
                           c.req.source_policy == STRATA_SHARD_FILE ? "FILE" : "DATA", ", ", c.req.num_shards, ", ",
                           c.req.index, ")")
                       .c_str());
    }
    SPDLOG_LOGGER_DEBUG(data_log(), "opened input pipeline '{}' ({}) for pipeline {}/{}", s.plugin, s.label,
                        c.ictx.input_pipeline_id, c.ictx.num_input_pipelines);
  }

  std::optional<Element> next() override {
    if (ended_) return std::nullopt;
    strata_element el{};
    STRATA_INIT_HEADER(&el, strata_element);
    strata_error err;
    strata_error_init(&err);
    t_pending_exception = nullptr;
    const strata_status_t st = vt_->next(static_cast<strata_input_t>(inst_.handle()), timeout_ms_, &el, &err);
    if (st != STRATA_OK) {
      ended_ = true;
      if (std::exception_ptr p = take_pending()) std::rethrow_exception(p);
      if (st == STRATA_ERR_OUT_OF_RANGE) return std::nullopt;
      const SourceSpec& s = node_->source;
      const std::string msg = err.message[0] ? err.message : strata_status_string(st);
      if (st == STRATA_ERR_DEADLINE_EXCEEDED)
        throw_status(
            st, str_cat("input pipeline '", s.plugin, "' (", s.label, "): no element within ", timeout_ms_ / 1000.0,
                        " s: ", msg, "; check the source, or raise DatasetOptions::source_timeout_s"));
      throw_status(st, str_cat("input pipeline '", s.plugin, "' (", s.label, "): ", msg));
    }
    ++yielded_;
    return convert(el);
  }

  // The plugin's own position when it can save and restore one; otherwise
  // the count of elements yielded, restored by reading that many again
  // (exact only for a deterministic source, e.g. a generator that yields
  // the same sequence on every call of its make function).
  void save(StateWriter& w) override {
    w.boolean(ended_);
    w.i64(yielded_);
    const bool own = plugin_can_save();
    w.boolean(own);
    if (!own || ended_) return;
    std::string bytes;
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st = vt_->save_state(
        static_cast<strata_input_t>(inst_.handle()),
        [](void* user, const char* data, std::uint64_t len) { static_cast<std::string*>(user)->append(data, len); },
        &bytes, &err);
    check_status(st, err, where("save_state").c_str());
    w.str(bytes);
  }

  void restore(StateReader& r) override {
    const bool ended = r.boolean();
    const std::int64_t yielded = r.i64();
    const bool own = r.boolean();
    if (ended) {
      ended_ = true;
      yielded_ = yielded;
      return;
    }
    if (own) {
      STRATA_ENFORCE(plugin_can_save(), STRATA_ERR_INVALID_ARGUMENT, where("restore_state"),
                     ": the state holds the plugin's own position but this build of the plugin cannot restore "
                     "one; restore with the plugin version that saved it");
      const std::string bytes = r.str();
      strata_error err;
      strata_error_init(&err);
      const strata_status_t st =
          vt_->restore_state(static_cast<strata_input_t>(inst_.handle()), bytes.data(), bytes.size(), &err);
      check_status(st, err, where("restore_state").c_str());
      yielded_ = yielded;
      return;
    }
    for (std::int64_t i = 0; i < yielded; ++i)
      if (!next())
        STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, where("restore_state"), ": the state was saved after ", yielded,
                     " elements but this pass ends after ", i,
                     "; the source is not deterministic (a generator must yield the same sequence on every call "
                     "of its make function to be restored)");
  }

 private:
  bool plugin_can_save() const {
    return STRATA_HAS_FIELD(vt_, strata_input_vtable, restore_state) && vt_->save_state != nullptr &&
           vt_->restore_state != nullptr;
  }
  std::string where(const char* op) const {
    return str_cat("input pipeline '", node_->source.plugin, "' (", node_->source.label, "): ", op);
  }

  Element convert(strata_element& el) {
    const SourceSpec& s = node_->source;
    if (el.num_components > STRATA_ELEMENT_MAX_COMPONENTS)
      STRATA_THROW(STRATA_ERR_INTERNAL, "input pipeline '", s.plugin, "' returned ", el.num_components,
                   " components (at most ", STRATA_ELEMENT_MAX_COMPONENTS, "); this is a plugin bug");
    Element e;
    for (std::uint32_t i = 0; i < el.num_components; ++i) {
      Tensor t;
      try {
        if (el.names[i] == nullptr)
          STRATA_THROW(STRATA_ERR_INTERNAL, "component ", i, " has a NULL name; this is a plugin bug");
        t = Tensor::adopt(el.tensors[i]);
      } catch (const Error& ex) {
        free_element(el, i);
        throw_status(ex.code(), str_cat("input pipeline '", s.plugin, "' (", s.label, "): ", ex.what()));
      }
      try {
        e.add(el.names[i], std::move(t));
      } catch (const Error& ex) {
        free_element(el, i + 1);
        throw_status(STRATA_ERR_INTERNAL, str_cat("input pipeline '", s.plugin, "' (", s.label, "): ", ex.what()));
      }
    }
    return e;
  }

  NodePtr node_;  // keeps the source's C structs alive
  PluginInstance inst_;
  const strata_input_vtable* vt_ = nullptr;
  std::int64_t timeout_ms_ = 0;
  std::int64_t yielded_ = 0;
  bool ended_ = false;
};

class ShuffleStream : public ElementStream {
 public:
  ShuffleStream(NodePtr node, std::unique_ptr<ElementStream> up, std::int64_t pass)
      : node_(std::move(node)), up_(std::move(up)) {
    const std::uint64_t seed = node_->flag ? node_->seed + static_cast<std::uint64_t>(pass) : node_->seed;
    rng_.seed(seed);
  }
  std::optional<Element> next() override {
    const std::size_t cap = static_cast<std::size_t>(node_->count);
    while (!up_ended_ && buf_.size() < cap) {
      std::optional<Element> e = up_->next();
      if (!e) {
        up_ended_ = true;
        up_.reset();  // release the source early
        break;
      }
      buf_.push_back(std::move(*e));
    }
    if (buf_.empty()) return std::nullopt;
    const std::size_t i = static_cast<std::size_t>(rng_() % buf_.size());
    std::swap(buf_[i], buf_.back());
    Element out = std::move(buf_.back());
    buf_.pop_back();
    return out;
  }

  // The buffer in order (the RNG picks by index), the RNG itself and the
  // input; the pass number is implied by the pass the stream is opened for.
  void save(StateWriter& w) override {
    std::ostringstream rng;
    rng.imbue(std::locale::classic());  // a user's global locale must not group digits
    rng << rng_;
    w.str(rng.str());
    w.boolean(up_ended_);
    w.u64(buf_.size());
    for (const Element& e : buf_) w.element(e);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    std::istringstream rng(r.str());
    rng.imbue(std::locale::classic());
    rng >> rng_;
    if (rng.fail()) STRATA_THROW(STRATA_ERR_DATA_LOSS, "shuffle(): the saved random generator state is unreadable");
    up_ended_ = r.boolean();
    buf_.clear();
    const std::uint64_t n = r.count(8);
    for (std::uint64_t i = 0; i < n; ++i) buf_.push_back(r.element());
    restore_input(r, up_);
  }

 private:
  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
  std::vector<Element> buf_;
  std::mt19937_64 rng_;
  bool up_ended_ = false;
};

class BatchStream : public ElementStream {
 public:
  BatchStream(NodePtr node, std::unique_ptr<ElementStream> up, std::int64_t size)
      : node_(std::move(node)), up_(std::move(up)), size_(size) {
    STRATA_ENFORCE(size_ > 0, STRATA_ERR_INVALID_ARGUMENT, "batch size ", size_, " is invalid; pass a size >= 1");
  }
  std::optional<Element> next() override {
    if (ended_) return std::nullopt;
    std::vector<Element> items;
    items.reserve(static_cast<std::size_t>(size_));
    while (static_cast<std::int64_t>(items.size()) < size_) {
      std::optional<Element> e = up_->next();
      if (!e) {
        ended_ = true;
        break;
      }
      items.push_back(std::move(*e));
    }
    const std::int64_t batch = batches_++;
    if (items.empty() || (ended_ && node_->flag && static_cast<std::int64_t>(items.size()) < size_))
      return std::nullopt;
    return stack(items, batch);
  }

  void save(StateWriter& w) override {
    w.boolean(ended_);
    w.i64(batches_);
    save_input(w, ended_ ? nullptr : up_.get());
  }
  void restore(StateReader& r) override {
    ended_ = r.boolean();
    batches_ = r.i64();
    restore_input(r, up_);
  }

 private:
  static Element stack(std::vector<Element>& items, std::int64_t batch) {
    const Element& first = items[0];
    Element out;
    for (std::size_t k = 0; k < first.tensors.size(); ++k) {
      const std::string& name = first.names[k];
      const Tensor& t0 = first.tensors[k];
      const DType dtype = t0.dtype();
      const std::vector<std::int64_t> shape = t0.shape();
      for (std::size_t j = 1; j < items.size(); ++j) {
        const Element& ej = items[j];
        if (ej.names.size() != first.names.size() || ej.names[k] != name)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "batch(): element ", j, " of batch ", batch,
                       " has different components than element 0 (component ", k, " is '",
                       k < ej.names.size() ? ej.names[k] : std::string("(missing)"), "', expected '", name,
                       "'); every element must have the same components");
        const Tensor& tj = ej.tensors[k];
        if (tj.dtype() != dtype || tj.shape() != shape)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "batch(): component '", name, "' has ", dtype_name(dtype),
                       detail::shape_string(shape), " in element 0 of batch ", batch, " but ", dtype_name(tj.dtype()),
                       detail::shape_string(tj.shape()), " in element ", j,
                       "; batch needs equal shapes and dtypes (reshape or pad the elements, e.g. with map())");
      }
      std::vector<std::int64_t> bshape;
      bshape.push_back(static_cast<std::int64_t>(items.size()));
      bshape.insert(bshape.end(), shape.begin(), shape.end());
      Tensor b = Tensor::zeros(bshape, dtype);
      const std::size_t row = t0.nbytes();
      auto* dst = static_cast<char*>(b.raw_data());
      for (std::size_t j = 0; j < items.size(); ++j) {
        const TensorView v(items[j].tensors[k]);
        STRATA_ENFORCE(v.is_contiguous(), STRATA_ERR_INVALID_ARGUMENT, "batch(): component '", name, "' of element ", j,
                       " is not contiguous; make it compact (e.g. Tensor::copy_of) in map()");
        if (row != 0) std::memcpy(dst + j * row, v.raw_data(), row);
      }
      out.names.push_back(name);
      out.tensors.push_back(std::move(b));
    }
    return out;
  }

  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
  std::int64_t size_;
  std::int64_t batches_ = 0;
  bool ended_ = false;
};

class RepeatStream : public ElementStream {
 public:
  RepeatStream(NodePtr node, const OpenCtx& c, std::int64_t pass) : node_(std::move(node)), ctx_(c), pass_(pass) {
    if (node_->count != 0) open_round();
  }
  std::optional<Element> next() override {
    while (up_) {
      std::optional<Element> e = up_->next();
      if (e) {
        got_any_ = true;
        return e;
      }
      up_.reset();
      ++round_;
      // An empty round means every round is empty: end instead of spinning.
      if (!got_any_) return std::nullopt;
      if (node_->count < 0 || round_ < node_->count) open_round();
    }
    return std::nullopt;
  }

  // The round and the round's own state; restoring reopens that round.
  void save(StateWriter& w) override {
    w.i64(round_);
    w.boolean(got_any_);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    const std::int64_t round = r.i64();
    const bool got_any = r.boolean();
    if (round != round_) {
      up_.reset();
      round_ = round;
      open_round();
    }
    got_any_ = got_any;
    restore_input(r, up_);
  }

 private:
  void open_round() {
    // Inner pass numbers continue across top-level passes, so a shuffle
    // inside repeat() reshuffles on every round of every iteration (as a
    // tf shuffle's seed generator does).
    const std::int64_t per_pass = node_->count > 0 ? node_->count : (std::int64_t{1} << 32);
    up_ = open_node(node_->input, ctx_, pass_ * per_pass + round_);
    got_any_ = false;
  }
  NodePtr node_;
  OpenCtx ctx_;
  std::int64_t pass_;
  std::int64_t round_ = 0;
  bool got_any_ = false;
  std::unique_ptr<ElementStream> up_;
};

class TakeStream : public ElementStream {
 public:
  TakeStream(NodePtr node, std::unique_ptr<ElementStream> up) : node_(std::move(node)), up_(std::move(up)) {}
  std::optional<Element> next() override {
    if (node_->count >= 0 && taken_ >= node_->count) return std::nullopt;
    std::optional<Element> e = up_->next();
    if (e) ++taken_;
    return e;
  }
  void save(StateWriter& w) override {
    w.i64(taken_);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    taken_ = r.i64();
    restore_input(r, up_);
  }

 private:
  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
  std::int64_t taken_ = 0;
};

class SkipStream : public ElementStream {
 public:
  SkipStream(NodePtr node, std::unique_ptr<ElementStream> up) : node_(std::move(node)), up_(std::move(up)) {}
  std::optional<Element> next() override {
    if (!skipped_) {
      skipped_ = true;
      for (std::int64_t i = 0; node_->count < 0 || i < node_->count; ++i)
        if (!up_->next()) return std::nullopt;
    }
    return up_->next();
  }
  void save(StateWriter& w) override {
    w.boolean(skipped_);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    skipped_ = r.boolean();
    restore_input(r, up_);
  }

 private:
  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
  bool skipped_ = false;
};

class MapStream : public ElementStream {
 public:
  MapStream(NodePtr node, std::unique_ptr<ElementStream> up) : node_(std::move(node)), up_(std::move(up)) {}
  std::optional<Element> next() override {
    std::optional<Element> e = up_->next();
    if (!e) return std::nullopt;
    return node_->fn(std::move(*e));
  }
  void save(StateWriter& w) override { save_input(w, up_.get()); }
  void restore(StateReader& r) override { restore_input(r, up_); }

 private:
  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
};

class ShardStream : public ElementStream {
 public:
  ShardStream(std::unique_ptr<ElementStream> up, std::int64_t n, std::int64_t i) : up_(std::move(up)), n_(n), i_(i) {}
  std::optional<Element> next() override {
    for (;;) {
      std::optional<Element> e = up_->next();
      if (!e) return std::nullopt;
      if (pos_++ % n_ == i_) return e;
    }
  }
  void save(StateWriter& w) override {
    w.i64(pos_);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    pos_ = r.i64();
    restore_input(r, up_);
  }

 private:
  std::unique_ptr<ElementStream> up_;
  std::int64_t n_, i_, pos_ = 0;
};

/// prefetch(n): a producer thread keeps up to n elements ready. It owns the
/// upstream (shared state), so that if it is stuck in a source call when
/// the consumer goes away it can be left to finish on its own instead of
/// blocking the consumer's destructor. The thread starts on the first
/// next() (as tf's prefetch does), so a fresh iterator can be restored
/// before anything was read ahead.
class PrefetchStream : public ElementStream {
 public:
  PrefetchStream(std::unique_ptr<ElementStream> up, std::int64_t depth, double timeout_s)
      : st_(std::make_shared<State>()), timeout_s_(timeout_s) {
    st_->up = std::move(up);
    st_->cap = static_cast<std::size_t>(depth);
  }

  ~PrefetchStream() override {
    if (th_.joinable()) stop_producer(*st_, th_, "the stage before prefetch()");
  }

  std::optional<Element> next() override {
    start();
    std::unique_lock<std::mutex> l(st_->mu);
    // Each source call has the source timeout, but a map() or generator
    // callback upstream does not: bound the wait here too.
    const bool ready =
        st_->cv.wait_for(l, wait_limit(timeout_s_), [&] { return !st_->q.empty() || st_->error || st_->end; });
    if (!ready)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "prefetch(): no element from the stages before it within ",
                   timeout_s_, " s; a map() or generator callback there may block. Fix it, or raise "
                   "DatasetOptions::prefetch_timeout_s if that input is only slow");
    if (!st_->q.empty()) {
      Element e = std::move(st_->q.front());
      st_->q.pop_front();
      st_->cv.notify_all();
      return e;
    }
    if (st_->error) {
      std::exception_ptr e = std::exchange(st_->error, nullptr);
      st_->end = true;
      std::rethrow_exception(e);
    }
    return std::nullopt;
  }

  // tf's prefetch checkpoint: pause the producer between two elements,
  // then save the elements already buffered and the input's state.
  void save(StateWriter& w) override {
    std::unique_lock<std::mutex> l(st_->mu);
    st_->paused = true;
    struct Resume {
      State& st;
      ~Resume() {
        st.paused = false;
        st.cv.notify_all();
      }
    } resume{*st_};
    const bool idle = st_->cv.wait_for(l, wait_limit(timeout_s_), [&] { return !st_->busy || st_->done; });
    if (!idle)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "save_state: the stage before prefetch() did not finish its element "
                   "within ", timeout_s_, " s, so its position cannot be taken; a map() or generator callback there "
                   "may block (DatasetOptions::prefetch_timeout_s)");
    if (st_->error) {
      try {
        std::rethrow_exception(st_->error);
      } catch (const std::exception& e) {
        STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "save_state: the input read ahead by prefetch() failed (",
                     e.what(), ") after the elements consumed so far, so no position past them can be saved; "
                     "handle the input's error first");
      }
    }
    w.boolean(st_->end);
    w.u64(st_->q.size());
    for (const Element& e : st_->q) w.element(e);
    save_input(w, st_->end ? nullptr : st_->up.get());
  }

  void restore(StateReader& r) override {
    STRATA_ENFORCE(!th_.joinable(), STRATA_ERR_INTERNAL, "prefetch(): restore after its thread started");
    st_->end = r.boolean();
    st_->q.clear();
    const std::uint64_t n = r.count(8);
    for (std::uint64_t i = 0; i < n; ++i) st_->q.push_back(r.element());
    restore_input(r, st_->up);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Element> q;
    std::exception_ptr error;
    bool end = false, stop = false, done = false;
    bool paused = false;  // save_state wants the producer to hold still
    bool busy = false;    // the producer is between waits (in up->next())
    std::size_t cap = 1;
    std::unique_ptr<ElementStream> up;
  };

  void start() {
    if (started_) return;
    started_ = true;
    if (st_->end) {  // restored at the end: nothing left to read
      std::lock_guard<std::mutex> l(st_->mu);
      st_->done = true;
      st_->busy = false;
      st_->up.reset();
      return;
    }
    th_ = std::thread(&PrefetchStream::produce, st_);
  }

  static void produce(std::shared_ptr<State> s) {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(s->mu);
        s->busy = false;
        s->cv.notify_all();
        s->cv.wait(l, [&] { return s->stop || (!s->paused && s->q.size() < s->cap); });
        if (s->stop) break;
        s->busy = true;
      }
      std::optional<Element> e;
      std::exception_ptr err;
      try {
        e = s->up->next();
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> l(s->mu);
      if (err)
        s->error = err;
      else if (!e)
        s->end = true;
      else
        s->q.push_back(std::move(*e));
      s->cv.notify_all();
      if (err || !e) break;
    }
    // Close the source on this thread, outside the lock.
    std::unique_ptr<ElementStream> up = std::move(s->up);
    up.reset();
    std::lock_guard<std::mutex> l(s->mu);
    s->done = true;
    s->cv.notify_all();
  }

  std::shared_ptr<State> st_;
  std::thread th_;
  bool started_ = false;
  double timeout_s_;
};

// ------------------------------------------------ composite datasets ---

const char* const kFileNameComponent = "filename";

Element file_name_element(const std::string& name) {
  Element e;
  e.add(kFileNameComponent, Tensor::from_bytes(name.data(), name.size(), {static_cast<std::int64_t>(name.size())},
                                               DType::kUInt8));
  return e;
}

/// list_files(): the file names, this worker's share of them when the
/// pipeline is auto-sharded by FILE (the shard sits before list_files'
/// shuffle, as tf's rewrite moves the shuffle after the shard it adds).
class ListFilesStream : public ElementStream {
 public:
  ListFilesStream(NodePtr node, const OpenCtx& c) : node_(std::move(node)) {
    const auto& files = node_->files;
    for (std::size_t i = 0; i < files.size(); ++i)
      if (c.req.source_policy != STRATA_SHARD_FILE ||
          static_cast<std::int64_t>(i % static_cast<std::size_t>(c.req.num_shards)) == c.req.index)
        mine_.push_back(i);
  }
  std::optional<Element> next() override {
    if (pos_ >= mine_.size()) return std::nullopt;
    return file_name_element(node_->files[mine_[pos_++]]);
  }
  void save(StateWriter& w) override { w.u64(pos_); }
  void restore(StateReader& r) override {
    pos_ = static_cast<std::size_t>(r.u64());
    if (pos_ > mine_.size())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "list_files(): the saved position ", pos_, " is past this shard's ",
                   mine_.size(), " files; restore with the same files and sharding");
  }

 private:
  NodePtr node_;
  std::vector<std::size_t> mine_;
  std::size_t pos_ = 0;
};

/// Opens a dataset returned by an interleave()/flat_map() function: with
/// its own options, the outer pass number and SHARD_HINT mapping, and never
/// source sharding (auto-sharding shards the interleave's input instead).
std::unique_ptr<ElementStream> open_inner(const Dataset& d, const OpenCtx& outer, std::int64_t pass) {
  OpenCtx c;
  c.ictx = outer.ictx;
  c.req.hint = outer.req.hint;
  c.req.pass = pass;
  c.options = d.options();
  return open_node(d.node(), c, pass);
}

/// interleave(fn, cycle_length, block_length), in the exact order of tf's
/// InterleaveDataset: a slot whose dataset ends is left empty and the turn
/// moves on; an empty slot is filled from the next input element when the
/// turn reaches it.
class InterleaveStream : public ElementStream {
 public:
  InterleaveStream(NodePtr node, std::unique_ptr<ElementStream> up, const OpenCtx& c, std::int64_t pass)
      : node_(std::move(node)), up_(std::move(up)), ctx_(c), pass_(pass),
        slots_(static_cast<std::size_t>(node_->count)), inputs_(slots_.size()) {}
  std::optional<Element> next() override {
    const std::size_t cycle = slots_.size();
    while (!input_ended_ || open_ > 0) {
      std::unique_ptr<ElementStream>& slot = slots_[cur_];
      if (slot) {
        std::optional<Element> e = slot->next();
        if (e) {
          if (++in_block_ == node_->block) advance(cycle);
          return e;
        }
        slot.reset();
        --open_;
        advance(cycle);
      } else if (!input_ended_) {
        std::optional<Element> in = up_->next();
        if (!in) {
          input_ended_ = true;
          up_.reset();
          continue;
        }
        inputs_[cur_] = in->clone();  // what a restore opens this slot's dataset from
        slot = open_inner(make_inner(std::move(*in)), ctx_, pass_);
        ++open_;
      } else {
        advance(cycle);
      }
    }
    return std::nullopt;
  }

  // The cycle position, the input's state, and per open slot the input
  // element it was opened from (the function runs again on restore) with
  // that dataset's recipe and position.
  void save(StateWriter& w) override {
    w.u64(cur_);
    w.i64(in_block_);
    w.i64(open_);
    w.boolean(input_ended_);
    save_input(w, up_.get());
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      w.boolean(slots_[i] != nullptr);
      if (!slots_[i]) continue;
      w.element(inputs_[i]);
      w.strings(inner_signature(inputs_[i]));
      slots_[i]->save(w);
    }
  }
  void restore(StateReader& r) override {
    cur_ = static_cast<std::size_t>(r.u64());
    if (cur_ >= slots_.size()) STRATA_THROW(STRATA_ERR_DATA_LOSS, "interleave(): saved cycle position out of range");
    in_block_ = r.i64();
    open_ = r.i64();
    input_ended_ = r.boolean();
    restore_input(r, up_);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].reset();
      if (!r.boolean()) continue;
      inputs_[i] = r.element();
      const std::vector<std::string> saved = r.strings();
      Dataset d = make_inner(inputs_[i].clone());
      check_same_recipe(saved, recipe_signature(d), "interleave()/flat_map() child dataset's");
      slots_[i] = open_inner(d, ctx_, pass_);
      slots_[i]->restore(r);
    }
  }

 private:
  Dataset make_inner(Element in) {
    Dataset d = node_->dataset_fn(std::move(in));
    STRATA_ENFORCE(d.node() != nullptr, STRATA_ERR_INVALID_ARGUMENT,
                   "interleave()/flat_map(): the function returned an empty Dataset; return one built with "
                   "Dataset::from_* (e.g. from_records({Dataset::file_name(e)}))");
    return d;
  }
  std::vector<std::string> inner_signature(const Element& in) { return recipe_signature(make_inner(in.clone())); }
  void advance(std::size_t cycle) {
    in_block_ = 0;
    cur_ = (cur_ + 1) % cycle;
  }
  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
  OpenCtx ctx_;
  std::int64_t pass_;
  std::vector<std::unique_ptr<ElementStream>> slots_;
  std::vector<Element> inputs_;
  std::size_t cur_ = 0;
  std::int64_t in_block_ = 0;
  std::int64_t open_ = 0;
  bool input_ended_ = false;
};

/// zip(): one element from every input; ends at the first input that ends.
class ZipStream : public ElementStream {
 public:
  explicit ZipStream(std::vector<std::unique_ptr<ElementStream>> ups) : ups_(std::move(ups)) {}
  std::optional<Element> next() override {
    if (ended_) return std::nullopt;
    Element out;
    std::vector<std::size_t> from;  // which input each component came from
    for (std::size_t k = 0; k < ups_.size(); ++k) {
      std::optional<Element> e = ups_[k]->next();
      if (!e) {
        ended_ = true;
        ups_.clear();
        return std::nullopt;
      }
      for (std::size_t i = 0; i < e->tensors.size(); ++i) {
        const auto dup = std::find(out.names.begin(), out.names.end(), e->names[i]);
        if (dup != out.names.end())
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "zip(): component '", e->names[i], "' is in dataset ",
                       from[static_cast<std::size_t>(dup - out.names.begin())], " and dataset ", k,
                       "; zipped elements are flat, so rename one of them with map() before zip()");
        STRATA_ENFORCE(out.tensors.size() < STRATA_ELEMENT_MAX_COMPONENTS, STRATA_ERR_INVALID_ARGUMENT,
                       "zip(): the zipped element would have more than ", STRATA_ELEMENT_MAX_COMPONENTS,
                       " components; drop some with map() before zip()");
        out.names.push_back(std::move(e->names[i]));
        out.tensors.push_back(std::move(e->tensors[i]));
        from.push_back(k);
      }
    }
    return out;
  }
  void save(StateWriter& w) override {
    w.boolean(ended_);
    if (!ended_)
      for (auto& up : ups_) up->save(w);
  }
  void restore(StateReader& r) override {
    ended_ = r.boolean();
    if (ended_) {
      ups_.clear();
      return;
    }
    for (auto& up : ups_) up->restore(r);
  }

 private:
  std::vector<std::unique_ptr<ElementStream>> ups_;
  bool ended_ = false;
};

std::string layout_str(const Element& e) {
  std::string s = "{";
  for (std::size_t i = 0; i < e.tensors.size(); ++i)
    s += (i ? ", " : "") + e.names[i] + ": " + dtype_name(e.tensors[i].dtype());
  return s + "}";
}

/// concatenate(): the first input, then the second (opened only then).
class ConcatenateStream : public ElementStream {
 public:
  ConcatenateStream(NodePtr node, std::unique_ptr<ElementStream> first, const OpenCtx& c, std::int64_t pass)
      : node_(std::move(node)), up_(std::move(first)), ctx_(c), pass_(pass) {}
  std::optional<Element> next() override {
    while (up_) {
      std::optional<Element> e = up_->next();
      if (e) {
        if (!second_ && !first_layout_) {
          first_layout_ = layout_of(*e);
          first_desc_ = layout_str(*e);
        } else if (second_ && !checked_) {
          checked_ = true;
          if (first_layout_ && *first_layout_ != layout_of(*e))
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "concatenate(): the datasets' elements differ: the first has ",
                         first_desc_, ", the second ", layout_str(*e),
                         "; both need the same component names and dtypes (convert one with map())");
        }
        return e;
      }
      if (second_) break;
      second_ = true;
      up_ = open_node(node_->inputs.at(0), ctx_, pass_);
    }
    up_.reset();
    return std::nullopt;
  }

  void save(StateWriter& w) override {
    w.boolean(second_);
    w.boolean(checked_);
    w.boolean(first_layout_.has_value());
    if (first_layout_) {
      w.u64(first_layout_->size());
      for (const auto& [name, dtype] : *first_layout_) {
        w.str(name);
        w.u8(static_cast<std::uint8_t>(dtype));
      }
      w.str(first_desc_);
    }
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    const bool second = r.boolean();
    checked_ = r.boolean();
    first_layout_.reset();
    if (r.boolean()) {
      first_layout_.emplace();
      const std::uint64_t n = r.count(9);
      for (std::uint64_t i = 0; i < n; ++i) {
        std::string name = r.str();
        first_layout_->emplace_back(std::move(name), static_cast<DType>(r.u8()));
      }
      first_desc_ = r.str();
    }
    if (second && !second_) {
      second_ = true;
      up_ = open_node(node_->inputs.at(0), ctx_, pass_);
    }
    restore_input(r, up_);
  }

 private:
  using Layout = std::vector<std::pair<std::string, DType>>;
  static Layout layout_of(const Element& e) {
    Layout l;
    for (std::size_t i = 0; i < e.tensors.size(); ++i) l.emplace_back(e.names[i], e.tensors[i].dtype());
    return l;
  }
  NodePtr node_;
  std::unique_ptr<ElementStream> up_;
  OpenCtx ctx_;
  std::int64_t pass_;
  bool second_ = false, checked_ = false;
  std::optional<Layout> first_layout_;
  std::string first_desc_;
};

/// unique(): keys are the dtype, shape and bytes of the one component.
class UniqueStream : public ElementStream {
 public:
  explicit UniqueStream(std::unique_ptr<ElementStream> up) : up_(std::move(up)) {}
  std::optional<Element> next() override {
    for (;;) {
      std::optional<Element> e = up_->next();
      if (!e) return std::nullopt;
      STRATA_ENFORCE(e->tensors.size() == 1, STRATA_ERR_INVALID_ARGUMENT, "unique(): the elements have ",
                     e->tensors.size(), " components ", layout_str(*e),
                     "; unique() needs exactly one (select it with map() first)");
      const Tensor& t = e->tensors[0];
      const DType d = t.dtype();
      STRATA_ENFORCE(d == DType::kInt32 || d == DType::kInt64 || d == DType::kUInt8, STRATA_ERR_INVALID_ARGUMENT,
                     "unique(): component '", e->names[0], "' is ", dtype_name(d),
                     "; unique() supports int32, int64 and uint8 (file names) only (cast it with map())");
      const TensorView v(t);
      STRATA_ENFORCE(v.is_contiguous(), STRATA_ERR_INVALID_ARGUMENT, "unique(): component '", e->names[0],
                     "' is not contiguous; make it compact (e.g. Tensor::copy_of) in map()");
      std::string key(1, static_cast<char>(d));
      for (std::int64_t dim : t.shape()) key.append(reinterpret_cast<const char*>(&dim), sizeof dim);
      key.append(static_cast<const char*>(v.raw_data()), t.nbytes());
      if (seen_.insert(std::move(key)).second) return e;
    }
  }
  void save(StateWriter& w) override {
    w.u64(seen_.size());
    for (const std::string& k : seen_) w.str(k);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    seen_.clear();
    const std::uint64_t n = r.count(8);
    for (std::uint64_t i = 0; i < n; ++i) seen_.insert(r.str());
    restore_input(r, up_);
  }

 private:
  std::unique_ptr<ElementStream> up_;
  std::unordered_set<std::string> seen_;
};

std::string elements_str(std::int64_t n) {
  if (n == INFINITE_CARDINALITY) return "an infinite number of elements";
  return std::to_string(n) + (n == 1 ? " element" : " elements");
}

/// assert_cardinality(n).
class AssertCardinalityStream : public ElementStream {
 public:
  AssertCardinalityStream(std::unique_ptr<ElementStream> up, std::int64_t n) : up_(std::move(up)), n_(n) {}
  std::optional<Element> next() override {
    std::optional<Element> e = up_->next();
    if (!e) {
      if (n_ != count_)
        STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "assert_cardinality(): the dataset was expected to have ",
                     elements_str(n_), " but had only ", elements_str(count_),
                     "; fix the count passed to assert_cardinality or the input");
      return std::nullopt;
    }
    ++count_;
    if (n_ != INFINITE_CARDINALITY && count_ > n_)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "assert_cardinality(): the dataset was expected to have ",
                   elements_str(n_), " but has at least ", elements_str(count_),
                   "; fix the count passed to assert_cardinality or the input");
    return e;
  }
  void save(StateWriter& w) override {
    w.i64(count_);
    save_input(w, up_.get());
  }
  void restore(StateReader& r) override {
    count_ = r.i64();
    restore_input(r, up_);
  }

 private:
  std::unique_ptr<ElementStream> up_;
  std::int64_t n_;
  std::int64_t count_ = 0;
};

/// The leading dimension shared by every component of a batch.
std::int64_t batch_rows(const Element& e, const char* op) {
  std::int64_t rows = -1;
  for (std::size_t i = 0; i < e.tensors.size(); ++i) {
    const std::vector<std::int64_t> shape = e.tensors[i].shape();
    STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT, op, ": component '", e.names[i],
                   "' is a scalar; it needs a leading batch dimension (batch() the dataset first)");
    STRATA_ENFORCE(rows < 0 || shape[0] == rows, STRATA_ERR_INVALID_ARGUMENT, op, ": component '", e.names[i],
                   "' has ", shape[0], " rows but '", e.names[0], "' has ", rows,
                   "; every component of a batch needs the same leading dimension");
    rows = shape[0];
  }
  return rows < 0 ? 0 : rows;
}

/// rebatch(sizes): the input's rows cut into batches of the cycled sizes.
class RebatchStream : public ElementStream {
 public:
  RebatchStream(NodePtr node, std::unique_ptr<ElementStream> up)
      : node_(std::move(node)), rows_(std::move(up), "rebatch()") {}
  std::optional<Element> next() override {
    if (ended_) return std::nullopt;
    const std::int64_t want = node_->sizes[next_];
    next_ = (next_ + 1) % node_->sizes.size();
    const bool full = rows_.fill(want);
    if (rows_.layout() == nullptr) {  // no input at all: nothing to describe an empty batch with
      ended_ = true;
      return std::nullopt;
    }
    if (!full) {
      ended_ = true;
      if (rows_.buffered() == 0 || node_->flag) return std::nullopt;
    }
    return rows_.take(std::min(want, rows_.buffered()));
  }
  void save(StateWriter& w) override {
    w.u64(next_);
    w.boolean(ended_);
    rows_.save(w);
  }
  void restore(StateReader& r) override {
    next_ = static_cast<std::size_t>(r.u64());
    if (next_ >= node_->sizes.size()) STRATA_THROW(STRATA_ERR_DATA_LOSS, "rebatch(): saved size index out of range");
    ended_ = r.boolean();
    rows_.restore(r);
  }

 private:
  NodePtr node_;
  RowQueue rows_;
  std::size_t next_ = 0;
  bool ended_ = false;
};

std::unique_ptr<ElementStream> open_node(const NodePtr& node, const OpenCtx& c, std::int64_t pass) {
  const DatasetNode& n = *node;
  switch (n.kind) {
    case NodeKind::kSource:
      return std::make_unique<SourceStream>(node, c);
    case NodeKind::kRepeat:
      return std::make_unique<RepeatStream>(node, c, pass);
    case NodeKind::kListFiles:
      return std::make_unique<ListFilesStream>(node, c);
    case NodeKind::kZip: {
      std::vector<std::unique_ptr<ElementStream>> ups;
      ups.push_back(open_node(n.input, c, pass));
      for (const NodePtr& in : n.inputs) ups.push_back(open_node(in, c, pass));
      return std::make_unique<ZipStream>(std::move(ups));
    }
    default:
      break;
  }
  std::unique_ptr<ElementStream> up = open_node(n.input, c, pass);
  switch (n.kind) {
    case NodeKind::kShuffle:
      return std::make_unique<ShuffleStream>(node, std::move(up), pass);
    case NodeKind::kBatch:
      return std::make_unique<BatchStream>(node, std::move(up), n.count);
    case NodeKind::kTake:
      return std::make_unique<TakeStream>(node, std::move(up));
    case NodeKind::kSkip:
      return std::make_unique<SkipStream>(node, std::move(up));
    case NodeKind::kMap:
      return std::make_unique<MapStream>(node, std::move(up));
    case NodeKind::kPrefetch:
      return std::make_unique<PrefetchStream>(std::move(up), n.count, c.options.prefetch_timeout_s);
    case NodeKind::kShard: {
      std::int64_t num = n.count, idx = n.index;
      if (num == SHARD_HINT) {
        STRATA_ENFORCE(c.req.hint.has_value(), STRATA_ERR_INVALID_ARGUMENT,
                       "shard(SHARD_HINT, SHARD_HINT) is a placeholder that only AutoShardPolicy::HINT fills in "
                       "(SHARD_HINT needs AutoShardPolicy::HINT); set it with with_options, or pass real numbers");
        num = c.req.hint->first;
        idx = c.req.hint->second;
        STRATA_ENFORCE(num >= 1 && idx >= 0 && idx < num, STRATA_ERR_INVALID_ARGUMENT, "shard hint (", num, ", ", idx,
                       ") is invalid; need num_shards >= 1 and 0 <= index < num_shards");
      }
      return std::make_unique<ShardStream>(std::move(up), num, idx);
    }
    case NodeKind::kOptions:
      return up;
    case NodeKind::kInterleave:
      return std::make_unique<InterleaveStream>(node, std::move(up), c, pass);
    case NodeKind::kConcatenate:
      return std::make_unique<ConcatenateStream>(node, std::move(up), c, pass);
    case NodeKind::kUnique:
      return std::make_unique<UniqueStream>(std::move(up));
    case NodeKind::kAssertCardinality:
      // Sharding by FILE changes the count; tf's rewrite drops the assertion.
      if (c.req.source_policy == STRATA_SHARD_FILE) return up;
      return std::make_unique<AssertCardinalityStream>(std::move(up), n.count);
    case NodeKind::kRebatch:
      return std::make_unique<RebatchStream>(node, std::move(up));
    default:
      break;
  }
  STRATA_THROW(STRATA_ERR_INTERNAL, "unknown dataset node kind ", static_cast<int>(n.kind));
}

bool has_shard_hint(const DatasetNode& n) {
  if (n.kind == NodeKind::kShard && n.count == SHARD_HINT) return true;
  if (n.input && has_shard_hint(*n.input)) return true;
  for (const NodePtr& in : n.inputs)
    if (has_shard_hint(*in)) return true;
  return false;
}

const DatasetNode* last_batch(const DatasetNode* n) {
  for (; n != nullptr; n = n->input.get())
    if (n->kind == NodeKind::kBatch) return n;
  return nullptr;
}

std::int64_t node_cardinality(const DatasetNode& n) {
  constexpr std::int64_t kUnknown = -1, kInfinite = -2;
  if (n.kind == NodeKind::kSource) {
    if (n.source.cardinality) return *n.source.cardinality;
    PluginInstance inst = open_source_plugin(n.source, InputContext{});
    const auto* vt = inst.vtable_as<strata_input_vtable>();
    if (!STRATA_HAS_FIELD(vt, strata_input_vtable, cardinality) || vt->cardinality == nullptr) return kUnknown;
    return vt->cardinality(static_cast<strata_input_t>(inst.handle()));
  }
  if (n.kind == NodeKind::kListFiles) return static_cast<std::int64_t>(n.files.size());
  if (n.kind == NodeKind::kAssertCardinality) return n.count;
  const std::int64_t in = node_cardinality(*n.input);
  switch (n.kind) {
    case NodeKind::kZip: {  // tf: the shortest; unknown if any is unknown
      std::int64_t r = in;
      for (const NodePtr& other : n.inputs) {
        const std::int64_t k = node_cardinality(*other);
        if (r == kUnknown || k == kUnknown) return kUnknown;
        if (k != kInfinite && (r == kInfinite || k < r)) r = k;
      }
      return r;
    }
    case NodeKind::kConcatenate: {
      if (in == kUnknown) return kUnknown;
      const std::int64_t k = node_cardinality(*n.inputs.at(0));
      if (k == kUnknown) return kUnknown;
      return in == kInfinite || k == kInfinite ? kInfinite : in + k;
    }
    case NodeKind::kInterleave:
    case NodeKind::kUnique:
      return kUnknown;
    case NodeKind::kRebatch:
      return in == kInfinite ? kInfinite : kUnknown;
    case NodeKind::kBatch:
      if (in < 0) return in;
      return n.flag ? in / n.count : (in + n.count - 1) / n.count;
    case NodeKind::kRepeat:
      if (n.count < 0) return in == 0 ? 0 : kInfinite;
      if (n.count == 0) return 0;
      if (in < 0) return in;
      return in * n.count;
    case NodeKind::kTake:
      if (in == kUnknown) return kUnknown;
      if (in == kInfinite) return n.count < 0 ? kInfinite : n.count;
      return n.count < 0 ? in : std::min(in, n.count);
    case NodeKind::kSkip:
      if (in < 0) return in;
      if (n.count < 0) return 0;
      return std::max<std::int64_t>(0, in - n.count);
    case NodeKind::kShard:
      if (in < 0 || n.count == SHARD_HINT) return in < 0 ? in : kUnknown;
      return in / n.count + (n.index < in % n.count ? 1 : 0);
    default:
      return in;  // shuffle, map, prefetch, options
  }
}

}  // namespace

// --------------------------------------------------- dataset_internal.h ---

BatchInfo batch_info(const Dataset& ds) {
  BatchInfo bi;
  if (const DatasetNode* b = last_batch(ds.node().get())) {
    bi.batched = true;
    bi.batch_size = b->count;
    bi.drop_remainder = b->flag;
  }
  bi.has_shard_hint = has_shard_hint(*ds.node());
  return bi;
}

namespace {

/// One source plugin's own answer to shard_info().
SourceShardInfo plugin_shard_info(const DatasetNode& src, const InputContext& ctx) {
  SourceShardInfo info;
  if (src.source.shard_flags) {
    info.flags = *src.source.shard_flags;
    return info;
  }
  PluginInstance inst = open_source_plugin(src.source, ctx);
  const auto* vt = inst.vtable_as<strata_input_vtable>();
  std::string files;
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st = vt->shard_info(
      static_cast<strata_input_t>(inst.handle()), &info.flags,
      [](void* user, const char* data, std::uint64_t len) { static_cast<std::string*>(user)->append(data, len); },
      &files, &err);
  check_status(st, err,
               str_cat("input pipeline '", src.source.plugin, "' (", src.source.label, "): shard_info").c_str());
  if (!files.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(files);
    } catch (const nlohmann::json::exception& e) {
      STRATA_THROW(STRATA_ERR_INTERNAL, "input pipeline '", src.source.plugin,
                   "' returned a file list that is not JSON (", e.what(), "); this is a plugin bug");
    }
    STRATA_ENFORCE(j.is_array(), STRATA_ERR_INTERNAL, "input pipeline '", src.source.plugin,
                   "' returned a file list that is not a JSON array: ", files, "; this is a plugin bug");
    for (const auto& f : j) {
      STRATA_ENFORCE(f.is_string(), STRATA_ERR_INTERNAL, "input pipeline '", src.source.plugin,
                     "' returned a file list with a non-string entry: ", f.dump(), "; this is a plugin bug");
      info.files.push_back(f.get<std::string>());
    }
  }
  return info;
}

/// Transformations the reader search walks through (tf's auto_shard.cc
/// pass-through ops; assert_cardinality is dropped when sharding by FILE).
bool passes_through(NodeKind k) {
  switch (k) {
    case NodeKind::kShuffle:
    case NodeKind::kBatch:
    case NodeKind::kRepeat:
    case NodeKind::kTake:
    case NodeKind::kSkip:
    case NodeKind::kMap:
    case NodeKind::kPrefetch:
    case NodeKind::kShard:
    case NodeKind::kOptions:
    case NodeKind::kRebatch:
    case NodeKind::kAssertCardinality:
      return true;
    default:
      return false;
  }
}

/// The readers under `n`, as tf's auto-shard rewrite finds them walking up
/// from the output: through pass-through ops, into every input of zip() and
/// concatenate(), stopping at a file-based source (from_records, a plugin
/// that shards by file) or at an interleave()/flat_map() over list_files().
/// Anything else (an in-memory source, a generator, list_files() read
/// directly, unique()) means no reader: `why` says which, and the search
/// stops. `files` keeps the smallest reader's file list (each reader is
/// sharded on its own, so the smallest limits the workers).
struct ReaderSearch {
  bool found = true;
  bool any = false;
  std::string why;
  std::vector<std::string> files;
};

void not_found(ReaderSearch& r, std::string why) {
  r.found = false;
  r.why = std::move(why);
}

void add_reader(ReaderSearch& r, std::vector<std::string> files) {
  if (!r.any || files.size() < r.files.size()) r.files = std::move(files);
  r.any = true;
}

void find_readers(const DatasetNode& n, const InputContext& ctx, ReaderSearch& r) {
  if (!r.found) return;
  if (passes_through(n.kind)) return find_readers(*n.input, ctx, r);
  switch (n.kind) {
    case NodeKind::kSource: {
      SourceShardInfo info = plugin_shard_info(n, ctx);
      if ((info.flags & STRATA_INPUT_CAN_SHARD_BY_FILE) == 0)
        return not_found(r, str_cat(n.source.label, " (input pipeline '", n.source.plugin,
                                    "') does not read files, so it cannot be sharded by file"));
      return add_reader(r, std::move(info.files));
    }
    case NodeKind::kZip:
    case NodeKind::kConcatenate:
      find_readers(*n.input, ctx, r);
      for (const NodePtr& in : n.inputs) find_readers(*in, ctx, r);
      return;
    case NodeKind::kInterleave: {
      const DatasetNode* in = n.input.get();
      while (passes_through(in->kind)) in = in->input.get();
      if (in->kind != NodeKind::kListFiles)
        return not_found(r, "interleave()/flat_map() is not over list_files() file names, so its function is not "
                            "known to read files");
      return add_reader(r, in->files);
    }
    case NodeKind::kListFiles:
      return not_found(r, "list_files() yields file names, not records (read them with interleave() or flat_map())");
    case NodeKind::kUnique:
      return not_found(r, "auto-sharding does not look through unique() (nor does tf's)");
    default:
      return not_found(r, str_cat("auto-sharding does not look through dataset node kind ", static_cast<int>(n.kind)));
  }
}

}  // namespace

SourceShardInfo source_shard_info(const Dataset& ds, const InputContext& ctx) {
  const DatasetNode& top = *ds.node();
  // A lone source answers for itself (its flags may say more than "file").
  if (top.kind == NodeKind::kSource) {
    SourceShardInfo info = plugin_shard_info(top, ctx);
    if ((info.flags & STRATA_INPUT_CAN_SHARD_BY_FILE) == 0)
      info.not_file_based =
          str_cat(top.source.label, " (input pipeline '", top.source.plugin, "') does not read files");
    return info;
  }
  ReaderSearch r;
  find_readers(top, ctx, r);
  SourceShardInfo info;
  if (r.found && r.any) {
    info.flags = STRATA_INPUT_CAN_SHARD_BY_FILE | STRATA_INPUT_CAN_SHARD_BY_DATA;
    info.files = std::move(r.files);
  } else {
    info.flags = STRATA_INPUT_CAN_SHARD_BY_DATA;
    info.not_file_based = r.why;
  }
  return info;
}

std::unique_ptr<ElementStream> open_stream(const Dataset& ds, const InputContext& ctx, const StreamRequest& req) {
  OpenCtx c;
  c.ictx = ctx;
  c.req = req;
  c.options = ds.options();
  if (req.source_policy != STRATA_SHARD_OFF)
    STRATA_ENFORCE(req.num_shards >= 1 && req.index >= 0 && req.index < req.num_shards, STRATA_ERR_INVALID_ARGUMENT,
                   "source sharding (", req.num_shards, ", ", req.index,
                   ") is invalid; need num_shards >= 1 and 0 <= index < num_shards");
  return open_node(ds.node(), c, req.pass);
}

namespace {

std::string bool_str(bool b) { return b ? "true" : "false"; }

void describe_node(const DatasetNode& n, std::vector<std::string>& out) {
  if (n.input) describe_node(*n.input, out);
  for (const NodePtr& in : n.inputs) describe_node(*in, out);
  switch (n.kind) {
    case NodeKind::kSource: {
      const SourceSpec& s = n.source;
      // In-memory sources carry an address in their options; name them by
      // what is stable across processes instead.
      if (!s.signature.empty())
        out.push_back(s.signature);
      else
        out.push_back(str_cat(s.label, " (input pipeline '", s.plugin, "', options ", s.options_json, ")"));
      return;
    }
    case NodeKind::kShuffle:
      out.push_back(str_cat("shuffle(buffer_size ", n.count, ", seed ", n.seed, ", reshuffle_each_iteration ",
                            bool_str(n.flag), ")"));
      return;
    case NodeKind::kBatch:
      out.push_back(str_cat("batch(", n.count, ", drop_remainder ", bool_str(n.flag), ")"));
      return;
    case NodeKind::kRepeat:
      out.push_back(str_cat("repeat(", n.count, ")"));
      return;
    case NodeKind::kTake:
      out.push_back(str_cat("take(", n.count, ")"));
      return;
    case NodeKind::kSkip:
      out.push_back(str_cat("skip(", n.count, ")"));
      return;
    case NodeKind::kMap:
      out.push_back("map()");
      return;
    case NodeKind::kPrefetch:
      out.push_back("prefetch()");  // the depth does not change the elements
      return;
    case NodeKind::kShard:
      out.push_back(n.count == SHARD_HINT ? std::string("shard(SHARD_HINT, SHARD_HINT)")
                                          : str_cat("shard(", n.count, ", ", n.index, ")"));
      return;
    case NodeKind::kOptions:
      return;  // options (timeouts) may change between runs
    case NodeKind::kListFiles: {
      std::string files;
      for (const std::string& f : n.files) files += (files.empty() ? "" : ", ") + f;
      out.push_back(str_cat("list_files(", n.files.size(), " files: ", files, ")"));
      return;
    }
    case NodeKind::kInterleave:
      out.push_back(str_cat("interleave(cycle_length ", n.count, ", block_length ", n.block, ")"));
      return;
    case NodeKind::kZip:
      out.push_back(str_cat("zip(", n.inputs.size() + 1, " datasets)"));
      return;
    case NodeKind::kConcatenate:
      out.push_back("concatenate()");
      return;
    case NodeKind::kUnique:
      out.push_back("unique()");
      return;
    case NodeKind::kAssertCardinality:
      out.push_back(str_cat("assert_cardinality(", n.count, ")"));
      return;
    case NodeKind::kRebatch: {
      std::string sizes;
      for (std::int64_t b : n.sizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(b);
      out.push_back(str_cat("rebatch([", sizes, "], drop_remainder ", bool_str(n.flag), ")"));
      return;
    }
  }
  out.push_back(str_cat("node kind ", static_cast<int>(n.kind)));
}

}  // namespace

std::vector<std::string> recipe_signature(const Dataset& ds) {
  std::vector<std::string> out;
  describe_node(*ds.node(), out);
  return out;
}

void note_restored_pass(const Dataset& ds, std::int64_t pass) {
  std::atomic<std::int64_t>& passes = ds.node()->passes;
  std::int64_t cur = passes.load();
  while (cur < pass + 1 && !passes.compare_exchange_weak(cur, pass + 1)) {
  }
}


// ------------------------------------------------------------ RowQueue ---

namespace {

// A batch's layout (names, dtypes, row shapes) as a batch of no rows.
Element zero_rows(const Element& b) {
  Element e;
  for (std::size_t k = 0; k < b.tensors.size(); ++k) {
    std::vector<std::int64_t> shape = b.tensors[k].shape();
    if (!shape.empty()) shape[0] = 0;
    e.names.push_back(b.names[k]);
    e.tensors.push_back(Tensor::zeros(shape, b.tensors[k].dtype()));
  }
  return e;
}

}  // namespace

bool RowQueue::fill(std::int64_t n) {
  while ((buffered_ < n || !layout_) && up_) {
    std::optional<Element> b = up_->next();
    if (!b) {
      up_.reset();
      break;
    }
    const std::int64_t r = batch_rows(*b, op_);
    if (!layout_) layout_ = zero_rows(*b);
    check_layout(*b);
    if (r == 0) continue;
    rows_.push_back(r);
    pending_.push_back(std::move(*b));
    buffered_ += r;
  }
  return buffered_ >= n;
}

std::vector<Element> RowQueue::buffered_rows() const {
  std::vector<Element> out;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (i > 0 || offset_ == 0) {
      out.push_back(pending_[i].clone());
      continue;
    }
    Element part;  // the rest of a batch partly taken
    for (std::size_t k = 0; k < pending_[i].tensors.size(); ++k) {
      const Tensor& t = pending_[i].tensors[k];
      const TensorView v(t);
      std::vector<std::int64_t> shape = t.shape();
      const std::size_t row = t.nbytes() / static_cast<std::size_t>(rows_[i]);
      shape[0] = rows_[i] - offset_;
      part.names.push_back(pending_[i].names[k]);
      part.tensors.push_back(Tensor::from_bytes(static_cast<const char*>(v.raw_data()) +
                                                    static_cast<std::size_t>(offset_) * row,
                                                static_cast<std::size_t>(shape[0]) * row, shape, t.dtype()));
    }
    out.push_back(std::move(part));
  }
  return out;
}

void RowQueue::save(StateWriter& w) {
  w.i64(taken_);
  w.boolean(layout_.has_value());
  if (layout_) w.element(*layout_);
  const std::vector<Element> rows = buffered_rows();
  w.u64(rows.size());
  for (const Element& e : rows) w.element(e);
  save_input(w, up_.get());
}

void RowQueue::restore(StateReader& r) {
  const std::int64_t taken = r.i64();
  std::optional<Element> layout;
  if (r.boolean()) layout = r.element();
  const std::uint64_t n = r.count(8);
  std::vector<Element> batches;
  for (std::uint64_t i = 0; i < n; ++i) batches.push_back(r.element());
  resume(std::move(batches), std::move(layout), taken, r);
}

void RowQueue::resume(std::vector<Element> batches, std::optional<Element> layout, std::int64_t taken,
                      StateReader& r) {
  pending_.clear();
  rows_.clear();
  offset_ = 0;
  buffered_ = 0;
  taken_ = taken;
  layout_ = std::move(layout);
  prepend(std::move(batches));
  restore_input(r, up_);
}

void RowQueue::prepend(std::vector<Element> batches) {
  std::deque<Element> old;
  if (offset_ > 0) {  // the partly taken front batch becomes the rows left of it
    for (Element& e : buffered_rows()) old.push_back(std::move(e));
  } else {
    old = std::move(pending_);
  }
  pending_.clear();
  rows_.clear();
  offset_ = 0;
  buffered_ = 0;
  auto push = [&](Element e) {
    const std::int64_t r = batch_rows(e, op_);
    if (!layout_) layout_ = zero_rows(e);
    if (r == 0) return;
    rows_.push_back(r);
    pending_.push_back(std::move(e));
    buffered_ += r;
  };
  for (Element& e : batches) push(std::move(e));
  for (Element& e : old) push(std::move(e));
}

void RowQueue::check_layout(const Element& b) const {
  bool same = b.tensors.size() == layout_->tensors.size();
  for (std::size_t i = 0; same && i < b.tensors.size(); ++i) {
    const auto s0 = layout_->tensors[i].shape(), s1 = b.tensors[i].shape();
    same = b.names[i] == layout_->names[i] && b.tensors[i].dtype() == layout_->tensors[i].dtype() &&
           s0.size() == s1.size();
  }
  if (!same)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op_, ": a batch has components ", layout_str(b), " but the first had ",
                 layout_str(*layout_), "; every batch needs the same components, dtypes and ranks");
}

Element RowQueue::take(std::int64_t n) {
  STRATA_ENFORCE(layout_ && n <= buffered_, STRATA_ERR_INTERNAL, op_, ": took ", n, " rows of ", buffered_);
  if (n > 0 && offset_ == 0 && rows_.front() == n) {  // exactly the next batch: no copy
    Element out = std::move(pending_.front());
    pending_.pop_front();
    rows_.pop_front();
    buffered_ -= n;
    taken_ += n;
    return out;
  }
  Element out;
  for (std::size_t k = 0; k < layout_->tensors.size(); ++k) {
    // Rows keep the shape of the batch they come from; rows from several
    // batches need equal row shapes (batches may differ, e.g. padded ones).
    std::vector<std::int64_t> shape = (n > 0 ? pending_.front() : *layout_).tensors[k].shape();
    shape[0] = n;
    Tensor t = Tensor::zeros(shape, layout_->tensors[k].dtype());
    auto* dst = static_cast<char*>(t.raw_data());
    std::int64_t got = 0, off = offset_;
    for (std::size_t i = 0; got < n; ++i) {
      const Tensor& src = pending_[i].tensors[k];
      const std::vector<std::int64_t> ss = src.shape();
      if (!std::equal(ss.begin() + 1, ss.end(), shape.begin() + 1))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op_, ": component '", layout_->names[k], "' has rows of shape ",
                     detail::shape_string(std::vector<std::int64_t>(shape.begin() + 1, shape.end())), " in one batch and ",
                     detail::shape_string(std::vector<std::int64_t>(ss.begin() + 1, ss.end())),
                     " in the next, and a new batch takes rows from both; give every batch the same row shape "
                     "(pad to a fixed size)");
      const TensorView v(src);
      STRATA_ENFORCE(v.is_contiguous(), STRATA_ERR_INVALID_ARGUMENT, op_, ": component '", layout_->names[k],
                     "' is not contiguous; make it compact (e.g. Tensor::copy_of) in map()");
      const std::size_t row = src.nbytes() / static_cast<std::size_t>(rows_[i]);
      const std::int64_t m = std::min(rows_[i] - off, n - got);
      if (row != 0)
        std::memcpy(dst + static_cast<std::size_t>(got) * row,
                    static_cast<const char*>(v.raw_data()) + static_cast<std::size_t>(off) * row,
                    static_cast<std::size_t>(m) * row);
      got += m;
      off = 0;
    }
    out.names.push_back(layout_->names[k]);
    out.tensors.push_back(std::move(t));
  }
  // Drop the rows taken.
  taken_ += n;
  buffered_ -= n;
  std::int64_t left = n;
  while (left > 0) {
    const std::int64_t m = std::min(rows_.front() - offset_, left);
    offset_ += m;
    left -= m;
    if (offset_ == rows_.front()) {
      pending_.pop_front();
      rows_.pop_front();
      offset_ = 0;
    }
  }
  return out;
}

}  // namespace detail

// ------------------------------------------------------------- Dataset ---

using detail::DatasetNode;
using detail::NodeKind;

namespace {

std::shared_ptr<DatasetNode> source_node(detail::SourceSpec spec) {
  auto n = std::make_shared<DatasetNode>();
  n->kind = NodeKind::kSource;
  n->source = std::move(spec);
  return n;
}

const std::shared_ptr<const DatasetNode>& checked(const std::shared_ptr<const DatasetNode>& n) {
  STRATA_ENFORCE(n != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "this Dataset has no recipe (built from a null node); create one with Dataset::from_*");
  return n;
}

}  // namespace

Dataset::Dataset(std::shared_ptr<const detail::DatasetNode> node) : node_(std::move(node)) {}

Dataset Dataset::from_tensor_slices(Element components) {
  STRATA_ENFORCE(!components.tensors.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "from_tensor_slices: the element has no components; add at least one tensor");
  STRATA_ENFORCE(components.names.size() == components.tensors.size(), STRATA_ERR_INVALID_ARGUMENT,
                 "from_tensor_slices: ", components.names.size(), " names but ", components.tensors.size(),
                 " tensors; build the element with Element::add");
  STRATA_ENFORCE(components.tensors.size() <= STRATA_ELEMENT_MAX_COMPONENTS, STRATA_ERR_INVALID_ARGUMENT,
                 "from_tensor_slices: ", components.tensors.size(), " components; at most ",
                 STRATA_ELEMENT_MAX_COMPONENTS, " are allowed");
  std::int64_t rows = -1;
  for (std::size_t i = 0; i < components.tensors.size(); ++i) {
    const Tensor& t = components.tensors[i];
    STRATA_ENFORCE(t.defined(), STRATA_ERR_INVALID_ARGUMENT, "from_tensor_slices: component '", components.names[i],
                   "' is an empty Tensor");
    STRATA_ENFORCE(t.ndim() >= 1, STRATA_ERR_INVALID_ARGUMENT, "from_tensor_slices: component '", components.names[i],
                   "' is a scalar; slicing needs at least one dimension");
    const std::int64_t r = t.dl().shape[0];
    STRATA_ENFORCE(rows < 0 || r == rows, STRATA_ERR_INVALID_ARGUMENT,
                   "from_tensor_slices: components must share their first dimension, but '", components.names[0],
                   "' has ", rows, " rows and '", components.names[i], "' has ", r, "; slice arrays of equal length");
    rows = r;
  }
  struct Arrays {
    Element owned;
    strata_input_arrays c{};
  };
  auto a = std::make_shared<Arrays>();
  a->owned = std::move(components);
  STRATA_INIT_HEADER(&a->c, strata_input_arrays);
  a->c.num_components = static_cast<std::uint32_t>(a->owned.tensors.size());
  for (std::size_t i = 0; i < a->owned.tensors.size(); ++i) {
    a->c.names[i] = a->owned.names[i].c_str();
    a->c.tensors[i] = &a->owned.tensors[i].dl();
  }
  detail::SourceSpec s;
  s.plugin = "memory";
  s.options_json = nlohmann::json{{"arrays", detail::hex_address(&a->c)}}.dump();
  s.label = "from_tensor_slices";
  s.signature = "from_tensor_slices(" + std::to_string(rows) + " rows of";
  for (std::size_t i = 0; i < a->owned.tensors.size(); ++i)
    s.signature += (i ? ", " : " ") + a->owned.names[i] + ": " + dtype_name(a->owned.tensors[i].dtype()) +
                   detail::shape_string(a->owned.tensors[i].shape());
  s.signature += ")";
  s.keep_alive = a;
  s.cardinality = rows;
  return Dataset(source_node(std::move(s)));
}

Dataset Dataset::from_npy(const std::vector<std::pair<std::string, std::string>>& files) {
  STRATA_ENFORCE(!files.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "from_npy: no files; pass {{\"x\", \"x.npy\"}, ...} with one .npy file per component");
  nlohmann::ordered_json npy = nlohmann::ordered_json::object();
  std::string label = "from_npy(";
  for (const auto& [name, file] : files) {
    STRATA_ENFORCE(!npy.contains(name), STRATA_ERR_INVALID_ARGUMENT, "from_npy: component '", name,
                   "' is listed twice; give each file its own name");
    npy[name] = file;
    label += (npy.size() > 1 ? ", " : "") + file;
  }
  detail::SourceSpec s;
  s.plugin = "memory";
  s.options_json = nlohmann::ordered_json{{"npy", npy}}.dump();
  s.label = label + ")";
  return Dataset(source_node(std::move(s)));
}

Dataset Dataset::from_generator(std::function<Generator(const InputContext&)> make) {
  STRATA_ENFORCE(static_cast<bool>(make), STRATA_ERR_INVALID_ARGUMENT,
                 "from_generator: the make function is empty; pass a callable returning a Generator");
  auto g = std::make_shared<detail::GeneratorSource>();
  g->make = std::move(make);
  STRATA_INIT_HEADER(&g->c, strata_input_generator);
  g->c.user = g.get();
  g->c.start = &detail::gen_start;
  g->c.next = &detail::gen_next;
  g->c.finish = &detail::gen_finish;
  detail::SourceSpec s;
  s.plugin = "generator";
  s.options_json = nlohmann::json{{"generator", detail::hex_address(&g->c)}}.dump();
  s.label = "from_generator";
  s.signature = "from_generator";
  s.keep_alive = g;
  s.cardinality = -1;
  s.shard_flags = STRATA_INPUT_CAN_SHARD_BY_DATA;
  return Dataset(source_node(std::move(s)));
}

Dataset Dataset::from_records(const std::vector<std::string>& files, const RecordOptions& options) {
  STRATA_ENFORCE(!files.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "from_records: no files; pass at least one TFRecord-format file");
  nlohmann::json o;
  o["files"] = files;
  if (!options.features.empty()) {
    nlohmann::json feats = nlohmann::json::array();
    for (const FeatureSpec& f : options.features)
      feats.push_back({{"name", f.name}, {"dtype", dtype_name(f.dtype)}, {"shape", f.shape}});
    o["features"] = feats;
  }
  o["skip_corrupt"] = options.skip_corrupt;
  o["buffer_bytes"] = options.buffer_bytes;
  detail::SourceSpec s;
  s.plugin = "records";
  s.options_json = o.dump();
  s.label =
      "from_records(" + files[0] + (files.size() > 1 ? ", ... " + std::to_string(files.size()) + " files" : "") + ")";
  return Dataset(source_node(std::move(s)));
}

Dataset Dataset::from_plugin(const std::string& name, const std::string& options_json) {
  STRATA_ENFORCE(!name.empty(), STRATA_ERR_INVALID_ARGUMENT, "from_plugin: the plugin name is empty");
  try {
    const nlohmann::json j = nlohmann::json::parse(options_json.empty() ? std::string("{}") : options_json);
    STRATA_ENFORCE(j.is_object(), STRATA_ERR_INVALID_ARGUMENT, "from_plugin('", name,
                   "'): options must be a JSON object, got ", j.type_name());
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "from_plugin('", name, "'): options are not valid JSON (", e.what(),
                 "); pass a JSON object such as {}");
  }
  detail::SourceSpec s;
  s.plugin = name;
  s.options_json = options_json.empty() ? "{}" : options_json;
  s.label = "from_plugin";
  return Dataset(source_node(std::move(s)));
}

Dataset Dataset::list_files(const std::vector<std::string>& patterns, bool shuffle, std::uint64_t seed) {
  STRATA_ENFORCE(!patterns.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "list_files: no patterns; pass at least one glob such as \"data/train-*.rec\"");
  std::vector<std::string> files;
  std::string all;
  for (const std::string& p : patterns) {
    all += (all.empty() ? "" : ", ") + p;
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    STRATA_ENFORCE(rc == 0 || rc == GLOB_NOMATCH, STRATA_ERR_INVALID_ARGUMENT, "list_files: pattern '", p,
                   "' could not be expanded (glob error ", rc, rc == GLOB_ABORTED ? ": a directory is unreadable" : "",
                   ")");
  }
  STRATA_ENFORCE(!files.empty(), STRATA_ERR_INVALID_ARGUMENT, "list_files: no files match ", all,
                 "; check the patterns and the working directory");
  std::sort(files.begin(), files.end());
  auto n = std::make_shared<DatasetNode>();
  n->kind = NodeKind::kListFiles;
  n->files = std::move(files);
  const auto count = static_cast<std::int64_t>(n->files.size());
  Dataset ds{std::shared_ptr<const DatasetNode>(std::move(n))};
  return shuffle ? ds.shuffle(count, seed, /*reshuffle_each_iteration=*/true) : ds;
}

std::string Dataset::file_name(const Element& e) {
  for (std::size_t i = 0; i < e.tensors.size(); ++i) {
    if (e.names[i] != detail::kFileNameComponent) continue;
    const Tensor& t = e.tensors[i];
    STRATA_ENFORCE(t.dtype() == DType::kUInt8 && t.ndim() == 1, STRATA_ERR_INVALID_ARGUMENT,
                   "Dataset::file_name: component 'filename' is ", dtype_name(t.dtype()), detail::shape_string(t.shape()),
                   ", not a uint8 vector; pass an element of Dataset::list_files");
    const TensorView v(t);
    return std::string(static_cast<const char*>(v.raw_data()), t.nbytes());
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
               "Dataset::file_name: the element has no component 'filename'; pass an element of Dataset::list_files");
}

Dataset Dataset::zip(const std::vector<Dataset>& datasets) {
  STRATA_ENFORCE(!datasets.empty(), STRATA_ERR_INVALID_ARGUMENT, "zip: no datasets; pass at least one");
  auto n = std::make_shared<DatasetNode>();
  n->kind = NodeKind::kZip;
  n->input = checked(datasets[0].node());
  n->options = n->input->options;
  for (std::size_t i = 1; i < datasets.size(); ++i) n->inputs.push_back(checked(datasets[i].node()));
  return Dataset(std::move(n));
}

namespace {

std::shared_ptr<DatasetNode> op_node(const std::shared_ptr<const DatasetNode>& input, NodeKind kind) {
  auto n = std::make_shared<DatasetNode>();
  n->kind = kind;
  n->input = checked(input);
  n->options = input->options;
  return n;
}

}  // namespace

Dataset Dataset::shuffle(std::int64_t buffer_size, std::uint64_t seed, bool reshuffle_each_iteration) const {
  STRATA_ENFORCE(buffer_size >= 1, STRATA_ERR_INVALID_ARGUMENT, "shuffle: buffer_size is ", buffer_size,
                 "; pass at least 1 (a buffer as large as the dataset gives a full shuffle)");
  auto n = op_node(node_, NodeKind::kShuffle);
  n->count = buffer_size;
  n->seed = seed;
  n->flag = reshuffle_each_iteration;
  return Dataset(std::move(n));
}

Dataset Dataset::batch(std::int64_t batch_size, bool drop_remainder) const {
  STRATA_ENFORCE(batch_size >= 1, STRATA_ERR_INVALID_ARGUMENT, "batch: batch_size is ", batch_size,
                 "; pass at least 1");
  auto n = op_node(node_, NodeKind::kBatch);
  n->count = batch_size;
  n->flag = drop_remainder;
  return Dataset(std::move(n));
}

Dataset Dataset::repeat(std::int64_t count) const {
  STRATA_ENFORCE(count >= -1, STRATA_ERR_INVALID_ARGUMENT, "repeat: count is ", count,
                 "; pass -1 (forever) or a count >= 0");
  auto n = op_node(node_, NodeKind::kRepeat);
  n->count = count;
  return Dataset(std::move(n));
}

Dataset Dataset::take(std::int64_t count) const {
  STRATA_ENFORCE(count >= -1, STRATA_ERR_INVALID_ARGUMENT, "take: count is ", count, "; pass -1 (all) or a count >= 0");
  auto n = op_node(node_, NodeKind::kTake);
  n->count = count;
  return Dataset(std::move(n));
}

Dataset Dataset::skip(std::int64_t count) const {
  STRATA_ENFORCE(count >= -1, STRATA_ERR_INVALID_ARGUMENT, "skip: count is ", count,
                 "; pass -1 (skip everything) or a count >= 0");
  auto n = op_node(node_, NodeKind::kSkip);
  n->count = count;
  return Dataset(std::move(n));
}

Dataset Dataset::map(std::function<Element(Element)> fn) const {
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_INVALID_ARGUMENT, "map: the function is empty; pass a callable");
  auto n = op_node(node_, NodeKind::kMap);
  n->fn = std::move(fn);
  return Dataset(std::move(n));
}

Dataset Dataset::prefetch(std::int64_t buffer_size) const {
  STRATA_ENFORCE(buffer_size >= 1 || buffer_size == -1, STRATA_ERR_INVALID_ARGUMENT, "prefetch: buffer_size is ",
                 buffer_size, "; pass at least 1, or -1 (AUTOTUNE) for the default of 2");
  auto n = op_node(node_, NodeKind::kPrefetch);
  n->count = buffer_size == -1 ? 2 : buffer_size;
  return Dataset(std::move(n));
}

Dataset Dataset::shard(std::int64_t num_shards, std::int64_t index) const {
  const bool hint = num_shards == SHARD_HINT || index == SHARD_HINT;
  if (hint)
    STRATA_ENFORCE(num_shards == SHARD_HINT && index == SHARD_HINT, STRATA_ERR_INVALID_ARGUMENT, "shard(", num_shards,
                   ", ", index, "): SHARD_HINT must be given for both arguments or for neither");
  else
    STRATA_ENFORCE(num_shards >= 1 && index >= 0 && index < num_shards, STRATA_ERR_INVALID_ARGUMENT, "shard(",
                   num_shards, ", ", index, ") is invalid; need num_shards >= 1 and 0 <= index < num_shards");
  auto n = op_node(node_, NodeKind::kShard);
  n->count = num_shards;
  n->index = index;
  return Dataset(std::move(n));
}

Dataset Dataset::interleave(std::function<Dataset(Element)> fn, std::int64_t cycle_length,
                            std::int64_t block_length) const {
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_INVALID_ARGUMENT,
                 "interleave: the function is empty; pass a callable returning a Dataset");
  STRATA_ENFORCE(cycle_length >= 1, STRATA_ERR_INVALID_ARGUMENT, "interleave: cycle_length is ", cycle_length,
                 "; pass at least 1 (Strata has no AUTOTUNE here: the order would depend on the machine)");
  STRATA_ENFORCE(block_length >= 1, STRATA_ERR_INVALID_ARGUMENT, "interleave: block_length is ", block_length,
                 "; pass at least 1");
  auto n = op_node(node_, NodeKind::kInterleave);
  n->dataset_fn = std::move(fn);
  n->count = cycle_length;
  n->block = block_length;
  return Dataset(std::move(n));
}

Dataset Dataset::flat_map(std::function<Dataset(Element)> fn) const {
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_INVALID_ARGUMENT,
                 "flat_map: the function is empty; pass a callable returning a Dataset");
  return interleave(std::move(fn), 1, 1);
}

Dataset Dataset::concatenate(const Dataset& other) const {
  auto n = op_node(node_, NodeKind::kConcatenate);
  n->inputs.push_back(checked(other.node()));
  return Dataset(std::move(n));
}

Dataset Dataset::unique() const { return Dataset(op_node(node_, NodeKind::kUnique)); }

Dataset Dataset::assert_cardinality(std::int64_t n) const {
  STRATA_ENFORCE(n >= 0 || n == INFINITE_CARDINALITY, STRATA_ERR_INVALID_ARGUMENT, "assert_cardinality: ", n,
                 " is not a count; pass a count >= 0 or INFINITE_CARDINALITY");
  auto node = op_node(node_, NodeKind::kAssertCardinality);
  node->count = n;
  return Dataset(std::move(node));
}

Dataset Dataset::rebatch(std::vector<std::int64_t> batch_sizes, bool drop_remainder) const {
  STRATA_ENFORCE(!batch_sizes.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "rebatch: no batch sizes; pass a size or a list of sizes");
  bool positive = false;
  for (std::int64_t b : batch_sizes) {
    STRATA_ENFORCE(b >= 0, STRATA_ERR_INVALID_ARGUMENT, "rebatch: batch size ", b, " is negative; pass sizes >= 0");
    positive = positive || b > 0;
  }
  STRATA_ENFORCE(positive, STRATA_ERR_INVALID_ARGUMENT,
                 "rebatch: every batch size is 0, which would never read the input; give at least one positive size");
  auto n = op_node(node_, NodeKind::kRebatch);
  n->sizes = std::move(batch_sizes);
  n->flag = drop_remainder;
  return Dataset(std::move(n));
}

Dataset Dataset::with_options(const DatasetOptions& options) const {
  STRATA_ENFORCE(options.source_timeout_s > 0, STRATA_ERR_INVALID_ARGUMENT, "with_options: source_timeout_s is ",
                 options.source_timeout_s, "; pass a positive number of seconds");
  STRATA_ENFORCE(options.prefetch_timeout_s > 0, STRATA_ERR_INVALID_ARGUMENT, "with_options: prefetch_timeout_s is ",
                 options.prefetch_timeout_s, "; pass a positive number of seconds");
  auto n = op_node(node_, NodeKind::kOptions);
  n->options = options;
  return Dataset(std::move(n));
}

const DatasetOptions& Dataset::options() const { return checked(node_)->options; }

std::int64_t Dataset::cardinality() const { return detail::node_cardinality(*checked(node_)); }

DatasetIterator Dataset::make_iterator(const InputContext& ctx) const {
  detail::StreamRequest req;
  req.pass = checked(node_)->passes.fetch_add(1);
  auto impl = std::make_unique<DatasetIterator::Impl>();
  impl->stream = detail::open_stream(*this, ctx, req);
  impl->dataset = *this;
  impl->ctx = ctx;
  impl->req = req;
  return DatasetIterator(std::move(impl));
}

DatasetIterator::RangeIter Dataset::begin() const {
  return DatasetIterator::RangeIter(std::make_shared<DatasetIterator>(make_iterator()));
}

// ----------------------------------------------------- DatasetIterator ---

DatasetIterator::DatasetIterator() = default;
DatasetIterator::DatasetIterator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatasetIterator::DatasetIterator(DatasetIterator&&) noexcept = default;
DatasetIterator& DatasetIterator::operator=(DatasetIterator&&) noexcept = default;
DatasetIterator::~DatasetIterator() = default;

std::optional<Element> DatasetIterator::next() {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "next() on an empty DatasetIterator (default-constructed or moved from); get one from "
                 "Dataset::make_iterator");
  impl_->used = true;
  if (impl_->ended) return std::nullopt;
  try {
    std::optional<Element> e = impl_->stream->next();
    if (!e) {
      impl_->ended = true;
      impl_->stream.reset();  // close the source now, not when the iterator dies
    }
    return e;
  } catch (...) {
    // A failed pass is over: the streams may be mid-element.
    impl_->ended = true;
    impl_->stream.reset();
    throw;
  }
}

namespace {
constexpr const char* kStateKind = "DatasetIterator";
}  // namespace

std::string DatasetIterator::save_state() {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "save_state() on an empty DatasetIterator (default-constructed or moved from); get one from "
                 "Dataset::make_iterator");
  detail::StateWriter w;
  w.strings(detail::recipe_signature(*impl_->dataset));
  w.i64(impl_->ctx.num_input_pipelines);
  w.i64(impl_->ctx.input_pipeline_id);
  w.i64(impl_->ctx.num_replicas_in_sync);
  w.i64(impl_->req.pass);
  w.boolean(impl_->ended);
  if (!impl_->ended) impl_->stream->save(w);
  return w.seal(kStateKind);
}

void DatasetIterator::restore_state(const std::string& state) {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "restore_state() on an empty DatasetIterator (default-constructed or moved from); get one from "
                 "Dataset::make_iterator");
  STRATA_ENFORCE(!impl_->used, STRATA_ERR_FAILED_PRECONDITION,
                 "restore_state() on an iterator that next() was already called on; restore into a fresh iterator "
                 "(Dataset::make_iterator) before reading from it");
  detail::StateReader r(state, kStateKind);
  detail::check_same_recipe(r.strings(), detail::recipe_signature(*impl_->dataset), "DatasetIterator");
  const std::int64_t pipelines = r.i64(), id = r.i64(), replicas = r.i64();
  const InputContext& c = impl_->ctx;
  STRATA_ENFORCE(pipelines == c.num_input_pipelines && id == c.input_pipeline_id &&
                     replicas == c.num_replicas_in_sync,
                 STRATA_ERR_INVALID_ARGUMENT, "the saved DatasetIterator state is of input pipeline ", id, " of ",
                 pipelines, " (", replicas, " replicas in sync) but this iterator is pipeline ", c.input_pipeline_id,
                 " of ", c.num_input_pipelines, " (", c.num_replicas_in_sync,
                 " replicas); make the iterator with the InputContext the state was saved with");
  const std::int64_t pass = r.i64();
  STRATA_ENFORCE(pass >= 0, STRATA_ERR_DATA_LOSS, "the saved DatasetIterator state has pass number ", pass);
  const bool ended = r.boolean();
  // The fresh stream read nothing yet; reopen it at the saved pass (its
  // shuffles' seeds depend on it) and restore every stage into it.
  detail::StreamRequest req = impl_->req;
  req.pass = pass;
  // On failure the original stream is untouched: the iterator stays fresh.
  std::unique_ptr<detail::ElementStream> stream;
  if (!ended) {
    stream = detail::open_stream(*impl_->dataset, impl_->ctx, req);
    stream->restore(r);
  }
  r.expect_end();
  impl_->stream = std::move(stream);
  impl_->ended = ended;
  impl_->req = req;
  detail::note_restored_pass(*impl_->dataset, pass);
}

DatasetIterator::RangeIter::RangeIter(DatasetIterator* it) : it_(it) { cur_ = it_->next(); }

DatasetIterator::RangeIter::RangeIter(std::shared_ptr<DatasetIterator> owned)
    : owned_(std::move(owned)), it_(owned_.get()) {
  cur_ = it_->next();
}

DatasetIterator::RangeIter& DatasetIterator::RangeIter::operator++() {
  cur_.reset();
  if (it_ != nullptr) cur_ = it_->next();
  return *this;
}

}  // namespace strata
