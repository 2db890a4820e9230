// SPDX-License-Identifier: Apache-2.0
// The wire format, the framed channel over a transport communicator and the
// per-process runtime of parameter-server training.
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <typeinfo>

#include <unistd.h>

#include "log.h"
#include "ps/ps_internal.h"

namespace strata {
namespace ps_detail {
namespace {

void append_to_string(void* user, const char* data, std::uint64_t len) {
  static_cast<std::string*>(user)->append(data, static_cast<std::size_t>(len));
}

constexpr std::uint64_t kHeaderTag = 1;
constexpr std::uint64_t kPayloadTag = 2;
constexpr std::uint64_t kClearTag = 3;  // the receiver of a bulk is ready for it
constexpr std::uint64_t kBulkTag = 4;
constexpr std::uint32_t kMagic = 0x53505332;  // "SPS2" (SPS1 had no bulk)

struct WireHeader {
  std::uint32_t magic;
  std::uint32_t kind;
  std::int32_t status;
  std::uint32_t reserved;
  std::uint64_t id;
  std::uint64_t len;
  std::uint64_t bulk_len;
};

std::mutex g_runtime_mu;
std::weak_ptr<Runtime> g_runtime;

std::int64_t ms_left(Clock::time_point deadline) {
  return std::max<std::int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// "grpc://host:port" -> "host:port".
std::string strip_layer(const std::string& address) {
  const auto p = address.find("://");
  return p == std::string::npos ? address : address.substr(p + 3);
}

std::optional<json> job_config(const char* pointer) {
  const strata_host_api* api = PluginHost::global().host_api();
  std::string out;
  strata_error err;
  strata_error_init(&err);
  if (api->get_config(api, pointer, &append_to_string, &out, &err) != STRATA_OK) return std::nullopt;
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// The task addresses of `job` in a cluster spec, by index.
std::vector<std::string> job_addresses(const json& spec, const std::string& job) {
  std::vector<std::string> out;
  if (!spec.is_object() || !spec.contains(job)) return out;
  const json& j = spec.at(job);
  if (j.is_array()) {
    for (const auto& a : j) out.push_back(a.is_string() ? strip_layer(a.get<std::string>()) : "");
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::size_t idx = 0;
      try {
        idx = static_cast<std::size_t>(std::stoul(it.key()));
      } catch (const std::exception&) {
        continue;
      }
      if (out.size() <= idx) out.resize(idx + 1);
      out[idx] = it.value().is_string() ? strip_layer(it.value().get<std::string>()) : "";
    }
  }
  return out;
}

}  // namespace

// ---- wire format ----

void Writer::tensor_raw(DType dtype, const std::vector<std::int64_t>& shape, const void* data, std::size_t nbytes) {
  u32(static_cast<std::uint32_t>(dtype));
  u32(static_cast<std::uint32_t>(shape.size()));
  for (auto d : shape) i64(d);
  u64(nbytes);
  out_.reserve(out_.size() + nbytes);
  raw(data, nbytes);
}

void Writer::tensor_header(DType dtype, const std::vector<std::int64_t>& shape, std::size_t nbytes) {
  u32(static_cast<std::uint32_t>(dtype));
  u32(static_cast<std::uint32_t>(shape.size()));
  for (auto d : shape) i64(d);
  u64(nbytes);
}

void Writer::tensor(const Tensor& t) {
  STRATA_ENFORCE(t.defined(), STRATA_ERR_INVALID_ARGUMENT, "cannot send an undefined tensor; pass a value");
  if (TensorView(t).is_contiguous()) {
    tensor_raw(t.dtype(), t.shape(), t.raw_data(), t.nbytes());
  } else {
    const Tensor c = Tensor::copy_of(TensorView(t));
    tensor_raw(c.dtype(), c.shape(), c.raw_data(), c.nbytes());
  }
}

void Writer::value(const Value& v) {
  u8(static_cast<std::uint8_t>(v.index()));
  switch (v.index()) {
    case 0: break;
    case 1: i64(std::get<1>(v)); break;
    case 2: f64(std::get<2>(v)); break;
    case 3: str(std::get<3>(v)); break;
    case 4: tensor(std::get<4>(v)); break;
    case 5: {
      const RemoteVariable& rv = std::get<5>(v);
      STRATA_ENFORCE(rv.defined(), STRATA_ERR_INVALID_ARGUMENT,
                     "cannot send an empty RemoteVariable; create it with ClusterCoordinator::create_variable");
      write_variable(*this, *rv.info());
      break;
    }
    case 6:
      u64(std::get<6>(v).id);
      u8(static_cast<std::uint8_t>(std::get<6>(v).kind));
      break;
    default: STRATA_THROW(STRATA_ERR_INTERNAL, "unknown Value kind ", v.index());
  }
}

const char* Reader::take(std::size_t n) {
  STRATA_ENFORCE(n <= in_.size() - pos_, STRATA_ERR_DATA_LOSS, "truncated parameter-server message (needs ", n,
                 " more bytes at offset ", pos_, " of ", in_.size(), ")");
  const char* p = in_.data() + pos_;
  pos_ += n;
  return p;
}
std::uint8_t Reader::u8() { return static_cast<std::uint8_t>(*take(1)); }
std::uint32_t Reader::u32() {
  std::uint32_t v;
  std::memcpy(&v, take(sizeof v), sizeof v);
  return v;
}
std::uint64_t Reader::u64() {
  std::uint64_t v;
  std::memcpy(&v, take(sizeof v), sizeof v);
  return v;
}
std::int64_t Reader::i64() {
  std::int64_t v;
  std::memcpy(&v, take(sizeof v), sizeof v);
  return v;
}
double Reader::f64() {
  double v;
  std::memcpy(&v, take(sizeof v), sizeof v);
  return v;
}
std::string Reader::str() {
  const std::uint64_t n = u64();
  return std::string(take(static_cast<std::size_t>(n)), static_cast<std::size_t>(n));
}
Reader::TensorBytes Reader::tensor_bytes() {
  TensorBytes t = tensor_header();
  t.data = take(t.nbytes);
  return t;
}

Reader::TensorBytes Reader::tensor_header() {
  const std::uint32_t dt = u32();
  STRATA_ENFORCE(dt <= static_cast<std::uint32_t>(DType::kUInt8), STRATA_ERR_DATA_LOSS,
                 "parameter-server message names an unknown dtype ", dt);
  const std::uint32_t nd = u32();
  STRATA_ENFORCE(nd <= 32, STRATA_ERR_DATA_LOSS, "parameter-server message has a tensor of rank ", nd);
  TensorBytes t;
  t.dtype = static_cast<DType>(dt);
  t.shape.resize(nd);
  std::uint64_t elems = 1;
  for (auto& d : t.shape) {
    d = i64();
    STRATA_ENFORCE(d >= 0, STRATA_ERR_DATA_LOSS, "parameter-server message has a negative dimension");
    elems *= static_cast<std::uint64_t>(d);
  }
  const std::uint64_t n = u64();
  STRATA_ENFORCE(n == elems * dtype_size(t.dtype), STRATA_ERR_DATA_LOSS, "parameter-server message: a tensor of ",
                 elems, " ", dtype_name(t.dtype), " elements carries ", n, " bytes");
  t.nbytes = static_cast<std::size_t>(n);
  t.data = nullptr;
  return t;
}

Tensor Reader::tensor() {
  const TensorBytes t = tensor_bytes();
  return Tensor::from_bytes(t.data, t.nbytes, t.shape, t.dtype);
}

Value Reader::value() {
  const std::uint8_t k = u8();
  switch (k) {
    case 0: return Value();
    case 1: return Value(i64());
    case 2: return Value(f64());
    case 3: return Value(str());
    case 4: return Value(tensor());
    case 5: return Value(RemoteVariable(read_variable(*this)));
    case 6: {
      PerWorkerRef ref;
      ref.id = u64();
      const std::uint8_t kind = u8();
      STRATA_ENFORCE(kind <= static_cast<std::uint8_t>(PerWorkerKind::kIterator), STRATA_ERR_DATA_LOSS,
                     "parameter-server message has an unknown per-worker kind ", int(kind));
      ref.kind = static_cast<PerWorkerKind>(kind);
      return Value(ref);
    }
    default: STRATA_THROW(STRATA_ERR_DATA_LOSS, "parameter-server message has an unknown value kind ", int(k));
  }
}

void write_variable(Writer& w, const VariableInfo& v) {
  w.str(v.name);
  w.u32(static_cast<std::uint32_t>(v.dtype));
  w.u32(static_cast<std::uint32_t>(v.shape.size()));
  for (auto d : v.shape) w.i64(d);
  w.u8(v.sharded ? 1 : 0);
  w.u32(static_cast<std::uint32_t>(v.shards.size()));
  for (const auto& s : v.shards) {
    w.u32(static_cast<std::uint32_t>(s.ps));
    w.u64(s.id);
    w.i64(s.row_offset);
    w.u32(static_cast<std::uint32_t>(s.shape.size()));
    for (auto d : s.shape) w.i64(d);
  }
  w.u32(v.synchronization);
  w.u32(v.aggregation);
  w.u8(v.trainable ? 1 : 0);
}

std::shared_ptr<const VariableInfo> read_variable(Reader& r) {
  auto v = std::make_shared<VariableInfo>();
  v->name = r.str();
  v->dtype = static_cast<DType>(r.u32());
  v->shape.resize(r.u32());
  for (auto& d : v->shape) d = r.i64();
  v->sharded = r.u8() != 0;
  v->shards.resize(r.u32());
  for (auto& s : v->shards) {
    s.ps = static_cast<int>(r.u32());
    s.id = r.u64();
    s.row_offset = r.i64();
    s.shape.resize(r.u32());
    for (auto& d : s.shape) d = r.i64();
  }
  v->synchronization = r.u32();
  v->aggregation = r.u32();
  v->trainable = r.u8() != 0;
  return v;
}

std::string demangled_type(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && name != nullptr) ? name : typeid(e).name();
  std::free(name);
  return out;
}

std::string task_name(const std::string& job, int index) { return job + " task " + std::to_string(index); }

std::string incarnation_key(const std::string& job, int index) {
  return "strata.ps/" + job + "/" + std::to_string(index) + "/incarnation";
}
std::string clients_key(const std::string& job, int index, const std::string& incarnation) {
  return "strata.ps/" + job + "/" + std::to_string(index) + "/" + incarnation + "/clients";
}
std::string comm_name(const std::string& job, int index, const std::string& incarnation, std::int64_t client) {
  return "strata.ps/" + job + "/" + std::to_string(index) + "/" + incarnation + "/c" + std::to_string(client);
}

// ---- Channel ----

Channel::Channel(const strata_transport_vtable* vt, strata_transport_t transport, const std::string& name,
                 int rank, std::int64_t timeout_ms, std::string peer)
    : vt_(vt), peer_(std::move(peer)), peer_rank_(1 - rank) {
  strata_error err;
  strata_error_init(&err);
  detail::check_status(vt_->comm_create(transport, name.c_str(), rank, 2, timeout_ms, &comm_, &err), err,
                       ("connecting to " + peer_ + " (communicator " + name + ")").c_str());
  strata_transport_caps caps{};
  STRATA_INIT_HEADER(&caps, strata_transport_caps);
  strata_error_init(&err);
  if (vt_->get_caps(transport, &caps, &err) == STRATA_OK)
    needs_mr_ = (caps.flags & STRATA_TRANSPORT_CAP_REQUIRES_MR) != 0;
}

Channel::~Channel() {
  if (comm_ == nullptr) return;
  if (peer_rank_ == 0 && server_reading_ && !broken_) {
    try {
      Frame bye;
      bye.kind = kBye;
      bye.id = next_id_++;
      send(bye, 1000);
    } catch (const std::exception&) {
      // The server is gone already: nothing to say goodbye to.
    }
  }
  vt_->comm_destroy(comm_);
}

void Channel::abort(const std::string& reason) {
  broken_ = true;
  vt_->comm_abort(comm_, reason.c_str());
}

void Channel::wait(strata_request_t req, std::int64_t timeout_ms, const std::atomic<bool>* stop, const char* what,
                   bool* stopped) {
  const auto start = Clock::now();
  for (;;) {
    std::int64_t slice = 200;
    if (timeout_ms >= 0)
      slice = std::min<std::int64_t>(
          slice, std::max<std::int64_t>(
                     1, timeout_ms - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)
                                         .count()));
    std::uint64_t bytes = 0;
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st = vt_->wait(comm_, req, slice, &bytes, &err);
    if (st == STRATA_OK) return;
    if (st != STRATA_ERR_DEADLINE_EXCEEDED) {
      broken_ = true;
      detail::check_status(st, err, (peer_ + ": " + what).c_str());
    }
    if (stop != nullptr && stop->load()) {
      vt_->cancel(comm_, req);
      *stopped = true;
      return;
    }
    if (timeout_ms >= 0 &&
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count() >= timeout_ms) {
      vt_->cancel(comm_, req);
      broken_ = true;
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, peer_, ": ", what, " did not finish within ", timeout_ms,
                   " ms; the task is stuck or the network is down (raise /timeouts or the operation deadline)");
    }
  }
}

