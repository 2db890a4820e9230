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

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
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

enum class IoResult { kOk, kTimeout, kAborted, kError, kClosed, kTlsError };

using TcpStoreClientConn = TcpStoreClient::Conn;

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

// A socket BIO that sends with MSG_NOSIGNAL: OpenSSL's own (SSL_set_fd)
// write()s, and a peer that closed would raise SIGPIPE in the user's process.
int bio_write(BIO* b, const char* p, int n) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t k = ::send(fd, p, static_cast<size_t>(n), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) return static_cast<int>(k);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return -1;
  }
}

int bio_read(BIO* b, char* p, int n) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t k = ::recv(fd, p, static_cast<size_t>(n), MSG_DONTWAIT);
    if (k >= 0) return static_cast<int>(k);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return -1;
  }
}

long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

BIO* socket_bio(int fd) {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "strata store socket");
    if (m != nullptr) {
      BIO_meth_set_write(m, bio_write);
      BIO_meth_set_read(m, bio_read);
      BIO_meth_set_ctrl(m, bio_ctrl);
    }
    return m;
  }();
  BIO* b = method != nullptr ? BIO_new(method) : nullptr;
  if (b == nullptr) return nullptr;
  BIO_set_data(b, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO_set_init(b, 1);
  return b;
}

// After an SSL call returned `ret` <= 0: wait for what it wants (with the
// same deadline and abort eventfd as plain sockets), or classify the failure.
IoResult ssl_wait(TcpStoreClientConn* c, int ret, int wake_fd, int64_t deadline_ms) {
  const int e = SSL_get_error(c->ssl, ret);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      return wait_fd(c->fd, POLLIN, wake_fd, deadline_ms);
    case SSL_ERROR_WANT_WRITE:
      return wait_fd(c->fd, POLLOUT, wake_fd, deadline_ms);
    case SSL_ERROR_ZERO_RETURN:
      return IoResult::kClosed;
    case SSL_ERROR_SYSCALL:
      if (errno == 0 || errno == ECONNRESET || errno == EPIPE) return IoResult::kClosed;
      return IoResult::kError;
    default:
      c->tls_error = openssl_errors();
      if (c->tls_error.empty()) c->tls_error = "SSL error " + std::to_string(e);
      return IoResult::kTlsError;
  }
}

// All `n` bytes through TLS: SSL_write when `writing`, else SSL_read (the
// buffer is then written to), waiting with the plain sockets' deadline.
IoResult ssl_all(TcpStoreClientConn* c, char* p, size_t n, bool writing, int wake_fd, int64_t deadline_ms) {
  while (n > 0) {
    ERR_clear_error();
    errno = 0;
    const int len = static_cast<int>(std::min<size_t>(n, 1u << 30));
    const int k = writing ? SSL_write(c->ssl, p, len) : SSL_read(c->ssl, p, len);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    const IoResult r = ssl_wait(c, k, wake_fd, deadline_ms);
    if (r != IoResult::kOk) return r;
  }
  return IoResult::kOk;
}

IoResult send_all(TcpStoreClientConn* c, const char* p, size_t n, int wake_fd, int64_t deadline_ms) {
  if (c->ssl != nullptr) return ssl_all(c, const_cast<char*>(p), n, true, wake_fd, deadline_ms);
  while (n > 0) {
    const ssize_t k = ::send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoResult r = wait_fd(c->fd, POLLOUT, wake_fd, deadline_ms);
      if (r != IoResult::kOk) return r;
      continue;
    }
    return IoResult::kError;
  }
  return IoResult::kOk;
}

IoResult recv_all(TcpStoreClientConn* c, char* p, size_t n, int wake_fd, int64_t deadline_ms) {
  if (c->ssl != nullptr) return ssl_all(c, p, n, false, wake_fd, deadline_ms);
  while (n > 0) {
    const ssize_t k = ::recv(c->fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoResult r = wait_fd(c->fd, POLLIN, wake_fd, deadline_ms);
      if (r != IoResult::kOk) return r;
      continue;
    }
    return IoResult::kError;
  }
  return IoResult::kOk;
}

