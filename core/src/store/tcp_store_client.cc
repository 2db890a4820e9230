// SPDX-License-Identifier: Apache-2.0
#include "store/tcp_store_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "host/host_state.h"
#include "store/store_protocol.h"
#include "strata/error.hpp"

namespace strata::store {

namespace {

constexpr int64_t kGraceMs = 10000;  // server answers a timed-out GET within this

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class IoResult { kOk, kTimeout, kAborted, kError, kClosed };

// Wait until `fd` is ready for `events`, the deadline passes, or wake_fd fires.
IoResult wait_fd(int fd, short events, int wake_fd, int64_t deadline_ms) {
  for (;;) {
    const int64_t left = deadline_ms - now_ms();
    if (left <= 0) return IoResult::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(left > 1000000 ? 1000000 : left));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoResult::kError;
    }
    if (fds[1].revents) return IoResult::kAborted;
    if (fds[0].revents) return IoResult::kOk;
  }
}

IoResult send_all(int fd, const char* p, size_t n, int wake_fd, int64_t deadline_ms) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoResult r = wait_fd(fd, POLLOUT, wake_fd, deadline_ms);
      if (r != IoResult::kOk) return r;
      continue;
    }
    return IoResult::kError;
  }
  return IoResult::kOk;
}

IoResult recv_all(int fd, char* p, size_t n, int wake_fd, int64_t deadline_ms) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoResult r = wait_fd(fd, POLLIN, wake_fd, deadline_ms);
      if (r != IoResult::kOk) return r;
      continue;
    }
    return IoResult::kError;
  }
  return IoResult::kOk;
}

}  // namespace

TcpStoreClient::TcpStoreClient(std::string address, std::string token, int64_t connect_timeout_ms,
                               const std::atomic<bool>* abort_flag)
    : address_(std::move(address)), token_(std::move(token)), abort_(abort_flag) {
  if (!split_host_port(address_, &host_, &port_) || port_ == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store address '", address_,
                 "' is not host:port with a non-zero port; use e.g. \"10.0.0.1:29400\"");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0)
    STRATA_THROW(STRATA_ERR_INTERNAL, "rendezvous store client: eventfd failed: ", std::strerror(errno));
  strata_error err;
  strata_error_init(&err);
  strata_status_t st = STRATA_OK;
  const int fd = open_connection(now_ms() + connect_timeout_ms, &err, &st);
  if (fd < 0) {
    ::close(wake_fd_);
    detail::throw_status(st, err.message);
  }
  idle_.push_back(fd);
}