Channel::Posted Channel::post(bool send, void* data, std::uint64_t bytes, std::uint64_t tag) {
  STRATA_ENFORCE(!broken_.load(), STRATA_ERR_UNAVAILABLE, peer_,
                 ": the connection failed earlier; no more messages go through it");
  strata_buffer buf{};
  STRATA_INIT_HEADER(&buf, strata_buffer);
  buf.data = data;
  buf.bytes = bytes;
  buf.device = DLDevice{kDLCPU, 0};
  strata_error err;
  strata_error_init(&err);
  if (needs_mr_) {
    detail::check_status(vt_->mem_register(comm_, data, bytes, buf.device, &buf.mr, &err), err,
                         (peer_ + ": registering a message buffer").c_str());
  }
  strata_request_t req = nullptr;
  strata_error_init(&err);
  const strata_status_t st = send ? vt_->isend(comm_, peer_rank_, tag, &buf, &req, &err)
                                : vt_->irecv(comm_, peer_rank_, tag, &buf, &req, &err);
  if (st != STRATA_OK) {
    if (buf.mr != nullptr) vt_->mem_deregister(comm_, buf.mr);
    broken_ = true;
    detail::check_status(st, err, (peer_ + (send ? ": posting a send" : ": posting a receive")).c_str());
  }
  return Posted{req, buf.mr};
}

