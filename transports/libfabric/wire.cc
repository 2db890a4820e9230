// SPDX-License-Identifier: Apache-2.0
#include "wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace strata::transport::libfabric {

namespace {

bool hmac_sha256(const std::string& secret, const std::string& msg, unsigned char out[EVP_MAX_MD_SIZE]) {
  unsigned int len = 0;
  return HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
              reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) != nullptr &&
         len == 32;
}

void put_u32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

bool random_secret(std::string* out) {
  out->assign(kSecretBytes, '\0');
  return RAND_bytes(reinterpret_cast<unsigned char*>(out->data()), static_cast<int>(kSecretBytes)) == 1;
}

bool pair_key(const std::string& secret, const std::string& comm, uint32_t src, uint32_t dst, AuthKey* out) {
  std::string msg("strata-lf-1", 11);
  msg.push_back('\0');
  msg += comm;
  msg.push_back('\0');
  put_u32(&msg, src);
  put_u32(&msg, dst);
  unsigned char mac[EVP_MAX_MD_SIZE];
  if (!hmac_sha256(secret, msg, mac)) return false;
  for (size_t i = 0; i < kAuthBytes; ++i) (*out)[i] = mac[i];
  return true;
}

bool data_tag_mask(const std::string& secret, const std::string& comm, uint64_t* out) {
  std::string msg("strata-lf-1 tags", 16);
  msg.push_back('\0');
  msg += comm;
  unsigned char mac[EVP_MAX_MD_SIZE];
  if (!hmac_sha256(secret, msg, mac)) return false;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(mac[i]) << (8 * i);
  *out = v;
  return true;
}

bool same_key(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kAuthBytes) == 0; }

}  // namespace strata::transport::libfabric
