// SPDX-License-Identifier: Apache-2.0
// The Default strategy's vtable. Every function follows the contract in
// strata/c/strategy.h for the case of a single replica: collectives are
// identities (SUM and MEAN of one value are the value), merge_call calls the
// merge function directly, and variables keep one copy with the same
// ON_WRITE / ON_READ rules a multi-replica strategy applies.
#include "api/default_strategy.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "api/kernels.h"
#include "api/strategy_impl.h"
#include "strata/plugin_host.hpp"
#include "strata/tensor.hpp"

struct strata_strategy_s {
  std::atomic<bool> running{false};
  std::atomic<int> live_variables{0};
};

struct strata_variable_s {
  std::mutex mu;  // the default replica context may be used from several threads
  strata::Tensor value;
  strata_var_sync sync = STRATA_VAR_SYNC_ON_WRITE;
  strata_var_aggregation aggregation = STRATA_VAR_AGG_NONE;
  std::string name;
};

struct strata_replica_s {
  int unused = 0;
};

namespace strata::detail {
namespace {

strata_replica_s g_replica;

strata_status_t set_error(strata_error* err, strata_status_t code, const std::string& msg) {
  if (err) {
    err->code = code;
    std::snprintf(err->message, sizeof(err->message), "%s", msg.c_str());
  }
  return code;
}

// Runs `body`, turning any exception into a status (none may cross the ABI).
template <class F>
strata_status_t guarded(strata_error* err, F&& body) {
  try {
    body();
    return STRATA_OK;
  } catch (...) {
    return status_from_current_exception(err);
  }
}

bool valid_replica(strata_replica_t r) { return r == &g_replica; }

strata_status_t bad_replica(strata_error* err) {
  return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                   "default strategy: the replica handle does not belong to this strategy; pass the "
                   "handle given to the replica function");
}

strata_status_t d_create(const strata_host_api*, const char* options_json, strata_strategy_t* out,
                         strata_error* err) {
  return guarded(err, [&] {
    const std::string text = options_json && *options_json ? options_json : "{}";
    nlohmann::json opts;
    try {
      opts = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "default strategy: options are not valid JSON (",
                   e.what(), "); pass a JSON object such as {}");
    }
    STRATA_ENFORCE(opts.is_object(), STRATA_ERR_INVALID_ARGUMENT,
                   "default strategy: options must be a JSON object, got ", text);
    for (const auto& item : opts.items()) {
      // A single replica never communicates, so these are accepted and unused
      // (from_config passes them to every strategy).
      STRATA_ENFORCE(item.key() == "timeout_s" || item.key() == "cross_device_ops",
                     STRATA_ERR_INVALID_ARGUMENT, "default strategy: unknown option '", item.key(),
                     "'; it accepts only \"timeout_s\" and \"cross_device_ops\"");
    }
    *out = new strata_strategy_s();
  });
}

void d_destroy(strata_strategy_t s) { delete s; }

strata_status_t d_describe(strata_strategy_t, strata_write_fn write, void* user, strata_error*) {
  static const char kJson[] =
      "{\"num_replicas_in_sync\": 1, \"num_local_replicas\": 1, \"worker_devices\": [\"cpu:0\"], "
      "\"parameter_devices\": [\"cpu:0\"], \"worker_index\": 0, \"num_workers\": 1, "
      "\"is_chief\": true}";
  write(user, kJson, sizeof(kJson) - 1);
  return STRATA_OK;
}

strata_status_t d_run(strata_strategy_t s, strata_replica_fn fn, void* user, strata_error* err) {
  bool expected = false;
  if (!s->running.compare_exchange_strong(expected, true)) {
    return set_error(err, STRATA_ERR_FAILED_PRECONDITION,
                     "default strategy: run called while run is in progress; run is not reentrant");
  }
  strata_error_init(err);
  const strata_status_t st = fn(user, &g_replica, 0, err);
  s->running.store(false);
  return st;
}

std::int32_t d_replica_id(strata_strategy_t, strata_replica_t) { return 0; }

strata_status_t d_all_reduce(strata_strategy_t, strata_replica_t r, std::uint32_t op, std::uint32_t n,
                             const DLTensor* const* in, DLTensor* const* out, strata_error* err) {
  if (!valid_replica(r)) return bad_replica(err);
  return guarded(err, [&] {
    STRATA_ENFORCE(op <= STRATA_REDUCE_PROD, STRATA_ERR_INVALID_ARGUMENT,
                   "default strategy: unknown reduce op ", op);
    // With one replica every reduction of a value is the value itself.
    for (std::uint32_t i = 0; i < n; ++i) copy_into(*out[i], *in[i]);
  });
}

