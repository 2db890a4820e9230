// SPDX-License-Identifier: Apache-2.0
// Strategy::distribute_dataset and distribute_datasets_from_function: the
// auto-shard decision, the split of batches across replicas, the input
// thread and the per-step agreement across workers (see
// strata/distributed_data.hpp for the rules).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "api/strategy_impl.h"
#include "data/dataset_internal.h"
#include "log.h"
#include "strata/distributed_data.hpp"
#include "strata/error.hpp"

namespace strata {

// ------------------------------------------------------------ element ---

DistributedElement::DistributedElement(std::vector<std::string> names, std::vector<PerReplica> values)
    : names_(std::move(names)), values_(std::move(values)) {}

namespace {
std::size_t find_name(const std::vector<std::string>& names, const std::string& name) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  STRATA_THROW(STRATA_ERR_NOT_FOUND, "the input has no component '", name, "'; its components are: ",
               all.empty() ? "(none)" : all);
}
}  // namespace

PerReplica& DistributedElement::operator[](const std::string& name) { return values_[find_name(names_, name)]; }
const PerReplica& DistributedElement::operator[](const std::string& name) const {
  return values_[find_name(names_, name)];
}

std::vector<std::int64_t> DistributedElement::local_batch_sizes() const {
  std::vector<std::int64_t> out;
  if (values_.empty()) return out;
  for (const Tensor& t : values_[0].values()) out.push_back(t.ndim() > 0 ? t.shape()[0] : 1);
  return out;
}

namespace detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The layout of one element (names, dtypes, per-row shapes), learned from
// the first batch a pipeline produces; used to make empty batches.
struct Spec {
  std::vector<std::string> names;
  std::vector<DType> dtypes;
  std::vector<std::vector<std::int64_t>> row_shapes;  // shape without the first dimension
  bool known = false;
};

Spec spec_of(const Element& e) {
  Spec s;
  s.names = e.names;
  for (const Tensor& t : e.tensors) {
    s.dtypes.push_back(t.dtype());
    auto shape = t.shape();
    STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT,
                   "a distributed dataset's elements must be batches (a leading batch dimension), but a "
                   "component is a scalar; batch the dataset before distributing it");
    s.row_shapes.emplace_back(shape.begin() + 1, shape.end());
  }
  s.known = true;
  return s;
}

// A spec as one line of JSON, tagged with the worker that sent it (for
// the exchange in DistributedIteratorImpl::share_spec).
std::string encode_spec(const Spec& s, int worker) {
  nlohmann::json j = {{"worker", worker}, {"names", s.names}, {"shapes", s.row_shapes}};
  for (DType d : s.dtypes) j["dtypes"].push_back(static_cast<int>(d));
  return j.dump() + "\n";
}

std::pair<Spec, int> decode_spec(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line);
  Spec s;
  s.names = j.at("names").get<std::vector<std::string>>();
  s.row_shapes = j.at("shapes").get<std::vector<std::vector<std::int64_t>>>();
  for (int d : j.value("dtypes", std::vector<int>{})) s.dtypes.push_back(static_cast<DType>(d));
  s.known = true;
  return {s, j.at("worker").get<int>()};
}

std::string describe_spec(const Spec& s) {
  std::string out;
  for (std::size_t i = 0; i < s.names.size(); ++i) {
    out += (i ? ", " : "") + s.names[i] + ": " + dtype_name(s.dtypes[i]) + "[batch";
    for (auto d : s.row_shapes[i]) out += "," + std::to_string(d);
    out += "]";
  }
  return out.empty() ? "(no components)" : out;
}

bool same_spec(const Spec& a, const Spec& b) {
  return a.names == b.names && a.dtypes == b.dtypes && a.row_shapes == b.row_shapes;
}

Element empty_like(const Spec& s) {
  Element e;
  for (std::size_t i = 0; i < s.names.size(); ++i) {
    std::vector<std::int64_t> shape{0};
    shape.insert(shape.end(), s.row_shapes[i].begin(), s.row_shapes[i].end());
    e.names.push_back(s.names[i]);
    e.tensors.push_back(Tensor::zeros(shape, s.dtypes[i]));
  }
  return e;
}

// Rows [begin, end) of every component of `batch` (a copy; moves the whole
// tensor when the range is all of it and `batch` may be consumed).
Element slice_rows(Element& batch, std::int64_t begin, std::int64_t end, bool may_move) {
  Element out;
  for (std::size_t i = 0; i < batch.tensors.size(); ++i) {
    Tensor& t = batch.tensors[i];
    auto shape = t.shape();
    const std::int64_t rows = shape.empty() ? 1 : shape[0];
    out.names.push_back(batch.names[i]);
    if (may_move && begin == 0 && end == rows) {
      out.tensors.push_back(std::move(t));
      continue;
    }
    const std::size_t row_bytes = rows > 0 ? t.nbytes() / static_cast<std::size_t>(rows) : 0;
    shape[0] = end - begin;
    if (end == begin) {
      out.tensors.push_back(Tensor::zeros(shape, t.dtype()));
      continue;
    }
    const auto* src = static_cast<const char*>(t.raw_data()) + static_cast<std::size_t>(begin) * row_bytes;
    out.tensors.push_back(Tensor::from_bytes(src, static_cast<std::size_t>(end - begin) * row_bytes, shape,
                                             t.dtype()));
  }
  return out;
}

std::int64_t rows_of(const Element& e) {
  if (e.tensors.empty()) return 0;
  const auto shape = e.tensors[0].shape();
  return shape.empty() ? 1 : shape[0];
}

// tf.data's legacy rebatch (what tf.distribute uses under DATA sharding):
// a batch of b rows becomes n minibatches of c = ceil(b / n) rows, the last
// ones shorter or empty; minibatch k is rows [k*c, min((k+1)*c, b)).
std::pair<std::int64_t, std::int64_t> split_range(std::int64_t b, std::int64_t n, std::int64_t k) {
  const std::int64_t c = ceil_div(b, n);
  const std::int64_t lo = std::min(b, k * c);
  const std::int64_t hi = std::min(b, lo + c);
  return {lo, hi};
}

