// SPDX-License-Identifier: Apache-2.0
#include "store/store_server.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <list>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "log.h"
#include "store/store_protocol.h"
#include "strata/error.hpp"

namespace strata::store {

namespace asio = boost::asio;
using asio::ip::tcp;

// sdk::refused_connections_key(): rendezvous errors name refused processes.
constexpr const char* kRefusedKey = "strata/store/refused";

namespace {

class Session;

struct Waiter {
  std::shared_ptr<Session> session;
  std::vector<std::string> keys;
  bool is_get = false;
  int64_t timeout_ms = 0;
  std::unique_ptr<asio::steady_timer> timer;
  bool done = false;
  std::string filed_under;  // the key it waits on in Impl::waiting
};

}  // namespace

struct StoreServer::Impl {
  // Declared first so that it outlives the sessions still queued in io.
  std::unique_ptr<asio::ssl::context> tls;  // null: plain TCP
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::string token;
  uint16_t port = 0;
  std::thread thread;
  // Everything below is touched only by the io thread.
  std::unordered_map<std::string, std::string> data;
  // Pending GETs and WAITs, each filed under one key it still lacks: a set
  // or add of key k looks only at the waiters filed under k (a WAIT on
  // several keys moves to its next missing key), so a rendezvous of n ranks
  // costs O(1) per set instead of a scan of every waiter.
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiting;
  void file(const std::shared_ptr<Waiter>& w, const std::string& key) {
    w->filed_under = key;
    waiting[key].push_back(w);
  }
  std::list<std::weak_ptr<Session>> sessions;
  // Connections that have not passed HELLO yet, oldest first.
  std::list<std::weak_ptr<Session>> unauthenticated;
  // Rate limit for the log lines about refused connections.
  std::chrono::steady_clock::time_point log_window{};
  int logged_in_window = 0;
  int64_t suppressed = 0;

  /// Log a refused connection (at most 20 lines per 10 s, then a count) and
  /// record it under sdk's refused-connections key for rendezvous errors.
  void note_refused(const std::string& peer, const std::string& why);

  void accept();
  /// Wake the waiters filed under `key`, which was just set.
  void wake_waiters(const std::string& key);
  /// The first of w's keys that is not set, or null when all are.
  const std::string* first_missing(const Waiter& w) const {
    for (const auto& k : w.keys)
      if (!data.count(k)) return &k;
    return nullptr;
  }
  bool satisfied(const Waiter& w) const { return first_missing(w) == nullptr; }
  void finish_waiter(const std::shared_ptr<Waiter>& w, bool timed_out);
};

namespace {

std::string response(int32_t status, int64_t number, const std::string& data) {
  Writer w;
  w.i32(status).i64(number).str(data);
  return std::move(w.finish());
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, StoreServer::Impl* server)
      : socket_(std::move(socket)), server_(server) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("<unknown>") : join_host_port(ep.address().to_string(), ep.port());
    if (server_->tls) tls_.emplace(std::move(socket_), *server_->tls);
  }
  /// Arm the HELLO deadline (it covers the TLS handshake too), send the
  /// challenge (with TLS: the preamble, the handshake, then the challenge
  /// inside TLS), then read requests.
  void start() {
    nonce_ = random_bytes(kNonceBytes);
    auto self = shared_from_this();
    hello_timer_ = std::make_unique<asio::steady_timer>(server_->io);
    hello_timer_->expires_after(std::chrono::milliseconds(kHelloTimeoutMs));
    hello_timer_->async_wait([self](boost::system::error_code ec) {
      if (ec || self->hello_done_ || !self->is_open()) return;
      self->reject(std::string("no valid ") + (self->tls_ && !self->tls_done_ ? "TLS handshake" : "HELLO") +
                   " within " + std::to_string(kHelloTimeoutMs / 1000) + " s");
    });
    if (!tls_) return respond(encode_challenge(nonce_));
    out_ = encode_tls_preamble();
    asio::async_write(tls_->next_layer(), asio::buffer(out_), [self](boost::system::error_code ec, size_t) {
      if (ec) return self->close();
      self->tls_->async_handshake(asio::ssl::stream_base::server, [self](boost::system::error_code ec2) {
        if (!self->is_open()) return;
        if (ec2) return self->reject("TLS handshake failed: " + tls_reason(ec2));
        self->tls_done_ = true;
        self->respond(encode_challenge(self->nonce_));
      });
    });
  }
  void close() {
    boost::system::error_code ec;
    lowest().close(ec);
    if (hello_timer_) hello_timer_->cancel();
  }
  bool authenticated() const { return hello_done_; }
  bool is_open() const { return tls_ ? tls_->next_layer().is_open() : socket_.is_open(); }
  /// Drop a connection that never authenticated, to make room for a new one.
  void evict() { reject("dropped for a newer connection: more than " + std::to_string(kMaxUnauthenticated) +
                        " connections were waiting to authenticate"); }
  /// Send one response, then read the next request.
  void respond(std::string bytes) {
    out_ = std::move(bytes);
    auto self = shared_from_this();
    with_stream([&](auto& stream) {
      asio::async_write(stream, asio::buffer(out_), [self](boost::system::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_header();
      });
    });
  }
  const std::string& peer() const { return peer_; }