strata_status_t d_all_gather(strata_strategy_t, strata_replica_t r, const DLTensor* in, std::int32_t axis,
                             DLManagedTensor** out, strata_error* err) {
  if (!valid_replica(r)) return bad_replica(err);
  return guarded(err, [&] {
    STRATA_ENFORCE(axis >= 0 && axis < in->ndim, STRATA_ERR_INVALID_ARGUMENT,
                   "default strategy: all_gather axis ", axis, " is out of range for rank ", in->ndim);
    *out = Tensor::copy_of(*in).to_dlpack();
  });
}

strata_status_t d_merge_call(strata_strategy_t, strata_replica_t r, strata_merge_fn fn,
                             void* merge_user, void* replica_arg, strata_error* err) {
  if (!valid_replica(r)) return bad_replica(err);
  void* args[1] = {replica_arg};
  return fn(merge_user, args, 1, err);
}

strata_status_t d_reduce_to(strata_strategy_t, std::uint32_t op, std::uint32_t n,
                            const DLTensor* const* values, DLTensor* output, strata_error* err) {
  return guarded(err, [&] {
    STRATA_ENFORCE(n == 1, STRATA_ERR_INVALID_ARGUMENT, "default strategy: reduce_to got ", n,
                   " values but there is 1 replica; pass one value");
    STRATA_ENFORCE(op <= STRATA_REDUCE_PROD, STRATA_ERR_INVALID_ARGUMENT,
                   "default strategy: unknown reduce op ", op);
    copy_into(*output, *values[0]);
  });
}

strata_status_t d_gather_to(strata_strategy_t, std::uint32_t n, const DLTensor* const* values,
                            std::int32_t axis, DLManagedTensor** out, strata_error* err) {
  return guarded(err, [&] {
    STRATA_ENFORCE(n == 1, STRATA_ERR_INVALID_ARGUMENT, "default strategy: gather_to got ", n,
                   " values but there is 1 replica; pass one value");
    STRATA_ENFORCE(axis >= 0 && axis < values[0]->ndim, STRATA_ERR_INVALID_ARGUMENT,
                   "default strategy: gather axis ", axis, " is out of range for rank ",
                   values[0]->ndim);
    *out = Tensor::copy_of(*values[0]).to_dlpack();
  });
}

strata_status_t d_variable_create(strata_strategy_t s, const strata_variable_desc* desc,
                                  const DLTensor* initial, strata_variable_t* out, strata_error* err) {
  return guarded(err, [&] {
    const char* name = desc->name ? desc->name : "";
    STRATA_ENFORCE(desc->synchronization <= STRATA_VAR_SYNC_NONE &&
                       desc->aggregation <= STRATA_VAR_AGG_ONLY_FIRST_REPLICA,
                   STRATA_ERR_INVALID_ARGUMENT, "variable '", name,
                   "': unknown synchronization or aggregation value");
    STRATA_ENFORCE(desc->synchronization != STRATA_VAR_SYNC_NONE, STRATA_ERR_INVALID_ARGUMENT,
                   "variable '", name,
                   "': synchronization NONE is not supported by distribution strategies; use "
                   "ON_WRITE (or AUTO) or ON_READ");
    STRATA_ENFORCE(!(desc->synchronization == STRATA_VAR_SYNC_ON_READ && desc->trainable),
                   STRATA_ERR_INVALID_ARGUMENT, "variable '", name,
                   "': synchronization ON_READ cannot be trainable; pass trainable = false");
    auto v = std::make_unique<strata_variable_s>();
    v->value = Tensor::copy_of(*initial);
    v->sync = desc->synchronization == STRATA_VAR_SYNC_ON_READ ? STRATA_VAR_SYNC_ON_READ
                                                               : STRATA_VAR_SYNC_ON_WRITE;
    v->aggregation = static_cast<strata_var_aggregation>(desc->aggregation);
    v->name = name;
    *out = v.release();
    s->live_variables.fetch_add(1);
  });
}

void d_variable_destroy(strata_strategy_t s, strata_variable_t v) {
  if (v == nullptr) return;
  s->live_variables.fetch_sub(1);
  delete v;
}

strata_status_t d_variable_read(strata_strategy_t, strata_variable_t v, strata_replica_t r,
                                DLManagedTensor** out, strata_error* err) {
  if (r != nullptr && !valid_replica(r)) return bad_replica(err);
  return guarded(err, [&] {
    std::lock_guard<std::mutex> lock(v->mu);
    if (r == nullptr && v->sync == STRATA_VAR_SYNC_ON_READ) {
      STRATA_ENFORCE(v->aggregation != STRATA_VAR_AGG_NONE, STRATA_ERR_FAILED_PRECONDITION,
                     "variable '", v->name,
                     "': an ON_READ variable with aggregation NONE cannot be read in cross-replica "
                     "context; give it aggregation SUM, MEAN or ONLY_FIRST_REPLICA, or read it "
                     "inside run");
    }
    // One copy: SUM, MEAN and ONLY_FIRST_REPLICA of it are all the copy.
    *out = v->value.clone().to_dlpack();
  });
}

