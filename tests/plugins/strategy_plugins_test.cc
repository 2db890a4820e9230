// SPDX-License-Identifier: Apache-2.0
// The one_device, mirrored and central_storage strategy plugins, loaded by
// the plugin host and driven through strata_strategy_vtable.
#include <gtest/gtest.h>

#include "strata/config.h"
#include "strata/tensor.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"
#include "strata/sdk/kernels.hpp"
#include "test_tensors.h"

namespace strata::test {
namespace {

using sdk::kFloat32;
using sdk::kInt64;

struct StrategyCase {
  std::string name;
  uint32_t replicas;
};
// Short names in test listings (gtest would otherwise dump the raw bytes).
void PrintTo(const StrategyCase& c, std::ostream* os) { *os << c.name << " x" << c.replicas; }

std::string options_for(const StrategyCase& c, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json o = std::move(extra);
  if (c.name == "one_device") {
    o["device"] = "cpu:0";
  } else {
    nlohmann::json devs = nlohmann::json::array();
    for (uint32_t i = 0; i < c.replicas; ++i) devs.push_back("cpu:" + std::to_string(i));
    o["devices"] = devs;
  }
  return o.dump();
}

using Body = std::function<strata_status_t(strata_replica_t, uint32_t, strata_error*)>;

struct Strat {
  PluginInstance inst;
  const strata_strategy_vtable* vt;
  strata_strategy_t s;

  Strat(const std::string& name, const std::string& options)
      : inst(PluginHost::global().create(STRATA_KIND_STRATEGY, name, options)),
        vt(inst.vtable_as<strata_strategy_vtable>()),
        s(static_cast<strata_strategy_t>(inst.handle())) {}

