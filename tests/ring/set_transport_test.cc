// SPDX-License-Identifier: Apache-2.0
// set_transport (ABI 1.2) of the ring CrossDeviceOps, with ranks as threads
// of this process over the in-process fixture transport and over tcp (when
// built), driven through the C vtable the plugin host hands out; plus the
// C++ API's StrategyExtended::set_transport on strategies without a
// transport. What is checked: a swap mid-sequence changes no result bit;
// every failure (unknown transport, bad options, ranks asking for different
// things, a rank that never asks) is the same error on every rank, and the
// old transport keeps working afterwards; started all-reduces are drained
// before the switch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"
#include "strata/strata.hpp"
#include "test_support.h"

namespace strata::test {
namespace {

using nlohmann::json;

struct Status {
  strata_status_t code = STRATA_OK;
  std::string message;
};

template <class F>
Status call(F f) {
  strata_error err;
  strata_error_init(&err);
  Status s;
  s.code = f(&err);
  if (s.code != STRATA_OK) s.message = err.message;
  return s;
}

// A float32 tensor of `n` elements, values that make the summation order
// visible in the low bits (so a reordered reduction would show).
struct Buf {
  std::vector<float> v;
  std::vector<int64_t> shape;
  DLTensor t{};
  explicit Buf(size_t n) : v(n), shape{int64_t(n)} {
    t = DLTensor{v.data(), {kDLCPU, 0}, 1, DLDataType{kDLFloat, 32, 1}, shape.data(), nullptr, 0};
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void fill(uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& x : v) x = d(gen) * 1e-3f + d(gen);
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b(v.size() * sizeof(float));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
};

class Cdo {
 public:
  explicit Cdo(const std::string& options)
      : inst_(PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, "ring", options)),
        vt_(inst_.vtable_as<strata_cross_device_ops_vtable>()),
        h_(static_cast<strata_cross_device_ops_t>(inst_.handle())) {}
  const strata_cross_device_ops_vtable* vt() const { return vt_; }
  strata_cross_device_ops_t h() const { return h_; }

  // all_reduce(SUM) of `nr` local replicas' buffers, outputs in place.
  Status all_reduce(std::vector<Buf*> bufs) {
    std::vector<const DLTensor*> in;
    std::vector<DLTensor*> out;
    for (Buf* b : bufs) {
      in.push_back(&b->t);
      out.push_back(&b->t);
    }
    return call([&](strata_error* e) {
      return vt_->all_reduce(h_, STRATA_REDUCE_SUM, 1, uint32_t(bufs.size()), in.data(), out.data(), e);
    });
  }
  Status set_transport(const std::string& name, const char* options) {
    return call([&](strata_error* e) { return vt_->set_transport(h_, name.c_str(), options, e); });
  }

