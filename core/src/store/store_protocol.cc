// SPDX-License-Identifier: Apache-2.0
#include "store/store_protocol.h"

#include <cstdlib>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "strata/error.hpp"

namespace strata::store {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the store protocol is encoded with memcpy and assumes a little-endian host");

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    STRATA_THROW(STRATA_ERR_INTERNAL, "rendezvous store: the system random generator failed (OpenSSL RAND_bytes)");
  return out;
}

namespace {
std::string hmac(const std::string& key, const char* role, const std::string& a, const std::string& b) {
  const std::string msg = std::string("strata-store-2 ") + role + a + b;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // An empty key is valid HMAC input; pass a non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : static_cast<const void*>(key.data());
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
           msg.size(), out, &len) == nullptr)
    STRATA_THROW(STRATA_ERR_INTERNAL, "rendezvous store: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(out), len);
}
}  // namespace

std::string client_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce) {
  return hmac(token, "client", server_nonce, client_nonce);
}

std::string server_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce) {
  return hmac(token, "server", server_nonce, client_nonce);
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Touch max(len) bytes whatever the inputs so timing reveals only lengths.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool split_host_port(const std::string& address, std::string* host, uint16_t* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return false;
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty()) return false;
  const std::string p = address.substr(colon + 1);
  char* end = nullptr;
  const long v = std::strtol(p.c_str(), &end, 10);
  if (end != p.c_str() + p.size() || v < 0 || v > 65535) return false;
  *host = h;
  *port = static_cast<uint16_t>(v);
  return true;
}

std::string join_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace strata::store
