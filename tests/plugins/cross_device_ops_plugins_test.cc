// SPDX-License-Identifier: Apache-2.0
// The reduction_to_one_device and hierarchical_copy CrossDeviceOps plugins,
// loaded by the plugin host and driven through their C vtables.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"
#include "strata/sdk/kernels.hpp"
#include "test_tensors.h"

namespace strata::test {
namespace {

using sdk::kFloat32;
using sdk::kInt32;

struct CdoCase {
  std::string name;
  std::string options;
  std::string label;
};
// Short names in test listings (gtest would otherwise dump the raw bytes).
void PrintTo(const CdoCase& c, std::ostream* os) { *os << c.label; }

struct Cdo {
  PluginInstance inst;
  const strata_cross_device_ops_vtable* vt;
  strata_cross_device_ops_t h;
  explicit Cdo(const CdoCase& c)
      : inst(PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, c.name, c.options)),
        vt(inst.vtable_as<strata_cross_device_ops_vtable>()),
        h(static_cast<strata_cross_device_ops_t>(inst.handle())) {}
};

using Tensors = std::vector<std::unique_ptr<HostTensor>>;

// Replica-major batch: tensor t of replica r at [t * nr + r].
struct Batch {
  Tensors in, out;
  std::vector<const DLTensor*> in_ptrs;
  std::vector<DLTensor*> out_ptrs;
};

Batch make_batch(const std::vector<std::pair<DLDataType, std::vector<int64_t>>>& specs, uint32_t nr, bool in_place) {
  Batch b;
  for (size_t t = 0; t < specs.size(); ++t)
    for (uint32_t r = 0; r < nr; ++r) {
      b.in.push_back(std::make_unique<HostTensor>(specs[t].first, specs[t].second));
      HostTensor& x = *b.in.back();
      for (size_t i = 0; i < x.count(); ++i) x.set(i, double((r + 1) * (i % 7 + 1)) - 3 * double(t));
      b.in_ptrs.push_back(&x.t);
      if (in_place) {
        b.out_ptrs.push_back(&x.t);
      } else {
        b.out.push_back(std::make_unique<HostTensor>(specs[t].first, specs[t].second));
        b.out_ptrs.push_back(&b.out.back()->t);
      }
    }
  return b;
}

double expected(uint32_t op, uint32_t nr, size_t t, size_t i, bool is_int) {
  double acc = 0;
  for (uint32_t r = 0; r < nr; ++r) {
    const double v = double((r + 1) * (i % 7 + 1)) - 3 * double(t);
    if (r == 0) acc = v;
    else if (op == STRATA_REDUCE_MAX) acc = std::max(acc, v);
    else if (op == STRATA_REDUCE_MIN) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == STRATA_REDUCE_MEAN) acc = is_int ? std::trunc(acc / nr) : acc / nr;
  return acc;
}

class CrossDeviceOpsPluginsTest : public ::testing::TestWithParam<CdoCase> {};

const std::vector<std::pair<DLDataType, std::vector<int64_t>>> kSpecs = {
    {kFloat32, {3, 5}}, {kInt32, {7}}, {sdk::kFloat16, {1025}}, {kFloat32, {1}},
    {sdk::kBFloat16, {9}}, {sdk::kFloat64, {0}}, {sdk::kInt64, {2, 2}}};

TEST_P(CrossDeviceOpsPluginsTest, BatchAllReduce) {
  Cdo cdo(GetParam());
  for (uint32_t nr : {1u, 2u, 4u})
    for (bool in_place : {false, true})
      for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MAX}) {
        Batch b = make_batch(kSpecs, nr, in_place);
        strata_error err;
        strata_error_init(&err);
        ASSERT_EQ(cdo.vt->all_reduce(cdo.h, op, static_cast<uint32_t>(kSpecs.size()), nr, b.in_ptrs.data(),
                                     b.out_ptrs.data(), &err),
                  STRATA_OK)
            << err.message;
        for (size_t t = 0; t < kSpecs.size(); ++t)
          for (uint32_t r = 0; r < nr; ++r) {
            const auto got = values_of(*b.out_ptrs[t * nr + r]);
            for (size_t i = 0; i < got.size(); ++i) {
              const double want = expected(op, nr, t, i, kSpecs[t].first.code == kDLInt);
              ASSERT_NEAR(got[i], want, 0.01 * std::fabs(want) + 1e-6)
                  << "tensor " << t << " replica " << r << " element " << i << " op " << op << " nr " << nr;
            }
          }
      }
}