 private:
  PluginInstance inst_;
  const strata_cross_device_ops_vtable* vt_;
  strata_cross_device_ops_t h_;
};

std::atomic<int> g_comm_id{0};
std::string unique_comm(const std::string& what) {
  return "swaptest-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(g_comm_id++);
}

// Run body(rank, cdo) on `n` threads, each with its own ring instance on
// communicator `comm` over `transport`.
void run_world(const std::string& transport, int n, const std::string& comm, const json& extra,
               const std::function<void(int, Cdo&)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        json o = {{"transport", {{"name", transport}}}, {"rank", r}, {"world_size", n}, {"communicator", comm}};
        for (auto it = extra.begin(); it != extra.end(); ++it) o[it.key()] = it.value();
        Cdo cdo(o.dump());
        body(r, cdo);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
}

std::string plugin_dir() { return std::filesystem::path(RING_PLUGIN).parent_path().string(); }
std::string libfabric_plugin() { return plugin_dir() + "/libstrata-transport-libfabric.so"; }

void load_plugins() {
  static bool done = [] {
    PluginHost::global().load_explicit(RING_PLUGIN);
    PluginHost::global().load_explicit(RING_INPROC_TRANSPORT);
#ifdef RING_HAVE_TCP
    PluginHost::global().load_explicit(RING_TCP_TRANSPORT);
#endif
    return true;
  }();
  (void)done;
}

json last_collectives() { return json::parse(PluginHost::global().last_collectives_json()); }

// Each transport under test and a differently configured instance of it
// to switch to (distinct options make a distinct instance).
struct Swap {
  std::string name;
  std::string other_options;
};

std::vector<std::string> transports() {
  std::vector<std::string> v{"ring_test_inproc"};
#ifdef RING_HAVE_TCP
  v.push_back("tcp");
#endif
  return v;
}

std::string other_options(const std::string& transport) {
  // Registered memory on the fixture; one connection per peer instead of 2 on tcp.
  return transport == "tcp" ? R"({"connections_per_peer": 1})" : R"({"requires_mr": true})";
}

class SetTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { load_plugins(); }
  const std::string& transport() const { return GetParam(); }
};

// Per rank, per step: the bytes of every replica's result.
using Trace = std::vector<std::vector<std::vector<unsigned char>>>;

// Six all-reduces (small ones take the direct path, large ones the ring;
// two local replicas), with set_transport(swaps[k]) before step k when
// present.
Trace run_steps(const std::string& transport, const std::string& comm,
                const std::vector<std::pair<int, Swap>>& swaps) {
  const int n = 3;
  const std::vector<size_t> sizes = {100, 50000, 7, 70001, 2000, 40000};
  Trace trace(size_t(n), std::vector<std::vector<unsigned char>>(sizes.size()));
  run_world(transport, n, comm, {{"chunk_bytes", 16384}}, [&](int rank, Cdo& cdo) {
    for (size_t step = 0; step < sizes.size(); ++step) {
      for (const auto& [at, sw] : swaps)
        if (size_t(at) == step) {
          Status s = cdo.set_transport(sw.name, sw.other_options.c_str());
          ASSERT_EQ(s.code, STRATA_OK) << "rank " << rank << " step " << step << ": " << s.message;
        }
      Buf a(sizes[step]), b(sizes[step]);
      a.fill(uint32_t(rank * 1000 + step * 10));
      b.fill(uint32_t(rank * 1000 + step * 10 + 1));
      Status s = cdo.all_reduce({&a, &b});
      ASSERT_EQ(s.code, STRATA_OK) << "rank " << rank << " step " << step << ": " << s.message;
      ASSERT_EQ(a.bytes(), b.bytes()) << "replicas differ on rank " << rank;
      trace[size_t(rank)][step] = a.bytes();
    }
  });
  return trace;
}

TEST_P(SetTransportTest, SwapMidSequenceChangesNoResultBit) {
  const std::string plain = unique_comm("plain");
  const Trace ref = run_steps(transport(), plain, {});
  const std::string swapped = unique_comm("swapped");
  // Away to another instance, then back to the first kind with other options.
  const Trace got = run_steps(transport(), swapped,
                              {{2, {transport(), other_options(transport())}}, {4, {transport(), "{}"}}});
  ASSERT_FALSE(::testing::Test::HasFailure());
  for (size_t r = 0; r < ref.size(); ++r)
    for (size_t step = 0; step < ref[r].size(); ++step) {
      EXPECT_EQ(got[r][step], ref[r][step]) << "rank " << r << " step " << step;
      EXPECT_EQ(got[r][step], got[0][step]) << "rank " << r << " differs from rank 0 at step " << step;
    }
  // The collectives after each swap ran on the new communicators.
  const json last = last_collectives();
  ASSERT_TRUE(last.contains(swapped + "/swap1")) << last.dump();
  ASSERT_TRUE(last.contains(swapped + "/swap2")) << last.dump();
  EXPECT_EQ(last[swapped]["sequence"].get<uint64_t>(), 1u) << "steps 0 and 1 on the first communicator";
  EXPECT_EQ(last[swapped + "/swap1"]["sequence"].get<uint64_t>(), 1u) << "steps 2 and 3 after the first swap";
  EXPECT_EQ(last[swapped + "/swap2"]["sequence"].get<uint64_t>(), 1u) << "steps 4 and 5 after the second swap";
}

// Checks every rank got the same failure and returns it.
Status same_everywhere(const std::vector<Status>& got) {
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_NE(got[r].code, STRATA_OK) << "rank " << r << " succeeded";
    EXPECT_EQ(got[r].code, got[0].code) << "rank " << r;
    EXPECT_EQ(got[r].message, got[0].message) << "rank " << r;
  }
  return got.empty() ? Status{} : got[0];
}

// A small all-reduce whose result every rank can check: sum of rank + 1.
void expect_collective_works(Cdo& cdo, int rank, int n, const char* when) {
  Buf x(5);
  for (float& v : x.v) v = float(rank + 1);
  Status s = cdo.all_reduce({&x});
  ASSERT_EQ(s.code, STRATA_OK) << when << ", rank " << rank << ": " << s.message;
  for (float v : x.v) EXPECT_EQ(v, float(n * (n + 1) / 2)) << when << ", rank " << rank;
}

