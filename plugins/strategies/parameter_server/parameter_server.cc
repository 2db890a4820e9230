// SPDX-License-Identifier: Apache-2.0
// ParameterServerStrategy (tf.distribute.experimental.ParameterServerStrategy,
// TF's parameter_server_strategy_v2): variables live on the cluster's "ps"
// tasks; the chief's ClusterCoordinator schedules functions on "worker"
// tasks, which run them on their local replicas with this strategy, and the
// workers train asynchronously (no collective spans processes).
//
// Options:
//   {"devices": ["cpu:0", ...]        this process's replicas (default ["cpu:0"]),
//    "variable_partitioner": {"name": "fixed_shards", "num_shards": 2}
//                                     | {"name": "min_size", "min_shard_bytes", "max_shards", "bytes_per_string"}
//                                     | {"name": "max_size", "max_shard_bytes", "max_shards", "bytes_per_string"}
//                                     (strata/partitioners.hpp; absent: no sharding),
//    "cluster": {...}                 the resolver's describe() JSON (core injects it),
//    "cross_device_ops", "timeout_s"  for the local replicas, as in mirrored,
//    "transport": {...}}              ignored (the ps connections follow the job config)
//
// Why the plugin is thin. The connections to the ps tasks belong to the
// process's ClusterCoordinator (chief) or strata::Server (worker), which live
// in core; a plugin cannot link core, so it reaches them through the host
// API entries ps_variable_create/read/update (ABI 1.3) and keeps, per
// variable, only the opaque reference the host hands out. No wire or
// channel code is duplicated here.
//
// Variables (as parameter_server_strategy_v2): created under scope() on the
// chief (after its ClusterCoordinator exists), placed round robin on the ps
// tasks in creation order and sharded by the partitioner. A worker attaches
// to them with strata::Variable(RemoteVariable) inside its scheduled
// function. num_replicas_in_sync is the local replica count (TF: GPUs per
// worker, or 1): replicas of one worker are synchronous, workers are not.
// In replica context with more than one replica, an update is a merge_call
// that aggregates the replicas' values (TF's AggregatingVariable): SUM adds
// them, MEAN averages them, ONLY_FIRST_REPLICA takes replica 0's, and the
// result is applied ONCE on the ps task; NONE is FAILED_PRECONDITION (TF's
// ValueError "You must specify an aggregation method ..."). With one
// replica the value is applied as is. Cross-replica updates apply as is.
// Synchronization: TF wraps every variable the same way here (there is one
// copy, on a ps task), so ON_WRITE, ON_READ and NONE behave alike (unlike
// the mirrored strategies, TF's ParameterServerStrategy does not reject
// NONE); ON_READ with trainable is INVALID_ARGUMENT, as tf.Variable raises.
// An aggregation or synchronization outside the enums is INVALID_ARGUMENT
// ("Invalid variable aggregation mode", TF's ValueError). Reads always pull
// the current value from the ps tasks.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "strata/sdk/local_strategy.hpp"
#include "strata/sdk/options.hpp"