 private:
  // Run `f` on the stream requests travel on: the TLS stream or the socket.
  template <class F>
  void with_stream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(socket_);
    }
  }
  tcp::socket& lowest() { return tls_ ? tls_->next_layer() : socket_; }

  static std::string tls_reason(const boost::system::error_code& ec) {
    std::string why = ec.message();
    if (ec.category() == asio::error::get_ssl_category()) {
      // The library's reason is the useful part (e.g. "peer did not return a
      // certificate", "tlsv1 alert unknown ca").
      const std::string more = openssl_errors();
      if (!more.empty() && more.find(why) == std::string::npos) why += " (" + more + ")";
    }
    return why;
  }

  void read_header() {
    auto self = shared_from_this();
    with_stream([&](auto& stream) {
      asio::async_read(stream, asio::buffer(len_buf_), [self](boost::system::error_code ec, size_t) {
        self->on_header(ec);
      });
    });
  }

  void on_header(boost::system::error_code ec) {
    if (ec) return close();
    uint32_t n = 0;
    std::memcpy(&n, len_buf_.data(), 4);
    // A TLS record (handshake 0x16, version 3.x) where a frame length
    // belongs: a client set up for TLS, which this store does not speak.
    if (!hello_done_ && !tls_ && len_buf_[0] == 0x16 && len_buf_[1] == 0x03)
      return reject("the client started a TLS handshake but this store does not speak TLS; set the same "
                    "/rendezvous/tls on the chief as on the workers, or remove it everywhere");
    // Until HELLO passes, only a HELLO-sized frame: a stranger's length
    // prefix must not make the chief allocate anything sizeable.
    const uint32_t max = hello_done_ ? kMaxFrameBytes : kMaxHelloFrameBytes;
    if (n == 0 || n > max)
      return reject("frame length " + std::to_string(n) + " is outside 1.." + std::to_string(max) + " bytes" +
                    (hello_done_ ? "" : " (before authentication)"));
    body_.resize(n);
    auto self = shared_from_this();
    with_stream([&](auto& stream) {
      asio::async_read(stream, asio::buffer(body_), [self](boost::system::error_code ec2, size_t) {
        if (ec2) return self->close();
        self->handle();
      });
    });
  }

  void reject(const std::string& why) {
    if (!hello_done_) {
      server_->note_refused(peer_, why);
    } else {
      detail::logger("store")->warn(
          "closing store connection from {}: {} (is something other than a Strata process "
          "connecting to the rendezvous port?)",
          peer_, why);
    }
    close();
  }

  void handle() {
    Reader r(body_.data(), body_.size());
    const auto op = static_cast<Op>(r.u8());
    if (!hello_done_ && op != Op::kHello) return reject("the first request was not HELLO");
    switch (op) {
      case Op::kHello: {
        if (hello_done_) return reject("a second HELLO");
        Hello hello;
        const HelloVerdict v = decode_hello(body_.data(), body_.size(), &hello);
        if (v == HelloVerdict::kVersionMismatch) {
          server_->note_refused(peer_, "protocol version " + std::to_string(hello.version));
          return answer_and_close(response(STRATA_ERR_ABI_MISMATCH, 0,
                                           "the rendezvous store speaks protocol version " +
                                               std::to_string(kProtocolVersion) + " but this process speaks " +
                                               std::to_string(hello.version) +
                                               "; run the same Strata version in every process"));
        }
        if (v != HelloVerdict::kOk) return reject("malformed HELLO");
        if (check_hello(hello, server_->token, nonce_) != HelloVerdict::kOk) {
          server_->note_refused(peer_, "wrong auth token");
          // Answer, then drop: the client reports PERMISSION_DENIED.
          return answer_and_close(response(STRATA_ERR_PERMISSION_DENIED, 0, "wrong auth token"));
        }
        hello_done_ = true;
        if (hello_timer_) hello_timer_->cancel();
        return respond(response(STRATA_OK, 0,
                                server_->token.empty() ? std::string()
                                                       : server_proof(server_->token, nonce_, hello.client_nonce)));
      }
      case Op::kSet: {
        std::string key = r.str(kMaxKeyBytes);
        std::string value = r.str(kMaxValueBytes);
        if (!r.ok() || !r.at_end()) return reject("malformed SET");
        server_->data[key] = std::move(value);
        server_->wake_waiters(key);
        return respond(response(STRATA_OK, 0, ""));
      }
      case Op::kAdd: {
        std::string key = r.str(kMaxKeyBytes);
        const int64_t delta = r.i64();
        if (!r.ok() || !r.at_end()) return reject("malformed ADD");
        int64_t value = 0;
        auto it = server_->data.find(key);
        if (it != server_->data.end()) {
          const std::string& s = it->second;
          char* end = nullptr;
          const long long v = std::strtoll(s.c_str(), &end, 10);
          if (s.empty() || end != s.c_str() + s.size())
            return respond(response(STRATA_ERR_INVALID_ARGUMENT, 0,
                                    "store_add('" + key +
                                        "'): the stored value is not an integer (it was set with "
                                        "store_set); use a separate key for counters"));
          value = v;
        }
        value += delta;
        server_->data[key] = std::to_string(value);
        server_->wake_waiters(key);
        return respond(response(STRATA_OK, value, ""));
      }
      case Op::kGet:
      case Op::kWait: {
        auto w = std::make_shared<Waiter>();
        w->is_get = op == Op::kGet;
        if (w->is_get) {
          w->keys.push_back(r.str(kMaxKeyBytes));
        } else {
          const uint32_t n = r.u32();
          if (!r.ok() || n > kMaxWaitKeys) return reject("malformed WAIT");
          for (uint32_t i = 0; i < n && r.ok(); ++i) w->keys.push_back(r.str(kMaxKeyBytes));
        }
        w->timeout_ms = r.i64();
        if (!r.ok() || !r.at_end() || w->timeout_ms < 0)
          return reject(w->is_get ? "malformed GET" : "malformed WAIT");
        w->session = shared_from_this();
        const std::string* missing = server_->first_missing(*w);
        if (!missing) return server_->finish_waiter(w, false);
        w->timer = std::make_unique<asio::steady_timer>(server_->io);
        w->timer->expires_after(std::chrono::milliseconds(w->timeout_ms));
        server_->file(w, *missing);
        StoreServer::Impl* srv = server_;
        std::weak_ptr<Waiter> weak = w;
        w->timer->async_wait([srv, weak](boost::system::error_code ec) {
          if (ec) return;
          if (auto ww = weak.lock()) srv->finish_waiter(ww, true);
        });
        return;
      }
    }
    reject("unknown request op " + std::to_string(static_cast<int>(op)));
  }

  void answer_and_close(std::string bytes) {
    out_ = std::move(bytes);
    auto self = shared_from_this();
    with_stream([&](auto& stream) {
      asio::async_write(stream, asio::buffer(out_), [self](boost::system::error_code, size_t) { self->close(); });
    });
  }

  tcp::socket socket_;  // moved into tls_ when the store speaks TLS
  std::optional<asio::ssl::stream<tcp::socket>> tls_;
  bool tls_done_ = false;
  StoreServer::Impl* server_;
  std::string peer_;
  std::string nonce_;
  std::unique_ptr<asio::steady_timer> hello_timer_;
  std::array<char, 4> len_buf_{};
  std::vector<char> body_;
  std::string out_;
  bool hello_done_ = false;
};

}  // namespace