TcpStoreClient::~TcpStoreClient() {
  for (int fd : idle_) ::close(fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TcpStoreClient::notify_all() {
  if (abort_ != nullptr && abort_->load()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }
}

int TcpStoreClient::open_connection(int64_t deadline_ms, strata_error* err, strata_status_t* st) {
  std::string last_error = "no attempt made";
  // A refusal is the most useful thing to report: an attempt cut short by
  // the deadline says nothing new about a port that refused every earlier one.
  bool refused = false;
  int64_t backoff_ms = 20;
  for (;;) {
    if (abort_ != nullptr && abort_->load()) {
      *st = detail::set_error(err, STRATA_ERR_ABORTED,
                              "connecting to the rendezvous store at " + address_ +
                                  " aborted: the job was asked to stop (request_abort)");
      return -1;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (gai != 0) {
      refused = false;
      last_error = std::string("cannot resolve '") + host_ + "': " + ::gai_strerror(gai);
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                ai->ai_protocol);
        if (fd < 0) continue;
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
          const IoResult r = wait_fd(fd, POLLOUT, wake_fd_, deadline_ms);
          if (r == IoResult::kOk) {
            int so = 0;
            socklen_t len = sizeof so;
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
            rc = so == 0 ? 0 : -1;
            errno = so;
          } else {
            errno = r == IoResult::kTimeout ? ETIMEDOUT : EINTR;
          }
        }
        if (rc != 0) {
          const bool cut_by_deadline = errno == ETIMEDOUT && now_ms() >= deadline_ms;
          if (!(cut_by_deadline && refused)) {
            refused = errno == ECONNREFUSED;
            last_error = std::strerror(errno);
          }
          ::close(fd);
          continue;
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        // The challenge: the server speaks first (store_protocol.h). A server
        // that says nothing within the HELLO deadline is not a Strata 2 store.
        const int64_t challenge_deadline = std::min<int64_t>(deadline_ms, now_ms() + kHelloTimeoutMs);
        char hdr[4];
        uint32_t n = 0;
        std::string body;
        std::string server_nonce;
        IoResult r = recv_all(fd, hdr, 4, wake_fd_, challenge_deadline);
        if (r == IoResult::kOk) {
          std::memcpy(&n, hdr, 4);
          if (n > kMaxHelloFrameBytes) r = IoResult::kError;
        }
        if (r == IoResult::kOk) {
          body.resize(n);
          r = recv_all(fd, body.data(), n, wake_fd_, challenge_deadline);
        }
        if (r == IoResult::kOk) {
          Challenge ch;
          const HelloVerdict v = decode_challenge(body.data(), body.size(), &ch);
          if (v == HelloVerdict::kVersionMismatch) {
            ::close(fd);
            freeaddrinfo(res);
            *st = detail::set_error(err, STRATA_ERR_ABI_MISMATCH,
                                    "the rendezvous store at " + address_ + " speaks protocol version " +
                                        std::to_string(ch.version) + " but this process speaks " +
                                        std::to_string(kProtocolVersion) +
                                        "; run the same Strata version in every process");
            return -1;
          }
          if (v != HelloVerdict::kOk) r = IoResult::kError;
          server_nonce = std::move(ch.server_nonce);
        }
        if (r != IoResult::kOk) {
          refused = false;
          last_error = r == IoResult::kClosed ? "the server closed the connection before its challenge"
                       : r == IoResult::kTimeout
                           ? "no challenge from the server (is it an older Strata, or not a rendezvous store?)"
                           : "the server's challenge is malformed (is it a rendezvous store?)";
          ::close(fd);
          continue;
        }
        // HELLO: refusals here are final (a wrong token does not get better).
        Hello hello;
        hello.version = kProtocolVersion;
        hello.client_nonce = random_bytes(kNonceBytes);
        hello.client_proof = client_proof(token_, server_nonce, hello.client_nonce);
        const std::string& client_nonce = hello.client_nonce;
        const std::string frame = encode_hello(hello);
        r = send_all(fd, frame.data(), frame.size(), wake_fd_, deadline_ms);
        if (r == IoResult::kOk) r = recv_all(fd, hdr, 4, wake_fd_, deadline_ms);
        n = 0;
        body.clear();
        if (r == IoResult::kOk) {
          std::memcpy(&n, hdr, 4);
          if (n > kMaxHelloAnswerBytes + 16) r = IoResult::kError;
        }
        if (r == IoResult::kOk) {
          body.resize(n);
          r = recv_all(fd, body.data(), n, wake_fd_, deadline_ms);
        }
        if (r != IoResult::kOk) {
          refused = false;
          last_error = r == IoResult::kClosed ? "the server closed the connection during HELLO"
                                              : "no answer to HELLO";
          ::close(fd);
          continue;
        }
        HelloAnswer answer;
        const bool decoded = decode_hello_answer(body.data(), body.size(), &answer) == HelloVerdict::kOk;
        const HelloVerdict v =
            decoded ? check_hello_answer(answer, token_, server_nonce, client_nonce) : HelloVerdict::kMalformed;
        if (v != HelloVerdict::kOk) {
          ::close(fd);
          freeaddrinfo(res);
          if (v == HelloVerdict::kRefused && answer.status == STRATA_ERR_PERMISSION_DENIED) {
            *st = detail::set_error(
                err, STRATA_ERR_PERMISSION_DENIED,
                "the rendezvous store at " + address_ +
                    " refused this process: STRATA_AUTH_TOKEN differs from the chief's; start every "
                    "process with the same token (strata-run does this)");
          } else if (v == HelloVerdict::kNoServerToken || v == HelloVerdict::kBadServerProof) {
            *st = detail::set_error(
                err, STRATA_ERR_PERMISSION_DENIED,
                "the rendezvous store at " + address_ +
                    (v == HelloVerdict::kNoServerToken
                         ? std::string(" runs without STRATA_AUTH_TOKEN but this process has one")
                         : std::string(" could not prove it knows this process's STRATA_AUTH_TOKEN")) +
                    "; start every process with the same token (strata-run does this), and check that the "
                    "address is the chief's");
          } else {
            *st = detail::set_error(err, decoded ? answer.status : STRATA_ERR_DATA_LOSS,
                                    "the rendezvous store at " + address_ + " rejected HELLO: " +
                                        (decoded ? answer.data : std::string("malformed answer")));
          }
          return -1;
        }
        freeaddrinfo(res);
        return fd;
      }
      freeaddrinfo(res);
    }
    const int64_t left = deadline_ms - now_ms();
    if (left <= 0) break;
    // Sleep (interruptible by an abort) before retrying: the chief may not be up yet.
    pollfd pf{wake_fd_, POLLIN, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(backoff_ms, left)));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 500);
  }
  if (refused) {
    *st = detail::set_error(err, STRATA_ERR_DEADLINE_EXCEEDED,
                            "could not reach the rendezvous store: connection refused by " + address_ +
                                " until the rendezvous deadline passed (nothing listens there: is the chief "
                                "running, and is the address/port right?); start the chief task (it serves "
                                "the store) or fix the address, or raise /timeouts/rendezvous_s if the chief "
                                "starts late");
    return -1;
  }
  *st = detail::set_error(err, STRATA_ERR_DEADLINE_EXCEEDED,
                          "could not reach the rendezvous store at " + address_ +
                              " before the rendezvous deadline (last error: " + last_error +
                              "); start the chief task (it serves the store), check the address "
                              "and firewall, or raise /timeouts/rendezvous_s");
  return -1;
}