void Channel::finish(Posted p, bool send, std::int64_t timeout_ms, const std::atomic<bool>* stop, bool* stopped) {
  try {
    wait(p.req, timeout_ms, stop, send ? "sending a message" : "receiving a message", stopped);
  } catch (...) {
    if (p.mr != nullptr) vt_->mem_deregister(comm_, p.mr);
    throw;
  }
  if (p.mr != nullptr) vt_->mem_deregister(comm_, p.mr);
}

void Channel::transfer(bool send, void* data, std::uint64_t bytes, std::uint64_t tag, std::int64_t timeout_ms,
                       const std::atomic<bool>* stop, bool* stopped) {
  finish(post(send, data, bytes, tag), send, timeout_ms, stop, stopped);
}

void Channel::send(const Frame& f, std::int64_t timeout_ms) {
  WireHeader h{kMagic, f.kind, f.status, 0, f.id, f.payload.size(), f.bulk_len};
  bool stopped = false;
  transfer(true, &h, sizeof h, kHeaderTag, timeout_ms, nullptr, &stopped);
  if (!f.payload.empty())
    transfer(true, const_cast<char*>(f.payload.data()), f.payload.size(), kPayloadTag, timeout_ms, nullptr,
             &stopped);
  if (f.bulk_len > 0) {
    // The receiver has posted its receive into the bulk's destination when
    // it says so: the bytes then go straight there.
    std::uint64_t ready = 0;
    transfer(false, &ready, sizeof ready, kClearTag, timeout_ms, nullptr, &stopped);
    if (ready != f.id) {
      broken_ = true;
      STRATA_THROW(STRATA_ERR_DATA_LOSS, peer_, ": cleared message ", ready, " to go while message ", f.id,
                   " waited; the connection is out of step");
    }
    transfer(true, const_cast<void*>(f.bulk), f.bulk_len, kBulkTag, timeout_ms, nullptr, &stopped);
  }
}

