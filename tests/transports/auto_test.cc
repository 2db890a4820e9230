// SPDX-License-Identifier: Apache-2.0
// Tests of the "auto" transport plugin, loaded through the plugin host. Ranks
// run as threads (each with its own transport instance over the host's shared
// in-process store) with "host_id" overrides standing in for hosts, and once
// as forked processes over the TCP rendezvous store. The sub-transports are
// named "tcp" explicitly where a test checks which one serves a peer, so the
// result does not depend on which other plugins are installed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "strata/error.hpp"
#include "strata/plugin_host.hpp"
#include "strata/sdk/host.hpp"
#include "test_support.h"
#include "forked_ranks.h"
#include "transport_test_support.h"
#include "../../transports/common/rdma_devices.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using test::Children;
using test::fill_pattern;
using test::pattern_mismatch;
using test::reap;
using test::run_ranks;
using test::unique_name;
using test::unused_port;

// One rank's "auto" transport instance and communicator, throwing on errors.
class Rank : public test::TransportRank {
 public:
  Rank(PluginHost& host, const std::string& options) : TransportRank(host, "auto", options) {}
};

std::string opts(const std::string& host_id, const std::string& extra = "") {
  return R"({"local": "tcp", "remote": {"name": "tcp", "options": {"connections_per_peer": 1}}, "host_id": ")" +
         host_id + "\"" + extra + "}";
}

// Every ordered pair exchanges messages of several sizes over two tags, in
// posting order (tags interleaved), all posted before any wait. Returns
// nothing; fails the test on a wrong byte or count.
void all_pairs_exchange(Rank& r, int rank, int world) {
  const std::vector<uint64_t> sizes = {0, 1, 8, 4096, 65536 + 3, (1u << 20) + 5};
  constexpr int kTags = 2;
  struct Msg {
    std::vector<uint8_t> data;
    strata_request_t req;
    int peer;
    uint64_t salt;
  };
  std::vector<Msg> recvs, sends;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    for (size_t k = 0; k < sizes.size(); ++k)
      for (int t = 0; t < kTags; ++t) {
        Msg m{std::vector<uint8_t>(sizes[k] + 8, 0xEE), nullptr, peer, (peer * 100 + rank) * 64 + k * kTags + t};
        m.req = r.irecv(peer, 10 + t, m.data.data(), m.data.size());
        recvs.push_back(std::move(m));
      }
  }
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    for (size_t k = 0; k < sizes.size(); ++k)
      for (int t = 0; t < kTags; ++t) {
        Msg m{std::vector<uint8_t>(sizes[k]), nullptr, peer, (rank * 100 + peer) * 64 + k * kTags + t};
        fill_pattern(m.data.data(), sizes[k], m.salt);
        m.req = r.isend(peer, 10 + t, m.data.data(), m.data.size());
        sends.push_back(std::move(m));
      }
  }
  for (auto& m : sends) ASSERT_EQ(r.wait(m.req), m.data.size());
  for (size_t j = 0; j < recvs.size(); ++j) {
    Msg& m = recvs[j];
    const uint64_t n = m.data.size() - 8;
    ASSERT_EQ(r.wait(m.req), n) << "rank " << rank << " from " << m.peer;
    if (const uint64_t i = pattern_mismatch(m.data.data(), n, m.salt); i != n)
      FAIL() << "rank " << rank << " from " << m.peer << ": byte " << i;
    ASSERT_EQ(m.data[n], 0xEE) << "wrote past the message";
  }
}

// The routes rank `rank` published for communicator `name`.
json routes_of(PluginHost& host, const std::string& name, int rank) {
  sdk::Host h(host.host_api(), "test");
  return json::parse(h.store_get(name + "/auto/route/" + std::to_string(rank), 5000));
}

