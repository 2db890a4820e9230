// SPDX-License-Identifier: Apache-2.0
// Internal state behind strata_host_api: the services table handed to
// plugins, the job config it exposes, the in-process key-value store and
// the abort flag.
//
// HostShared is reference-counted and held by the PluginHost and by every
// loaded library record, so the table a plugin was given stays valid while
// any of the plugin's objects lives, even after the PluginHost is gone
// (process exit). Thread-safety: every member is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/store_backend.h"
#include "strata/c/strata.h"

namespace strata {
class PluginHost;
}

namespace strata::detail {

struct HostShared;

/// Standard-layout wrapper so a `const strata_host_api*` leads back to its
/// HostShared (the table is the first member).
struct HostTable {
  strata_host_api api;
  HostShared* shared;
};

/// The in-process rendezvous store, the default backend (connect_store
/// switches the table to a TcpStoreClient). Values are bytes; store_add
/// keeps decimal text.
class KvStore : public StoreBackend {
 public:
  explicit KvStore(const std::atomic<bool>* abort_flag) : abort_(abort_flag) {}
  strata_status_t set(const std::string& key, std::string value, int64_t timeout_ms,
                      strata_error* err) override;
  /// Waits until `key` exists; DEADLINE_EXCEEDED / ABORTED into `err`.
  strata_status_t get(const std::string& key, int64_t timeout_ms, std::string* out,
                      strata_error* err) override;
  strata_status_t add(const std::string& key, int64_t delta, int64_t* result, int64_t timeout_ms,
                      strata_error* err) override;
  strata_status_t wait(const std::vector<std::string>& keys, int64_t timeout_ms,
                       strata_error* err) override;
  /// Wake every waiter (after an abort request).
  void notify_all() override;

 private:
  // Caller holds mu_. Waits until pred() or the deadline / an abort.
  template <class Pred>
  strata_status_t wait_until(std::unique_lock<std::mutex>& lock, int64_t timeout_ms, Pred pred,
                             const std::string& what, strata_error* err);
  const std::atomic<bool>* abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> data_;
};

struct HostShared {
  HostShared();
  HostShared(const HostShared&) = delete;
  HostShared& operator=(const HostShared&) = delete;

  HostTable table{};
  std::atomic<bool> abort{false};
  KvStore store{&abort};

  /// The backend the store_* services use: `remote_store` once
  /// connect_store installed it, else `store`. The returned pointer keeps the
  /// backend alive for the duration of a call.
  std::shared_ptr<StoreBackend> store_backend();
  /// Install the TCP client (connect_store). False when one is installed.
  bool set_remote_store(std::shared_ptr<StoreBackend> backend);
  mutable std::mutex store_mu;
  std::shared_ptr<StoreBackend> remote_store;

  mutable std::mutex config_mu;
  nlohmann::json config = nlohmann::json::object();

  mutable std::mutex fingerprint_mu;
  std::map<std::string, strata_collective_fingerprint, std::less<>> last_fingerprint;  // found by name without a copy

  // The PluginHost that create_plugin forwards to; null once it is destroyed.
  std::mutex host_mu;
  PluginHost* host = nullptr;

  /// Default for store waits given a negative timeout: /timeouts/rendezvous_s.
  int64_t default_store_timeout_ms() const;

  static HostShared* from(const strata_host_api* api) {
    return reinterpret_cast<const HostTable*>(api)->shared;
  }
};

/// Write `message` (truncated to fit, NUL-terminated) and `code` into `err`
/// (which may be null) and return `code`.
strata_status_t set_error(strata_error* err, strata_status_t code, const std::string& message);

}  // namespace strata::detail