namespace strata::plugins {
namespace {

using nlohmann::json;

constexpr const char* kComp = "parameter_server strategy";

const char* const kAggNames[] = {"NONE", "SUM", "MEAN", "ONLY_FIRST_REPLICA"};

std::size_t job_size(const json& spec, const char* job) {
  if (!spec.is_object() || !spec.contains(job)) return 0;
  const json& j = spec.at(job);
  return j.is_array() || j.is_object() ? j.size() : 0;
}

struct Cluster {
  json task_type;
  json task_id;
  std::size_t num_ps = 0;
  std::size_t num_workers = 0;
};

Cluster place(const json& cluster) {
  Cluster c;
  const json spec = cluster.is_object() ? cluster.value("cluster_spec", json::object()) : json::object();
  c.num_ps = job_size(spec, "ps");
  c.num_workers = job_size(spec, "worker");
  if (c.num_ps == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, " needs at least one \"ps\" task in the cluster, but the cluster ",
                 spec.dump(), " has none; run under strata-run --chief 1 --workers N --ps M, or add "
                 "\"ps\": [\"host:port\"] to TF_CONFIG (for one process use one_device or mirrored)");
  if (c.num_workers == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, " needs \"worker\" tasks in the cluster ", spec.dump(),
                 "; run under strata-run --chief 1 --workers N --ps M");
  c.task_type = cluster.value("task_type", json());
  c.task_id = cluster.value("task_id", json());
  if (c.task_type == "ps")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComp, ": this process is a ps task; ps tasks only serve "
                 "variables (strata-server or strata::Server::from_env().join()), they run no strategy");
  return c;
}

sdk::LocalStrategyConfig make_config(const json& o, const Cluster& c) {
  sdk::LocalStrategyConfig cfg;
  cfg.strategy_name = "parameter_server";
  cfg.placement = sdk::VariablePlacement::kSingleCopy;
  sdk::parse_common_options(o, cfg, /*allow_devices=*/true);
  cfg.is_chief = c.task_type == "chief";
  cfg.describe_extra = json{{"task_type", c.task_type},
                            {"task_id", c.task_id},
                            {"num_ps", c.num_ps},
                            {"num_cluster_workers", c.num_workers},
                            {"variable_placement", "ps"}};
  return cfg;
}

// One variable: the host's reference and the policy.
struct PsVar {
  std::string name;
  std::string ref;
  uint32_t synchronization = 0;
  uint32_t aggregation = 0;
};

// Per replica, what it passes to the merge_call of an update.
struct UpdateArg {
  PsVar* var;
  strata_var_update_op op;
  const DLTensor* value;
};

void validate_policy(const strata_variable_desc& d) {
  const std::string name = d.name != nullptr ? d.name : "";
  if (d.aggregation > STRATA_VAR_AGG_ONLY_FIRST_REPLICA)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "Invalid variable aggregation mode: ", d.aggregation,
                 " for variable: '", name, "'; use NONE, SUM, MEAN or ONLY_FIRST_REPLICA");
  if (d.synchronization > STRATA_VAR_SYNC_NONE)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "Invalid variable synchronization mode: ", d.synchronization,
                 " for variable: '", name, "'; use AUTO, ON_WRITE, ON_READ or NONE");
  if (d.synchronization == STRATA_VAR_SYNC_ON_READ && d.trainable != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable '", name,
                 "': synchronization ON_READ can only be set for non-trainable variables; pass trainable = false");
}

std::size_t numel(const DLTensor& t) {
  std::size_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= static_cast<std::size_t>(t.shape[i]);
  return n;
}

bool compact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

template <class T>
void sum_into(std::vector<char>& out, const std::vector<const DLTensor*>& values, bool mean) {
  const std::size_t n = numel(*values[0]);
  out.assign(n * sizeof(T), 0);
  T* o = reinterpret_cast<T*>(out.data());
  for (const DLTensor* v : values) {
    const T* p = reinterpret_cast<const T*>(static_cast<const char*>(v->data) + v->byte_offset);
    for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<T>(o[i] + p[i]);
  }
  if (mean)
    for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<T>(o[i] / static_cast<T>(values.size()));
}

class ParameterServerStrategy : public sdk::StrategyBase {
 public:
  static constexpr const char* kSubsystem = "strategy.parameter_server";

  ParameterServerStrategy(sdk::Host host, const char* options_json)
      : ParameterServerStrategy(host, sdk::parse_options(options_json, kComp)) {}

  std::string describe() override { return local_->describe(); }
  void run(strata_replica_fn fn, void* user) override { local_->run(fn, user); }
  int32_t replica_id_in_sync_group(strata_replica_t r) override { return local_->replica_id_in_sync_group(r); }
  void replica_all_reduce(strata_replica_t r, strata_reduce_op op, uint32_t num_tensors, const DLTensor* const* inputs,
                          DLTensor* const* outputs) override {
    local_->replica_all_reduce(r, op, num_tensors, inputs, outputs);
  }
  DLManagedTensor* replica_all_gather(strata_replica_t r, const DLTensor& input, int32_t axis) override {
    return local_->replica_all_gather(r, input, axis);
  }
  void replica_merge_call(strata_replica_t r, strata_merge_fn fn, void* merge_user, void* replica_arg) override {
    local_->replica_merge_call(r, fn, merge_user, replica_arg);
  }
  void reduce_to(strata_reduce_op op, uint32_t num_values, const DLTensor* const* values, DLTensor& output) override {
    local_->reduce_to(op, num_values, values, output);
  }
  DLManagedTensor* gather_to(uint32_t num_values, const DLTensor* const* values, int32_t axis) override {
    return local_->gather_to(num_values, values, axis);
  }

