// SPDX-License-Identifier: Apache-2.0
// The ring CrossDeviceOps with GPU tensors (CUDA builds only): they are
// staged through pinned host memory, so every result must be bit-identical
// to the same call on host tensors.
//
// RingGpuStagingTest: runs anywhere; without a GPU a CUDA tensor is a clear
// error, not a crash. RingGpuTest (ctest label "gpu"): needs one GPU; the
// local replicas all live on gpu:0 (the ring accepts several per device),
// and two ranks run as threads over the in-process fixture transport.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
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

namespace strata::test {
namespace {

using nlohmann::json;
using sdk::dtype_equal;

const std::vector<DLDataType> kDtypes = {sdk::kFloat32, sdk::kFloat64, sdk::kFloat16,
                                         sdk::kBFloat16, sdk::kInt32,   sdk::kInt64};

void load_plugins() {
  static bool done = [] {
    PluginHost::global().load_explicit(RING_PLUGIN);
    PluginHost::global().load_explicit(RING_INPROC_TRANSPORT);
    return true;
  }();
  (void)done;
}

// Bytes of `count` elements of `d`: values with fractions, so that sums
// round (bit-identity then means the same arithmetic, not just exactness).
std::vector<unsigned char> make_values(DLDataType d, size_t count, int seed) {
  std::vector<unsigned char> b(count * (d.bits / 8));
  for (size_t i = 0; i < count; ++i) {
    const double v = double((i * 37 + size_t(seed) * 11) % 101) / 7.0 - 5.0;
    void* p = b.data();
    if (dtype_equal(d, sdk::kFloat32)) static_cast<float*>(p)[i] = float(v);
    else if (dtype_equal(d, sdk::kFloat64)) static_cast<double*>(p)[i] = v;
    else if (dtype_equal(d, sdk::kFloat16)) static_cast<uint16_t*>(p)[i] = sdk::kernels::float_to_half(float(v));
    else if (dtype_equal(d, sdk::kBFloat16)) static_cast<uint16_t*>(p)[i] = sdk::kernels::float_to_bfloat16(float(v));
    else if (dtype_equal(d, sdk::kInt32)) static_cast<int32_t*>(p)[i] = int32_t(std::lround(v * 7));
    else static_cast<int64_t*>(p)[i] = int64_t(std::lround(v * 7));
  }
  return b;
}

// A tensor on the host or on gpu:0 holding `bytes`.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<unsigned char> host;
  void* dev = nullptr;
  DLTensor t{};
  Tensor(DLDataType d, std::vector<int64_t> s, bool gpu, const std::vector<unsigned char>& init = {})
      : shape(std::move(s)) {
    size_t n = 1;
    for (int64_t x : shape) n *= size_t(x);
    host.assign(n * (d.bits / 8), 0);
    if (!init.empty()) host = init;
    if (gpu) {
      EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&dev, host.size() + 1), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    t = DLTensor{gpu ? dev : host.data(), gpu ? DLDevice{kDLCUDA, 0} : DLDevice{kDLCPU, 0}, int32_t(shape.size()),
                 d, shape.data(), nullptr, 0};
  }
  ~Tensor() {
    if (dev != nullptr) cudaFree(dev);
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  // The current contents (copied back from the GPU).
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b = host;
    if (dev != nullptr) {
      EXPECT_EQ(cudaMemcpy(b.data(), dev, b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return b;
  }
};

struct Status {
  strata_status_t code = STRATA_OK;
  std::string message;
};

class Cdo {
 public:
  explicit Cdo(const std::string& options)
      : inst_(PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, "ring", options)),
        vt_(inst_.vtable_as<strata_cross_device_ops_vtable>()),
        h_(static_cast<strata_cross_device_ops_t>(inst_.handle())) {}
  template <class F>
  Status call(F f) {
    strata_error err;
    strata_error_init(&err);
    Status s;
    s.code = f(vt_, h_, &err);
    if (s.code != STRATA_OK) s.message = err.message;
    return s;
  }

 private:
  PluginInstance inst_;
  const strata_cross_device_ops_vtable* vt_;
  strata_cross_device_ops_t h_;
};

std::atomic<int> g_comm{0};

// Every collective of the ring on `nr` local replicas, with tensors on the
// GPU or on the host; returns every output's bytes, in a fixed order.
std::vector<std::vector<unsigned char>> run_all(Cdo& c, bool gpu, DLDataType d, uint32_t op, uint32_t nr, int rank,
                                                int world) {
  std::vector<std::vector<unsigned char>> result;
  std::vector<std::unique_ptr<Tensor>> keep;
  auto make = [&](std::vector<int64_t> shape, int seed) {
    size_t n = 1;
    for (int64_t x : shape) n *= size_t(x);
    keep.push_back(std::make_unique<Tensor>(d, std::move(shape), gpu,
                                            seed < 0 ? std::vector<unsigned char>() : make_values(d, n, seed)));
    return keep.back().get();
  };
  // A batch all-reduce of three tensors, the second one in place.
  std::vector<const DLTensor*> in;
  std::vector<DLTensor*> out;
  std::vector<Tensor*> outs;
  for (int t = 0; t < 3; ++t)
    for (uint32_t r = 0; r < nr; ++r) {
      Tensor* x = make({int64_t(5 + 300 * t)}, rank * 100 + int(r) * 10 + t);
      Tensor* y = t == 1 ? x : make({int64_t(5 + 300 * t)}, -1);
      in.push_back(&x->t);
      out.push_back(&y->t);
      outs.push_back(y);
    }
  Status s = c.call([&](auto* vt, auto h, strata_error* e) {
    return vt->all_reduce(h, op, 3, nr, in.data(), out.data(), e);
  });
  EXPECT_EQ(s.code, STRATA_OK) << s.message;
  for (Tensor* y : outs) result.push_back(y->bytes());
  // reduce of the first tensor to one output
  Tensor* ro = make({5}, -1);
  DLTensor* ro_t = &ro->t;
  s = c.call([&](auto* vt, auto h, strata_error* e) { return vt->reduce(h, op, 1, nr, in.data(), &ro_t, e); });
  EXPECT_EQ(s.code, STRATA_OK) << s.message;
  result.push_back(ro->bytes());
  // broadcast
  Tensor* src = make({77}, 1000 + rank);
  std::vector<DLTensor*> dsts;
  std::vector<Tensor*> dst_t;
  for (uint32_t r = 0; r < nr; ++r) {
    dst_t.push_back(make({77}, -1));
    dsts.push_back(&dst_t.back()->t);
  }
  s = c.call([&](auto* vt, auto h, strata_error* e) { return vt->broadcast(h, &src->t, nr, dsts.data(), e); });
  EXPECT_EQ(s.code, STRATA_OK) << s.message;
  for (Tensor* y : dst_t) result.push_back(y->bytes());
  // all_gather along axis 1 of [2, 3]
  std::vector<const DLTensor*> gin;
  std::vector<DLTensor*> gout;
  std::vector<Tensor*> gout_t;
  for (uint32_t r = 0; r < nr; ++r) {
    gin.push_back(&make({2, 3}, 2000 + rank * 10 + int(r))->t);
    gout_t.push_back(make({2, int64_t(3 * nr * uint32_t(world))}, -1));
    gout.push_back(&gout_t.back()->t);
  }
  s = c.call([&](auto* vt, auto h, strata_error* e) { return vt->all_gather(h, nr, gin.data(), 1, gout.data(), e); });
  EXPECT_EQ(s.code, STRATA_OK) << s.message;
  for (Tensor* y : gout_t) result.push_back(y->bytes());
  // reduce_scatter of [parts * 4]
  const int64_t parts = int64_t(nr) * world;
  std::vector<const DLTensor*> sin;
  std::vector<DLTensor*> sout;
  std::vector<Tensor*> sout_t;
  for (uint32_t r = 0; r < nr; ++r) {
    sin.push_back(&make({parts * 4}, 3000 + rank * 10 + int(r))->t);
    sout_t.push_back(make({4}, -1));
    sout.push_back(&sout_t.back()->t);
  }
  s = c.call([&](auto* vt, auto h, strata_error* e) { return vt->reduce_scatter(h, op, nr, sin.data(), sout.data(), e); });
  EXPECT_EQ(s.code, STRATA_OK) << s.message;
  for (Tensor* y : sout_t) result.push_back(y->bytes());
  return result;
}

// ============================================================= no GPU ===

TEST(RingGpuStagingTest, CudaTensorWithoutAGpuIsAClearError) {
  if (strata::num_gpus() > 0) GTEST_SKIP() << "a CUDA device is visible; this checks machines without one";
  load_plugins();
  Cdo c("{}");
  std::vector<int64_t> shape{4};
  static float fake[8];
  DLTensor x{fake, DLDevice{kDLCUDA, 0}, 1, sdk::kFloat32, shape.data(), nullptr, 0};
  const DLTensor* in[1] = {&x};
  DLTensor* out[1] = {&x};
  const Status s = c.call([&](auto* vt, auto h, strata_error* e) { return vt->all_reduce(h, 0, 1, 1, in, out, e); });
  EXPECT_NE(s.code, STRATA_OK);
  EXPECT_NE(s.message.find("staging GPU tensors"), std::string::npos) << s.message;
}

// ================================================================ GPU ===

class RingGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPUS(1);
    load_plugins();
  }
};

// One process, three local replicas all on gpu:0: every collective, dtype
// and op gives the bits of the same call on host replicas.
TEST_F(RingGpuTest, LocalReplicasOnOneGpuMatchHostBits) {
  for (DLDataType d : kDtypes)
    for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MAX}) {
      SCOPED_TRACE(sdk::dtype_name(d) + " op " + std::to_string(op));
      Cdo host_cdo("{}"), gpu_cdo("{}");
      const auto want = run_all(host_cdo, false, d, op, 3, 0, 1);
      const auto got = run_all(gpu_cdo, true, d, op, 3, 0, 1);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], want[k]) << "output " << k;
    }
}

