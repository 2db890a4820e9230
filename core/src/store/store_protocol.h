// SPDX-License-Identifier: Apache-2.0
// Wire format of the TCP rendezvous store (server: store_server.cc, client:
// tcp_store_client.cc). Everything is little-endian.
//
//   frame    = u32 body_length, body (body_length <= kMaxFrameBytes; before
//              HELLO succeeds, <= kMaxHelloFrameBytes)
//   challenge = u32 magic, u32 version, str server_nonce (the server's first
//              frame, sent on accept, before anything is read)
//   preamble = u32 magic "SRTL", u32 version (only from a store with TLS:
//              its first frame, in the clear; then the client's TLS
//              handshake, and the challenge and all else inside TLS; see
//              store_tls.h)
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
constexpr uint32_t kTlsPreambleMagic = 0x4c545253;  // "SRTL"
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

/// The handshake as pure functions, shared by store_server.cc and
/// tcp_store_client.cc and fuzzed by tests/store/store_hello_fuzz.cc. A
/// decoder takes a frame body (without its length prefix) and is total: any
/// bytes give a verdict, never an exception or a read past the end; `out` is
/// filled only as far as the verdict says. The checks compare proofs in
/// constant time and throw only when OpenSSL itself fails (INTERNAL).
enum class HelloVerdict {
  kOk,
  kMalformed,        ///< truncated, oversized, wrong magic or trailing bytes
  kVersionMismatch,  ///< well-formed up to the version, which is not ours (`version` is set)
  kWrongToken,       ///< server: the client's proof is not HMAC(token, this challenge)
  kRefused,          ///< client: the server answered HELLO with a non-OK status
  kNoServerToken,    ///< client: the server accepted without a proof (it has no token), we have one
  kBadServerProof,   ///< client: the server's proof is not HMAC(token, this exchange)
  kTlsRequired,      ///< client: the server's first frame is the TLS preamble (`version` is set)
};

/// The server's first frame.
struct Challenge {
  uint32_t version = 0;
  std::string server_nonce;
};
/// kOk (version and nonce set), kVersionMismatch (version set), kTlsRequired
/// (version set) or kMalformed.
HelloVerdict decode_challenge(const char* body, size_t size, Challenge* out);
/// The whole challenge frame (length prefix included).
std::string encode_challenge(const std::string& server_nonce);
/// The whole TLS preamble frame.
std::string encode_tls_preamble();

/// The client's first request.
struct Hello {
  uint32_t version = 0;
  std::string client_nonce;
  std::string client_proof;
};
/// `body` starts with the op byte. kOk, kVersionMismatch (only `version` is
/// set: the rest may be another protocol's) or kMalformed.
HelloVerdict decode_hello(const char* body, size_t size, Hello* out);
/// The whole HELLO frame for `hello` as it is (the proof is not computed).
std::string encode_hello(const Hello& hello);
/// Server: kOk when `token` is empty or the proof matches this connection's
/// `server_nonce`, else kWrongToken. `hello` comes from decode_hello == kOk.
HelloVerdict check_hello(const Hello& hello, const std::string& token, const std::string& server_nonce);

/// The server's answer to HELLO (a response: status, number, data).
struct HelloAnswer {
  int32_t status = 0;
  std::string data;  ///< server_proof when status is OK, else the error message
};
/// kOk or kMalformed (the response's number must be 0).
HelloVerdict decode_hello_answer(const char* body, size_t size, HelloAnswer* out);
/// Client: kRefused for a non-OK status; with a token, kNoServerToken or
/// kBadServerProof unless `data` is the server's proof; else kOk.
HelloVerdict check_hello_answer(const HelloAnswer& answer, const std::string& token,
                                const std::string& server_nonce, const std::string& client_nonce);
/// Largest HELLO answer body a client reads (an error message).
constexpr uint32_t kMaxHelloAnswerBytes = 65536;

/// Compare two secrets in time independent of where they differ.
bool constant_time_equal(const std::string& a, const std::string& b);

/// Split "host:port" or "[v6]:port"; false when malformed.
bool split_host_port(const std::string& address, std::string* host, uint16_t* port);

/// "host:port", bracketing IPv6 literals.
std::string join_host_port(const std::string& host, uint16_t port);

}  // namespace strata::store
