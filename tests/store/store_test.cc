// SPDX-License-Identifier: Apache-2.0
// Tests of the TCP rendezvous store through PluginHost::connect_store and the
// host services table. Each PluginHost has its own services table, so
// several hosts in one process behave like several processes; the forked
// tests use real separate processes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/resource.h>

#include "strata/error.hpp"
#include "test_support.h"
#include "strata/plugin_host.hpp"
#include "strata/store.hpp"

namespace strata {
namespace {

using test::reap;
using test::unused_port;

using Clock = std::chrono::steady_clock;

void append(void* user, const char* data, uint64_t len) {
  static_cast<std::string*>(user)->append(data, len);
}

// Thin wrappers over the C table (what plugins call), throwing on failure.
struct Store {
  const strata_host_api* api;
  void set(const std::string& k, const std::string& v, int64_t ms = 5000) const {
    strata_error e;
    strata_error_init(&e);
    detail::check_status(api->store_set(api, k.c_str(), v.data(), v.size(), ms, &e), e, "set");
  }
  std::string get(const std::string& k, int64_t ms = 5000) const {
    strata_error e;
    strata_error_init(&e);
    std::string out;
    detail::check_status(api->store_get(api, k.c_str(), append, &out, ms, &e), e, "get");
    return out;
  }
  int64_t add(const std::string& k, int64_t d, int64_t ms = 5000) const {
    strata_error e;
    strata_error_init(&e);
    int64_t r = 0;
    detail::check_status(api->store_add(api, k.c_str(), d, &r, ms, &e), e, "add");
    return r;
  }
  void wait(const std::vector<std::string>& keys, int64_t ms = 5000) const {
    std::vector<const char*> p;
    for (const auto& k : keys) p.push_back(k.c_str());
    strata_error e;
    strata_error_init(&e);
    detail::check_status(api->store_wait(api, p.data(), p.size(), ms, &e), e, "wait");
  }
};

StoreConfig serve_cfg(const std::string& token = "") {
  StoreConfig c;
  c.address = "127.0.0.1:0";
  c.serve = true;
  c.auth_token = token;
  c.timeout_s = 10;
  return c;
}

StoreConfig client_cfg(const std::string& address, const std::string& token = "", double t = 10) {
  StoreConfig c;
  c.address = address;
  c.auth_token = token;
  c.timeout_s = t;
  return c;
}

uint16_t port_of(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}


int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the peer closes `fd` within `ms` (reads and discards data).
bool closed_by_peer(int fd, int ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

TEST(StoreTest, ServeOnEphemeralPortAndShareAcrossHosts) {
  PluginHost server;
  server.connect_store(serve_cfg());
  const std::string addr = server.store_address();
  ASSERT_NE(port_of(addr), 0) << addr;
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;

  PluginHost a, b;
  EXPECT_EQ(a.store_address(), "");
  a.connect_store(client_cfg(addr));
  b.connect_store(client_cfg(addr));
  EXPECT_EQ(a.store_address(), addr);
  Store sa{a.host_api()}, sb{b.host_api()}, ss{server.host_api()};

  sa.set("k", std::string("v\0w", 3));
  EXPECT_EQ(sb.get("k"), std::string("v\0w", 3));
  EXPECT_EQ(ss.get("k"), std::string("v\0w", 3));
  sb.set("k", "");
  EXPECT_EQ(sa.get("k"), "");

  EXPECT_EQ(sa.add("n", 5), 5);
  EXPECT_EQ(sb.add("n", -2), 3);
  EXPECT_EQ(ss.get("n"), "3");
  EXPECT_THROW(sa.add("k", 1), InvalidArgumentError);  // "" is not an integer

  // get and wait block server-side until another host sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    sb.set("late", "x");
    sb.set("late2", "y");
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(sa.get("late"), "x");
  ss.wait({"late", "late2", "n"});
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(100));
  setter.join();

  // The in-process store of a host that did not connect is separate.
  PluginHost local;
  Store sl{local.host_api()};
  EXPECT_THROW(sl.get("k", 50), DeadlineExceededError);
}

TEST(StoreTest, ManyThreadsCountConcurrently) {
  PluginHost server;
  server.connect_store(serve_cfg());
  PluginHost client;
  client.connect_store(client_cfg(server.store_address()));
  Store s{client.host_api()}, ss{server.host_api()};
  constexpr int kThreads = 8, kAdds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        // Half the threads first block on a key only the last adder sets.
        if (t % 2 == 0) s.get("go");
        for (int i = 0; i < kAdds; ++i) s.add("counter", 1);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ss.set("go", "1");
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(ss.get("counter"), std::to_string(kThreads * kAdds));
}

TEST(StoreTest, GetAndWaitHonourDeadlines) {
  PluginHost server;
  server.connect_store(serve_cfg());
  Store s{server.host_api()};
  s.set("present", "1");
  auto t0 = Clock::now();
  try {
    s.get("missing", 200);
    FAIL() << "get of a missing key returned";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  auto dt = Clock::now() - t0;
  EXPECT_GE(dt, std::chrono::milliseconds(190));
  EXPECT_LT(dt, std::chrono::seconds(5));
  try {
    s.wait({"present", "absent"}, 100);
    FAIL() << "wait for a missing key returned";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("'absent'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("'present'"), std::string::npos) << e.what();
  }
  // The connection is still usable after a timed-out request.
  EXPECT_EQ(s.get("present"), "1");
}

// The server files each pending GET/WAIT under one key it still lacks and
// looks only at those when a key is set: a WAIT on several keys must move
// from key to key and answer only once all are set, and a request that
// timed out must never be answered again when its key appears later.
TEST(StoreTest, WaitsMoveFromKeyToKeyAndTimedOutWaitersStayAnswered) {
  PluginHost server;
  server.connect_store(serve_cfg());
  Store ss{server.host_api()};
  PluginHost a_host, b_host;
  a_host.connect_store(client_cfg(server.store_address()));
  b_host.connect_store(client_cfg(server.store_address()));
  Store a{a_host.host_api()}, b{b_host.host_api()};
  std::atomic<bool> a_done{false}, b_done{false};
  std::thread ta([&] {
    try {
      a.wait({"w1", "w2", "w3"}, 10000);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    a_done = true;
  });
  std::thread tb([&] {
    try {
      EXPECT_EQ(b.get("w3", 10000), "three");
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    b_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ss.set("w3", "three");  // wakes b; a moves on to w1
  ss.set("w1", "one");    // a moves on to w2
  for (int i = 0; i < 500 && !b_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(b_done.load()) << "a get of w3 was not answered when w3 was set";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(a_done.load()) << "a wait on w1, w2, w3 was answered before w2 was set";
  ss.set("w2", "two");
  ta.join();
  tb.join();
  EXPECT_TRUE(a_done.load());

  // Timed-out requests on a key set later: each got its one answer (the
  // timeout), and the connection's later requests read their own answers.
  for (int i = 0; i < 20; ++i) EXPECT_THROW(a.get("late", 20), DeadlineExceededError);
  EXPECT_THROW(a.wait({"w1", "late"}, 20), DeadlineExceededError);
  ss.set("late", "L");
  EXPECT_EQ(a.get("w2"), "two");
  EXPECT_EQ(a.get("late"), "L");
  EXPECT_EQ(a.add("after", 5), 5);
}

TEST(StoreTest, LimitsAreEnforcedWithClearErrors) {
  PluginHost server;
  server.connect_store(serve_cfg());
  Store s{server.host_api()};
  try {
    s.set("big", std::string((64u << 20) + 1, 'x'));
    FAIL() << "oversized value accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("accepts values up to"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.set(std::string(5000, 'k'), "v"), InvalidArgumentError);
  const std::string large(1u << 20, 'y');
  s.set("large", large);
  EXPECT_EQ(s.get("large"), large);
}

TEST(StoreTest, ServerAbsentFailsAtTheDeadline) {
  PluginHost h;
  const std::string addr = "127.0.0.1:" + std::to_string(unused_port());
  const auto t0 = Clock::now();
  try {
    h.connect_store(client_cfg(addr, "", 0.5));
    FAIL() << "connected to nothing";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find(addr), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(450));
  EXPECT_EQ(h.store_address(), "");
}

// A closed loopback port refuses at once, every retry: the error must say
// "refused" (nobody listens), not just that a deadline passed.
TEST(StoreTest, ClosedPortIsReportedAsRefused) {
  PluginHost h;
  const std::string addr = "127.0.0.1:" + std::to_string(unused_port());
  const auto t0 = Clock::now();
  try {
    h.connect_store(client_cfg(addr, "", 0.3));
    FAIL() << "connected to nothing";
  } catch (const DeadlineExceededError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("connection refused by " + addr), std::string::npos) << what;
    EXPECT_NE(what.find("is the chief running"), std::string::npos) << what;
    EXPECT_EQ(what.find("timed out"), std::string::npos) << what;
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
}

TEST(StoreTest, BadAddressAndDoubleConnectAreRejected) {
  PluginHost h;
  EXPECT_THROW(h.connect_store(client_cfg("no-port")), InvalidArgumentError);
  EXPECT_THROW(h.connect_store(client_cfg("127.0.0.1:0")), InvalidArgumentError);
  h.connect_store(serve_cfg());
  EXPECT_THROW(h.connect_store(serve_cfg()), FailedPreconditionError);
}

TEST(StoreTest, PortTakenIsAlreadyExists) {
  PluginHost a;
  a.connect_store(serve_cfg());
  PluginHost b;
  StoreConfig c = serve_cfg();
  c.address = a.store_address();
  try {
    b.connect_store(c);
    FAIL() << "served twice on one port";
  } catch (const AlreadyExistsError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port_of(a.store_address()))), std::string::npos)
        << e.what();
  }
}

TEST(StoreTest, GarbageClosesOnlyThatConnection) {
  PluginHost server;
  server.connect_store(serve_cfg());
  const uint16_t port = port_of(server.store_address());
  Store s{server.host_api()};
  const std::vector<std::string> garbage = {
      std::string("\xff\xff\xff\xff", 4),                          // oversize frame
      std::string("\x00\x00\x00\x00", 4),                          // empty frame
      std::string("\x05\x00\x00\x00\x02\x01\x00\x00\x00", 9),      // SET before HELLO
      std::string("\x01\x00\x00\x00\x63", 5),                      // unknown op
      std::string("\x03\x00\x00\x00\x01\x53\x52", 7),              // truncated HELLO
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
  };
  for (const auto& g : garbage) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, g.data(), g.size(), MSG_NOSIGNAL), static_cast<ssize_t>(g.size()));
    EXPECT_TRUE(closed_by_peer(fd, 3000)) << "server kept a connection that sent garbage";
    ::close(fd);
  }
  // A connection that hangs up mid-frame does not disturb the server either.
  const int fd = raw_connect(port);
  ASSERT_GE(fd, 0);
  ::send(fd, "\x10\x00", 2, MSG_NOSIGNAL);
  ::close(fd);
  s.set("still", "alive");
  EXPECT_EQ(s.get("still"), "alive");
}

TEST(StoreTest, AbortUnblocksAGet) {
  PluginHost server;
  server.connect_store(serve_cfg());
  PluginHost client;
  client.connect_store(client_cfg(server.store_address()));
  const strata_host_api* api = client.host_api();
  std::thread aborter([api] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    api->request_abort(api, "test abort");
  });
  const auto t0 = Clock::now();
  EXPECT_THROW(Store{api}.get("never", 20000), AbortedError);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  aborter.join();
  EXPECT_THROW(Store{api}.set("x", "y"), AbortedError);
}

TEST(StoreTest, ServerGoneIsUnavailable) {
  PluginHost client;
  {
    PluginHost server;
    server.connect_store(serve_cfg());
    client.connect_store(client_cfg(server.store_address()));
    Store{client.host_api()}.set("a", "b");
  }
  try {
    Store{client.host_api()}.get("a", 1000);
    FAIL() << "store still answered after the server stopped";
  } catch (const Error& e) {
    // A pooled connection sees the close (UNAVAILABLE); a fresh one cannot
    // connect before the deadline (DEADLINE_EXCEEDED). Both name the store.
    EXPECT_TRUE(e.code() == STRATA_ERR_UNAVAILABLE || e.code() == STRATA_ERR_DEADLINE_EXCEEDED) << e.what();
    EXPECT_NE(std::string(e.what()).find("rendezvous store at 127.0.0.1:"), std::string::npos) << e.what();
  }
}

// Child processes report through exit codes; they never return into gtest.
[[noreturn]] void child_exit(int code) { ::_exit(code); }

TEST(StoreTest, ForkedClientsRendezvousWithAServerStartedLater) {
  // Fork before this process starts any thread; the children connect with
  // retries while the server is not up yet (as ranks racing the chief).
  const uint16_t port = unused_port();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  constexpr int kChildren = 3;
  std::vector<pid_t> pids;
  for (int i = 0; i < kChildren; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        PluginHost h;
        h.connect_store(client_cfg(addr, "secret", 20));
        Store s{h.host_api()};
        s.add("arrived", 1);  // before the key the parent waits for
        s.set("child/" + std::to_string(i), std::to_string(i * 10));
        if (s.get("go", 20000) != "now") code = 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
        code = 1;
      }
      child_exit(code);
    }
    pids.push_back(pid);
  }
  int result[kChildren];
  {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    PluginHost server;
    StoreConfig c = serve_cfg("secret");
    c.address = addr;
    server.connect_store(c);
    Store s{server.host_api()};
    std::vector<std::string> keys;
    for (int i = 0; i < kChildren; ++i) keys.push_back("child/" + std::to_string(i));
    try {
      s.wait(keys, 20000);
      for (int i = 0; i < kChildren; ++i) EXPECT_EQ(s.get(keys[i]), std::to_string(i * 10));
      EXPECT_EQ(s.get("arrived"), "3");
      s.set("go", "now");
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    for (int i = 0; i < kChildren; ++i) result[i] = reap(pids[i], 20000);
  }
  for (int i = 0; i < kChildren; ++i) EXPECT_EQ(result[i], 0) << "child " << i;
}

TEST(StoreTest, WrongTokenIsRefusedAndLoggedByTheServer) {
  char log_path[] = "/tmp/strata-store-test-XXXXXX";
  const int log_fd = ::mkstemp(log_path);
  ASSERT_GE(log_fd, 0);
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(log_fd, 2);
    ::close(ready[0]);
    ::close(done[1]);
    int code = 0;
    try {
      PluginHost server;
      server.connect_store(serve_cfg("right-token"));
      const std::string addr = server.store_address();
      (void)!::write(ready[1], addr.data(), addr.size());
      ::close(ready[1]);
      char c;
      pollfd p{done[0], POLLIN, 0};
      ::poll(&p, 1, 30000);  // until the parent is done (or gone)
      (void)!::read(done[0], &c, 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server child: %s\n", e.what());
      code = 1;
    }
    child_exit(code);
  }
  ::close(ready[1]);
  ::close(done[0]);
  std::string addr;
  {
    pollfd p{ready[0], POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 20000), 1);
    char buf[128];
    const ssize_t n = ::read(ready[0], buf, sizeof buf);
    ASSERT_GT(n, 0);
    addr.assign(buf, static_cast<size_t>(n));
  }
  {
    PluginHost wrong;
    try {
      wrong.connect_store(client_cfg(addr, "wrong-token"));
      ADD_FAILURE() << "a wrong token was accepted";
    } catch (const PermissionDeniedError& e) {
      EXPECT_NE(std::string(e.what()).find("STRATA_AUTH_TOKEN differs from the chief's"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(addr), std::string::npos) << e.what();
    }
    PluginHost none;
    EXPECT_THROW(none.connect_store(client_cfg(addr, "")), PermissionDeniedError);
    PluginHost right;
    right.connect_store(client_cfg(addr, "right-token"));
    Store{right.host_api()}.set("ok", "1");
    EXPECT_EQ(Store{right.host_api()}.get("ok"), "1");
  }
  ::close(done[1]);
  EXPECT_EQ(reap(pid, 20000), 0);
  ::close(ready[0]);
  std::ifstream f(log_path);
  std::stringstream ss;
  ss << f.rdbuf();
  ::close(log_fd);
  ::unlink(log_path);
  EXPECT_NE(ss.str().find("refused store connection from 127.0.0.1:"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("wrong auth token"), std::string::npos) << ss.str();
}


// ---- the authenticated handshake (store_protocol.h), spoken by hand ----

// One frame: u32 length, body.
std::string frame(const std::string& body) {
  const uint32_t n = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + body;
}
std::string u32le(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string lstr(const std::string& s) { return u32le(static_cast<uint32_t>(s.size())) + s; }

bool read_exact(int fd, char* p, size_t n, int ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (n > 0 && Clock::now() < deadline) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 50) <= 0) continue;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return n == 0;
}

// The server's challenge nonce, read off a fresh connection.
std::string read_challenge(int fd) {
  char hdr[4];
  if (!read_exact(fd, hdr, 4, 3000)) return "";
  uint32_t n = 0;
  std::memcpy(&n, hdr, 4);
  if (n > 256) return "";
  std::string body(n, '\0');
  if (!read_exact(fd, body.data(), n, 3000)) return "";
  if (body.size() != 4 + 4 + 4 + 32 || body.compare(0, 4, u32le(0x43545253)) != 0) return "";
  return body.substr(12);
}

// HMAC-SHA256(token, "strata-store-2 client" | server_nonce | client_nonce),
// computed here from the protocol's definition, not with Strata's code.
std::string hello_for(const std::string& token, const std::string& server_nonce, const std::string& client_nonce) {
  const std::string msg = "strata-store-2 client" + server_nonce + client_nonce;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), mac, &len);
  return frame(std::string("\x01", 1) + u32le(0x53545253) + u32le(2) + lstr(client_nonce) +
               lstr(std::string(reinterpret_cast<const char*>(mac), len)));
}

