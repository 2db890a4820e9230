// SPDX-License-Identifier: Apache-2.0
#include "gpu_allreduce.h"

#include "bench_util.h"
#include "strata/error.hpp"

#if STRATA_BENCH_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "key_json.h"
#include "sizes.h"
#include "strata/c/transport.h"
#include "strata/plugin_host.hpp"
#include "strata/sdk/host.hpp"
#endif

namespace strata::bench {

#if !STRATA_BENCH_WITH_CUDA

int gpu_count_or_throw() {
  STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION,
               "--device gpu: this strata-bench was built without CUDA (the CUDA Toolkit or NCCL was not found, or "
               "STRATA_WITH_CUDA=OFF); rebuild with -DSTRATA_WITH_CUDA=ON");
}

int run_gpu_allreduce(const MultiProcOptions&, int) { return gpu_count_or_throw(); }

#else

namespace {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

constexpr const char* kCommunicator = "strata-bench-gpu";

std::string cuda_text(cudaError_t e) { return str_cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)); }

void cuda_check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  STRATA_THROW(e == cudaErrorMemoryAllocation ? STRATA_ERR_UNAVAILABLE : STRATA_ERR_INTERNAL, what, ": ", cuda_text(e),
               e == cudaErrorMemoryAllocation ? "; lower the largest --sizes" : "");
}

std::string nccl_text(ncclResult_t r, ncclComm_t c) {
  const char* last = ncclGetLastError(c);
  return str_cat(ncclGetErrorString(r), last != nullptr && last[0] != '\0' ? str_cat(" (", last, ")") : "");
}

struct GpuDType {
  const char* name;
  DLDataType dl;
  ncclDataType_t nccl;
  std::size_t size;
};

const GpuDType& gpu_dtype(const std::string& name) {
  static const GpuDType kTypes[] = {
      {"float32", {kDLFloat, 32, 1}, ncclFloat32, 4},
      {"float64", {kDLFloat, 64, 1}, ncclFloat64, 8},
      {"int32", {kDLInt, 32, 1}, ncclInt32, 4},
      {"int64", {kDLInt, 64, 1}, ncclInt64, 8},
  };
  for (const GpuDType& d : kTypes)
    if (name == d.name) return d;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--dtype ", name,
               " is not supported: use float32, float64, int32 or int64");
}

// Rank r contributes r + 1 + j % 5 at element j, so the sum over n ranks is
// n (n + 1) / 2 + n (j % 5): exact in every dtype here.
template <class T>
void fill_t(char* out, std::size_t count, int rank) {
  T* p = reinterpret_cast<T*>(out);
  for (std::size_t j = 0; j < count; ++j) p[j] = static_cast<T>(rank + 1 + static_cast<int>(j % 5));
}
template <class T>
std::int64_t wrong_t(const char* in, std::size_t count, int n) {
  const T* p = reinterpret_cast<const T*>(in);
  std::int64_t wrong = 0;
  for (std::size_t j = 0; j < count; ++j)
    wrong += p[j] != static_cast<T>(n * (n + 1) / 2 + n * static_cast<int>(j % 5));
  return wrong;
}
std::vector<char> fill(const GpuDType& d, std::size_t count, int rank) {
  std::vector<char> h(count * d.size);
  if (d.nccl == ncclFloat32) fill_t<float>(h.data(), count, rank);
  else if (d.nccl == ncclFloat64) fill_t<double>(h.data(), count, rank);
  else if (d.nccl == ncclInt32) fill_t<std::int32_t>(h.data(), count, rank);
  else fill_t<std::int64_t>(h.data(), count, rank);
  return h;
}
std::int64_t count_wrong(const GpuDType& d, const std::vector<char>& h, std::size_t count, int n) {
  if (d.nccl == ncclFloat32) return wrong_t<float>(h.data(), count, n);
  if (d.nccl == ncclFloat64) return wrong_t<double>(h.data(), count, n);
  if (d.nccl == ncclInt32) return wrong_t<std::int32_t>(h.data(), count, n);
  return wrong_t<std::int64_t>(h.data(), count, n);
}