  strata_status_t run(const Body& body, strata_error* err) const {
    strata_error_init(err);
    return vt->run(
        s,
        [](void* user, strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
          return (*static_cast<const Body*>(user))(r, id, e);
        },
        const_cast<Body*>(&body), err);
  }
  nlohmann::json describe() const {
    std::string out;
    strata_error err;
    strata_error_init(&err);
    EXPECT_EQ(vt->describe(s, &append, &out, &err), STRATA_OK) << err.message;
    return nlohmann::json::parse(out);
  }
  strata_variable_t make_var(const char* name, uint32_t sync, uint32_t agg, int trainable, const DLTensor& init,
                             strata_status_t expect = STRATA_OK, std::string* message = nullptr) const {
    strata_variable_desc d{};
    STRATA_INIT_HEADER(&d, strata_variable_desc);
    d.name = name;
    d.synchronization = sync;
    d.aggregation = agg;
    d.trainable = trainable;
    strata_variable_t v = nullptr;
    strata_error err;
    strata_error_init(&err);
    EXPECT_EQ(vt->variable_create(s, &d, &init, &v, &err), expect) << err.message;
    if (message) *message = err.message;
    return v;
  }
  std::vector<double> read(strata_variable_t v, strata_replica_t r = nullptr, strata_status_t expect = STRATA_OK,
                           std::string* message = nullptr) const {
    DLManagedTensor* out = nullptr;
    strata_error err;
    strata_error_init(&err);
    EXPECT_EQ(vt->variable_read(s, v, r, &out, &err), expect) << err.message;
    if (message) *message = err.message;
    if (out == nullptr) return {};
    std::vector<double> vals = values_of(out->dl_tensor);
    out->deleter(out);
    return vals;
  }
};

class StrategyPluginsTest : public ::testing::TestWithParam<StrategyCase> {
 protected:
  const StrategyCase& c() const { return GetParam(); }
  uint32_t n() const { return GetParam().replicas; }
};

TEST_P(StrategyPluginsTest, DescribeAndThreads) {
  Strat st(c().name, options_for(c()));
  const auto d = st.describe();
  EXPECT_EQ(d.at("num_replicas_in_sync"), n());
  EXPECT_EQ(d.at("num_local_replicas"), n());
  EXPECT_EQ(d.at("worker_devices").size(), n());
  EXPECT_EQ(d.at("is_chief"), true);
  if (c().name == "central_storage") {
    EXPECT_EQ(d.at("parameter_devices"), nlohmann::json({"cpu:0"}));
  }
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::set<int32_t> ids;
  strata_error err;
  ASSERT_EQ(st.run(
                [&](strata_replica_t r, uint32_t id, strata_error*) -> strata_status_t {
                  std::lock_guard<std::mutex> l(mu);
                  threads.insert(std::this_thread::get_id());
                  ids.insert(st.vt->replica_id_in_sync_group(st.s, r));
                  return STRATA_OK;
                },
                &err),
            STRATA_OK)
      << err.message;
  EXPECT_EQ(threads.size(), n());
  EXPECT_EQ(ids.size(), n());
  if (c().name == "one_device") {
    EXPECT_EQ(*threads.begin(), std::this_thread::get_id());
  }
}

TEST_P(StrategyPluginsTest, AllReduceSumAndMeanForAllDtypes) {
  Strat st(c().name, options_for(c()));
  for (DLDataType dt : all_dtypes()) {
    for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
      std::vector<std::vector<double>> got(n());
      strata_error err;
      ASSERT_EQ(st.run(
                    [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                      HostTensor a(dt, {5}), b(dt, {2, 2});
                      for (size_t i = 0; i < 5; ++i) a.set(i, 4.0 * (id + 1) + i);
                      for (size_t i = 0; i < 4; ++i) b.set(i, -2.0 * (id + 1));
                      HostTensor out_a(dt, {5});
                      const DLTensor* in[2] = {&a.t, &b.t};
                      DLTensor* out[2] = {&out_a.t, &b.t};  // b in place
                      const strata_status_t s = st.vt->replica_all_reduce(st.s, r, op, 2, in, out, e);
                      got[id] = out_a.values();
                      auto bv = b.values();
                      got[id].insert(got[id].end(), bv.begin(), bv.end());
                      return s;
                    },
                    &err),
                STRATA_OK)
          << dtype_label(dt) << " " << err.message;
      const double sum_ids = n() * (n() + 1) / 2.0;
      for (uint32_t r = 0; r < n(); ++r) {
        ASSERT_EQ(got[r].size(), 9u);
        for (size_t i = 0; i < 5; ++i) {
          double want = 4.0 * sum_ids + n() * i;
          if (op == STRATA_REDUCE_MEAN) want = dt.code == kDLInt ? std::trunc(want / n()) : want / n();
          EXPECT_NEAR(got[r][i], want, 0.02 * std::fabs(want)) << dtype_label(dt) << " replica " << r;
        }
        double want_b = -2.0 * sum_ids;
        if (op == STRATA_REDUCE_MEAN) want_b = dt.code == kDLInt ? std::trunc(want_b / n()) : want_b / n();
        EXPECT_NEAR(got[r][5], want_b, 0.02 * std::fabs(want_b)) << dtype_label(dt);
      }
    }
  }
}

TEST_P(StrategyPluginsTest, AllGatherWithUnevenSizes) {
  Strat st(c().name, options_for(c()));
  std::vector<std::vector<double>> got(n());
  std::vector<std::vector<int64_t>> shapes(n());
  strata_error err;
  ASSERT_EQ(st.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                  HostTensor t(kFloat32, {static_cast<int64_t>(id + 1), 2});
                  for (size_t i = 0; i < t.count(); ++i) t.set(i, id * 10.0 + i);
                  DLManagedTensor* out = nullptr;
                  const strata_status_t s = st.vt->replica_all_gather(st.s, r, &t.t, 0, &out, e);
                  if (out) {
                    got[id] = values_of(out->dl_tensor);
                    shapes[id].assign(out->dl_tensor.shape, out->dl_tensor.shape + out->dl_tensor.ndim);
                    out->deleter(out);
                  }
                  return s;
                },
                &err),
            STRATA_OK)
      << err.message;
  std::vector<double> want;
  for (uint32_t r = 0; r < n(); ++r)
    for (size_t i = 0; i < (r + 1) * 2; ++i) want.push_back(r * 10.0 + i);
  const int64_t rows = n() * (n() + 1) / 2;
  for (uint32_t r = 0; r < n(); ++r) {
    EXPECT_EQ(got[r], want) << "replica " << r;
    EXPECT_EQ(shapes[r], (std::vector<int64_t>{rows, 2}));
  }
}

struct MergeState {
  std::atomic<int> calls{0};
  std::vector<uint32_t> seen;
  std::thread::id thread;
};