bool Channel::recv(Frame& out, std::int64_t timeout_ms, const std::atomic<bool>* stop, const BulkPlace* place) {
  WireHeader h{};
  bool stopped = false;
  transfer(false, &h, sizeof h, kHeaderTag, timeout_ms, stop, &stopped);
  if (stopped) return false;
  if (h.magic != kMagic) {
    broken_ = true;
    STRATA_THROW(STRATA_ERR_DATA_LOSS, peer_, ": received a message that is not a parameter-server frame (magic ",
                 h.magic, "); is another program or another Strata version using this communicator?");
  }
  out.kind = h.kind;
  out.status = h.status;
  out.id = h.id;
  out.bulk = nullptr;
  out.bulk_len = 0;
  out.payload.assign(static_cast<std::size_t>(h.len), '\0');
  // The rest follows its header at once: wait for it without `stop`.
  const std::int64_t rest_ms = timeout_ms < 0 ? 600000 : timeout_ms;
  if (h.len > 0) transfer(false, out.payload.data(), h.len, kPayloadTag, rest_ms, nullptr, &stopped);
  if (h.bulk_len > 0) {
    void* dst = place != nullptr && *place ? (*place)(out, h.bulk_len) : nullptr;
    if (dst == nullptr) {
      broken_ = true;
      STRATA_THROW(STRATA_ERR_DATA_LOSS, peer_, ": message ", h.id, " (kind ", h.kind, ") carries ", h.bulk_len,
                   " bulk bytes that nothing here expects; the two sides speak different protocols");
    }
    Posted p = post(false, dst, h.bulk_len, kBulkTag);
    std::uint64_t ready = h.id;
    try {
      transfer(true, &ready, sizeof ready, kClearTag, rest_ms, nullptr, &stopped);
    } catch (...) {
      vt_->cancel(comm_, p.req);
      if (p.mr != nullptr) vt_->mem_deregister(comm_, p.mr);
      throw;
    }
    finish(p, false, rest_ms, nullptr, &stopped);
    out.bulk = dst;
    out.bulk_len = h.bulk_len;
  }
  return true;
}

