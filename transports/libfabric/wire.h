// SPDX-License-Identifier: Apache-2.0
// Wire format and authentication of the libfabric transport. Pure functions,
// no libfabric calls (tests/transports/libfabric_auth_test.cc plays a
// stranger with them).
//
// Tags. The top usable tag bit (1 << (tag_bits - 1)) marks control
// messages; data messages use the bits below it: the sender's rank above
// `seq_bits` bits of its data sequence number to this receiver, XORed with a
// per-communicator random mask (data_tag_mask). The XOR is a bijection, so a
// tag stays unique per (sender, data sequence) and never has the control
// bit.
//
// Authentication. Rank 0 draws a random 32-byte secret per communicator and
// publishes it through the host store (token-authenticated), under
// "<name>/lf/secret". Each ordered pair (src, dst) gets a 16-byte key,
// pair_key(); every control message from src to dst carries it in `auth`,
// and dst checks it (constant time) before acting on the message.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::transport::libfabric {

constexpr uint32_t kCtrlMagic = 0x5354464c;  // "STFL"
constexpr size_t kSecretBytes = 32;
constexpr size_t kAuthBytes = 16;
using AuthKey = std::array<uint8_t, kAuthBytes>;

// Control message. Host byte order: every rank of a communicator runs the
// same build on the same architecture (libfabric's own wire formats assume
// the same). An eager payload (at most kEagerBytes) follows the header.
struct CtrlHeader {
  uint32_t magic;
  uint32_t src;        // sender rank
  uint64_t ctrl_seq;   // number of this message from src to this rank
  uint64_t tag;        // user tag
  uint64_t total;      // payload bytes
  uint64_t first_seq;  // data sequence of the first data message
  uint64_t nchunks;    // data messages (0: payload follows this header)
  uint64_t chunk;      // bytes per data message but the last; with no data
                       // messages: payload bytes in this control message
  uint64_t kind;       // kMsg, or a notice (payload: the reason)
  uint8_t auth[kAuthBytes];  // pair_key(secret, name, src, dst)
};
static_assert(sizeof(CtrlHeader) == 80, "CtrlHeader is a wire format");

// Notices travel in the control sequence, after every message sent before.
constexpr uint64_t kMsg = 0;
constexpr uint64_t kBye = 1;    // the sender destroyed its communicator
constexpr uint64_t kAbort = 2;  // the sender aborted its communicator
// Clear to send: the receiver matched the split message whose control
// sequence is in `tag` and posted receives for its data. A split message's
// data waits for this, so it never lands unexpected in the receiver's
// queues, whatever order the receiver takes messages in.
constexpr uint64_t kCts = 3;
// The rest of an eager message whose payload did not fit one control
// message: a kMsg whose `chunk` (payload bytes carried) is below its `total`
// is followed, in the control sequence, by kFrag messages carrying the next
// `total` bytes each until the message is whole. Nothing comes between them
// (the sender sends them in one go).
constexpr uint64_t kFrag = 4;

/// The control tag for `tag_bits` usable tag bits.
inline uint64_t ctrl_wire_tag(int tag_bits) { return 1ull << (tag_bits - 1); }

/// The wire tag of data message `seq` from rank `src` (see "Tags"); `mask`
/// from data_tag_mask(), 0 for the unmixed layout.
inline uint64_t data_wire_tag(int src, uint64_t seq, int tag_bits, int seq_bits, uint64_t mask) {
  const uint64_t low = (static_cast<uint64_t>(src) << seq_bits) | (seq & ((1ull << seq_bits) - 1));
  return low ^ (mask & (ctrl_wire_tag(tag_bits) - 1));
}

/// 32 bytes from the system random generator (OpenSSL RAND_bytes); false
/// when it fails.
bool random_secret(std::string* out);

/// HMAC-SHA256(secret, "strata-lf-1" 0x00 comm 0x00 src dst), src and dst as
/// u32 little endian, truncated to 16 bytes. False when OpenSSL fails.
bool pair_key(const std::string& secret, const std::string& comm, uint32_t src, uint32_t dst, AuthKey* out);

/// The first 8 bytes (little endian) of HMAC-SHA256(secret, "strata-lf-1
/// tags" 0x00 comm): random bits mixed into data wire tags. False when
/// OpenSSL fails.
bool data_tag_mask(const std::string& secret, const std::string& comm, uint64_t* out);

/// Constant-time comparison of two keys.
bool same_key(const uint8_t* a, const uint8_t* b);

}  // namespace strata::transport::libfabric