// tf.distribute's batch_sizes_for_worker: a global batch of `global` rows
// is cut into N = workers * local sub-batches, the first global % N of them
// one row longer; worker w's list is that list rotated left by w * local, so
// that every step (local sub-batches on each worker) sums to `global` and
// the longer sub-batches move from worker to worker step by step.
std::vector<std::int64_t> rebatch_sizes(std::int64_t global, int workers, int local, int worker) {
  const std::int64_t n = static_cast<std::int64_t>(workers) * local;
  const std::int64_t floor = global / n, longer = global % n;
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) {
    const std::int64_t j = (k + static_cast<std::int64_t>(worker) * local) % n;
    out[static_cast<std::size_t>(k)] = floor + (j < longer ? 1 : 0);
  }
  return out;
}

// One local step: an Element per local replica, or nullopt when this
// worker's input is exhausted.
using LocalStep = std::optional<std::vector<Element>>;

// How a producer continues a saved position (see
// DistributedIteratorImpl::restore_state): the data it must hand out before
// reading its input again, and where its split cycle stands.
struct Continuation {
  // Batches to emit first: global batches for a DataShardProducer, rows (any
  // cut) for a RebatchProducer.
  std::vector<Element> batches;
  std::size_t cycle = 0;    // RebatchProducer: index into its sizes
  std::int64_t taken = 0;   // RebatchProducer: rows of its stream already handed out
  std::optional<Element> layout;
};

// What a saved producer state holds before its input's state.
enum class ProducerKind : std::uint8_t { kData = 0, kRows = 1, kFunction = 2 };

// Produces local steps (runs on the input thread).
class StepProducer {
 public:
  virtual ~StepProducer() = default;
  virtual LocalStep next() = 0;
  virtual ProducerKind kind() const = 0;
  // Its position: a ProducerKind byte, what read_continuation() reads,
  // then its input's state.
  virtual void save(StateWriter& w) = 0;
  // Continue from `c`, then restore the input from `r`, positioned where
  // save() wrote it.
  virtual void resume(Continuation c, StateReader& r) = 0;
  Spec spec;  // read by the consumer only after the producer has stopped or via the queue
  // Per step, moved into the queued item: the unsliced global batch
  // (DataShardProducer) and the rows taken so far (RebatchProducer).
  std::optional<Element> last_global;
  std::int64_t rows_taken = 0;
};

// Reads what a kData or kRows producer's save() wrote before its input
// (the kind byte already read).
Continuation read_continuation(StateReader& r, ProducerKind kind) {
  Continuation c;
  if (kind == ProducerKind::kRows) {
    c.cycle = static_cast<std::size_t>(r.u64());
    c.taken = r.i64();
    if (r.boolean()) c.layout = r.element();
  }
  const std::uint64_t n = r.count(8);
  for (std::uint64_t i = 0; i < n; ++i) c.batches.push_back(r.element());
  return c;
}

// Under DATA sharding across workers (tf.distribute's legacy rebatch, then
// shard(num_workers, index) over the minibatches): every worker reads the
// same global batches, each cut into N = W * L minibatches, and local
// replica i of worker w keeps minibatch w + i * W.
class DataShardProducer : public StepProducer {
 public:
  DataShardProducer(std::unique_ptr<ElementStream> stream, int workers, int worker, int local)
      : stream_(std::move(stream)), workers_(workers), worker_(worker), local_(local) {}
  LocalStep next() override {
    std::optional<Element> batch;
    if (!pending_.empty()) {
      batch = std::move(pending_.front());
      pending_.pop_front();
    } else if (stream_) {
      batch = stream_->next();
    }
    if (!batch) {
      stream_.reset();
      return std::nullopt;
    }
    if (!spec.known) spec = spec_of(*batch);
    const std::int64_t b = rows_of(*batch);
    const std::int64_t n = static_cast<std::int64_t>(workers_) * local_;
    std::vector<Element> out;
    for (int i = 0; i < local_; ++i) {
      auto [lo, hi] = split_range(b, n, worker_ + static_cast<std::int64_t>(i) * workers_);
      out.push_back(slice_rows(*batch, lo, hi, false));
    }
    // Worker 0 keeps each global batch until it is consumed: its state is
    // what another worker count continues from (see restore_state).
    if (worker_ == 0) last_global = std::move(batch);
    return out;
  }
  ProducerKind kind() const override { return ProducerKind::kData; }
  void save(StateWriter& w) override {
    w.u8(static_cast<std::uint8_t>(kind()));
    w.u64(pending_.size());
    for (const Element& e : pending_) w.element(e);
    save_input(w, stream_.get());
  }
  void resume(Continuation c, StateReader& r) override {
    pending_.assign(std::make_move_iterator(c.batches.begin()), std::make_move_iterator(c.batches.end()));
    restore_input(r, stream_);
  }

 private:
  std::unique_ptr<ElementStream> stream_;
  std::deque<Element> pending_;  // global batches restored from a state
  int workers_, worker_, local_;
};

// Every other case (one worker; FILE, OFF or HINT across workers): this
// worker's stream of global batches is re-cut into sub-batches whose sizes
// cycle through rebatch_sizes(), local ones per step. A step in which
// every sub-batch is empty still counts while the stream has rows left (a
// worker whose turn has no rows waits with empty batches), never after.
class RebatchProducer : public StepProducer {
 public:
  RebatchProducer(std::unique_ptr<ElementStream> stream, std::vector<std::int64_t> sizes, int local)
      : rows_(std::move(stream), "distribute_dataset"), sizes_(std::move(sizes)), local_(local) {}
  LocalStep next() override {
    const bool any = rows_.fill(1);
    if (!spec.known && rows_.layout() != nullptr) spec = spec_of(*rows_.layout());
    if (!any) return std::nullopt;
    std::vector<Element> out;
    for (int i = 0; i < local_; ++i) {
      rows_.fill(sizes_[next_]);
      out.push_back(rows_.take(std::min(sizes_[next_], rows_.buffered())));
      next_ = (next_ + 1) % sizes_.size();
    }
    rows_taken = rows_.taken();
    return out;
  }
  ProducerKind kind() const override { return ProducerKind::kRows; }
  void save(StateWriter& w) override {
    w.u8(static_cast<std::uint8_t>(kind()));
    w.u64(next_);
    rows_.save(w);  // taken, layout, buffered rows, input: read_continuation's order
  }
  void resume(Continuation c, StateReader& r) override {
    if (c.cycle >= sizes_.size())
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved distributed iterator state has split position ", c.cycle,
                   " of ", sizes_.size());
    next_ = c.cycle;
    rows_.resume(std::move(c.batches), std::move(c.layout), c.taken, r);
  }

 private:
  RowQueue rows_;
  std::vector<std::int64_t> sizes_;
  int local_;
  std::size_t next_ = 0;
};

