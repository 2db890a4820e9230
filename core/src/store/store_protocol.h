// SPDX-License-Identifier: Apache-2.0
// Wire format of the TCP rendezvous store (server: store_server.cc, client:
// tcp_store_client.cc). Everything is little-endian.
//
//   frame    = u32 body_length, body (body_length <= kMaxFrameBytes; before
//              HELLO succeeds, <= kMaxHelloFrameBytes)
//   challenge = u32 magic, u32 version, str server_nonce (the server's first
//              frame, sent on accept, before anything is read)
//   request  = u8 op, fields:
//     HELLO  u32 magic, u32 version, str client_nonce, str client_proof
//            (always the first request; the answer's data is server_proof)
//     SET    str key, str value
//     GET    str key, i64 timeout_ms                    (server waits for the key)
//     ADD    str key, i64 delta
//     WAIT   u32 n, n * str key, i64 timeout_ms
//   response = i32 status, i64 number (ADD result), str data (GET value or
//              the error message when status != 0)
//   str      = u32 length, bytes
//
// Authentication (protocol 2) is a challenge-response keyed by the job token
// (STRATA_AUTH_TOKEN), so the token never crosses the wire and a recorded
// HELLO is useless against a fresh challenge:
//   client_proof = HMAC-SHA256(token, "strata-store-2 client" | server_nonce | client_nonce)
//   server_proof = HMAC-SHA256(token, "strata-store-2 server" | server_nonce | client_nonce)
// The client checks server_proof too, so a process squatting on the chief's
// port cannot pose as the store. An empty token on the server disables the
// check (single-user machines); a client with a token then refuses it.
// Before HELLO succeeds a connection may send one small frame within
// kHelloTimeoutMs, and at most kMaxUnauthenticated such connections are
// kept (the oldest is dropped for a new one), so strangers cannot exhaust
// the chief's memory or keep a real worker out.
//
// A connection carries one request at a time: the client sends the next
// request only after the response to the previous one. The Reader is total:
// any truncation or oversize field makes ok() false instead of reading past
// the end, so garbage from the network cannot crash the server.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace strata::store {

constexpr uint32_t kHelloMagic = 0x53545253;  // "SRTS"
constexpr uint32_t kProtocolVersion = 2;
constexpr uint32_t kChallengeMagic = 0x43545253;  // "SRTC"
constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;
constexpr uint32_t kMaxHelloFrameBytes = 256;
constexpr int64_t kHelloTimeoutMs = 10000;
constexpr size_t kMaxUnauthenticated = 64;
constexpr uint64_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = 64ull << 20;
constexpr uint32_t kMaxWaitKeys = 65536;
constexpr uint32_t kMaxFrameBytes = static_cast<uint32_t>(kMaxValueBytes + (1u << 20));

enum class Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kWait = 5 };

class Writer {
 public:
  Writer() { buf_.resize(4); }  // room for the frame length
  Writer& u8(uint8_t v) { buf_.push_back(static_cast<char>(v)); return *this; }
  Writer& u32(uint32_t v) { return raw(&v, 4); }
  Writer& i32(int32_t v) { return raw(&v, 4); }
  Writer& i64(int64_t v) { return raw(&v, 8); }
  Writer& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
    return *this;
  }
  /// The frame with its length prefix filled in.
  std::string& finish() {
    const uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
    std::memcpy(&buf_[0], &n, 4);
    return buf_;
  }

 private:
  // Little-endian hosts only (x86-64, aarch64), checked in store_protocol.cc.
  Writer& raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string buf_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { uint8_t v = 0; raw(&v, 1); return v; }
  uint32_t u32() { uint32_t v = 0; raw(&v, 4); return v; }
  int32_t i32() { int32_t v = 0; raw(&v, 4); return v; }
  int64_t i64() { int64_t v = 0; raw(&v, 8); return v; }
  std::string str(uint64_t max_bytes) {
    const uint32_t n = u32();
    if (!ok_ || n > max_bytes || static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  void raw(void* out, size_t n) {
    if (!ok_ || static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return;
    }
    std::memcpy(out, p_, n);
    p_ += n;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

/// `n` bytes from the system's CSPRNG (OpenSSL RAND_bytes); INTERNAL on failure.
std::string random_bytes(size_t n);

/// HMAC-SHA256 proofs of the handshake (see the top of this file).
std::string client_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce);
std::string server_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce);

/// Compare two secrets in time independent of where they differ.
bool constant_time_equal(const std::string& a, const std::string& b);

/// Split "host:port" or "[v6]:port"; false when malformed.
bool split_host_port(const std::string& address, std::string* host, uint16_t* port);

/// "host:port", bracketing IPv6 literals.
std::string join_host_port(const std::string& host, uint16_t port);

}  // namespace strata::store
