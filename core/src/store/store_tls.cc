// SPDX-License-Identifier: Apache-2.0
#include "store/store_tls.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "strata/error.hpp"

namespace strata::store {

std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

namespace {

// `what` is e.g. "certificate", `key` the config key ("cert").
void check_readable(const std::string& path, const char* what, const char* key) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int e = errno;
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "rendezvous store TLS: cannot read the ", what, " file '", path, "' (",
                 std::strerror(e), "), named by /rendezvous/tls/", key, " or STRATA_TLS_",
                 key == std::string("cert") ? "CERT" : key == std::string("key") ? "KEY" : "CA",
                 "; fix the path or the file's permissions");
  }
  std::fclose(f);
}

void common_setup(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // The store's frames carry their own lengths, so a peer that closes
  // without close_notify is an ordinary closed connection, not an attack.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
}

void load_identity(SSL_CTX* ctx, const TlsConfig& cfg) {
  if (cfg.cert.empty() != cfg.key.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store TLS: \"",
                 cfg.cert.empty() ? "key" : "cert", "\" is set but \"", cfg.cert.empty() ? "cert" : "key",
                 "\" is not (", kTlsConfigHint, "); set both the certificate and its private key");
  if (cfg.cert.empty()) return;
  check_readable(cfg.cert, "certificate", "cert");
  check_readable(cfg.key, "private key", "key");
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx, cfg.cert.c_str()) != 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store TLS: '", cfg.cert,
                 "' (/rendezvous/tls/cert) is not a PEM certificate (OpenSSL: ", openssl_errors(), ")");
  if (SSL_CTX_use_PrivateKey_file(ctx, cfg.key.c_str(), SSL_FILETYPE_PEM) != 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store TLS: '", cfg.key,
                 "' (/rendezvous/tls/key) is not an unencrypted PEM private key (OpenSSL: ", openssl_errors(), ")");
  if (SSL_CTX_check_private_key(ctx) != 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store TLS: the private key '", cfg.key,
                 "' does not belong to the certificate '", cfg.cert, "' (OpenSSL: ", openssl_errors(),
                 "); give the key the certificate was issued for");
}

void load_ca(SSL_CTX* ctx, const std::string& ca) {
  check_readable(ca, "CA certificate", "ca");
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store TLS: '", ca,
                 "' (/rendezvous/tls/ca) holds no PEM CA certificate (OpenSSL: ", openssl_errors(), ")");
}

}  // namespace

void configure_server_tls(SSL_CTX* ctx, const TlsConfig& cfg) {
  if (cfg.cert.empty() || cfg.key.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "rendezvous store TLS: this process serves the store (it is the chief) and TLS is on, so it "
                 "needs its certificate and private key: set \"cert\" and \"key\" (",
                 kTlsConfigHint, ")");
  common_setup(ctx);
  // No session resumption is used: skip sending tickets.
  SSL_CTX_set_num_tickets(ctx, 0);
  load_identity(ctx, cfg);
  if (!cfg.ca.empty()) {
    load_ca(ctx, cfg.ca);
    // Advertise the CA so that a client picks the right certificate.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(cfg.ca.c_str())) SSL_CTX_set_client_CA_list(ctx, names);
    ERR_clear_error();
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  }
}

SSL_CTX* make_client_tls(const TlsConfig& cfg) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr)
    STRATA_THROW(STRATA_ERR_INTERNAL, "rendezvous store TLS: SSL_CTX_new failed (OpenSSL: ", openssl_errors(), ")");
  try {
    common_setup(ctx);
    load_identity(ctx, cfg);
    if (!cfg.ca.empty()) {
      load_ca(ctx, cfg.ca);
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      STRATA_THROW(STRATA_ERR_INTERNAL, "rendezvous store TLS: cannot load the system's trust store (OpenSSL: ",
                   openssl_errors(), "); set /rendezvous/tls/ca");
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  } catch (...) {
    SSL_CTX_free(ctx);
    throw;
  }
  return ctx;
}

}  // namespace strata::store