TEST_P(StrategyPluginsTest, MergeCallRunsOnceWithAllArgsInOrder) {
  Strat st(c().name, options_for(c()));
  MergeState ms;
  std::vector<uint32_t> args(n());
  std::atomic<int> after{0};
  strata_error err;
  ASSERT_EQ(st.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                  args[id] = id * 7;
                  const strata_status_t s = st.vt->replica_merge_call(
                      st.s, r,
                      [](void* mu, void* const* a, uint32_t num, strata_error*) -> strata_status_t {
                        auto* m = static_cast<MergeState*>(mu);
                        ++m->calls;
                        for (uint32_t i = 0; i < num; ++i) m->seen.push_back(*static_cast<uint32_t*>(a[i]));
                        return STRATA_OK;
                      },
                      &ms, &args[id], e);
                  // Every replica returns only after the merge function ran.
                  if (ms.calls.load() == 1) ++after;
                  return s;
                },
                &err),
            STRATA_OK)
      << err.message;
  EXPECT_EQ(ms.calls.load(), 1);
  std::vector<uint32_t> want;
  for (uint32_t i = 0; i < n(); ++i) want.push_back(i * 7);
  EXPECT_EQ(ms.seen, want);
  EXPECT_EQ(after.load(), static_cast<int>(n()));
}

TEST_P(StrategyPluginsTest, ReduceToAndGatherTo) {
  Strat st(c().name, options_for(c()));
  std::vector<std::unique_ptr<HostTensor>> vals;
  std::vector<const DLTensor*> ptrs;
  for (uint32_t r = 0; r < n(); ++r) {
    vals.push_back(std::make_unique<HostTensor>(kInt64, std::vector<int64_t>{1, 3}));
    vals.back()->fill({double(r), double(r * 2), 5});
    ptrs.push_back(&vals.back()->t);
  }
  HostTensor out(kInt64, {1, 3});
  strata_error err;
  strata_error_init(&err);
  ASSERT_EQ(st.vt->reduce_to(st.s, STRATA_REDUCE_SUM, n(), ptrs.data(), &out.t, &err), STRATA_OK) << err.message;
  const double s = n() * (n() - 1) / 2.0;
  EXPECT_EQ(out.values(), (std::vector<double>{s, 2 * s, 5.0 * n()}));
  DLManagedTensor* g = nullptr;
  ASSERT_EQ(st.vt->gather_to(st.s, n(), ptrs.data(), 0, &g, &err), STRATA_OK) << err.message;
  ASSERT_EQ(g->dl_tensor.shape[0], static_cast<int64_t>(n()));
  auto gv = values_of(g->dl_tensor);
  g->deleter(g);
  for (uint32_t r = 0; r < n(); ++r) EXPECT_EQ(gv[r * 3 + 1], r * 2.0);
  EXPECT_EQ(st.vt->reduce_to(st.s, STRATA_REDUCE_SUM, n() + 1, ptrs.data(), &out.t, &err), STRATA_ERR_INVALID_ARGUMENT);
}

// Each replica adds (id + 1) to an ON_WRITE variable in replica context.
void replica_add(const Strat& st, strata_variable_t v, strata_status_t expect, std::string* msg = nullptr) {
  strata_error err;
  const strata_status_t s = st.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        HostTensor d(kFloat32, {2});
        d.fill({double(id + 1), 1});
        return st.vt->variable_update(st.s, v, r, STRATA_VAR_ASSIGN_ADD, &d.t, e);
      },
      &err);
  EXPECT_EQ(s, expect) << err.message;
  if (msg) *msg = err.message;
}

