// SPDX-License-Identifier: Apache-2.0
// The in-process replica machinery through the C vtable the adapter builds,
// with the SDK's built-in CrossDeviceOps (no host, no core).
#include "strata/sdk/local_strategy.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "strata/sdk/kernels.hpp"
#include "strata/sdk/local_cross_device_ops.hpp"
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
    cfg.split_all_reduce = o.value("split", false);
    nlohmann::json rest = o;
    rest.erase("single_copy");
    rest.erase("split");
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

// ---- split all-reduce (LocalStrategyConfig::split_all_reduce) ----

// One tensor group of a batch: every replica's input and output bytes.
struct Group {
  DLDataType dtype;
  int64_t count;
  std::vector<std::vector<unsigned char>> in, out;  // [replica]
  std::vector<unsigned char> want;                  // one left-to-right reduction
};

// Values whose float sums depend on the order of the additions.
double value_at(uint32_t r, size_t t, size_t i) {
  const uint64_t x = (i * 2654435761u + r * 40503u + t * 977u) % 2001u;
  const double scale[4] = {1e-3, 1.0, 37.0, 1e3};
  return (static_cast<double>(x) - 1000.0) / 7.0 * scale[(i + r) % 4];
}

void store(DLDataType d, void* p, size_t i, double v) {
  if (d.code == kDLFloat && d.bits == 32) static_cast<float*>(p)[i] = static_cast<float>(v);
  else if (d.code == kDLFloat && d.bits == 64) static_cast<double*>(p)[i] = v;
  else if (d.code == kDLFloat && d.bits == 16) static_cast<uint16_t*>(p)[i] = kernels::float_to_half(static_cast<float>(v));
  else if (d.code == kDLBfloat) static_cast<uint16_t*>(p)[i] = kernels::float_to_bfloat16(static_cast<float>(v));
  else if (d.bits == 32) static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
  else static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
}

std::vector<Group> make_groups(uint32_t n, strata_reduce_op op) {
  // Sizes above and below the split threshold, odd counts (not divisible by
  // the replica count), one element between two range cuts, an empty one.
  const std::vector<std::pair<DLDataType, int64_t>> specs = {
      {kFloat32, 100003}, {kFloat16, 70001}, {kInt64, 3}, {kFloat32, 0}, {kFloat64, 20001}, {kBFloat16, 33333},
      {kFloat32, 1}, {kInt32, 65537}};
  std::vector<Group> groups;
  for (size_t t = 0; t < specs.size(); ++t) {
    Group g{specs[t].first, specs[t].second, {}, {}, {}};
    const size_t bytes = static_cast<size_t>(g.count) * g.dtype.bits / 8;
    std::vector<const void*> ptrs;
    for (uint32_t r = 0; r < n; ++r) {
      g.in.emplace_back(bytes + 1);
      g.out.emplace_back(bytes + 1, 0xEE);
      for (int64_t i = 0; i < g.count; ++i) store(g.dtype, g.in[r].data(), static_cast<size_t>(i), value_at(r, t, i));
    }
    for (uint32_t r = 0; r < n; ++r) ptrs.push_back(g.in[r].data());
    g.want.resize(bytes + 1);
    kernels::reduce(op, g.dtype, n, ptrs.data(), g.want.data(), static_cast<size_t>(g.count), n);
    groups.push_back(std::move(g));
  }
  return groups;
}