// Check every rank's published routes against the host assignment.
void expect_routes(PluginHost& host, const std::string& name, const std::vector<std::string>& hosts) {
  const int world = static_cast<int>(hosts.size());
  for (int r = 0; r < world; ++r) {
    const json j = routes_of(host, name, r);
    EXPECT_EQ(j.at("rank").get<int>(), r);
    EXPECT_EQ(j.at("host").get<std::string>(), hosts[r]);
    ASSERT_EQ(j.at("routes").size(), static_cast<size_t>(world - 1)) << j.dump();
    std::vector<int> same;
    for (int p = 0; p < world; ++p)
      if (hosts[p] == hosts[r]) same.push_back(p);
    for (const json& route : j.at("routes")) {
      const int p = route.at("peer").get<int>();
      ASSERT_NE(p, r);
      EXPECT_EQ(route.at("transport").get<std::string>(), "tcp");
      if (hosts[p] == hosts[r]) {
        EXPECT_EQ(route.at("scope").get<std::string>(), "local") << "rank " << r << " -> " << p;
        const int sub = static_cast<int>(std::find(same.begin(), same.end(), p) - same.begin());
        EXPECT_EQ(route.at("sub_rank").get<int>(), sub) << "rank " << r << " -> " << p;
      } else {
        EXPECT_EQ(route.at("scope").get<std::string>(), "remote") << "rank " << r << " -> " << p;
        EXPECT_EQ(route.at("sub_rank").get<int>(), p);
      }
    }
  }
}

void exchange_on_hosts(const std::vector<std::string>& hosts) {
  PluginHost host;
  const std::string name = unique_name("hosts");
  const int world = static_cast<int>(hosts.size());
  run_ranks(world, [&](int rank) {
    Rank r(host, opts(hosts[rank]));
    r.join(name, rank, world);
    all_pairs_exchange(r, rank, world);
  });
  expect_routes(host, name, hosts);
}

TEST(AutoTest, TwoHostsOfTwoRanksExchangeEveryPairInOrder) { exchange_on_hosts({"a", "a", "b", "b"}); }

TEST(AutoTest, OneHostUsesOnlyTheLocalTransport) { exchange_on_hosts({"x", "x", "x"}); }

TEST(AutoTest, EveryRankOnItsOwnHostUsesOnlyTheRemoteTransport) { exchange_on_hosts({"h0", "h1", "h2"}); }

TEST(AutoTest, UnevenHostsAndInterleavedRanks) { exchange_on_hosts({"b", "a", "b", "c", "a"}); }

TEST(AutoTest, DetectedIdentityPutsThreadsOfOneProcessOnOneHost) {
  PluginHost host;
  const std::string name = unique_name("detect");
  run_ranks(3, [&](int rank) {
    Rank r(host, R"({"local": "tcp", "remote": "tcp"})");
    r.join(name, rank, 3);
    uint64_t v = 0, out = rank;
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    auto q = r.irecv(prev, 1, &v, 8);
    r.wait(r.isend(next, 1, &out, 8));
    ASSERT_EQ(r.wait(q), 8u);
    EXPECT_EQ(v, uint64_t(prev));
  });
  for (int r = 0; r < 3; ++r) {
    const json j = routes_of(host, name, r);  // the loop below borrows from it
    for (const json& route : j.at("routes")) EXPECT_EQ(route.at("scope").get<std::string>(), "local") << route.dump();
  }
}