Frame Channel::call(std::uint32_t kind, std::string payload, std::int64_t timeout_ms, const std::atomic<bool>* stop,
                    const void* bulk, std::uint64_t bulk_len, BulkSink sink) {
  std::lock_guard<std::mutex> l(call_mu_);
  Frame req;
  req.kind = kind;
  req.id = next_id_++;
  req.payload = std::move(payload);
  req.bulk = bulk;
  req.bulk_len = bulk_len;
  send(req, timeout_ms);
  Frame resp;
  const BulkPlace place = [&](const Frame& f, std::uint64_t len) -> void* {
    if (sink.data == nullptr || len != sink.len) {
      broken_ = true;
      STRATA_THROW(STRATA_ERR_DATA_LOSS, peer_, ": answer ", f.id, " carries ", len, " bulk bytes where ",
                   sink.len, " were expected");
    }
    return sink.data;
  };
  if (!recv(resp, timeout_ms, stop, &place)) {
    // The answer may still come; this channel can no longer pair them up.
    broken_ = true;
    STRATA_THROW(STRATA_ERR_CANCELLED, peer_, ": the call was cancelled (the caller is shutting down)");
  }
  if (resp.id != req.id || resp.kind != kind) {
    broken_ = true;
    STRATA_THROW(STRATA_ERR_DATA_LOSS, peer_, ": answer ", resp.id, " (kind ", resp.kind, ") to request ", req.id,
                 " (kind ", kind, "); the connection is out of step");
  }
  if (resp.status != STRATA_OK) detail::throw_status(resp.status, resp.payload);
  if (kind == kStop) server_reading_ = false;
  return resp;
}

// ---- Runtime ----

std::shared_ptr<Runtime> Runtime::current() {
  std::lock_guard<std::mutex> l(g_runtime_mu);
  auto rt = g_runtime.lock();
  STRATA_ENFORCE(rt != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "no parameter-server runtime in this process: remote variables are used inside a "
                 "ClusterCoordinator (chief) or a strata::Server (worker) process");
  return rt;
}

const strata_host_api* Runtime::api() const { return PluginHost::global().host_api(); }

