// SPDX-License-Identifier: Apache-2.0
// ClusterCoordinator, RemoteValue and RemoteVariable. One dispatcher thread
// per worker takes closures from the shared queue and runs them on its
// worker through a dedicated connection (one closure at a time per worker);
// a monitor thread pings every server through separate control connections,
// so that servers know the coordinator lives and the coordinator learns of a
// dead ps task even while no closure touches it.
#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "api/kernels.h"
#include "log.h"
#include "ps/ps_internal.h"

namespace strata {
namespace ps_detail {

void set_current_coordinator(const std::shared_ptr<CoordinatorCore>& core);

class CoordinatorCore : public std::enable_shared_from_this<CoordinatorCore> {
 public:
  CoordinatorCore(std::shared_ptr<Runtime> rt, CoordinatorOptions opt)
      : rt_(std::move(rt)), opt_(opt), placer_(std::max(1, rt_->count("ps"))) {}

  void start() {
    rt_->set_op_timeout_ms(static_cast<std::int64_t>(opt_.op_timeout_s * 1000));
    if (opt_.ps_grace_s >= 0) rt_->set_ps_grace_ms(static_cast<std::int64_t>(opt_.ps_grace_s * 1000));
    num_workers_ = rt_->count("worker");
    num_ps_ = rt_->count("ps");
    STRATA_ENFORCE(num_ps_ >= 1, STRATA_ERR_INVALID_ARGUMENT,
                   "ClusterCoordinator needs at least one \"ps\" task in the cluster; add \"ps\": [\"host:port\"]");
    for (int p = 0; p < num_ps_; ++p) rt_->ps_channel(p);
    for (int w = 0; w < num_workers_; ++w) workers_.push_back(std::make_unique<Worker>());
    for (int w = 0; w < num_workers_; ++w) {
      Worker& wk = *workers_[static_cast<std::size_t>(w)];
      json hello;
      wk.dispatch = rt_->connect("worker", w, rt_->job(), rt_->rendezvous_ms(), &hello);
      wk.control = rt_->connect("worker", w, rt_->job(), rt_->rendezvous_ms());
      for (const auto& f : hello.value("functions", json::array())) functions_.insert(f.get<std::string>());
      for (const auto& f : hello.value("dataset_functions", json::array()))
        dataset_functions_.insert(f.get<std::string>());
      wk.incarnation = hello.value("incarnation", std::string());
    }
    auto self = shared_from_this();
    for (int w = 0; w < num_workers_; ++w) threads_.emplace_back([self, w] { self->dispatch_loop(w); });
    threads_.emplace_back([self] { self->monitor_loop(); });
    detail::logger("ps")->info("coordinator: {} workers, {} ps tasks; functions: {}", num_workers_, num_ps_,
                               json(std::vector<std::string>(functions_.begin(), functions_.end())).dump());
  }

  void shutdown() {
    const bool stop_servers = opt_.stop_servers_on_exit;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (shut_) return;
      shut_ = true;
      shutting_down_ = true;
      for (auto& c : queue_) finish(*c, RemoteValueStatus::kAborted, STRATA_ERR_CANCELLED,
                                    "cancelled: the ClusterCoordinator was destroyed");
      queue_.clear();
      for (auto& w : workers_) {
        for (auto& c : w->own)
          finish(*c, RemoteValueStatus::kAborted, STRATA_ERR_CANCELLED, "cancelled: the ClusterCoordinator was destroyed");
        w->own.clear();
      }
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    // Dispatch channels close (saying goodbye) before the workers are told
    // to stop, so that no worker is still reading one when it closes.
    for (auto& w : workers_) w->dispatch.reset();
    if (stop_servers) this->stop_servers();
    for (auto& w : workers_) {
      std::lock_guard<std::mutex> l(w->control_mu);
      w->control.reset();
    }
  }

