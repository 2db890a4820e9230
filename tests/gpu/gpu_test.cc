// SPDX-License-Identifier: Apache-2.0
// CUDA devices ("gpu:N", alias "cuda:N", ABI 1.4) end to end: the host's
// device services, Tensor::to, ReplicaContext::stream, and the in-tree
// one_device / mirrored / central_storage strategies with GPU replicas
// (variables in GPU memory, collectives staged through host memory,
// distributed batches copied to the replica's GPU).
//
// GpuNoDeviceTest: what a process that sees no GPU reports (each case that
// asserts the no-GPU error skips where a GPU is visible). GpuTest: needs a
// GPU (ctest label "gpu"); skips with the reason when none is visible.
// Every value is exactly representable, so GPU runs must give the same bits
// as host runs.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"
#include "strata/sdk/device.hpp"
#include "strata/sdk/kernels.hpp"
#include "strata/sdk/local_strategy.hpp"
#include "strata/strata.hpp"
#include "test_support.h"

namespace strata {
namespace {

using test::contains;

// The message of the Error `fn` throws with status `code` ("" when it does
// not throw, which fails the test).
template <class F>
std::string error_of(F&& fn, strata_status_t code) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

#define SKIP_IF_GPU()                                                                   \
  if (num_gpus() > 0) GTEST_SKIP() << num_gpus() << " CUDA device(s) visible: this case checks the no-GPU error"
#define SKIP_WITHOUT_GPU() \
  if (num_gpus() == 0) GTEST_SKIP() << gpu_unavailable_reason()

// ------------------------------------------------------------ no GPU ---

TEST(GpuNoDeviceTest, ParsesGpuAndCudaDeviceNames) {
  DLDevice d = parse_device("gpu:0");
  EXPECT_EQ(d.device_type, kDLCUDA);
  EXPECT_EQ(d.device_id, 0);
  d = parse_device("cuda:3");
  EXPECT_EQ(d.device_type, kDLCUDA);
  EXPECT_EQ(d.device_id, 3);
  d = parse_device("cpu:1");
  EXPECT_EQ(d.device_type, kDLCPU);
  EXPECT_EQ(d.device_id, 1);
  EXPECT_EQ(device_name(DLDevice{kDLCUDA, 2}), "gpu:2");
  EXPECT_EQ(device_name(DLDevice{kDLCPU, 0}), "cpu:0");
  for (const char* bad : {"gpu:", "gpu:-1", "cuda:x", "tpu:0", "gpu0", ""})
    EXPECT_THROW(parse_device(bad), InvalidArgumentError) << bad;
  // The SDK's parser (what the strategy plugins use) agrees.
  EXPECT_EQ(sdk::parse_device("gpu:2", "devices"), 2);
  EXPECT_EQ(sdk::parse_device("cuda:1", "devices"), 1);
  EXPECT_EQ(sdk::parse_device_spec("cuda:1", "devices").device_type, kDLCUDA);
  EXPECT_EQ(sdk::parse_device_spec("cpu:0", "devices").device_type, kDLCPU);
  EXPECT_THROW(sdk::parse_device("gpu:a", "devices"), InvalidArgumentError);
  EXPECT_EQ(sdk::parse_device_list(nlohmann::json::parse(R"(["gpu:0", "cuda:1", "cpu:0"])"), "devices").size(), 3u);
}

TEST(GpuNoDeviceTest, DeviceCountSaysWhyThereIsNoGpu) {
  SKIP_IF_GPU();
  PluginHost host;
  const strata_host_api* api = host.host_api();
  ASSERT_TRUE(STRATA_HAS_FIELD(api, strata_host_api, memcpy_async));
  strata_error err;
  strata_error_init(&err);
  int32_t count = -1;
  EXPECT_EQ(api->device_count(api, kDLCUDA, &count, &err), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(count, 0);
  const std::string msg = err.message;
  EXPECT_TRUE(contains(msg, "no CUDA device visible: cudaGetDeviceCount")) << msg;
  EXPECT_TRUE(contains(msg, "nvidia-smi")) << msg;
  EXPECT_TRUE(contains(msg, "driver")) << msg;
  EXPECT_TRUE(contains(msg, "CUDA_VISIBLE_DEVICES")) << msg;
  EXPECT_EQ(num_gpus(), 0);
  EXPECT_EQ(gpu_unavailable_reason(), msg);
  // The host always has one host device.
  EXPECT_EQ(api->device_count(api, kDLCPU, &count, &err), STRATA_OK);
  EXPECT_EQ(count, 1);
  // Every other device service fails cleanly too.
  EXPECT_EQ(api->set_device(api, DLDevice{kDLCUDA, 0}, &err), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(api->set_device(api, DLDevice{kDLCPU, 0}, &err), STRATA_OK);
  void* stream = reinterpret_cast<void*>(1);
  EXPECT_EQ(api->stream_create(api, DLDevice{kDLCUDA, 0}, &stream, &err), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(stream, nullptr);
  api->stream_destroy(api, nullptr);
  EXPECT_EQ(api->allocate(api, DLDevice{kDLCUDA, 0}, 64, 0), nullptr);
  EXPECT_EQ(api->allocate(api, DLDevice{kDLCUDAHost, 0}, 64, 0), nullptr);
  float a = 1, b = 0;
  EXPECT_EQ(api->memcpy_async(api, &b, DLDevice{kDLCUDA, 0}, &a, DLDevice{kDLCPU, 0}, 4, nullptr, &err),
            STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(api->memcpy_async(api, &b, DLDevice{kDLCPU, 0}, &a, DLDevice{kDLCPU, 0}, 4, nullptr, &err), STRATA_OK);
  EXPECT_EQ(b, 1.0f);
  EXPECT_EQ(api->device_count(api, kDLOpenCL, &count, &err), STRATA_ERR_INVALID_ARGUMENT);
}

TEST(GpuNoDeviceTest, GpuStrategiesFailWithTheNoGpuMessage) {
  SKIP_IF_GPU();
  struct Case {
    const char* strategy;
    const char* options;
  };
  for (const Case& c : {Case{"one_device", R"({"device": "gpu:0"})"}, Case{"one_device", R"({"device": "cuda:0"})"},
                        Case{"mirrored", R"({"devices": ["gpu:0"]})"},
                        Case{"mirrored", R"({"devices": ["cpu:0", "cuda:1"]})"},
                        Case{"central_storage", R"({"devices": ["gpu:0"]})"}}) {
    const std::string msg =
        error_of([&] { Strategy::create(c.strategy, c.options); }, STRATA_ERR_FAILED_PRECONDITION);
    EXPECT_TRUE(contains(msg, "no CUDA device visible")) << c.strategy << " " << c.options << ": " << msg;
    EXPECT_TRUE(contains(msg, "nvidia-smi")) << msg;
  }
}

TEST(GpuNoDeviceTest, MirroredWithoutDevicesUsesTheHost) {
  SKIP_IF_GPU();
  for (const char* name : {"mirrored", "central_storage"}) {
    Strategy s = Strategy::create(name, "{}");
    EXPECT_EQ(s.extended().worker_devices(), std::vector<std::string>{"cpu:0"}) << name;
  }
}

TEST(GpuNoDeviceTest, TensorToGpuFailsWithTheNoGpuMessage) {
  SKIP_IF_GPU();
  Tensor t = Tensor::from_vector<float>({1, 2, 3});
  for (const char* dev : {"gpu:0", "cuda:0"}) {
    const std::string msg = error_of([&] { t.to(dev); }, STRATA_ERR_FAILED_PRECONDITION);
    EXPECT_TRUE(contains(msg, "no CUDA device visible")) << msg;
  }
  EXPECT_THROW(t.to("tpu:0"), InvalidArgumentError);
  Tensor h = t.to("cpu:0");  // host to host: a copy
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_NE(h.raw_data(), t.raw_data());
}

TEST(GpuNoDeviceTest, ElementAccessOnADeviceTensorSaysToCopyToTheHost) {
  // A view that claims GPU memory: element access must refuse before
  // touching the pointer.
  std::vector<float> storage(2);
  DLTensor d{};
  std::int64_t shape[1] = {2};
  d.data = storage.data();
  d.device = DLDevice{kDLCUDA, 0};
  d.ndim = 1;
  d.dtype = DLDataType{kDLFloat, 32, 1};
  d.shape = shape;
  Tensor t = Tensor::borrow(TensorView(d));
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(t.device_string(), "gpu:0");
  const std::string msg = error_of([&] { t.to_vector<float>(); }, STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_TRUE(contains(msg, ".to(\"cpu:0\")")) << msg;
  EXPECT_TRUE(contains(msg, "gpu:0")) << msg;
  error_of([&] { t.to_doubles(); }, STRATA_ERR_FAILED_PRECONDITION);
  error_of([&] { TensorView(d).data<float>(); }, STRATA_ERR_FAILED_PRECONDITION);
}

TEST(GpuNoDeviceTest, ReplicaStreamIsNullOnHostReplicas) {
  Strategy s = Strategy::create("mirrored", R"({"devices": ["cpu:0", "cpu:1"]})");
  PerReplica streams = s.run([](ReplicaContext& ctx) {
    return Tensor::scalar<std::int64_t>(ctx.stream() == nullptr ? 1 : 0);
  });
  EXPECT_EQ(s.reduce(ReduceOp::SUM, streams).to_vector<std::int64_t>().at(0), 2);
}

// --------------------------------------------------------------- GPU ---

std::vector<float> ramp(int n, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * static_cast<float>(i + 1);
  return v;
}

TEST(GpuTest, TensorRoundTripIsExact) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> values = ramp(1000, 0.1f);  // not exact decimals: the bits must survive
  Tensor h = Tensor::from_vector<float>(values, {10, 100});
  Tensor g = h.to("gpu:0");
  EXPECT_EQ(g.device().device_type, kDLCUDA);
  EXPECT_EQ(g.device().device_id, 0);
  EXPECT_EQ(g.shape(), (std::vector<std::int64_t>{10, 100}));
  EXPECT_EQ(g.dtype(), DType::kFloat32);
  const std::string msg = error_of([&] { g.to_vector<float>(); }, STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_TRUE(contains(msg, ".to(\"cpu:0\")")) << msg;
  Tensor g2 = g.to("cuda:0");  // device to device
  EXPECT_NE(g2.dl().data, g.dl().data);
  Tensor back = g2.to(DLDevice{kDLCPU, 0});
  EXPECT_EQ(back.device().device_type, kDLCPU);
  EXPECT_EQ(back.to_vector<float>(), values);
  Tensor i64 = Tensor::from_vector<std::int64_t>({-5, 7, 1LL << 40}).to("gpu:0").to("cpu:0");
  EXPECT_EQ(i64.to_vector<std::int64_t>(), (std::vector<std::int64_t>{-5, 7, 1LL << 40}));
  Tensor empty = Tensor::zeros({0}, DType::kFloat32).to("gpu:0").to("cpu:0");
  EXPECT_EQ(empty.numel(), 0);
}

TEST(GpuTest, AGpuBeyondTheVisibleCountIsAnInvalidArgument) {
  SKIP_WITHOUT_GPU();
  const std::string beyond = "gpu:" + std::to_string(num_gpus());
  std::string msg = error_of([&] { Tensor::scalar(1.0f).to(beyond); }, STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(msg, beyond)) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(num_gpus()) + " CUDA device(s)")) << msg;
  msg = error_of([&] { Strategy::create("one_device", R"({"device": ")" + beyond + R"("})"); },
                 STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(msg, beyond + " does not exist")) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(num_gpus()) + " CUDA device(s)")) << msg;
}

TEST(GpuTest, HostServicesCopyAndSynchronize) {
  SKIP_WITHOUT_GPU();
  PluginHost host;
  const strata_host_api* api = host.host_api();
  strata_error err;
  strata_error_init(&err);
  int32_t count = 0;
  ASSERT_EQ(api->device_count(api, kDLCUDA, &count, &err), STRATA_OK) << err.message;
  EXPECT_EQ(count, num_gpus());
  const DLDevice gpu{kDLCUDA, 0}, pinned{kDLCUDAHost, 0}, cpu{kDLCPU, 0};
  void* stream = nullptr;
  ASSERT_EQ(api->stream_create(api, gpu, &stream, &err), STRATA_OK) << err.message;
  ASSERT_NE(stream, nullptr);
  const std::size_t n = 1 << 20;
  void* d = api->allocate(api, gpu, n * 4, 0);
  void* p = api->allocate(api, pinned, n * 4, 0);
  ASSERT_NE(d, nullptr);
  ASSERT_NE(p, nullptr);
  std::vector<float> src = ramp(static_cast<int>(n), 0.5f), dst(n, 0.0f);
  ASSERT_EQ(api->memcpy_async(api, d, gpu, src.data(), cpu, n * 4, stream, &err), STRATA_OK) << err.message;
  ASSERT_EQ(api->memcpy_async(api, p, pinned, d, gpu, n * 4, stream, &err), STRATA_OK) << err.message;
  ASSERT_EQ(api->stream_synchronize(api, stream, 60000, &err), STRATA_OK) << err.message;
  EXPECT_EQ(std::memcmp(p, src.data(), n * 4), 0);
  ASSERT_EQ(api->memcpy_async(api, dst.data(), cpu, d, gpu, n * 4, nullptr, &err), STRATA_OK) << err.message;
  EXPECT_EQ(dst, src);  // a NULL stream copies synchronously
  api->free_memory(api, gpu, d);
  api->free_memory(api, pinned, p);
  api->stream_destroy(api, stream);
  EXPECT_EQ(api->set_device(api, DLDevice{kDLCUDA, num_gpus()}, &err), STRATA_ERR_INVALID_ARGUMENT);
}

// ---------------------------------------------- device_update (ABI 1.5) ---

struct UpdateDtype {
  const char* name;
  DLDataType dl;
};
const UpdateDtype kUpdateDtypes[] = {{"float16", {kDLFloat, 16, 1}}, {"bfloat16", {kDLBfloat, 16, 1}},
                                     {"float32", {kDLFloat, 32, 1}}, {"float64", {kDLFloat, 64, 1}},
                                     {"int32", {kDLInt, 32, 1}},     {"int64", {kDLInt, 64, 1}}};

// Whether element i of `bytes` (dtype d) is a NaN: only NaN payloads may
// differ between the host and a GPU (a GPU returns the canonical NaN).
bool is_nan_at(const std::vector<unsigned char>& bytes, DLDataType d, std::size_t i) {
  if (d.code == kDLInt) return false;
  if (d.bits == 16) {
    std::uint16_t h;
    std::memcpy(&h, bytes.data() + i * 2, 2);
    return d.code == kDLBfloat ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0
                               : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
  }
  if (d.bits == 32) {
    float f;
    std::memcpy(&f, bytes.data() + i * 4, 4);
    return std::isnan(f);
  }
  double x;
  std::memcpy(&x, bytes.data() + i * 8, 8);
  return std::isnan(x);
}

// `count` elements of d: random bit patterns (every exponent, subnormals,
// infinities, NaNs, ties of the 16-bit roundings) and, for floats, ordinary
// values of similar magnitude whose sums round.
std::vector<unsigned char> update_operand(DLDataType d, std::size_t count, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t es = d.bits / 8;
  std::vector<unsigned char> out(count * es);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t bits = rng();
    if (d.code != kDLInt && i % 2 == 1) {  // ordinary values
      const double v = std::ldexp(static_cast<double>(rng() % 100000) - 50000.0, -static_cast<int>(rng() % 12));
      if (d.bits == 64) {
        std::memcpy(&bits, &v, 8);
      } else {
        const float f = static_cast<float>(v);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        bits = d.bits == 32 ? u : d.code == kDLBfloat ? u >> 16 : bits;
        if (d.code == kDLFloat && d.bits == 16) bits = (rng() % 2 ? 0x3c00u : 0x4800u) | (rng() & 0x3ffu);
      }
    }
    std::memcpy(out.data() + i * es, &bits, es);
  }
  return out;
}

TEST(GpuTest, HostDeviceUpdateGivesTheHostKernelsBits) {
  SKIP_WITHOUT_GPU();
  PluginHost host;
  const strata_host_api* api = host.host_api();
  ASSERT_TRUE(STRATA_HAS_FIELD(api, strata_host_api, device_update));
  const DLDevice gpu{kDLCUDA, 0}, cpu{kDLCPU, 0};
  strata_error err;
  strata_error_init(&err);
  void* stream = nullptr;
  ASSERT_EQ(api->stream_create(api, gpu, &stream, &err), STRATA_OK) << err.message;
  const std::size_t count = 100003;  // not a multiple of any block size
  for (const UpdateDtype& dt : kUpdateDtypes) {
    const std::size_t bytes = count * (dt.dl.bits / 8);
    void* d_dst = api->allocate(api, gpu, bytes, 0);
    void* d_src = api->allocate(api, gpu, bytes, 0);
    ASSERT_NE(d_dst, nullptr);
    ASSERT_NE(d_src, nullptr);
    for (strata_var_update_op op : {STRATA_VAR_ASSIGN, STRATA_VAR_ASSIGN_ADD, STRATA_VAR_ASSIGN_SUB}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0: synchronous, 1: on a stream, 2: dst == src on a stream
        SCOPED_TRACE(std::string(dt.name) + " op " + std::to_string(op) + " mode " + std::to_string(mode));
        const std::vector<unsigned char> a = update_operand(dt.dl, count, 7u + op * 3u + mode);
        const std::vector<unsigned char> b = mode == 2 ? a : update_operand(dt.dl, count, 1000u + op);
        std::vector<unsigned char> expect = a;
        sdk::kernels::apply_update(op, dt.dl, expect.data(), b.data(), count);  // in mode 2, b == a: x op x
        ASSERT_EQ(api->memcpy_async(api, d_dst, gpu, a.data(), cpu, bytes, nullptr, &err), STRATA_OK) << err.message;
        ASSERT_EQ(api->memcpy_async(api, d_src, gpu, b.data(), cpu, bytes, nullptr, &err), STRATA_OK) << err.message;
        void* src = mode == 2 ? d_dst : d_src;
        ASSERT_EQ(api->device_update(api, op, dt.dl, d_dst, src, count, gpu, mode == 0 ? nullptr : stream, &err),
                  STRATA_OK)
            << err.message;
        if (mode != 0) {
          ASSERT_EQ(api->stream_synchronize(api, stream, 60000, &err), STRATA_OK) << err.message;
        }
        std::vector<unsigned char> got(bytes);
        ASSERT_EQ(api->memcpy_async(api, got.data(), cpu, d_dst, gpu, bytes, nullptr, &err), STRATA_OK)
            << err.message;
        const std::size_t es = dt.dl.bits / 8;
        std::size_t wrong = 0, nans = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const bool nan_e = is_nan_at(expect, dt.dl, i), nan_g = is_nan_at(got, dt.dl, i);
          nans += nan_e;
          const bool same = nan_e ? nan_g : std::memcmp(&expect[i * es], &got[i * es], es) == 0;
          if (!same && wrong++ < 3) ADD_FAILURE() << "element " << i << " differs from the host kernel's";
        }
        EXPECT_EQ(wrong, 0u);
        if (dt.dl.code != kDLInt) {
          EXPECT_LT(nans, count / 2);  // most elements are numbers
        }
      }
    }
    api->free_memory(api, gpu, d_dst);
    api->free_memory(api, gpu, d_src);
  }
  api->stream_destroy(api, stream);
}

