// SPDX-License-Identifier: Apache-2.0
#include "nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nccl_rendezvous.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/rendezvous.hpp"

namespace strata::transport::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using ::strata::detail::str_cat;

// How often the watchdog polls every live communicator. Errors surface
// within this period; the cost is one ncclCommGetAsyncError and a few
// cudaEventQuery calls per period.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(20);
// Enqueued collectives the calling thread lets wait for the watchdog's reaping.
constexpr size_t kMaxUnreaped = 4096;
// How often a blocking collective checks ncclCommGetAsyncError and its
// deadline between cudaStreamQuery polls.
constexpr auto kErrorCheckPeriod = std::chrono::milliseconds(1);
// comm_destroy of an idle communicator: ncclCommFinalize gets this long
// before the communicator is aborted instead.
constexpr auto kFinalizeLimit = std::chrono::seconds(10);

std::string cuda_error_text(cudaError_t e) { return str_cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)); }

std::string visible_devices_text() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v == nullptr ? std::string("CUDA_VISIBLE_DEVICES (unset)") : str_cat("CUDA_VISIBLE_DEVICES='", v, "'");
}

std::string cuda_version_text(int v) { return str_cat(v / 1000, ".", (v % 1000) / 10); }

// The number of visible GPUs; throws FAILED_PRECONDITION saying what to
// check when there is none (no driver, no device, CUDA_VISIBLE_DEVICES="").
int visible_gpu_count(const std::string& who) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return n;
  (void)cudaGetLastError();  // leave no error behind for the caller's next CUDA call
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who, ": no GPU is visible to this process (cudaGetDeviceCount: ",
               e == cudaSuccess ? std::string("0 devices") : cuda_error_text(e),
               "); check that `nvidia-smi` lists a GPU, that the NVIDIA driver is loaded and supports CUDA ",
               cuda_version_text(runtime), ", and that ", visible_devices_text(),
               " does not hide it; for host memory use the tcp or libfabric transport");
}

std::string dtype_name(DLDataType t) {
  const char* base = t.code == kDLInt      ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLFloat  ? "float"
                     : t.code == kDLBfloat ? "bfloat"
                     : t.code == 5         ? "complex"  // kDLComplex (DLPack >= 0.6)
                                           : nullptr;
  std::string s = base != nullptr ? str_cat(base, static_cast<int>(t.bits))
                                  : str_cat("dtype(code ", static_cast<int>(t.code), ", ", static_cast<int>(t.bits),
                                            " bits)");
  if (t.lanes != 1) s += str_cat("x", t.lanes);
  return s;
}

struct NcclType {
  ncclDataType_t type;
  uint64_t bytes;
};

NcclType nccl_type(DLDataType t, const char* op_name, const std::string& who) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 16) return {ncclFloat16, 2};
        if (t.bits == 32) return {ncclFloat32, 4};
        if (t.bits == 64) return {ncclFloat64, 8};
        break;
      case kDLBfloat:
        if (t.bits == 16) return {ncclBfloat16, 2};
        break;
      case kDLInt:
        if (t.bits == 8) return {ncclInt8, 1};
        if (t.bits == 32) return {ncclInt32, 4};
        if (t.bits == 64) return {ncclInt64, 8};
        break;
      case kDLUInt:
        if (t.bits == 8) return {ncclUint8, 1};
        if (t.bits == 32) return {ncclUint32, 4};
        if (t.bits == 64) return {ncclUint64, 8};
        break;
      default:
        break;
    }
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op_name, " of ", who, ": dtype ", dtype_name(t),
               " is not supported by NCCL; use float16, bfloat16, float32, float64, int8, int32, int64, uint8, "
               "uint32 or uint64 (convert other types first)");
}

