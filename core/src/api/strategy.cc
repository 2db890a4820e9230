// SPDX-License-Identifier: Apache-2.0
#include "strata/strategy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "api/default_strategy.h"
#include "api/kernels.h"
#include "api/strategy_impl.h"
#include "log.h"
#include "strata/plugin_host.hpp"
#include "strata/config.hpp"
#include "strata/store.hpp"
#include "strata/variable.hpp"

namespace strata {
namespace detail {

using nlohmann::json;

namespace {

void append_string(void* user, const char* data, std::uint64_t len) {
  static_cast<std::string*>(user)->append(data, static_cast<std::size_t>(len));
}

std::vector<std::string> string_list(const json& j, const char* key) {
  std::vector<std::string> out;
  if (!j.contains(key)) return out;
  for (const auto& e : j.at(key)) out.push_back(e.get<std::string>());
  return out;
}

}  // namespace

StrategyImpl::StrategyImpl(PluginInstance inst, std::string n, bool dflt)
    : instance(std::move(inst)), name(std::move(n)), is_default(dflt) {
  vt = instance.vtable_as<strata_strategy_vtable>();
  handle = static_cast<strata_strategy_t>(instance.handle());
  STRATA_ENFORCE(vt != nullptr && handle != nullptr, STRATA_ERR_INTERNAL, "strategy '", name,
                 "' was created without a vtable or handle");
  strata_error err;
  strata_error_init(&err);
  check(vt->describe(handle, &append_string, &describe_json, &err), err,
        ("describe() of strategy '" + name + "'").c_str());
  try {
    const json j = json::parse(describe_json);
    num_replicas_in_sync = j.at("num_replicas_in_sync").get<int>();
    num_local_replicas = j.at("num_local_replicas").get<int>();
    worker_devices = string_list(j, "worker_devices");
    parameter_devices = string_list(j, "parameter_devices");
    worker_index = j.value("worker_index", 0);
    num_workers = j.value("num_workers", 1);
    is_chief = j.value("is_chief", worker_index == 0);
  } catch (const json::exception& e) {
    STRATA_THROW(STRATA_ERR_INTERNAL, "strategy '", name, "' returned an invalid describe() JSON (",
                 e.what(), "): ", describe_json,
                 "; it must contain integer num_replicas_in_sync and num_local_replicas");
  }
  STRATA_ENFORCE(num_local_replicas >= 1 && num_replicas_in_sync >= num_local_replicas,
                 STRATA_ERR_INTERNAL, "strategy '", name, "' describes ", num_local_replicas,
                 " local and ", num_replicas_in_sync,
                 " replicas in sync; it needs 1 <= local <= in sync");
  view = std::make_unique<Strategy>(this, nullptr);
  extended = std::make_unique<StrategyExtended>(this);
  // Probe each local replica's global id once, so that
  // experimental_distribute_values_from_function works in any context.
  replica_ids.assign(static_cast<std::size_t>(num_local_replicas), -1);
  run_on_replicas(*this, [this](ReplicaContext& ctx) {
    replica_ids[ctx.local_replica_id()] = ctx.replica_id_in_sync_group();
  });
}

StrategyImpl::~StrategyImpl() {
  default_replica.reset();
  extended.reset();
  view.reset();
}

ThreadState& tls() {
  thread_local ThreadState state;
  return state;
}

StrategyImpl* current_non_default() {
  ThreadState& t = tls();
  if (t.merge != nullptr && !t.merge->is_default) return t.merge;
  if (t.replica != nullptr && !t.replica->impl()->is_default) return t.replica->impl();
  for (auto it = t.scopes.rbegin(); it != t.scopes.rend(); ++it)
    if (!(*it)->is_default) return *it;
  return nullptr;
}

StrategyImpl& current_impl() {
  StrategyImpl* s = current_non_default();
  return s ? *s : default_impl();
}

bool in_replica_of(const StrategyImpl& s) {
  const ThreadState& t = tls();
  return t.merge == nullptr && t.replica != nullptr && t.replica->impl() == &s;
}

void require_cross_replica(const StrategyImpl& s, const char* what) {
  const ThreadState& t = tls();
  STRATA_ENFORCE(t.merge != nullptr || t.replica == nullptr, STRATA_ERR_FAILED_PRECONDITION, what,
                 " must be called in cross-replica context, not inside a replica function of "
                 "Strategy::run; call it after run returns, or from ReplicaContext::merge_call");
}

CrossReplicaLock::CrossReplicaLock(StrategyImpl& s) {
  if (tls().merge != &s) lock_ = std::unique_lock<std::mutex>(s.cross_mu);
}

strata_status_t status_from_current_exception(strata_error* err) {
  strata_status_t code = STRATA_ERR_INTERNAL;
  std::string msg;
  try {
    throw;
  } catch (const Error& e) {
    code = e.code();
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("exception in user code: ") + e.what();
  } catch (...) {
    msg = "unknown exception in user code";
  }
  if (code == STRATA_OK) code = STRATA_ERR_INTERNAL;
  if (err != nullptr) {
    err->code = code;
    std::snprintf(err->message, sizeof(err->message), "%s", msg.c_str());
  }
  return code;
}

namespace {

// Sets this thread's replica context for the duration of a replica function.
class ReplicaGuard {
 public:
  explicit ReplicaGuard(ReplicaContext* ctx) : saved_replica_(tls().replica), saved_merge_(tls().merge) {
    tls().replica = ctx;
    tls().merge = nullptr;
  }
  ~ReplicaGuard() {
    tls().replica = saved_replica_;
    tls().merge = saved_merge_;
  }
  ReplicaGuard(const ReplicaGuard&) = delete;
  ReplicaGuard& operator=(const ReplicaGuard&) = delete;