// distribute_datasets_from_function: every local replica pulls one element
// (already a per-replica batch) from its stream; PER_WORKER shares one
// stream among the local replicas.
class FunctionProducer : public StepProducer {
 public:
  FunctionProducer(std::vector<std::unique_ptr<ElementStream>> streams, int local)
      : streams_(std::move(streams)), local_(local), done_(streams_.size(), false) {}
  LocalStep next() override {
    std::vector<std::optional<Element>> got(static_cast<std::size_t>(local_));
    bool any = false;
    for (int i = 0; i < local_; ++i) {
      const std::size_t s = streams_.size() == 1 ? 0 : static_cast<std::size_t>(i);
      if (done_[s]) continue;
      got[i] = streams_[s]->next();
      if (!got[i]) {
        done_[s] = true;
        continue;
      }
      if (!spec.known) spec = spec_of(*got[i]);
      any = true;
    }
    if (!any) return std::nullopt;
    std::vector<Element> out;
    for (auto& g : got) out.push_back(g ? std::move(*g) : empty_like(spec));
    return out;
  }
  ProducerKind kind() const override { return ProducerKind::kFunction; }
  void save(StateWriter& w) override {
    w.u8(static_cast<std::uint8_t>(kind()));
    w.u64(streams_.size());
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      w.boolean(done_[i]);
      streams_[i]->save(w);
    }
  }
  void resume(Continuation, StateReader& r) override {
    const std::uint64_t n = r.u64();
    if (n != streams_.size())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the saved distributed iterator state has ", n,
                   " input pipelines on this worker but this one has ", streams_.size(),
                   "; restore with the same InputReplicationMode and replicas");
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      done_[i] = r.boolean();
      streams_[i]->restore(r);
    }
  }

 private:
  std::vector<std::unique_ptr<ElementStream>> streams_;
  int local_;
  std::vector<bool> done_;
};

}  // namespace

// What a distributed dataset needs to open a pass.
// Each local replica's device from the strategy's worker_devices ("gpu:<n>"
// / "cuda:<n>" -> kDLCUDA; anything else, or a list of another length, is
// the host).
std::vector<DLDevice> replica_devices(const StrategyImpl& s, std::size_t local) {
  std::vector<DLDevice> out(local, DLDevice{kDLCPU, 0});
  if (s.worker_devices.size() != local) return out;
  for (std::size_t r = 0; r < local; ++r) {
    const std::string& d = s.worker_devices[r];
    if (d.rfind("gpu:", 0) != 0 && d.rfind("cuda:", 0) != 0) continue;
    try {
      out[r] = parse_device(d);
    } catch (const Error&) {
      // Not a device name Strata knows: leave the batch on the host.
    }
  }
  return out;
}

struct DistributedDatasetImpl {
  std::shared_ptr<StrategyImpl> strategy;
  InputOptions options;
  std::string policy;  // "FILE", "DATA", "OFF", "HINT", "FUNCTION"
  std::string reason;
  std::atomic<std::int64_t> passes{0};
  // Opens the producer of pass `pass`.
  std::function<std::unique_ptr<StepProducer>(std::int64_t pass)> open;
  // For iterator states: the recipe (of every pipeline, for
  // distribute_datasets_from_function) and the global batch size.
  std::vector<std::string> recipe;
  std::int64_t global_batch = 0;
};

// The input thread and its bounded queue of local steps. The thread owns
// its state through a shared_ptr, so that if it is stuck in a user callback
// when the iterator goes away it can be left to finish on its own. It
// starts on the first next(), so that a fresh iterator can be restored
// before anything was read.
struct DistributedIteratorImpl {
  struct Item {
    LocalStep step;
    std::exception_ptr error;
    Spec spec;  // the producer's spec after this step
    std::optional<Element> global;  // DataShardProducer: the unsliced global batch
    std::int64_t rows_after = 0;    // RebatchProducer: rows taken after this step
    // The step's tensors already in the memory of replicas on GPUs, copied
    // by the input thread ahead of the step ([replica][component]; empty
    // for a host replica, or when nothing is on a GPU). `step` keeps the
    // host copy, which a saved state writes out.
    std::vector<std::vector<Tensor>> on_device;
  };

  struct Shared {
    std::shared_ptr<DistributedDatasetImpl> ds;
    std::int64_t pass = 0;
    std::size_t depth = 1;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    // Opened by the thread, or before it by restore_state; touched by the
    // consumer only while the thread is paused and idle (or not started).
    std::unique_ptr<StepProducer> producer;
    std::vector<DLDevice> devices;  // each local replica's device
    bool stop = false;
    bool done = false;    // the thread has returned (or is about to)
    bool paused = false;  // save_state wants the thread to hold still
    bool busy = false;    // the thread is between waits (opening or producing)

    void push(Item item) {
      {
        std::lock_guard<std::mutex> l(mu);
        queue.push_back(std::move(item));
      }
      cv.notify_all();
    }
  };

  DistributedIteratorImpl(std::shared_ptr<DistributedDatasetImpl> ds, std::int64_t pass)
      : ds_(std::move(ds)), sh_(std::make_shared<Shared>()) {
    sh_->ds = ds_;
    sh_->pass = pass;
    sh_->depth = static_cast<std::size_t>(std::max(1, ds_->options.prefetch_depth));
    sh_->devices = replica_devices(*ds_->strategy, static_cast<std::size_t>(ds_->strategy->num_local_replicas));
  }
  ~DistributedIteratorImpl() {
    if (thread_.joinable()) stop_producer(*sh_, thread_, "the distributed input thread");
  }

  void start() {
    if (started_) return;
    started_ = true;
    if (exhausted_ || ended_ || no_more_) return;  // restored past this worker's last step
    sh_->busy = true;
    thread_ = std::thread([sh = sh_] { produce(*sh); });
  }

