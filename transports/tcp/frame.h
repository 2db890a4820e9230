// SPDX-License-Identifier: Apache-2.0
// Wire format of the TCP transport. Pure functions, no I/O, fuzzed by
// tests/transports/frame_fuzz.cc.
//
// Every frame is a fixed 48-byte little-endian header plus `length` payload
// bytes:
//   magic u32 | version u16 | flags u16 | tag u64 | seq u64 | length u64 |
//   offset u64 | total u64
// A message (one isend) of `total` bytes travels as one or more data frames
// (stripes, possibly on different connections of the same peer), each
// carrying bytes [offset, offset + length) of it; `seq` numbers the messages
// of one sender to one receiver from 0. A connection opens with one
// handshake frame each way (flags = kFlagHandshake, payload below).
//
// Handshake authentication (version 2): each rank publishes a fresh 32-byte
// nonce with its address through the (token-authenticated) store, and rank
// 0 a random per-communicator secret. The connecting rank sends its own
// fresh nonce and HMAC-SHA256(secret, "strata-tcp-2 connect" | fields |
// acceptor_nonce | nonce); the acceptor answers with its fields, the same
// nonce and HMAC(secret, "strata-tcp-2 accept" | ...). A process without
// store access cannot join or inject data, and a recorded handshake is
// useless in another communicator (other nonces) or the same one (slot
// already taken).
//
// Version 3 (lazy connections): either rank of a pair may connect first.
// When both do at once, the lower rank's connections win: an acceptor that
// is itself connecting to a higher rank answers that rank's handshake with
// flags = kFlagHandshake | kFlagDeclined and HMAC(secret, "strata-tcp-2
// decline" | ...), and closes; the higher rank then waits for the lower
// rank's connections. A version-2 peer sees a clear version error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::transport::tcp {

constexpr uint32_t kFrameMagic = 0x53545446;  // "FTTS"
constexpr uint16_t kFrameVersion = 3;
constexpr size_t kFrameHeaderBytes = 48;
constexpr size_t kHandshakeFieldBytes = 24;  ///< name_hash .. conns_per_peer, the MAC's input
constexpr size_t kHandshakeNonceBytes = 32;
constexpr size_t kHandshakeMacBytes = 32;
constexpr size_t kHandshakeBytes = kHandshakeFieldBytes + kHandshakeNonceBytes + kHandshakeMacBytes;
/// Largest message the decoder accepts (a sanity bound against garbage).
constexpr uint64_t kMaxMessageBytes = 1ull << 40;

enum FrameFlags : uint16_t {
  kFlagData = 0,
  kFlagHandshake = 1,
  kFlagDeclined = 2,  ///< only with kFlagHandshake: "connect to me the other way" (see above)
};

struct FrameHeader {
  uint16_t flags = kFlagData;
  uint64_t tag = 0;
  uint64_t seq = 0;
  uint64_t length = 0;  ///< payload bytes in this frame
  uint64_t offset = 0;  ///< where they go in the message
  uint64_t total = 0;   ///< message size
};

/// Handshake payload: who is connecting, to which communicator.
struct Handshake {
  uint64_t name_hash = 0;   ///< comm_name_hash(communicator name)
  int32_t rank = 0;         ///< sender's rank
  int32_t world = 0;        ///< sender's world size
  uint32_t conn_index = 0;  ///< which of the connections_per_peer this is
  uint32_t conns_per_peer = 0;
  std::string nonce;  ///< the connecting side's fresh nonce (kHandshakeNonceBytes)
  std::string mac;    ///< HMAC over the fields and both nonces (kHandshakeMacBytes)
};

void encode_header(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]);
/// Decode and validate (magic, version, known flags, offset + length <= total
/// <= kMaxMessageBytes, handshake frames of the right size). Returns "" on
/// success, else what is wrong (for an error message).
std::string decode_header(const uint8_t* data, size_t size, FrameHeader* out);

void encode_handshake(const Handshake& h, uint8_t out[kHandshakeBytes]);
/// Returns "" on success, else what is wrong (negative rank, world < 1, ...).
std::string decode_handshake(const uint8_t* data, size_t size, Handshake* out);

/// FNV-1a 64 of the communicator name.
uint64_t comm_name_hash(const std::string& name);

}  // namespace strata::transport::tcp
