// SPDX-License-Identifier: Apache-2.0
// Internals of parameter-server training (strata/coordinator.hpp): the
// framed request/response channel over a two-rank transport communicator,
// the wire encoding of Values, the per-process runtime (cluster, transport,
// connections to ps tasks) and the shared state of closures and variables.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/error.hpp"
#include "strata/c/strata.h"
#include "strata/coordinator.hpp"
#include "strata/plugin_host.hpp"

namespace strata::ps_detail {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

class Runtime;
class Reader;

// Message kinds. A response carries the request's kind and id, and a
// status (0 ok; else a strata status code whose message is the payload).
enum Kind : std::uint32_t {
  kHello = 1,      // payload: json {"role": "coordinator"|"worker", ...}; reply json of the task
  kPing = 2,       // from the coordinator; keeps the server alive
  kStop = 3,       // from the coordinator; the server stops
  kExecute = 4,    // worker: payload name + args; reply: result value
  kVarCreate = 5,  // ps: id + tensor
  kVarRead = 6,    // ps: id; reply tensor
  kVarUpdate = 7,  // ps: id + op + tensor
  // worker: resource id, PerWorkerKind, function name, parent id, args;
  // reply: the value (kValue) or none
  kPerWorkerCreate = 8,
  // ps, applied at most once: request key (client token, sequence), then as
  // kVarUpdate / scatter (id, op, n, n row indices, rows tensor)
  kVarUpdateOnce = 9,
  kVarScatterOnce = 10,
  // From a client about to close the channel; no reply. The server stops
  // reading it, so the close that follows finds no receive posted (a posted
  // receive that meets the close is a lost peer to the transport, which
  // warns).
  kBye = 11,
};

enum UpdateOp : std::uint32_t { kAssign = 0, kAssignAdd = 1, kAssignSub = 2 };

// Apply a scatter (kVarScatterOnce's body after the request key and shard
// id: op, n, n local row indices, rows) to `shard`. `who` names the ps task.
void apply_scatter(Tensor& shard, std::uint64_t shard_id, Reader& r, const std::string& who);

// Remembers the responses of ps requests that must be applied at most once
// (kVarUpdateOnce, kVarScatterOnce), by (client token, sequence): a retry
// of a request already applied (or being applied) gets the first answer.
class OnceTable {
 public:
  // Run `fn` for `key` unless it ran; a concurrent duplicate waits for it.
  std::string run(std::uint64_t token, std::uint64_t seq, const std::function<std::string()>& fn);

 private:
  struct Entry {
    bool done = false;
    std::int32_t code = 0;
    std::string response;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, Entry> entries_;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> order_;
};

// Worker side of per-worker values: create resource (kPerWorkerCreate).
std::string per_worker_create(const Runtime& rt, const std::string& payload);

struct Frame {
  std::uint32_t kind = 0;
  std::int32_t status = 0;
  std::uint64_t id = 0;
  std::string payload;
  // Bulk bytes (a large tensor's data) that travel after the payload as
  // their own message, straight from the sender's memory into the
  // receiver's (no encoding copy): the receiver posts its receive into the
  // final destination, then clears the sender to go (one small message), so
  // the transport never stages them. Sending: the source, which must stay
  // valid until send() returns. Received: where they landed.
  const void* bulk = nullptr;
  std::uint64_t bulk_len = 0;
};

// Tensors of at least this many bytes travel as a frame's bulk; smaller
// ones inside the payload (the clear-to-send round trip would cost more
// than the copy).
constexpr std::uint64_t kBulkMinBytes = 64 * 1024;

// Where a call's answer may put its bulk: `len` bytes at `data` (the
// answer's bulk must be exactly that long; DataLossError otherwise).
struct BulkSink {
  void* data = nullptr;
  std::uint64_t len = 0;
};

// Byte-level writer/reader of the wire format (little-endian host order;
// every process of a job runs on the same architecture).
class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) { raw(&v, sizeof v); }
  void u64(std::uint64_t v) { raw(&v, sizeof v); }
  void i64(std::int64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    out_.append(s);
  }
  void raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  void tensor(const Tensor& t);
  // A tensor from raw compact bytes (no intermediate Tensor).
  void tensor_raw(DType dtype, const std::vector<std::int64_t>& shape, const void* data, std::size_t nbytes);
  // A tensor's header only (dtype, shape, byte count): its bytes travel as
  // the frame's bulk (Reader::tensor_header).
  void tensor_header(DType dtype, const std::vector<std::int64_t>& shape, std::size_t nbytes);
  void value(const Value& v);
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  std::uint8_t u8();
  std::uint32_t u32();
  std::uint64_t u64();
  std::int64_t i64();
  double f64();
  std::string str();
  Tensor tensor();
  // A tensor's header and a pointer to its bytes inside the message (valid
  // while the message lives): no copy.
  struct TensorBytes {
    DType dtype;
    std::vector<std::int64_t> shape;
    const char* data;
    std::size_t nbytes;
  };
  TensorBytes tensor_bytes();
  // What tensor_header wrote (data is null).
  TensorBytes tensor_header();
  Value value();
  bool at_end() const { return pos_ == in_.size(); }