TEST_P(SetTransportTest, FailedSwapFailsEverywhereAndTheOldTransportKeepsWorking) {
  const int n = 3;
  const std::string comm = unique_comm("fail");
  std::vector<Status> unknown(n), bad_options(n), not_json(n);
  run_world(transport(), n, comm, json::object(), [&](int rank, Cdo& cdo) {
    expect_collective_works(cdo, rank, n, "before the swaps");
    unknown[size_t(rank)] = cdo.set_transport("no_such_transport", "{}");
    expect_collective_works(cdo, rank, n, "after the unknown transport");
    bad_options[size_t(rank)] = cdo.set_transport(transport(), R"({"no_such_option": 1})");
    expect_collective_works(cdo, rank, n, "after the bad options");
    not_json[size_t(rank)] = cdo.set_transport(transport(), "{not json");
    expect_collective_works(cdo, rank, n, "after the malformed options");
    // The swap counter stayed in step on every rank: the fourth one works.
    Status ok = cdo.set_transport(transport(), other_options(transport()).c_str());
    ASSERT_EQ(ok.code, STRATA_OK) << "rank " << rank << ": " << ok.message;
    expect_collective_works(cdo, rank, n, "after the successful swap");
  });
  const Status u = same_everywhere(unknown);
  EXPECT_EQ(u.code, STRATA_ERR_NOT_FOUND) << u.message;
  EXPECT_NE(u.message.find("no_such_transport"), std::string::npos) << u.message;
  EXPECT_NE(u.message.find("ranks 0, 1, 2"), std::string::npos) << "names the ranks: " << u.message;
  EXPECT_NE(u.message.find("stays on transport '" + transport() + "'"), std::string::npos) << u.message;
  const Status b = same_everywhere(bad_options);
  EXPECT_EQ(b.code, STRATA_ERR_INVALID_ARGUMENT) << b.message;
  EXPECT_NE(b.message.find("no_such_option"), std::string::npos) << b.message;
  const Status j = same_everywhere(not_json);
  EXPECT_EQ(j.code, STRATA_ERR_INVALID_ARGUMENT) << j.message;
  EXPECT_NE(j.message.find("not a JSON object"), std::string::npos) << j.message;
  const json last = last_collectives();
  EXPECT_EQ(last[comm]["sequence"].get<uint64_t>(), 3u) << "four collectives on the old communicator";
  for (int k = 1; k <= 3; ++k)
    EXPECT_FALSE(last.contains(comm + "/swap" + std::to_string(k))) << "failed swap " << k << " left a communicator";
  ASSERT_TRUE(last.contains(comm + "/swap4")) << last.dump();
  EXPECT_EQ(last[comm + "/swap4"]["sequence"].get<uint64_t>(), 0u);
}