int Runtime::count(const std::string& job) const {
  return static_cast<int>(job_addresses(spec_, job).size());
}

// The cluster as the configured resolver describes it, else auto-detection
// (TF_CONFIG, Slurm, ...); nullopt when there is no cluster (`why` says why).
std::optional<json> describe_cluster(std::string* resolver, std::string* why) {
  PluginHost& host = PluginHost::global();
  std::string configured;
  json resolver_options = json::object();
  if (auto part = job_config("/cluster_resolver"); part && part->is_object()) {
    configured = part->value("name", std::string());
    if (part->contains("options")) resolver_options = part->at("options");
  }
  const ResolverChoice choice = choose_cluster_resolver(host, configured);
  *resolver = choice.name;
  *why = choice.reason;
  if (choice.name.empty()) return std::nullopt;
  PluginInstance inst = host.create(STRATA_KIND_CLUSTER_RESOLVER, choice.name, resolver_options.dump());
  const auto* rvt = inst.vtable_as<strata_resolver_vtable>();
  std::string text;
  strata_error err;
  strata_error_init(&err);
  detail::check_status(rvt->describe(static_cast<strata_resolver_t>(inst.handle()), &append_to_string, &text, &err),
                       err, ("describe() of cluster resolver '" + choice.name + "'").c_str());
  const json desc = json::parse(text, nullptr, false);
  STRATA_ENFORCE(desc.is_object(), STRATA_ERR_INTERNAL, "cluster resolver '", choice.name,
                 "' returned invalid JSON: ", text);
  return desc;
}

std::shared_ptr<Runtime> Runtime::start(const std::string& job_override, int index_override, bool server) {
  std::lock_guard<std::mutex> l(g_runtime_mu);
  STRATA_ENFORCE(g_runtime.expired(), STRATA_ERR_FAILED_PRECONDITION,
                 "this process already runs a ClusterCoordinator or a Server; one per process");
  std::shared_ptr<Runtime> rt(new Runtime());
  PluginHost& host = PluginHost::global();
  ResolverChoice choice;
  const std::optional<json> described = describe_cluster(&choice.name, &choice.reason);
  STRATA_ENFORCE(described.has_value(), STRATA_ERR_FAILED_PRECONDITION,
                 "parameter-server training needs a cluster (chief, worker and ps tasks) but none was found: ",
                 choice.reason, "; set TF_CONFIG (or run under strata-run or Slurm)");
  const json& desc = *described;
  rt->spec_ = desc.value("cluster_spec", json::object());
  rt->job_ = job_override;
  rt->index_ = index_override;
  if (rt->job_.empty() && desc.contains("task_type") && desc["task_type"].is_string())
    rt->job_ = desc["task_type"].get<std::string>();
  if (rt->index_ < 0 && desc.contains("task_id") && desc["task_id"].is_number_integer())
    rt->index_ = desc["task_id"].get<int>();
  STRATA_ENFORCE(!rt->job_.empty() && rt->index_ >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "this process's task is unknown (cluster resolver '", choice.name,
                 "' gave none); set TF_CONFIG's \"task\" or pass --job and --index");
  if (server)
    STRATA_ENFORCE(rt->job_ == "worker" || rt->job_ == "ps", STRATA_ERR_INVALID_ARGUMENT, "this process is ",
                   task_name(rt->job_, rt->index_),
                   "; only worker and ps tasks run a Server (the chief runs ClusterCoordinator)");
  else
    STRATA_ENFORCE(rt->job_ == "chief", STRATA_ERR_FAILED_PRECONDITION,
                   "ClusterCoordinator runs on the chief, but this process is ", task_name(rt->job_, rt->index_),
                   "; worker and ps tasks run strata::Server::from_env().join() (or strata-server)");
  const auto tasks = job_addresses(rt->spec_, rt->job_);
  STRATA_ENFORCE(static_cast<std::size_t>(rt->index_) < tasks.size(), STRATA_ERR_INVALID_ARGUMENT, "task ",
                 rt->job_, " ", rt->index_, " is not in the cluster ", rt->spec_.dump(), "; fix --job/--index or TF_CONFIG");
  const auto chiefs = job_addresses(rt->spec_, "chief");
  STRATA_ENFORCE(!chiefs.empty() && !chiefs[0].empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "parameter-server training needs a \"chief\" task (the coordinator) in the cluster ",
                 rt->spec_.dump(), "; add \"chief\": [\"host:port\"]");
  STRATA_ENFORCE(!job_addresses(rt->spec_, "worker").empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "parameter-server training needs \"worker\" tasks in the cluster ", rt->spec_.dump());
  if (auto v = job_config("/timeouts/rendezvous_s"); v && v->is_number() && v->get<double>() > 0)
    rt->rendezvous_ms_ = static_cast<std::int64_t>(v->get<double>() * 1000);
  rt->load_ps_timeouts();
  // The chief serves the rendezvous store on its address; every task talks to it.
  if (host.store_address().empty()) {
    StoreConfig cfg;
    cfg.address = chiefs[0];
    cfg.serve = rt->job_ == "chief" && rt->index_ == 0;
    cfg.timeout_s = static_cast<double>(rt->rendezvous_ms_) / 1000.0;
    host.connect_store(cfg);
  }
  // The transport of every connection.
  std::string tname = "tcp";
  json topts = json::object();
  if (const char* e = std::getenv("STRATA_TRANSPORT"); e != nullptr && e[0] != '\0') tname = e;
  else if (auto t = job_config("/transport"); t && t->is_object() && t->contains("name")) {
    tname = t->at("name").get<std::string>();
    if (t->contains("options")) topts = t->at("options");
  }
  rt->transport_ = host.create(STRATA_KIND_TRANSPORT, tname, topts.dump());
  rt->vt_ = rt->transport_.vtable_as<strata_transport_vtable>();
  g_runtime = rt;
  detail::logger("ps")->info("{} {}: cluster {} via resolver '{}', transport '{}'", rt->job_, rt->index_,
                             rt->spec_.dump(), choice.name, tname);
  return rt;
}