 private:
  ReplicaContext* saved_replica_;
  StrategyImpl* saved_merge_;
};

struct RunState {
  StrategyImpl* impl = nullptr;
  const std::function<void(ReplicaContext&)>* fn = nullptr;
  // One slot per local replica, each written only by that replica's thread;
  // run reads them after the plugin's run returned (which joins them).
  std::vector<std::exception_ptr> errors;
  std::vector<int> order;
  std::vector<char> aborted;
  std::atomic<int> seq{0};
};

strata_status_t replica_trampoline(void* user, strata_replica_t r, std::uint32_t local,
                                   strata_error* err) {
  auto* st = static_cast<RunState*>(user);
  if (local >= st->errors.size()) {
    if (err) {
      err->code = STRATA_ERR_INTERNAL;
      std::snprintf(err->message, sizeof(err->message),
                    "strategy '%s' called the replica function with local id %u but describe() "
                    "reported %zu local replicas",
                    st->impl->name.c_str(), local, st->errors.size());
    }
    return STRATA_ERR_INTERNAL;
  }
  try {
    ReplicaContext ctx(st->impl, r, local);
    ReplicaGuard guard(&ctx);
    (*st->fn)(ctx);
    return STRATA_OK;
  } catch (...) {
    st->errors[local] = std::current_exception();
    st->order[local] = st->seq.fetch_add(1);
    const strata_status_t code = status_from_current_exception(err);
    st->aborted[local] = code == STRATA_ERR_ABORTED || code == STRATA_ERR_CANCELLED;
    return code;
  }
}

}  // namespace

void run_on_replicas(StrategyImpl& s, const std::function<void(ReplicaContext&)>& fn) {
  const ThreadState& t = tls();
  STRATA_ENFORCE(t.replica == nullptr && t.merge == nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "Strategy::run was called inside ",
                 t.merge ? "a merge_call function" : "a replica function",
                 "; run is not reentrant: call it from cross-replica context (outside run)");
  const auto n = static_cast<std::size_t>(s.num_local_replicas);
  RunState st;
  st.impl = &s;
  st.fn = &fn;
  st.errors.resize(n);
  st.order.assign(n, std::numeric_limits<int>::max());
  st.aborted.assign(n, 0);
  strata_error err;
  strata_error_init(&err);
  strata_status_t status;
  {
    CrossReplicaLock lock(s);
    status = s.vt->run(s.handle, &replica_trampoline, &st, &err);
  }
  // Prefer the failure that caused the others (theirs read ABORTED).
  int best = -1;
  for (int pass = 0; pass < 2 && best < 0; ++pass) {
    for (std::size_t i = 0; i < n; ++i) {
      if (!st.errors[i] || (pass == 0 && st.aborted[i])) continue;
      if (best < 0 || st.order[i] < st.order[static_cast<std::size_t>(best)]) best = static_cast<int>(i);
    }
  }
  if (best >= 0) std::rethrow_exception(st.errors[static_cast<std::size_t>(best)]);
  check(status, err, ("run of strategy '" + s.name + "'").c_str());
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Scope

Scope::Scope(std::shared_ptr<detail::StrategyImpl> impl) : impl_(std::move(impl)) {
  detail::tls().scopes.push_back(impl_.get());
}

Scope::Scope(Scope&& o) noexcept : impl_(std::move(o.impl_)) {}

Scope::~Scope() {
  if (!impl_) return;
  auto& scopes = detail::tls().scopes;
  // Innermost first is the contract; tolerate a different order by removing
  // the innermost entry of this strategy.
  for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
    if (*it == impl_.get()) {
      scopes.erase(std::next(it).base());
      break;
    }
  }
}

// ---------------------------------------------------------------------------
// Strategy

Strategy::Strategy(detail::StrategyImpl* impl, std::shared_ptr<detail::StrategyImpl> owner)
    : impl_(impl), owner_(std::move(owner)) {}

Strategy::Strategy(Strategy&& o) noexcept
    : impl_(std::exchange(o.impl_, nullptr)), owner_(std::move(o.owner_)) {}

Strategy& Strategy::operator=(Strategy&& o) noexcept {
  if (this != &o) {
    impl_ = std::exchange(o.impl_, nullptr);
    owner_ = std::move(o.owner_);
  }
  return *this;
}

Strategy::~Strategy() = default;

namespace detail {
namespace {

// Strategies whose processes form a cluster: core resolves the cluster,
// connects the rendezvous store and passes the resolver's description as
// option "cluster" (plus "transport" from the job config).
bool needs_cluster(const std::string& name) {
  return name == "multi_worker_mirrored" || name == "parameter_server";
}

// The job config at `pointer` as JSON (set by from_config or
// PluginHost::set_config), or nullopt.
std::optional<json> job_config(const char* pointer) {
  const strata_host_api* api = PluginHost::global().host_api();
  std::string out;
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st = api->get_config(api, pointer, &append_string, &out, &err);
  if (st == STRATA_ERR_NOT_FOUND) return std::nullopt;
  check(st, err, (std::string("reading the job config at ") + pointer).c_str());
  return json::parse(out);
}

// The description of a process that is alone (no cluster configured).
json single_process_cluster() {
  return json{{"cluster_spec", json::object()}, {"task_type", nullptr},      {"task_id", nullptr},
              {"rpc_layer", nullptr},           {"environment", nullptr},    {"num_accelerators", json::object()},
              {"env_after", json::object()}};
}

// Apply a resolver's env_after ({VAR: value}) to this process, before any
// plugin or user code touches the devices it names (CUDA_VISIBLE_DEVICES).
void apply_env_after(const json& description, const std::string& resolver) {
  const json env = description.value("env_after", json::object());
  if (!env.is_object()) return;
  for (auto it = env.begin(); it != env.end(); ++it) {
    if (!it.value().is_string() || it.key().empty() || it.key().find('=') != std::string::npos) {
      logger("cluster")->warn("cluster resolver '{}': ignoring env_after entry {}={} (not VAR: \"string\")",
                              resolver, it.key(), it.value().dump());
      continue;
    }
    const std::string& value = it.value().get_ref<const std::string&>();
    const char* old = std::getenv(it.key().c_str());
    if (old == nullptr || value != old)
      logger("cluster")->info("cluster resolver '{}' sets {}={} (was {})", resolver, it.key(), value,
                              old == nullptr ? "unset" : std::string("'") + old + "'");
    ::setenv(it.key().c_str(), value.c_str(), 1);
  }
}

// Resolve the cluster: /cluster_resolver of the job config (or
// STRATA_CLUSTER_RESOLVER), else auto-detection (slurm, tf_config, tpu; see
// choose_cluster_resolver), else a single process. The chosen resolver's
// env_after is applied to this process.
json resolve_cluster() {
  std::string configured;
  json options = json::object();
  if (auto part = job_config("/cluster_resolver")) {
    configured = part->value("name", std::string());
    if (part->contains("options")) options = part->at("options");
  }
  const ResolverChoice choice = choose_cluster_resolver(PluginHost::global(), configured);
  for (const auto& [name, found] : choice.probes) logger("cluster")->debug("detect {}: {}", name, found);
  if (choice.name.empty()) {
    logger("cluster")->info("{}", choice.reason);
    return single_process_cluster();
  }
  const std::string& resolver = choice.name;
  logger("cluster")->info("cluster resolver '{}': {}", resolver, choice.reason);
  PluginInstance inst = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, resolver, options.dump());
  const auto* vt = inst.vtable_as<strata_resolver_vtable>();
  std::string text;
  strata_error err;
  strata_error_init(&err);
  check(vt->describe(static_cast<strata_resolver_t>(inst.handle()), &append_string, &text, &err), err,
        ("describe() of cluster resolver '" + resolver + "'").c_str());
  json j;
  try {
    j = json::parse(text);
    if (!j.is_object()) throw std::runtime_error("not an object");
  } catch (const std::exception& e) {
    STRATA_THROW(STRATA_ERR_INTERNAL, "cluster resolver '", resolver, "' returned an invalid describe() JSON (",
                 e.what(), "): ", text);
  }
  j["resolver"] = resolver;
  apply_env_after(j, resolver);
  return j;
}

// "grpc://host:port" -> "host:port".
std::string strip_layer(const std::string& address) {
  const auto p = address.find("://");
  return p == std::string::npos ? address : address.substr(p + 3);
}

// Lowest-index task address of `job`, or "" when the job is absent/empty.
std::string first_address(const json& spec, const char* job, std::size_t* count) {
  *count = 0;
  if (!spec.contains(job)) return "";
  const json& j = spec.at(job);
  std::string first;
  long long best = -1;
  if (j.is_array()) {
    *count = j.size();
    if (!j.empty() && j.at(0).is_string()) first = j.at(0).get<std::string>();
  } else if (j.is_object()) {
    *count = j.size();
    for (auto it = j.begin(); it != j.end(); ++it) {
      long long idx = -1;
      try {
        idx = std::stoll(it.key());
      } catch (const std::exception&) {
        continue;
      }
      if (it.value().is_string() && (best < 0 || idx < best)) {
        best = idx;
        first = it.value().get<std::string>();
      }
    }
  }
  return strip_layer(first);
}

// Connect this process's host services store to the chief's rendezvous
// store, once per process (later strategies reuse the connection).
void connect_store_once(const StoreConfig& cfg) {
  static std::mutex mu;
  static std::optional<std::string> connected;
  std::lock_guard<std::mutex> l(mu);
  if (connected) {
    STRATA_ENFORCE(*connected == cfg.address, STRATA_ERR_FAILED_PRECONDITION,
                   "this process is already connected to the rendezvous store at ", *connected,
                   " but the cluster now names ", cfg.address,
                   " as the chief; every strategy of one process must use the same cluster");
    return;
  }
  PluginHost::global().connect_store(cfg);
  connected = cfg.address;
}

// When `cluster` has more than one collective task (chief + workers) and
// this process is one of them, connect the rendezvous store: the chief
// (chief 0, else worker 0) serves it on its cluster address.
void join_rendezvous(const json& cluster) {
  const json spec = cluster.value("cluster_spec", json::object());
  if (!spec.is_object()) return;  // the strategy reports the malformed spec
  const json type = cluster.value("task_type", json());
  const json id = cluster.value("task_id", json());
  if (!type.is_string() || !id.is_number_integer()) return;
  const std::string t = type.get<std::string>();
  if (t != "chief" && t != "worker") return;  // evaluator and ps tasks do not join collectives
  std::size_t chiefs = 0, workers = 0;
  const std::string chief_addr = first_address(spec, "chief", &chiefs);
  const std::string worker_addr = first_address(spec, "worker", &workers);
  if (chiefs + workers <= 1) return;
  StoreConfig cfg;
  cfg.address = chiefs > 0 ? chief_addr : worker_addr;
  STRATA_ENFORCE(!cfg.address.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "the cluster spec has no address for its chief task (", chiefs > 0 ? "chief 0" : "worker 0",
                 "): ", spec.dump(), "; list \"host:port\" for every task");
  cfg.serve = id.get<long long>() == 0 && ((chiefs > 0 && t == "chief") || (chiefs == 0 && t == "worker"));
  if (const char* tok = std::getenv("STRATA_AUTH_TOKEN"); tok != nullptr && tok[0] != '\0') {
    cfg.auth_token = tok;
  } else if (auto v = job_config("/rendezvous/auth_token"); v && v->is_string()) {
    cfg.auth_token = v->get<std::string>();
  }
  double rendezvous_s = 120;
  if (auto v = job_config("/timeouts/rendezvous_s"); v && v->is_number()) rendezvous_s = v->get<double>();
  cfg.timeout_s = rendezvous_s;
  connect_store_once(cfg);
}

}  // namespace
}  // namespace detail

Strategy Strategy::create(const std::string& name, const std::string& options_json) {
  detail::ensure_default_registered();
  if (detail::needs_cluster(name)) {
    using nlohmann::json;
    json options = options_json.empty() ? json::object() : json::parse(options_json, nullptr, false);
    if (options.is_object()) {  // otherwise the plugin reports the malformed options
      if (!options.contains("cluster")) options["cluster"] = detail::resolve_cluster();
      // parameter_server's processes meet through the rendezvous store that
      // its ClusterCoordinator / strata::Server connects; they run no collectives.
      if (name != "parameter_server") detail::join_rendezvous(options["cluster"]);
      if (!options.contains("transport")) {
        if (auto t = detail::job_config("/transport"); t && t->is_object() && t->contains("name")) {
          json part{{"name", t->at("name")}};
          if (t->contains("options")) part["options"] = t->at("options");
          options["transport"] = part;
        }
      }
      PluginInstance inst = PluginHost::global().create(STRATA_KIND_STRATEGY, name, options.dump());
      auto impl = std::make_shared<detail::StrategyImpl>(std::move(inst), name, false);
      detail::StrategyImpl* raw = impl.get();
      return Strategy(raw, std::move(impl));
    }
  }
  if (name == detail::kDefaultStrategyName) {
    // The Default strategy is a singleton, as in TF. Options are still
    // validated (by a throwaway instance) so that a typo is reported.
    if (!options_json.empty() && options_json != "{}")
      PluginHost::global().create(STRATA_KIND_STRATEGY, name, options_json);
    return Strategy(detail::default_impl_ptr().get(), detail::default_impl_ptr());
  }
  PluginInstance inst =
      PluginHost::global().create(STRATA_KIND_STRATEGY, name, options_json.empty() ? "{}" : options_json);
  auto impl = std::make_shared<detail::StrategyImpl>(std::move(inst), name, false);
  detail::StrategyImpl* raw = impl.get();
  return Strategy(raw, std::move(impl));
}

Strategy Strategy::from_config(const Config& config) {
  using nlohmann::json;
  PluginHost::global().set_config(config.json());
  const std::string name = config.name("strategy", detail::kDefaultStrategyName);
  json options = json::parse(config.options_json("strategy"));
  const std::string cdo = config.name("cross_device_ops");
  if (!cdo.empty() && !options.contains("cross_device_ops")) {
    options["cross_device_ops"] = {{"name", cdo},
                                   {"options", json::parse(config.options_json("cross_device_ops"))}};
  }
  const double timeout = config.timeout_s("collective_s", -1.0);
  if (timeout > 0 && !options.contains("timeout_s")) options["timeout_s"] = timeout;
  return create(name, options.dump());
}

detail::StrategyImpl* Strategy::checked() const {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "use of a moved-from Strategy; use the Strategy it was moved into");
  return impl_;
}

