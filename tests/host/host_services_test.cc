// SPDX-License-Identifier: Apache-2.0
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"
#include "test_support.h"
#include "test_util.h"

namespace strata {
namespace {

using test::append_to_string;
using test::fixture_dir;
using test::ScopedEnv;

using test::contains;

class HostServicesTest : public ::testing::Test {
 protected:
  HostServicesTest() { strata_error_init(&err_); }
  PluginHost host_;
  const strata_host_api* api_ = host_.host_api();
  strata_error err_;
};

TEST_F(HostServicesTest, TableIsCompleteAndCurrent) {
  EXPECT_EQ(api_->struct_size, STRATA_HOST_API_STRUCT_SIZE);
  EXPECT_EQ(api_->abi_minor, static_cast<uint32_t>(STRATA_ABI_MINOR));
  EXPECT_EQ(api_->ext, nullptr);
  EXPECT_TRUE(api_->log && api_->get_config && api_->create_plugin && api_->release_plugin && api_->allocate &&
              api_->free_memory && api_->store_set && api_->store_get && api_->store_add && api_->store_wait &&
              api_->now_ns && api_->abort_requested && api_->record_collective);
  ASSERT_TRUE(STRATA_HAS_FIELD(api_, strata_host_api, request_abort));
  EXPECT_NE(api_->request_abort, nullptr);
  // Each host has its own table.
  PluginHost other;
  EXPECT_NE(other.host_api(), api_);
}

TEST_F(HostServicesTest, LogAcceptsNullsAndRepeats) {
  for (int i = 0; i < 5; ++i) api_->log(api_, STRATA_LOG_ERROR, "test.repeat", "same message");
  api_->log(api_, STRATA_LOG_INFO, nullptr, nullptr);
  api_->log(api_, 99, "test", "out-of-range level is treated as critical");
  SUCCEED();
}

TEST_F(HostServicesTest, StoreSetGetRoundTripsBytes) {
  const char value[] = {'a', '\0', 'b'};
  ASSERT_EQ(api_->store_set(api_, "k", value, sizeof(value), 1000, &err_), STRATA_OK);
  std::string out;
  ASSERT_EQ(api_->store_get(api_, "k", append_to_string, &out, 1000, &err_), STRATA_OK) << err_.message;
  EXPECT_EQ(out, std::string(value, sizeof(value)));
  ASSERT_EQ(api_->store_set(api_, "k", "new", 3, 1000, &err_), STRATA_OK);
  out.clear();
  ASSERT_EQ(api_->store_get(api_, "k", append_to_string, &out, 1000, &err_), STRATA_OK);
  EXPECT_EQ(out, "new");
}

TEST_F(HostServicesTest, StoreGetWaitsForALaterSet) {
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    strata_error e;
    strata_error_init(&e);
    api_->store_set(api_, "late", "v", 1, 1000, &e);
  });
  std::string out;
  EXPECT_EQ(api_->store_get(api_, "late", append_to_string, &out, 10000, &err_), STRATA_OK) << err_.message;
  EXPECT_EQ(out, "v");
  setter.join();
}

TEST_F(HostServicesTest, StoreGetDeadlineExpires) {
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(api_->store_get(api_, "never", append_to_string, &out, 50, &err_), STRATA_ERR_DEADLINE_EXCEEDED);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  EXPECT_EQ(err_.code, STRATA_ERR_DEADLINE_EXCEEDED);
  EXPECT_TRUE(contains(err_.message, "'never'")) << err_.message;
  EXPECT_TRUE(contains(err_.message, "50 ms")) << err_.message;
  EXPECT_TRUE(out.empty());
}

