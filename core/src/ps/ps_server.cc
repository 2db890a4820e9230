// SPDX-License-Identifier: Apache-2.0
// strata::Server: a worker or ps task serving the coordinator and the
// workers. One thread watches the store for new clients (each client takes
// the next number of this incarnation's counter and both sides join the
// communicator named after it); one thread per connection answers its
// requests in order. Variable shards live here on a ps task, each behind its
// own mutex, so that updates of one shard are applied one at a time.
#include <cstring>
#include <random>
#include <thread>

#include "api/kernels.h"
#include "log.h"
#include "ps/ps_internal.h"

namespace strata {
namespace ps_detail {
namespace {

// `src` points into a received message, at any alignment: its elements are
// read with memcpy (UBSan flagged the direct int64 loads as misaligned).
template <class T>
void apply_typed(void* dst, const void* src, std::int64_t n, std::uint32_t op) {
  T* d = static_cast<T*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  for (std::int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, s + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
    d[i] = static_cast<T>(op == kAssignAdd ? d[i] + v : d[i] - v);
  }
}

// A shard's value is replaced, not written, while a read still sends it
// (copy on write): reads answer without copying and without holding `mu`
// while the bytes travel.
struct Shard {
  std::mutex mu;
  std::shared_ptr<Tensor> value;
};

// The shape and dtype of a bulk assign's new value (kVarUpdateOnce with op
// kAssign and its bytes in the bulk), read from the request's payload; false
// for any other request.
bool bulk_assign_layout(const Frame& f, DType* dtype, std::vector<std::int64_t>* shape) {
  if (f.kind != kVarUpdateOnce) return false;
  try {
    Reader r(f.payload);
    r.u64();  // request key
    r.u64();
    r.u64();  // shard id
    if (r.u32() != kAssign || r.u8() == 0) return false;
    const Reader::TensorBytes t = r.tensor_header();
    *dtype = t.dtype;
    *shape = t.shape;
    return true;
  } catch (const Error&) {
    return false;  // malformed: apply_update says what is wrong
  }
}

// A read's hold on a shard's value while its bytes are sent. It lets go
// under the shard's mutex, so that an update that then finds the value
// unshared (writable) happens after the send's last read of it.
struct Snapshot {
  std::shared_ptr<Shard> shard;
  std::shared_ptr<const Tensor> value;
  Snapshot() = default;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot() {
    if (!value) return;
    std::lock_guard<std::mutex> l(shard->mu);
    value.reset();
  }
};

}  // namespace

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  ServerCore(std::shared_ptr<Runtime> rt, ServerOptions opt) : rt_(std::move(rt)), opt_(std::move(opt)) {}

  void start() {
    std::random_device rd;
    incarnation_ = std::to_string(rd()) + std::to_string(rd());
    started_ = Clock::now();
    touch();
    rt_->store_set(incarnation_key(rt_->job(), rt_->index()), incarnation_);
    auto self = shared_from_this();
    accept_ = std::thread([self] { self->accept_loop(); });
    detail::logger("ps")->info("{} serving (incarnation {})", task_name(rt_->job(), rt_->index()), incarnation_);
  }