// The answer's status (0 = OK), or -1 when the server just closed.
int32_t answer_status(int fd) {
  char hdr[4];
  if (!read_exact(fd, hdr, 4, 3000)) return -1;
  uint32_t n = 0;
  std::memcpy(&n, hdr, 4);
  std::string body(n, '\0');
  if (n < 4 || !read_exact(fd, body.data(), n, 3000)) return -1;
  int32_t st = 0;
  std::memcpy(&st, body.data(), 4);
  return st;
}

TEST(StoreTest, HandshakeProvesTheTokenWithoutSendingItAndRefusesAReplay) {
  const std::string token = "job-token-0123456789";
  PluginHost server;
  server.connect_store(serve_cfg(token));
  const uint16_t port = port_of(server.store_address());
  const std::string client_nonce(32, 'c');

  // A correct proof for this connection's challenge is accepted.
  const int a = raw_connect(port);
  ASSERT_GE(a, 0);
  const std::string nonce_a = read_challenge(a);
  ASSERT_EQ(nonce_a.size(), 32u);
  const std::string hello_a = hello_for(token, nonce_a, client_nonce);
  EXPECT_EQ(hello_a.find(token), std::string::npos) << "the token crossed the wire";
  ASSERT_EQ(::send(a, hello_a.data(), hello_a.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello_a.size()));
  EXPECT_EQ(answer_status(a), STRATA_OK);
  ::close(a);

  // The same HELLO replayed on a new connection meets a new challenge.
  const int b = raw_connect(port);
  ASSERT_GE(b, 0);
  const std::string nonce_b = read_challenge(b);
  ASSERT_EQ(nonce_b.size(), 32u);
  EXPECT_NE(nonce_a, nonce_b) << "challenges repeat";
  ASSERT_EQ(::send(b, hello_a.data(), hello_a.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello_a.size()));
  EXPECT_EQ(answer_status(b), STRATA_ERR_PERMISSION_DENIED) << "a replayed HELLO was accepted";
  EXPECT_TRUE(closed_by_peer(b, 3000));
  ::close(b);

  // Every single corrupted byte of a valid HELLO is refused, and the server
  // keeps serving.
  for (size_t i = 0; i < hello_a.size(); ++i) {
    const int c = raw_connect(port);
    ASSERT_GE(c, 0);
    std::string h = hello_for(token, read_challenge(c), client_nonce);
    h[i] = static_cast<char>(h[i] ^ 0x5a);
    ::send(c, h.data(), h.size(), MSG_NOSIGNAL);
    EXPECT_NE(answer_status(c), STRATA_OK) << "byte " << i << " corrupted, still accepted";
    ::close(c);
  }
  PluginHost client;
  client.connect_store(client_cfg(server.store_address(), token));
  Store{client.host_api()}.set("k", "v");
  EXPECT_EQ(Store{server.host_api()}.get("k"), "v");
  // Each refusal is on record for rendezvous errors.
  EXPECT_NE(Store{server.host_api()}.get("strata/store/refused").find("wrong auth token"), std::string::npos);
}

