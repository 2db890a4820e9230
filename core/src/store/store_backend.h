// SPDX-License-Identifier: Apache-2.0
// StoreBackend: what the host services store_* functions talk to. Two
// implementations: the in-process KvStore (host/host_state.h, the default,
// shared by every plugin of one process) and TcpStoreClient (a client of the
// chief's StoreServer, installed by PluginHost::connect_store).
//
// Contract: every method is thread-safe and may block up to `timeout_ms`
// (>= 0; callers resolve "default" before calling). Errors are returned as a
// status with `err` (may be null) filled; nothing throws. notify_all wakes
// every blocked call so that it can observe the host's abort flag and fail
// with ABORTED; it never blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/c/common.h"

namespace strata::detail {

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  virtual strata_status_t set(const std::string& key, std::string value, int64_t timeout_ms,
                              strata_error* err) = 0;
  /// Blocks until `key` exists, then stores its value in `*out`.
  virtual strata_status_t get(const std::string& key, int64_t timeout_ms, std::string* out,
                              strata_error* err) = 0;
  /// Adds `delta` to the decimal integer at `key` (absent = 0).
  virtual strata_status_t add(const std::string& key, int64_t delta, int64_t* result,
                              int64_t timeout_ms, strata_error* err) = 0;
  /// Blocks until every key exists.
  virtual strata_status_t wait(const std::vector<std::string>& keys, int64_t timeout_ms,
                               strata_error* err) = 0;
  virtual void notify_all() = 0;
};

}  // namespace strata::detail