strata_status_t d_variable_update(strata_strategy_t, strata_variable_t v, strata_replica_t r,
                                  std::uint32_t op, const DLTensor* value, strata_error* err) {
  if (r != nullptr && !valid_replica(r)) return bad_replica(err);
  return guarded(err, [&] {
    STRATA_ENFORCE(op <= STRATA_VAR_ASSIGN_SUB, STRATA_ERR_INVALID_ARGUMENT, "variable '", v->name,
                   "': unknown update op ", op);
    std::lock_guard<std::mutex> lock(v->mu);
    if (r == nullptr) {
      if (v->sync == STRATA_VAR_SYNC_ON_READ && v->aggregation == STRATA_VAR_AGG_SUM) {
        STRATA_ENFORCE(op == STRATA_VAR_ASSIGN, STRATA_ERR_FAILED_PRECONDITION, "variable '", v->name,
                       "': assign_add/assign_sub of an ON_READ variable with SUM aggregation is not "
                       "supported in cross-replica context; update it inside run, or use assign");
        // assign stores value / num_replicas per copy; with one replica that is value.
      }
    } else if (v->sync == STRATA_VAR_SYNC_ON_WRITE) {
      STRATA_ENFORCE(v->aggregation != STRATA_VAR_AGG_NONE, STRATA_ERR_FAILED_PRECONDITION,
                     "variable '", v->name,
                     "': updating an ON_WRITE variable in replica context needs an aggregation; "
                     "create it with aggregation SUM, MEAN or ONLY_FIRST_REPLICA, or update it in "
                     "merge_call");
      // Aggregating one replica's value (SUM, MEAN, ONLY_FIRST_REPLICA) is the value.
    }
    DLTensor& dst = v->value.mutable_dl();
    if (op == STRATA_VAR_ASSIGN) {
      copy_into(dst, *value);
    } else {
      add_into(dst, *value, op == STRATA_VAR_ASSIGN_ADD ? 1 : -1);
    }
  });
}

strata_status_t d_variable_view(strata_strategy_t, strata_variable_t v, strata_replica_t r,
                                DLTensor* out, strata_error* err) {
  if (r != nullptr && !valid_replica(r)) return bad_replica(err);
  std::lock_guard<std::mutex> lock(v->mu);
  *out = v->value.dl();
  return STRATA_OK;
}

strata_strategy_vtable make_vtable() {
  strata_strategy_vtable vt{};
  STRATA_INIT_HEADER(&vt, strata_strategy_vtable);
  vt.create = &d_create;
  vt.destroy = &d_destroy;
  vt.describe = &d_describe;
  vt.run = &d_run;
  vt.replica_id_in_sync_group = &d_replica_id;
  vt.replica_all_reduce = &d_all_reduce;
  vt.replica_all_gather = &d_all_gather;
  vt.replica_merge_call = &d_merge_call;
  vt.reduce_to = &d_reduce_to;
  vt.gather_to = &d_gather_to;
  vt.variable_create = &d_variable_create;
  vt.variable_destroy = &d_variable_destroy;
  vt.variable_read = &d_variable_read;
  vt.variable_update = &d_variable_update;
  vt.variable_view = &d_variable_view;
  // save_state/restore_state stay NULL: the Default strategy has no state of
  // its own to checkpoint.
  return vt;
}

const strata_strategy_vtable kVtable = make_vtable();

}  // namespace

const strata_strategy_vtable* default_strategy_vtable() { return &kVtable; }

strata_replica_t default_replica_handle() { return &g_replica; }

void ensure_default_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    PluginHost::global().register_builtin(STRATA_KIND_STRATEGY, kDefaultStrategyName, "1.0.0",
                                          &kVtable);
  });
}

const std::shared_ptr<StrategyImpl>& default_impl_ptr() {
  // PluginHost::global() is constructed first (inside ensure_default_registered),
  // so it is destroyed after this instance at exit.
  static const std::shared_ptr<StrategyImpl> impl = [] {
    ensure_default_registered();
    PluginInstance inst = PluginHost::global().create(STRATA_KIND_STRATEGY, kDefaultStrategyName, "{}");
    auto p = std::make_shared<StrategyImpl>(std::move(inst), kDefaultStrategyName, true);
    p->default_replica = std::make_unique<ReplicaContext>(p.get(), &g_replica, 0);
    return p;
  }();
  return impl;
}

StrategyImpl& default_impl() { return *default_impl_ptr(); }

}  // namespace strata::detail
