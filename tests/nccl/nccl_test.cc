// SPDX-License-Identifier: Apache-2.0
// Tests of the "nccl" transport plugin that need no GPU: the plugin loads
// through the plugin host and reports its caps, its options are validated,
// comm_create without a GPU fails at once saying so, and the ranks agree on
// the NCCL unique id through the host store (ranks as threads sharing the
// in-process store), naming the ranks that never come. The collectives
// themselves are in nccl_gpu_test.cc (label gpu).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench_runner.h"
#include "nccl_rendezvous.h"
#include "strata/error.hpp"
#include "strata/plugin_host.hpp"
#include "strata/sdk/host.hpp"
#include "strata/sdk/rendezvous.hpp"
#include "test_support.h"
#include "transport_test_support.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
using test::run_ranks;
using test::TransportRank;
using test::unique_name;

bool gpu_visible() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

using test::contains;

TEST(NcclTest, LoadsAndReportsCaps) {
  PluginHost host;
  bool listed = false;
  for (const PluginInfo& i : host.discover())
    if (i.kind == "transport" && i.name == "nccl") {
      listed = true;
      EXPECT_TRUE(i.ok) << i.error;
      EXPECT_NE(i.path.find("libstrata-transport-nccl.so"), std::string::npos) << i.path;
    }
  EXPECT_TRUE(listed) << "the nccl transport plugin was not discovered";

  TransportRank r(host, "nccl", "{}");
  const strata_transport_caps c = r.caps();
  EXPECT_EQ(c.flags, STRATA_TRANSPORT_CAP_NATIVE_COLLECTIVES | STRATA_TRANSPORT_CAP_MEM_CUDA |
                         STRATA_TRANSPORT_CAP_THREAD_SAFE);
  EXPECT_EQ(c.flags & STRATA_TRANSPORT_CAP_P2P, 0u);
  EXPECT_EQ(c.flags & STRATA_TRANSPORT_CAP_REQUIRES_MR, 0u);
  const strata_transport_vtable* vt = r.vt();
  // Function pointers are compared one by one (no cast to void* needed).
  EXPECT_NE(vt->create, nullptr);
  EXPECT_NE(vt->destroy, nullptr);
  EXPECT_NE(vt->get_caps, nullptr);
  EXPECT_NE(vt->comm_create, nullptr);
  EXPECT_NE(vt->comm_destroy, nullptr);
  EXPECT_NE(vt->comm_abort, nullptr);
  EXPECT_NE(vt->mem_register, nullptr);
  EXPECT_NE(vt->mem_deregister, nullptr);
  EXPECT_NE(vt->isend, nullptr);
  EXPECT_NE(vt->irecv, nullptr);
  EXPECT_NE(vt->test, nullptr);
  EXPECT_NE(vt->wait, nullptr);
  EXPECT_NE(vt->cancel, nullptr);
  EXPECT_NE(vt->all_reduce, nullptr);
  EXPECT_NE(vt->broadcast, nullptr);
  EXPECT_NE(vt->all_gather, nullptr);
  EXPECT_NE(vt->reduce_scatter, nullptr);
  EXPECT_EQ(vt->mem_export, nullptr);  // no RMA
}

TEST(NcclTest, OptionsAreValidated) {
  PluginHost host;
  try {
    TransportRank r(host, "nccl", R"({"bogus": 1})");
    FAIL() << "unknown option accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "'bogus'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "device, timeout_s, setup_timeout_s")) << e.what();
  }
  try {
    TransportRank r(host, "nccl", R"({"device": -1})");
    FAIL() << "device -1 accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "'device'")) << e.what();
  }
  try {
    TransportRank r(host, "nccl", R"({"device": "0"})");
    FAIL() << "device \"0\" (a string) accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "'device'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "integer")) << e.what();
  }
  EXPECT_THROW(TransportRank(host, "nccl", R"({"timeout_s": 0})"), InvalidArgumentError);
  EXPECT_THROW(TransportRank(host, "nccl", R"({"setup_timeout_s": -1})"), InvalidArgumentError);
  EXPECT_THROW(TransportRank(host, "nccl", R"({"timeout_s": "fast"})"), InvalidArgumentError);
  EXPECT_THROW(TransportRank(host, "nccl", R"({"watch_enqueued": "no"})"), InvalidArgumentError);
  TransportRank unwatched(host, "nccl", R"({"watch_enqueued": false})");
  EXPECT_THROW(TransportRank(host, "nccl", R"([1, 2])"), InvalidArgumentError);
  EXPECT_THROW(TransportRank(host, "nccl", R"({"device": )"), InvalidArgumentError);
  // Creating the transport touches no GPU (strata-info lists it anywhere).
  TransportRank ok(host, "nccl", R"({"device": 0, "timeout_s": 5, "setup_timeout_s": 2.5})");
  TransportRank defaults(host, "nccl", "");
}

TEST(NcclTest, CommCreateWithoutGpuSaysSo) {
  if (gpu_visible()) GTEST_SKIP() << "a CUDA device is visible: this test is for machines without one";
  int n = 0;
  const cudaError_t cuda_error = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  PluginHost host;
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      TransportRank r(host, "nccl", "{}");
      const auto t0 = Clock::now();
      try {
        // world 2 with the peer absent: the missing GPU is reported at once,
        // before any wait for the peer.
        r.join(unique_name("nccl-nogpu"), rank, world, 20000);
        FAIL() << "comm_create succeeded without a GPU";
      } catch (const FailedPreconditionError& e) {
        const std::string m = e.what();
        EXPECT_TRUE(contains(m, "no GPU is visible")) << m;
        EXPECT_TRUE(contains(m, "nvidia-smi")) << m;
        EXPECT_TRUE(contains(m, "CUDA_VISIBLE_DEVICES")) << m;
        EXPECT_TRUE(contains(m, "driver")) << m;
        if (cuda_error != cudaSuccess) {
          EXPECT_TRUE(contains(m, cudaGetErrorString(cuda_error))) << m;
        }
        EXPECT_TRUE(contains(m, "rank " + std::to_string(rank) + " of " + std::to_string(world))) << m;
      }
      EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << "world " << world << " rank " << rank;
    }
  }
}