// One frame: u32 length (at most `max`), then the body.
IoResult recv_frame(TcpStoreClientConn* c, std::string* body, uint32_t max, int wake_fd, int64_t deadline_ms) {
  char hdr[4];
  IoResult r = recv_all(c, hdr, 4, wake_fd, deadline_ms);
  if (r != IoResult::kOk) return r;
  uint32_t n = 0;
  std::memcpy(&n, hdr, 4);
  if (n > max) return IoResult::kError;
  body->resize(n);
  return recv_all(c, body->data(), n, wake_fd, deadline_ms);
}

}  // namespace

TcpStoreClient::TcpStoreClient(std::string address, std::string token, int64_t connect_timeout_ms,
                               const std::atomic<bool>* abort_flag, const TlsConfig& tls)
    : address_(std::move(address)), token_(std::move(token)), abort_(abort_flag), tls_(tls) {
  if (!split_host_port(address_, &host_, &port_) || port_ == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store address '", address_,
                 "' is not host:port with a non-zero port; use e.g. \"10.0.0.1:29400\"");
  if (tls_.enabled()) tls_ctx_ = make_client_tls(tls_);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    const int e = errno;
    if (tls_ctx_ != nullptr) SSL_CTX_free(tls_ctx_);
    STRATA_THROW(STRATA_ERR_INTERNAL, "rendezvous store client: eventfd failed: ", std::strerror(e));
  }
  strata_error err;
  strata_error_init(&err);
  strata_status_t st = STRATA_OK;
  Conn conn;
  if (!open_connection(now_ms() + connect_timeout_ms, &conn, &err, &st)) {
    ::close(wake_fd_);
    if (tls_ctx_ != nullptr) SSL_CTX_free(tls_ctx_);
    detail::throw_status(st, err.message);
  }
  idle_.push_back(std::move(conn));
}

TcpStoreClient::~TcpStoreClient() {
  for (Conn& c : idle_) close_conn(&c);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (tls_ctx_ != nullptr) SSL_CTX_free(tls_ctx_);
}

void TcpStoreClient::close_conn(Conn* c) {
  if (c->ssl != nullptr) SSL_free(c->ssl);
  c->ssl = nullptr;
  if (c->fd >= 0) ::close(c->fd);
  c->fd = -1;
}

void TcpStoreClient::notify_all() {
  if (abort_ != nullptr && abort_->load()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }
}