TEST(LocalStrategyTest, SplitAllReduceIsBitIdenticalToOneReductionOnEveryReplica) {
  for (uint32_t n : {2u, 3u, 4u}) {
    Fixture f(R"({"split": true, "devices": )" + devices(static_cast<int>(n)) + "}");
    for (strata_reduce_op op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MAX, STRATA_REDUCE_PROD})
      for (bool in_place : {false, true}) {
        std::vector<Group> groups = make_groups(n, op);
        const size_t nt = groups.size();
        std::vector<std::vector<int64_t>> shapes(nt);
        for (size_t t = 0; t < nt; ++t) shapes[t] = {groups[t].count};
        strata_error err;
        strata_error_init(&err);
        ASSERT_EQ(f.run(
                      [&](strata_replica_t r, uint32_t id, strata_error* e) {
                        std::vector<DLTensor> ins(nt), outs(nt);
                        std::vector<const DLTensor*> in_p(nt);
                        std::vector<DLTensor*> out_p(nt);
                        for (size_t t = 0; t < nt; ++t) {
                          ins[t] = DLTensor{groups[t].in[id].data(), {kDLCPU, 0}, 1, groups[t].dtype,
                                            shapes[t].data(), nullptr, 0};
                          outs[t] = ins[t];
                          if (!in_place) outs[t].data = groups[t].out[id].data();
                          in_p[t] = &ins[t];
                          out_p[t] = &outs[t];
                        }
                        return f.vt->replica_all_reduce(f.s, r, op, static_cast<uint32_t>(nt), in_p.data(),
                                                        out_p.data(), e);
                      },
                      &err),
                  STRATA_OK)
            << err.message;
        for (size_t t = 0; t < nt; ++t) {
          const Group& g = groups[t];
          const size_t bytes = static_cast<size_t>(g.count) * g.dtype.bits / 8;
          for (uint32_t r = 0; r < n; ++r) {
            const auto& got = in_place ? g.in[r] : g.out[r];
            ASSERT_EQ(std::memcmp(got.data(), g.want.data(), bytes), 0)
                << "group " << t << " (" << dtype_name(g.dtype) << "[" << g.count << "]) replica " << r
                << " of " << n << " op " << reduce_op_name(op) << (in_place ? " in place" : "");
            // Nothing past the end was written.
            if (!in_place) {
              EXPECT_EQ(got[bytes], 0xEE) << "group " << t << " replica " << r;
            }
          }
        }
      }
  }
}

TEST(LocalStrategyTest, SplitAllReduceStillNamesMismatchesAndBadTensors) {
  Fixture f(R"({"split": true, "devices": )" + devices(2) + "}");
  std::vector<float> a(300000, 1.0f), b(300000, 2.0f);
  int64_t shape = 300000;
  strata_error err;
  strata_error_init(&err);
  // Replica 1 passes int32: the split must not hide the mismatch.
  EXPECT_EQ(f.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) {
                  DLTensor t{id == 0 ? a.data() : b.data(), {kDLCPU, 0}, 1, id == 0 ? kFloat32 : kInt32, &shape,
                             nullptr, 0};
                  const DLTensor* in[1] = {&t};
                  DLTensor* out[1] = {&t};
                  return f.vt->replica_all_reduce(f.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
                },
                &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("mismatched collectives"), std::string::npos) << err.message;
  // A strided (non-contiguous) tensor is refused by the cross_device_ops,
  // not silently reduced as if it were contiguous.
  int64_t shape2[2] = {1000, 150};
  int64_t strides[2] = {1, 1000};
  strata_error_init(&err);
  EXPECT_EQ(f.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) {
                  DLTensor t{id == 0 ? a.data() : b.data(), {kDLCPU, 0}, 2, kFloat32, shape2, strides, 0};
                  const DLTensor* in[1] = {&t};
                  DLTensor* out[1] = {&t};
                  return f.vt->replica_all_reduce(f.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
                },
                &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("not contiguous"), std::string::npos) << err.message;
  // And the strategy works afterwards, split.
  std::fill(a.begin(), a.end(), 1.0f);
  std::fill(b.begin(), b.end(), 2.0f);
  strata_error_init(&err);
  ASSERT_EQ(f.run(
                [&](strata_replica_t r, uint32_t id, strata_error* e) {
                  DLTensor t{id == 0 ? a.data() : b.data(), {kDLCPU, 0}, 1, kFloat32, &shape, nullptr, 0};
                  const DLTensor* in[1] = {&t};
                  DLTensor* out[1] = {&t};
                  return f.vt->replica_all_reduce(f.s, r, STRATA_REDUCE_SUM, 1, in, out, e);
                },
                &err),
            STRATA_OK)
      << err.message;
  for (size_t i = 0; i < a.size(); i += 997) ASSERT_EQ(a[i] + b[i], 6.0f) << i;
}