Scope Strategy::scope() {
  detail::StrategyImpl* s = checked();
  detail::StrategyImpl* cur = detail::current_non_default();
  if (cur != nullptr && cur != s) {
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "Mixing different strategies: this thread is in '",
                 cur->name, "' (", cur->describe_json, ") and tried to enter the scope of '", s->name,
                 "'; leave the first strategy's scope (destroy its Scope) before entering another");
  }
  return Scope(s->shared_from_this());
}

void Strategy::run_replicas(const std::function<void(ReplicaContext&)>& fn) {
  detail::run_on_replicas(*checked(), fn);
}

void Strategy::check_per_replica_size(const PerReplica& args, const char* what) const {
  STRATA_ENFORCE(args.size() == static_cast<std::size_t>(checked()->num_local_replicas),
                 STRATA_ERR_INVALID_ARGUMENT, what, ": the per-replica argument has ", args.size(),
                 " components but strategy '", impl_->name, "' has ", impl_->num_local_replicas,
                 " local replicas; pass one value per local replica");
}

int Strategy::num_replicas_in_sync() const { return checked()->num_replicas_in_sync; }
int Strategy::num_local_replicas() const { return checked()->num_local_replicas; }
StrategyExtended& Strategy::extended() const { return *checked()->extended; }
const std::string& Strategy::name() const { return checked()->name; }