strata_status_t TcpStoreClient::io_error(const std::string& what, const std::string& cause,
                                         strata_error* err) {
  return detail::set_error(err, STRATA_ERR_UNAVAILABLE,
                           what + ": lost connection to the rendezvous store at " + address_ +
                               " (" + cause +
                               "); the chief process, which serves the store, may have exited");
}

strata_status_t TcpStoreClient::call(const std::string& frame, int64_t timeout_ms,
                                     const std::string& what, Response* resp, strata_error* err) {
  if (abort_ != nullptr && abort_->load())
    return detail::set_error(err, STRATA_ERR_ABORTED,
                             what + " aborted: the job was asked to stop (request_abort)");
  const int64_t deadline = now_ms() + timeout_ms + kGraceMs;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      fd = idle_.back();
      idle_.pop_back();
    }
  }
  if (fd < 0) {
    strata_status_t st = STRATA_OK;
    fd = open_connection(now_ms() + timeout_ms, err, &st);
    if (fd < 0) return st;
  }
  char hdr[4];
  IoResult r = send_all(fd, frame.data(), frame.size(), wake_fd_, deadline);
  if (r == IoResult::kOk) r = recv_all(fd, hdr, 4, wake_fd_, deadline);
  uint32_t n = 0;
  std::string body;
  if (r == IoResult::kOk) {
    std::memcpy(&n, hdr, 4);
    if (n < 16 || n > kMaxFrameBytes) {
      ::close(fd);
      return detail::set_error(err, STRATA_ERR_DATA_LOSS,
                               what + ": malformed answer from the rendezvous store at " +
                                   address_ + " (frame of " + std::to_string(n) + " bytes)");
    }
    body.resize(n);
    r = recv_all(fd, body.data(), n, wake_fd_, deadline);
  }
  if (r != IoResult::kOk) {
    const int saved = errno;
    ::close(fd);
    switch (r) {
      case IoResult::kAborted:
        return detail::set_error(err, STRATA_ERR_ABORTED,
                                 what + " aborted: the job was asked to stop (request_abort)");
      case IoResult::kTimeout:
        return detail::set_error(err, STRATA_ERR_DEADLINE_EXCEEDED,
                                 what + ": the rendezvous store at " + address_ +
                                     " did not answer within " + std::to_string(timeout_ms + kGraceMs) +
                                     " ms; check that the chief process is alive");
      case IoResult::kClosed:
        return io_error(what, "connection closed by the server", err);
      default:
        return io_error(what, std::strerror(saved), err);
    }
  }
  Reader rd(body.data(), body.size());
  resp->status = rd.i32();
  resp->number = rd.i64();
  resp->data = rd.str(kMaxValueBytes);
  if (!rd.ok() || !rd.at_end()) {
    ::close(fd);
    return detail::set_error(err, STRATA_ERR_DATA_LOSS,
                             what + ": malformed answer from the rendezvous store at " + address_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(fd);
  }
  if (resp->status != STRATA_OK) return detail::set_error(err, resp->status, resp->data);
  return STRATA_OK;
}

