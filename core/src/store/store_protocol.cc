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

HelloVerdict decode_challenge(const char* body, size_t size, Challenge* out) {
  Reader r(body, size);
  const uint32_t magic = r.u32();
  const uint32_t version = r.u32();
  if (r.ok() && r.at_end() && magic == kTlsPreambleMagic) {
    out->version = version;
    return HelloVerdict::kTlsRequired;
  }
  if (!r.ok() || magic != kChallengeMagic) return HelloVerdict::kMalformed;
  out->version = version;
  if (version != kProtocolVersion) return HelloVerdict::kVersionMismatch;
  std::string nonce = r.str(kNonceBytes);
  if (!r.ok() || !r.at_end() || nonce.size() != kNonceBytes) return HelloVerdict::kMalformed;
  out->server_nonce = std::move(nonce);
  return HelloVerdict::kOk;
}

std::string encode_challenge(const std::string& server_nonce) {
  Writer w;
  w.u32(kChallengeMagic).u32(kProtocolVersion).str(server_nonce);
  return std::move(w.finish());
}

std::string encode_tls_preamble() {
  Writer w;
  w.u32(kTlsPreambleMagic).u32(kProtocolVersion);
  return std::move(w.finish());
}

HelloVerdict decode_hello(const char* body, size_t size, Hello* out) {
  Reader r(body, size);
  const uint8_t op = r.u8();
  const uint32_t magic = r.u32();
  const uint32_t version = r.u32();
  if (!r.ok() || op != static_cast<uint8_t>(Op::kHello) || magic != kHelloMagic) return HelloVerdict::kMalformed;
  out->version = version;
  // Another version's HELLO may lay out the rest differently: answer it
  // with the version mismatch rather than calling it malformed.
  if (version != kProtocolVersion) return HelloVerdict::kVersionMismatch;
  std::string nonce = r.str(kNonceBytes);
  std::string proof = r.str(kProofBytes);
  if (!r.ok() || !r.at_end() || nonce.size() != kNonceBytes || proof.size() != kProofBytes)
    return HelloVerdict::kMalformed;
  out->client_nonce = std::move(nonce);
  out->client_proof = std::move(proof);
  return HelloVerdict::kOk;
}

std::string encode_hello(const Hello& hello) {
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kHello)).u32(kHelloMagic).u32(hello.version).str(hello.client_nonce).str(
      hello.client_proof);
  return std::move(w.finish());
}

HelloVerdict check_hello(const Hello& hello, const std::string& token, const std::string& server_nonce) {
  if (hello.version != kProtocolVersion) return HelloVerdict::kVersionMismatch;
  if (hello.client_nonce.size() != kNonceBytes) return HelloVerdict::kMalformed;
  if (token.empty()) return HelloVerdict::kOk;
  return constant_time_equal(hello.client_proof, client_proof(token, server_nonce, hello.client_nonce))
             ? HelloVerdict::kOk
             : HelloVerdict::kWrongToken;
}

HelloVerdict decode_hello_answer(const char* body, size_t size, HelloAnswer* out) {
  Reader r(body, size);
  const int32_t status = r.i32();
  const int64_t number = r.i64();  // unused by HELLO: always 0, so one encoding per answer
  std::string data = r.str(kMaxHelloAnswerBytes);
  if (!r.ok() || !r.at_end() || number != 0) return HelloVerdict::kMalformed;
  out->status = status;
  out->data = std::move(data);
  return HelloVerdict::kOk;
}

HelloVerdict check_hello_answer(const HelloAnswer& answer, const std::string& token,
                                const std::string& server_nonce, const std::string& client_nonce) {
  if (answer.status != STRATA_OK) return HelloVerdict::kRefused;
  if (token.empty()) return HelloVerdict::kOk;
  if (answer.data.empty()) return HelloVerdict::kNoServerToken;
  return constant_time_equal(answer.data, server_proof(token, server_nonce, client_nonce))
             ? HelloVerdict::kOk
             : HelloVerdict::kBadServerProof;
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