namespace {

void check_components(const detail::StrategyImpl& s, const DistributedValues& v, const char* what) {
  STRATA_ENFORCE(v.size() == static_cast<std::size_t>(s.num_local_replicas),
                 STRATA_ERR_INVALID_ARGUMENT, what, ": the value has ", v.size(),
                 " components but strategy '", s.name, "' has ", s.num_local_replicas,
                 " local replicas; pass a value produced by this strategy");
  for (std::size_t i = 0; i < v.size(); ++i)
    STRATA_ENFORCE(v[i].defined(), STRATA_ERR_INVALID_ARGUMENT, what, ": component ", i,
                   " is an empty Tensor; every replica needs a value");
}

int normalise_axis(int axis, std::int64_t ndim) {
  const std::int64_t a = axis < 0 ? axis + ndim : axis;
  STRATA_ENFORCE(a >= 0 && a < ndim, STRATA_ERR_INVALID_ARGUMENT, "axis ", axis,
                 " is out of range for values of rank ", ndim, "; use -rank <= axis < rank");
  return static_cast<int>(a);
}

}  // namespace

Tensor Strategy::reduce(ReduceOp op, const DistributedValues& value, std::optional<int> axis) {
  detail::StrategyImpl* s = checked();
  detail::require_cross_replica(*s, "Strategy::reduce");
  check_components(*s, value, "Strategy::reduce");
  if (!axis) return s->extended->reduce_to(op, value);
  return reduce(op, value, std::vector<int>{*axis});
}