  void join() {
    if (accept_.joinable()) accept_.join();
    // Connection threads see the stop flag within 200 ms unless they are
    // inside a user function; give those a few seconds, then leave them.
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(5), [&] { return live_ == 0; });
    if (live_ != 0)
      detail::logger("ps")->warn("{}: {} connection(s) still busy at stop; leaving them",
                                 task_name(rt_->job(), rt_->index()), live_);
    for (auto& t : conns_) {
      if (live_ == 0) t.join();
      else t.detach();
    }
    conns_.clear();
    if (gone_)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, task_name(rt_->job(), rt_->index()),
                   ": the coordinator (chief task 0) has not been heard from for ", opt_.coordinator_timeout_s,
                   " s; stopping so that no server outlives its job");
  }

  void stop() { stop_ = true; }
  const std::shared_ptr<Runtime>& runtime() const { return rt_; }

 private:
  void touch() {
    last_contact_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }

  void accept_loop() {
    const std::string clients = clients_key(rt_->job(), rt_->index(), incarnation_);
    std::int64_t seen = 0;
    const auto first_deadline =
        started_ + std::chrono::milliseconds(std::max<std::int64_t>(
                       rt_->rendezvous_ms(), static_cast<std::int64_t>(opt_.coordinator_timeout_s * 1000)));
    while (!stop_) {
      std::int64_t n = seen;
      try {
        n = rt_->store_add(clients, 0, 1000);
      } catch (const Error& e) {
        // The store lives in the coordinator: it being gone is the
        // coordinator being gone, which the deadline below handles.
        detail::logger("ps")->debug("{}: store: {}", task_name(rt_->job(), rt_->index()), e.what());
      }
      for (; seen < n; ++seen) {
        const std::int64_t id = seen + 1;
        auto self = shared_from_this();
        std::lock_guard<std::mutex> l(mu_);
        ++live_;
        conns_.emplace_back([self, id] { self->serve(id); });
      }
      const auto now = Clock::now();
      const auto last = Clock::time_point(std::chrono::nanoseconds(last_contact_ns_.load()));
      const bool overdue = coordinator_seen_
                               ? now - last > std::chrono::milliseconds(
                                                  static_cast<std::int64_t>(opt_.coordinator_timeout_s * 1000))
                               : now > first_deadline;
      if (overdue) {
        detail::logger("ps")->error("{}: no word from the coordinator for {} s; stopping",
                                    task_name(rt_->job(), rt_->index()), opt_.coordinator_timeout_s);
        gone_ = true;
        stop_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void serve(std::int64_t id) {
    const std::string who = task_name(rt_->job(), rt_->index());
    bool from_coordinator = false;
    try {
      Channel ch(rt_->vt(), rt_->transport(), comm_name(rt_->job(), rt_->index(), incarnation_, id), 0,
                 rt_->rendezvous_ms(), who + "'s client " + std::to_string(id));
      // A request's bulk (a large update) lands in this connection's
      // scratch buffer, kept for the next one (no fresh pages per update).
      // A bulk assign lands in `spare`, a tensor of the shard's layout that
      // then replaces the shard's value (no copy); the value it replaced
      // becomes the next spare unless a read still holds it.
      std::unique_ptr<char[]> scratch;
      std::uint64_t scratch_len = 0;
      Tensor spare;
      const Channel::BulkPlace place = [&](const Frame& f, std::uint64_t len) -> void* {
        DType dtype{};
        std::vector<std::int64_t> shape;
        if (bulk_assign_layout(f, &dtype, &shape) &&
            len == static_cast<std::uint64_t>(shape_numel(shape)) * dtype_size(dtype)) {
          if (!spare.defined() || spare.dtype() != dtype || spare.shape() != shape)
            spare = detail::uninitialized_tensor(shape, dtype);
          return spare.raw_data();
        }
        if (len > scratch_len) {
          scratch.reset(new char[len]);
          scratch_len = len;
        }
        return scratch.get();
      };
      while (!stop_) {
        Frame req;
        if (!ch.recv(req, -1, &stop_, &place)) break;
        if (req.kind == kBye) {
          detail::logger("ps")->debug("{}: client {} ({}) closed its channel", who, id,
                                      from_coordinator ? "coordinator" : "worker");
          break;
        }
        if (from_coordinator) touch();
        Frame resp;
        resp.kind = req.kind;
        resp.id = req.id;
        // A large read's answer goes out straight from the shard's current
        // value, which this keeps alive (updates meanwhile copy on write).
        Snapshot hold;
        try {
          resp.payload = handle(req, &from_coordinator, &hold, &spare);
          if (hold.value) {
            resp.bulk = hold.value->raw_data();
            resp.bulk_len = hold.value->nbytes();
          }
        } catch (const Error& e) {
          resp.status = e.code();
          resp.payload = e.what();
        } catch (const std::exception& e) {
          resp.status = STRATA_ERR_INTERNAL;
          resp.payload = who + ": " + demangled_type(e) + ": " + e.what();
        }
        ch.send(resp, rt_->op_timeout_ms());
      }
    } catch (const std::exception& e) {
      detail::logger("ps")->info("{}: client {} ({}) left: {}", who, id,
                                 from_coordinator ? "coordinator" : "worker", e.what());
    }
    std::lock_guard<std::mutex> l(mu_);
    --live_;
    cv_.notify_all();
  }

  std::string handle(const Frame& req, bool* from_coordinator, Snapshot* hold, Tensor* spare) {
    const std::string who = task_name(rt_->job(), rt_->index());
    switch (req.kind) {
      case kHello: {
        const json hello = json::parse(req.payload);
        if (hello.value("role", std::string()) == "chief") {
          *from_coordinator = true;
          coordinator_seen_ = true;
          touch();
        }
        json reply{{"job", rt_->job()}, {"index", rt_->index()}, {"incarnation", incarnation_}};
        reply["functions"] = rt_->job() == "worker" ? registered_functions() : std::vector<std::string>{};
        reply["dataset_functions"] =
            rt_->job() == "worker" ? registered_dataset_functions() : std::vector<std::string>{};
        return reply.dump();
      }
      case kPing: return std::string();
      case kStop:
        detail::logger("ps")->info("{}: the coordinator asked it to stop", who);
        stop_ = true;
        return std::string();
      case kExecute: return execute(req);
      case kVarCreate: {
        require_ps("create a variable");
        Reader r(req.payload);
        const std::uint64_t id = r.u64();
        auto shard = std::make_shared<Shard>();
        shard->value = std::make_shared<Tensor>(r.tensor());
        std::lock_guard<std::mutex> l(vars_mu_);
        if (auto it = vars_.find(id); it != vars_.end()) {
          // A create resent after a blip (ps_call) finds its own first copy.
          std::lock_guard<std::mutex> sl(it->second->mu);
          const Tensor& have = *it->second->value;
          if (have.dtype() == shard->value->dtype() && have.shape() == shard->value->shape() &&
              std::memcmp(have.raw_data(), shard->value->raw_data(), have.nbytes()) == 0)
            return std::string();
        }
        STRATA_ENFORCE(vars_.count(id) == 0, STRATA_ERR_ALREADY_EXISTS, who, ": variable shard ", id,
                       " exists already");
        vars_[id] = std::move(shard);
        return std::string();
      }
      case kVarRead: {
        require_ps("read a variable");
        Reader r(req.payload);
        auto shard = find(r.u64());
        const bool bulk_ok = r.u8() != 0;  // the reader posted a destination for a bulk
        Writer w;
        std::lock_guard<std::mutex> l(shard->mu);
        const Tensor& value = *shard->value;
        if (bulk_ok && value.nbytes() >= kBulkMinBytes) {
          // Sent after this returns, from a snapshot: updates meanwhile
          // copy on write (Shard).
          w.u8(1);
          w.tensor_header(value.dtype(), value.shape(), value.nbytes());
          hold->value = shard->value;
          hold->shard = shard;
        } else {
          w.u8(0);
          w.tensor(value);
        }
        return w.take();
      }
      case kVarUpdate: {
        require_ps("update a variable");
        Reader r(req.payload);
        return apply_update(r, req, spare);
      }
      case kVarUpdateOnce:
      case kVarScatterOnce: {
        require_ps("update a variable");
        Reader r(req.payload);
        const std::uint64_t token = r.u64();
        const std::uint64_t seq = r.u64();
        return once_.run(token, seq, [&]() -> std::string {
          if (req.kind == kVarUpdateOnce) return apply_update(r, req, spare);
          const std::uint64_t sid = r.u64();
          auto shard = find(sid);
          std::lock_guard<std::mutex> l(shard->mu);
          apply_scatter(writable(*shard), sid, r, who);
          return std::string();
        });
      }
      case kPerWorkerCreate:
        STRATA_ENFORCE(rt_->job() == "worker", STRATA_ERR_FAILED_PRECONDITION, who,
                       " does not hold per-worker values; only worker tasks do");
        return per_worker_create(*rt_, req.payload);
      default:
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who, ": unknown request kind ", req.kind,
                     "; the client speaks another protocol version");
    }
  }

  // kVarUpdate's body (after the kind): shard id, op, then the tensor (flag
  // 0) or its header with the bytes in the frame's bulk (flag 1).
  // `spare`: the connection's spare tensor, which holds a bulk assign's
  // bytes (see serve()).
  std::string apply_update(Reader& r, const Frame& req, Tensor* spare) {
    const std::string who = task_name(rt_->job(), rt_->index());
    const std::uint64_t id = r.u64();
    const std::uint32_t op = r.u32();
    const bool in_bulk = r.u8() != 0;
    Reader::TensorBytes delta = in_bulk ? r.tensor_header() : r.tensor_bytes();
    if (in_bulk) {
      STRATA_ENFORCE(req.bulk_len == delta.nbytes, STRATA_ERR_DATA_LOSS, who, ": update of shard ", id, " announced ",
                     delta.nbytes, " bytes but its bulk holds ", req.bulk_len);
      delta.data = static_cast<const char*>(req.bulk);
    }
    auto shard = find(id);
    std::lock_guard<std::mutex> l(shard->mu);
    STRATA_ENFORCE(delta.dtype == shard->value->dtype() && delta.shape == shard->value->shape(),
                   STRATA_ERR_INVALID_ARGUMENT, who, ": update of shard ", id, " has dtype ",
                   dtype_name(delta.dtype), " and ", delta.nbytes, " bytes but the shard has ",
                   dtype_name(shard->value->dtype()), " and ", shard->value->nbytes());
    STRATA_ENFORCE(op == kAssign || op == kAssignAdd || op == kAssignSub, STRATA_ERR_INVALID_ARGUMENT, who,
                   ": unknown update op ", op);
    if (op == kAssign && in_bulk && spare->defined() && spare->raw_data() == req.bulk) {
      std::shared_ptr<Tensor> old = std::move(shard->value);
      shard->value = std::make_shared<Tensor>(std::move(*spare));
      *spare = Tensor();
      if (old.use_count() == 1) *spare = std::move(*old);  // no read holds it (copies are made under mu)
      return std::string();
    }
    if (op == kAssign) {
      if (shard->value.use_count() > 1)  // a read is sending the old value: replace it instead of writing into it
        shard->value = std::make_shared<Tensor>(Tensor::from_bytes(delta.data, delta.nbytes, delta.shape, delta.dtype));
      else
        std::memcpy(shard->value->raw_data(), delta.data, delta.nbytes);
      return std::string();
    }
    Tensor& value = writable(*shard);
    void* d = value.raw_data();
    const void* s = delta.data;
    const std::int64_t n = value.numel();
    switch (delta.dtype) {
      case DType::kFloat32: apply_typed<float>(d, s, n, op); break;
      case DType::kFloat64: apply_typed<double>(d, s, n, op); break;
      case DType::kInt32: apply_typed<std::int32_t>(d, s, n, op); break;
      case DType::kInt64: apply_typed<std::int64_t>(d, s, n, op); break;
      case DType::kUInt8: apply_typed<std::uint8_t>(d, s, n, op); break;
      default:
        STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, who, ": assign_add/assign_sub of ", dtype_name(delta.dtype),
                     " variables is not supported; use float32, float64, int32, int64 or uint8");
    }
    return std::string();
  }

  std::string execute(const Frame& req) {
    const std::string who = task_name(rt_->job(), rt_->index());
    STRATA_ENFORCE(rt_->job() == "worker", STRATA_ERR_FAILED_PRECONDITION, who,
                   " does not run functions; schedule them on worker tasks");
    Reader r(req.payload);
    const std::uint64_t closure = r.u64();
    const std::string name = r.str();
    const std::uint64_t nargs = r.u64();
    Args args;
    for (std::uint64_t i = 0; i < nargs; ++i) args.push_back(r.value());
    RemoteFunction fn = find_function(name);
    STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_NOT_FOUND, who, " has no function '", name,
                   "'; register it with STRATA_REGISTER_FUNCTION in the program the workers run");
    const std::string where = detail::str_cat("closure ", closure, " ('", name, "') on ", who);
    const Value result = run_user(where, [&] { return fn(args); });
    Writer w;
    w.value(result);
    return w.take();
  }

  // The shard's value, ready to be written in place (caller holds shard.mu).
  // Every copy of the pointer is made under shard.mu, so a count of 1 means
  // no read holds it; a higher count may be stale (a read just finished),
  // which only costs a needless copy.
  static Tensor& writable(Shard& shard) {
    if (shard.value.use_count() > 1) shard.value = std::make_shared<Tensor>(shard.value->clone());
    return *shard.value;
  }

  void require_ps(const char* what) {
    STRATA_ENFORCE(rt_->job() == "ps", STRATA_ERR_FAILED_PRECONDITION, task_name(rt_->job(), rt_->index()),
                   " is not a ps task; cannot ", what);
  }

  std::shared_ptr<Shard> find(std::uint64_t id) {
    std::lock_guard<std::mutex> l(vars_mu_);
    auto it = vars_.find(id);
    STRATA_ENFORCE(it != vars_.end(), STRATA_ERR_NOT_FOUND, task_name(rt_->job(), rt_->index()),
                   " holds no variable shard ", id,
                   " (it was restarted and lost its variables, or the handle belongs to another job)");
    return it->second;
  }

  std::shared_ptr<Runtime> rt_;
  ServerOptions opt_;
  std::string incarnation_;
  Clock::time_point started_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> gone_{false};
  std::atomic<bool> coordinator_seen_{false};
  std::atomic<std::int64_t> last_contact_ns_{0};
  std::thread accept_;
  std::mutex mu_;
  std::condition_variable cv_;
  int live_ = 0;
  std::vector<std::thread> conns_;
  std::mutex vars_mu_;
  std::map<std::uint64_t, std::shared_ptr<Shard>> vars_;
  OnceTable once_;
};

}  // namespace ps_detail