TEST_F(HostServicesTest, NegativeTimeoutUsesTheConfiguredRendezvousTimeout) {
  host_.set_config(R"({"timeouts": {"rendezvous_s": 0.05}})");
  std::string out;
  EXPECT_EQ(api_->store_get(api_, "never", append_to_string, &out, -1, &err_), STRATA_ERR_DEADLINE_EXCEEDED);
  const char* keys[] = {"never"};
  EXPECT_EQ(api_->store_wait(api_, keys, 1, STRATA_NO_TIMEOUT, &err_), STRATA_ERR_DEADLINE_EXCEEDED);
}

TEST_F(HostServicesTest, StoreAddIsAtomicAcrossThreads) {
  int64_t result = 0;
  ASSERT_EQ(api_->store_add(api_, "counter", 5, &result, 1000, &err_), STRATA_OK);
  EXPECT_EQ(result, 5);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      strata_error e;
      strata_error_init(&e);
      int64_t r = 0;
      for (int i = 0; i < 100; ++i) api_->store_add(api_, "counter", 1, &r, 1000, &e);
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(api_->store_add(api_, "counter", -5, &result, 1000, &err_), STRATA_OK);
  EXPECT_EQ(result, 400);
  std::string out;
  ASSERT_EQ(api_->store_get(api_, "counter", append_to_string, &out, 1000, &err_), STRATA_OK);
  EXPECT_EQ(out, "400");
  ASSERT_EQ(api_->store_set(api_, "text", "abc", 3, 1000, &err_), STRATA_OK);
  EXPECT_EQ(api_->store_add(api_, "text", 1, &result, 1000, &err_), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err_.message, "not an integer")) << err_.message;
}

TEST_F(HostServicesTest, StoreWaitForSeveralKeysAndReportsMissingOnes) {
  const char* keys[] = {"a", "b", "c"};
  api_->store_set(api_, "a", "1", 1, 1000, &err_);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    strata_error e;
    strata_error_init(&e);
    api_->store_set(api_, "b", "1", 1, 1000, &e);
  });
  EXPECT_EQ(api_->store_wait(api_, keys, 2, 10000, &err_), STRATA_OK) << err_.message;
  setter.join();
  EXPECT_EQ(api_->store_wait(api_, keys, 3, 30, &err_), STRATA_ERR_DEADLINE_EXCEEDED);
  EXPECT_TRUE(contains(err_.message, "keys never set: 'c'")) << err_.message;
  EXPECT_FALSE(contains(err_.message, "'a'")) << err_.message;
}