TEST(StoreTest, AClientRefusesAStoreThatCannotProveTheToken) {
  PluginHost server;
  server.connect_store(serve_cfg(""));  // no token: proves nothing
  PluginHost client;
  try {
    client.connect_store(client_cfg(server.store_address(), "some-token", 3));
    FAIL() << "a store without the token was trusted";
  } catch (const PermissionDeniedError& e) {
    EXPECT_NE(std::string(e.what()).find("runs without STRATA_AUTH_TOKEN"), std::string::npos) << e.what();
  }
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// 1,000 connections that each send a 4-byte length of 64 MiB and wait: the
// server (in this process) allocates nothing sizeable for them, keeps at most
// a bounded number, and a real client still gets in at once.
TEST(StoreTest, AThousandHostileConnectionsNeitherExhaustNorBlockTheStore) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  constexpr int kConns = 1000;
  if (rl.rlim_cur < kConns + 200) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, kConns + 200);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  const int conns = static_cast<int>(std::min<rlim_t>(kConns, rl.rlim_cur - 200));
  PluginHost server;
  server.connect_store(serve_cfg("tok"));
  const uint16_t port = port_of(server.store_address());
  const long before = rss_kib();
  const uint32_t big = 64u << 20;
  std::vector<int> fds;
  for (int i = 0; i < conns; ++i) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0) << "connection " << i;
    ::send(fd, &big, 4, MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  // Let the server read them all.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long after = rss_kib();
  std::printf("[ store ] %d hostile connections: server process RSS %ld -> %ld KiB (+%ld KiB)\n", conns, before,
              after, after - before);
#ifdef STORE_TEST_SANITIZED
  const long bound_kib = 96 * 1024;  // shadow memory and ASan's quarantine of freed sessions
#else
  const long bound_kib = 16 * 1024;  // a 64 MiB allocation for even one of them would break it
#endif
  EXPECT_LT(after - before, bound_kib) << "the store allocated for unauthenticated frames";
  // Every hostile connection is closed (refused at once: the frame is too
  // big before authentication).
  // One shared deadline, not one per socket: on a loaded machine the
  // server may close the last of them a moment later than the first.
  int open = 0;
  const auto all_closed_by = Clock::now() + std::chrono::seconds(10);
  for (int fd : fds) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(all_closed_by - Clock::now()).count();
    open += closed_by_peer(fd, static_cast<int>(std::max<int64_t>(left, 20))) ? 0 : 1;
  }
  EXPECT_EQ(open, 0) << open << " hostile connections still open 10 s after they were refused";
  for (int fd : fds) ::close(fd);
  fds.clear();
  // 1,000 connections that only connect and say nothing: the oldest are
  // dropped for newer ones, so a real client still gets in at once.
  for (int i = 0; i < conns; ++i) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  const auto t0 = Clock::now();
  PluginHost client;
  client.connect_store(client_cfg(server.store_address(), "tok", 10));
  Store{client.host_api()}.set("in", "yes");
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ store ] a real client behind %d idle connections got in after %.3f s\n", conns, s);
  EXPECT_LT(s, 5.0);
  int dropped = 0;
  for (int fd : fds) dropped += closed_by_peer(fd, 5) ? 1 : 0;
  EXPECT_GE(dropped, conns - 64 - 1) << "idle unauthenticated connections were kept without bound";
  for (int fd : fds) ::close(fd);
}