void StoreServer::Impl::finish_waiter(const std::shared_ptr<Waiter>& w, bool timed_out) {
  if (w->done) return;
  w->done = true;
  if (w->timer) w->timer->cancel();
  if (timed_out) {  // a woken waiter was already taken out of `waiting`
    auto it = waiting.find(w->filed_under);
    if (it != waiting.end()) {
      auto& v = it->second;
      v.erase(std::remove(v.begin(), v.end(), w), v.end());
      if (it->second.empty()) waiting.erase(it);
    }
  }
  auto session = std::move(w->session);
  if (!timed_out) {
    const std::string value = w->is_get ? data[w->keys[0]] : std::string();
    return session->respond(response(STRATA_OK, 0, value));
  }
  std::string msg;
  if (w->is_get) {
    msg = "store_get('" + w->keys[0] + "'): key was never set; timed out after " +
          std::to_string(w->timeout_ms) +
          " ms; check that every rank reached this rendezvous, or raise /timeouts/rendezvous_s";
  } else {
    std::string missing;
    for (const auto& k : w->keys)
      if (!data.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
    msg = "store_wait timed out after " + std::to_string(w->timeout_ms) +
          " ms; keys never set: " + missing +
          "; check that every rank reached this rendezvous, or raise /timeouts/rendezvous_s";
  }
  session->respond(response(STRATA_ERR_DEADLINE_EXCEEDED, 0, msg));
}

void StoreServer::Impl::note_refused(const std::string& peer, const std::string& why) {
  const auto now = std::chrono::steady_clock::now();
  if (now - log_window > std::chrono::seconds(10)) {
    if (suppressed > 0)
      detail::logger("store")->warn("refused {} more store connection(s) in the last 10 s (not logged one by one)",
                                    suppressed);
    log_window = now;
    logged_in_window = 0;
    suppressed = 0;
  }
  if (++logged_in_window <= 20) {
    detail::logger("store")->warn(
        "refused store connection from {}: {} (a Strata process with another STRATA_AUTH_TOKEN or version, or "
        "something else connecting to the rendezvous port)",
        peer, why);
  } else {
    ++suppressed;
  }
  // Keep the last 16 for rendezvous errors (sdk::refused_connections_text).
  std::string& list = data[kRefusedKey];
  list += peer + " (" + why + ")\n";
  size_t lines = 0;
  for (char c : list) lines += c == '\n' ? 1 : 0;
  while (lines-- > 16) list.erase(0, list.find('\n') + 1);
}

void StoreServer::Impl::wake_waiters(const std::string& key) {
  auto it = waiting.find(key);
  if (it == waiting.end()) return;
  std::vector<std::shared_ptr<Waiter>> filed = std::move(it->second);
  waiting.erase(it);
  for (const auto& w : filed) {
    if (w->done) continue;
    if (const std::string* missing = first_missing(*w))
      file(w, *missing);
    else
      finish_waiter(w, false);
  }
}

void StoreServer::Impl::accept() {
  Impl* self = this;
  acceptor.async_accept([self](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
    if (!ec) {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto s = std::make_shared<Session>(std::move(socket), self);
      self->sessions.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
      self->sessions.push_back(s);
      self->unauthenticated.remove_if([](const std::weak_ptr<Session>& w) {
        auto p = w.lock();
        return !p || p->authenticated() || !p->is_open();
      });
      if (self->unauthenticated.size() >= kMaxUnauthenticated) {
        if (auto oldest = self->unauthenticated.front().lock()) oldest->evict();
        self->unauthenticated.pop_front();
      }
      self->unauthenticated.push_back(s);
      s->start();
    } else {
      detail::logger("store")->warn("rendezvous store accept failed: {}", ec.message());
    }
    self->accept();
  });
}

StoreServer::StoreServer(const std::string& host, uint16_t port, std::string auth_token, const TlsConfig& tls)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(auth_token);
  if (tls.enabled()) {
    impl_->tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    configure_server_tls(impl_->tls->native_handle(), tls);
  }
  impl_->data[kRefusedKey] = "";
  boost::system::error_code ec;
  asio::ip::address addr;
  if (host.empty()) {
    addr = asio::ip::address_v6::any();
  } else {
    addr = asio::ip::make_address(host, ec);
    if (ec) {
      tcp::resolver resolver(impl_->io);
      auto results = resolver.resolve(host, std::to_string(port), ec);
      if (ec || results.empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "rendezvous store: cannot resolve host '", host,
                     "' (", ec.message(), "); use an IP address or a resolvable host name");
      addr = results.begin()->endpoint().address();
    }
  }
  const tcp::endpoint ep(addr, port);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec && addr.is_v6() && addr.to_v6().is_unspecified())
    impl_->acceptor.set_option(asio::ip::v6_only(false), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (ec == asio::error::address_in_use)
    STRATA_THROW(STRATA_ERR_ALREADY_EXISTS, "rendezvous store: port ", port, " on ",
                 addr.to_string(),
                 " is already in use; stop the process holding it, or give the chief another port "
                 "in the cluster spec (strata-run picks a free one)");
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, "rendezvous store: cannot listen on ",
                 join_host_port(addr.to_string(), port), ": ", ec.message(),
                 "; check the chief's address in the cluster spec");
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept();
  Impl* impl = impl_.get();
  impl_->thread = std::thread([impl] {
    try {
      impl->io.run();
    } catch (const std::exception& e) {
      detail::logger("store")->error("rendezvous store server stopped: {}", e.what());
    }
  });
  detail::logger("store")->info("rendezvous store serving on {}{}", join_host_port(addr.to_string(), impl_->port),
                                impl_->tls ? " (TLS)" : "");
}

StoreServer::~StoreServer() {
  Impl* impl = impl_.get();
  asio::post(impl->io, [impl] {
    boost::system::error_code ec;
    impl->acceptor.close(ec);
    for (auto& w : impl->sessions)
      if (auto s = w.lock()) s->close();
    for (auto& [key, filed] : impl->waiting)
      for (auto& w : filed)
        if (w->timer) w->timer->cancel();
    impl->waiting.clear();
    impl->io.stop();
  });
  if (impl->thread.joinable()) impl->thread.join();
  // Handlers still queued in io (holding Sessions) are destroyed with impl_;
  // they never run again, so their raw Impl pointers are not used.
  impl->waiting.clear();
  impl->sessions.clear();
}

uint16_t StoreServer::port() const { return impl_->port; }

}  // namespace strata::store