  void stop_servers() {
    const std::int64_t t = std::min<std::int64_t>(rt_->op_timeout_ms(), 5000);
    for (int w = 0; w < num_workers_; ++w) {
      auto& wk = *workers_[static_cast<std::size_t>(w)];
      std::lock_guard<std::mutex> l(wk.control_mu);
      try {
        if (wk.control && !wk.control->broken()) wk.control->call(kStop, "", t);
      } catch (const std::exception& e) {
        detail::logger("ps")->info("stopping worker task {}: {}", w, e.what());
      }
    }
    for (int p = 0; p < num_ps_; ++p) {
      try {
        rt_->ps_call(p, kStop, "");
      } catch (const std::exception& e) {
        detail::logger("ps")->info("stopping ps task {}: {}", p, e.what());
      }
    }
  }

  RemoteVariable create_variable(const std::string& name, const Tensor& initial, const Partitioner& partitioner) {
    STRATA_ENFORCE(initial.defined(), STRATA_ERR_INVALID_ARGUMENT, "variable '", name,
                   "' needs an initial value");
    raise_ps_failure();
    const auto shape = initial.shape();
    const VariablePartition part = partition_variable(shape, initial.dtype(), partitioner);
    auto info = std::make_shared<VariableInfo>();
    info->name = name;
    info->dtype = initial.dtype();
    info->shape = shape;
    info->sharded = part.sharded;
    std::vector<int> where;
    {
      std::lock_guard<std::mutex> l(var_mu_);  // consecutive slots and ids per variable
      where = part.sharded ? placer_.place_shards(part.layout.num_shards()) : std::vector<int>{placer_.place()};
      for (std::size_t i = 0; i < where.size(); ++i) {
        ShardRef s;
        s.ps = where[i];
        s.id = next_var_id_++;
        s.row_offset = part.layout.shards[i].row_offset;
        s.shape = part.layout.shards[i].shape;
        info->shards.push_back(s);
      }
    }
    const Tensor contiguous = Tensor::copy_of(TensorView(initial));
    const std::size_t row_bytes =
        shape.empty() || shape[0] == 0 ? contiguous.nbytes() : contiguous.nbytes() / static_cast<std::size_t>(shape[0]);
    for (const auto& s : info->shards) {
      const std::size_t rows = s.shape.empty() ? 1 : static_cast<std::size_t>(s.shape[0]);
      const char* base = static_cast<const char*>(contiguous.raw_data()) +
                         (shape.empty() ? 0 : static_cast<std::size_t>(s.row_offset) * row_bytes);
      const Tensor piece = Tensor::from_bytes(base, shape.empty() ? contiguous.nbytes() : rows * row_bytes, s.shape,
                                              initial.dtype());
      Writer w;
      w.u64(s.id);
      w.tensor(piece);
      rt_->ps_call(s.ps, kVarCreate, w.take());
    }
    return RemoteVariable(info);
  }

  RemoteValue schedule(const std::string& fn, Args args) {
    raise_pending_error();
    if (functions_.count(fn) == 0) {
      STRATA_THROW(STRATA_ERR_NOT_FOUND, "no worker has a function named '", fn, "' (the workers register: ",
                   json(std::vector<std::string>(functions_.begin(), functions_.end())).dump(),
                   "); register it with STRATA_REGISTER_FUNCTION in the program the workers run");
    }
    auto c = std::make_shared<ClosureState>();
    c->fn = fn;
    c->fetch_timeout_s = opt_.join_timeout_s;
    c->coordinator = weak_from_this();
    Writer w;
    {
      std::lock_guard<std::mutex> l(mu_);
      c->id = next_closure_++;
    }
    w.u64(c->id);
    w.str(fn);
    w.u64(args.size());
    for (const auto& a : args) w.value(a);
    c->args = w.take();
    {
      std::lock_guard<std::mutex> l(mu_);
      STRATA_ENFORCE(!shutting_down_, STRATA_ERR_FAILED_PRECONDITION, "the ClusterCoordinator is shutting down");
      queue_.push_back(c);
    }
    cv_.notify_all();
    return RemoteValue(c);
  }