ncclRedOp_t nccl_op(strata_reduce_op op) {
  switch (op) {
    case STRATA_REDUCE_SUM: return ncclSum;
    case STRATA_REDUCE_MEAN: return ncclAvg;
    case STRATA_REDUCE_MIN: return ncclMin;
    case STRATA_REDUCE_MAX: return ncclMax;
    case STRATA_REDUCE_PROD: return ncclProd;
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce op ", static_cast<int>(op), " is not a strata_reduce_op");
}

// What to check for an NCCL failure, by result.
const char* nccl_hint(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
      return "; another rank failed, exited or was aborted: its log names the first error";
    case ncclSystemError:
      return "; a system or network call failed (NCCL_DEBUG=WARN names it; NCCL_SOCKET_IFNAME picks the "
             "interface NCCL uses)";
    case ncclUnhandledCudaError:
      return "; a CUDA call inside NCCL failed (check `nvidia-smi` and the driver's log, dmesg)";
    case ncclInvalidUsage:
    case ncclInvalidArgument:
      return "; NCCL refused the call (two ranks on one GPU, mismatched collectives across ranks, or a bad "
             "argument; NCCL_DEBUG=WARN says which)";
    default:
      return "";
  }
}

strata_status_t status_of(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return STRATA_ERR_UNAVAILABLE;
    case ncclInvalidUsage:
    case ncclInvalidArgument:
      return STRATA_ERR_INVALID_ARGUMENT;
    default:
      return STRATA_ERR_INTERNAL;
  }
}

std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return str_cat("NCCL error ", ncclGetErrorString(r),
                 last != nullptr && last[0] != '\0' ? str_cat(" (", last, ")") : "",
                 nccl_hint(r));
}

// Makes `device` current for the scope and restores the previous device.
// The runtime's current device is the driver's current context, so this is
// the caller's device too (the plugin links its own static runtime).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device && cudaSetDevice(device) == cudaSuccess)
      changed_ = true;
  }
  ~DeviceGuard() {
    if (changed_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

[[noreturn]] void no_p2p(const char* call) {
  STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "nccl transport: ", call,
               " is not supported: the nccl transport moves device buffers through collectives only (all_reduce, "
               "broadcast, all_gather, reduce_scatter; NCCL has no message tags); use the tcp or libfabric "
               "transport for point-to-point");
}

// A buffer argument of a collective, for validation.
struct Buf {
  const void* ptr;
  uint64_t bytes;
  const char* role;  // "send" or "recv"
};

struct Region {
  void* data;
  uint64_t bytes;
};

}  // namespace

// ---------------------------------------------------------- communicator ---

class NcclComm : public sdk::CommBase {
 public:
  NcclComm(sdk::Host host, const Options& opts, std::string name, int rank, int world, int device)
      : host_(std::move(host)), opts_(opts), name_(std::move(name)), rank_(rank), world_(world), device_(device) {
    who_ = str_cat("communicator '", name_, "' (rank ", rank_, " of ", world_, ", GPU ", device_, ")");
  }
  ~NcclComm() override;

  // Creates the stream and the NCCL communicator from `id` (a ncclUniqueId)
  // by `deadline`, then starts the watchdog.
  void setup(const std::string& id, Clock::time_point deadline, int64_t timeout_ms);

  void abort(const char* reason) noexcept override {
    try {
      set_reason(str_cat(who_, " was aborted: ", reason));
    } catch (...) {
      aborted_.store(true);  // out of memory for the text: the flag alone still stops everything
    }
    std::lock_guard<std::mutex> lk(wd_mu_);
    wd_cv_.notify_all();
  }

