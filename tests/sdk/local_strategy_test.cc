// SPDX-License-Identifier: Apache-2.0
// The in-process replica machinery through the C vtable the adapter builds,
// with the SDK's built-in CrossDeviceOps (no host, no core).
#include "strata/sdk/local_strategy.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "strata/sdk/kernels.hpp"
#include "strata/sdk/options.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::sdk {
namespace {

class TestStrategy : public LocalStrategy {
 public:
  TestStrategy(Host host, const char* options) : LocalStrategy(std::move(host), config(options)) {}

 private:
  static LocalStrategyConfig config(const char* options) {
    const auto o = parse_options(options, "test");
    LocalStrategyConfig cfg;
    cfg.strategy_name = "test";
    cfg.cross_device_ops = "";
    if (o.value("single_copy", false)) cfg.placement = VariablePlacement::kSingleCopy;
    nlohmann::json rest = o;
    rest.erase("single_copy");
    parse_common_options(rest, cfg, true);
    return cfg;
  }
};

using ReplicaBody = std::function<strata_status_t(strata_replica_t, uint32_t, strata_error*)>;

struct Fixture {
  const strata_strategy_vtable* vt = StrategyAdapter<TestStrategy>::vtable();
  strata_strategy_t s = nullptr;

  explicit Fixture(const std::string& options) {
    strata_error err;
    strata_error_init(&err);
    EXPECT_EQ(vt->create(nullptr, options.c_str(), &s, &err), STRATA_OK) << err.message;
  }
  ~Fixture() { vt->destroy(s); }

  strata_status_t run(const ReplicaBody& body, strata_error* err) {
    return vt->run(
        s,
        [](void* user, strata_replica_t r, uint32_t id, strata_error* e) {
          return (*static_cast<const ReplicaBody*>(user))(r, id, e);
        },
        const_cast<ReplicaBody*>(&body), err);
  }
};

std::string devices(int n) {
  std::string d = "[";
  for (int i = 0; i < n; ++i) d += (i ? ",\"cpu:" : "\"cpu:") + std::to_string(i) + "\"";
  return d + "]";
}

DLTensor view(float* data, int64_t* shape, int ndim = 1) {
  return DLTensor{data, {kDLCPU, 0}, ndim, kFloat32, shape, nullptr, 0};
}

class LocalStrategyTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalStrategyTest, RunsEveryReplicaOnItsOwnThreadAndAllReduces) {
  const int n = GetParam();
  Fixture f(R"({"devices": )" + devices(n) + "}");
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::vector<float> results(n, 0);
  for (int step = 0; step < 50; ++step) {
    strata_error err;
    strata_error_init(&err);
    ASSERT_EQ(f.run(
                  [&](strata_replica_t r, uint32_t id, strata_error* e) {
                    {
                      std::lock_guard<std::mutex> l(mu);
                      threads.insert(std::this_thread::get_id());
                    }
                    EXPECT_EQ(f.vt->replica_id_in_sync_group(f.s, r), static_cast<int32_t>(id));
                    float v[3] = {static_cast<float>(id + 1), 1, 2};
                    int64_t shape = 3;
                    DLTensor t = view(v, &shape);
                    const DLTensor* in[1] = {&t};
                    DLTensor* out[1] = {&t};
                    const strata_status_t st = f.vt->replica_all_reduce(f.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
                    results[id] = v[0];
                    return st;
                  },
                  &err),
              STRATA_OK)
        << err.message;
    for (int i = 0; i < n; ++i) EXPECT_EQ(results[i], n * (n + 1) / 2.0f);
  }
  EXPECT_EQ(threads.size(), static_cast<size_t>(n));
}

INSTANTIATE_TEST_SUITE_P(Replicas, LocalStrategyTest, ::testing::Values(1, 2, 4));

TEST(LocalStrategyTest, FailingReplicaAbortsWaitingReplicas) {
  Fixture f(R"({"devices": )" + devices(3) + R"(, "timeout_s": 30})");
  std::atomic<int> aborted{0};
  const auto t0 = std::chrono::steady_clock::now();
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st = f.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        if (id == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          std::snprintf(e->message, sizeof e->message, "replica one exploded");
          return STRATA_ERR_DATA_LOSS;
        }
        float v = 1;
        int64_t shape = 1;
        DLTensor t = view(&v, &shape);
        const DLTensor* in[1] = {&t};
        DLTensor* out[1] = {&t};
        const strata_status_t s = f.vt->replica_all_reduce(f.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
        if (s == STRATA_ERR_ABORTED) ++aborted;
        return s;
      },
      &err);
  EXPECT_EQ(st, STRATA_ERR_DATA_LOSS);
  EXPECT_NE(std::string(err.message).find("replica one exploded"), std::string::npos) << err.message;
  EXPECT_EQ(aborted.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // The strategy is usable again after a failed run.
  strata_error_init(&err);
  EXPECT_EQ(f.run([](strata_replica_t, uint32_t, strata_error*) -> strata_status_t { return STRATA_OK; }, &err), STRATA_OK);
}

TEST(LocalStrategyTest, MissingReplicaTimesOut) {
  Fixture f(R"({"devices": )" + devices(2) + R"(, "timeout_s": 0.3})");
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st = f.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        if (id == 1) return STRATA_OK;  // skips the collective
        return f.vt->replica_merge_call(
            f.s, r, [](void*, void* const*, uint32_t, strata_error*) -> strata_status_t { return STRATA_OK; }, nullptr, nullptr, e);
      },
      &err);
  EXPECT_EQ(st, STRATA_ERR_DEADLINE_EXCEEDED);
  EXPECT_NE(std::string(err.message).find("replica(s) [1] never arrived"), std::string::npos) << err.message;
}