  void join() {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(opt_.join_timeout_s * 1000));
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      raise_pending_error_locked(l);
      raise_ps_failure();
      if (idle_locked()) return;
      if (Clock::now() >= deadline) {
        std::string dead;
        for (int w = 0; w < num_workers_; ++w)
          if (!workers_[static_cast<std::size_t>(w)]->alive) dead += " " + std::to_string(w);
        STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "join(): ", queue_.size(), " closure(s) queued and ", inflight_,
                     " running after ", opt_.join_timeout_s, " s; workers unreachable:",
                     dead.empty() ? " none" : dead, " (raise CoordinatorOptions::join_timeout_s or start workers)");
      }
      cv_.wait_for(l, std::chrono::milliseconds(100));
    }
  }

  bool done() {
    std::unique_lock<std::mutex> l(mu_);
    raise_pending_error_locked(l);
    raise_ps_failure();
    return idle_locked();
  }

  // A value computed on every worker (kPerWorkerCreate): one closure per
  // worker, queued on that worker ahead of the shared queue and kept to be
  // run again when the worker restarts.
  PerWorkerValues create_per_worker(PerWorkerKind kind, const std::string& fn, std::uint64_t parent, Args args) {
    raise_pending_error();
    if (kind == PerWorkerKind::kValue && functions_.count(fn) == 0)
      STRATA_THROW(STRATA_ERR_NOT_FOUND, "no worker has a function named '", fn, "' (the workers register: ",
                   json(std::vector<std::string>(functions_.begin(), functions_.end())).dump(),
                   "); register it with STRATA_REGISTER_FUNCTION in the program the workers run");
    if (kind == PerWorkerKind::kDataset && dataset_functions_.count(fn) == 0)
      STRATA_THROW(STRATA_ERR_NOT_FOUND, "no worker has a dataset function named '", fn,
                   "' (the workers register: ",
                   json(std::vector<std::string>(dataset_functions_.begin(), dataset_functions_.end())).dump(),
                   "); register it with STRATA_REGISTER_DATASET_FN in the program the workers run");
    PerWorkerRef ref;
    ref.kind = kind;
    {
      std::lock_guard<std::mutex> l(mu_);
      ref.id = next_resource_++;
    }
    Writer w;
    w.u64(ref.id);
    w.u8(static_cast<std::uint8_t>(kind));
    w.str(fn);
    w.u64(parent);
    w.u64(args.size());
    for (const auto& a : args) w.value(a);
    const std::string payload = w.take();
    std::vector<RemoteValue> values;
    {
      std::lock_guard<std::mutex> l(mu_);
      STRATA_ENFORCE(!shutting_down_, STRATA_ERR_FAILED_PRECONDITION, "the ClusterCoordinator is shutting down");
      for (auto& wk : workers_) {
        auto c = std::make_shared<ClosureState>();
        c->id = next_closure_++;
        c->fn = kind == PerWorkerKind::kIterator ? detail::str_cat("iterator of per-worker dataset ", parent) : fn;
        c->kind = kPerWorkerCreate;
        c->args = payload;
        c->fetch_timeout_s = opt_.join_timeout_s;
        c->coordinator = weak_from_this();
        wk->own.push_back(c);
        wk->resources.push_back(c);
        values.emplace_back(c);
      }
    }
    cv_.notify_all();
    return PerWorkerValues(ref, std::move(values), weak_from_this());
  }

  void raise_ps_failure() {
    std::string msg;
    {
      std::lock_guard<std::mutex> l(ps_mu_);
      msg = ps_error_;
    }
    if (!msg.empty()) detail::throw_status(STRATA_ERR_UNAVAILABLE, msg);
  }

  int num_workers() const { return num_workers_; }
  int num_ps() const { return num_ps_; }

 private:
  struct Worker {
    std::unique_ptr<Channel> dispatch;
    std::unique_ptr<Channel> control;
    std::mutex control_mu;
    bool alive = true;  // guarded by mu_
    // Per-worker value closures: queued for this worker only (guarded by
    // mu_), and all of them, in creation order, to run again when the
    // worker comes back as a new incarnation (a restarted process).
    std::deque<std::shared_ptr<ClosureState>> own;
    std::vector<std::shared_ptr<ClosureState>> resources;
    std::string incarnation;  // dispatch thread only
  };

  bool idle_locked() const {
    if (!queue_.empty() || inflight_ != 0) return false;
    for (const auto& w : workers_)
      if (w->alive && !w->own.empty()) return false;  // a dead worker's values wait for its return
    return true;
  }

  static void finish(ClosureState& c, RemoteValueStatus st, strata_status_t code, const std::string& msg,
                     Value result = Value()) {
    {
      std::lock_guard<std::mutex> l(c.mu);
      c.status = st;
      c.error_code = code;
      c.error = msg;
      c.result = std::move(result);
    }
    c.cv.notify_all();
  }

  void raise_pending_error() {
    std::unique_lock<std::mutex> l(mu_);
    raise_pending_error_locked(l);
  }
  void raise_pending_error_locked(std::unique_lock<std::mutex>&) {
    if (pending_code_ == STRATA_OK) return;
    const strata_status_t code = std::exchange(pending_code_, STRATA_OK);
    const std::string msg = std::move(pending_error_);
    pending_error_.clear();
    detail::throw_status(code, msg);
  }

  void dispatch_loop(int w) {
    Worker& wk = *workers_[static_cast<std::size_t>(w)];
    const std::string who = task_name("worker", w);
    while (!shutting_down_) {
      if (!wk.dispatch || wk.dispatch->broken()) {
        // Rejoin: a restarted worker publishes a new incarnation.
        try {
          json hello;
          auto ch = rt_->connect("worker", w, rt_->job(), 3000, &hello, &shutting_down_);
          auto ctl = rt_->connect("worker", w, rt_->job(), 3000, nullptr, &shutting_down_);
          {
            std::lock_guard<std::mutex> l(wk.control_mu);
            wk.control = std::move(ctl);
          }
          wk.dispatch = std::move(ch);
          const std::string inc = hello.value("incarnation", std::string());
          std::lock_guard<std::mutex> l(mu_);
          if (inc != wk.incarnation) {
            // A restarted worker has none of its per-worker values: create
            // them all again, in order, before it runs anything else.
            wk.own.clear();
            for (auto& r : wk.resources) {
              {
                std::lock_guard<std::mutex> cl(r->mu);
                r->status = RemoteValueStatus::kScheduled;
                r->worker = -1;
              }
              wk.own.push_back(r);
            }
            if (!wk.resources.empty())
              detail::logger("ps")->info("coordinator: {} restarted; creating its {} per-worker value(s) again", who,
                                         wk.resources.size());
            wk.incarnation = inc;
          }
          wk.alive = true;
          detail::logger("ps")->warn("coordinator: {} is back", who);
        } catch (const std::exception& e) {
          detail::logger("ps")->debug("coordinator: {} still unreachable: {}", who, e.what());
          std::unique_lock<std::mutex> l(mu_);
          cv_.wait_for(l, std::chrono::milliseconds(500), [&] { return shutting_down_.load(); });
        }
        continue;
      }
      std::shared_ptr<ClosureState> c;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait_for(l, std::chrono::milliseconds(200),
                     [&] { return shutting_down_ || !wk.own.empty() || !queue_.empty(); });
        if (shutting_down_) continue;
        std::deque<std::shared_ptr<ClosureState>>& from = !wk.own.empty() ? wk.own : queue_;
        if (from.empty()) continue;
        c = from.front();
        from.pop_front();
        ++inflight_;
      }
      {
        std::lock_guard<std::mutex> l(c->mu);
        c->status = RemoteValueStatus::kRunning;
        c->worker = w;
      }
      try {
        Frame r = wk.dispatch->call(c->kind, c->args,
                                    static_cast<std::int64_t>(opt_.join_timeout_s * 1000), &shutting_down_);
        Reader rd(r.payload);
        finish(*c, RemoteValueStatus::kReady, STRATA_OK, "", rd.value());
      } catch (const Error& e) {
        if (wk.dispatch->broken() && !shutting_down_) {
          // No answer: the worker died or became unreachable mid-closure.
          // Nothing was recorded for this closure, so it runs again elsewhere.
          detail::logger("ps")->warn("coordinator: {} failed while running closure {} ('{}'): {}; rescheduling it",
                                     who, c->id, c->fn, e.what());
          {
            std::lock_guard<std::mutex> l(c->mu);
            c->status = RemoteValueStatus::kScheduled;
            c->worker = -1;
          }
          std::lock_guard<std::mutex> l(mu_);
          wk.alive = false;
          (c->kind == kPerWorkerCreate ? wk.own : queue_).push_front(c);
          --inflight_;
          cv_.notify_all();
          continue;
        }
        closure_failed(c, e.code(), e.what());
      } catch (const std::exception& e) {
        closure_failed(c, STRATA_ERR_INTERNAL, e.what());
      }
      std::lock_guard<std::mutex> l(mu_);
      --inflight_;
      cv_.notify_all();
    }
  }

  void closure_failed(const std::shared_ptr<ClosureState>& c, strata_status_t code, const std::string& msg) {
    finish(*c, RemoteValueStatus::kError, code, msg);
    std::lock_guard<std::mutex> l(mu_);
    if (pending_code_ == STRATA_OK) {
      pending_code_ = code;
      pending_error_ = msg;
    }
    // tf.distribute: an error cancels every closure still queued.
    for (auto& q : queue_)
      finish(*q, RemoteValueStatus::kAborted, STRATA_ERR_CANCELLED,
             detail::str_cat("cancelled: closure ", c->id, " ('", c->fn, "') failed first: ", msg));
    queue_.clear();
  }

  void monitor_loop() {
    const auto period = std::chrono::milliseconds(static_cast<std::int64_t>(opt_.heartbeat_s * 1000));
    const std::int64_t t = std::min<std::int64_t>(rt_->op_timeout_ms(), 10000);
    while (!shutting_down_) {
      for (int p = 0; p < num_ps_ && !shutting_down_; ++p) {
        try {
          (void)t;
          rt_->ps_call(p, kPing, "");
        } catch (const Error& e) {
          std::lock_guard<std::mutex> l(ps_mu_);
          if (ps_error_.empty()) {
            ps_error_ = detail::str_cat(task_name("ps", p), " is unavailable (", e.what(),
                                        "); its variables are lost: restart the job from its last checkpoint");
            detail::logger("ps")->error("coordinator: {}", ps_error_);
          }
        }
      }
      for (int w = 0; w < num_workers_ && !shutting_down_; ++w) {
        auto& wk = *workers_[static_cast<std::size_t>(w)];
        std::lock_guard<std::mutex> l(wk.control_mu);
        if (!wk.control || wk.control->broken()) continue;
        try {
          wk.control->call(kPing, "", t, &shutting_down_);
        } catch (const Error& e) {
          detail::logger("ps")->warn("coordinator: worker task {} does not answer pings: {}", w, e.what());
        }
      }
      cv_.notify_all();  // join() re-checks the ps state
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, period, [&] { return shutting_down_.load(); });
    }
  }

  std::shared_ptr<Runtime> rt_;
  CoordinatorOptions opt_;
  int num_workers_ = 0;
  int num_ps_ = 0;
  std::set<std::string> functions_;
  std::set<std::string> dataset_functions_;
  std::uint64_t next_resource_ = 1;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ClosureState>> queue_;
  int inflight_ = 0;
  std::uint64_t next_closure_ = 1;
  strata_status_t pending_code_ = STRATA_OK;
  std::string pending_error_;
  std::atomic<bool> shutting_down_{false};
  bool shut_ = false;
  std::mutex ps_mu_;
  std::string ps_error_;
  std::mutex var_mu_;
  RoundRobinPlacer placer_;
  std::uint64_t next_var_id_ = 1;
};