 private:
  const char* take(std::size_t n);
  const std::string& in_;
  std::size_t pos_ = 0;
};

// One shard of a remote variable: which ps task and which id there.
struct ShardRef {
  int ps = 0;
  std::uint64_t id = 0;
  std::int64_t row_offset = 0;
  std::vector<std::int64_t> shape;
};

struct VariableInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  bool sharded = false;
  std::vector<ShardRef> shards;
  // The strategy's policy for the variable (strata_var_sync,
  // strata_var_aggregation), so that a worker attaching to it under the
  // parameter_server strategy aggregates replica updates as the chief asked.
  std::uint32_t synchronization = 0;
  std::uint32_t aggregation = 0;
  bool trainable = true;
};

void write_variable(Writer& w, const VariableInfo& v);
std::shared_ptr<const VariableInfo> read_variable(Reader& r);

// A framed request/response channel: one two-rank communicator of a
// transport. Thread-safe: call() holds a mutex for the whole exchange.
class Channel {
 public:
  // Join communicator `name` as `rank` of 2 within timeout_ms. `peer` names
  // the other side in every error ("ps task 1").
  Channel(const strata_transport_vtable* vt, strata_transport_t transport, const std::string& name, int rank,
          std::int64_t timeout_ms, std::string peer);
  // A client's channel (rank 1) first sends kBye, unless the channel broke
  // or the server stopped reading it (kStop answered).
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Send `f` (header, payload, then f.bulk once the receiver is ready) and
  // wait until it left, within timeout_ms.
  void send(const Frame& f, std::int64_t timeout_ms);
  // Where a received frame's bulk goes: called with the frame (payload
  // received) and the bulk's length; returns memory of at least that many
  // bytes, valid until the frame has been handled.
  using BulkPlace = std::function<void*(const Frame&, std::uint64_t len)>;
  // Receive the next frame. Returns false when `stop` became true first.
  // Throws DeadlineExceededError after timeout_ms (< 0: none), or the
  // transport's error (UNAVAILABLE when the peer is gone). A frame with a
  // bulk and no `place` is DataLossError (the channel breaks).
  bool recv(Frame& out, std::int64_t timeout_ms, const std::atomic<bool>* stop, const BulkPlace* place = nullptr);
  // send + recv of the response; a non-OK response is thrown as its error.
  // `bulk`/`bulk_len`: the request's bulk; `sink`: where the answer's goes.
  Frame call(std::uint32_t kind, std::string payload, std::int64_t timeout_ms,
             const std::atomic<bool>* stop = nullptr, const void* bulk = nullptr, std::uint64_t bulk_len = 0,
             BulkSink sink = {});
  void abort(const std::string& reason);
  bool broken() const { return broken_.load(); }
  const std::string& peer() const { return peer_; }

 private:
  void wait(strata_request_t req, std::int64_t timeout_ms, const std::atomic<bool>* stop, const char* what,
            bool* stopped);
  void transfer(bool send, void* data, std::uint64_t bytes, std::uint64_t tag, std::int64_t timeout_ms,
                const std::atomic<bool>* stop, bool* stopped);
  // transfer() in two halves, for a receive that must be posted before the
  // peer is told to send.
  struct Posted {
    strata_request_t req = nullptr;
    strata_mem_region_t mr = nullptr;
  };
  Posted post(bool send, void* data, std::uint64_t bytes, std::uint64_t tag);
  void finish(Posted p, bool send, std::int64_t timeout_ms, const std::atomic<bool>* stop, bool* stopped);

