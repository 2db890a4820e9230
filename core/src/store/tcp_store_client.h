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
// With TLS (store_tls.h) each connection runs OpenSSL over the same
// non-blocking socket, its handshake bounded by the HELLO deadline; a store
// that does not speak what this client expects (TLS or plain), a server
// certificate that does not verify and a refused client certificate are
// final errors, reported at once.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "store/store_backend.h"
#include "store/store_tls.h"

namespace strata::store {

class TcpStoreClient : public detail::StoreBackend {
 public:
  /// Connect to `address` ("host:port"), retrying until `connect_timeout_ms`
  /// passes (the server may start later), and authenticate with `token`.
  /// Throws DeadlineExceededError naming the address, PermissionDeniedError
  /// when the server refuses the token, InvalidArgumentError for a bad address.
  /// With tls.enabled(), speak TLS only (FailedPreconditionError when the
  /// store does not, PermissionDeniedError when a certificate is refused;
  /// file errors as make_client_tls in store_tls.h).
  TcpStoreClient(std::string address, std::string token, int64_t connect_timeout_ms,
                 const std::atomic<bool>* abort_flag, const TlsConfig& tls = {});
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

  /// One connection: the socket and, with TLS, its OpenSSL session (used by
  /// one thread at a time, like the socket).
  struct Conn {
    int fd = -1;
    ssl_st* ssl = nullptr;
    std::string tls_error;  ///< OpenSSL's reason for the last failed TLS call
  };

 private:
  struct Response {
    int32_t status = 0;
    int64_t number = 0;
    std::string data;
  };
  // Open and authenticate one connection, retrying refused connects until
  // `deadline_ms` (now_ms() clock). Returns false and fills `err` on failure.
  bool open_connection(int64_t deadline_ms, Conn* conn, strata_error* err, strata_status_t* st);
  // The TLS (if on) and HELLO handshakes on a connected socket. 0: done;
  // 1: worth retrying (`last_error` says why); -1: final (`err` filled).
  int handshake(Conn* c, int64_t deadline_ms, std::string* last_error, strata_error* err, strata_status_t* st);
  static void close_conn(Conn* c);
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
  TlsConfig tls_;
  ssl_ctx_st* tls_ctx_ = nullptr;  // null: plain TCP
  std::mutex mu_;
  std::vector<Conn> idle_;
};

}  // namespace strata::store