void check_ps_failure(const std::shared_ptr<CoordinatorCore>& core) {
  if (core) core->raise_ps_failure();
}

namespace {
std::mutex g_coordinator_mu;
std::weak_ptr<CoordinatorCore> g_coordinator;  // this process's, for the parameter_server strategy
}  // namespace

namespace {
ClusterCoordinator* g_coordinator_object = nullptr;  // for the Trainer, guarded by g_coordinator_mu
}  // namespace

void set_current_coordinator(const std::shared_ptr<CoordinatorCore>& core) {
  std::lock_guard<std::mutex> l(g_coordinator_mu);
  g_coordinator = core;
}

void set_current_coordinator_object(ClusterCoordinator* c, ClusterCoordinator* expected) {
  std::lock_guard<std::mutex> l(g_coordinator_mu);
  if (g_coordinator_object == expected) g_coordinator_object = c;
}

ClusterCoordinator* current_coordinator_object() {
  std::lock_guard<std::mutex> l(g_coordinator_mu);
  return g_coordinator_object;
}

RemoteVariable create_variable_on_coordinator(const std::string& name, const Tensor& initial,
                                              const Partitioner& partitioner, std::uint32_t synchronization,
                                              std::uint32_t aggregation, bool trainable) {
  std::shared_ptr<CoordinatorCore> core;
  {
    std::lock_guard<std::mutex> l(g_coordinator_mu);
    core = g_coordinator.lock();
  }
  if (core == nullptr) {
    std::shared_ptr<Runtime> rt;
    try {
      rt = Runtime::current();
    } catch (const Error&) {
    }
    // A worker creating a variable inside a scheduled function: TF refuses
    // too (variables are created once, on the coordinator).
    STRATA_ENFORCE(rt == nullptr || rt->job() == "chief", STRATA_ERR_FAILED_PRECONDITION, "variable '", name,
                   "' cannot be created on ", task_name(rt->job(), rt->index()),
                   ": this process runs no ClusterCoordinator, and only the chief's places variables on the ps "
                   "tasks; create it on the chief under the parameter_server strategy's scope and pass "
                   "variable.remote() to schedule()");
  }
  STRATA_ENFORCE(core != nullptr, STRATA_ERR_FAILED_PRECONDITION, "variable '", name,
                 "' cannot be placed on the ps tasks: this process runs no ClusterCoordinator; create the "
                 "strata::ClusterCoordinator on the chief before creating variables under the parameter_server "
                 "strategy's scope (workers attach to the chief's variables with Variable(RemoteVariable))");
  RemoteVariable rv = core->create_variable(name, initial, partitioner);
  auto info = std::make_shared<VariableInfo>(*rv.info());
  info->synchronization = synchronization;
  info->aggregation = aggregation;
  info->trainable = trainable;
  return RemoteVariable(info);
}

}  // namespace ps_detail