TEST(LocalStrategyTest, ReentrantRunIsRejected) {
  Fixture f(R"({"devices": )" + devices(2) + "}");
  std::atomic<int> rejected{0};
  strata_error err;
  strata_error_init(&err);
  EXPECT_EQ(f.run(
                [&](strata_replica_t, uint32_t, strata_error*) {
                  strata_error inner;
                  strata_error_init(&inner);
                  if (f.vt->run(f.s, [](void*, strata_replica_t, uint32_t, strata_error*) -> strata_status_t { return STRATA_OK; },
                                nullptr, &inner) == STRATA_ERR_FAILED_PRECONDITION)
                    ++rejected;
                  return STRATA_OK;
                },
                &err),
            STRATA_OK);
  EXPECT_EQ(rejected.load(), 2);
}

TEST(LocalStrategyTest, SingleCopyVariableAggregatesReplicaUpdates) {
  Fixture f(R"({"devices": )" + devices(4) + R"(, "single_copy": true})");
  float init[2] = {10, 20};
  int64_t shape = 2;
  DLTensor it = view(init, &shape);
  strata_variable_desc d{};
  STRATA_INIT_HEADER(&d, strata_variable_desc);
  d.name = "w";
  d.aggregation = STRATA_VAR_AGG_MEAN;
  d.trainable = 1;
  strata_variable_t v = nullptr;
  strata_error err;
  strata_error_init(&err);
  ASSERT_EQ(f.vt->variable_create(f.s, &d, &it, &v, &err), STRATA_OK) << err.message;
  ASSERT_EQ(f.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) {
                  float delta[2] = {static_cast<float>(id), 1};
                  int64_t sh = 2;
                  DLTensor dt = view(delta, &sh);
                  return f.vt->variable_update(f.s, v, r, STRATA_VAR_ASSIGN_SUB, &dt, e);
                },
                &err),
            STRATA_OK)
      << err.message;
  DLTensor vw{};
  ASSERT_EQ(f.vt->variable_view(f.s, v, nullptr, &vw, &err), STRATA_OK);
  EXPECT_EQ(static_cast<float*>(vw.data)[0], 10 - 1.5f);
  EXPECT_EQ(static_cast<float*>(vw.data)[1], 19);
  f.vt->variable_destroy(f.s, v);
}

}  // namespace
}  // namespace strata::sdk