  const strata_transport_vtable* vt_;
  strata_comm_t comm_ = nullptr;
  bool needs_mr_ = false;
  std::string peer_;
  int peer_rank_ = 0;
  std::mutex call_mu_;
  std::atomic<bool> broken_{false};
  bool server_reading_ = true;  // false once a kStop was answered
  std::uint64_t next_id_ = 1;
};

// Task naming: {"worker", 1} -> "worker task 1".
std::string task_name(const std::string& job, int index);

// Per-process runtime: the cluster, this task, the transport and the
// connections this process opened to ps tasks (for variable operations).
class Runtime {
 public:
  // Resolve the cluster (resolver, with optional task override), connect the
  // rendezvous store (serve = this task is the chief) and create the
  // transport. Only one runtime per process.
  // `server`: this process must be a worker or ps task (else the chief);
  // checked before anything connects.
  static std::shared_ptr<Runtime> start(const std::string& job, int index, bool server);
  static std::shared_ptr<Runtime> current();  // FailedPreconditionError when none
  ~Runtime();

  const std::string& job() const { return job_; }
  int index() const { return index_; }
  int count(const std::string& job) const;
  std::int64_t op_timeout_ms() const { return op_timeout_ms_; }
  std::int64_t rendezvous_ms() const { return rendezvous_ms_; }
  void set_op_timeout_ms(std::int64_t ms) { op_timeout_ms_ = ms; }
  const strata_host_api* api() const;

  // Open a new channel to task (job, index) as `role` (the server's
  // incarnation, published in the store, picks the communicator name).
  // Returns the channel and the task's hello reply.
  std::unique_ptr<Channel> connect(const std::string& job, int index, const std::string& role,
                                   std::int64_t timeout_ms, json* hello_reply = nullptr,
                                   const std::atomic<bool>* stop = nullptr);
  // The shared channel of this process to ps task `ps` (opened on first use,
  // reopened after a failure). Callers serialise through Channel::call.
  std::shared_ptr<Channel> ps_channel(int ps);
  // call() on ps task `ps`, tolerating a blip (ps_retry.cc): a lost
  // connection or an attempt past the operation deadline reconnects and
  // resends the same payload until ps_grace_ms() passed since the first
  // failure, then UnavailableError naming the ps task. Only idempotent
  // requests go through it (reads, pings, *Once updates with a request key).
  Frame ps_call(int ps, std::uint32_t kind, const std::string& payload);
  // The same, with the payload made by `make` for each attempt (moved into
  // the first one: a large update is not copied once more for a retry that
  // rarely happens). `make` must give the same bytes every time.
  Frame ps_call(int ps, std::uint32_t kind, const std::function<std::string()>& make);
  // The same with a bulk: the request's (`bulk`, `bulk_len`: sent again as
  // is on a retry) and where the answer's goes (`sink`).
  Frame ps_call(int ps, std::uint32_t kind, const std::function<std::string()>& make, const void* bulk,
                std::uint64_t bulk_len, BulkSink sink);
  // A request key for a *Once request: this process's token and a new
  // sequence number; write it with write_request_key.
  std::pair<std::uint64_t, std::uint64_t> request_key() { return {token_, next_seq_.fetch_add(1)}; }
  static void write_request_key(Writer& w, const std::pair<std::uint64_t, std::uint64_t>& key);
  std::int64_t ps_grace_ms() const { return ps_grace_ms_; }
  void set_ps_grace_ms(std::int64_t ms) { ps_grace_ms_ = ms; }

  const strata_transport_vtable* vt() const { return vt_; }
  strata_transport_t transport() const { return static_cast<strata_transport_t>(transport_.handle()); }

  // Store helpers (throw the store's error).
  void store_set(const std::string& key, const std::string& value);
  std::string store_get(const std::string& key, std::int64_t timeout_ms);
  std::int64_t store_add(const std::string& key, std::int64_t delta, std::int64_t timeout_ms);