// /timeouts/ps_grace_s (how long a ps task may be away before it counts as
// failed) and /timeouts/ps_op_s (one ps operation's deadline, on workers;
// the coordinator takes CoordinatorOptions::op_timeout_s).
void Runtime::load_ps_timeouts() {
  if (auto v = job_config("/timeouts/ps_grace_s"); v && v->is_number() && v->get<double>() >= 0)
    ps_grace_ms_ = static_cast<std::int64_t>(v->get<double>() * 1000);
  if (auto v = job_config("/timeouts/ps_op_s"); v && v->is_number() && v->get<double>() > 0)
    op_timeout_ms_ = static_cast<std::int64_t>(v->get<double>() * 1000);
  std::random_device rd;
  token_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
}

Runtime::~Runtime() {
  std::lock_guard<std::mutex> l(mu_);
  ps_.clear();  // every communicator before the transport
}

void Runtime::store_set(const std::string& key, const std::string& value) {
  strata_error err;
  strata_error_init(&err);
  detail::check_status(api()->store_set(api(), key.c_str(), value.data(), value.size(), rendezvous_ms_, &err), err,
                       ("store_set " + key).c_str());
}

std::string Runtime::store_get(const std::string& key, std::int64_t timeout_ms) {
  std::string out;
  strata_error err;
  strata_error_init(&err);
  detail::check_status(api()->store_get(api(), key.c_str(), &append_to_string, &out, timeout_ms, &err), err,
                       ("store_get " + key).c_str());
  return out;
}

std::int64_t Runtime::store_add(const std::string& key, std::int64_t delta, std::int64_t timeout_ms) {
  std::int64_t v = 0;
  strata_error err;
  strata_error_init(&err);
  detail::check_status(api()->store_add(api(), key.c_str(), delta, &v, timeout_ms, &err), err,
                       ("store_add " + key).c_str());
  return v;
}