// ---- RemoteValue ----

RemoteValueStatus RemoteValue::status() const {
  STRATA_ENFORCE(s_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "empty RemoteValue; get one from schedule()");
  std::lock_guard<std::mutex> l(s_->mu);
  return s_->status;
}

int RemoteValue::worker() const {
  STRATA_ENFORCE(s_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "empty RemoteValue; get one from schedule()");
  std::lock_guard<std::mutex> l(s_->mu);
  return s_->worker;
}

const Value& RemoteValue::fetch() const {
  STRATA_ENFORCE(s_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "empty RemoteValue; get one from schedule()");
  const auto deadline = ps_detail::Clock::now() +
                        std::chrono::milliseconds(static_cast<std::int64_t>(s_->fetch_timeout_s * 1000));
  std::unique_lock<std::mutex> l(s_->mu);
  for (;;) {
    if (s_->status == RemoteValueStatus::kReady) return s_->result;
    if (s_->status == RemoteValueStatus::kError) detail::throw_status(s_->error_code, s_->error);
    if (s_->status == RemoteValueStatus::kAborted) detail::throw_status(STRATA_ERR_CANCELLED, s_->error);
    l.unlock();
    ps_detail::check_ps_failure(s_->coordinator.lock());
    l.lock();
    if (ps_detail::Clock::now() >= deadline)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "closure ", s_->id, " ('", s_->fn, "') is still ",
                   remote_value_status_name(s_->status), " after ", s_->fetch_timeout_s, " s");
    s_->cv.wait_for(l, std::chrono::milliseconds(100));
  }
}