// The built-in CrossDeviceOps' started all-reduces run on its worker thread
// (or on the waiting thread), in start order, before later blocking calls
// and before the instance is destroyed.
TEST(LocalCrossDeviceOpsTest, StartedAllReducesRunInOrderOffTheCaller) {
  const strata_cross_device_ops_vtable* vt = CrossDeviceOpsAdapter<LocalCrossDeviceOps>::vtable();
  strata_cross_device_ops_t cdo = nullptr;
  strata_error err;
  strata_error_init(&err);
  ASSERT_EQ(vt->create(nullptr, "{}", &cdo, &err), STRATA_OK) << err.message;
  const int64_t count = 1 << 20;
  std::vector<float> x0(count, 1.0f), x1(count, 2.0f), y0(count, 1.0f), y1(count, 2.0f);
  int64_t shape = count;
  DLTensor a0 = view(x0.data(), &shape), a1 = view(x1.data(), &shape);
  DLTensor b0 = view(y0.data(), &shape), b1 = view(y1.data(), &shape);
  const DLTensor* ain[2] = {&a0, &a1};
  DLTensor* aout[2] = {&a0, &a1};
  const DLTensor* bin[2] = {&b0, &b1};
  DLTensor* bout[2] = {&b0, &b1};
  strata_cdo_request_t r1 = nullptr, r2 = nullptr, r3 = nullptr;
  ASSERT_EQ(vt->all_reduce_start(cdo, STRATA_REDUCE_SUM, 1, 2, ain, aout, &r1, &err), STRATA_OK) << err.message;
  ASSERT_EQ(vt->all_reduce_start(cdo, STRATA_REDUCE_SUM, 1, 2, ain, aout, &r2, &err), STRATA_OK) << err.message;
  ASSERT_EQ(vt->all_reduce_start(cdo, STRATA_REDUCE_MEAN, 1, 2, bin, bout, &r3, &err), STRATA_OK) << err.message;
  // 1 + 2 = 3, then 3 + 3 = 6: only in start order.
  EXPECT_EQ(vt->request_wait(cdo, r2, -1, &err), STRATA_OK) << err.message;
  EXPECT_EQ(vt->request_wait(cdo, r1, 0, &err), STRATA_OK) << err.message;  // done before r2
  for (int64_t i = 0; i < count; i += 4099) ASSERT_EQ(x0[i] + x1[i], 12.0f) << i;
  // A blocking call after a started one sees its result.
  ASSERT_EQ(vt->all_reduce(cdo, STRATA_REDUCE_SUM, 1, 2, bin, bout, &err), STRATA_OK) << err.message;
  for (int64_t i = 0; i < count; i += 4099) ASSERT_EQ(y0[i], 3.0f) << i;  // mean 1.5, then 1.5 + 1.5
  EXPECT_EQ(vt->request_wait(cdo, r3, 1000, &err), STRATA_OK) << err.message;
  EXPECT_EQ(vt->request_wait(cdo, r3, 1000, &err), STRATA_ERR_INVALID_ARGUMENT);
  // Left pending: destroy finishes it first.
  strata_cdo_request_t r4 = nullptr;
  ASSERT_EQ(vt->all_reduce_start(cdo, STRATA_REDUCE_SUM, 1, 2, bin, bout, &r4, &err), STRATA_OK) << err.message;
  vt->destroy(cdo);
  for (int64_t i = 0; i < count; i += 4099) ASSERT_EQ(y1[i], 6.0f) << i;
}

}  // namespace
}  // namespace strata::sdk