TEST(AutoTest, DefaultsWorkWhateverIsInstalled) {
  // No sub-transport named: same-host via shmem when /dev/shm works here,
  // else libfabric/shm, else tcp; across hosts via a NIC provider, else tcp.
  PluginHost host;
  const std::string name = unique_name("defaults");
  const std::vector<std::string> hosts = {"a", "a", "b"};
  run_ranks(3, [&](int rank) {
    Rank r(host, R"({"host_id": ")" + hosts[rank] + R"("})");
    r.join(name, rank, 3);
    const auto caps = r.caps();
    EXPECT_TRUE(caps.flags & STRATA_TRANSPORT_CAP_P2P);
    EXPECT_TRUE(caps.flags & STRATA_TRANSPORT_CAP_MEM_HOST);
    // Registered buffers work whether or not a sub-transport requires them.
    std::vector<uint64_t> out(4, rank), in(8, 99);
    auto mo = r.reg(out.data(), 32);
    auto mi = r.reg(in.data(), 64);
    std::vector<strata_request_t> rq;
    for (int p = 0; p < 3; ++p)
      if (p != rank) rq.push_back(r.irecv(p, 3, &in[p * 2], 16, mi));
    for (int p = 0; p < 3; ++p)
      if (p != rank) r.wait(r.isend(p, 3, &out[0], 16, mo));
    for (auto q : rq) EXPECT_EQ(r.wait(q), 16u);
    for (int p = 0; p < 3; ++p) {
      if (p != rank) {
        EXPECT_EQ(in[p * 2], uint64_t(p));
      }
    }
    r.dereg(mo);
    r.dereg(mi);
  });
  const json j = routes_of(host, name, 0);
  for (const json& route : j.at("routes")) {
    const std::string t = route.at("transport").get<std::string>();
    if (route.at("peer").get<int>() == 1) {
      EXPECT_TRUE(t == "shmem" || t == "tcp" || t == "libfabric/shm") << t;
    } else {
      EXPECT_EQ(route.at("scope").get<std::string>(), "remote");
    }
  }
}

// Whether libfabric's library is mapped into this process (/proc/self/maps).
bool libfabric_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/libfabric.so") != std::string::npos) return true;
  return false;
}

TEST(AutoTest, WithoutAnRdmaDeviceLibfabricIsNeverLoaded) {
  // Loading libfabric (and the psm/infinipath libraries it links) cost about
  // 0.2 s per process; a job that cannot use it must not pay for it: not
  // when the plugins are scanned, not when auto picks its sub-transports.
  if (transport::has_rdma_device())
    GTEST_SKIP() << "this machine has an RDMA device: auto asks libfabric for a NIC provider here";
  ASSERT_FALSE(libfabric_mapped()) << "libfabric was loaded before the test began";
  PluginHost host;
  const auto plugins = host.discover();
  const bool have_libfabric_plugin = std::any_of(plugins.begin(), plugins.end(), [](const PluginInfo& p) {
    return p.kind == "transport" && p.name == "libfabric" && p.ok;
  });
  EXPECT_FALSE(libfabric_mapped()) << "scanning the plugins loaded libfabric";
  const std::string name = unique_name("nolibfabric");
  run_ranks(2, [&](int rank) {
    Rank r(host, R"({"host_id": ")" + std::string(rank == 0 ? "a" : "b") + R"("})");
    r.join(name, rank, 2);
    std::vector<uint8_t> out(64, uint8_t(rank + 1)), in(64, 0);
    const auto q = r.irecv(1 - rank, 5, in.data(), in.size());
    r.wait(r.isend(1 - rank, 5, out.data(), out.size()));
    EXPECT_EQ(r.wait(q), 64u);
    EXPECT_EQ(in[63], uint8_t(2 - rank));
  });
  const json j = routes_of(host, name, 0);
  EXPECT_EQ(j.at("routes").at(0).at("transport"), "tcp") << j.dump();
  EXPECT_FALSE(libfabric_mapped()) << "auto loaded libfabric on a machine without an RDMA device";
  if (!have_libfabric_plugin) return;
  // The check above can see libfabric: creating its transport loads it.
  PluginInstance lf = host.create(STRATA_KIND_TRANSPORT, "libfabric", R"({"provider": "shm"})");
  EXPECT_TRUE(libfabric_mapped());
}