// Device memory, freed at scope exit.
class DeviceMem {
 public:
  DeviceMem(std::size_t bytes, int device) {
    cuda_check(cudaMalloc(&p_, std::max<std::size_t>(bytes, 16)),
               str_cat("cudaMalloc of ", format_size(bytes), " bytes on GPU ", device));
  }
  ~DeviceMem() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// The raw NCCL reference communicator: created non-blocking as the
// transport does, so its setup has the same deadline; aborted if dropped
// unfinished.
class RawComm {
 public:
  RawComm(const sdk::Host& host, int rank, int n, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    const auto left_ms = [&] {
      return std::max<std::int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    };
    ncclUniqueId id;
    const std::string key = str_cat(kCommunicator, "/raw_nccl_unique_id");
    if (rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        STRATA_THROW(STRATA_ERR_UNAVAILABLE, "raw NCCL: ncclGetUniqueId failed: ", nccl_text(r, nullptr),
                     " (NCCL_SOCKET_IFNAME picks the bootstrap interface)");
      if (n > 1) host.store_set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id), left_ms());
    } else {
      const std::string v = host.store_get(key, left_ms());
      if (v.size() != sizeof id)
        STRATA_THROW(STRATA_ERR_DATA_LOSS, "raw NCCL: the unique id under '", key, "' is ", v.size(), " bytes, not ",
                     sizeof id);
      std::memcpy(&id, v.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, n, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, "raw NCCL: ncclCommInitRankConfig failed on rank ", rank, ": ",
                   nccl_text(r, comm_));
    settle(deadline, "raw NCCL communicator setup");
  }
  ~RawComm() {
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  }
  RawComm(const RawComm&) = delete;
  RawComm& operator=(const RawComm&) = delete;
  ncclComm_t get() const { return comm_; }

  // Wait until the communicator leaves ncclInProgress (non-blocking mode).
  void settle(Clock::time_point deadline, const std::string& what) {
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": ", nccl_text(state, comm_));
      if (Clock::now() >= deadline)
        STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, what, " did not finish by the --timeout deadline; a rank is stuck "
                                                         "or gone (NCCL_DEBUG=INFO shows where)");
      std::this_thread::yield();
    }
  }
  void call(ncclResult_t r, Clock::time_point deadline, const std::string& what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": ", nccl_text(r, comm_));
    settle(deadline, what);
  }
  // Finalize and destroy; abort (in the destructor) when that does not finish in time.
  void close(double timeout_s) {
    if (comm_ == nullptr) return;
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r != ncclSuccess && r != ncclInProgress) return;
    try {
      settle(deadline, "raw NCCL finalize");
    } catch (const Error&) {
      return;
    }
    (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

// Wait for `s` by `deadline`, watching the raw communicator's errors.
void sync_stream(cudaStream_t s, ncclComm_t raw, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_check(q, what);
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(raw, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": raw NCCL error ", nccl_text(state, raw));
    if (Clock::now() >= deadline)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, what, " did not finish by the --timeout deadline; a rank is stuck or "
                                                       "gone (check every rank's error)");
    std::this_thread::yield();
  }
}

// The Strata communicator: the "nccl" transport through the plugin host.
class StrataComm {
 public:
  StrataComm(const MultiProcOptions& o, int rank, int device) {
    nlohmann::json opts = cli::apply_key_json(o.transport_option_pairs, nlohmann::json::parse(o.transport_options),
                                              "--option", "'timeout_s=60'");
    if (!opts.contains("device")) opts["device"] = device;
    if (!opts.contains("timeout_s")) opts["timeout_s"] = o.timeout_s;
    inst_ = PluginHost::global().create(STRATA_KIND_TRANSPORT, "nccl", opts.dump());
    vt_ = inst_.vtable_as<strata_transport_vtable>();
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->comm_create(static_cast<strata_transport_t>(inst_.handle()), kCommunicator, rank,
                                          o.ranks, static_cast<std::int64_t>(o.timeout_s * 1000), &comm_, &err),
                         err, "nccl transport comm_create");
  }
  ~StrataComm() {
    if (comm_ != nullptr) vt_->comm_destroy(comm_);
  }
  StrataComm(const StrataComm&) = delete;
  StrataComm& operator=(const StrataComm&) = delete;
  void all_reduce(const void* send, void* recv, std::size_t count, DLDataType dt, cudaStream_t s) {
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->all_reduce(comm_, send, recv, count, dt, STRATA_REDUCE_SUM, s, &err), err,
                         "all_reduce through the nccl transport");
  }

 private:
  PluginInstance inst_;
  const strata_transport_vtable* vt_ = nullptr;
  strata_comm_t comm_ = nullptr;
};

}  // namespace

int gpu_count_or_throw() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return n;
  (void)cudaGetLastError();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "--device gpu: no GPU is visible to this process (cudaGetDeviceCount: ",
               e == cudaSuccess ? std::string("0 devices") : cuda_text(e),
               "); check that `nvidia-smi` lists a GPU, that the NVIDIA driver is loaded, and that ",
               visible == nullptr ? std::string("CUDA_VISIBLE_DEVICES (unset)")
                                  : str_cat("CUDA_VISIBLE_DEVICES='", visible, "'"),
               " does not hide it; or run the CPU benchmark (--device cpu)");
}