TEST_P(SetTransportTest, DifferentRequestsFailEverywhereNamingEachRank) {
  const int n = 3;
  const std::string comm = unique_comm("differ");
  std::vector<Status> got(n), malformed(n);
  run_world(transport(), n, comm, json::object(), [&](int rank, Cdo& cdo) {
    const std::string name = rank == 1 ? "other_transport" : transport();
    const char* options = rank == 2 ? R"({"b": 2, "a": 1})" : "{}";
    got[size_t(rank)] = cdo.set_transport(name, options);
    expect_collective_works(cdo, rank, n, "after the disagreement");
    // Key order and spacing do not matter; one malformed text does.
    malformed[size_t(rank)] = cdo.set_transport(transport(), rank == 0 ? "{\"a\":1,\"b\":2}"
                                                             : rank == 1 ? "{\"b\": 2, \"a\": 1}"
                                                                         : "{\"a\": 1, \"b\": 2");
    expect_collective_works(cdo, rank, n, "after the malformed request");
  });
  const Status s = same_everywhere(got);
  EXPECT_EQ(s.code, STRATA_ERR_INVALID_ARGUMENT) << s.message;
  EXPECT_NE(s.message.find("rank 0 asked for '" + transport() + "' {}"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("rank 1 asked for 'other_transport' {}"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("rank 2 asked for '" + transport() + "' {\"a\":1,\"b\":2}"), std::string::npos)
      << s.message;
  const Status m = same_everywhere(malformed);
  EXPECT_EQ(m.code, STRATA_ERR_INVALID_ARGUMENT) << m.message;
  EXPECT_NE(m.message.find("ranks 0, 1 asked for '" + transport() + "' {\"a\":1,\"b\":2}"), std::string::npos)
      << m.message;
  EXPECT_NE(m.message.find("rank 2 asked for"), std::string::npos) << m.message;
  EXPECT_FALSE(last_collectives().contains(comm + "/swap1"));
}

TEST_P(SetTransportTest, StartedAllReducesFinishBeforeTheSwap) {
  const int n = 3;
  const std::string comm = unique_comm("drain");
  const std::vector<size_t> sizes = {5, 60000, 7, 30000};
  run_world(transport(), n, comm, {{"chunk_bytes", 8192}}, [&](int rank, Cdo& cdo) {
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<std::vector<const DLTensor*>> ins;
    std::vector<std::vector<DLTensor*>> outs;
    std::vector<strata_cdo_request_t> reqs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      bufs.push_back(std::make_unique<Buf>(sizes[k]));
      for (size_t i = 0; i < sizes[k]; ++i) bufs.back()->v[i] = float((rank + 1) * int(k + 1));
      ins.push_back({&bufs.back()->t});
      outs.push_back({&bufs.back()->t});
      strata_cdo_request_t req = nullptr;
      Status s = call([&](strata_error* e) {
        return cdo.vt()->all_reduce_start(cdo.h(), STRATA_REDUCE_SUM, 1, 1, ins.back().data(), outs.back().data(),
                                          &req, e);
      });
      ASSERT_EQ(s.code, STRATA_OK) << s.message;
      reqs.push_back(req);
    }
    // Not waited for yet: set_transport must let them finish on the old communicator.
    Status sw = cdo.set_transport(transport(), other_options(transport()).c_str());
    ASSERT_EQ(sw.code, STRATA_OK) << "rank " << rank << ": " << sw.message;
    for (size_t k = 0; k < sizes.size(); ++k) {
      Status s = call([&](strata_error* e) { return cdo.vt()->request_wait(cdo.h(), reqs[k], 0, e); });
      ASSERT_EQ(s.code, STRATA_OK) << "request " << k << " was not finished by set_transport: " << s.message;
      for (float v : bufs[k]->v) ASSERT_EQ(v, float(n * (n + 1) / 2 * int(k + 1))) << "request " << k;
    }
    expect_collective_works(cdo, rank, n, "after the swap");
  });
  const json last = last_collectives();
  EXPECT_EQ(last[comm]["sequence"].get<uint64_t>(), 3u) << "the four started all-reduces ran on the old one";
  ASSERT_TRUE(last.contains(comm + "/swap1")) << last.dump();
  EXPECT_EQ(last[comm + "/swap1"]["sequence"].get<uint64_t>(), 0u);
}

#ifdef RING_TEST_SANITIZED
constexpr double kShortTimeoutS = 5;  // the rendezvous of the communicator needs the same deadline
#else
constexpr double kShortTimeoutS = 2;
#endif

TEST_P(SetTransportTest, RankThatNeverAsksIsADeadlineNamingIt) {
  const int n = 3;
  const std::string comm = unique_comm("absent");
  std::vector<Status> got(n);
  const auto start = std::chrono::steady_clock::now();
  run_world(transport(), n, comm, {{"timeout_s", kShortTimeoutS}}, [&](int rank, Cdo& cdo) {
    if (rank == 2) return;  // never calls set_transport
    got[size_t(rank)] = cdo.set_transport(transport(), other_options(transport()).c_str());
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 4 * kShortTimeoutS) << "bounded by the collective deadline";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[size_t(r)].code, STRATA_ERR_DEADLINE_EXCEEDED) << got[size_t(r)].message;
    EXPECT_NE(got[size_t(r)].message.find("rank 2 did not publish its request"), std::string::npos)
        << got[size_t(r)].message;
  }
}