TEST(GpuTest, HostDeviceUpdateRefusesMemoryItCannotTouch) {
  SKIP_WITHOUT_GPU();
  PluginHost host;
  const strata_host_api* api = host.host_api();
  const DLDevice gpu{kDLCUDA, 0}, cpu{kDLCPU, 0}, pinned{kDLCUDAHost, 0};
  const DLDataType f32{kDLFloat, 32, 1};
  strata_error err;
  strata_error_init(&err);
  float* d = static_cast<float*>(api->allocate(api, gpu, 1024 * 4, 0));
  float* p = static_cast<float*>(api->allocate(api, pinned, 1024 * 4, 0));
  ASSERT_NE(d, nullptr);
  ASSERT_NE(p, nullptr);
  std::vector<float> h(1024, 1.0f);
  // Host memory, pinned or not, would fault inside a kernel: refused by name.
  EXPECT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, d, h.data(), 1024, gpu, nullptr, &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err.message, "source buffer")) << err.message;
  EXPECT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, p, d, 1024, gpu, nullptr, &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err.message, "destination buffer")) << err.message;
  EXPECT_TRUE(contains(err.message, "pinned host memory")) << err.message;
  // Partial overlap is refused; the same buffer is fine.
  EXPECT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, d, d + 1, 512, gpu, nullptr, &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err.message, "overlap")) << err.message;
  EXPECT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, d, d, 0, gpu, nullptr, &err), STRATA_OK);
  EXPECT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, d, nullptr, 4, gpu, nullptr, &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, d, d, 4, DLDevice{kDLCUDA, num_gpus()}, nullptr,
                               &err),
            STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(err.message, "does not exist")) << err.message;
  // Nothing ran, so the GPU still works: 1 + 1 = 2 everywhere.
  ASSERT_EQ(api->memcpy_async(api, d, gpu, h.data(), cpu, 1024 * 4, nullptr, &err), STRATA_OK) << err.message;
  ASSERT_EQ(api->device_update(api, STRATA_VAR_ASSIGN_ADD, f32, d, d, 1024, gpu, nullptr, &err), STRATA_OK)
      << err.message;
  ASSERT_EQ(api->memcpy_async(api, h.data(), cpu, d, gpu, 1024 * 4, nullptr, &err), STRATA_OK) << err.message;
  EXPECT_EQ(h, std::vector<float>(1024, 2.0f));
  api->free_memory(api, gpu, d);
  api->free_memory(api, pinned, p);
}