  static void produce(Shared& sh) {
    struct MarkDone {
      Shared& sh;
      ~MarkDone() {
        {
          std::lock_guard<std::mutex> l(sh.mu);
          sh.done = true;
        }
        sh.cv.notify_all();
      }
    } mark{sh};
    if (!sh.producer) {
      try {
        std::unique_ptr<StepProducer> p = sh.ds->open(sh.pass);
        std::lock_guard<std::mutex> l(sh.mu);
        sh.producer = std::move(p);
      } catch (...) {
        sh.push(Item{std::nullopt, std::current_exception(), {}, std::nullopt, 0, {}});
        return;
      }
    }
    StepProducer& producer = *sh.producer;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(sh.mu);
        sh.busy = false;
        sh.cv.notify_all();
        sh.cv.wait(l, [&] { return sh.stop || (!sh.paused && sh.queue.size() < sh.depth); });
        if (sh.stop) return;
        sh.busy = true;
      }
      Item item;
      try {
        item.step = producer.next();
        if (item.step) item.on_device = to_devices(*item.step, sh.devices);
      } catch (...) {
        item.error = std::current_exception();
      }
      item.spec = producer.spec;
      item.global = std::exchange(producer.last_global, std::nullopt);
      item.rows_after = producer.rows_taken;
      const bool last = !item.step || item.error;
      sh.push(std::move(item));
      if (last) return;
    }
  }

  // Copies of `step`'s tensors on the GPUs of the replicas that have one
  // (prefetch to device, as tf.distribute's distributed iterators do), or
  // nothing when every replica is on the host.
  static std::vector<std::vector<Tensor>> to_devices(const std::vector<Element>& step,
                                                     const std::vector<DLDevice>& devices) {
    std::vector<std::vector<Tensor>> out;
    if (devices.size() != step.size() ||
        std::none_of(devices.begin(), devices.end(), [](const DLDevice& d) { return d.device_type == kDLCUDA; }))
      return out;
    out.resize(step.size());
    for (std::size_t r = 0; r < step.size(); ++r) {
      if (devices[r].device_type != kDLCUDA) continue;
      for (const Tensor& t : step[r].tensors) out[r].push_back(t.to(devices[r]));
    }
    return out;
  }

  // The next local step, waiting at most InputOptions::timeout_s for it.
  Item pop() {
    std::unique_lock<std::mutex> l(sh_->mu);
    const bool ready = sh_->cv.wait_for(l, wait_limit(ds_->options.timeout_s), [&] { return !sh_->queue.empty(); });
    if (!ready) {
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "the input for step ", steps_ + 1, " was not ready after ",
                   ds_->options.timeout_s, " s (policy ", ds_->policy,
                   "): the input thread is still inside the pipeline, most likely a map() or generator callback "
                   "that blocks; fix the callback, or raise InputOptions::timeout_s if the input is only slow");
    }
    Item item = std::move(sh_->queue.front());
    sh_->queue.pop_front();
    l.unlock();
    sh_->cv.notify_all();
    return item;
  }

  // Number of workers that still have data this step (this one included).
  // The same reduction says whether some worker has never seen a batch and
  // so cannot shape its empty ones; then the workers exchange the element
  // layout once (share_spec).
  std::int64_t agree(bool has_data) {
    StrategyImpl& s = *ds_->strategy;
    if (s.num_workers <= 1) return has_data ? 1 : 0;
    std::vector<Tensor> flags;
    for (int i = 0; i < s.num_local_replicas; ++i) {
      const bool first = i == 0;
      flags.push_back(Tensor::from_vector<float>(
          {first && has_data ? 1.0f : 0.0f, first && !spec_.known ? 1.0f : 0.0f}, {2}));
    }
    Strategy handle(&s, nullptr);
    Tensor sum = handle.reduce(ReduceOp::SUM, PerReplica(std::move(flags)));
    const auto live = static_cast<std::int64_t>(sum.data<float>()[0] + 0.5f);
    const bool someone_needs_spec = sum.data<float>()[1] > 0.5f;
    if (live > 0 && someone_needs_spec) share_spec(handle);
    return live;
  }

  // Every worker that knows the layout sends it; all check that the layouts
  // agree, and a worker that had none takes it.
  void share_spec(Strategy& handle) {
    StrategyImpl& s = *ds_->strategy;
    std::vector<Tensor> blobs;
    for (int i = 0; i < s.num_local_replicas; ++i) {
      // JSON text padded with NULs to whole int64 words (gather moves
      // numeric tensors; JSON never holds a raw NUL).
      std::string mine = i == 0 && spec_.known ? encode_spec(spec_, s.worker_index) : std::string();
      mine.resize((mine.size() + 7) / 8 * 8, '\0');
      blobs.push_back(Tensor::from_bytes(mine.data(), mine.size(), {static_cast<std::int64_t>(mine.size() / 8)},
                                         DType::kInt64));
    }
    Tensor all = handle.gather(PerReplica(std::move(blobs)), 0);
    std::string text(static_cast<const char*>(all.raw_data()), all.nbytes());
    text.erase(std::remove(text.begin(), text.end(), '\0'), text.end());
    std::optional<std::pair<Spec, int>> first;
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t end = text.find('\n', pos);
      auto got = decode_spec(text.substr(pos, end - pos));
      pos = end == std::string::npos ? text.size() : end + 1;
      if (!first) {
        first = std::move(got);
        continue;
      }
      STRATA_ENFORCE(same_spec(first->first, got.first), STRATA_ERR_INVALID_ARGUMENT,
                     "the workers' inputs have different element layouts: worker ", first->second, " has {",
                     describe_spec(first->first), "} but worker ", got.second, " has {", describe_spec(got.first),
                     "}; every worker must build the same dataset");
    }
    STRATA_ENFORCE(first.has_value(), STRATA_ERR_INTERNAL,
                   "no worker sent its element layout although some still have data");
    if (!spec_.known) {
      logger("data")->info("this worker's input produced no batch; its replicas get empty batches shaped like "
                           "worker {}'s: {}",
                           first->second, describe_spec(first->first));
      spec_ = std::move(first->first);
    }
  }

  std::optional<DistributedElement> next() {
    used_ = true;
    if (ended_) return std::nullopt;
    start();
    LocalStep step;
    std::vector<std::vector<Tensor>> on_device;  // the input thread's GPU copies, if any
    if (!exhausted_) {
      Item item;
      try {
        item = pop();
      } catch (...) {
        ended_ = true;
        throw;
      }
      if (item.error) {
        ended_ = true;
        std::rethrow_exception(item.error);
      }
      if (item.spec.known) spec_ = item.spec;
      step = std::move(item.step);
      on_device = std::move(item.on_device);
      if (!step) exhausted_ = true;
      consumed_rows_ = item.rows_after;
    }
    const std::int64_t live = agree(step.has_value());
    if (live == 0) {
      ended_ = true;
      STRATA_ENFORCE(steps_ > 0, STRATA_ERR_INVALID_ARGUMENT,
                     "the distributed dataset has no elements on any worker (policy ", ds_->policy,
                     "); check its files, take()/skip() counts, and drop_remainder with a batch larger than "
                     "the data");
      return std::nullopt;
    }
    ++steps_;
    const int local = ds_->strategy->num_local_replicas;
    if (!step) {
      STRATA_ENFORCE(spec_.known, STRATA_ERR_INTERNAL, "the element layout is unknown on an empty step");
      step.emplace();
      for (int i = 0; i < local; ++i) step->push_back(empty_like(spec_));
    }
    // Transpose: per component, one tensor per local replica. A replica on
    // a GPU gets its batch in that GPU's memory: copied by the input thread
    // ahead of the step, or here for an empty step made above.
    const std::vector<DLDevice> devices = replica_devices(*ds_->strategy, step->size());
    std::vector<std::string> names = (*step)[0].names;
    std::vector<PerReplica> values;
    for (std::size_t c = 0; c < names.size(); ++c) {
      std::vector<Tensor> per;
      for (std::size_t r = 0; r < step->size(); ++r) {
        Tensor& t = (*step)[r].tensors.at(c);
        if (devices[r].device_type != kDLCUDA)
          per.push_back(std::move(t));
        else if (r < on_device.size() && c < on_device[r].size())
          per.push_back(std::move(on_device[r][c]));
        else
          per.push_back(t.to(devices[r]));
      }
      values.emplace_back(std::move(per));
    }
    return DistributedElement(std::move(names), std::move(values));
  }

  // ------------------------------------------------------------ state ---
  //
  // A worker's state is its position after the steps the user got from
  // next(): the input thread is paused between two steps and the steps it
  // prepared ahead are stored in the state (under DATA, worker 0's state
  // also holds their unsliced global batches, so that another worker count
  // can continue from it), followed by the producer's own position. The thread
  // is paused, not stopped, so saving costs no read-ahead.

  std::string save_state() {
    StrategyImpl& s = *ds_->strategy;
    StateWriter w;
    w.strings(ds_->recipe);
    w.str(ds_->policy);
    w.i64(s.num_workers);
    w.i64(s.worker_index);
    w.i64(s.num_local_replicas);
    w.i64(ds_->global_batch);
    w.i64(sh_->pass);
    w.i64(steps_);
    w.boolean(exhausted_);
    w.boolean(ended_);
    w.str(spec_.known ? encode_spec(spec_, s.worker_index) : std::string());
    w.i64(consumed_rows_);
    if (!started_ || !thread_.joinable()) {
      // Not started (or restored past the end): nothing runs ahead.
      write_queue(w, sh_->queue);
      write_producer(w, sh_->producer.get());
      return w.seal(kStateKind);
    }
    std::unique_lock<std::mutex> l(sh_->mu);
    sh_->paused = true;
    struct Resume {
      Shared& sh;
      ~Resume() {
        {
          std::lock_guard<std::mutex> g(sh.mu);
          sh.paused = false;
        }
        sh.cv.notify_all();
      }
    };
    const bool idle =
        sh_->cv.wait_for(l, wait_limit(ds_->options.timeout_s), [&] { return !sh_->busy || sh_->done; });
    l.unlock();
    Resume resume{*sh_};
    if (!idle)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "DistributedIterator::save_state: the input thread did not finish "
                   "its step within ", ds_->options.timeout_s, " s (policy ", ds_->policy,
                   "), so the position cannot be taken; a map() or generator callback may block "
                   "(InputOptions::timeout_s)");
    for (const Item& item : sh_->queue)
      if (item.error) {
        try {
          std::rethrow_exception(item.error);
        } catch (const std::exception& e) {
          STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "DistributedIterator::save_state: the input read ahead of "
                       "the steps consumed failed (", e.what(), "), so no position past them can be saved");
        }
      }
    write_queue(w, sh_->queue);
    write_producer(w, sh_->producer.get());
    return w.seal(kStateKind);
  }

  static void write_queue(StateWriter& w, const std::deque<Item>& queue) {
    w.u64(queue.size());
    for (const Item& item : queue) {
      w.boolean(item.step.has_value());
      if (item.step) {
        w.u64(item.step->size());
        for (const Element& e : *item.step) w.element(e);
      }
      w.boolean(item.global.has_value());
      if (item.global) w.element(*item.global);
      w.i64(item.rows_after);
    }
  }

  static void write_producer(StateWriter& w, StepProducer* p) {
    w.boolean(p != nullptr);
    if (p != nullptr) p->save(w);
  }

  void restore_state(const std::vector<std::string>& states) {
    StrategyImpl& s = *ds_->strategy;
    STRATA_ENFORCE(!used_, STRATA_ERR_FAILED_PRECONDITION,
                   "DistributedIterator::restore_state on an iterator that next() was already called on; restore "
                   "into a fresh iterator (DistributedDataset::make_iterator) before reading from it");
    STRATA_ENFORCE(!states.empty(), STRATA_ERR_INVALID_ARGUMENT,
                   "DistributedIterator::restore_state: no states; pass the states every worker saved, in "
                   "worker-index order");
    const int saved_workers = static_cast<int>(states.size());
    const bool same_count = saved_workers == s.num_workers;
    const std::size_t pick = same_count ? static_cast<std::size_t>(s.worker_index) : 0;
    StateReader r(states[pick], kStateKind);
    check_same_recipe(r.strings(), ds_->recipe, "DistributedIterator");
    const std::string policy = r.str();
    const std::int64_t workers = r.i64(), index = r.i64(), local = r.i64(), global = r.i64();
    const std::int64_t pass = r.i64();
    const std::int64_t steps = r.i64();
    const bool exhausted = r.boolean(), ended = r.boolean();
    const std::string spec_text = r.str();
    const std::int64_t consumed_rows = r.i64();
    STRATA_ENFORCE(workers == saved_workers, STRATA_ERR_INVALID_ARGUMENT,
                   "DistributedIterator::restore_state: got ", saved_workers, " states but they were saved by ",
                   workers, " workers; pass every worker's state, in worker-index order");
    STRATA_ENFORCE(index == static_cast<std::int64_t>(pick), STRATA_ERR_INVALID_ARGUMENT,
                   "DistributedIterator::restore_state: states_by_worker[", pick, "] was saved by worker ", index,
                   "; pass the states in worker-index order");
    STRATA_ENFORCE(global == ds_->global_batch, STRATA_ERR_INVALID_ARGUMENT,
                   "DistributedIterator::restore_state: the state was saved with global batch ", global,
                   " but this dataset's is ", ds_->global_batch);
    STRATA_ENFORCE(pass >= 0 && steps >= 0, STRATA_ERR_DATA_LOSS,
                   "the saved DistributedIterator state has pass ", pass, " and step ", steps);
    const bool same_topology = same_count && local == s.num_local_replicas;
    const auto continues_globally = [](const std::string& p) { return p == "DATA" || p == "OFF"; };
    if (same_topology) {
      STRATA_ENFORCE(policy == ds_->policy, STRATA_ERR_INVALID_ARGUMENT,
                     "DistributedIterator::restore_state: the state was saved under AutoShardPolicy ", policy,
                     " but this dataset applies ", ds_->policy, "; distribute the same dataset with the same policy");
    } else if (!continues_globally(policy) || !continues_globally(ds_->policy)) {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "DistributedIterator::restore_state: the state was saved by ",
                   workers, " worker(s) of ", local, " replica(s) under AutoShardPolicy ", policy,
                   " but this job has ", s.num_workers, " worker(s) of ", s.num_local_replicas,
                   " replica(s) and applies ", ds_->policy, "; only DATA and OFF read one global stream that "
                   "continues on another worker count. Restore with the same worker count, or restore without "
                   "the iterator to restart the input from the beginning");
    }
    // Queued steps, then the producer.
    std::deque<Item> queue;
    const std::uint64_t n = r.count(3);
    for (std::uint64_t i = 0; i < n; ++i) {
      Item item;
      if (r.boolean()) {
        item.step.emplace();
        const std::uint64_t k = r.count(8);
        for (std::uint64_t j = 0; j < k; ++j) item.step->push_back(r.element());
      }
      if (r.boolean()) item.global = r.element();
      item.rows_after = r.i64();
      queue.push_back(std::move(item));
    }
    std::unique_ptr<StepProducer> producer;
    std::int64_t rows_taken = consumed_rows;
    if (r.boolean()) {
      const auto kind = static_cast<ProducerKind>(r.u8());
      STRATA_ENFORCE(kind == ProducerKind::kData || kind == ProducerKind::kRows || kind == ProducerKind::kFunction,
                     STRATA_ERR_DATA_LOSS, "the saved DistributedIterator state has producer kind ",
                     static_cast<int>(kind));
      producer = ds_->open(pass);
      Continuation c;
      if (kind != ProducerKind::kFunction) c = read_continuation(r, kind);
      if (same_topology) {
        STRATA_ENFORCE(kind == producer->kind(), STRATA_ERR_INVALID_ARGUMENT,
                       "DistributedIterator::restore_state: the state's input split differs from this dataset's; "
                       "distribute the same dataset with the same policy");
      } else {
        c = continue_globally(std::move(c), kind, producer->kind(), queue, consumed_rows, policy, workers, local);
        queue.clear();
        rows_taken = c.taken;
      }
      producer->resume(std::move(c), r);
    }
    r.expect_end();
    Spec spec;
    if (!spec_text.empty()) spec = decode_spec(spec_text).first;
    if (producer && spec.known) producer->spec = spec;
    // Commit.
    sh_->pass = pass;
    sh_->queue = std::move(queue);
    sh_->producer = std::move(producer);
    no_more_ = false;  // without a producer (saved before it opened) the thread opens one
    for (const Item& item : sh_->queue)
      if (!item.step) no_more_ = true;
    spec_ = spec;
    steps_ = steps;
    exhausted_ = exhausted;
    ended_ = ended;
    consumed_rows_ = rows_taken;
    std::int64_t cur = ds_->passes.load();
    while (cur < pass + 1 && !ds_->passes.compare_exchange_weak(cur, pass + 1)) {
    }
  }

  // The saved worker's unconsumed data re-expressed for a producer of
  // another topology: the global batches (DATA) or rows (OFF, one worker)
  // still to come, ahead of its input.
  Continuation continue_globally(Continuation c, ProducerKind saved, ProducerKind mine, const std::deque<Item>& queue,
                                 std::int64_t consumed_rows, const std::string& policy, std::int64_t workers,
                                 std::int64_t local) {
    std::vector<Element> ahead;
    for (const Item& item : queue) {
      if (!item.step) break;
      if (saved == ProducerKind::kData) {
        STRATA_ENFORCE(item.global.has_value(), STRATA_ERR_INVALID_ARGUMENT,
                       "the saved DistributedIterator state lacks a queued step's global batch (only worker 0's "
                       "state has them); pass every worker's state in worker-index order");
        ahead.push_back(item.global->clone());
      } else {
        for (const Element& e : *item.step)
          if (rows_of(e) > 0) ahead.push_back(e.clone());
      }
    }
    for (Element& e : c.batches) ahead.push_back(std::move(e));
    Continuation out;
    out.layout = std::move(c.layout);
    // Rows of the original stream handed out so far (a global-batch
    // boundary when the saved split was DATA's).
    out.taken = saved == ProducerKind::kRows ? consumed_rows : 0;
    if (mine == ProducerKind::kRows) {  // rows in order; the new split starts its cycle
      out.batches = std::move(ahead);
      return out;
    }
    if (saved == ProducerKind::kData) {  // global batches as they were
      out.batches = std::move(ahead);
      return out;
    }
    // A row stream continued as global batches: only where the saved
    // worker stood on a global-batch boundary.
    const std::int64_t g = ds_->global_batch;
    if (g <= 0 || consumed_rows % g != 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "DistributedIterator::restore_state: the state was saved by ",
                   workers, " worker(s) of ", local, " replica(s) under ", policy, " in the middle of a global batch (",
                   consumed_rows, " rows consumed, global batch ", g, "), which ", ds_->policy, " on ",
                   ds_->strategy->num_workers,
                   " workers cannot continue exactly; restore with the same worker count, or restore without the "
                   "iterator to restart the input from the beginning");
    std::vector<Element> batches;
    RowQueue rows(nullptr, "restore_state");
    rows.prepend(std::move(ahead));
    while (rows.buffered() > 0) batches.push_back(rows.take(std::min(g, rows.buffered())));
    out.batches = std::move(batches);
    return out;
  }

  static constexpr const char* kStateKind = "DistributedIterator";

  std::shared_ptr<DistributedDatasetImpl> ds_;
  std::shared_ptr<Shared> sh_;
  std::thread thread_;
  Spec spec_;
  bool started_ = false;
  bool used_ = false;      // next() was called: restore_state is refused
  bool no_more_ = false;   // restored with this worker's end already queued
  bool exhausted_ = false;
  bool ended_ = false;
  std::int64_t steps_ = 0;
  std::int64_t consumed_rows_ = 0;  // rows of this worker's stream in the steps consumed (RebatchProducer)
};