namespace {
strata_status_t check_key(const std::string& what, const std::string& key, strata_error* err) {
  if (key.size() > kMaxKeyBytes)
    return detail::set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                             what + ": key is " + std::to_string(key.size()) +
                                 " bytes; the rendezvous store accepts keys up to " +
                                 std::to_string(kMaxKeyBytes) + " bytes");
  return STRATA_OK;
}
}  // namespace

strata_status_t TcpStoreClient::set(const std::string& key, std::string value, int64_t timeout_ms,
                                    strata_error* err) {
  const std::string what = "store_set('" + key + "')";
  if (strata_status_t st = check_key(what, key, err)) return st;
  if (value.size() > kMaxValueBytes)
    return detail::set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                             what + ": value is " + std::to_string(value.size()) +
                                 " bytes; the rendezvous store accepts values up to " +
                                 std::to_string(kMaxValueBytes) +
                                 " bytes (it is for addresses and small metadata; send bulk data "
                                 "through a transport)");
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kSet)).str(key).str(value);
  Response resp;
  return call(w.finish(), timeout_ms, what, &resp, err);
}

strata_status_t TcpStoreClient::get(const std::string& key, int64_t timeout_ms, std::string* out,
                                    strata_error* err) {
  const std::string what = "store_get('" + key + "')";
  if (strata_status_t st = check_key(what, key, err)) return st;
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kGet)).str(key).i64(timeout_ms);
  Response resp;
  const strata_status_t st = call(w.finish(), timeout_ms, what, &resp, err);
  if (st == STRATA_OK) *out = std::move(resp.data);
  return st;
}

strata_status_t TcpStoreClient::add(const std::string& key, int64_t delta, int64_t* result,
                                    int64_t timeout_ms, strata_error* err) {
  const std::string what = "store_add('" + key + "')";
  if (strata_status_t st = check_key(what, key, err)) return st;
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kAdd)).str(key).i64(delta);
  Response resp;
  const strata_status_t st = call(w.finish(), timeout_ms, what, &resp, err);
  if (st == STRATA_OK && result != nullptr) *result = resp.number;
  return st;
}

strata_status_t TcpStoreClient::wait(const std::vector<std::string>& keys, int64_t timeout_ms,
                                     strata_error* err) {
  if (keys.size() > kMaxWaitKeys)
    return detail::set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                             "store_wait: " + std::to_string(keys.size()) +
                                 " keys; the rendezvous store waits for at most " +
                                 std::to_string(kMaxWaitKeys) + " keys per call");
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kWait)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    if (strata_status_t st = check_key("store_wait", k, err)) return st;
    w.str(k);
  }
  w.i64(timeout_ms);
  Response resp;
  return call(w.finish(), timeout_ms, "store_wait", &resp, err);
}

}  // namespace strata::store