TEST_P(CrossDeviceOpsPluginsTest, StartAndWait) {
  Cdo cdo(GetParam());
  ASSERT_NE(cdo.vt->all_reduce_start, nullptr);
  ASSERT_NE(cdo.vt->request_wait, nullptr);
  Batch b1 = make_batch(kSpecs, 3, false), b2 = make_batch(kSpecs, 3, true);
  strata_cdo_request_t r1 = nullptr, r2 = nullptr;
  strata_error err;
  strata_error_init(&err);
  const uint32_t nt = static_cast<uint32_t>(kSpecs.size());
  ASSERT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_SUM, nt, 3, b1.in_ptrs.data(), b1.out_ptrs.data(), &r1, &err),
            STRATA_OK)
      << err.message;
  ASSERT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_MEAN, nt, 3, b2.in_ptrs.data(), b2.out_ptrs.data(), &r2, &err),
            STRATA_OK);
  EXPECT_EQ(cdo.vt->request_wait(cdo.h, r1, 5000, &err), STRATA_OK);
  EXPECT_EQ(cdo.vt->request_wait(cdo.h, r2, 5000, &err), STRATA_OK);
  EXPECT_EQ(values_of(*b1.out_ptrs[0])[4], expected(STRATA_REDUCE_SUM, 3, 0, 4, false));
  EXPECT_EQ(values_of(*b2.out_ptrs[3])[6], expected(STRATA_REDUCE_MEAN, 3, 1, 6, true));
  // A request is waited for once.
  EXPECT_EQ(cdo.vt->request_wait(cdo.h, r1, 0, &err), STRATA_ERR_INVALID_ARGUMENT);
  // A started op with bad arguments fails at start.
  HostTensor x(kFloat32, {3}), y(kInt32, {3});
  const DLTensor* in[2] = {&x.t, &y.t};
  DLTensor* out[2] = {&x.t, &y.t};
  strata_cdo_request_t r3 = nullptr;
  EXPECT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_SUM, 1, 2, in, out, &r3, &err), STRATA_ERR_INVALID_ARGUMENT);
}

TEST_P(CrossDeviceOpsPluginsTest, ReduceBroadcastGatherScatter) {
  Cdo cdo(GetParam());
  const uint32_t nr = 4;
  Batch b = make_batch({{kFloat32, {8}}, {kInt32, {3}}}, nr, false);
  HostTensor o0(kFloat32, {8}), o1(kInt32, {3});
  DLTensor* outs[2] = {&o0.t, &o1.t};
  strata_error err;
  strata_error_init(&err);
  ASSERT_EQ(cdo.vt->reduce(cdo.h, STRATA_REDUCE_SUM, 2, nr, b.in_ptrs.data(), outs, &err), STRATA_OK) << err.message;
  EXPECT_EQ(o0.get(5), expected(STRATA_REDUCE_SUM, nr, 0, 5, false));
  EXPECT_EQ(o1.get(2), expected(STRATA_REDUCE_SUM, nr, 1, 2, true));

  Tensors dsts;
  std::vector<DLTensor*> dp;
  for (uint32_t r = 0; r < nr; ++r) {
    dsts.push_back(std::make_unique<HostTensor>(kFloat32, std::vector<int64_t>{8}));
    dp.push_back(&dsts.back()->t);
  }
  ASSERT_EQ(cdo.vt->broadcast(cdo.h, &o0.t, nr, dp.data(), &err), STRATA_OK) << err.message;
  for (auto& d : dsts) EXPECT_EQ(d->values(), o0.values());

  // all_gather along axis 1 with uneven sizes.
  Tensors ins, gouts;
  std::vector<const DLTensor*> ip;
  std::vector<DLTensor*> op;
  for (uint32_t r = 0; r < nr; ++r) {
    ins.push_back(std::make_unique<HostTensor>(kInt32, std::vector<int64_t>{2, int64_t(r)}));
    for (size_t i = 0; i < ins.back()->count(); ++i) ins.back()->set(i, r * 100 + i);
    ip.push_back(&ins.back()->t);
    gouts.push_back(std::make_unique<HostTensor>(kInt32, std::vector<int64_t>{2, 6}));
    op.push_back(&gouts.back()->t);
  }
  ASSERT_EQ(cdo.vt->all_gather(cdo.h, nr, ip.data(), 1, op.data(), &err), STRATA_OK) << err.message;
  const std::vector<double> want{100, 200, 201, 300, 301, 302, 101, 202, 203, 303, 304, 305};
  for (auto& g : gouts) EXPECT_EQ(g->values(), want);
  HostTensor wrong(kInt32, {2, 5});
  DLTensor* wp[4] = {&wrong.t, op[1], op[2], op[3]};
  EXPECT_EQ(cdo.vt->all_gather(cdo.h, nr, ip.data(), 1, wp, &err), STRATA_ERR_INVALID_ARGUMENT);

  // reduce_scatter: 8 rows over 4 replicas.
  ASSERT_NE(cdo.vt->reduce_scatter, nullptr);
  Tensors rs_out;
  std::vector<DLTensor*> rp;
  for (uint32_t r = 0; r < nr; ++r) {
    rs_out.push_back(std::make_unique<HostTensor>(kFloat32, std::vector<int64_t>{2}));
    rp.push_back(&rs_out.back()->t);
  }
  ASSERT_EQ(cdo.vt->reduce_scatter(cdo.h, STRATA_REDUCE_SUM, nr, b.in_ptrs.data(), rp.data(), &err), STRATA_OK)
      << err.message;
  for (uint32_t r = 0; r < nr; ++r)
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(rs_out[r]->get(i), expected(STRATA_REDUCE_SUM, nr, 0, r * 2 + i, false));
  HostTensor odd(kFloat32, {3});
  const DLTensor* oddp[2] = {&odd.t, &odd.t};
  EXPECT_EQ(cdo.vt->reduce_scatter(cdo.h, STRATA_REDUCE_SUM, 2, oddp, rp.data(), &err), STRATA_ERR_INVALID_ARGUMENT);
}

