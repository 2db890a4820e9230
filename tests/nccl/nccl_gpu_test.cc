// SPDX-License-Identifier: Apache-2.0
// Tests of the "nccl" transport on real GPUs (ctest label "gpu"). Every test
// skips when no CUDA device is visible. One GPU runs everything at world
// size 1 (NCCL refuses two ranks on one GPU), where every reduction returns
// its input: the tests compare bit for bit with the host's copy of the
// input, out of place and in place, blocking (stream NULL) and on a
// caller's stream. With two or more GPUs, TwoRanks* run two ranks as
// threads, one GPU each, and check real sums and a collective's deadline.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/gpu_skip.h"
#include "bench_runner.h"

#include "strata/error.hpp"
#include "strata/plugin_host.hpp"
#include "test_support.h"
#include "transport_test_support.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
using test::run_ranks;
using test::TransportRank;
using test::unique_name;

#define CUDA_OK(call)                                                                 \
  do {                                                                                \
    const cudaError_t e_ = (call);                                                    \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);           \
  } while (0)

using test::contains;

// Device memory, freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    cudaSetDevice(device);
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(ptr_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  char* bytes_at(size_t off) const { return static_cast<char*>(ptr_) + off; }
  size_t size() const { return bytes_; }

 private:
  int device_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

std::vector<char> to_host(const void* dev, size_t bytes) {
  std::vector<char> h(bytes);
  EXPECT_EQ(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
// cudaMemcpy from pageable memory may return before its DMA finished, and
// cudaMemset is asynchronous: both are finished before a collective runs.
void to_device(void* dev, const std::vector<char>& h) {
  EXPECT_EQ(cudaMemcpy(dev, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}
void set_device(void* dev, int byte, size_t bytes) {
  EXPECT_EQ(cudaMemset(dev, byte, bytes), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

struct DType {
  const char* name;
  DLDataType dl;
  size_t size;
};
const DType kDTypes[] = {
    {"float16", {kDLFloat, 16, 1}, 2}, {"bfloat16", {kDLBfloat, 16, 1}, 2}, {"float32", {kDLFloat, 32, 1}, 4},
    {"float64", {kDLFloat, 64, 1}, 8}, {"int32", {kDLInt, 32, 1}, 4},     {"int64", {kDLInt, 64, 1}, 8},
    {"uint8", {kDLUInt, 8, 1}, 1},
};
const DLDataType kF32{kDLFloat, 32, 1};

const struct {
  const char* name;
  uint32_t op;
} kOps[] = {{"SUM", STRATA_REDUCE_SUM},
            {"MEAN", STRATA_REDUCE_MEAN},
            {"MIN", STRATA_REDUCE_MIN},
            {"MAX", STRATA_REDUCE_MAX},
            {"PROD", STRATA_REDUCE_PROD}};

// IEEE half of a small integer (exact for |v| <= 2048).
uint16_t half_of(int v) {
  if (v == 0) return 0;
  int e = 0;
  const double m = std::frexp(static_cast<double>(v), &e);  // v = m * 2^e, 0.5 <= m < 1
  const uint16_t exponent = static_cast<uint16_t>(e - 1 + 15);
  const uint16_t mantissa = static_cast<uint16_t>(std::lround((m * 2.0 - 1.0) * 1024.0));
  return static_cast<uint16_t>((exponent << 10) | mantissa);
}

// Element i of a test tensor: the small integer `v_i` (exact in every
// dtype) encoded as `d`.
void put(const DType& d, char* out, int v) {
  switch (d.dl.code) {
    case kDLFloat:
      if (d.dl.bits == 16) {
        const uint16_t h = half_of(v);
        std::memcpy(out, &h, 2);
      } else if (d.dl.bits == 32) {
        const float f = static_cast<float>(v);
        std::memcpy(out, &f, 4);
      } else {
        const double f = v;
        std::memcpy(out, &f, 8);
      }
      break;
    case kDLBfloat: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t b = static_cast<uint16_t>(bits >> 16);  // exact: small integers need no rounding
      std::memcpy(out, &b, 2);
      break;
    }
    case kDLInt:
      if (d.dl.bits == 32) {
        const int32_t x = v;
        std::memcpy(out, &x, 4);
      } else {
        const int64_t x = v;
        std::memcpy(out, &x, 8);
      }
      break;
    default: {
      const uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(out, &x, 1);
    }
  }
}

std::vector<char> pattern(const DType& d, size_t count, int salt) {
  std::vector<char> h(count * d.size);
  for (size_t i = 0; i < count; ++i) put(d, h.data() + i * d.size, static_cast<int>((i * 7 + salt) % 11) + 1);
  return h;
}

// Blocking on the host unless `stream`; throws strata errors.
void all_reduce(TransportRank& r, const void* s, void* d, uint64_t n, DLDataType dt, uint32_t op,
                void* stream = nullptr) {
  strata_error e;
  strata_error_init(&e);
  detail::check_status(r.vt()->all_reduce(r.comm(), s, d, n, dt, op, stream, &e), e, "all_reduce");
}
void broadcast(TransportRank& r, const void* s, void* d, uint64_t n, DLDataType dt, int32_t root,
               void* stream = nullptr) {
  strata_error e;
  strata_error_init(&e);
  detail::check_status(r.vt()->broadcast(r.comm(), s, d, n, dt, root, stream, &e), e, "broadcast");
}
void all_gather(TransportRank& r, const void* s, void* d, uint64_t n, DLDataType dt, void* stream = nullptr) {
  strata_error e;
  strata_error_init(&e);
  detail::check_status(r.vt()->all_gather(r.comm(), s, d, n, dt, stream, &e), e, "all_gather");
}
void reduce_scatter(TransportRank& r, const void* s, void* d, uint64_t n, DLDataType dt, uint32_t op,
                    void* stream = nullptr) {
  strata_error e;
  strata_error_init(&e);
  detail::check_status(r.vt()->reduce_scatter(r.comm(), s, d, n, dt, op, stream, &e), e, "reduce_scatter");
}

// One rank on GPU 0 (world 1), created with the default options except the
// deadline, so that a broken GPU fails a test instead of hanging it.
struct OneRank {
  PluginHost host;
  TransportRank rank;
  explicit OneRank(const char* options = R"({"device": 0, "timeout_s": 60})") : rank(host, "nccl", options) {
    rank.join(unique_name("nccl-gpu"), 0, 1, 60000);
  }
};

TEST(NcclGpuTest, AllReduceEveryOpAndDtypeWorldOne) {
  REQUIRE_GPUS(1);
  OneRank one;
  const size_t count = 1037;  // not a multiple of any vector width
  for (const DType& d : kDTypes) {
    for (const auto& op : kOps) {
      SCOPED_TRACE(std::string(d.name) + " " + op.name);
      const std::vector<char> in = pattern(d, count, 3);
      const size_t bytes = in.size();
      DeviceBuffer send(0, bytes), recv(0, bytes);
      ASSERT_NE(send.get(), nullptr);
      ASSERT_NE(recv.get(), nullptr);
      to_device(send.get(), in);
      set_device(recv.get(), 0xAB, bytes);
      // Out of place: world 1 reduces one value, so every op returns it.
      all_reduce(one.rank, send.get(), recv.get(), count, d.dl, op.op);
      EXPECT_EQ(to_host(recv.get(), bytes), in);
      EXPECT_EQ(to_host(send.get(), bytes), in) << "the send buffer changed";
      // In place.
      all_reduce(one.rank, send.get(), send.get(), count, d.dl, op.op);
      EXPECT_EQ(to_host(send.get(), bytes), in);
    }
  }
}

// Both with the watchdog's CUDA event per enqueued collective (the
// default) and without it (option watch_enqueued false).
class NcclStreamOrderedTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Watch, NcclStreamOrderedTest,
                         ::testing::Values(R"({"device": 0, "timeout_s": 60})",
                                           R"({"device": 0, "timeout_s": 60, "watch_enqueued": false})"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.index == 0 ? "Watched" : "Unwatched");
                         });

TEST_P(NcclStreamOrderedTest, AllReduceOnTheCallersStream) {
  REQUIRE_GPUS(1);
  OneRank one(GetParam());
  const size_t count = (4u << 20) / 4;  // 4 MiB of float32
  const DType& f32 = kDTypes[2];
  const std::vector<char> in = pattern(f32, count, 5);
  std::vector<char> out(in.size(), 0);
  DeviceBuffer send(0, in.size()), recv(0, in.size());
  ASSERT_NE(send.get(), nullptr);
  ASSERT_NE(recv.get(), nullptr);
  set_device(recv.get(), 0, in.size());
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Upload, all-reduce and download are all queued on `s`; only stream
  // order makes the result right (pageable memcpy returns once staged, so
  // the host vector is read before the call returns).
  for (int iter = 0; iter < 3; ++iter) {
    CUDA_OK(cudaMemcpyAsync(send.get(), in.data(), in.size(), cudaMemcpyHostToDevice, s));
    all_reduce(one.rank, send.get(), recv.get(), count, f32.dl, STRATA_REDUCE_SUM, s);
    CUDA_OK(cudaMemcpyAsync(out.data(), recv.get(), out.size(), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(out, in) << "iteration " << iter;
    std::fill(out.begin(), out.end(), 0);
  }
  // Many enqueued back to back, then one synchronisation (the benchmark's pattern).
  for (int i = 0; i < 200; ++i) all_reduce(one.rank, send.get(), send.get(), count, f32.dl, STRATA_REDUCE_MAX, s);
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(to_host(send.get(), in.size()), in);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(NcclGpuTest, BroadcastAllGatherReduceScatterWorldOne) {
  REQUIRE_GPUS(1);
  OneRank one;
  const size_t count = 4099;
  for (const DType& d : kDTypes) {
    SCOPED_TRACE(d.name);
    const std::vector<char> in = pattern(d, count, 9);
    const size_t bytes = in.size();
    DeviceBuffer send(0, bytes), recv(0, bytes);
    ASSERT_NE(send.get(), nullptr);
    ASSERT_NE(recv.get(), nullptr);
    to_device(send.get(), in);
    set_device(recv.get(), 0x5A, bytes);
    broadcast(one.rank, send.get(), recv.get(), count, d.dl, 0);
    EXPECT_EQ(to_host(recv.get(), bytes), in) << "broadcast";
    set_device(recv.get(), 0x5A, bytes);
    all_gather(one.rank, send.get(), recv.get(), count, d.dl);
    EXPECT_EQ(to_host(recv.get(), bytes), in) << "all_gather";
    set_device(recv.get(), 0x5A, bytes);
    reduce_scatter(one.rank, send.get(), recv.get(), count, d.dl, STRATA_REDUCE_SUM);
    EXPECT_EQ(to_host(recv.get(), bytes), in) << "reduce_scatter";
    // In place: broadcast send == recv; all_gather send == recv + rank * count.
    broadcast(one.rank, send.get(), send.get(), count, d.dl, 0);
    all_gather(one.rank, send.get(), send.get(), count, d.dl);
    EXPECT_EQ(to_host(send.get(), bytes), in) << "in place";
  }
  DeviceBuffer b(0, 64);
  EXPECT_THROW(broadcast(one.rank, b.get(), b.get(), 16, kF32, 1), InvalidArgumentError);  // root 1 of world 1
}

TEST(NcclGpuTest, BadArgumentsAreRefusedByName) {
  REQUIRE_GPUS(1);
  OneRank one;
  DeviceBuffer dev(0, 4096);
  ASSERT_NE(dev.get(), nullptr);
  std::vector<float> host_mem(1024, 1.0f);
  try {
    all_reduce(one.rank, host_mem.data(), host_mem.data(), 1024, kF32, STRATA_REDUCE_SUM);
    FAIL() << "host memory accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "host memory")) << e.what();
    EXPECT_TRUE(contains(e.what(), "tcp or libfabric")) << e.what();
  }
  try {
    all_reduce(one.rank, dev.get(), dev.get(), 16, DLDataType{kDLInt, 16, 1}, STRATA_REDUCE_SUM);
    FAIL() << "int16 accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "int16")) << e.what();
  }
  EXPECT_THROW(all_reduce(one.rank, dev.get(), dev.get(), 16, kF32, 99), InvalidArgumentError);
  // Partly overlapping buffers.
  EXPECT_THROW(all_reduce(one.rank, dev.get(), dev.bytes_at(4), 16, kF32, STRATA_REDUCE_SUM), InvalidArgumentError);
  // No point-to-point.
  strata_buffer b = test::make_buf(dev.get(), 64);
  b.device = DLDevice{kDLCUDA, 0};
  strata_request_t req = nullptr;
  strata_error e;
  strata_error_init(&e);
  EXPECT_EQ(one.rank.vt()->isend(one.rank.comm(), 0, 1, &b, &req, &e), STRATA_ERR_UNIMPLEMENTED);
  EXPECT_TRUE(contains(e.message, "tcp or libfabric")) << e.message;
  strata_error_init(&e);
  EXPECT_EQ(one.rank.vt()->irecv(one.rank.comm(), 0, 1, &b, &req, &e), STRATA_ERR_UNIMPLEMENTED);
  // The communicator still works after refused calls.
  const DType& f32 = kDTypes[2];
  const std::vector<char> in = pattern(f32, 1024, 1);
  to_device(dev.get(), in);
  all_reduce(one.rank, dev.get(), dev.get(), 1024, kF32, STRATA_REDUCE_SUM);
  EXPECT_EQ(to_host(dev.get(), in.size()), in);
}

TEST(NcclGpuTest, AbortThenEveryCallFailsAborted) {
  REQUIRE_GPUS(1);
  OneRank one;
  DeviceBuffer dev(0, 4096);
  ASSERT_NE(dev.get(), nullptr);
  all_reduce(one.rank, dev.get(), dev.get(), 1024, kF32, STRATA_REDUCE_SUM);  // it works before
  const auto t0 = Clock::now();
  one.rank.abort("the test stops here");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1)) << "comm_abort blocked";
  for (int i = 0; i < 2; ++i) {
    try {
      all_reduce(one.rank, dev.get(), dev.get(), 1024, kF32, STRATA_REDUCE_SUM);
      FAIL() << "all_reduce after abort succeeded";
    } catch (const AbortedError& e) {
      EXPECT_TRUE(contains(e.what(), "the test stops here")) << e.what();
    }
  }
  EXPECT_THROW(broadcast(one.rank, dev.get(), dev.get(), 16, kF32, 0), AbortedError);
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreate(&s));
  EXPECT_THROW(all_gather(one.rank, dev.get(), dev.get(), 16, kF32, s), AbortedError);
  CUDA_OK(cudaStreamDestroy(s));
  // Destroying an aborted communicator neither hangs nor crashes (the fixture does it).
}

TEST(NcclGpuTest, DeviceOptionOutOfRangeIsRefused) {
  REQUIRE_GPUS(1);
  const int n = strata::num_gpus();
  PluginHost host;
  TransportRank r(host, "nccl", "{\"device\": " + std::to_string(n) + "}");
  try {
    r.join(unique_name("nccl-baddev"), 0, 1, 10000);
    FAIL() << "device " << n << " accepted with " << n << " GPU(s)";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "'device'")) << e.what();
  }
}

TEST(NcclGpuTest, CurrentDeviceIsTheDefault) {
  REQUIRE_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  PluginHost host;
  TransportRank r(host, "nccl", R"({"timeout_s": 60})");
  r.join(unique_name("nccl-curdev"), 0, 1, 60000);
  DeviceBuffer dev(0, 4096);
  const std::vector<char> in = pattern(kDTypes[2], 1024, 2);
  to_device(dev.get(), in);
  all_reduce(r, dev.get(), dev.get(), 1024, kF32, STRATA_REDUCE_MEAN);
  EXPECT_EQ(to_host(dev.get(), in.size()), in);
}

// World 2 with rank 1 never started: rank 0's comm_create fails at its
// deadline naming rank 1 (one GPU is enough: rank 1 never reaches NCCL).
TEST(NcclGpuTest, CommCreateNamesTheMissingRank) {
  REQUIRE_GPUS(1);
  PluginHost host;
  TransportRank r(host, "nccl", R"({"device": 0})");
  const std::string name = unique_name("nccl-alone");
  const auto t0 = Clock::now();
  try {
    r.join(name, 0, 2, 2000);
    FAIL() << "comm_create of world 2 succeeded with rank 1 absent";
  } catch (const DeadlineExceededError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 1 of 2 never joined communicator '" + name + "'")) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));
}

// Two ranks as threads, rank r on GPU r. Skips with fewer than two GPUs.
TEST(NcclGpuTest, TwoRanksSumMeanAndGather) {
  REQUIRE_GPUS(2);
  PluginHost host;
  const std::string name = unique_name("nccl-two");
  const size_t count = 1 << 20;
  run_ranks(2, [&](int rank) {
    cudaSetDevice(rank);
    TransportRank r(host, "nccl", "{\"device\": " + std::to_string(rank) + ", \"timeout_s\": 60}");
    r.join(name, rank, 2, 60000);
    std::vector<float> in(count), out(count * 2);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 13);
    DeviceBuffer send(rank, count * 4), recv(rank, count * 8);
    ASSERT_EQ(cudaMemcpy(send.get(), in.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    all_reduce(r, send.get(), recv.get(), count, kF32, STRATA_REDUCE_SUM);
    ASSERT_EQ(cudaMemcpy(out.data(), recv.get(), count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != 3.0f * static_cast<float>(i % 13);
    EXPECT_EQ(wrong, 0u) << "SUM on rank " << rank;
    all_reduce(r, send.get(), recv.get(), count, kF32, STRATA_REDUCE_MEAN);
    ASSERT_EQ(cudaMemcpy(out.data(), recv.get(), count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != 1.5f * static_cast<float>(i % 13);
    EXPECT_EQ(wrong, 0u) << "MEAN on rank " << rank;
    all_gather(r, send.get(), recv.get(), count, kF32);
    ASSERT_EQ(cudaMemcpy(out.data(), recv.get(), count * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    wrong = 0;
    for (size_t j = 0; j < 2 * count; ++j)
      wrong += out[j] != static_cast<float>(j / count + 1) * static_cast<float>((j % count) % 13);
    EXPECT_EQ(wrong, 0u) << "all_gather on rank " << rank;
  });
}

// Rank 1 never calls the collective rank 0 calls: rank 0 fails at its
// deadline naming the collective, instead of hanging.
TEST(NcclGpuTest, TwoRanksMissingPeerHitsTheDeadline) {
  REQUIRE_GPUS(2);
  PluginHost host;
  const std::string name = unique_name("nccl-deadline");
  std::string error;
  Clock::duration took{};
  run_ranks(2, [&](int rank) {
    cudaSetDevice(rank);
    TransportRank r(host, "nccl", "{\"device\": " + std::to_string(rank) + ", \"timeout_s\": 3}");
    r.join(name, rank, 2, 60000);
    DeviceBuffer buf(rank, 4096);
    all_reduce(r, buf.get(), buf.get(), 1024, kF32, STRATA_REDUCE_SUM);  // #0, together
    if (rank == 1) return;  // leaves without #1 (its communicator is destroyed: cancelled)
    const auto t0 = Clock::now();
    try {
      all_reduce(r, buf.get(), buf.get(), 1024, kF32, STRATA_REDUCE_SUM);  // #1, alone
      error = "(no error)";
    } catch (const Error& e) {
      error = e.what();
    }
    took = Clock::now() - t0;
  });
  EXPECT_TRUE(contains(error, "all_reduce #1 of communicator '" + name + "'")) << error;
  EXPECT_LT(took, std::chrono::seconds(30)) << error;
}

// strata-bench allreduce --device gpu at world 1: both paths give the right
// sums and every figure is there (the bench's own check, as JSON).
TEST(NcclGpuBenchTest, AllReduceBenchRunsAndChecksWorldOne) {
  REQUIRE_GPUS(1);
  const test::BenchRun r = test::run_strata_bench(
      "allreduce --device gpu -n 1 --sizes 4K,1M --repeats 1 --iters 5 --timeout 60 --json", 240);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << r.out;
  const auto& results = doc["results"];
  ASSERT_EQ(results.size(), 2u) << r.out;
  for (const auto& row : results) {
    EXPECT_EQ(row["ranks"], 1) << row.dump();
    EXPECT_EQ(row["wrong_strata"], 0) << row.dump();
    EXPECT_EQ(row["wrong_raw"], 0) << row.dump();
    EXPECT_GT(row["strata_time_us"].get<double>(), 0.0) << row.dump();
    EXPECT_GT(row["raw_time_us"].get<double>(), 0.0) << row.dump();
    EXPECT_GT(row["strata_algbw_gbps"].get<double>(), 0.0) << row.dump();
    EXPECT_EQ(row["strata_busbw_gbps"].get<double>(), 0.0) << row.dump();  // world 1
  }
  EXPECT_EQ(results[0]["bytes"], 4096);
  EXPECT_EQ(results[1]["bytes"], 1 << 20);
  // The blocking variant, as text: the header and one row with wrong = 0.
  const test::BenchRun t = test::run_strata_bench(
      "allreduce --device gpu -n 1 --sizes 64K --repeats 1 --iters 5 --timeout 60 --blocking", 240);
  ASSERT_EQ(t.status, 0) << t.out << t.err;
  EXPECT_TRUE(contains(t.out, "strata/raw")) << t.out;
  EXPECT_TRUE(contains(t.out, "blocking")) << t.out;
  EXPECT_TRUE(contains(t.out, "64K")) << t.out;
  EXPECT_TRUE(contains(t.out, "float32")) << t.out;
}

}  // namespace
}  // namespace strata