  strata_variable_t variable_create(const strata_variable_desc& desc, const DLTensor& initial) override {
    validate_policy(desc);
    require_host_entries();
    const std::string name = desc.name != nullptr ? desc.name : "";
    json o{{"synchronization", desc.synchronization},
           {"aggregation", desc.aggregation},
           {"trainable", desc.trainable != 0}};
    if (!partitioner_.is_null()) o["partitioner"] = partitioner_;
    const std::string options = o.dump();
    auto v = std::make_unique<PsVar>();
    v->name = name;
    v->synchronization = desc.synchronization;
    v->aggregation = desc.aggregation;
    strata_error err;
    strata_error_init(&err);
    const strata_host_api* api = host_.api();
    ::strata::detail::check_status(
        api->ps_variable_create(api, name.c_str(), &initial, options.c_str(), &append, &v->ref, &err), err,
        ("creating variable '" + name + "' on the ps tasks").c_str());
    host_.debug("variable '", name, "' created on the ps tasks (", v->ref.size(), "-byte reference)");
    return reinterpret_cast<strata_variable_t>(v.release());
  }

  // ABI 1.3: a worker's handle on a variable the chief created.
  strata_variable_t variable_attach(const strata_variable_desc& desc) {
    validate_policy(desc);
    require_host_entries();
    auto v = std::make_unique<PsVar>();
    v->name = desc.name != nullptr ? desc.name : "";
    v->synchronization = desc.synchronization;
    v->aggregation = desc.aggregation;
    v->ref.assign(static_cast<const char*>(desc.attach_ref), static_cast<std::size_t>(desc.attach_ref_len));
    return reinterpret_cast<strata_variable_t>(v.release());
  }

  // ABI 1.3.
  std::string variable_ref(strata_variable_t v) { return var(v).ref; }

  void variable_destroy(strata_variable_t v) noexcept override { delete reinterpret_cast<PsVar*>(v); }

  DLManagedTensor* variable_read(strata_variable_t v, strata_replica_t) override {
    PsVar& pv = var(v);
    DLManagedTensor* out = nullptr;
    strata_error err;
    strata_error_init(&err);
    const strata_host_api* api = host_.api();
    ::strata::detail::check_status(api->ps_variable_read(api, pv.ref.data(), pv.ref.size(), &out, &err), err,
                                   ("reading variable '" + pv.name + "' from its ps task").c_str());
    return out;
  }