TEST_P(StrategyPluginsTest, OnWriteVariables) {
  Strat st(c().name, options_for(c()));
  HostTensor init(kFloat32, {2});
  init.fill({100, 0});
  const double sum_ids = n() * (n() + 1) / 2.0;
  struct {
    uint32_t agg;
    std::vector<double> want;
  } cases[] = {{STRATA_VAR_AGG_SUM, {100 + sum_ids, double(n())}},
               {STRATA_VAR_AGG_MEAN, {100 + sum_ids / n(), 1}},
               {STRATA_VAR_AGG_ONLY_FIRST_REPLICA, {101, 1}}};
  for (const auto& cs : cases) {
    strata_variable_t v = st.make_var("w", STRATA_VAR_SYNC_AUTO, cs.agg, 1, init.t);
    replica_add(st, v, STRATA_OK);
    EXPECT_EQ(st.read(v), cs.want) << "aggregation " << cs.agg;
    // Every replica sees the same value.
    strata_error err;
    std::vector<std::vector<double>> seen(n());
    ASSERT_EQ(st.run(
                  [&](strata_replica_t r, uint32_t id, strata_error*) -> strata_status_t {
                    seen[id] = st.read(v, r);
                    return STRATA_OK;
                  },
                  &err),
              STRATA_OK);
    for (auto& s : seen) EXPECT_EQ(s, cs.want);
    // Cross-replica assign updates every copy.
    HostTensor val(kFloat32, {2});
    val.fill({-1, -2});
    strata_error_init(&err);
    ASSERT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN, &val.t, &err), STRATA_OK);
    EXPECT_EQ(st.read(v), (std::vector<double>{-1, -2}));
    // Wrong shape or dtype.
    HostTensor bad(kFloat32, {3});
    EXPECT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN, &bad.t, &err), STRATA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err.message).find("float32[3]"), std::string::npos) << err.message;
    HostTensor bad2(kInt64, {2});
    EXPECT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN, &bad2.t, &err), STRATA_ERR_INVALID_ARGUMENT);
    st.vt->variable_destroy(st.s, v);
  }
  // Placement: central_storage and one_device keep one copy, mirrored one per replica.
  strata_variable_t v = st.make_var("p", STRATA_VAR_SYNC_ON_WRITE, STRATA_VAR_AGG_SUM, 1, init.t);
  std::vector<void*> ptrs(n());
  strata_error err;
  ASSERT_EQ(st.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                  DLTensor view{};
                  const strata_status_t s = st.vt->variable_view(st.s, v, r, &view, e);
                  ptrs[id] = view.data;
                  return s;
                },
                &err),
            STRATA_OK)
      << err.message;
  const size_t distinct = std::set<void*>(ptrs.begin(), ptrs.end()).size();
  EXPECT_EQ(distinct, c().name == "mirrored" ? n() : 1u);
  st.vt->variable_destroy(st.s, v);
}

TEST_P(StrategyPluginsTest, OnWriteNoneAggregationInReplicaContext) {
  Strat st(c().name, options_for(c()));
  HostTensor init(kFloat32, {2});
  init.fill({1, 1});
  strata_variable_t v = st.make_var("w", STRATA_VAR_SYNC_ON_WRITE, STRATA_VAR_AGG_NONE, 1, init.t);
  if (c().name == "one_device") {
    replica_add(st, v, STRATA_OK);  // a single replica needs no aggregation
    EXPECT_EQ(st.read(v), (std::vector<double>{2, 2}));
  } else {
    std::string msg;
    replica_add(st, v, STRATA_ERR_FAILED_PRECONDITION, &msg);
    EXPECT_NE(msg.find("You must specify an aggregation method to update a variable in replica context"),
              std::string::npos)
        << msg;
    EXPECT_EQ(st.read(v), (std::vector<double>{1, 1}));
  }
  st.vt->variable_destroy(st.s, v);
}

