// SPDX-License-Identifier: Apache-2.0
// The "nccl" CrossDeviceOps (NcclAllReduce), loaded through the real plugin
// host and driven through its C vtable.
//
// NcclCdoTest: runs anywhere (no GPU needed): the plugin loads, options are
// checked, host tensors are refused with the message pointing to "ring",
// and a CUDA tensor without a visible GPU is a clear error.
// NcclCdoGpuTest (ctest label "gpu"): tensors cudaMalloc'ed on GPU 0 (one
// replica = one GPU) and, with >= 2 GPUs visible, on GPUs 0 and 1; every
// value is small integers, so every result is exact and checked bit for bit
// after copying it back. Skipped when no CUDA device is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/gpu_skip.h"
#include "strata/plugin_host.hpp"
#include "strata/sdk/kernels.hpp"
#include "strata/strategy.hpp"

namespace strata::test {
namespace {

using nlohmann::json;
using sdk::dtype_equal;

const DLDataType kF32{kDLFloat, 32, 1}, kF64{kDLFloat, 64, 1}, kF16{kDLFloat, 16, 1}, kBF16{kDLBfloat, 16, 1},
    kI32{kDLInt, 32, 1}, kI64{kDLInt, 64, 1}, kU8{kDLUInt, 8, 1};
const std::vector<DLDataType> kDtypes = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8};

void load_plugins() {
  static bool done = [] {
    PluginHost::global().load_explicit(NCCL_CDO_PLUGIN);
    return true;
  }();
  (void)done;
}

// ------------------------------------------------------------ tensors ---

// A tensor on the host (device < 0) or on CUDA device `device`, with a host
// mirror for setting and checking values.
struct Tensor {
  DLDataType dtype;
  std::vector<int64_t> shape;
  int device;
  std::vector<unsigned char> host;  // the values (host tensors: the data itself)
  void* dev = nullptr;
  DLTensor t{};