namespace {

void check_input_options(const InputOptions& options) {
  STRATA_ENFORCE(options.prefetch_depth >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "InputOptions::prefetch_depth must be at least 1, got ", options.prefetch_depth);
  STRATA_ENFORCE(options.timeout_s > 0, STRATA_ERR_INVALID_ARGUMENT, "InputOptions::timeout_s is ",
                 options.timeout_s, "; pass a positive number of seconds");
}

std::shared_ptr<DistributedDatasetImpl> make_distributed(StrategyImpl& s, const Dataset& ds,
                                                         const InputOptions& options) {
  check_input_options(options);
  const BatchInfo bi = batch_info(ds);
  STRATA_ENFORCE(bi.batched, STRATA_ERR_INVALID_ARGUMENT,
                 "distribute_dataset needs a dataset batched by the global batch size; call "
                 ".batch(global_batch_size) before distributing it, or use distribute_datasets_from_function "
                 "for per-replica batches");
  const int workers = s.num_workers;
  const int w = s.worker_index;
  const int local = s.num_local_replicas;
  const int replicas = s.num_replicas_in_sync;
  const InputContext ctx{workers, w, replicas};
  const AutoShardPolicy requested = ds.options().auto_shard_policy;

  auto impl = std::make_shared<DistributedDatasetImpl>();
  impl->strategy = s.shared_from_this();
  impl->options = options;
  impl->recipe = recipe_signature(ds);
  impl->global_batch = bi.batch_size;

  // Decide the policy.
  AutoShardPolicy applied = requested;
  std::string reason;
  if (requested == AutoShardPolicy::HINT) {
    reason = bi.has_shard_hint ? "shard(SHARD_HINT) placeholders become shard(num_workers, worker_index)"
                               : "HINT requested but the dataset has no shard(SHARD_HINT): every worker reads "
                                 "all of it";
  } else {
    STRATA_ENFORCE(!bi.has_shard_hint, STRATA_ERR_INVALID_ARGUMENT,
                   "the dataset uses shard(SHARD_HINT, SHARD_HINT) but its AutoShardPolicy is ",
                   auto_shard_policy_name(requested), "; set DatasetOptions::auto_shard_policy = "
                   "AutoShardPolicy::HINT or give shard() real numbers");
  }
  if (requested == AutoShardPolicy::FILE || (requested == AutoShardPolicy::AUTO && workers > 1)) {
    const SourceShardInfo info = source_shard_info(ds, ctx);
    const bool by_file = (info.flags & STRATA_INPUT_CAN_SHARD_BY_FILE) != 0;
    const auto nfiles = static_cast<std::int64_t>(info.files.size());
    if (requested == AutoShardPolicy::FILE) {
      // tf's rewrite reports a pipeline without a reader as NotFound.
      STRATA_ENFORCE(by_file, STRATA_ERR_NOT_FOUND,
                     "AutoShardPolicy::FILE needs a file-based source, but this dataset has no reader to shard by "
                     "file: ", info.not_file_based, "; use AutoShardPolicy::DATA (or AUTO)");
      STRATA_ENFORCE(nfiles >= workers, STRATA_ERR_INVALID_ARGUMENT, "AutoShardPolicy::FILE needs at least ",
                     workers, " files (one per worker) but the dataset has ", nfiles,
                     "; split the data into more files or use AutoShardPolicy::DATA");
      reason = std::to_string(nfiles) + " files over " + std::to_string(workers) + " workers";
    } else if (by_file && nfiles >= workers) {
      applied = AutoShardPolicy::FILE;
      reason = "AUTO: the source is file-based with " + std::to_string(nfiles) + " files for " +
               std::to_string(workers) + " workers";
    } else {
      applied = AutoShardPolicy::DATA;
      reason = by_file ? "AUTO: only " + std::to_string(nfiles) + " files for " + std::to_string(workers) +
                             " workers, so every worker reads all data and keeps its share"
                       : "AUTO: the source is not file-based (" + info.not_file_based +
                             "), so every worker reads all data and keeps its share";
    }
  } else if (requested == AutoShardPolicy::AUTO) {
    applied = AutoShardPolicy::OFF;
    reason = "AUTO: a single worker needs no sharding";
  } else if (requested == AutoShardPolicy::DATA) {
    reason = "every worker reads all data and keeps its replicas' rows of each global batch";
  } else if (requested == AutoShardPolicy::OFF) {
    reason = workers > 1 ? "OFF: every worker reads all data (elements repeat across workers)" : "OFF";
  }
  impl->policy = auto_shard_policy_name(applied);
  impl->reason = reason;
  logger("data")->info("distribute_dataset: worker {} of {}: applied AutoShardPolicy {} ({}); global batch {}{}",
                       w, workers, impl->policy, reason, bi.batch_size,
                       bi.drop_remainder ? " with drop_remainder" : "");

  if (workers > 1 && applied == AutoShardPolicy::DATA) {
    impl->open = [ds, ctx, workers, w, local](std::int64_t pass) -> std::unique_ptr<StepProducer> {
      StreamRequest req;
      req.pass = pass;
      req.hint = std::make_pair(std::int64_t{1}, std::int64_t{0});
      return std::make_unique<DataShardProducer>(open_stream(ds, ctx, req), workers, w, local);
    };
    return impl;
  }
  StreamRequest base;
  if (workers > 1 && applied == AutoShardPolicy::FILE) {
    base.source_policy = STRATA_SHARD_FILE;
    base.num_shards = workers;
    base.index = w;
  }
  const bool hint = workers > 1 && applied == AutoShardPolicy::HINT;
  base.hint = std::make_pair(std::int64_t{hint ? workers : 1}, std::int64_t{hint ? w : 0});
  const std::vector<std::int64_t> sizes = rebatch_sizes(bi.batch_size, workers, local, w);
  impl->open = [ds, ctx, base, sizes, local](std::int64_t pass) -> std::unique_ptr<StepProducer> {
    StreamRequest req = base;
    req.pass = pass;
    return std::make_unique<RebatchProducer>(open_stream(ds, ctx, req), sizes, local);
  };
  return impl;
}

std::shared_ptr<DistributedDatasetImpl> make_from_function(StrategyImpl& s,
                                                           const std::function<Dataset(const InputContext&)>& fn,
                                                           const InputOptions& options) {
  check_input_options(options);
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_INVALID_ARGUMENT,
                 "distribute_datasets_from_function needs a dataset function");
  auto impl = std::make_shared<DistributedDatasetImpl>();
  impl->strategy = s.shared_from_this();
  impl->options = options;
  impl->policy = "FUNCTION";
  const int local = s.num_local_replicas;
  std::vector<std::pair<InputContext, Dataset>> pipelines;
  if (options.experimental_replication_mode == InputReplicationMode::PER_WORKER) {
    const InputContext ctx{s.num_workers, s.worker_index, s.num_replicas_in_sync};
    pipelines.emplace_back(ctx, fn(ctx));
    impl->reason = "one pipeline per worker (" + std::to_string(s.num_workers) + "), each feeding " +
                   std::to_string(local) + " local replicas";
  } else {
    for (int i = 0; i < local; ++i) {
      const InputContext ctx{s.num_replicas_in_sync, s.replica_ids.at(static_cast<std::size_t>(i)),
                             s.num_replicas_in_sync};
      pipelines.emplace_back(ctx, fn(ctx));
    }
    impl->reason = "one pipeline per replica (" + std::to_string(s.num_replicas_in_sync) + ")";
  }
  logger("data")->info("distribute_datasets_from_function: worker {} of {}: {}", s.worker_index, s.num_workers,
                       impl->reason);
  for (const auto& [ctx, ds] : pipelines) {
    impl->recipe.push_back(str_cat("pipeline ", ctx.input_pipeline_id, " of ", ctx.num_input_pipelines, ":"));
    for (std::string& line : recipe_signature(ds)) impl->recipe.push_back(std::move(line));
  }
  impl->open = [pipelines, local](std::int64_t pass) -> std::unique_ptr<StepProducer> {
    std::vector<std::unique_ptr<ElementStream>> streams;
    for (const auto& [ctx, ds] : pipelines) {
      StreamRequest req;
      req.pass = pass;
      streams.push_back(open_stream(ds, ctx, req));
    }
    return std::make_unique<FunctionProducer>(std::move(streams), local);
  };
  return impl;
}

}  // namespace
}  // namespace detail