int TcpStoreClient::handshake(Conn* c, int64_t deadline_ms, std::string* last_error, strata_error* err,
                              strata_status_t* st) {
  // The server speaks first (store_protocol.h), and its TLS handshake and
  // challenge must come within the HELLO deadline: a server that says
  // nothing by then is not a Strata 2 store.
  const int64_t hello_deadline = std::min<int64_t>(deadline_ms, now_ms() + kHelloTimeoutMs);
  std::string body;
  IoResult r = recv_frame(c, &body, kMaxHelloFrameBytes, wake_fd_, hello_deadline);
  Challenge ch;
  HelloVerdict v = r == IoResult::kOk ? decode_challenge(body.data(), body.size(), &ch) : HelloVerdict::kMalformed;
  if (r == IoResult::kOk && v == HelloVerdict::kTlsRequired && tls_ctx_ == nullptr) {
    *st = detail::set_error(err, STRATA_ERR_FAILED_PRECONDITION,
                            "the rendezvous store at " + address_ +
                                " speaks TLS but this process does not; set /rendezvous/tls in the job config "
                                "like the chief's ({\"ca\": \"ca.pem\"} to verify the store, with \"cert\" and "
                                "\"key\" when the chief requires client certificates), or STRATA_TLS_CA, "
                                "STRATA_TLS_CERT and STRATA_TLS_KEY");
    return -1;
  }
  if (r == IoResult::kOk && v != HelloVerdict::kTlsRequired && v != HelloVerdict::kMalformed &&
      tls_ctx_ != nullptr) {
    // Refusing here is what keeps a stranger from downgrading us to plain TCP.
    *st = detail::set_error(err, STRATA_ERR_FAILED_PRECONDITION,
                            "the rendezvous store at " + address_ +
                                " does not speak TLS but this process has TLS set (" + kTlsConfigHint +
                                "); set the same /rendezvous/tls on the chief (it needs \"cert\" and \"key\"), "
                                "or remove it from this process");
    return -1;
  }
  if (r == IoResult::kOk && v == HelloVerdict::kTlsRequired) {
    c->ssl = SSL_new(tls_ctx_);
    BIO* bio = c->ssl != nullptr ? socket_bio(c->fd) : nullptr;
    if (bio == nullptr) {
      *st = detail::set_error(err, STRATA_ERR_INTERNAL,
                              "rendezvous store TLS: cannot create an OpenSSL session (" + openssl_errors() + ")");
      return -1;
    }
    SSL_set_bio(c->ssl, bio, bio);
    for (;;) {
      ERR_clear_error();
      errno = 0;
      const int k = SSL_connect(c->ssl);
      if (k == 1) break;
      r = ssl_wait(c, k, wake_fd_, hello_deadline);
      if (r != IoResult::kOk) break;
    }
    if (r == IoResult::kOk) r = recv_frame(c, &body, kMaxHelloFrameBytes, wake_fd_, hello_deadline);
    if (r == IoResult::kTlsError) {
      const long verify = SSL_get_verify_result(c->ssl);
      if (verify != X509_V_OK) {
        *st = detail::set_error(
            err, STRATA_ERR_PERMISSION_DENIED,
            "TLS: the certificate of the rendezvous store at " + address_ + " does not verify against " +
                (tls_.ca.empty() ? std::string("the system's trust store") : "the CA '" + tls_.ca + "'") +
                " (OpenSSL: " + X509_verify_cert_error_string(verify) + "; " + c->tls_error +
                "); give every process the CA that signed the chief's certificate (/rendezvous/tls/ca or "
                "STRATA_TLS_CA), and check that the address is the chief's");
      } else {
        *st = detail::set_error(
            err, STRATA_ERR_PERMISSION_DENIED,
            "TLS: the rendezvous store at " + address_ + " refused the TLS connection (OpenSSL: " + c->tls_error +
                ")" +
                (tls_.cert.empty()
                     ? std::string("; it may require a client certificate (mutual TLS, \"ca\" set on the chief): "
                                   "set /rendezvous/tls/cert and key (or STRATA_TLS_CERT and STRATA_TLS_KEY) "
                                   "to a certificate signed by the chief's CA")
                     : std::string("; check that this process's certificate '" + tls_.cert +
                                   "' is signed by the CA the chief has in /rendezvous/tls/ca")));
      }
      return -1;
    }
    v = r == IoResult::kOk ? decode_challenge(body.data(), body.size(), &ch) : HelloVerdict::kMalformed;
  }
  if (r == IoResult::kOk && v == HelloVerdict::kVersionMismatch) {
    *st = detail::set_error(err, STRATA_ERR_ABI_MISMATCH,
                            "the rendezvous store at " + address_ + " speaks protocol version " +
                                std::to_string(ch.version) + " but this process speaks " +
                                std::to_string(kProtocolVersion) + "; run the same Strata version in every process");
    return -1;
  }
  if (r != IoResult::kOk || v != HelloVerdict::kOk) {
    *last_error = r == IoResult::kClosed ? "the server closed the connection before its challenge"
                  : r == IoResult::kTimeout
                      ? std::string("no ") + (c->ssl != nullptr ? "TLS handshake or " : "") +
                            "challenge from the server (is it an older Strata, or not a rendezvous store?)"
                  : r == IoResult::kAborted ? "aborted"
                                            : "the server's challenge is malformed (is it a rendezvous store?)";
    return 1;
  }
  const std::string server_nonce = std::move(ch.server_nonce);
  // HELLO: refusals here are final (a wrong token does not get better).
  Hello hello;
  hello.version = kProtocolVersion;
  hello.client_nonce = random_bytes(kNonceBytes);
  hello.client_proof = client_proof(token_, server_nonce, hello.client_nonce);
  const std::string frame = encode_hello(hello);
  r = send_all(c, frame.data(), frame.size(), wake_fd_, deadline_ms);
  if (r == IoResult::kOk) r = recv_frame(c, &body, kMaxHelloAnswerBytes + 16, wake_fd_, deadline_ms);
  if (r != IoResult::kOk) {
    *last_error = r == IoResult::kClosed ? "the server closed the connection during HELLO"
                  : r == IoResult::kTlsError ? "TLS error during HELLO: " + c->tls_error
                                             : "no answer to HELLO";
    return 1;
  }
  HelloAnswer answer;
  const bool decoded = decode_hello_answer(body.data(), body.size(), &answer) == HelloVerdict::kOk;
  v = decoded ? check_hello_answer(answer, token_, server_nonce, hello.client_nonce) : HelloVerdict::kMalformed;
  if (v == HelloVerdict::kOk) return 0;
  if (v == HelloVerdict::kRefused && answer.status == STRATA_ERR_PERMISSION_DENIED) {
    *st = detail::set_error(err, STRATA_ERR_PERMISSION_DENIED,
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

bool TcpStoreClient::open_connection(int64_t deadline_ms, Conn* conn, strata_error* err, strata_status_t* st) {
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
      return false;
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
        Conn c;
        c.fd = fd;
        const int h = handshake(&c, deadline_ms, &last_error, err, st);
        if (h == 0) {
          freeaddrinfo(res);
          *conn = std::move(c);
          return true;
        }
        close_conn(&c);
        if (h < 0) {
          freeaddrinfo(res);
          return false;
        }
        refused = false;
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
    return false;
  }
  *st = detail::set_error(err, STRATA_ERR_DEADLINE_EXCEEDED,
                          "could not reach the rendezvous store at " + address_ +
                              " before the rendezvous deadline (last error: " + last_error +
                              "); start the chief task (it serves the store), check the address "
                              "and firewall, or raise /timeouts/rendezvous_s");
  return false;
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
  Conn c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (c.fd < 0) {
    strata_status_t st = STRATA_OK;
    if (!open_connection(now_ms() + timeout_ms, &c, err, &st)) return st;
  }
  char hdr[4];
  IoResult r = send_all(&c, frame.data(), frame.size(), wake_fd_, deadline);
  if (r == IoResult::kOk) r = recv_all(&c, hdr, 4, wake_fd_, deadline);
  uint32_t n = 0;
  std::string body;
  if (r == IoResult::kOk) {
    std::memcpy(&n, hdr, 4);
    if (n < 16 || n > kMaxFrameBytes) {
      close_conn(&c);
      return detail::set_error(err, STRATA_ERR_DATA_LOSS,
                               what + ": malformed answer from the rendezvous store at " +
                                   address_ + " (frame of " + std::to_string(n) + " bytes)");
    }
    body.resize(n);
    r = recv_all(&c, body.data(), n, wake_fd_, deadline);
  }
  if (r != IoResult::kOk) {
    const int saved = errno;
    const std::string tls_error = c.tls_error;
    close_conn(&c);
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
      case IoResult::kTlsError:
        return io_error(what, "TLS error: " + tls_error, err);
      default:
        return io_error(what, std::strerror(saved), err);
    }
  }
  Reader rd(body.data(), body.size());
  resp->status = rd.i32();
  resp->number = rd.i64();
  resp->data = rd.str(kMaxValueBytes);
  if (!rd.ok() || !rd.at_end()) {
    close_conn(&c);
    return detail::set_error(err, STRATA_ERR_DATA_LOSS,
                             what + ": malformed answer from the rendezvous store at " + address_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(c));
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