  strata_mem_region_t mem_register(void* data, uint64_t bytes, DLDevice) override {
    return reinterpret_cast<strata_mem_region_t>(new Region{data, bytes});
  }
  void mem_deregister(strata_mem_region_t mr) noexcept override { delete reinterpret_cast<Region*>(mr); }
  strata_request_t isend(int32_t, uint64_t, const strata_buffer&) override { no_p2p("isend"); }
  strata_request_t irecv(int32_t, uint64_t, const strata_buffer&) override { no_p2p("irecv"); }
  strata_request_t iwrite(int32_t, const strata_buffer&, const void*, uint64_t, uint64_t) { no_p2p("iwrite"); }
  bool test(strata_request_t, uint64_t*) override {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "nccl transport: test() got a request, but this transport never makes one (it has no isend/irecv)");
  }
  uint64_t wait(strata_request_t, int64_t) override {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "nccl transport: wait() got a request, but this transport never makes one (it has no isend/irecv)");
  }
  void cancel(strata_request_t) noexcept override {}

  void all_reduce(const void* send, void* recv, uint64_t count, DLDataType dt, strata_reduce_op op, void* stream) {
    const NcclType t = nccl_type(dt, "all_reduce", who_);
    const ncclRedOp_t nop = nccl_op(op);
    const uint64_t bytes = count * t.bytes;
    collective("all_reduce", STRATA_COLL_ALL_REDUCE, op, dt, count, -1, stream,
               {Buf{send, bytes, "send"}, Buf{recv, bytes, "recv"}}, true,
               [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(send, recv, count, t.type, nop, c, s); });
  }
  void broadcast(const void* send, void* recv, uint64_t count, DLDataType dt, int32_t root, void* stream) {
    const NcclType t = nccl_type(dt, "broadcast", who_);
    if (root < 0 || root >= world_)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "broadcast of ", who_, ": root ", root, " is not a rank (0..",
                   world_ - 1, ")");
    const uint64_t bytes = count * t.bytes;
    // Only the root's send buffer is read.
    std::vector<Buf> bufs{Buf{recv, bytes, "recv"}};
    if (rank_ == root) bufs.push_back(Buf{send, bytes, "send"});
    collective("broadcast", STRATA_COLL_BROADCAST, 0, dt, count, root, stream, std::move(bufs), rank_ == root,
               [&](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(send, recv, count, t.type, root, c, s); });
  }
  void all_gather(const void* send, void* recv, uint64_t count, DLDataType dt, void* stream) {
    const NcclType t = nccl_type(dt, "all_gather", who_);
    const uint64_t bytes = count * t.bytes;
    // In place (NCCL's convention): send is this rank's slice of recv.
    const bool in_place = static_cast<const char*>(send) == static_cast<const char*>(recv) + rank_ * bytes;
    collective("all_gather", STRATA_COLL_ALL_GATHER, 0, dt, count, -1, stream,
               {Buf{send, bytes, "send"}, Buf{recv, bytes * world_, "recv"}}, !in_place,
               [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(send, recv, count, t.type, c, s); });
  }
  void reduce_scatter(const void* send, void* recv, uint64_t count, DLDataType dt, strata_reduce_op op,
                      void* stream) {
    const NcclType t = nccl_type(dt, "reduce_scatter", who_);
    const ncclRedOp_t nop = nccl_op(op);
    const uint64_t bytes = count * t.bytes;
    // In place (NCCL's convention): recv is this rank's slice of send.
    const bool in_place = static_cast<const char*>(recv) == static_cast<const char*>(send) + rank_ * bytes;
    collective("reduce_scatter", STRATA_COLL_REDUCE_SCATTER, op, dt, count, -1, stream,
               {Buf{send, bytes * world_, "send"}, Buf{recv, bytes, "recv"}}, !in_place,
               [&](ncclComm_t c, cudaStream_t s) { return ncclReduceScatter(send, recv, count, t.type, nop, c, s); });
  }

 private:
  // A collective: its name and sequence number ("all_reduce #17"); the
  // message text is built only when something fails.
  struct OpId {
    const char* name = nullptr;
    uint64_t seq = 0;
  };
  std::string describe(const OpId& op) const {
    return op.name != nullptr ? str_cat(op.name, " #", op.seq, " of ", who_) : who_;
  }
  // One stream-ordered collective the watchdog follows until its event fires.
  struct InFlight {
    OpId op;
    cudaEvent_t done;
    cudaStream_t stream;  // events on one stream complete in the order they were recorded
    Clock::time_point deadline;
  };

  Clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_s));
  }
  std::string reason() const {
    std::lock_guard<std::mutex> lk(reason_mu_);
    return reason_.empty() ? str_cat(who_, " was aborted") : reason_;
  }
  // The first reason wins: later ones are consequences of it.
  void set_reason(const std::string& r) {
    std::lock_guard<std::mutex> lk(reason_mu_);
    if (reason_.empty()) reason_ = r;
    aborted_.store(true);
  }
  void throw_if_aborted() const {
    if (aborted_.load()) STRATA_THROW(STRATA_ERR_ABORTED, reason());
  }

  void check_buffers(const char* op_name, const std::vector<Buf>& bufs, bool no_overlap);
  template <class Enqueue>
  void collective(const char* op_name, strata_collective_op op, uint32_t reduce_op, DLDataType dt, uint64_t count,
                  int32_t peer, void* user_stream, std::vector<Buf> bufs, bool no_overlap, Enqueue&& enqueue);
  void wait_own_stream(const OpId& op, Clock::time_point deadline);

  // Everything below with the suffix _locked needs nccl_mu_.
  void abort_locked(const std::string& why);
  [[noreturn]] void fail_locked(strata_status_t code, const std::string& msg) {
    abort_locked(msg);
    STRATA_THROW(code, msg);
  }
  void check_async_locked(const OpId& op);
  void finish_call_locked(ncclResult_t r, const OpId& op, Clock::time_point deadline);
  void track_locked(const OpId& op, cudaStream_t s, Clock::time_point deadline);
  void reap_locked(bool enforce_deadlines);
  void watchdog();

  sdk::Host host_;
  Options opts_;
  std::string name_;
  int rank_, world_, device_;
  std::string who_;
  cudaStream_t stream_ = nullptr;  // for collectives called without a stream

  std::mutex call_mu_;  // serialises collectives (one order of NCCL calls per rank)
  uint64_t seq_ = 0;    // call_mu_
  // Device buffers of this GPU seen by recent collectives (call_mu_): a
  // training loop passes the same few buffers every step. An entry can
  // outlive its allocation; a later cudaMalloc at that address is device
  // memory again, and NCCL itself still fails on anything else.
  std::array<const void*, 8> checked_ptrs_{};
  size_t checked_next_ = 0;  // call_mu_

  std::mutex nccl_mu_;          // every NCCL call on comm_ and the members below
  ncclComm_t comm_ = nullptr;   // null once aborted or destroyed
  std::deque<InFlight> inflight_;
  std::vector<cudaEvent_t> spare_events_;
  OpId last_op_;                // the latest collective enqueued, for the watchdog's messages

  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mu_;
  std::string reason_;

  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;  // wd_mu_
  std::thread wd_;
};