// ----------------------------------------------------------- iterator ---

DistributedIterator::DistributedIterator() = default;
DistributedIterator::DistributedIterator(std::unique_ptr<detail::DistributedIteratorImpl> impl)
    : impl_(std::move(impl)) {}
DistributedIterator::DistributedIterator(DistributedIterator&&) noexcept = default;
DistributedIterator& DistributedIterator::operator=(DistributedIterator&&) noexcept = default;
DistributedIterator::~DistributedIterator() = default;

std::optional<DistributedElement> DistributedIterator::get_next_as_optional() {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "this DistributedIterator is empty (moved from); make one with DistributedDataset::make_iterator");
  detail::require_cross_replica(*impl_->ds_->strategy, "DistributedIterator::next");
  return impl_->next();
}

DistributedElement DistributedIterator::next() {
  auto e = get_next_as_optional();
  STRATA_ENFORCE(e.has_value(), STRATA_ERR_OUT_OF_RANGE,
                 "end of the distributed dataset: every worker's input is exhausted; make a new iterator for "
                 "another epoch");
  return std::move(*e);
}

std::string DistributedIterator::save_state() {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "this DistributedIterator is empty (moved from); make one with DistributedDataset::make_iterator");
  detail::require_cross_replica(*impl_->ds_->strategy, "DistributedIterator::save_state");
  return impl_->save_state();
}