TEST_F(HostServicesTest, RequestAbortWakesWaitersAndSetsTheFlag) {
  EXPECT_EQ(api_->abort_requested(api_), 0);
  EXPECT_FALSE(host_.abort_requested());
  std::atomic<strata_status_t> st{STRATA_OK};
  std::thread waiter([&] {
    strata_error e;
    strata_error_init(&e);
    std::string out;
    st = api_->store_get(api_, "never", append_to_string, &out, 60000, &e);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  api_->request_abort(api_, "test asked to stop");
  waiter.join();
  EXPECT_EQ(st.load(), STRATA_ERR_ABORTED);
  EXPECT_EQ(api_->abort_requested(api_), 1);
  EXPECT_TRUE(host_.abort_requested());
}

TEST_F(HostServicesTest, AllocateHonoursAlignmentAndDevice) {
  const DLDevice cpu{kDLCPU, 0};
  void* p = api_->allocate(api_, cpu, 100, 0);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 1, 100);
  api_->free_memory(api_, cpu, p);
  p = api_->allocate(api_, cpu, 10, 4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  api_->free_memory(api_, cpu, p);
  p = api_->allocate(api_, cpu, 0, 16);
  EXPECT_NE(p, nullptr);
  api_->free_memory(api_, cpu, p);
  EXPECT_EQ(api_->allocate(api_, cpu, 100, 48), nullptr);  // not a power of two
  // Device memory (ABI 1.4) only where a GPU is visible; tests/gpu covers it.
  int32_t gpus = 0;
  if (api_->device_count(api_, kDLCUDA, &gpus, &err_) != STRATA_OK) {
    EXPECT_EQ(api_->allocate(api_, DLDevice{kDLCUDA, 0}, 100, 0), nullptr);
  }
  EXPECT_EQ(api_->allocate(api_, DLDevice{kDLOpenCL, 0}, 100, 0), nullptr);  // never supported
}

// device_update (ABI 1.5) refuses what it cannot do before touching memory,
// with or without a GPU; tests/gpu checks its arithmetic on a GPU.
TEST_F(HostServicesTest, DeviceUpdateRefusesBadArgumentsAndNamesAMissingGpu) {
  const DLDataType f32{kDLFloat, 32, 1};
  float host_a[4] = {1, 2, 3, 4}, host_b[4] = {1, 1, 1, 1};
  const DLDevice gpu0{kDLCUDA, 0};
  // Not a GPU, an unsupported dtype, an unknown op: INVALID_ARGUMENT naming it.
  EXPECT_EQ(api_->device_update(api_, STRATA_VAR_ASSIGN_ADD, f32, host_a, host_b, 4, DLDevice{kDLCPU, 0}, nullptr,
                                &err_),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err_.message, "must be a GPU")) << err_.message;
  EXPECT_EQ(api_->device_update(api_, STRATA_VAR_ASSIGN_ADD, DLDataType{kDLUInt, 8, 1}, host_a, host_b, 4, gpu0,
                                nullptr, &err_),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err_.message, "not supported")) << err_.message;
  EXPECT_EQ(api_->device_update(api_, 7, f32, host_a, host_b, 4, gpu0, nullptr, &err_), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err_.message, "ASSIGN_ADD")) << err_.message;
  EXPECT_EQ(host_a[0], 1.0f);
  int32_t gpus = 0;
  strata_error count_err;
  strata_error_init(&count_err);
  const strata_status_t have = api_->device_count(api_, kDLCUDA, &gpus, &count_err);
  const strata_status_t st = api_->device_update(api_, STRATA_VAR_ASSIGN_ADD, f32, host_a, host_b, 4, gpu0, nullptr,
                                                 &err_);
  if (have == STRATA_OK) {
    // Host memory handed to a GPU kernel would ruin the CUDA context: refused.
    EXPECT_EQ(st, STRATA_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err_.message, "host memory, not memory of gpu:0")) << err_.message;
  } else {
    // No GPU (or no CUDA in this build): the same status and reason as device_count.
    EXPECT_EQ(st, have) << err_.message;
    EXPECT_TRUE(contains(err_.message, have == STRATA_ERR_UNIMPLEMENTED ? "needs a build with CUDA"
                                                                         : "no CUDA device visible"))
        << err_.message;
  }
  EXPECT_EQ(host_a[0], 1.0f);
}

TEST_F(HostServicesTest, GetConfigByJsonPointer) {
  host_.set_config(R"({"timeouts": {"collective_s": 300}, "strategy": {"name": "mirrored"}})");
  std::string out;
  ASSERT_EQ(api_->get_config(api_, "/timeouts/collective_s", append_to_string, &out, &err_), STRATA_OK);
  EXPECT_EQ(out, "300");
  out.clear();
  ASSERT_EQ(api_->get_config(api_, "/strategy/name", append_to_string, &out, &err_), STRATA_OK);
  EXPECT_EQ(out, "\"mirrored\"");
  out.clear();
  ASSERT_EQ(api_->get_config(api_, "", append_to_string, &out, &err_), STRATA_OK);
  EXPECT_EQ(nlohmann::json::parse(out)["strategy"]["name"], "mirrored");
  out.clear();
  EXPECT_EQ(api_->get_config(api_, "/transport/name", append_to_string, &out, &err_), STRATA_ERR_NOT_FOUND);
  EXPECT_TRUE(contains(err_.message, "/transport/name")) << err_.message;
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(api_->get_config(api_, "timeouts", append_to_string, &out, &err_), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api_->get_config(api_, "/x", nullptr, nullptr, &err_), STRATA_ERR_INVALID_ARGUMENT);
  // err may be NULL.
  EXPECT_EQ(api_->get_config(api_, "/nope", append_to_string, &out, nullptr), STRATA_ERR_NOT_FOUND);
}