// ---- RemoteVariable ----

namespace {
const ps_detail::VariableInfo& info_of(const std::shared_ptr<const ps_detail::VariableInfo>& i) {
  STRATA_ENFORCE(i != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "empty RemoteVariable; create it with ClusterCoordinator::create_variable");
  return *i;
}
std::size_t row_bytes(const ps_detail::VariableInfo& v) {
  std::size_t n = dtype_size(v.dtype);
  for (std::size_t i = 1; i < v.shape.size(); ++i) n *= static_cast<std::size_t>(v.shape[i]);
  return n;
}
}  // namespace

const std::string& RemoteVariable::name() const { return info_of(info_).name; }
DType RemoteVariable::dtype() const { return info_of(info_).dtype; }
std::vector<std::int64_t> RemoteVariable::shape() const { return info_of(info_).shape; }
std::int64_t RemoteVariable::num_shards() const { return static_cast<std::int64_t>(info_of(info_).shards.size()); }
int RemoteVariable::shard_ps_task(std::int64_t i) const {
  const auto& v = info_of(info_);
  STRATA_ENFORCE(i >= 0 && i < static_cast<std::int64_t>(v.shards.size()), STRATA_ERR_OUT_OF_RANGE, "variable '",
                 v.name, "' has ", v.shards.size(), " shard(s); shard ", i, " does not exist");
  return v.shards[static_cast<std::size_t>(i)].ps;
}