void DistributedIterator::restore_state(const std::vector<std::string>& states_by_worker) {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "this DistributedIterator is empty (moved from); make one with DistributedDataset::make_iterator");
  detail::require_cross_replica(*impl_->ds_->strategy, "DistributedIterator::restore_state");
  impl_->restore_state(states_by_worker);
}

DistributedIterator::RangeIter::RangeIter(DistributedIterator* it) : it_(it) { cur_ = it_->get_next_as_optional(); }

DistributedIterator::RangeIter& DistributedIterator::RangeIter::operator++() {
  cur_ = it_->get_next_as_optional();
  return *this;
}

// ------------------------------------------------------------ dataset ---

DistributedDataset::DistributedDataset(std::shared_ptr<detail::DistributedDatasetImpl> impl)
    : impl_(std::move(impl)) {}
DistributedDataset::DistributedDataset(DistributedDataset&&) noexcept = default;
DistributedDataset& DistributedDataset::operator=(DistributedDataset&&) noexcept = default;
DistributedDataset::~DistributedDataset() = default;

DistributedIterator DistributedDataset::make_iterator() const {
  const std::int64_t pass = impl_->passes.fetch_add(1);
  return DistributedIterator(std::make_unique<detail::DistributedIteratorImpl>(impl_, pass));
}

DistributedIterator::RangeIter DistributedDataset::begin() {
  range_.reset();  // end the previous pass's input thread first
  range_.emplace(make_iterator());
  return DistributedIterator::RangeIter(&*range_);
}

const std::string& DistributedDataset::applied_policy() const { return impl_->policy; }
const std::string& DistributedDataset::policy_reason() const { return impl_->reason; }

// ----------------------------------------------------------- strategy ---

DistributedDataset Strategy::distribute_dataset(const Dataset& dataset) {
  return distribute_dataset(dataset, InputOptions{});
}

DistributedDataset Strategy::distribute_dataset(const Dataset& dataset, const InputOptions& options) {
  return DistributedDataset(detail::make_distributed(*checked(), dataset, options));
}

DistributedDataset Strategy::distribute_datasets_from_function(
    const std::function<Dataset(const InputContext&)>& fn) {
  return distribute_datasets_from_function(fn, InputOptions{});
}

DistributedDataset Strategy::distribute_datasets_from_function(
    const std::function<Dataset(const InputContext&)>& fn, const InputOptions& options) {
  return DistributedDataset(detail::make_from_function(*checked(), fn, options));
}

}  // namespace strata