int run_gpu_allreduce(const MultiProcOptions& o, int rank) {
  const int gpus = gpu_count_or_throw();
  const int n = o.ranks;
  const int device = rank % gpus;
  cuda_check(cudaSetDevice(device), str_cat("cudaSetDevice(", device, ")"));
  const GpuDType& d = gpu_dtype(o.dtype);
  const sdk::Host host(PluginHost::global().host_api(), "bench");
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1000));

  StrataComm strata(o, rank, device);
  RawComm raw(host, rank, n, o.timeout_s);
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { (void)cudaStreamDestroy(s); }
  } stream_guard{stream};

  // One pinned double on the host and on the device, for the cross-rank
  // reductions of the batch times and wrong-element counts (raw NCCL).
  double* pinned = nullptr;
  cuda_check(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(double)), "cudaMallocHost");
  struct PinnedGuard {
    double* p;
    ~PinnedGuard() { (void)cudaFreeHost(p); }
  } pinned_guard{pinned};
  DeviceMem scalar(sizeof(double), device);
  auto reduce_scalar = [&](double v, ncclRedOp_t op, const char* what) {
    const auto deadline = Clock::now() + timeout;
    *pinned = v;
    cuda_check(cudaMemcpyAsync(scalar.get(), pinned, sizeof(double), cudaMemcpyHostToDevice, stream), what);
    raw.call(ncclAllReduce(scalar.get(), scalar.get(), 1, ncclFloat64, op, raw.get(), stream), deadline, what);
    cuda_check(cudaMemcpyAsync(pinned, scalar.get(), sizeof(double), cudaMemcpyDeviceToHost, stream), what);
    sync_stream(stream, raw.get(), deadline, what);
    return *pinned;
  };

  const double factor = 2.0 * (n - 1) / n;
  nlohmann::json results = nlohmann::json::array();
  if (rank == 0 && !o.json) {
    cudaDeviceProp prop{};
    (void)cudaGetDeviceProperties(&prop, device);
    int nccl_version = 0, runtime = 0;
    (void)ncclGetVersion(&nccl_version);
    (void)cudaRuntimeGetVersion(&runtime);
    std::printf("# allreduce %s SUM on GPUs: ranks=%d (rank r on GPU r %% %d; rank 0: %s), NCCL %d.%d.%d, CUDA "
                "runtime %d.%d\n",
                d.name, n, gpus, prop.name, nccl_version / 10000, (nccl_version / 100) % 100, nccl_version % 100,
                runtime / 1000, (runtime % 1000) / 10);
    std::printf("# strata = the nccl transport through the plugin host, raw = ncclAllReduce on its own communicator; "
                "%s; trials=%d (median), busbw factor=%.3f%s\n",
                o.blocking ? "blocking: Strata with stream NULL, raw synchronised after each operation"
                           : "stream-ordered, one synchronisation per batch (nccl-tests' method)",
                o.trials, factor, n == 1 ? " (world 1: busbw is 0, compare time and algbw)" : "");
    std::printf("%10s %12s %8s %13s %12s %12s %13s %12s %12s %11s %8s\n", "size", "count", "dtype", "strata(us)",
                "algbw(GB/s)", "busbw(GB/s)", "raw(us)", "algbw(GB/s)", "busbw(GB/s)", "strata/raw", "wrong");
    std::fflush(stdout);
  }

  std::vector<double> strata_times(static_cast<std::size_t>(o.trials)), raw_times(static_cast<std::size_t>(o.trials));
  for (std::uint64_t requested : o.sizes) {
    const std::size_t count = static_cast<std::size_t>(requested / d.size);
    const std::size_t bytes = count * d.size;
    const std::string what = str_cat("all_reduce of ", format_size(bytes), " bytes");
    DeviceMem send(bytes, device), recv(bytes, device);
    const std::vector<char> input = fill(d, count, rank);
    std::vector<char> output(bytes);
    // On `stream`, so every later operation on it sees the whole input.
    cuda_check(cudaMemcpyAsync(send.get(), input.data(), bytes, cudaMemcpyHostToDevice, stream), "uploading the input");
    sync_stream(stream, raw.get(), Clock::now() + timeout, "uploading the input");

    auto strata_op = [&] { strata.all_reduce(send.get(), recv.get(), count, d.dl, o.blocking ? nullptr : stream); };
    auto raw_op = [&](Clock::time_point deadline) {
      raw.call(ncclAllReduce(send.get(), recv.get(), count, d.nccl, ncclSum, raw.get(), stream), deadline,
               str_cat("raw ", what));
      if (o.blocking) sync_stream(stream, raw.get(), deadline, str_cat("raw ", what));
    };
    // Correctness of the first operation of each path.
    auto check = [&](bool strata_path) {
      const auto deadline = Clock::now() + timeout;
      cuda_check(cudaMemsetAsync(recv.get(), 0, bytes, stream), "clearing the output");
      // Done before the operation: with --blocking, Strata runs on its own stream.
      sync_stream(stream, raw.get(), deadline, "clearing the output");
      if (strata_path) strata_op();
      else raw_op(deadline);
      sync_stream(stream, raw.get(), deadline, what);
      cuda_check(cudaMemcpyAsync(output.data(), recv.get(), bytes, cudaMemcpyDeviceToHost, stream),
                 "downloading the result");
      sync_stream(stream, raw.get(), deadline, "downloading the result");
      return static_cast<std::int64_t>(
          reduce_scalar(static_cast<double>(count_wrong(d, output, count, n)), ncclSum, "summing the wrong counts"));
    };
    const std::int64_t wrong_strata = check(true);
    const std::int64_t wrong_raw = check(false);

    std::int64_t iters = o.iters;
    if (iters == 0) iters = std::clamp<std::int64_t>(static_cast<std::int64_t>((1ull << 30) / bytes), 5, 1000);
    const std::int64_t warmup = o.warmup >= 0 ? o.warmup : iters / 5;
    // One batch: ranks start together (a one-element all-reduce), the
    // operations are enqueued, one synchronisation; the slowest rank's time.
    auto batch = [&](bool strata_path, std::int64_t ops) {
      (void)reduce_scalar(0.0, ncclMax, "the barrier before a batch");
      const auto deadline = Clock::now() + timeout;
      const auto t0 = Clock::now();
      for (std::int64_t i = 0; i < ops; ++i) {
        if (strata_path) strata_op();
        else raw_op(deadline);
      }
      sync_stream(stream, raw.get(), deadline, what);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count() /
                        static_cast<double>(std::max<std::int64_t>(ops, 1));
      return reduce_scalar(dt, ncclMax, "the maximum of the batch times");
    };
    (void)batch(true, warmup);
    (void)batch(false, warmup);
    for (int t = 0; t < o.trials; ++t) {
      strata_times[static_cast<std::size_t>(t)] = batch(true, iters);
      raw_times[static_cast<std::size_t>(t)] = batch(false, iters);
    }
    if (rank != 0) continue;
    const double ts = median(strata_times), tr = median(raw_times);
    const double algs = static_cast<double>(bytes) / ts / 1e9, algr = static_cast<double>(bytes) / tr / 1e9;
    if (o.json) {
      results.push_back({{"op", "allreduce"}, {"device", "gpu"}, {"transport", "nccl"}, {"ranks", n},
                         {"bytes", bytes}, {"count", count}, {"dtype", d.name}, {"iters", iters},
                         {"trials", o.trials}, {"blocking", o.blocking}, {"strata_time_us", ts * 1e6},
                         {"strata_algbw_gbps", algs}, {"strata_busbw_gbps", algs * factor},
                         {"raw_time_us", tr * 1e6}, {"raw_algbw_gbps", algr}, {"raw_busbw_gbps", algr * factor},
                         {"ratio_strata_over_raw", ts / tr}, {"wrong_strata", wrong_strata},
                         {"wrong_raw", wrong_raw}});
    } else {
      std::printf("%10s %12zu %8s %13.1f %12.2f %12.2f %13.1f %12.2f %12.2f %11.3f %8lld\n",
                  format_size(bytes).c_str(), count, d.name, ts * 1e6, algs, algs * factor, tr * 1e6, algr,
                  algr * factor, ts / tr, static_cast<long long>(wrong_strata + wrong_raw));
      std::fflush(stdout);
    }
  }
  if (rank == 0 && o.json) {
    std::printf("%s\n", nlohmann::json{{"results", results}}.dump(2).c_str());
    std::fflush(stdout);
  }
  // Leave together, so no rank tears down while another still reduces.
  (void)reduce_scalar(0.0, ncclMax, "the final barrier");
  raw.close(o.timeout_s);
  return 0;
}

#endif  // STRATA_BENCH_WITH_CUDA

}  // namespace strata::bench