void NcclComm::setup(const std::string& id, Clock::time_point deadline, int64_t timeout_ms) {
  DeviceGuard guard(device_);
  // A blocking stream: collectives called without a stream are ordered
  // after the caller's work on the legacy default stream (cudaMemcpy,
  // cudaMemset), as a caller who passes no stream expects.
  const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    stream_ = nullptr;
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "comm_create of ", who_, ": cannot create a CUDA stream on GPU ",
                 device_, " (", cuda_error_text(e), "); check `nvidia-smi` for the GPU's state and ",
                 visible_devices_text());
  }
  ncclUniqueId uid;
  static_assert(sizeof uid == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing or stuck peer cannot hang this thread past the deadline
  ncclComm_t c = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&c, world_, uid, rank_, &config);
  auto fail = [&](strata_status_t code, const std::string& msg) {
    if (c != nullptr) (void)ncclCommAbort(c);
    STRATA_THROW(code, msg);
  };
  if (r != ncclSuccess && r != ncclInProgress)
    fail(STRATA_ERR_UNAVAILABLE,
         str_cat("comm_create of ", who_, ": ncclCommInitRankConfig failed: ", nccl_error_text(r, c)));
  for (;;) {
    ncclResult_t state = ncclInProgress;
    r = ncclCommGetAsyncError(c, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress)
      fail(status_of(state) == STRATA_ERR_INTERNAL ? STRATA_ERR_UNAVAILABLE : status_of(state),
           str_cat("comm_create of ", who_, ": NCCL could not create the communicator: ", nccl_error_text(state, c)));
    if (host_.abort_requested())
      fail(STRATA_ERR_ABORTED, str_cat("comm_create of ", who_, ": the job was aborted while NCCL created the "
                                       "communicator"));
    if (Clock::now() >= deadline)
      fail(STRATA_ERR_DEADLINE_EXCEEDED,
           str_cat("comm_create of ", who_, ": NCCL did not finish creating the communicator within ", timeout_ms,
                   " ms although all ", world_, " ranks passed the rendezvous; a rank is stuck in NCCL's bootstrap "
                   "or the ranks cannot reach each other's bootstrap address (NCCL_DEBUG=INFO shows where; "
                   "NCCL_SOCKET_IFNAME picks the interface), or raise the comm_create timeout "
                   "(/timeouts/rendezvous_s)"));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    std::lock_guard<std::mutex> lk(nccl_mu_);
    comm_ = c;
  }
  wd_ = std::thread([this] { watchdog(); });
  host_.debug("created ", who_, " (NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH, ")");
}