Tensor Strategy::reduce(ReduceOp op, const DistributedValues& value, const std::vector<int>& axes) {
  detail::StrategyImpl* s = checked();
  detail::require_cross_replica(*s, "Strategy::reduce");
  check_components(*s, value, "Strategy::reduce");
  STRATA_ENFORCE(!axes.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "Strategy::reduce: the list of axes is empty; pass at least one axis, or no axis at all");
  const std::int64_t ndim = value[0].ndim();
  std::vector<int> norm;
  for (int a : axes) {
    const int ax = normalise_axis(a, ndim);
    STRATA_ENFORCE(std::find(norm.begin(), norm.end(), ax) == norm.end(), STRATA_ERR_INVALID_ARGUMENT,
                   "Strategy::reduce: axis ", a, " is listed twice; list each axis once");
    norm.push_back(ax);
  }
  // Highest first, so that summing one axis leaves the others' numbers valid.
  std::sort(norm.rbegin(), norm.rend());
  std::vector<Tensor> sums, counts;
  for (std::size_t i = 0; i < value.size(); ++i) {
    STRATA_ENFORCE(value[i].ndim() == ndim, STRATA_ERR_INVALID_ARGUMENT, "Strategy::reduce: replica ", i,
                   " has rank ", value[i].ndim(), " but replica 0 has ", ndim,
                   "; per-replica values must differ only along the reduced axes");
    double count = 1;
    Tensor t;
    const DLTensor* cur = &value[i].dl();
    for (int ax : norm) {
      count *= static_cast<double>(cur->shape[ax]);
      t = detail::sum_along_axis(*cur, ax);
      cur = &t.dl();
    }
    sums.push_back(std::move(t));
    counts.push_back(Tensor::scalar<double>(count));
  }
  Tensor total = s->extended->reduce_to(ReduceOp::SUM, PerReplica(std::move(sums)));
  if (op == ReduceOp::MEAN) {
    // TF divides by the global count of elements the axes held, not by the
    // replica count.
    Tensor n = s->extended->reduce_to(ReduceOp::SUM, PerReplica(std::move(counts)));
    detail::divide_by(total.mutable_dl(), n.data<double>()[0]);
  }
  return total;
}