std::unique_ptr<Channel> Runtime::connect(const std::string& job, int index, const std::string& role,
                                          std::int64_t timeout_ms, json* hello_reply, const std::atomic<bool>* stop) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string inc;
  try {
    inc = store_get(incarnation_key(job, index), timeout_ms);
  } catch (const Error& e) {
    detail::throw_status(e.code() == STRATA_ERR_DEADLINE_EXCEEDED ? STRATA_ERR_UNAVAILABLE : e.code(),
                         detail::str_cat(task_name(job, index), " never started serving within ", timeout_ms,
                                         " ms (", e.what(), "); start it (strata-server --job ", job, " --index ",
                                         index, ") or raise /timeouts/rendezvous_s"));
  }
  const std::int64_t id = store_add(clients_key(job, index, inc), 1, ms_left(deadline) + 1);
  auto ch = std::make_unique<Channel>(vt_, transport(), comm_name(job, index, inc, id), 1,
                                      std::max<std::int64_t>(1, ms_left(deadline)), task_name(job, index));
  json hello{{"role", role}, {"job", job_}, {"index", index_}};
  Frame r = ch->call(kHello, hello.dump(), std::max<std::int64_t>(1, ms_left(deadline)), stop);
  if (hello_reply != nullptr) *hello_reply = json::parse(r.payload);
  return ch;
}

std::shared_ptr<Channel> Runtime::ps_channel(int ps) {
  STRATA_ENFORCE(ps >= 0 && ps < count("ps"), STRATA_ERR_INVALID_ARGUMENT, "ps task ", ps,
                 " is not in the cluster (", count("ps"), " ps tasks)");
  std::lock_guard<std::mutex> l(mu_);
  auto it = ps_.find(ps);
  if (it != ps_.end()) {
    STRATA_ENFORCE(!it->second->broken(), STRATA_ERR_UNAVAILABLE, task_name("ps", ps),
                   " is unavailable: its connection failed; a ps task holds variables, so the job must restart "
                   "from its last checkpoint");
    return it->second;
  }
  json hello;
  std::shared_ptr<Channel> ch = connect("ps", ps, job_, rendezvous_ms_, &hello);
  ps_incarnation_.emplace(ps, hello.value("incarnation", std::string()));
  ps_[ps] = ch;
  return ch;
}

}  // namespace ps_detail

// ---- public helpers ----

const char* value_kind_name(const Value& v) {
  switch (v.index()) {
    case 0: return "none";
    case 1: return "int64";
    case 2: return "double";
    case 3: return "string";
    case 4: return "tensor";
    case 5: return "remote variable";
    case 6: return "per-worker value";
    default: return "unknown";
  }
}

const char* remote_value_status_name(RemoteValueStatus s) {
  switch (s) {
    case RemoteValueStatus::kScheduled: return "scheduled";
    case RemoteValueStatus::kRunning: return "running";
    case RemoteValueStatus::kReady: return "ready";
    case RemoteValueStatus::kAborted: return "aborted";
    case RemoteValueStatus::kError: return "error";
  }
  return "unknown";
}

namespace {
std::mutex& registry_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, RemoteFunction>& registry() {
  static std::map<std::string, RemoteFunction> r;
  return r;
}
}  // namespace

void register_function(const std::string& name, RemoteFunction fn) {
  STRATA_ENFORCE(!name.empty(), STRATA_ERR_INVALID_ARGUMENT, "a function needs a non-empty name");
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_INVALID_ARGUMENT, "function '", name, "' is empty");
  std::lock_guard<std::mutex> l(registry_mu());
  STRATA_ENFORCE(registry().count(name) == 0, STRATA_ERR_ALREADY_EXISTS, "function '", name,
                 "' is registered twice; give each STRATA_REGISTER_FUNCTION its own name");
  registry()[name] = std::move(fn);
}

std::vector<std::string> registered_functions() {
  std::lock_guard<std::mutex> l(registry_mu());
  std::vector<std::string> out;
  for (const auto& [k, v] : registry()) out.push_back(k);
  return out;
}

std::string current_task_type() {
  std::string resolver, why;
  const auto desc = ps_detail::describe_cluster(&resolver, &why);
  if (!desc || !desc->contains("task_type") || !(*desc)["task_type"].is_string()) return std::string();
  return (*desc)["task_type"].get<std::string>();
}

namespace ps_detail {
RemoteFunction find_function(const std::string& name) {
  std::lock_guard<std::mutex> l(registry_mu());
  auto it = registry().find(name);
  return it == registry().end() ? RemoteFunction() : it->second;
}
}  // namespace ps_detail

}  // namespace strata