NcclComm::~NcclComm() {
  {
    std::lock_guard<std::mutex> lk(wd_mu_);
    wd_stop_ = true;
    wd_cv_.notify_all();
  }
  if (wd_.joinable()) wd_.join();
  std::lock_guard<std::mutex> lk(nccl_mu_);
  DeviceGuard guard(device_);
  if (comm_ != nullptr) {
    // Pending work is cancelled (the contract), so only an idle
    // communicator is finalized; a finalize that does not finish in time
    // (a peer gone) falls back to abort too.
    reap_locked(false);
    const bool idle = inflight_.empty() && (stream_ == nullptr || cudaStreamQuery(stream_) == cudaSuccess);
    bool clean = false;
    const ncclResult_t fr = idle ? ncclCommFinalize(comm_) : ncclInvalidUsage;
    if (fr == ncclSuccess || fr == ncclInProgress) {
      const auto deadline = Clock::now() + std::min<Clock::duration>(timeout(), kFinalizeLimit);
      for (;;) {
        ncclResult_t state = ncclInProgress;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state == ncclSuccess) {
          clean = true;
          break;
        }
        if (state != ncclInProgress || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (clean) {
      (void)ncclCommDestroy(comm_);
    } else {
      host_.debug(who_, ": destroyed with work pending or a failed finalize; aborting the NCCL communicator");
      (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  for (auto& f : inflight_) spare_events_.push_back(f.done);
  inflight_.clear();
  for (cudaEvent_t ev : spare_events_) (void)cudaEventDestroy(ev);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

void NcclComm::abort_locked(const std::string& why) {
  set_reason(why);
  if (comm_ == nullptr) return;
  DeviceGuard guard(device_);
  host_.error(reason());
  // Stops kernels that wait for a dead peer and frees the communicator.
  // Whatever it returns, comm_ is never touched again.
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  for (auto& f : inflight_) spare_events_.push_back(f.done);
  inflight_.clear();
}

void NcclComm::check_async_locked(const OpId& op) {
  if (comm_ == nullptr) STRATA_THROW(STRATA_ERR_ABORTED, reason());
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) state = r;
  if (state == ncclSuccess || state == ncclInProgress) return;
  fail_locked(status_of(state), str_cat(describe(op), ": ", nccl_error_text(state, comm_)));
}

void NcclComm::finish_call_locked(ncclResult_t r, const OpId& op, Clock::time_point deadline) {
  if (r == ncclSuccess) return;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    // Refused before anything was enqueued: the communicator is still good.
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, describe(op), ": ", nccl_error_text(r, comm_));
  }
  if (r != ncclInProgress) fail_locked(status_of(r), str_cat(describe(op), ": ", nccl_error_text(r, comm_)));
  // A non-blocking communicator may still be enqueueing: NCCL wants its
  // state to leave ncclInProgress before the next call.
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      fail_locked(status_of(state), str_cat(describe(op), ": ", nccl_error_text(state, comm_)));
    if (aborted_.load()) fail_locked(STRATA_ERR_ABORTED, reason());
    if (Clock::now() >= deadline)
      fail_locked(STRATA_ERR_DEADLINE_EXCEEDED,
                  str_cat(describe(op), ": NCCL did not finish enqueueing it within ", opts_.timeout_s,
                          " s (option 'timeout_s'); the communicator was aborted"));
    std::this_thread::yield();
  }
}

void NcclComm::track_locked(const OpId& op, cudaStream_t s, Clock::time_point deadline) {
  last_op_ = op;
  cudaEvent_t ev = nullptr;
  if (!spare_events_.empty()) {
    ev = spare_events_.back();
    spare_events_.pop_back();
  } else {
    const cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      // The collective is enqueued already: only its deadline goes unwatched.
      host_.warn(describe(op), ": cannot create a CUDA event to watch it (", cuda_error_text(e),
                 "); its deadline is not enforced");
      return;
    }
  }
  const cudaError_t e = cudaEventRecord(ev, s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    spare_events_.push_back(ev);
    host_.warn(describe(op), ": cannot record a CUDA event on the caller's stream (", cuda_error_text(e),
               "); its deadline is not enforced");
    return;
  }
  inflight_.push_back(InFlight{op, ev, s, deadline});
  // The watchdog reaps completed events every kWatchdogPeriod. Querying
  // the oldest pending event here, on every call, cost about 2.5 us per
  // collective in back-to-back bursts on an H100 (most likely a flush of
  // the driver's queued work); the calling thread reaps only when the
  // queue is long.
  if (inflight_.size() >= kMaxUnreaped) reap_locked(false);
}

void NcclComm::reap_locked(bool enforce_deadlines) {
  // Events recorded on one stream complete in order, so the completed
  // entries of a run on one stream are a prefix of it: the run's last event
  // tells whether all of it is done (the usual case, one query per period),
  // else a binary search finds the prefix. Querying every event one by one
  // held nccl_mu_, which every collective needs, for thousands of queries
  // per period in a burst of small collectives.
  const auto query = [&](const InFlight& f) {
    const cudaError_t q = cudaEventQuery(f.done);
    if (q == cudaSuccess || q == cudaErrorNotReady) return q == cudaSuccess;
    (void)cudaGetLastError();
    abort_locked(str_cat(describe(f.op), ": the CUDA stream it was enqueued on failed (", cuda_error_text(q),
                         "); the communicator was aborted"));
    return false;
  };
  while (!inflight_.empty() && comm_ != nullptr) {
    size_t run = 1;
    while (run < inflight_.size() && inflight_[run].stream == inflight_.front().stream) ++run;
    size_t done = 0;  // entries known complete at the front
    if (query(inflight_[run - 1])) {
      done = run;
    } else {
      if (comm_ == nullptr) return;
      size_t lo = 0, hi = run - 1;  // [0, lo) complete; hi is not
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (query(inflight_[mid])) {
          lo = mid + 1;
        } else {
          if (comm_ == nullptr) return;
          hi = mid;
        }
      }
      done = lo;
    }
    for (size_t i = 0; i < done; ++i) {
      spare_events_.push_back(inflight_.front().done);
      inflight_.pop_front();
    }
    if (done < run) break;  // the front entry is still pending
  }
  if (inflight_.empty() || comm_ == nullptr) return;
  const InFlight& f = inflight_.front();
  if (enforce_deadlines && Clock::now() >= f.deadline)
    abort_locked(str_cat(describe(f.op), " did not complete within ", opts_.timeout_s,
                         " s of being enqueued (option 'timeout_s' / /timeouts/collective_s); a rank did not call "
                         "it or is stuck (check every rank's log), or work before it on the stream took that "
                         "long; the communicator was aborted"));
}