  void variable_update(strata_variable_t v, strata_replica_t r, strata_var_update_op op,
                       const DLTensor& value) override {
    PsVar& pv = var(v);
    if (r == nullptr || local_->num_replicas() == 1) {  // cross-replica, or TF's single-replica plain variable
      apply(pv, op, value);
      return;
    }
    if (pv.aggregation == STRATA_VAR_AGG_NONE)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "variable '", pv.name,
                   "': You must specify an aggregation method to update a variable in replica context with ",
                   local_->num_replicas(),
                   " replicas; create it with VariableOptions::aggregation = SUM, MEAN or ONLY_FIRST_REPLICA");
    UpdateArg mine{&pv, op, &value};
    local_->replica_merge_call(r, &merge_update, this, &mine);
  }

 private:
  ParameterServerStrategy(const sdk::Host& host, const json& o)
      : host_(host), cluster_(check_and_place(o)), partitioner_(o.value("variable_partitioner", json())),
        local_(std::make_unique<sdk::LocalStrategy>(host, make_config(strip(o), cluster_))) {
    if (!partitioner_.is_null() && !partitioner_.is_object())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'variable_partitioner' of ", kComp,
                   " must be an object like {\"name\": \"fixed_shards\", \"num_shards\": 2}; got ", partitioner_.dump());
    host_.info("parameter_server: ", local_->num_replicas(), " local replica(s); ", cluster_.num_ps, " ps task(s), ",
               cluster_.num_workers, " worker task(s); this task: ", cluster_.task_type.dump(), " ",
               cluster_.task_id.dump());
  }

  static Cluster check_and_place(const json& o) {
    sdk::check_known_keys(o, {"devices", "variable_partitioner", "cluster", "cross_device_ops", "transport", "timeout_s"},
                          kComp);
    return place(o.value("cluster", json()));
  }
  // The options LocalStrategy reads.
  static json strip(const json& o) {
    json out = json::object();
    for (const char* k : {"devices", "cross_device_ops", "timeout_s"})
      if (o.contains(k)) out[k] = o.at(k);
    return out;
  }

  static void append(void* user, const char* data, uint64_t len) {
    static_cast<std::string*>(user)->append(data, static_cast<std::size_t>(len));
  }

  void require_host_entries() const {
    const strata_host_api* api = host_.api();
    if (api == nullptr || !STRATA_HAS_FIELD(api, strata_host_api, ps_variable_update) ||
        api->ps_variable_create == nullptr || api->ps_variable_read == nullptr || api->ps_variable_update == nullptr)
      STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, kComp,
                   " needs a host with parameter-server variables (ABI 1.3); this host is older: upgrade libstrata_core");
  }

  static PsVar& var(strata_variable_t v) {
    if (v == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable handle is NULL");
    return *reinterpret_cast<PsVar*>(v);
  }

  void apply(PsVar& pv, strata_var_update_op op, const DLTensor& value) {
    strata_error err;
    strata_error_init(&err);
    const strata_host_api* api = host_.api();
    ::strata::detail::check_status(
        api->ps_variable_update(api, pv.ref.data(), pv.ref.size(), static_cast<uint32_t>(op), &value, &err), err,
        ("updating variable '" + pv.name + "' on its ps task").c_str());
  }

  // Runs once, with every local replica's UpdateArg in replica order.
  static strata_status_t merge_update(void* merge_user, void* const* replica_args, uint32_t n, strata_error* err) {
    auto* self = static_cast<ParameterServerStrategy*>(merge_user);
    try {
      std::vector<const DLTensor*> values;
      const UpdateArg& first = *static_cast<const UpdateArg*>(replica_args[0]);
      for (uint32_t i = 0; i < n; ++i) {
        const UpdateArg& a = *static_cast<const UpdateArg*>(replica_args[i]);
        if (a.var != first.var || a.op != first.op)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "replica ", i, " updates variable '", a.var->name, "' (op ", a.op,
                       ") while replica 0 updates '", first.var->name, "' (op ", first.op,
                       "); every replica must issue the same updates in the same order");
        const DLTensor& v = *a.value;
        if (!compact(v) || v.ndim != first.value->ndim || v.dtype.code != first.value->dtype.code ||
            v.dtype.bits != first.value->dtype.bits || numel(v) != numel(*first.value))
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable '", a.var->name, "': replica ", i,
                       "'s update value differs in dtype or shape from replica 0's, or is not compact");
        values.push_back(&v);
      }
      const uint32_t agg = first.var->aggregation;
      if (agg == STRATA_VAR_AGG_ONLY_FIRST_REPLICA) {
        self->apply(*first.var, first.op, *values[0]);
        return STRATA_OK;
      }
      const bool mean = agg == STRATA_VAR_AGG_MEAN;
      std::vector<char> buf;
      const DLDataType dt = values[0]->dtype;
      if (dt.code == kDLFloat && dt.bits == 32) sum_into<float>(buf, values, mean);
      else if (dt.code == kDLFloat && dt.bits == 64) sum_into<double>(buf, values, mean);
      else if (dt.code == kDLInt && dt.bits == 32) sum_into<int32_t>(buf, values, mean);
      else if (dt.code == kDLInt && dt.bits == 64) sum_into<int64_t>(buf, values, mean);
      else
        STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "variable '", first.var->name, "': ", kAggNames[agg],
                     " aggregation of this dtype is not supported; use float32, float64, int32 or int64");
      DLTensor out = *values[0];
      out.data = buf.data();
      out.byte_offset = 0;
      out.strides = nullptr;
      self->apply(*first.var, first.op, out);
      return STRATA_OK;
    } catch (const Error& e) {
      return fail(err, e.code(), e.what());
    } catch (const std::exception& e) {
      return fail(err, STRATA_ERR_INTERNAL, e.what());
    }
  }

  static strata_status_t fail(strata_error* err, strata_status_t code, const char* msg) {
    if (err != nullptr) {
      err->code = code;
      std::snprintf(err->message, sizeof err->message, "%s", msg);
    }
    return code;
  }

  sdk::Host host_;
  Cluster cluster_;
  json partitioner_;
  std::unique_ptr<sdk::LocalStrategy> local_;
};

}  // namespace
}  // namespace strata::plugins

STRATA_PLUGIN("strata parameter_server strategy", "0.1.0",
              STRATA_STRATEGY_COMPONENT(strata::plugins::ParameterServerStrategy, "parameter_server", "0.1.0"))