TEST(AutoTest, OptionsAreValidatedAndBadSubTransportsNamed) {
  PluginHost host;
  auto expect_error = [&](const std::string& options, std::vector<std::string> needles) {
    try {
      Rank r(host, options);
      ADD_FAILURE() << "accepted " << options;
    } catch (const Error& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"bogus": 1})", {"'bogus'"});
  expect_error(R"({"local": "no_such_transport"})", {"option 'local'", "'no_such_transport'", "cannot be created"});
  expect_error(R"({"local": "tcp", "remote": {"name": "nope_remote"}})",
               {"option 'remote'", "'nope_remote'", "cannot be created"});
  expect_error(R"({"remote": {"name": "tcp", "options": {"connections_per_peer": 99}}})",
               {"option 'remote'", "'tcp'", "connections_per_peer"});
  expect_error(R"({"local": "auto"})", {"option 'local'", "cannot compose itself"});
  expect_error(R"({"local": 5})", {"option 'local'"});
  expect_error(R"({"host_id": ""})", {"'host_id'"});
  expect_error(R"({"timeout_s": 0})", {"'timeout_s'"});
  try {
    Rank(host, R"({"local": "no_such_transport"})");
    ADD_FAILURE() << "a missing local transport was accepted";
  } catch (const NotFoundError&) {
  } catch (const Error& e) {
    ADD_FAILURE() << "a missing plugin should keep NOT_FOUND: " << e.what();
  }

  Rank ok(host, opts("a"));
  const auto caps = ok.caps();
  EXPECT_EQ(caps.flags & (STRATA_TRANSPORT_CAP_P2P | STRATA_TRANSPORT_CAP_MEM_HOST | STRATA_TRANSPORT_CAP_THREAD_SAFE),
            STRATA_TRANSPORT_CAP_P2P | STRATA_TRANSPORT_CAP_MEM_HOST | STRATA_TRANSPORT_CAP_THREAD_SAFE);
  EXPECT_FALSE(caps.flags & STRATA_TRANSPORT_CAP_REQUIRES_MR);
  EXPECT_EQ(caps.preferred_chunk_bytes, 4u << 20);  // both halves are tcp: its preference
}

TEST(AutoTest, AMissingRankIsNamedAtTheDeadline) {
  PluginHost host;
  const std::string name = unique_name("missing");
  run_ranks(2, [&](int rank) {
    Rank r(host, opts(rank == 0 ? "a" : "b"));
    try {
      r.join(name, rank, 3, 400);
      ADD_FAILURE() << "comm_create succeeded without rank 2";
    } catch (const DeadlineExceededError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 never published a host record"), std::string::npos) << e.what();
    }
  });
}

TEST(AutoTest, AbortFromAnotherThreadUnblocksLocalAndRemoteWaits) {
  PluginHost host;
  const std::string name = unique_name("abort");
  std::atomic<bool> done{false};
  const std::vector<std::string> hosts = {"a", "a", "b"};
  run_ranks(3, [&](int rank) {
    Rank r(host, opts(hosts[rank]));
    r.join(name, rank, 3);
    if (rank != 0) {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    struct Done {
      std::atomic<bool>& d;
      ~Done() { d = true; }
    } mark{done};
    uint64_t a = 0, b = 0;
    auto local = r.irecv(1, 9, &a, 8);
    auto remote = r.irecv(2, 9, &b, 8);
    try {
      r.wait(local, 50);
      ADD_FAILURE() << "wait returned without a message";
    } catch (const DeadlineExceededError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 (host a, via tcp as its local rank 1)"), std::string::npos)
          << e.what();
    }
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      r.abort("test says stop");
    });
    const auto t0 = Clock::now();
    for (auto q : {local, remote}) {
      try {
        r.wait(q, 20000);
        ADD_FAILURE() << "wait returned after abort";
      } catch (const AbortedError& e) {
        EXPECT_NE(std::string(e.what()).find("test says stop"), std::string::npos) << e.what();
      }
    }
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
    aborter.join();
    EXPECT_THROW(r.wait(r.isend(2, 1, &a, 8)), AbortedError);
  });
}