TEST_P(StrategyPluginsTest, OnReadVariables) {
  Strat st(c().name, options_for(c()));
  HostTensor init(kFloat32, {2});
  init.fill({0, 0});
  std::string msg;
  st.make_var("bad", STRATA_VAR_SYNC_ON_READ, STRATA_VAR_AGG_SUM, 1, init.t, STRATA_ERR_INVALID_ARGUMENT, &msg);
  EXPECT_NE(msg.find("trainable"), std::string::npos) << msg;
  st.make_var("bad", STRATA_VAR_SYNC_NONE, STRATA_VAR_AGG_SUM, 0, init.t, STRATA_ERR_INVALID_ARGUMENT);

  const double sum_ids = n() * (n() + 1) / 2.0;
  for (uint32_t agg : {STRATA_VAR_AGG_NONE, STRATA_VAR_AGG_SUM, STRATA_VAR_AGG_MEAN,
                       STRATA_VAR_AGG_ONLY_FIRST_REPLICA}) {
    strata_variable_t v = st.make_var("acc", STRATA_VAR_SYNC_ON_READ, agg, 0, init.t);
    // Replica context: each replica updates only its own copy.
    strata_error err;
    std::vector<std::vector<double>> own(n());
    ASSERT_EQ(st.run(
                  [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                    HostTensor d(kFloat32, {2});
                    d.fill({double(id + 1), 2});
                    const strata_status_t s = st.vt->variable_update(st.s, v, r, STRATA_VAR_ASSIGN_ADD, &d.t, e);
                    own[id] = st.read(v, r);
                    return s;
                  },
                  &err),
              STRATA_OK)
        << err.message;
    for (uint32_t r = 0; r < n(); ++r) EXPECT_EQ(own[r], (std::vector<double>{double(r + 1), 2}));
    // Cross-replica read aggregates.
    switch (agg) {
      case STRATA_VAR_AGG_NONE:
        st.read(v, nullptr, STRATA_ERR_FAILED_PRECONDITION, &msg);
        EXPECT_NE(msg.find("NONE"), std::string::npos) << msg;
        break;
      case STRATA_VAR_AGG_SUM: EXPECT_EQ(st.read(v), (std::vector<double>{sum_ids, 2.0 * n()})); break;
      case STRATA_VAR_AGG_MEAN: EXPECT_EQ(st.read(v), (std::vector<double>{sum_ids / n(), 2})); break;
      default: EXPECT_EQ(st.read(v), (std::vector<double>{1, 2})); break;
    }
    // Cross-replica assign.
    HostTensor val(kFloat32, {2});
    val.fill({8, 4});
    strata_error_init(&err);
    ASSERT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN, &val.t, &err), STRATA_OK) << err.message;
    std::vector<std::vector<double>> copies(n());
    ASSERT_EQ(st.run(
                  [&](strata_replica_t r, uint32_t id, strata_error*) -> strata_status_t {
                    copies[id] = st.read(v, r);
                    return STRATA_OK;
                  },
                  &err),
              STRATA_OK);
    const std::vector<double> want_copy =
        agg == STRATA_VAR_AGG_SUM ? std::vector<double>{8.0 / n(), 4.0 / n()} : std::vector<double>{8, 4};
    for (auto& cp : copies) EXPECT_EQ(cp, want_copy) << "aggregation " << agg;
    if (agg == STRATA_VAR_AGG_SUM) {
      EXPECT_EQ(st.read(v), (std::vector<double>{8, 4}));
      EXPECT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN_ADD, &val.t, &err),
                STRATA_ERR_FAILED_PRECONDITION);
      EXPECT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN_SUB, &val.t, &err),
                STRATA_ERR_FAILED_PRECONDITION);
    } else {
      EXPECT_EQ(st.vt->variable_update(st.s, v, nullptr, STRATA_VAR_ASSIGN_ADD, &val.t, &err), STRATA_OK);
    }
    st.vt->variable_destroy(st.s, v);
  }
}

TEST_P(StrategyPluginsTest, FailingReplicaDoesNotHangOthers) {
  Strat st(c().name, options_for(c(), {{"timeout_s", 60}}));
  const uint32_t bad = n() - 1;
  const auto t0 = std::chrono::steady_clock::now();
  strata_error err;
  const strata_status_t s = st.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        if (id == bad) {
          std::snprintf(e->message, sizeof e->message, "loss is NaN on replica %u", id);
          return STRATA_ERR_DATA_LOSS;
        }
        HostTensor t(kFloat32, {4});
        const DLTensor* in[1] = {&t.t};
        DLTensor* out[1] = {&t.t};
        const strata_status_t x = st.vt->replica_all_reduce(st.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
        EXPECT_EQ(x, STRATA_ERR_ABORTED);
        return x;
      },
      &err);
  EXPECT_EQ(s, STRATA_ERR_DATA_LOSS);
  EXPECT_NE(std::string(err.message).find("loss is NaN"), std::string::npos) << err.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST_P(StrategyPluginsTest, SkippedCollectiveTimesOut) {
  if (n() < 2) GTEST_SKIP() << "needs two replicas";
  Strat st(c().name, options_for(c(), {{"timeout_s", 1}}));
  const auto t0 = std::chrono::steady_clock::now();
  strata_error err;
  const strata_status_t s = st.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        if (id == 1) return STRATA_OK;
        HostTensor t(kFloat32, {4});
        const DLTensor* in[1] = {&t.t};
        DLTensor* out[1] = {&t.t};
        return st.vt->replica_all_reduce(st.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
      },
      &err);
  EXPECT_EQ(s, STRATA_ERR_DEADLINE_EXCEEDED);
  EXPECT_NE(std::string(err.message).find("[1] never arrived"), std::string::npos) << err.message;
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, std::chrono::milliseconds(900));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

