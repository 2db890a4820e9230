// SPDX-License-Identifier: Apache-2.0
// Optional TLS for the rendezvous store (config /rendezvous/tls, env
// STRATA_TLS_CERT / STRATA_TLS_KEY / STRATA_TLS_CA). Shared by the server
// (store_server.cc, Boost.Asio over the SSL_CTX filled here) and the client
// (tcp_store_client.cc, OpenSSL's SSL API over its non-blocking socket).
//
// Roles of the three files (PEM):
//   cert, key  the server's identity (required on the chief); on a client,
//              presented to the server (mutual TLS)
//   ca         a client verifies the server's certificate against it (without
//              it, against the system's trust store); on the server it makes a
//              client certificate signed by it mandatory
// Only the chain is verified, not a host name: any certificate the CA signed
// is a member of the job, so use a CA of its own for the job. The HMAC token
// handshake still runs inside TLS.
//
// On the wire a TLS server first sends a plain preamble frame (magic
// kTlsPreambleMagic, store_protocol.h) and then waits for the client's TLS
// handshake; the challenge and everything after it travel inside TLS. The
// preamble lets a plain client say "this store speaks TLS" at once, and a TLS
// client that meets a plain challenge instead refuses it at once (no
// downgrade).
//
// Every function throws strata::Error with a message that names the file,
// the config key and OpenSSL's reason. Thread-safe (no shared state).
#pragma once

#include <string>

struct ssl_ctx_st;  // SSL_CTX
struct ssl_st;      // SSL

namespace strata::store {

struct TlsConfig {
  std::string cert;  ///< PEM certificate (chain) file
  std::string key;   ///< PEM private key file
  std::string ca;    ///< PEM CA file
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

/// Set up `ctx` for the chief's server: TLS >= 1.2, cert and key (required),
/// and with `ca` a mandatory client certificate signed by it. Throws
/// InvalidArgumentError when cert or key is not set or does not parse,
/// NotFoundError naming the path when a file cannot be read.
void configure_server_tls(ssl_ctx_st* ctx, const TlsConfig& cfg);

/// A new client SSL_CTX: TLS >= 1.2, server verification against `ca` (or
/// the system's trust store), and cert + key when given. The caller frees
/// it with SSL_CTX_free. Throws as configure_server_tls.
ssl_ctx_st* make_client_tls(const TlsConfig& cfg);

/// Every error queued by OpenSSL on this thread, "; "-joined, then cleared
/// ("" when none).
std::string openssl_errors();

/// Where the configuration of TLS is named in messages.
constexpr const char* kTlsConfigHint = "/rendezvous/tls in the job config or STRATA_TLS_CERT/STRATA_TLS_KEY/STRATA_TLS_CA";

}  // namespace strata::store