// Variable updates of every kind on mirrored gpu:0 give the bits they give on
// cpu:0: replica context with GPU values (all-reduced and applied on the GPU)
// and host values, ON_READ copies, cross-replica updates, several dtypes.
std::vector<std::vector<double>> run_variable_updates(const std::string& device, DType dtype) {
  const bool on_gpu = device != "cpu:0";
  Strategy s = Strategy::create("mirrored", R"({"devices": [")" + device + R"("]})");
  Scope scope = s.scope();
  std::vector<Variable> vars;
  const Aggregation aggs[] = {Aggregation::SUM, Aggregation::MEAN, Aggregation::ONLY_FIRST_REPLICA};
  const bool is_float = dtype != DType::kInt32 && dtype != DType::kInt64;
  for (Aggregation agg : aggs) {
    if (agg == Aggregation::MEAN && !is_float) continue;
    VariableOptions vo;
    vo.name = "v" + std::to_string(vars.size());
    vo.aggregation = agg;
    vars.emplace_back(Tensor::from_doubles({1.5, -2.25, 3.0, 1e3, 0.1}, {5}, dtype), vo);
    vo.name += "_on_read";
    vo.synchronization = Synchronization::ON_READ;
    vars.emplace_back(Tensor::from_doubles({0.5, 0.25, -1.0, 7.0, 0.3}, {5}, dtype), vo);
  }
  for (int step = 0; step < 3; ++step) {
    s.run([&](ReplicaContext& ctx) {
      const double k = step + 1;
      Tensor delta = Tensor::from_doubles({0.1 * k, 1.0, -0.7 * k, 33.0, 1e-3 * k}, {5}, dtype);
      Tensor gpu_delta = on_gpu ? delta.to(device) : delta.clone();
      for (Variable& v : vars) {
        v.assign_add(gpu_delta);
        v.assign_sub(delta);  // a host value on a GPU copy
        v.assign_add(gpu_delta);
        if (step == 2 && v.aggregation() != Aggregation::SUM) v.assign(gpu_delta);
      }
    });
    for (Variable& v : vars)
      if (v.synchronization() != Synchronization::ON_READ || v.aggregation() != Aggregation::SUM)
        v.assign_add(Tensor::from_doubles({1, 2, 3, 4, 5}, {5}, dtype));
  }
  std::vector<std::vector<double>> out;
  for (Variable& v : vars) out.push_back(v.value().to_doubles());
  return out;
}