void NcclComm::watchdog() {
  (void)cudaSetDevice(device_);
  std::unique_lock<std::mutex> lk(wd_mu_);
  while (!wd_stop_) {
    wd_cv_.wait_for(lk, kWatchdogPeriod);
    if (wd_stop_) break;
    lk.unlock();
    try {
      std::lock_guard<std::mutex> g(nccl_mu_);
      if (comm_ != nullptr) {
        if (aborted_.load()) {
          abort_locked(reason());
        } else {
          ncclResult_t state = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
          if (r != ncclSuccess) state = r;
          if (state != ncclSuccess && state != ncclInProgress) {
            const OpId op = !inflight_.empty() ? inflight_.front().op : last_op_;
            abort_locked(str_cat(describe(op), ": ", nccl_error_text(state, comm_), "; the communicator was aborted"));
          } else {
            reap_locked(true);
          }
        }
      }
    } catch (...) {
      // Out of memory for a message: try again next period.
    }
    lk.lock();
  }
}

void NcclComm::check_buffers(const char* op_name, const std::vector<Buf>& bufs, bool no_overlap) {
  const auto what = [&] { return str_cat(op_name, " of ", who_); };
  for (const Buf& b : bufs) {
    if (b.bytes == 0) continue;
    if (b.ptr == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what(), ": the ", b.role, " buffer is NULL (", b.bytes, " bytes)");
    // A pointer checked recently skips the driver query (about 0.5 us
    // each, against NCCL's few microseconds per small collective).
    if (std::find(checked_ptrs_.begin(), checked_ptrs_.end(), b.ptr) != checked_ptrs_.end()) continue;
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, b.ptr);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what(), ": cannot tell what memory the ", b.role, " buffer ", b.ptr,
                   " is (cudaPointerGetAttributes: ", cuda_error_text(e), "); pass device memory of GPU ", device_);
    }
    if (a.type == cudaMemoryTypeManaged) continue;
    if (a.type != cudaMemoryTypeDevice)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what(), ": the ", b.role, " buffer ", b.ptr, " is ",
                   a.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory",
                   ", but the nccl transport moves device buffers only: allocate it with cudaMalloc on GPU ",
                   device_, ", or use the tcp or libfabric transport for host memory");
    if (a.device != device_)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what(), ": the ", b.role, " buffer ", b.ptr, " is memory of GPU ",
                   a.device, ", but this communicator runs on GPU ", device_,
                   " (option 'device', else the current device at comm_create)");
    if (a.type == cudaMemoryTypeDevice) {
      checked_ptrs_[checked_next_] = b.ptr;
      checked_next_ = (checked_next_ + 1) % checked_ptrs_.size();
    }
  }
  if (no_overlap && bufs.size() == 2 && bufs[0].bytes > 0 && bufs[1].bytes > 0) {
    const char* a0 = static_cast<const char*>(bufs[0].ptr);
    const char* b0 = static_cast<const char*>(bufs[1].ptr);
    const bool same = a0 == b0 && bufs[0].bytes == bufs[1].bytes;
    if (!same && a0 < b0 + bufs[1].bytes && b0 < a0 + bufs[0].bytes)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what(),
                   ": the send and recv buffers overlap without being in place; pass separate buffers, or send == "
                   "recv (all_reduce, broadcast), send == recv + rank * count (all_gather) or recv == send + rank * "
                   "count (reduce_scatter)");
  }
}

