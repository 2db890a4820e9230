// SPDX-License-Identifier: Apache-2.0
#include "frame.h"

#include <cstring>

namespace strata::transport::tcp {

namespace {
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "frames are encoded with memcpy and assume a little-endian host");

template <class T>
void put(uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof v);
  p += sizeof v;
}
template <class T>
T take(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}
std::string hex(uint64_t v) {
  static const char* d = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 60; i >= 0; i -= 4) s += d[(v >> i) & 0xf];
  return s;
}
}  // namespace

void encode_header(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]) {
  uint8_t* p = out;
  put<uint32_t>(p, kFrameMagic);
  put<uint16_t>(p, kFrameVersion);
  put<uint16_t>(p, h.flags);
  put<uint64_t>(p, h.tag);
  put<uint64_t>(p, h.seq);
  put<uint64_t>(p, h.length);
  put<uint64_t>(p, h.offset);
  put<uint64_t>(p, h.total);
}

std::string decode_header(const uint8_t* data, size_t size, FrameHeader* out) {
  if (size < kFrameHeaderBytes)
    return "short frame header (" + std::to_string(size) + " of " +
           std::to_string(kFrameHeaderBytes) + " bytes)";
  const uint8_t* p = data;
  const uint32_t magic = take<uint32_t>(p);
  const uint16_t version = take<uint16_t>(p);
  FrameHeader h;
  h.flags = take<uint16_t>(p);
  h.tag = take<uint64_t>(p);
  h.seq = take<uint64_t>(p);
  h.length = take<uint64_t>(p);
  h.offset = take<uint64_t>(p);
  h.total = take<uint64_t>(p);
  if (magic != kFrameMagic)
    return "bad frame magic " + hex(magic) + " (expected " + hex(kFrameMagic) +
           "; is another program writing to this port?)";
  if (version != kFrameVersion)
    return "frame version " + std::to_string(version) + " but this process speaks " +
           std::to_string(kFrameVersion) + " (run the same Strata version on every rank)";
  if (h.flags != kFlagData && h.flags != kFlagHandshake && h.flags != (kFlagHandshake | kFlagDeclined))
    return "unknown frame flags " + hex(h.flags);
  if (h.total > kMaxMessageBytes)
    return "message size " + std::to_string(h.total) + " exceeds the limit of " +
           std::to_string(kMaxMessageBytes) + " bytes";
  if (h.length > h.total || h.offset > h.total - h.length)
    return "frame range [" + std::to_string(h.offset) + ", +" + std::to_string(h.length) +
           ") lies outside the " + std::to_string(h.total) + "-byte message";
  if ((h.flags & kFlagHandshake) != 0 && (h.length != kHandshakeBytes || h.total != kHandshakeBytes))
    return "handshake frame of " + std::to_string(h.length) + " bytes (expected " +
           std::to_string(kHandshakeBytes) + ")";
  *out = h;
  return "";
}

void encode_handshake(const Handshake& h, uint8_t out[kHandshakeBytes]) {
  uint8_t* p = out;
  put<uint64_t>(p, h.name_hash);
  put<int32_t>(p, h.rank);
  put<int32_t>(p, h.world);
  put<uint32_t>(p, h.conn_index);
  put<uint32_t>(p, h.conns_per_peer);
  for (size_t i = 0; i < kHandshakeNonceBytes; ++i) *p++ = i < h.nonce.size() ? static_cast<uint8_t>(h.nonce[i]) : 0;
  for (size_t i = 0; i < kHandshakeMacBytes; ++i) *p++ = i < h.mac.size() ? static_cast<uint8_t>(h.mac[i]) : 0;
}

std::string decode_handshake(const uint8_t* data, size_t size, Handshake* out) {
  if (size != kHandshakeBytes) return "handshake of " + std::to_string(size) + " bytes";
  const uint8_t* p = data;
  Handshake h;
  h.name_hash = take<uint64_t>(p);
  h.rank = take<int32_t>(p);
  h.world = take<int32_t>(p);
  h.conn_index = take<uint32_t>(p);
  h.conns_per_peer = take<uint32_t>(p);
  h.nonce.assign(reinterpret_cast<const char*>(p), kHandshakeNonceBytes);
  p += kHandshakeNonceBytes;
  h.mac.assign(reinterpret_cast<const char*>(p), kHandshakeMacBytes);
  if (h.world < 1) return "handshake world size " + std::to_string(h.world) + " < 1";
  if (h.rank < 0 || h.rank >= h.world)
    return "handshake rank " + std::to_string(h.rank) + " outside 0.." + std::to_string(h.world - 1);
  if (h.conns_per_peer < 1 || h.conns_per_peer > 8 || h.conn_index >= h.conns_per_peer)
    return "handshake connection " + std::to_string(h.conn_index) + " of " +
           std::to_string(h.conns_per_peer) + " is invalid";
  *out = h;
  return "";
}

uint64_t comm_name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace strata::transport::tcp
