// SPDX-License-Identifier: Apache-2.0
// StoreServer: the rendezvous key-value store the chief process serves over
// TCP (protocol in store_protocol.h). One Boost.Asio thread runs every
// connection; GET and WAIT park the request (no polling) until the keys
// exist or the request's deadline timer fires. When an auth token is set, a
// client whose HELLO carries another token is refused with
// PERMISSION_DENIED and the refusal is logged. A connection that sends
// anything malformed (bad length, unknown op, truncated fields, a request
// before HELLO) is logged and closed; the server keeps serving the others.
// With TLS (store_tls.h) every accepted connection gets the plain preamble,
// then a TLS handshake that must finish within the HELLO deadline and counts
// as unauthenticated; a failed handshake is logged like a refused HELLO.
//
// Ownership and threads: the constructor binds and starts the thread; the
// destructor stops it and closes every connection (clients then see
// UNAVAILABLE). port() is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "store/store_tls.h"

namespace strata::store {

class StoreServer {
 public:
  /// Bind `host` (an IP literal, or a name resolved to its first address;
  /// "" = every interface) on `port` (0 = ephemeral) and start serving.
  /// Throws AlreadyExistsError when the port is taken, UnavailableError for
  /// other bind failures, InvalidArgumentError for an unresolvable host.
  /// With tls.enabled(), serve TLS only; throws as configure_server_tls
  /// (store_tls.h) when the files are missing or invalid.
  StoreServer(const std::string& host, uint16_t port, std::string auth_token, const TlsConfig& tls = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// The bound port (the ephemeral one when constructed with 0).
  uint16_t port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::store
