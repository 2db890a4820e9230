// SPDX-License-Identifier: Apache-2.0
// Internals shared by the C++ API sources: the strategy instance behind a
// Strategy handle, the thread-local distribution context and the lock that
// serialises cross-replica calls into a plugin (the C contract leaves that
// to the host).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/c/strategy.h"
#include "strata/plugin_host.hpp"
#include "strata/strategy.hpp"

namespace strata::detail {

struct StrategyImpl : std::enable_shared_from_this<StrategyImpl> {
  StrategyImpl(PluginInstance instance, std::string name, bool is_default);
  ~StrategyImpl();
  StrategyImpl(const StrategyImpl&) = delete;
  StrategyImpl& operator=(const StrategyImpl&) = delete;

  PluginInstance instance;
  const strata_strategy_vtable* vt = nullptr;
  strata_strategy_t handle = nullptr;
  std::string name;
  bool is_default = false;

  // From describe(), fixed for the life of the instance.
  std::string describe_json;
  int num_replicas_in_sync = 1;
  int num_local_replicas = 1;
  std::vector<std::string> worker_devices;
  std::vector<std::string> parameter_devices;
  int worker_index = 0;
  int num_workers = 1;
  bool is_chief = true;
  // replica_id_in_sync_group of each local replica (probed once at creation).
  std::vector<std::int32_t> replica_ids;

  std::mutex cross_mu;  // serialises cross-replica calls into the plugin

  std::unique_ptr<Strategy> view;            // non-owning handle get_strategy() returns
  std::unique_ptr<StrategyExtended> extended;
  std::unique_ptr<ReplicaContext> default_replica;  // Default strategy only
};

/// Per-thread distribution context.
struct ThreadState {
  std::vector<StrategyImpl*> scopes;  // entered scopes, innermost last
  ReplicaContext* replica = nullptr;  // set on replica threads during run
  StrategyImpl* merge = nullptr;      // set while a merge function runs
};
ThreadState& tls();

/// The Default strategy's instance (created on first use, lives until exit).
StrategyImpl& default_impl();
const std::shared_ptr<StrategyImpl>& default_impl_ptr();
/// The strategy this thread is in, ignoring the Default strategy; NULL when
/// none.
StrategyImpl* current_non_default();
/// The current strategy (current_non_default() or the Default one).
StrategyImpl& current_impl();
/// True when this thread is in replica context of `s` via run().
bool in_replica_of(const StrategyImpl& s);

/// Throws FailedPreconditionError when this thread is inside a replica
/// function (`what` names the call).
void require_cross_replica(const StrategyImpl& s, const char* what);

/// Locks `s.cross_mu` unless this thread is running a merge function of `s`
/// (whose run already holds it on another thread, and whose replicas are
/// all parked in merge_call, so the call is already serialised).
class CrossReplicaLock {
 public:
  explicit CrossReplicaLock(StrategyImpl& s);

 private:
  std::unique_lock<std::mutex> lock_;
};

/// Run `fn` on every local replica of `s` with contexts set; rethrows the
/// first user exception with its type.
void run_on_replicas(StrategyImpl& s, const std::function<void(ReplicaContext&)>& fn);

/// Throw the error a vtable call returned.
inline void check(strata_status_t st, const strata_error& err, const char* what) {
  check_status(st, err, what);
}

/// Fill `err` from the exception being handled (inside a catch block) and
/// return its status.
strata_status_t status_from_current_exception(strata_error* err);

}  // namespace strata::detail
