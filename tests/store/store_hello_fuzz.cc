// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the rendezvous store's authentication handshake: the
// same bytes go to every decoder the server and the client run before a
// connection is trusted (decode_challenge with the TLS preamble, decode_hello, decode_hello_answer
// and their checks, store_protocol.h). Each must give a verdict without
// crashing or reading past the input; whatever decodes must re-encode to the
// same bytes (one encoding per message, so nothing is accepted that the
// checks did not see). The bytes also serve as an XOR mask and a cut over a
// valid HELLO and a valid answer for fixed nonces and token: the mutated
// frame must never be accepted with the original proof. Anything else aborts.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "store/store_protocol.h"

namespace {

using namespace strata::store;

const std::string kToken = "fuzz-token";
const std::string kServerNonce(kNonceBytes, 's');
const std::string kClientNonce(kNonceBytes, 'c');

void check(bool ok) {
  if (!ok) std::abort();
}

// A frame's body: the frame without its 4-byte length.
std::string body_of(const std::string& frame) { return frame.substr(4); }

const std::string& valid_hello() {
  static const std::string body = [] {
    Hello h;
    h.version = kProtocolVersion;
    h.client_nonce = kClientNonce;
    h.client_proof = client_proof(kToken, kServerNonce, kClientNonce);
    return body_of(encode_hello(h));
  }();
  return body;
}

const std::string& valid_answer() {
  static const std::string body = [] {
    Writer w;
    w.i32(0).i64(0).str(server_proof(kToken, kServerNonce, kClientNonce));
    return body_of(w.finish());
  }();
  return body;
}

// `base` XOR `mask` (the mask's extra bytes appended), then cut to `cut`
// bytes when cut is smaller.
std::string mutate(const std::string& base, const std::string& mask, size_t cut) {
  std::string m = base;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (i < m.size()) {
      m[i] = static_cast<char>(m[i] ^ mask[i]);
    } else {
      m.push_back(mask[i]);
    }
  }
  if (cut < m.size()) m.resize(cut);
  return m;
}

bool hello_accepted(const std::string& body) {
  Hello h;
  return decode_hello(body.data(), body.size(), &h) == HelloVerdict::kOk &&
         check_hello(h, kToken, kServerNonce) == HelloVerdict::kOk;
}

bool answer_accepted(const std::string& body) {
  HelloAnswer a;
  return decode_hello_answer(body.data(), body.size(), &a) == HelloVerdict::kOk &&
         check_hello_answer(a, kToken, kServerNonce, kClientNonce) == HelloVerdict::kOk;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const std::string in(p, size);

  Challenge ch;
  switch (decode_challenge(p, size, &ch)) {
    case HelloVerdict::kOk:
      check(ch.version == kProtocolVersion && ch.server_nonce.size() == kNonceBytes);
      check(body_of(encode_challenge(ch.server_nonce)) == in);
      break;
    case HelloVerdict::kVersionMismatch:
      check(ch.version != kProtocolVersion);
      break;
    case HelloVerdict::kTlsRequired:
      check(size == 8);
      if (ch.version == kProtocolVersion) check(body_of(encode_tls_preamble()) == in);
      break;
    case HelloVerdict::kMalformed:
      break;
    default:
      std::abort();
  }

  Hello h;
  switch (decode_hello(p, size, &h)) {
    case HelloVerdict::kOk: {
      check(h.version == kProtocolVersion && h.client_nonce.size() == kNonceBytes &&
            h.client_proof.size() == kProofBytes);
      check(body_of(encode_hello(h)) == in);
      const HelloVerdict v = check_hello(h, kToken, kServerNonce);
      check(v == HelloVerdict::kOk || v == HelloVerdict::kWrongToken);
      // Accepted only with the proof for its own nonce and this challenge.
      if (v == HelloVerdict::kOk) check(h.client_proof == client_proof(kToken, kServerNonce, h.client_nonce));
      // Without a token every well-formed HELLO passes.
      check(check_hello(h, "", kServerNonce) == HelloVerdict::kOk);
      break;
    }
    case HelloVerdict::kVersionMismatch:
      check(h.version != kProtocolVersion);
      break;
    case HelloVerdict::kMalformed:
      break;
    default:
      std::abort();
  }

  HelloAnswer a;
  if (decode_hello_answer(p, size, &a) == HelloVerdict::kOk) {
    check(a.data.size() <= kMaxHelloAnswerBytes);
    Writer w;
    w.i32(a.status).i64(0).str(a.data);
    check(body_of(w.finish()) == in);
    const HelloVerdict v = check_hello_answer(a, kToken, kServerNonce, kClientNonce);
    if (a.status != 0) check(v == HelloVerdict::kRefused);
    if (v == HelloVerdict::kOk) check(a.data == server_proof(kToken, kServerNonce, kClientNonce));
  }

  // Mutations of valid frames: the last input byte (if any) picks a cut.
  const size_t cut = size == 0 ? SIZE_MAX : static_cast<size_t>(data[size - 1]) * 2;
  check(hello_accepted(valid_hello()) && answer_accepted(valid_answer()));
  const std::string hello = mutate(valid_hello(), in, cut);
  if (hello != valid_hello()) check(!hello_accepted(hello));
  const std::string answer = mutate(valid_answer(), in, cut);
  if (answer != valid_answer()) check(!answer_accepted(answer));
  return 0;
}