// One fixed port for every rank's new tcp communicator: one rank binds it
// and then waits out the rendezvous, the others fail at once. Every rank
// must still get the same verdict, and keep the old communicator.
TEST_P(SetTransportTest, CommunicatorThatSomeRanksCannotBuildFailsEverywhere) {
  if (transport() != "tcp") GTEST_SKIP() << "needs tcp's 'ports' option";
  const int n = 3;
  const std::string comm = unique_comm("nobuild");
  const std::string ports = json{{"ports", std::to_string(unused_port())}}.dump();
  std::vector<Status> got(n);
  const auto start = std::chrono::steady_clock::now();
  run_world(transport(), n, comm, {{"timeout_s", kShortTimeoutS}}, [&](int rank, Cdo& cdo) {
    got[size_t(rank)] = cdo.set_transport("tcp", ports.c_str());
    expect_collective_works(cdo, rank, n, "after the failed build");
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 4 * kShortTimeoutS) << "bounded by the collective deadline";
  const Status s = same_everywhere(got);
  EXPECT_NE(s.message.find("joining communicator '" + comm + "/swap1'"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("is free"), std::string::npos) << "names the cause: " << s.message;
  EXPECT_EQ(last_collectives()[comm]["sequence"].get<uint64_t>(), 0u) << "the old communicator ran the check";
  RecordProperty("message", s.message);
}

TEST_P(SetTransportTest, OneProcessChecksTheTransportExists) {
  Cdo cdo(json{{"rank", 0}, {"world_size", 1}}.dump());
  Status ok = cdo.set_transport(transport(), nullptr);
  EXPECT_EQ(ok.code, STRATA_OK) << ok.message;
  Status bad = cdo.set_transport("no_such_transport", "{}");
  EXPECT_EQ(bad.code, STRATA_ERR_NOT_FOUND) << bad.message;
  EXPECT_NE(bad.message.find("no_such_transport"), std::string::npos) << bad.message;
  Status nul = call([&](strata_error* e) { return cdo.vt()->set_transport(cdo.h(), nullptr, "{}", e); });
  EXPECT_EQ(nul.code, STRATA_ERR_INVALID_ARGUMENT) << nul.message;
}

INSTANTIATE_TEST_SUITE_P(Transports, SetTransportTest, ::testing::ValuesIn(transports()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// tcp -> libfabric (tcp;ofi_rxm) -> libfabric (shm) -> tcp, once the
// libfabric transport is built next to the ring plugin.
TEST(SetTransportLibfabricTest, TcpToLibfabricAndBackChangesNoResultBit) {
#ifndef RING_HAVE_TCP
  GTEST_SKIP() << "the tcp transport is not built";
#else
  if (!std::filesystem::exists(libfabric_plugin())) GTEST_SKIP() << libfabric_plugin() << " is not built";
  load_plugins();
  PluginHost::global().load_explicit(libfabric_plugin());
  const Trace ref = run_steps("tcp", unique_comm("lf-plain"), {});
  const std::string comm = unique_comm("lf-swapped");
  const Trace got = run_steps("tcp", comm,
                              {{1, {"libfabric", R"({"provider": "tcp;ofi_rxm"})"}},
                               {3, {"libfabric", R"({"provider": "shm"})"}},
                               {5, {"tcp", "{}"}}});
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(got, ref);
  const json last = last_collectives();
  for (const char* k : {"/swap1", "/swap2", "/swap3"}) EXPECT_TRUE(last.contains(comm + k)) << last.dump();
#endif
}

// ------------------------------------------------------------- C++ API ---

TEST(SetTransportApiTest, StrategiesWithoutATransportAreUnimplemented) {
  for (const auto& [name, options] : std::vector<std::pair<std::string, std::string>>{
           {"mirrored", R"({"devices": ["cpu:0", "cpu:1"]})"}, {"one_device", "{}"}, {"default", "{}"}}) {
    Strategy s = Strategy::create(name, options);
    try {
      s.extended().set_transport("tcp");
      ADD_FAILURE() << name << ": set_transport succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), STRATA_ERR_UNIMPLEMENTED) << name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(SetTransportApiTest, SingleWorkerMultiWorkerMirroredChecksTheTransport) {
  load_plugins();
  Strategy s = Strategy::create("multi_worker_mirrored", "{}");
  EXPECT_NO_THROW(s.extended().set_transport("tcp", R"({"connections_per_peer": 1})"));
  try {
    s.extended().set_transport("no_such_transport");
    ADD_FAILURE() << "set_transport to an unknown transport succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), STRATA_ERR_NOT_FOUND) << e.what();
    EXPECT_NE(std::string(e.what()).find("no_such_transport"), std::string::npos) << e.what();
  }
  // Inside a replica function it is a cross-replica call out of place.
  bool threw = false;
  s.run([&](ReplicaContext&) {
    try {
      s.extended().set_transport("tcp");
    } catch (const Error& e) {
      threw = e.code() == STRATA_ERR_FAILED_PRECONDITION;
    }
  });
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace strata::test