Tensor Strategy::reduce(ReduceOp op, const TensorView& value, std::optional<int> axis) {
  detail::StrategyImpl* s = checked();
  detail::require_cross_replica(*s, "Strategy::reduce");
  if (axis) {
    // As in TF, a non-distributed value stands for the same value on every
    // replica.
    std::vector<Tensor> copies;
    for (int i = 0; i < s->num_local_replicas; ++i) copies.push_back(Tensor::copy_of(value));
    return reduce(op, Mirrored(std::move(copies)), axis);
  }
  if (s->num_workers > 1) {
    // tf.distribute's multi-worker reduce_to all-reduces a non-distributed
    // value across the workers: each worker's value counts once (SUM adds
    // them, MEAN averages them), whatever the values are.
    std::vector<Tensor> parts;
    parts.push_back(Tensor::copy_of(value));
    for (int i = 1; i < s->num_local_replicas; ++i) parts.push_back(Tensor::zeros(value.shape(), value.dtype()));
    Tensor total = s->extended->reduce_to(ReduceOp::SUM, PerReplica(std::move(parts)));
    if (op == ReduceOp::MEAN) detail::divide_by(total.mutable_dl(), s->num_workers);
    return total;
  }
  STRATA_ENFORCE(op == ReduceOp::MEAN || s->num_replicas_in_sync == 1, STRATA_ERR_INVALID_ARGUMENT,
                 "A non-distributed value cannot be reduced with SUM over ", s->num_replicas_in_sync,
                 " replicas of strategy '", s->name,
                 "' (the result would depend on the replica count); reduce a PerReplica value "
                 "returned by run(), or use MEAN");
  return Tensor::copy_of(value);
}