namespace {
// Read one shard into `dst` (`nbytes`, the shard's size): a large shard's
// bytes land there straight from the ps (the frame's bulk), a small one's
// come inside the answer.
void read_shard(ps_detail::Runtime& rt, const ps_detail::VariableInfo& v, const ps_detail::ShardRef& s, void* dst,
                std::size_t nbytes) {
  const bool bulk = nbytes >= ps_detail::kBulkMinBytes;
  ps_detail::Writer w;
  w.u64(s.id);
  w.u8(bulk ? 1 : 0);
  const std::string req = w.take();
  ps_detail::Frame r = rt.ps_call(s.ps, ps_detail::kVarRead, [&] { return req; }, nullptr, 0,
                                  bulk ? ps_detail::BulkSink{dst, nbytes} : ps_detail::BulkSink{});
  ps_detail::Reader rd(r.payload);
  const bool got_bulk = rd.u8() != 0;
  const ps_detail::Reader::TensorBytes piece = got_bulk ? rd.tensor_header() : rd.tensor_bytes();
  STRATA_ENFORCE(piece.shape == s.shape && piece.dtype == v.dtype && piece.nbytes == nbytes &&
                     got_bulk == (r.bulk_len > 0),
                 STRATA_ERR_DATA_LOSS, "variable '", v.name, "': ps task ", s.ps,
                 " returned a shard of another shape or dtype");
  if (!got_bulk && nbytes > 0) std::memcpy(dst, piece.data, nbytes);
}
}  // namespace

Tensor RemoteVariable::read() const {
  const auto& v = info_of(info_);
  auto rt = ps_detail::Runtime::current();
  const std::size_t rb = row_bytes(v);
  Tensor out = detail::uninitialized_tensor(v.shape, v.dtype);  // the shards cover every byte
  for (const auto& s : v.shards) {
    const std::size_t rows = s.shape.empty() ? 1 : static_cast<std::size_t>(s.shape[0]);
    const std::size_t off = v.shape.empty() ? 0 : static_cast<std::size_t>(s.row_offset) * rb;
    const std::size_t nbytes = v.shape.empty() ? out.nbytes() : rows * rb;
    STRATA_ENFORCE(off + nbytes <= out.nbytes(), STRATA_ERR_DATA_LOSS, "variable '", v.name, "': shard on ps task ",
                   s.ps, " lies outside the variable's shape");
    read_shard(*rt, v, s, static_cast<char*>(out.raw_data()) + off, nbytes);
  }
  return out;
}

void RemoteVariable::update(std::uint32_t op, const Tensor& value) const {
  const auto& v = info_of(info_);
  STRATA_ENFORCE(value.defined() && value.dtype() == v.dtype && value.shape() == v.shape,
                 STRATA_ERR_INVALID_ARGUMENT, "variable '", v.name, "' is ", dtype_name(v.dtype), " of ",
                 v.shape.size(), "-d shape; the update must have the same dtype and shape");
  auto rt = ps_detail::Runtime::current();
  Tensor staged;  // a compact copy, only when `value` is strided
  const char* base = static_cast<const char*>(value.raw_data());
  if (!TensorView(value).is_contiguous()) {
    staged = Tensor::copy_of(TensorView(value));
    base = static_cast<const char*>(staged.raw_data());
  }
  const std::size_t rb = row_bytes(v);
  for (const auto& s : v.shards) {
    const std::size_t rows = s.shape.empty() ? 1 : static_cast<std::size_t>(s.shape[0]);
    const char* src = base + (v.shape.empty() ? 0 : static_cast<std::size_t>(s.row_offset) * rb);
    const std::size_t nbytes = v.shape.empty() ? value.nbytes() : rows * rb;
    // A large update's bytes go from `value` straight to the ps (the
    // frame's bulk), a small one's inside the request.
    const bool bulk = nbytes >= ps_detail::kBulkMinBytes;
    const auto key = rt->request_key();  // applied once even when a blip makes us resend it
    rt->ps_call(
        s.ps, ps_detail::kVarUpdateOnce,
        [&] {
          ps_detail::Writer w;
          ps_detail::Runtime::write_request_key(w, key);
          w.u64(s.id);
          w.u32(op);
          w.u8(bulk ? 1 : 0);
          if (bulk) w.tensor_header(v.dtype, s.shape, nbytes);
          else w.tensor_raw(v.dtype, s.shape, src, nbytes);
          return w.take();
        },
        bulk ? src : nullptr, bulk ? nbytes : 0, ps_detail::BulkSink{});
  }
}