 private:
  Runtime() = default;
  std::string job_;
  int index_ = 0;
  json spec_;
  PluginInstance transport_;
  const strata_transport_vtable* vt_ = nullptr;
  std::int64_t op_timeout_ms_ = 60000;
  std::int64_t rendezvous_ms_ = 120000;
  std::mutex mu_;
  std::map<int, std::shared_ptr<Channel>> ps_;
  // ps_retry.cc: the grace period, the request token and sequence, and the
  // incarnation each ps task had at first contact (a different one after a
  // reconnect means it restarted and lost its variables).
  void load_ps_timeouts();
  std::shared_ptr<Channel> reconnect_ps(int ps, const std::shared_ptr<Channel>& broken, std::int64_t timeout_ms);
  std::int64_t ps_grace_ms_ = 5000;
  std::uint64_t token_ = 0;
  std::atomic<std::uint64_t> next_seq_{1};
  std::map<int, std::string> ps_incarnation_;
};

// Store keys of a server task.
std::string incarnation_key(const std::string& job, int index);
std::string clients_key(const std::string& job, int index, const std::string& incarnation);
std::string comm_name(const std::string& job, int index, const std::string& incarnation, std::int64_t client);

// The result of one closure.
struct ClosureState {
  std::uint64_t id = 0;
  std::string fn;
  std::string args;  // encoded
  std::mutex mu;
  std::condition_variable cv;
  RemoteValueStatus status = RemoteValueStatus::kScheduled;
  Value result;
  strata_status_t error_code = STRATA_OK;
  std::string error;
  int worker = -1;
  double fetch_timeout_s = 3600;
  // kExecute, or kPerWorkerCreate for a per-worker value's closure (which
  // runs on its own worker only, again after that worker restarts).
  std::uint32_t kind = kExecute;
  // The coordinator's ps failure (UnavailableError), checked by fetch.
  std::weak_ptr<CoordinatorCore> coordinator;
};

// Create a variable through this process's ClusterCoordinator (for the
// parameter_server strategy's host-API entry); FailedPreconditionError
// naming the fix when none is running.
RemoteVariable create_variable_on_coordinator(const std::string& name, const Tensor& initial,
                                              const Partitioner& partitioner, std::uint32_t synchronization,
                                              std::uint32_t aggregation, bool trainable);

// This process's newest live ClusterCoordinator (nullptr when none), for
// the Trainer under the parameter_server strategy. The constructor sets it,
// the destructor clears it (set_..._object(c, expected) sets c only while
// the current one is `expected`).
ClusterCoordinator* current_coordinator_object();
void set_current_coordinator_object(ClusterCoordinator* c, ClusterCoordinator* expected);

// Called when a strata::Server stops serving (join returns or throws, or
// the Server is destroyed): one hook, set by the Trainer to drop its
// worker-side state. Idempotent.
void set_server_exit_hook(void (*fn)());
void run_server_exit_hook();
// Drop this process's per-worker values, datasets and iterators (when its
// server stops: their buffers may hold tensors whose deleters live in
// plugins, which must not outlast PluginHost at exit).
void clear_per_worker_values();

// Raise the ps failure of `core`, if any (for RemoteValue::fetch).
void check_ps_failure(const std::shared_ptr<CoordinatorCore>& core);

// The function registered as `name`, or an empty function.
RemoteFunction find_function(const std::string& name);
// The dataset function registered as `name`, or an empty function.
DatasetFunction find_dataset_function(const std::string& name);

// The names of C++ exception types, for messages ("std::runtime_error").
std::string demangled_type(const std::exception& e);

// Run a user function (a scheduled closure, a dataset or per-worker value
// function), turning its exception into a strata error of the matching
// code whose message says `where`, the C++ type and what it said.
template <class F>
auto run_user(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    detail::throw_status(e.code(), where + " raised " + demangled_type(e) + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    detail::throw_status(STRATA_ERR_INVALID_ARGUMENT, where + " raised " + demangled_type(e) + ": " + e.what());
  } catch (const std::out_of_range& e) {
    detail::throw_status(STRATA_ERR_OUT_OF_RANGE, where + " raised " + demangled_type(e) + ": " + e.what());
  } catch (const std::exception& e) {
    detail::throw_status(STRATA_ERR_INTERNAL, where + " raised " + demangled_type(e) + ": " + e.what());
  }
}

}  // namespace strata::ps_detail