Tensor Strategy::gather(const DistributedValues& value, int axis) {
  detail::StrategyImpl* s = checked();
  detail::require_cross_replica(*s, "Strategy::gather");
  check_components(*s, value, "Strategy::gather");
  const int ax = normalise_axis(axis, value[0].ndim());
  std::vector<const DLTensor*> ptrs;
  for (const Tensor& t : value.values()) ptrs.push_back(&t.dl());
  strata_error err;
  strata_error_init(&err);
  DLManagedTensor* out = nullptr;
  {
    detail::CrossReplicaLock lock(*s);
    detail::check(s->vt->gather_to(s->handle, static_cast<std::uint32_t>(ptrs.size()), ptrs.data(),
                                   ax, &out, &err),
                  err, ("gather of strategy '" + s->name + "'").c_str());
  }
  return Tensor::adopt(out);
}

std::vector<Tensor> Strategy::experimental_local_results(const DistributedValues& value) const {
  std::vector<Tensor> out;
  for (const Tensor& t : value.values()) out.push_back(t.clone());
  return out;
}

std::vector<Tensor> Strategy::experimental_local_results(const TensorView& value) const {
  std::vector<Tensor> out;
  out.push_back(Tensor::copy_of(value));
  return out;
}

PerReplica Strategy::experimental_distribute_values_from_function(
    const std::function<Tensor(const ValueContext&)>& fn) {
  detail::StrategyImpl* s = checked();
  std::vector<Tensor> out;
  for (int i = 0; i < s->num_local_replicas; ++i) {
    ValueContext vc{s->replica_ids[static_cast<std::size_t>(i)], s->num_replicas_in_sync};
    out.push_back(fn(vc));
    STRATA_ENFORCE(out.back().defined(), STRATA_ERR_INVALID_ARGUMENT,
                   "experimental_distribute_values_from_function: the function returned an empty "
                   "Tensor for replica ", vc.replica_id_in_sync_group, "; return a value for every replica");
  }
  return PerReplica(std::move(out));
}