void RemoteVariable::assign(const Tensor& value) const { update(ps_detail::kAssign, value); }
void RemoteVariable::assign_add(const Tensor& delta) const { update(ps_detail::kAssignAdd, delta); }
void RemoteVariable::assign_sub(const Tensor& delta) const { update(ps_detail::kAssignSub, delta); }

// ---- ClusterCoordinator ----

ClusterCoordinator::ClusterCoordinator(CoordinatorOptions options) {
  auto rt = ps_detail::Runtime::start("", -1, false);
  core_ = std::make_shared<ps_detail::CoordinatorCore>(rt, options);
  core_->start();
  ps_detail::set_current_coordinator(core_);
  ps_detail::set_current_coordinator_object(this, ps_detail::current_coordinator_object());
}

ClusterCoordinator::~ClusterCoordinator() {
  ps_detail::set_current_coordinator_object(nullptr, this);
  if (core_) core_->shutdown();
}

int ClusterCoordinator::num_workers() const { return core_->num_workers(); }
int ClusterCoordinator::num_ps() const { return core_->num_ps(); }
RemoteVariable ClusterCoordinator::create_variable(const std::string& name, const Tensor& initial,
                                                   const Partitioner& partitioner) {
  return core_->create_variable(name, initial, partitioner);
}
RemoteValue ClusterCoordinator::schedule(const std::string& fn, Args args) { return core_->schedule(fn, std::move(args)); }
void ClusterCoordinator::join() { core_->join(); }
bool ClusterCoordinator::done() { return core_->done(); }
const Value& ClusterCoordinator::fetch(const RemoteValue& remote) {
  core_->raise_ps_failure();
  return remote.fetch();
}
void ClusterCoordinator::stop_servers() { core_->stop_servers(); }

std::vector<std::reference_wrapper<const Value>> ClusterCoordinator::fetch(const PerWorkerValues& values) {
  STRATA_ENFORCE(values.defined(), STRATA_ERR_FAILED_PRECONDITION,
                 "empty PerWorkerValues; get one from create_per_worker_values or create_per_worker_dataset");
  core_->raise_ps_failure();
  std::vector<std::reference_wrapper<const Value>> out;
  for (const auto& r : values.values()) out.emplace_back(r.fetch());
  return out;
}

PerWorkerDataset ClusterCoordinator::create_per_worker_dataset(const std::string& dataset_fn) {
  return PerWorkerDataset(core_->create_per_worker(PerWorkerKind::kDataset, dataset_fn, 0, {}));
}

PerWorkerValues ClusterCoordinator::create_per_worker_values(const std::string& fn, Args args) {
  return core_->create_per_worker(PerWorkerKind::kValue, fn, 0, std::move(args));
}

PerWorkerIterator PerWorkerDataset::iter() const {
  STRATA_ENFORCE(defined(), STRATA_ERR_FAILED_PRECONDITION,
                 "empty PerWorkerDataset; get one from ClusterCoordinator::create_per_worker_dataset");
  auto core = coordinator_.lock();
  STRATA_ENFORCE(core != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "the ClusterCoordinator of this per-worker dataset was destroyed");
  return PerWorkerIterator(core->create_per_worker(PerWorkerKind::kIterator, std::string(), ref_.id, {}));
}

}  // namespace strata