TEST(GpuTest, VariableUpdatesOnAGpuGiveTheHostsBits) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32}) {
    SCOPED_TRACE(static_cast<int>(dt));
    EXPECT_EQ(run_variable_updates("gpu:0", dt), run_variable_updates("cpu:0", dt));
  }
}

TEST(GpuTest, OneDeviceTrainingLoopKeepsTheVariableOnTheGpu) {
  SKIP_WITHOUT_GPU();
  Strategy s = Strategy::create("one_device", R"({"device": "gpu:0"})");
  EXPECT_EQ(s.extended().worker_devices(), std::vector<std::string>{"gpu:0"});
  Scope scope = s.scope();
  Variable w(Tensor::from_vector<float>({1, 2, 3, 4}), {"w"});
  EXPECT_FALSE(w.read_view().has_value());  // GPU memory: no host view
  const Tensor grad = Tensor::from_vector<float>({0.5f, 0.25f, -1, 2});
  std::vector<float> expect{1, 2, 3, 4};
  for (int step = 0; step < 5; ++step) {
    s.run([&](ReplicaContext& ctx) {
      EXPECT_NE(ctx.stream(), nullptr);
      Tensor inside = w.value();  // replica context: on the variable's GPU
      EXPECT_EQ(inside.device().device_type, kDLCUDA);
      EXPECT_EQ(inside.to("cpu:0").to_vector<float>(), expect);
      w.assign_sub(grad.to("gpu:0"));  // a GPU value
      w.assign_add(Tensor::from_vector<float>({0, 0, 0, 1}));  // a host value
    });
    for (int i = 0; i < 4; ++i) expect[static_cast<std::size_t>(i)] -= grad.to_vector<float>()[static_cast<std::size_t>(i)];
    expect[3] += 1;
    Tensor outside = w.value();  // cross-replica: a host tensor
    EXPECT_EQ(outside.device().device_type, kDLCPU);
    EXPECT_EQ(outside.to_vector<float>(), expect) << "step " << step;
  }
  w.assign(Tensor::from_vector<float>({9, 8, 7, 6}).to("gpu:0"));
  EXPECT_EQ(w.value().to_vector<float>(), (std::vector<float>{9, 8, 7, 6}));
  w.assign(Tensor::from_vector<float>({1, 1, 1, 1}));
  EXPECT_EQ(w.value().to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
}

// What a mirrored strategy over `devices` computes: every replica all-reduces
// (SUM and MEAN) a value that depends on its id, returns it, and the values
// are reduce_to'd; a MEAN variable is updated with per-replica values. On a
// GPU replica the inputs are made on its GPU.
struct MirroredRun {
  std::vector<float> all_reduce_sum, all_reduce_mean, all_gather, reduce_sum, reduce_mean, variable;
  std::vector<int> result_device_types;
};

MirroredRun run_mirrored(const std::string& devices_json, bool on_gpu) {
  Strategy s = Strategy::create("mirrored", devices_json);
  const int n = s.num_replicas_in_sync();
  Scope scope = s.scope();
  VariableOptions vo;
  vo.name = "v";
  vo.aggregation = Aggregation::MEAN;
  Variable v(Tensor::from_vector<float>({1, 2, 3}), vo);
  MirroredRun out;
  std::vector<int> devs(static_cast<std::size_t>(n), -1);
  PerReplica results = s.run([&](ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    const std::string dev = on_gpu ? "gpu:" + std::to_string(ctx.local_replica_id()) : "cpu:0";
    Tensor x = Tensor::from_vector<float>({0.1f * static_cast<float>(id + 1), 3.0f, -0.7f * static_cast<float>(id)});
    if (on_gpu) x = x.to(dev);
    Tensor sum = ctx.all_reduce(ReduceOp::SUM, x);
    devs[static_cast<std::size_t>(ctx.local_replica_id())] = sum.device().device_type;
    Tensor mean = ctx.all_reduce(ReduceOp::MEAN, x);
    Tensor gathered = ctx.all_gather(x, 0);
    EXPECT_EQ(gathered.device().device_type, on_gpu ? kDLCUDA : kDLCPU);
    if (id == 0) out.all_gather = gathered.to("cpu:0").to_vector<float>();
    if (id == 0) {
      out.all_reduce_sum = sum.to("cpu:0").to_vector<float>();
      out.all_reduce_mean = mean.to("cpu:0").to_vector<float>();
    }
    Tensor delta = Tensor::from_vector<float>({0.5f * static_cast<float>(id), 1.0f, 0.25f});
    v.assign_add(on_gpu ? delta.to(dev) : std::move(delta));
    return x;  // on the replica's device
  });
  out.reduce_sum = s.reduce(ReduceOp::SUM, results).to_vector<float>();
  out.reduce_mean = s.reduce(ReduceOp::MEAN, results).to_vector<float>();
  out.variable = v.value().to_vector<float>();
  out.result_device_types = devs;
  return out;
}

void expect_same_bits(const MirroredRun& gpu, const MirroredRun& cpu) {
  EXPECT_EQ(gpu.all_reduce_sum, cpu.all_reduce_sum);
  EXPECT_EQ(gpu.all_reduce_mean, cpu.all_reduce_mean);
  EXPECT_EQ(gpu.all_gather, cpu.all_gather);
  EXPECT_EQ(gpu.reduce_sum, cpu.reduce_sum);
  EXPECT_EQ(gpu.reduce_mean, cpu.reduce_mean);
  EXPECT_EQ(gpu.variable, cpu.variable);
  for (int t : gpu.result_device_types) EXPECT_EQ(t, kDLCUDA);  // all_reduce of a GPU tensor stays on the GPU
  EXPECT_FALSE(gpu.all_reduce_sum.empty());
}

TEST(GpuTest, MirroredOnOneGpuGivesTheSameBitsAsTheHost) {
  SKIP_WITHOUT_GPU();
  const MirroredRun gpu = run_mirrored(R"({"devices": ["gpu:0"]})", true);
  const MirroredRun cpu = run_mirrored(R"({"devices": ["cpu:0"]})", false);
  expect_same_bits(gpu, cpu);
}

TEST(GpuTest, MirroredOnTwoGpusGivesTheSameBitsAsTwoHostReplicas) {
  if (num_gpus() < 2) GTEST_SKIP() << "needs 2 CUDA devices; " << num_gpus() << " visible";
  const MirroredRun gpu = run_mirrored(R"({"devices": ["gpu:0", "gpu:1"]})", true);
  const MirroredRun cpu = run_mirrored(R"({"devices": ["cpu:0", "cpu:1"]})", false);
  expect_same_bits(gpu, cpu);
}

TEST(GpuTest, ReplicaStreamIsUsableForUserWork) {
  SKIP_WITHOUT_GPU();
  Strategy s = Strategy::create("mirrored", R"({"devices": ["gpu:0"]})");
  const std::vector<float> values = ramp(4096, 0.25f);
  PerReplica out = s.run([&](ReplicaContext& ctx) {
    auto stream = static_cast<cudaStream_t>(ctx.stream());
    EXPECT_NE(stream, nullptr);
    Tensor d = Tensor::zeros({4096}, DType::kFloat32).to("gpu:0");
    // Enqueued, not waited for: run() waits for the replica's stream.
    EXPECT_EQ(cudaMemcpyAsync(d.mutable_dl().data, values.data(), values.size() * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    return d;
  });
  EXPECT_EQ(out[0].device().device_type, kDLCUDA);
  EXPECT_EQ(out[0].to("cpu:0").to_vector<float>(), values);
}

TEST(GpuTest, DistributedBatchesArriveOnTheReplicasGpu) {
  SKIP_WITHOUT_GPU();
  Strategy s = Strategy::create("mirrored", R"({"devices": ["gpu:0"]})");
  Element e;
  std::vector<float> rows = ramp(12, 1.5f);
  e.add("x", Tensor::from_vector<float>(rows, {12, 1}));
  auto dist = s.distribute_dataset(Dataset::from_tensor_slices(std::move(e)).batch(4));
  std::vector<float> seen;
  int steps = 0;
  for (DistributedElement& batch : dist) {
    ++steps;
    PerReplica got = s.run(
        [&](ReplicaContext&, const Tensor& x) {
          EXPECT_EQ(x.device().device_type, kDLCUDA);
          EXPECT_EQ(x.device().device_id, 0);
          return x.to("cpu:0");
        },
        batch["x"]);
    for (float f : got[0].to_vector<float>()) seen.push_back(f);
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(seen, rows);
}

TEST(GpuTest, StrategiesWithoutDevicesUseEveryVisibleGpu) {
  SKIP_WITHOUT_GPU();
  std::vector<std::string> expect;
  for (int g = 0; g < num_gpus(); ++g) expect.push_back("gpu:" + std::to_string(g));
  for (const char* name : {"mirrored", "central_storage"}) {
    Strategy s = Strategy::create(name, "{}");
    EXPECT_EQ(s.extended().worker_devices(), expect) << name;
    EXPECT_EQ(s.num_replicas_in_sync(), num_gpus()) << name;
    const nlohmann::json d = nlohmann::json::parse(s.extended().describe_json());
    EXPECT_EQ(d.at("worker_devices").at(0), "gpu:0") << d.dump();
  }
  // one_device names its device: still the host by default.
  EXPECT_EQ(Strategy::create("one_device", "{}").extended().worker_devices(), std::vector<std::string>{"cpu:0"});
}

TEST(GpuTest, CentralStorageKeepsVariablesOnTheHostAndComputesOnTheGpu) {
  SKIP_WITHOUT_GPU();
  Strategy s = Strategy::create("central_storage", R"({"devices": ["gpu:0"]})");
  Scope scope = s.scope();
  VariableOptions vo;
  vo.name = "c";
  vo.aggregation = Aggregation::SUM;
  Variable v(Tensor::from_vector<float>({1, 2}), vo);
  s.run([&](ReplicaContext& ctx) {
    Tensor inside = v.value();
    EXPECT_EQ(inside.device().device_type, kDLCPU);  // the parameter device is cpu:0
    v.assign_add(Tensor::from_vector<float>({0.5f, 0.25f}).to("gpu:0"));
    EXPECT_NE(ctx.stream(), nullptr);
  });
  EXPECT_EQ(v.value().to_vector<float>(), (std::vector<float>{1.5f, 2.25f}));
}

}  // namespace
}  // namespace strata
