// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the tcp transport's frame and handshake decoders must
// accept or reject any bytes without crashing, and whatever they accept
// must satisfy the invariants the transport relies on and round-trip.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "frame.h"

using namespace strata::transport::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FrameHeader h;
  if (decode_header(data, size, &h).empty()) {
    if (h.length > h.total || h.offset + h.length > h.total || h.total > kMaxMessageBytes) std::abort();
    if (h.flags == kFlagHandshake && h.length != kHandshakeBytes) std::abort();
    uint8_t again[kFrameHeaderBytes];
    encode_header(h, again);
    if (std::memcmp(again, data, kFrameHeaderBytes) != 0) std::abort();
  }
  if (size >= kHandshakeBytes) {
    Handshake hs;
    if (decode_handshake(data + size - kHandshakeBytes, kHandshakeBytes, &hs).empty()) {
      if (hs.rank < 0 || hs.rank >= hs.world || hs.conn_index >= hs.conns_per_peer) std::abort();
      uint8_t again[kHandshakeBytes];
      encode_handshake(hs, again);
      if (std::memcmp(again, data + size - kHandshakeBytes, kHandshakeBytes) != 0) std::abort();
    }
  }
  (void)comm_name_hash(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