TEST(NcclTest, CommCreateArgumentsAreChecked) {
  PluginHost host;
  TransportRank r(host, "nccl", "{}");
  EXPECT_THROW(r.join("", 0, 1), InvalidArgumentError);
  EXPECT_THROW(r.join(unique_name("nccl-args"), 2, 2), InvalidArgumentError);
  EXPECT_THROW(r.join(unique_name("nccl-args"), 0, 0), InvalidArgumentError);
}

// The unique-id exchange (nccl_rendezvous.h) with a real ncclGetUniqueId,
// which needs no GPU (only a network interface for NCCL's bootstrap).
std::string real_unique_id() {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  EXPECT_EQ(r, ncclSuccess) << ncclGetErrorString(r);
  return std::string(reinterpret_cast<const char*>(&uid), sizeof uid);
}

TEST(NcclRendezvousTest, RanksAgreeOnRankZerosUniqueId) {
  PluginHost host;
  const sdk::Host h(host.host_api(), "test");
  const std::string id = real_unique_id();
  ASSERT_EQ(id.size(), sizeof(ncclUniqueId));
  for (int world : {1, 2, 4}) {
    const std::string name = unique_name("nccl-uid");
    std::vector<std::string> got(static_cast<size_t>(world));
    run_ranks(world, [&](int rank) {
      got[static_cast<size_t>(rank)] = transport::nccl::exchange_unique_id(
          h, name, rank, world, 20000, rank == 0 ? id : std::string(), sizeof(ncclUniqueId), "test");
    });
    for (int rank = 0; rank < world; ++rank) EXPECT_EQ(got[static_cast<size_t>(rank)], id) << "rank " << rank;
    if (world > 1) {
      EXPECT_EQ(test::store_get(host.host_api(), transport::nccl::unique_id_key(name), 0), id);
    }
  }
}

TEST(NcclRendezvousTest, MissingRanksAreNamed) {
  PluginHost host;
  const sdk::Host h(host.host_api(), "test");
  const std::string id = real_unique_id();
  const std::string name = unique_name("nccl-missing");
  // World 3, rank 1 never comes: ranks 0 and 2 fail naming it, within their deadline.
  std::vector<std::string> errors(3);
  const auto t0 = Clock::now();
  run_ranks(3, [&](int rank) {
    if (rank == 1) return;
    try {
      transport::nccl::exchange_unique_id(h, name, rank, 3, 1500, rank == 0 ? id : std::string(),
                                          sizeof(ncclUniqueId), "nccl test rank " + std::to_string(rank));
      errors[static_cast<size_t>(rank)] = "(no error)";
    } catch (const DeadlineExceededError& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  for (int rank : {0, 2}) {
    const std::string& m = errors[static_cast<size_t>(rank)];
    EXPECT_TRUE(contains(m, "rank 1 of 3 never joined communicator '" + name + "'")) << m;
    EXPECT_TRUE(contains(m, "nccl test rank " + std::to_string(rank))) << m;
  }
}

TEST(NcclRendezvousTest, MissingRankZeroIsNamed) {
  PluginHost host;
  const sdk::Host h(host.host_api(), "test");
  const std::string name = unique_name("nccl-norank0");
  try {
    transport::nccl::exchange_unique_id(h, name, 1, 2, 1000, "", sizeof(ncclUniqueId), "nccl test rank 1");
    FAIL() << "rank 1 got an id although rank 0 never came";
  } catch (const DeadlineExceededError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 0 of 2 never joined communicator '" + name + "'")) << e.what();
  }
}

TEST(NcclRendezvousTest, ForeignValueUnderTheKeyIsDataLoss) {
  PluginHost host;
  const sdk::Host h(host.host_api(), "test");
  const std::string name = unique_name("nccl-foreign");
  // Rank 0 of another program put something else under the key.
  run_ranks(2, [&](int rank) {
    if (rank == 0) {
      h.store_set(transport::nccl::unique_id_key(name), "not an id", 1000);
      sdk::rendezvous_gate(h, name, 0, 2, 5000, "foreign rank 0");
      return;
    }
    try {
      transport::nccl::exchange_unique_id(h, name, 1, 2, 5000, "", sizeof(ncclUniqueId), "nccl test rank 1");
      ADD_FAILURE() << "a 9-byte id was accepted";
    } catch (const DataLossError& e) {
      EXPECT_TRUE(contains(e.what(), "9 bytes")) << e.what();
    }
  });
}

TEST(NcclBenchTest, GpuBenchWithoutGpuFailsClearly) {
  if (gpu_visible()) GTEST_SKIP() << "a CUDA device is visible: this test is for machines without one";
  for (const char* args : {"allreduce --device gpu --sizes 4K", "allreduce --device gpu -n 1 --sizes 4K",
                           "allreduce --device gpu -n 2 --sizes 4K --json"}) {
    SCOPED_TRACE(args);
    const auto t0 = Clock::now();
    const test::BenchRun r = test::run_strata_bench(args, 60);
    EXPECT_NE(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.status, 124) << "strata-bench hung without a GPU";
    EXPECT_TRUE(contains(r.err, "no GPU is visible")) << r.err;
    EXPECT_TRUE(contains(r.err, "nvidia-smi")) << r.err;
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  }
}

}  // namespace
}  // namespace strata