// Two ranks (threads over the in-process transport), each with one replica
// on gpu:0 and packing across the batch: the bits of the host run.
TEST_F(RingGpuTest, TwoRanksMatchHostBits) {
  for (DLDataType d : {sdk::kFloat32, sdk::kFloat16, sdk::kInt64})
    for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
      SCOPED_TRACE(sdk::dtype_name(d) + " op " + std::to_string(op));
      std::vector<std::vector<std::vector<unsigned char>>> res(4);
      for (int gpu = 0; gpu < 2; ++gpu) {
        const std::string comm = "ring-gpu-" + std::to_string(::getpid()) + "-" + std::to_string(g_comm++);
        std::vector<std::thread> threads;
        for (int r = 0; r < 2; ++r)
          threads.emplace_back([&, r, gpu] {
            try {
              Cdo c(json{{"transport", "ring_test_inproc"}, {"rank", r}, {"world_size", 2}, {"communicator", comm},
                         {"bytes_per_pack", 1024}}
                        .dump());
              res[size_t(gpu * 2 + r)] = run_all(c, gpu == 1, d, op, 1, r, 2);
            } catch (const std::exception& e) {
              ADD_FAILURE() << "rank " << r << ": " << e.what();
            }
          });
        for (auto& t : threads) t.join();
      }
      for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(res[size_t(2 + r)].size(), res[size_t(r)].size());
        for (size_t k = 0; k < res[size_t(r)].size(); ++k)
          EXPECT_EQ(res[size_t(2 + r)][k], res[size_t(r)][k]) << "rank " << r << " output " << k;
      }
    }
}