TEST_P(StrategyPluginsTest, MismatchedCollectivesAreDetected) {
  if (n() < 2) GTEST_SKIP() << "needs two replicas";
  Strat st(c().name, options_for(c(), {{"timeout_s", 30}}));
  strata_error err;
  // all_reduce on replica 0, all_gather elsewhere.
  strata_status_t s = st.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        HostTensor t(kFloat32, {4});
        if (id == 0) {
          const DLTensor* in[1] = {&t.t};
          DLTensor* out[1] = {&t.t};
          return st.vt->replica_all_reduce(st.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
        }
        DLManagedTensor* out = nullptr;
        const strata_status_t x = st.vt->replica_all_gather(st.s, r, &t.t, 0, &out, e);
        if (out) out->deleter(out);
        return x;
      },
      &err);
  EXPECT_EQ(s, STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("replica 0 called all_reduce"), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find("called all_gather"), std::string::npos) << err.message;
  // Same collective, different dtypes.
  s = st.run(
      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
        HostTensor t(id == 1 ? kInt64 : kFloat32, {4});
        const DLTensor* in[1] = {&t.t};
        DLTensor* out[1] = {&t.t};
        return st.vt->replica_all_reduce(st.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
      },
      &err);
  EXPECT_EQ(s, STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("int64[4]"), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find("float32[4]"), std::string::npos) << err.message;
}

TEST_P(StrategyPluginsTest, ReentrantRunIsFailedPrecondition) {
  Strat st(c().name, options_for(c()));
  std::atomic<int> rejected{0};
  strata_error err;
  ASSERT_EQ(st.run(
                [&](strata_replica_t, uint32_t, strata_error*) -> strata_status_t {
                  strata_error inner;
                  strata_error_init(&inner);
                  if (st.vt->run(st.s, [](void*, strata_replica_t, uint32_t, strata_error*) -> strata_status_t {
                        return STRATA_OK;
                      }, nullptr, &inner) == STRATA_ERR_FAILED_PRECONDITION)
                    ++rejected;
                  return STRATA_OK;
                },
                &err),
            STRATA_OK);
  EXPECT_EQ(rejected.load(), static_cast<int>(n()));
}