TEST_P(CrossDeviceOpsPluginsTest, RejectsMismatchedGroups) {
  Cdo cdo(GetParam());
  HostTensor a(kFloat32, {4}), b(kFloat32, {5}), c(kInt32, {4});
  strata_error err;
  strata_error_init(&err);
  const DLTensor* in[2] = {&a.t, &b.t};
  DLTensor* out[2] = {&a.t, &b.t};
  EXPECT_EQ(cdo.vt->all_reduce(cdo.h, STRATA_REDUCE_SUM, 1, 2, in, out, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("replica 1"), std::string::npos) << err.message;
  const DLTensor* in2[2] = {&a.t, &c.t};
  EXPECT_EQ(cdo.vt->all_reduce(cdo.h, STRATA_REDUCE_SUM, 1, 2, in2, out, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(cdo.vt->all_reduce(cdo.h, 42, 1, 1, in, out, &err), STRATA_ERR_INVALID_ARGUMENT);
  HostTensor u(DLDataType{kDLUInt, 8, 1}, {4});
  const DLTensor* in3[1] = {&u.t};
  DLTensor* out3[1] = {&u.t};
  EXPECT_EQ(cdo.vt->all_reduce(cdo.h, STRATA_REDUCE_SUM, 1, 1, in3, out3, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("uint8"), std::string::npos) << err.message;
}

// Two replicas' float32 buffers of `count` elements, replica r holding
// r + 1 + (i % 5) at element i; reduced in place.
struct Pair {
  std::unique_ptr<HostTensor> x[2];
  const DLTensor* in[2];
  DLTensor* out[2];
  explicit Pair(int64_t count) {
    for (int r = 0; r < 2; ++r) {
      x[r] = std::make_unique<HostTensor>(kFloat32, std::vector<int64_t>{count});
      float* p = static_cast<float*>(x[r]->t.data);
      for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>(r + 1 + i % 5);
      in[r] = &x[r]->t;
      out[r] = &x[r]->t;
    }
  }
  // Elements that are not `scale` times the sum, on either replica.
  int64_t wrong(float scale) const {
    int64_t bad = 0;
    for (int r = 0; r < 2; ++r) {
      const float* p = static_cast<const float*>(x[r]->t.data);
      for (size_t i = 0; i < x[r]->count(); ++i) bad += p[i] != scale * static_cast<float>(3 + 2 * (i % 5));
    }
    return bad;
  }
};

TEST_P(CrossDeviceOpsPluginsTest, StartReturnsBeforeTheWorkIsDone) {
  Cdo cdo(GetParam());
  // 2 x 32 MiB takes milliseconds to reduce; a start that did the work
  // itself would leave nothing for a zero-timeout wait to miss. The test
  // thread could be descheduled for that long on a loaded machine, so it
  // passes when any of three tries sees the work still running.
  bool seen_running = false;
  for (int attempt = 0; attempt < 3 && !seen_running; ++attempt) {
    Pair p(8 << 20);
    strata_cdo_request_t req = nullptr;
    strata_error err;
    strata_error_init(&err);
    ASSERT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_SUM, 1, 2, p.in, p.out, &req, &err), STRATA_OK)
        << err.message;
    const strata_status_t polled = cdo.vt->request_wait(cdo.h, req, 0, &err);
    if (polled == STRATA_ERR_DEADLINE_EXCEEDED) {
      seen_running = true;
      EXPECT_NE(std::string(err.message).find("still running"), std::string::npos) << err.message;
      // The request stays live after a missed deadline.
      strata_error_init(&err);
      ASSERT_EQ(cdo.vt->request_wait(cdo.h, req, 60000, &err), STRATA_OK) << err.message;
    } else {
      ASSERT_EQ(polled, STRATA_OK) << err.message;
    }
    EXPECT_EQ(p.wrong(1.0f), 0);
  }
  EXPECT_TRUE(seen_running) << "all_reduce_start of 2 x 32 MiB finished before returning, three times";
}

TEST_P(CrossDeviceOpsPluginsTest, StartedBatchesFinishBeforeLaterCallsAndDestroy) {
  strata_error err;
  strata_error_init(&err);
  {
    Cdo cdo(GetParam());
    // Started, then a blocking all_reduce on the started one's outputs: it
    // must see them reduced (3 + 2 (i % 5), twice over: 2x).
    Pair a(1 << 20), b(1 << 20);
    strata_cdo_request_t ra = nullptr, rb = nullptr;
    ASSERT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_SUM, 1, 2, a.in, a.out, &ra, &err), STRATA_OK);
    ASSERT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_SUM, 1, 2, a.in, a.out, &rb, &err), STRATA_OK);
    ASSERT_EQ(cdo.vt->all_reduce(cdo.h, STRATA_REDUCE_SUM, 1, 2, a.in, a.out, &err), STRATA_OK) << err.message;
    EXPECT_EQ(a.wrong(4.0f), 0);  // (x0 + x1) -> 2 (x0 + x1) -> 4 (x0 + x1), in order
    // Waited out of order: both are done already.
    EXPECT_EQ(cdo.vt->request_wait(cdo.h, rb, 5000, &err), STRATA_OK) << err.message;
    EXPECT_EQ(cdo.vt->request_wait(cdo.h, ra, 5000, &err), STRATA_OK) << err.message;
    // Started and never waited for: destroying the instance finishes it
    // before the tensors go away.
    strata_cdo_request_t rc = nullptr;
    ASSERT_EQ(cdo.vt->all_reduce_start(cdo.h, STRATA_REDUCE_SUM, 1, 2, b.in, b.out, &rc, &err), STRATA_OK);
    cdo.inst = PluginInstance();
    EXPECT_EQ(b.wrong(1.0f), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    CrossDeviceOps, CrossDeviceOpsPluginsTest,
    ::testing::Values(CdoCase{"reduction_to_one_device", "{}", "reduction_to_one_device"},
                      CdoCase{"reduction_to_one_device", R"({"reduce_to_device": "cpu:2"})", "reduction_to_cpu2"},
                      CdoCase{"hierarchical_copy", R"({"num_packs": 0})", "hierarchical_copy_packs0"},
                      CdoCase{"hierarchical_copy", "{}", "hierarchical_copy_packs1"},
                      CdoCase{"hierarchical_copy", R"({"num_packs": 3})", "hierarchical_copy_packs3"}),
    [](const ::testing::TestParamInfo<CdoCase>& i) { return i.param.label; });

TEST(CrossDeviceOpsPluginsTest, BadOptionsNameTheKey) {
  for (const auto& [name, opts, key] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"hierarchical_copy", R"({"bytes_per_pack": 1})", "'bytes_per_pack'"},
           {"hierarchical_copy", R"({"num_packs": -1})", "'num_packs'"},
           {"reduction_to_one_device", R"({"device": "cpu:0"})", "'device'"},
           {"reduction_to_one_device", R"({"reduce_to_device": "xpu"})", "'reduce_to_device'"}}) {
    try {
      PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, name, opts);
      ADD_FAILURE() << name << " accepted " << opts;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace strata::test