// Host and GPU tensors in one call: the host ones pass through.
TEST_F(RingGpuTest, MixedHostAndGpuReplicas) {
  Cdo c("{}");
  const auto a = make_values(sdk::kFloat32, 64, 1), b = make_values(sdk::kFloat32, 64, 2);
  Tensor x(sdk::kFloat32, {64}, false, a), y(sdk::kFloat32, {64}, true, b);
  Tensor hx(sdk::kFloat32, {64}, false, a), hy(sdk::kFloat32, {64}, false, b);
  const DLTensor* in[2] = {&x.t, &y.t};
  DLTensor* out[2] = {&x.t, &y.t};
  const DLTensor* hin[2] = {&hx.t, &hy.t};
  DLTensor* hout[2] = {&hx.t, &hy.t};
  ASSERT_EQ(c.call([&](auto* vt, auto h, strata_error* e) { return vt->all_reduce(h, 0, 1, 2, in, out, e); }).code,
            STRATA_OK);
  ASSERT_EQ(c.call([&](auto* vt, auto h, strata_error* e) { return vt->all_reduce(h, 0, 1, 2, hin, hout, e); }).code,
            STRATA_OK);
  EXPECT_EQ(x.bytes(), hx.bytes());
  EXPECT_EQ(y.bytes(), hy.bytes());
}

}  // namespace
}  // namespace strata::test