// ---- TLS (store_tls.h) ----

// Certificates made with OpenSSL's C API (no openssl CLI): a CA, a server
// and a client certificate it signed, and a second CA that signed nothing
// here. Written once per process into a temp dir.
struct TlsFiles {
  std::string dir, ca, other_ca, server_cert, server_key, client_cert, client_key;
};

EVP_PKEY* new_key() { return EVP_EC_gen("P-256"); }

X509* new_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool is_ca, long serial) {
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600L * 24);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  const auto add = [&](int nid, const char* value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  };
  add(NID_basic_constraints, is_ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  add(NID_key_usage, is_ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  if (!is_ca) add(NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  return x;
}

void write_pem(const std::string& path, X509* cert, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  if (cert != nullptr) PEM_write_X509(f, cert);
  if (key != nullptr) PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
}

const TlsFiles& tls_files() {
  static const TlsFiles files = [] {
    TlsFiles t;
    char tmpl[] = "/tmp/strata_store_tls_XXXXXX";
    t.dir = ::mkdtemp(tmpl);
    t.ca = t.dir + "/ca.pem";
    t.other_ca = t.dir + "/other-ca.pem";
    t.server_cert = t.dir + "/server.pem";
    t.server_key = t.dir + "/server.key";
    t.client_cert = t.dir + "/client.pem";
    t.client_key = t.dir + "/client.key";
    EVP_PKEY* ca_key = new_key();
    X509* ca = new_cert(ca_key, "strata test CA", nullptr, nullptr, true, 1);
    EVP_PKEY* other_key = new_key();
    X509* other = new_cert(other_key, "strata test CA", nullptr, nullptr, true, 1);  // same name, other key
    EVP_PKEY* server_key = new_key();
    X509* server = new_cert(server_key, "strata store", ca, ca_key, false, 2);
    EVP_PKEY* client_key = new_key();
    X509* client = new_cert(client_key, "strata worker", ca, ca_key, false, 3);
    write_pem(t.ca, ca, nullptr);
    write_pem(t.other_ca, other, nullptr);
    write_pem(t.server_cert, server, nullptr);
    write_pem(t.server_key, nullptr, server_key);
    write_pem(t.client_cert, client, nullptr);
    write_pem(t.client_key, nullptr, client_key);
    for (X509* x : {ca, other, server, client}) X509_free(x);
    for (EVP_PKEY* k : {ca_key, other_key, server_key, client_key}) EVP_PKEY_free(k);
    return t;
  }();
  return files;
}

std::string tls_config(const std::string& cert, const std::string& key, const std::string& ca) {
  std::string j = "{\"rendezvous\": {\"tls\": {";
  std::string sep;
  if (!cert.empty()) j += sep + "\"cert\": \"" + cert + "\"", sep = ", ";
  if (!key.empty()) j += sep + "\"key\": \"" + key + "\"", sep = ", ";
  if (!ca.empty()) j += sep + "\"ca\": \"" + ca + "\"";
  return j + "}}}";
}

// A chief serving TLS with the server certificate. With "ca" set it
// requires client certificates (mutual TLS), and its own client (the chief
// connects to its store too) presents the server certificate.
void serve_tls(PluginHost& server, const std::string& token = "tok") {
  const TlsFiles& t = tls_files();
  server.set_config(tls_config(t.server_cert, t.server_key, t.ca));
  server.connect_store(serve_cfg(token));
}

// connect_store's error, and how long it took.
template <class E>
std::string connect_error(PluginHost& client, const StoreConfig& cfg, double* seconds) {
  const auto t0 = Clock::now();
  try {
    client.connect_store(cfg);
  } catch (const E& e) {
    *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("[ store ] refused after %.3f s: %s\n", *seconds, e.what());
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected error type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "connect_store succeeded";
  return "";
}

TEST(StoreTest, TlsClientAndServerSetGetWait) {
  const TlsFiles& t = tls_files();
  PluginHost server;
  serve_tls(server);
  PluginHost client;
  client.set_config(tls_config(t.client_cert, t.client_key, t.ca));
  client.connect_store(client_cfg(server.store_address(), "tok"));
  Store a{server.host_api()};
  Store b{client.host_api()};
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a.set("later", "x");
  });
  EXPECT_EQ(b.get("later"), "x");  // parked GET woken over TLS
  setter.join();
  b.set("k", std::string(1 << 20, 'v'));  // larger than a TLS record
  EXPECT_EQ(a.get("k").size(), 1u << 20);
  EXPECT_EQ(b.add("n", 2), 2);
  a.set("w", "1");
  b.wait({"k", "w", "n"});
  // On the wire: the clear preamble, and the challenge only inside TLS.
  const int fd = raw_connect(port_of(server.store_address()));
  ASSERT_GE(fd, 0);
  char pre[12];
  ASSERT_TRUE(read_exact(fd, pre, 12, 3000));
  EXPECT_EQ(std::string(pre, 12), u32le(8) + u32le(0x4c545253) + u32le(2));
  ::close(fd);
}

TEST(StoreTest, TlsWithTheWrongCaFailsVerification) {
  const TlsFiles& t = tls_files();
  PluginHost server;
  serve_tls(server);
  PluginHost client;
  client.set_config(tls_config(t.client_cert, t.client_key, t.other_ca));
  double s = 0;
  const std::string msg = connect_error<PermissionDeniedError>(client, client_cfg(server.store_address(), "tok"), &s);
  EXPECT_NE(msg.find("does not verify against the CA '" + t.other_ca + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("OpenSSL: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("certificate verify failed"), std::string::npos) << msg;
  EXPECT_LT(s, 3.0) << msg;
}

TEST(StoreTest, PlainClientToTlsServerFailsFast) {
  PluginHost server;
  serve_tls(server);
  PluginHost client;
  double s = 0;
  const std::string msg =
      connect_error<FailedPreconditionError>(client, client_cfg(server.store_address(), "tok", 10), &s);
  EXPECT_NE(msg.find("the rendezvous store at " + server.store_address() + " speaks TLS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/rendezvous/tls"), std::string::npos) << msg;
  EXPECT_LT(s, 2.0) << msg;
}

TEST(StoreTest, TlsClientToPlainServerFailsFast) {
  const TlsFiles& t = tls_files();
  PluginHost server;
  server.connect_store(serve_cfg("tok"));
  PluginHost client;
  client.set_config(tls_config(t.client_cert, t.client_key, t.ca));
  double s = 0;
  const std::string msg =
      connect_error<FailedPreconditionError>(client, client_cfg(server.store_address(), "tok", 10), &s);
  EXPECT_NE(msg.find("the rendezvous store at " + server.store_address() + " does not speak TLS"), std::string::npos)
      << msg;
  EXPECT_LT(s, 2.0) << msg;
}

TEST(StoreTest, TlsMissingFilesNameThePath) {
  const TlsFiles& t = tls_files();
  const std::string missing = t.dir + "/no-such.key";
  {
    PluginHost server;
    server.set_config(tls_config(t.server_cert, missing, t.ca));
    try {
      server.connect_store(serve_cfg());
      FAIL() << "served TLS without a key";
    } catch (const NotFoundError& e) {
      EXPECT_NE(std::string(e.what()).find("private key file '" + missing + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
    }
  }
  {
    // The env var overrides the config, on a client too.
    PluginHost server;
    serve_tls(server);
    PluginHost client;
    client.set_config(tls_config(t.client_cert, t.client_key, t.ca));
    const std::string missing_ca = t.dir + "/no-such-ca.pem";
    ::setenv("STRATA_TLS_CA", missing_ca.c_str(), 1);
    try {
      client.connect_store(client_cfg(server.store_address(), "tok"));
      ADD_FAILURE() << "connected without a CA file";
    } catch (const NotFoundError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + missing_ca + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("STRATA_TLS_CA"), std::string::npos) << e.what();
    }
    ::unsetenv("STRATA_TLS_CA");
  }
  {
    // A chief needs its own certificate and key.
    PluginHost server;
    server.set_config(tls_config("", "", t.ca));
    EXPECT_THROW(server.connect_store(serve_cfg()), InvalidArgumentError);
  }
}

TEST(StoreTest, MutualTlsRefusesAClientWithoutCertificate) {
  const TlsFiles& t = tls_files();
  PluginHost server;
  serve_tls(server);
  PluginHost client;
  client.set_config(tls_config("", "", t.ca));
  double s = 0;
  const std::string msg = connect_error<PermissionDeniedError>(client, client_cfg(server.store_address(), "tok"), &s);
  EXPECT_NE(msg.find("refused the TLS connection (OpenSSL: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("client certificate"), std::string::npos) << msg;
  EXPECT_LT(s, 3.0) << msg;
  // The chief records the refusal for rendezvous errors.
  EXPECT_NE(Store{server.host_api()}.get("strata/store/refused").find("TLS handshake failed"), std::string::npos);
}

TEST(StoreTest, TlsHandshakesCountAgainstTheUnauthenticatedCap) {
  const TlsFiles& t = tls_files();
  PluginHost server;
  serve_tls(server);
  const uint16_t port = port_of(server.store_address());
  // 200 connections that read the preamble and never start TLS.
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  const auto t0 = Clock::now();
  PluginHost client;
  client.set_config(tls_config(t.client_cert, t.client_key, t.ca));
  client.connect_store(client_cfg(server.store_address(), "tok"));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ store ] a TLS client behind 200 idle connections got in after %.3f s\n", s);
  EXPECT_LT(s, 5.0);
  int dropped = 0;
  for (int fd : fds) dropped += closed_by_peer(fd, 5) ? 1 : 0;
  EXPECT_GE(dropped, 200 - 64 - 1) << "idle TLS connections were kept without bound";
  for (int fd : fds) ::close(fd);
}

TEST(StoreTest, TlsConfigKeysAreValidated) {
  PluginHost h;
  try {
    h.set_config(R"({"rendezvous": {"tls": {"cert": "a.pem", "certificate": "b.pem"}}})");
    FAIL() << "unknown key accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("/rendezvous/tls may contain only \"cert\", \"key\" and \"ca\""),
              std::string::npos)
        << e.what();
  }
  try {
    h.set_config(R"({"rendezvous": {"ssl": {}}})");
    FAIL() << "unknown key accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("\"address\", \"auth_token\" and \"tls\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(h.set_config(R"({"rendezvous": {"tls": "ca.pem"}})"), InvalidArgumentError);
  EXPECT_NO_THROW(h.set_config(R"({"rendezvous": {"tls": {"cert": "a", "key": "b", "ca": "c"}}})"));
}

}  // namespace
}  // namespace strata