// ---------------------------------------------------------------------------
// StrategyExtended

const std::vector<std::string>& StrategyExtended::worker_devices() const { return impl_->worker_devices; }
const std::vector<std::string>& StrategyExtended::parameter_devices() const {
  return impl_->parameter_devices;
}
int StrategyExtended::num_local_replicas() const { return impl_->num_local_replicas; }
int StrategyExtended::worker_index() const { return impl_->worker_index; }
int StrategyExtended::num_workers() const { return impl_->num_workers; }
bool StrategyExtended::is_chief() const { return impl_->is_chief; }
const std::string& StrategyExtended::describe_json() const { return impl_->describe_json; }
InputContext StrategyExtended::input_context() const {
  return InputContext{impl_->num_workers, impl_->worker_index, impl_->num_replicas_in_sync};
}

Tensor StrategyExtended::reduce_to(ReduceOp op, const DistributedValues& value) {
  detail::StrategyImpl* s = impl_;
  detail::require_cross_replica(*s, "StrategyExtended::reduce_to");
  check_components(*s, value, "StrategyExtended::reduce_to");
  std::vector<const DLTensor*> ptrs;
  for (const Tensor& t : value.values()) {
    detail::check_same_layout(value[0].dl(), t.dl(), "reduce_to: per-replica values");
    ptrs.push_back(&t.dl());
  }
  Tensor out = Tensor::zeros(value[0].shape(), value[0].dtype());
  strata_error err;
  strata_error_init(&err);
  {
    detail::CrossReplicaLock lock(*s);
    detail::check(s->vt->reduce_to(s->handle, to_c(op), static_cast<std::uint32_t>(ptrs.size()),
                                   ptrs.data(), &out.mutable_dl(), &err),
                  err, ("reduce_to of strategy '" + s->name + "'").c_str());
  }
  return out;
}

std::vector<Tensor> StrategyExtended::batch_reduce_to(ReduceOp op,
                                                      const std::vector<const DistributedValues*>& values) {
  std::vector<Tensor> out;
  for (const DistributedValues* v : values) {
    STRATA_ENFORCE(v != nullptr, STRATA_ERR_INVALID_ARGUMENT, "batch_reduce_to: NULL value");
    out.push_back(reduce_to(op, *v));
  }
  return out;
}

Mirrored StrategyExtended::broadcast_to(const TensorView& value) {
  std::vector<Tensor> copies;
  for (int i = 0; i < impl_->num_local_replicas; ++i) copies.push_back(Tensor::copy_of(value));
  return Mirrored(std::move(copies));
}

bool StrategyExtended::variable_created_in_scope(const Variable& v) const {
  return v.strategy_impl() == impl_;
}

void StrategyExtended::set_transport(const std::string& name, const std::string& options_json) {
  detail::StrategyImpl* s = impl_;
  detail::require_cross_replica(*s, "StrategyExtended::set_transport");
  STRATA_ENFORCE(!name.empty(), STRATA_ERR_INVALID_ARGUMENT, "set_transport on strategy '", s->name,
                 "': the transport name is empty; pass a transport plugin name such as \"tcp\"");
  // The vtable is the host's normalized copy, so a plugin built before 1.2
  // reads as NULL here rather than as whatever followed its table.
  if (s->vt->set_transport == nullptr)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "strategy '", s->name, "' does not support set_transport (switching to '",
                 name, "'): it has no cross-process transport or was built before ABI 1.2; use "
                 "multi_worker_mirrored to switch transports at run time");
  strata_error err;
  strata_error_init(&err);
  detail::CrossReplicaLock lock(*s);
  detail::check(s->vt->set_transport(s->handle, name.c_str(), options_json.c_str(), &err), err,
                ("set_transport of strategy '" + s->name + "'").c_str());
}

}  // namespace strata