TEST_F(HostServicesTest, CreateAndReleasePluginThroughTheTable) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("good"));
  PluginHost host;
  const strata_host_api* api = host.host_api();
  strata_plugin_instance inst;
  ASSERT_EQ(api->create_plugin(api, STRATA_KIND_CLUSTER_RESOLVER, "good", nullptr, &inst, &err_), STRATA_OK)
      << err_.message;
  EXPECT_EQ(inst.struct_size, STRATA_PLUGIN_INSTANCE_STRUCT_SIZE);
  EXPECT_EQ(inst.kind, static_cast<uint32_t>(STRATA_KIND_CLUSTER_RESOLVER));
  ASSERT_NE(inst.handle, nullptr);
  ASSERT_NE(inst.host_token, nullptr);
  const auto* vt = static_cast<const strata_resolver_vtable*>(inst.vtable);
  std::string out;
  ASSERT_EQ(vt->master(static_cast<strata_resolver_t>(inst.handle), nullptr, 0, nullptr, append_to_string, &out,
                       &err_),
            STRATA_OK);
  EXPECT_EQ(out, "localhost:1234");
  api->release_plugin(api, &inst);
  EXPECT_EQ(inst.handle, nullptr);
  EXPECT_EQ(inst.host_token, nullptr);
  api->release_plugin(api, &inst);  // zeroed: no-op
  api->release_plugin(api, nullptr);

  EXPECT_EQ(api->create_plugin(api, STRATA_KIND_CLUSTER_RESOLVER, "missing", "{}", &inst, &err_),
            STRATA_ERR_NOT_FOUND);
  EXPECT_TRUE(contains(err_.message, "no cluster_resolver plugin named 'missing'")) << err_.message;
  EXPECT_EQ(inst.handle, nullptr);
  EXPECT_EQ(api->create_plugin(api, 77, "good", "{}", &inst, &err_), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->create_plugin(api, STRATA_KIND_CLUSTER_RESOLVER, "good", R"({"fail": 1})", &inst, &err_),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err_.message, "fixture create failed")) << err_.message;
}

TEST_F(HostServicesTest, ClockIsMonotonic) {
  uint64_t a = api_->now_ns(api_);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  uint64_t b = api_->now_ns(api_);
  EXPECT_GE(b - a, 2'000'000u);
}

TEST_F(HostServicesTest, RecordCollectiveKeepsTheLastPerCommunicator) {
  strata_collective_fingerprint fp{};
  STRATA_INIT_HEADER(&fp, strata_collective_fingerprint);
  fp.communicator = "world";
  fp.op = STRATA_COLL_ALL_REDUCE;
  fp.reduce_op = STRATA_REDUCE_SUM;
  fp.dtype = DLDataType{kDLFloat, 32, 1};
  fp.count = 10;
  fp.rank = 1;
  fp.peer = -1;
  for (uint64_t s = 0; s < 3; ++s) {
    fp.sequence = s;
    api_->record_collective(api_, &fp);
  }
  fp.communicator = "other";
  fp.op = STRATA_COLL_BROADCAST;
  api_->record_collective(api_, &fp);
  api_->record_collective(api_, nullptr);
  auto j = nlohmann::json::parse(host_.last_collectives_json());
  EXPECT_EQ(j["world"]["sequence"], 2);
  EXPECT_EQ(j["world"]["op"], STRATA_COLL_ALL_REDUCE);
  EXPECT_EQ(j["world"]["count"], 10);
  EXPECT_EQ(j["world"]["dtype"]["bits"], 32);
  EXPECT_EQ(j["other"]["op"], STRATA_COLL_BROADCAST);
}

}  // namespace
}  // namespace strata
