// SPDX-License-Identifier: Apache-2.0
// TcpStoreClient: the StoreBackend that forwards store_* calls to the
// chief's StoreServer (protocol in store_protocol.h).
//
// Connections are pooled: a call takes an idle connection (or opens one,
// with the HELLO handshake) and returns it after the response, so calls
// from many threads run concurrently and a blocked GET never delays a SET.
// Sockets are plain POSIX with poll(), so every call has a deadline (the
// request's own timeout plus a grace period for the server's answer), and
// notify_all (after an abort request) wakes blocked calls through an
// eventfd: they fail with ABORTED and their connection is discarded.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "store/store_backend.h"

namespace strata::store {

class TcpStoreClient : public detail::StoreBackend {
 public:
  /// Connect to `address` ("host:port"), retrying until `connect_timeout_ms`
  /// passes (the server may start later), and authenticate with `token`.
  /// Throws DeadlineExceededError naming the address, PermissionDeniedError
  /// when the server refuses the token, InvalidArgumentError for a bad address.
  TcpStoreClient(std::string address, std::string token, int64_t connect_timeout_ms,
                 const std::atomic<bool>* abort_flag);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  strata_status_t set(const std::string& key, std::string value, int64_t timeout_ms,
                      strata_error* err) override;
  strata_status_t get(const std::string& key, int64_t timeout_ms, std::string* out,
                      strata_error* err) override;
  strata_status_t add(const std::string& key, int64_t delta, int64_t* result, int64_t timeout_ms,
                      strata_error* err) override;
  strata_status_t wait(const std::vector<std::string>& keys, int64_t timeout_ms,
                       strata_error* err) override;
  void notify_all() override;

  const std::string& address() const { return address_; }

 private:
  struct Response {
    int32_t status = 0;
    int64_t number = 0;
    std::string data;
  };
  // Open and authenticate one connection, retrying refused connects until
  // `deadline_ms` (now_ms() clock). Returns the fd or fills `err`.
  int open_connection(int64_t deadline_ms, strata_error* err, strata_status_t* st);
  // One request/response on a pooled connection; `what` names the call.
  strata_status_t call(const std::string& frame, int64_t timeout_ms, const std::string& what,
                       Response* resp, strata_error* err);
  strata_status_t io_error(const std::string& what, const std::string& cause, strata_error* err);

  std::string address_;
  std::string host_;
  uint16_t port_ = 0;
  std::string token_;
  const std::atomic<bool>* abort_;
  int wake_fd_ = -1;  // eventfd, readable once notify_all ran with the abort flag set
  std::mutex mu_;
  std::vector<int> idle_;
};

}  // namespace strata::store