  Tensor(DLDataType d, std::vector<int64_t> s, int device_ = -1) : dtype(d), shape(std::move(s)), device(device_) {
    host.assign(nbytes() + 8, 0xAB);
    if (device >= 0) {
      EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&dev, nbytes() + 8), cudaSuccess);
      EXPECT_EQ(cudaMemset(dev, 0xAB, nbytes() + 8), cudaSuccess);
    }
    t = DLTensor{device >= 0 ? dev : host.data(), device >= 0 ? DLDevice{kDLCUDA, device} : DLDevice{kDLCPU, 0},
                 int32_t(shape.size()), d, shape.data(), nullptr, 0};
  }
  ~Tensor() {
    if (dev != nullptr) cudaFree(dev);
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  size_t count() const {
    size_t n = 1;
    for (int64_t x : shape) n *= size_t(x);
    return n;
  }
  size_t nbytes() const { return count() * (dtype.bits / 8); }
  void set(size_t i, double v) {
    void* p = host.data();
    if (dtype_equal(dtype, kF32)) static_cast<float*>(p)[i] = float(v);
    else if (dtype_equal(dtype, kF64)) static_cast<double*>(p)[i] = v;
    else if (dtype_equal(dtype, kF16)) static_cast<uint16_t*>(p)[i] = sdk::kernels::float_to_half(float(v));
    else if (dtype_equal(dtype, kBF16)) static_cast<uint16_t*>(p)[i] = sdk::kernels::float_to_bfloat16(float(v));
    else if (dtype_equal(dtype, kI32)) static_cast<int32_t*>(p)[i] = int32_t(v);
    else if (dtype_equal(dtype, kI64)) static_cast<int64_t*>(p)[i] = int64_t(v);
    else static_cast<uint8_t*>(p)[i] = uint8_t(v);
  }
  double get(size_t i) const {
    const void* p = host.data();
    if (dtype_equal(dtype, kF32)) return static_cast<const float*>(p)[i];
    if (dtype_equal(dtype, kF64)) return static_cast<const double*>(p)[i];
    if (dtype_equal(dtype, kF16)) return sdk::kernels::half_to_float(static_cast<const uint16_t*>(p)[i]);
    if (dtype_equal(dtype, kBF16)) return sdk::kernels::bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
    if (dtype_equal(dtype, kI32)) return static_cast<const int32_t*>(p)[i];
    if (dtype_equal(dtype, kI64)) return double(static_cast<const int64_t*>(p)[i]);
    return static_cast<const uint8_t*>(p)[i];
  }
  void fill(const std::function<double(size_t)>& f) {
    for (size_t i = 0; i < count(); ++i) set(i, f(i));
    upload();
  }
  void upload() {
    if (device >= 0) {
      ASSERT_EQ(cudaMemcpy(dev, host.data(), nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  void download() {
    if (device >= 0) {
      ASSERT_EQ(cudaMemcpy(host.data(), dev, nbytes() + 8, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }
  // The 8 guard bytes past the end are untouched.
  bool guard_intact() const {
    for (size_t i = nbytes(); i < nbytes() + 8; ++i)
      if (host[i] != 0xAB) return false;
    return true;
  }
};

std::string name_of(DLDataType d) { return sdk::dtype_name(d); }

// ---------------------------------------------------------------- CDO ---

struct Status {
  strata_status_t code = STRATA_OK;
  std::string message;
};

class Cdo {
 public:
  explicit Cdo(const std::string& options, const std::string& name = "nccl")
      : inst_(PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, name, options)),
        vt_(inst_.vtable_as<strata_cross_device_ops_vtable>()),
        h_(static_cast<strata_cross_device_ops_t>(inst_.handle())) {}
  const strata_cross_device_ops_vtable* vt() const { return vt_; }

  Status all_reduce(uint32_t op, const std::vector<Tensor*>& in, const std::vector<Tensor*>& out, uint32_t nr) {
    auto i = cptrs(in);
    auto o = ptrs(out);
    return call([&](strata_error* e) { return vt_->all_reduce(h_, op, uint32_t(in.size() / nr), nr, i.data(), o.data(), e); });
  }
  Status reduce(uint32_t op, const std::vector<Tensor*>& in, const std::vector<Tensor*>& out, uint32_t nr) {
    auto i = cptrs(in);
    auto o = ptrs(out);
    return call([&](strata_error* e) { return vt_->reduce(h_, op, uint32_t(in.size() / nr), nr, i.data(), o.data(), e); });
  }
  Status broadcast(Tensor& src, const std::vector<Tensor*>& out) {
    auto o = ptrs(out);
    return call([&](strata_error* e) { return vt_->broadcast(h_, &src.t, uint32_t(o.size()), o.data(), e); });
  }
  Status all_gather(const std::vector<Tensor*>& in, int32_t axis, const std::vector<Tensor*>& out) {
    auto i = cptrs(in);
    auto o = ptrs(out);
    return call([&](strata_error* e) { return vt_->all_gather(h_, uint32_t(in.size()), i.data(), axis, o.data(), e); });
  }
  Status reduce_scatter(uint32_t op, const std::vector<Tensor*>& in, const std::vector<Tensor*>& out) {
    auto i = cptrs(in);
    auto o = ptrs(out);
    return call([&](strata_error* e) { return vt_->reduce_scatter(h_, op, uint32_t(in.size()), i.data(), o.data(), e); });
  }
  Status barrier() {
    const DLTensor* i = nullptr;
    DLTensor* o = nullptr;
    return call([&](strata_error* e) { return vt_->all_reduce(h_, STRATA_REDUCE_SUM, 0, 1, &i, &o, e); });
  }

 private:
  static std::vector<const DLTensor*> cptrs(const std::vector<Tensor*>& v) {
    std::vector<const DLTensor*> p;
    for (Tensor* x : v) p.push_back(&x->t);
    return p;
  }
  static std::vector<DLTensor*> ptrs(const std::vector<Tensor*>& v) {
    std::vector<DLTensor*> p;
    for (Tensor* x : v) p.push_back(&x->t);
    return p;
  }
  template <class F>
  static Status call(F f) {
    strata_error err;
    strata_error_init(&err);
    Status s;
    s.code = f(&err);
    if (s.code != STRATA_OK) s.message = err.message;
    return s;
  }
  PluginInstance inst_;
  const strata_cross_device_ops_vtable* vt_;
  strata_cross_device_ops_t h_;
};

Status create_status(const std::string& options) {
  try {
    Cdo c(options);
    return {};
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
}

// Small non-negative integers: every sum and half-sum of two is exact in
// every dtype (uint8 included).
double value(int replica, int tensor, size_t i) { return double((i * 7 + size_t(replica) * 4 + size_t(tensor) * 3) % 13); }

// ============================================================ no GPU ===
// (The cross-process tests at the end create the "nccl" transport, which
// another plugin provides; they skip themselves without it.)

class NcclCdoTest : public ::testing::Test {
 protected:
  void SetUp() override { load_plugins(); }
};

TEST_F(NcclCdoTest, PluginLoadsAndFillsTheVtable) {
  Cdo c("{}");
  ASSERT_NE(c.vt(), nullptr);
  EXPECT_GE(c.vt()->struct_size, STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_0);
  EXPECT_NE(c.vt()->all_reduce, nullptr);
  EXPECT_NE(c.vt()->reduce, nullptr);
  EXPECT_NE(c.vt()->broadcast, nullptr);
  EXPECT_NE(c.vt()->all_gather, nullptr);
  EXPECT_NE(c.vt()->reduce_scatter, nullptr);
}

TEST_F(NcclCdoTest, OptionsAreChecked) {
  for (const char* ok : {R"({})", R"({"num_packs": 0})", R"({"num_packs": 1})", R"({"num_packs": 4})",
                         R"({"bytes_per_pack": 1048576})", R"({"timeout_s": 5})",
                         R"({"rank": 0, "world_size": 1, "communicator": "x"})"})
    EXPECT_EQ(create_status(ok).code, STRATA_OK) << ok << ": " << create_status(ok).message;
  struct Bad {
    const char* options;
    const char* mentions;
  };
  for (const Bad& b : {Bad{R"({"num_packs": -1})", "num_packs"}, Bad{R"({"num_packs": "two"})", "num_packs"},
                       Bad{R"({"num_packs": 1.5})", "num_packs"}, Bad{R"({"num_packs": 100000})", "num_packs"},
                       Bad{R"({"bytes_per_pack": -3})", "bytes_per_pack"}, Bad{R"({"packs": 2})", "packs"},
                       Bad{R"({"timeout_s": 0})", "timeout_s"}, Bad{R"({"world_size": 0})", "world_size"},
                       Bad{R"({"rank": 2, "world_size": 2})", "rank"}, Bad{R"({"transport": 7})", "transport"},
                       Bad{R"([1, 2])", "JSON object"}, Bad{R"({nope)", "JSON"}}) {
    const Status s = create_status(b.options);
    EXPECT_EQ(s.code, STRATA_ERR_INVALID_ARGUMENT) << b.options << ": " << s.message;
    EXPECT_NE(s.message.find(b.mentions), std::string::npos) << b.options << ": " << s.message;
  }
}

TEST_F(NcclCdoTest, HostTensorsAreRejectedPointingToRing) {
  Cdo c("{}");
  Tensor a(kF32, {4}), b(kF32, {4}), o(kF32, {4}), p(kF32, {4});
  a.fill([](size_t i) { return double(i); });
  auto expect_refusal = [](const Status& s, const char* what) {
    EXPECT_EQ(s.code, STRATA_ERR_INVALID_ARGUMENT) << what << ": " << s.message;
    EXPECT_NE(s.message.find("NcclAllReduce needs GPU replicas"), std::string::npos) << what << ": " << s.message;
    EXPECT_NE(s.message.find("\"ring\""), std::string::npos) << what << ": " << s.message;
  };
  expect_refusal(c.all_reduce(STRATA_REDUCE_SUM, {&a, &b}, {&o, &p}, 2), "all_reduce");
  expect_refusal(c.reduce(STRATA_REDUCE_MEAN, {&a, &b}, {&o}, 2), "reduce");
  expect_refusal(c.broadcast(a, {&o, &p}), "broadcast");
  Tensor g(kF32, {8}), h(kF32, {8});
  expect_refusal(c.all_gather({&a, &b}, 0, {&g, &h}), "all_gather");
  Tensor s1(kF32, {2}), s2(kF32, {2});
  expect_refusal(c.reduce_scatter(STRATA_REDUCE_SUM, {&a, &b}, {&s1, &s2}), "reduce_scatter");
  // The host data was not touched.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.get(i), double(i));
}

TEST_F(NcclCdoTest, NoVisibleGpuIsAClearError) {
  if (strata::num_gpus() > 0) GTEST_SKIP() << "a CUDA device is visible; this checks machines without one";
  // Never dereferenced: the device check comes first.
  std::vector<int64_t> shape{4};
  static float fake[8];
  DLTensor x{fake, DLDevice{kDLCUDA, 0}, 1, kF32, shape.data(), nullptr, 0};
  const DLTensor* in[1] = {&x};
  DLTensor* out[1] = {&x};
  strata_error err;
  strata_error_init(&err);
  PluginInstance inst = PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, "nccl", "{}");
  auto* vt = inst.vtable_as<strata_cross_device_ops_vtable>();
  auto* h = static_cast<strata_cross_device_ops_t>(inst.handle());
  const strata_status_t code = vt->all_reduce(h, STRATA_REDUCE_SUM, 1, 1, in, out, &err);
  EXPECT_EQ(code, STRATA_ERR_FAILED_PRECONDITION) << err.message;
  EXPECT_NE(std::string(err.message).find("no CUDA device is visible"), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find("ring"), std::string::npos) << err.message;
}

// ============================================================ one GPU ===

class NcclCdoGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { load_plugins(); }
};

TEST_F(NcclCdoGpuTest, AllReduceOneGpuEveryDtypeAndOp) {
  REQUIRE_GPUS(1);
  Cdo c("{}");
  for (DLDataType d : kDtypes)
    for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MIN, STRATA_REDUCE_MAX}) {
      SCOPED_TRACE(name_of(d) + " op " + std::to_string(op));
      Tensor in(d, {3, 37}, 0), out(d, {3, 37}, 0);
      in.fill([](size_t i) { return value(0, 0, i); });
      const Status s = c.all_reduce(op, {&in}, {&out}, 1);
      ASSERT_EQ(s.code, STRATA_OK) << s.message;
      out.download();
      for (size_t i = 0; i < out.count(); ++i) ASSERT_EQ(out.get(i), value(0, 0, i)) << "element " << i;
      EXPECT_TRUE(out.guard_intact());
      // In place (the output is the input).
      Tensor x(d, {129}, 0);
      x.fill([](size_t i) { return value(0, 1, i); });
      ASSERT_EQ(c.all_reduce(op, {&x}, {&x}, 1).code, STRATA_OK);
      x.download();
      for (size_t i = 0; i < x.count(); ++i) ASSERT_EQ(x.get(i), value(0, 1, i)) << "element " << i;
      EXPECT_TRUE(x.guard_intact());
    }
}

// Several tensors of mixed sizes and dtypes (an empty one among them) in one
// batch, with every packing: each output gets exactly its own input back.
TEST_F(NcclCdoGpuTest, BatchReducePackingOneGpu) {
  REQUIRE_GPUS(1);
  const std::vector<std::pair<DLDataType, int64_t>> spec = {{kF32, 3},   {kF32, 1000}, {kI32, 17},  {kF16, 5},
                                                            {kF32, 0},   {kF64, 256},  {kBF16, 33}, {kF32, 1},
                                                            {kU8, 100},  {kI64, 9},    {kF16, 4096}};
  for (const char* options : {R"({"num_packs": 1})", R"({"num_packs": 2})", R"({"num_packs": 0})",
                              R"({"num_packs": 7})", R"({"bytes_per_pack": 64})"}) {
    SCOPED_TRACE(options);
    Cdo c(options);
    for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
      std::vector<std::unique_ptr<Tensor>> ins, outs;
      std::vector<Tensor*> in, out;
      for (size_t t = 0; t < spec.size(); ++t) {
        ins.push_back(std::make_unique<Tensor>(spec[t].first, std::vector<int64_t>{spec[t].second}, 0));
        outs.push_back(std::make_unique<Tensor>(spec[t].first, std::vector<int64_t>{spec[t].second}, 0));
        ins.back()->fill([t](size_t i) { return value(0, int(t), i); });
        in.push_back(ins.back().get());
        out.push_back(outs.back().get());
      }
      const Status s = c.all_reduce(op, in, out, 1);
      ASSERT_EQ(s.code, STRATA_OK) << s.message;
      for (size_t t = 0; t < spec.size(); ++t) {
        outs[t]->download();
        for (size_t i = 0; i < outs[t]->count(); ++i)
          ASSERT_EQ(outs[t]->get(i), value(0, int(t), i)) << "tensor " << t << " element " << i;
        EXPECT_TRUE(outs[t]->guard_intact()) << "tensor " << t;
      }
    }
  }
}

TEST_F(NcclCdoGpuTest, BroadcastReduceGatherScatterOneGpu) {
  REQUIRE_GPUS(1);
  Cdo c("{}");
  // broadcast from a device tensor and from a host tensor
  Tensor src(kF32, {50}, 0), dst(kF32, {50}, 0), hsrc(kI64, {50}), dst2(kI64, {50}, 0);
  src.fill([](size_t i) { return value(2, 0, i); });
  hsrc.fill([](size_t i) { return value(3, 0, i); });
  ASSERT_EQ(c.broadcast(src, {&dst}).code, STRATA_OK);
  ASSERT_EQ(c.broadcast(hsrc, {&dst2}).code, STRATA_OK);
  dst.download();
  dst2.download();
  for (size_t i = 0; i < 50; ++i) {
    ASSERT_EQ(dst.get(i), value(2, 0, i));
    ASSERT_EQ(dst2.get(i), value(3, 0, i));
  }
  // reduce to a host output and to a device output
  Tensor in(kF64, {20}, 0), hout(kF64, {20}), dout(kF64, {20}, 0);
  in.fill([](size_t i) { return value(0, 5, i); });
  ASSERT_EQ(c.reduce(STRATA_REDUCE_SUM, {&in, &in}, {&hout, &dout}, 1).code, STRATA_OK);
  dout.download();
  for (size_t i = 0; i < 20; ++i) {
    ASSERT_EQ(hout.get(i), value(0, 5, i));
    ASSERT_EQ(dout.get(i), value(0, 5, i));
  }
  // all_gather along axis 1 and reduce_scatter with one replica: copies
  Tensor g(kI32, {2, 3}, 0), go(kI32, {2, 3}, 0), rs(kBF16, {6, 2}, 0), rso(kBF16, {6, 2}, 0);
  g.fill([](size_t i) { return double(i); });
  rs.fill([](size_t i) { return double(i); });
  ASSERT_EQ(c.all_gather({&g}, 1, {&go}).code, STRATA_OK);
  ASSERT_EQ(c.reduce_scatter(STRATA_REDUCE_SUM, {&rs}, {&rso}).code, STRATA_OK);
  go.download();
  rso.download();
  for (size_t i = 0; i < 6; ++i) ASSERT_EQ(go.get(i), double(i));
  for (size_t i = 0; i < 12; ++i) ASSERT_EQ(rso.get(i), double(i));
}

TEST_F(NcclCdoGpuTest, TwoReplicasOnOneGpuAreRefusedPointingToRing) {
  REQUIRE_GPUS(1);
  Cdo c("{}");
  Tensor a(kF32, {4}, 0), b(kF32, {4}, 0);
  const Status s = c.all_reduce(STRATA_REDUCE_SUM, {&a, &b}, {&a, &b}, 2);
  EXPECT_EQ(s.code, STRATA_ERR_INVALID_ARGUMENT) << s.message;
  EXPECT_NE(s.message.find("both on cuda:0"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("ring"), std::string::npos) << s.message;
}

// tf.distribute's defaults on GPUs: mirrored picks NcclAllReduce (with
// named GPUs and with its every-visible-GPU default) and
// multi_worker_mirrored's AUTO picks NCCL; an explicit choice wins.
TEST_F(NcclCdoGpuTest, StrategiesPickNcclOnGpuDevices) {
  REQUIRE_GPUS(1);
  Strategy m = Strategy::create("mirrored", R"({"devices": ["gpu:0"]})");
  EXPECT_EQ(json::parse(m.extended().describe_json()).value("cross_device_ops", ""), "nccl")
      << m.extended().describe_json();
  Strategy all = Strategy::create("mirrored", "{}");
  const json da = json::parse(all.extended().describe_json());
  EXPECT_EQ(da.value("cross_device_ops", ""), "nccl") << da.dump();
  EXPECT_EQ(da.at("worker_devices").at(0), "gpu:0") << da.dump();
  Strategy w = Strategy::create("multi_worker_mirrored", R"({"devices": ["gpu:0"]})");
  const json d = json::parse(w.extended().describe_json());
  EXPECT_EQ(d.value("communication", ""), "NCCL") << d.dump();
  EXPECT_EQ(d.value("cross_device_ops", ""), "nccl") << d.dump();
  Strategy e = Strategy::create("mirrored", R"({"devices": ["gpu:0"], "cross_device_ops": "ring"})");
  EXPECT_EQ(json::parse(e.extended().describe_json()).value("cross_device_ops", ""), "ring");
  Strategy h = Strategy::create("mirrored", R"({"devices": ["cpu:0"]})");
  EXPECT_EQ(json::parse(h.extended().describe_json()).value("cross_device_ops", ""), "reduction_to_one_device");
}

// =========================================================== two GPUs ===

TEST_F(NcclCdoGpuTest, TwoGpusAllReduceBatchBroadcastGatherScatter) {
  REQUIRE_GPUS(2);
  for (const char* options : {R"({"num_packs": 1})", R"({"num_packs": 2})", R"({"num_packs": 0})"}) {
    SCOPED_TRACE(options);
    Cdo c(options);
    for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MAX}) {
      std::vector<std::unique_ptr<Tensor>> keep;
      std::vector<Tensor*> in, out;
      // Two tensors of every dtype, so that packing joins them.
      auto dtype_of = [](size_t t) { return kDtypes[t % kDtypes.size()]; };
      for (size_t t = 0; t < 2 * kDtypes.size(); ++t)
        for (int r = 0; r < 2; ++r) {
          keep.push_back(std::make_unique<Tensor>(dtype_of(t), std::vector<int64_t>{int64_t(11 + 40 * t)}, r));
          keep.back()->fill([r, t](size_t i) { return value(r, int(t), i); });
          in.push_back(keep.back().get());
          keep.push_back(std::make_unique<Tensor>(dtype_of(t), std::vector<int64_t>{int64_t(11 + 40 * t)}, r));
          out.push_back(keep.back().get());
        }
      const Status s = c.all_reduce(op, in, out, 2);
      ASSERT_EQ(s.code, STRATA_OK) << s.message;
      for (size_t k = 0; k < out.size(); ++k) {
        out[k]->download();
        const int t = int(k / 2);
        const DLDataType d = dtype_of(size_t(t));
        for (size_t i = 0; i < out[k]->count(); ++i) {
          const double a = value(0, t, i), b = value(1, t, i);
          double want = op == STRATA_REDUCE_SUM ? a + b : op == STRATA_REDUCE_MAX ? std::max(a, b) : (a + b) / 2;
          if (op == STRATA_REDUCE_MEAN && d.code != kDLFloat && d.code != kDLBfloat) want = double(int64_t(a + b) / 2);
          ASSERT_EQ(out[k]->get(i), want) << name_of(d) << " tensor " << t << " replica " << k % 2 << " element " << i;
        }
        EXPECT_TRUE(out[k]->guard_intact());
      }
    }
  }
  Cdo c("{}");
  // broadcast from GPU 1's tensor to both
  Tensor src(kF32, {64}, 1), d0(kF32, {64}, 0), d1(kF32, {64}, 1);
  src.fill([](size_t i) { return value(1, 9, i); });
  ASSERT_EQ(c.broadcast(src, {&d0, &d1}).code, STRATA_OK);
  d0.download();
  d1.download();
  for (size_t i = 0; i < 64; ++i) {
    ASSERT_EQ(d0.get(i), value(1, 9, i));
    ASSERT_EQ(d1.get(i), value(1, 9, i));
  }
  // all_gather along axis 1: [2, 3] from each -> [2, 6], rows interleaved
  Tensor g0(kI32, {2, 3}, 0), g1(kI32, {2, 3}, 1), o0(kI32, {2, 6}, 0), o1(kI32, {2, 6}, 1);
  g0.fill([](size_t i) { return double(i); });
  g1.fill([](size_t i) { return double(100 + i); });
  ASSERT_EQ(c.all_gather({&g0, &g1}, 1, {&o0, &o1}).code, STRATA_OK);
  o0.download();
  o1.download();
  const double want_g[12] = {0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105};
  for (size_t i = 0; i < 12; ++i) {
    ASSERT_EQ(o0.get(i), want_g[i]) << i;
    ASSERT_EQ(o1.get(i), want_g[i]) << i;
  }
  // reduce_scatter SUM: [4] from each; replica r gets slice r of the sum
  Tensor s0(kF32, {4}, 0), s1(kF32, {4}, 1), r0(kF32, {2}, 0), r1(kF32, {2}, 1);
  s0.fill([](size_t i) { return double(i); });
  s1.fill([](size_t i) { return double(10 * i); });
  ASSERT_EQ(c.reduce_scatter(STRATA_REDUCE_SUM, {&s0, &s1}, {&r0, &r1}).code, STRATA_OK);
  r0.download();
  r1.download();
  EXPECT_EQ(r0.get(0), 0.0);
  EXPECT_EQ(r0.get(1), 11.0);
  EXPECT_EQ(r1.get(0), 22.0);
  EXPECT_EQ(r1.get(1), 33.0);
}

// ======================================================= across processes ===

// world_size ranks as threads of this process (the host's in-process store
// serves the rendezvous), each with `nr` replicas on GPUs of its own, over
// the "nccl" transport: the hierarchical path (local NCCL reduce, the
// transport's all-reduce, local broadcast). Needs world * nr GPUs (NCCL
// cannot put two ranks on one GPU) and the nccl transport plugin.
void run_cross_process(int world, int nr) {
  try {
    PluginHost::global().create(STRATA_KIND_TRANSPORT, "nccl", "{}");
  } catch (const Error& e) {
    GTEST_SKIP() << "the nccl transport plugin is not available: " << e.what();
  }
  static std::atomic<int> comm_id{0};
  const std::string comm = "nccl-cdo-test-" + std::to_string(comm_id++);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        Cdo c(json{{"rank", rank}, {"world_size", world}, {"communicator", comm}, {"transport", "nccl"},
                   {"timeout_s", 60}}
                  .dump());
        auto gpu = [&](int r) { return rank * nr + r; };
        const int n_all = world * nr;
        // all_reduce SUM and MEAN, float32 and int32, packed together
        for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
          std::vector<std::unique_ptr<Tensor>> keep;
          std::vector<Tensor*> in, out;
          for (int t = 0; t < 4; ++t)
            for (int r = 0; r < nr; ++r) {
              const DLDataType d = t % 2 == 0 ? kF32 : kI32;
              keep.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{int64_t(33 + 100 * t)}, gpu(r)));
              keep.back()->fill([&, t, r](size_t i) { return value(gpu(r), t, i); });
              in.push_back(keep.back().get());
              keep.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{int64_t(33 + 100 * t)}, gpu(r)));
              out.push_back(keep.back().get());
            }
          const Status s = c.all_reduce(op, in, out, uint32_t(nr));
          ASSERT_EQ(s.code, STRATA_OK) << "rank " << rank << ": " << s.message;
          for (size_t k = 0; k < out.size(); ++k) {
            out[k]->download();
            const int t = int(k) / nr;
            for (size_t i = 0; i < out[k]->count(); ++i) {
              double sum = 0;
              for (int g = 0; g < n_all; ++g) sum += value(g, t, i);
              double want = sum;
              if (op == STRATA_REDUCE_MEAN) want = t % 2 == 0 ? sum / n_all : double(int64_t(sum) / n_all);
              ASSERT_EQ(out[k]->get(i), want) << "rank " << rank << " tensor " << t << " element " << i;
            }
          }
        }
        // broadcast of rank 0's source to every replica of every rank
        Tensor src(kF64, {40}, gpu(0));
        src.fill([&](size_t i) { return value(rank, 7, i); });
        std::vector<std::unique_ptr<Tensor>> dst;
        std::vector<Tensor*> dp;
        for (int r = 0; r < nr; ++r) {
          dst.push_back(std::make_unique<Tensor>(kF64, std::vector<int64_t>{40}, gpu(r)));
          dp.push_back(dst.back().get());
        }
        Status s = c.broadcast(src, dp);
        ASSERT_EQ(s.code, STRATA_OK) << s.message;
        for (Tensor* x : dp) {
          x->download();
          for (size_t i = 0; i < 40; ++i) ASSERT_EQ(x->get(i), value(0, 7, i));
        }
        // all_gather along axis 0 in (rank, replica) order
        std::vector<std::unique_ptr<Tensor>> gi, go;
        std::vector<Tensor*> gin, gout;
        for (int r = 0; r < nr; ++r) {
          gi.push_back(std::make_unique<Tensor>(kI64, std::vector<int64_t>{3}, gpu(r)));
          gi.back()->fill([&, r](size_t i) { return double(100 * gpu(r) + int(i)); });
          gin.push_back(gi.back().get());
          go.push_back(std::make_unique<Tensor>(kI64, std::vector<int64_t>{int64_t(3 * n_all)}, gpu(r)));
          gout.push_back(go.back().get());
        }
        s = c.all_gather(gin, 0, gout);
        ASSERT_EQ(s.code, STRATA_OK) << s.message;
        for (Tensor* x : gout) {
          x->download();
          for (size_t i = 0; i < x->count(); ++i) ASSERT_EQ(x->get(i), double(100 * int(i / 3) + int(i % 3)));
        }
        // a barrier (an all_reduce of no tensors)
        s = c.barrier();
        EXPECT_EQ(s.code, STRATA_OK) << s.message;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
}

TEST_F(NcclCdoGpuTest, TwoRanksOverTheNcclTransportOneGpuEach) {
  REQUIRE_GPUS(2);
  run_cross_process(2, 1);
}

TEST_F(NcclCdoGpuTest, TwoRanksOverTheNcclTransportTwoGpusEach) {
  REQUIRE_GPUS(4);
  run_cross_process(2, 2);
}

}  // namespace
}  // namespace strata::test