Server Server::from_env(ServerOptions options) {
  if (options.job.empty() && options.index >= 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "ServerOptions.index is set without ServerOptions.job; set both");
  if (!options.job.empty())
    STRATA_ENFORCE(options.job == "worker" || options.job == "ps", STRATA_ERR_INVALID_ARGUMENT, "job '",
                   options.job, "' cannot serve; a server is a \"worker\" or \"ps\" task");
  STRATA_ENFORCE(options.coordinator_timeout_s > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "coordinator_timeout_s must be > 0 (got ", options.coordinator_timeout_s, ")");
  auto rt = ps_detail::Runtime::start(options.job, options.index, true);
  auto core = std::make_shared<ps_detail::ServerCore>(rt, options);
  core->start();
  return Server(core);
}

Server::Server(std::shared_ptr<ps_detail::ServerCore> core) : core_(std::move(core)) {}
Server::Server(Server&&) noexcept = default;
Server& Server::operator=(Server&&) noexcept = default;
namespace ps_detail {
namespace {
std::atomic<void (*)()> g_server_exit_hook{nullptr};
}  // namespace
void set_server_exit_hook(void (*fn)()) { g_server_exit_hook.store(fn); }
void run_server_exit_hook() {
  if (void (*fn)() = g_server_exit_hook.load()) fn();
  clear_per_worker_values();
}
}  // namespace ps_detail

Server::~Server() {
  if (core_) {
    core_->stop();
    try {
      core_->join();
    } catch (const std::exception&) {
    }
    ps_detail::run_server_exit_hook();
  }
}
const std::string& Server::job() const { return core_->runtime()->job(); }
int Server::index() const { return core_->runtime()->index(); }
void Server::join() {
  // What closures kept in this process (the Trainer's worker model and
  // strategy, whose replica threads must end before the process does) goes
  // when serving ends, however it ends.
  try {
    core_->join();
  } catch (...) {
    ps_detail::run_server_exit_hook();
    throw;
  }
  ps_detail::run_server_exit_hook();
}
void Server::stop() { core_->stop(); }

}  // namespace strata