template <class Enqueue>
void NcclComm::collective(const char* op_name, strata_collective_op op, uint32_t reduce_op, DLDataType dt,
                          uint64_t count, int32_t peer, void* user_stream, std::vector<Buf> bufs, bool no_overlap,
                          Enqueue&& enqueue) {
  throw_if_aborted();
  std::lock_guard<std::mutex> call(call_mu_);
  throw_if_aborted();
  check_buffers(op_name, bufs, no_overlap);
  const uint64_t seq = seq_++;
  const OpId what{op_name, seq};
  strata_collective_fingerprint fp{};
  STRATA_INIT_HEADER(&fp, strata_collective_fingerprint);
  fp.communicator = name_.c_str();
  fp.op = op;
  fp.reduce_op = reduce_op;
  fp.sequence = seq;
  fp.dtype = dt;
  fp.count = count;
  fp.rank = rank_;
  fp.peer = peer;
  host_.record_collective(fp);
  DeviceGuard guard(device_);
  cudaStream_t s = user_stream != nullptr ? static_cast<cudaStream_t>(user_stream) : stream_;
  const auto deadline = Clock::now() + timeout();
  {
    std::lock_guard<std::mutex> lk(nccl_mu_);
    if (comm_ == nullptr) STRATA_THROW(STRATA_ERR_ABORTED, reason());
    check_async_locked(what);  // an error of an earlier, stream-ordered collective
    finish_call_locked(enqueue(comm_, s), what, deadline);
    if (user_stream != nullptr) {
      if (opts_.watch_enqueued) track_locked(what, s, deadline);
      else last_op_ = what;
      return;
    }
    last_op_ = what;
  }
  wait_own_stream(what, deadline);
}