TEST_P(StrategyPluginsTest, BadOptionsNameTheKey) {
  try {
    Strat st(c().name, options_for(c(), {{"devicez", 1}}));
    FAIL() << "accepted an unknown option";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("'devicez'"), std::string::npos) << e.what();
  }
  const char* key = c().name == "one_device" ? "device" : "devices";
  // A GPU no machine has: UNIMPLEMENTED without CUDA, FAILED_PRECONDITION
  // (no GPU visible) or INVALID_ARGUMENT (beyond the visible count) with it.
  nlohmann::json bad = c().name == "one_device" ? nlohmann::json("gpu:99") : nlohmann::json({"gpu:99"});
  try {
    Strat st(c().name, nlohmann::json{{key, bad}}.dump());
    FAIL() << "accepted a GPU device that does not exist";
  } catch (const Error& e) {
    const strata_status_t want = !STRATA_HAVE_CUDA    ? STRATA_ERR_UNIMPLEMENTED
                                 : num_gpus() == 0 ? STRATA_ERR_FAILED_PRECONDITION
                                                   : STRATA_ERR_INVALID_ARGUMENT;
    EXPECT_EQ(e.code(), want) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  if (c().name != "one_device") {
    EXPECT_THROW(Strat(c().name, R"({"devices": ["cpu:0", "cpu:0"]})"), InvalidArgumentError);
    EXPECT_THROW(Strat(c().name, R"({"devices": []})"), InvalidArgumentError);
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, StrategyPluginsTest,
                         ::testing::Values(StrategyCase{"one_device", 1}, StrategyCase{"mirrored", 1},
                                           StrategyCase{"mirrored", 2}, StrategyCase{"mirrored", 4},
                                           StrategyCase{"central_storage", 1}, StrategyCase{"central_storage", 2},
                                           StrategyCase{"central_storage", 4}),
                         [](const ::testing::TestParamInfo<StrategyCase>& i) {
                           return i.param.name + "_" + std::to_string(i.param.replicas);
                         });

TEST(StrategyPluginsTest, MirroredWithEveryCrossDeviceOps) {
  for (const char* cdo : {R"({"name": "hierarchical_copy", "options": {"num_packs": 3}})",
                          R"({"name": "reduction_to_one_device", "options": {"reduce_to_device": "cpu:1"}})"}) {
    Strat st("mirrored", R"({"devices": ["cpu:0", "cpu:1", "cpu:2"], "cross_device_ops": )" + std::string(cdo) + "}");
    EXPECT_EQ(st.describe().at("cross_device_ops"), nlohmann::json::parse(cdo).at("name"));
    std::vector<double> got(3);
    strata_error err;
    ASSERT_EQ(st.run(
                  [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                    HostTensor a(kFloat32, {3}), b(kInt64, {2});
                    a.fill({1, 2, double(id)});
                    b.fill({5, double(id)});
                    const DLTensor* in[2] = {&a.t, &b.t};
                    DLTensor* out[2] = {&a.t, &b.t};
                    const strata_status_t s = st.vt->replica_all_reduce(st.s, r, STRATA_REDUCE_SUM, 2, in, out, e);
                    got[id] = a.get(2) + b.get(1) * 100;
                    return s;
                  },
                  &err),
              STRATA_OK)
        << err.message;
    for (double g : got) EXPECT_EQ(g, 3 + 300);
  }
  EXPECT_THROW(Strat("mirrored", R"({"cross_device_ops": {"name": "hierarchical_copy", "options": {"packs": 1}}})"),
               InvalidArgumentError);
}

// Large all-reduces are shared out among mirrored's replica threads (each
// through its own cross_device_ops instance); the result must be the bits
// of one left-to-right reduction, on every replica, for every in-process
// cross_device_ops.
TEST(StrategyPluginsTest, MirroredSplitAllReduceIsBitIdentical) {
  const std::vector<std::string> cdos = {"", R"({"name": "reduction_to_one_device"})",
                                         R"({"name": "hierarchical_copy", "options": {"num_packs": 3}})",
                                         R"({"name": "hierarchical_copy", "options": {"num_packs": 0}})"};
  const std::vector<std::pair<DLDataType, int64_t>> specs = {
      {kFloat32, 262147}, {sdk::kFloat16, 100001}, {kInt64, 7}, {sdk::kBFloat16, 65541}};
  for (const std::string& cdo : cdos)
    for (uint32_t nr : {2u, 4u}) {
      nlohmann::json o = nlohmann::json::parse(options_for(StrategyCase{"mirrored", nr}));
      if (!cdo.empty()) o["cross_device_ops"] = nlohmann::json::parse(cdo);
      Strat st("mirrored", o.dump());
      for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
        // in[t][r]: values whose float sums depend on the order of additions.
        std::vector<std::vector<std::unique_ptr<HostTensor>>> in(specs.size());
        std::vector<std::unique_ptr<HostTensor>> want;
        for (size_t t = 0; t < specs.size(); ++t) {
          std::vector<const void*> ptrs;
          for (uint32_t r = 0; r < nr; ++r) {
            in[t].push_back(std::make_unique<HostTensor>(specs[t].first, std::vector<int64_t>{specs[t].second}));
            for (size_t i = 0; i < in[t][r]->count(); ++i)
              in[t][r]->set(i, (double((i * 7919 + r * 104729) % 1999) - 999.0) / 13.0 * (i % 3 == 0 ? 1000.0 : 0.01));
            ptrs.push_back(in[t][r]->t.data);
          }
          want.push_back(std::make_unique<HostTensor>(specs[t].first, std::vector<int64_t>{specs[t].second}));
          sdk::kernels::reduce(static_cast<strata_reduce_op>(op), specs[t].first, nr, ptrs.data(), want[t]->t.data,
                               want[t]->count(), nr);
        }
        strata_error err;
        ASSERT_EQ(st.run(
                      [&](strata_replica_t r, uint32_t id, strata_error* e) -> strata_status_t {
                        std::vector<const DLTensor*> ins;
                        std::vector<DLTensor*> outs;
                        for (size_t t = 0; t < specs.size(); ++t) {
                          ins.push_back(&in[t][id]->t);
                          outs.push_back(&in[t][id]->t);  // in place
                        }
                        return st.vt->replica_all_reduce(st.s, r, op, static_cast<uint32_t>(specs.size()), ins.data(),
                                                         outs.data(), e);
                      },
                      &err),
                  STRATA_OK)
            << cdo << " x" << nr << ": " << err.message;
        for (size_t t = 0; t < specs.size(); ++t)
          for (uint32_t r = 0; r < nr; ++r)
            ASSERT_EQ(in[t][r]->bytes, want[t]->bytes)
                << (cdo.empty() ? "default" : cdo) << " x" << nr << " op " << op << " tensor " << t << " replica " << r;
      }
    }
}

}  // namespace
}  // namespace strata::test