TEST(AutoTest, APeerErrorNamesTheGlobalRank) {
  PluginHost host;
  const std::string name = unique_name("peer-error");
  std::atomic<int> posted{0}, finished{0};
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  run_ranks(4, [&](int rank) {
    Rank r(host, opts(hosts[rank]));
    r.join(name, rank, 4);
    uint64_t v = 0;
    if (rank == 3 || rank == 0) {
      // Rank 3 waits on its same-host peer (local rank 0 there), rank 0 on
      // an off-host one; both peers leave without sending.
      auto q = r.irecv(2, 4, &v, 8);
      posted++;
      try {
        r.wait(q, 10000);
        ADD_FAILURE() << "receive from a departed peer succeeded";
      } catch (const Error& e) {
        const std::string want = rank == 3 ? "rank 2 (host b, via tcp as its local rank 0)"
                                           : "rank 2 (host b, via tcp across hosts)";
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        EXPECT_EQ(e.code(), STRATA_ERR_UNAVAILABLE) << e.what();
      }
      EXPECT_THROW(r.isend(5, 0, &v, 8), InvalidArgumentError);
      EXPECT_THROW(r.irecv(rank, 0, &v, 8), InvalidArgumentError);
      finished++;
    } else {
      // Rank 2 leaves once both receives are posted; rank 1 stays until the
      // others are done so that only rank 2's departure is observed.
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      std::atomic<int>& until = rank == 2 ? posted : finished;
      while (until.load() < 2 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      r.leave();
    }
  });
}

TEST(AutoTest, TestNeverBlocksAndCancelReleases) {
  PluginHost host;
  const std::string name = unique_name("test-cancel");
  const std::vector<std::string> hosts = {"a", "b"};
  run_ranks(2, [&](int rank) {
    Rank r(host, opts(hosts[rank]));
    r.join(name, rank, 2);
    uint64_t v = 0, n = 0;
    const int peer = 1 - rank;
    auto q = r.irecv(peer, 77, &v, 8);
    const auto t0 = Clock::now();
    EXPECT_FALSE(r.test(q, &n));
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));
    r.cancel(q);
    EXPECT_THROW(r.wait(q, 10), InvalidArgumentError);  // released
    // Still usable afterwards.
    uint64_t out = 40 + rank;
    auto rq = r.irecv(peer, 78, &v, 8);
    auto sq = r.isend(peer, 78, &out, 8);
    bool done = false;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!(done = r.test(rq, &n)) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(done);
    EXPECT_EQ(n, 8u);
    EXPECT_EQ(v, uint64_t(40 + peer));
    r.wait(sq);
  });
}

// ------------------------------------------------------ forked processes ---

TEST(AutoTest, ForkedProcessesOnTwoHostsOverTheTcpStore) {
  const std::string store = "127.0.0.1:" + std::to_string(unused_port());
  constexpr int kWorld = 4;
  const char* kHosts[kWorld] = {"a", "a", "b", "b"};
  auto body = [&](PluginHost& host, int rank) -> int {
    Rank r(host, opts(kHosts[rank]));
    r.join("auto-forked", rank, kWorld);
    constexpr uint64_t kBytes = (1u << 20) + 3;
    std::vector<uint8_t> out(kBytes);
    fill_pattern(out.data(), kBytes, rank);
    std::vector<std::vector<uint8_t>> in(kWorld, std::vector<uint8_t>(kBytes));
    std::vector<strata_request_t> rq(kWorld), sq;
    for (int p = 0; p < kWorld; ++p)
      if (p != rank) rq[p] = r.irecv(p, 1, in[p].data(), kBytes);
    for (int p = 0; p < kWorld; ++p)
      if (p != rank) sq.push_back(r.isend(p, 1, out.data(), kBytes));
    for (auto q : sq) r.wait(q);
    for (int p = 0; p < kWorld; ++p) {
      if (p == rank) continue;
      if (r.wait(rq[p]) != kBytes) return 3;
      if (pattern_mismatch(in[p].data(), kBytes, p) != kBytes) return 4;
    }
    // Barrier so nobody closes while a peer still reads.
    uint8_t b = 0;
    std::vector<strata_request_t> bs;
    for (int p = 0; p < kWorld; ++p)
      if (p != rank) bs.push_back(r.isend(p, 2, &b, 1));
    for (int p = 0; p < kWorld; ++p)
      if (p != rank) r.wait(r.irecv(p, 2, &b, 1));
    for (auto q : bs) r.wait(q);
    return 0;
  };
  test::run_forked_world(kWorld, store, body, [](PluginHost& host) {
    expect_routes(host, "auto-forked", {"a", "a", "b", "b"});
  });
}

}  // namespace
}  // namespace strata