void NcclComm::wait_own_stream(const OpId& what, Clock::time_point deadline) {
  auto next_check = Clock::now() + kErrorCheckPeriod;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      (void)cudaGetLastError();
      std::lock_guard<std::mutex> lk(nccl_mu_);
      fail_locked(STRATA_ERR_INTERNAL, str_cat(describe(what), ": the communicator's CUDA stream failed (",
                                               cuda_error_text(q),
                                               "); the communicator was aborted"));
    }
    const auto now = Clock::now();
    if (aborted_.load() || now >= next_check) {
      std::lock_guard<std::mutex> lk(nccl_mu_);
      if (aborted_.load()) fail_locked(STRATA_ERR_ABORTED, reason());
      check_async_locked(what);
      if (now >= deadline)
        fail_locked(STRATA_ERR_DEADLINE_EXCEEDED,
                    str_cat(describe(what), " did not complete within ", opts_.timeout_s,
                            " s (option 'timeout_s' / /timeouts/collective_s); a rank did not call it or is stuck "
                            "(check every rank's log for the first error); the communicator was aborted"));
      next_check = now + kErrorCheckPeriod;
    }
    std::this_thread::yield();
  }
}

// ------------------------------------------------------------- transport ---

NcclTransport::NcclTransport(sdk::Host host, const char* options_json) : host_(std::move(host)) {
  const std::string comp = "transport 'nccl'";
  const auto o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o, {"device", "timeout_s", "setup_timeout_s", "watch_enqueued"}, comp);
  opts_.watch_enqueued = sdk::get_option<bool>(o, "watch_enqueued", true, comp);
  opts_.device = sdk::get_option<int>(o, "device", -1, comp);
  if (o.contains("device") && !o["device"].is_null() && opts_.device < 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'device' of ", comp, " must be a CUDA device ordinal >= 0, got ",
                 opts_.device, "; leave it out to use the calling thread's current device");
  opts_.timeout_s = sdk::collective_timeout_s(host_, o, comp);
  opts_.setup_timeout_s = sdk::rendezvous_timeout_s(host_, o, comp, "setup_timeout_s");
  // No CUDA call here: strata-info creates every transport to list its caps,
  // on machines without a GPU too.
}

strata_transport_caps NcclTransport::caps() {
  strata_transport_caps c{};
  c.flags = STRATA_TRANSPORT_CAP_NATIVE_COLLECTIVES | STRATA_TRANSPORT_CAP_MEM_CUDA | STRATA_TRANSPORT_CAP_THREAD_SAFE;
  c.max_inflight = 0;
  c.max_message_bytes = 0;
  c.preferred_chunk_bytes = 0;  // NCCL pipelines internally
  return c;
}

std::unique_ptr<sdk::CommBase> NcclTransport::comm_create(const char* name, int32_t rank, int32_t world_size,
                                                          int64_t timeout_ms) {
  sdk::check_comm_create_args(name, rank, world_size, "nccl transport comm_create");
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.setup_timeout_s * 1000.0);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  const std::string who = str_cat("nccl transport comm_create('", name, "') rank ", rank, " of ", world_size);
  // Fail at once without a GPU rather than make every peer wait for us.
  const int gpus = visible_gpu_count(who);
  int device = opts_.device;
  if (device >= gpus)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who, ": option 'device' is ", device, " but only ", gpus,
                 " GPU(s) are visible (", visible_devices_text(), "); pass 0..", gpus - 1);
  if (device < 0) {
    const cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who, ": cannot read the current CUDA device (",
                   cuda_error_text(e), "); pass option 'device'");
    }
  }
  std::string id;
  if (rank == 0) {
    ncclUniqueId uid;
    const ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, who, ": ncclGetUniqueId failed: ", nccl_error_text(r, nullptr),
                   "; NCCL needs a network interface for its bootstrap (NCCL_SOCKET_IFNAME picks one)");
    id.assign(reinterpret_cast<const char*>(&uid), sizeof uid);
  }
  id = exchange_unique_id(host_, name, rank, world_size, timeout_ms, id, sizeof(ncclUniqueId), who);
  auto comm = std::make_unique<NcclComm>(host_, opts_, name, rank, world_size, device);
  comm->setup(id, deadline, timeout_ms);
  return comm;
}

}  // namespace strata::transport::nccl

STRATA_PLUGIN("strata-transport-nccl", "0.1.0",
              STRATA_TRANSPORT_COMPONENT(strata::transport::nccl::NcclTransport, "nccl", "0.1.0"));
