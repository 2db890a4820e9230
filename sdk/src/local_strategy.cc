// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/local_strategy.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "strata/error.hpp"
#include "strata/sdk/device.hpp"
#include "strata/sdk/kernels.hpp"
#include "strata/sdk/local_cross_device_ops.hpp"
#include "strata/sdk/options.hpp"
#include "strata/sdk/tensor.hpp"
// Header-only load sampling and cpu_relax shared with the transports.
#include "../../transports/common/wait_pacer.h"

namespace strata::sdk {
namespace {

// Which strategy (if any) the current thread is running a replica of.
thread_local const void* tls_replica_owner = nullptr;

using transport::cpu_relax;

// Poll before sleeping. A thread of the strategy about to wait for another
// one (a replica at the rendezvous, a pool thread between runs, run()
// waiting for the replicas) first polls its condition for up to kPollUs: a
// sleep on a condition variable costs a futex wake and, when the other core
// was idle, an IPI to wake a virtual CPU, more than a small collective
// (measured on this 2-core VM: 4 KiB all-reduce of 2 replicas 6.3-7.3 us
// with sleeping, 1.5 us with polling; mirrored:4 dispatch 10.8-11.2 us,
// 2.4 us). With a thread per core at most it spins with a CPU pause between
// polls; with more replica threads than cores it yields (sched_yield)
// between polls, so that the thread it waits for gets the core (spinning
// there took the core from it: mirrored:4 dispatch 334 us against ~65 us
// without on a loaded machine). The yielding kind polls only while no other
// process wants the cores: runnable threads (/proc/loadavg) less this
// strategy's threads that are not asleep, the smallest of 3 samples 10 ms
// apart, must be 0 (yielding to two busy processes made mirrored:4 dispatch
// 3 ms per run instead of 20-48 us). The pausing kind polls under load too:
// it keeps the core its thread already has, for at most kPollUs (with two
// busy processes, mirrored:2 dispatch 0.6-3.4 us polling, 27-44 us not).
constexpr auto kPollUs = std::chrono::microseconds(100);
constexpr uint64_t kVariableMagic = 0x5354524154415641ull;

// Split all-reduce (LocalStrategyConfig::split_all_reduce): below this many
// bytes per replica one thread is quicker than waking the others.
constexpr size_t kSplitMinBytes = 128 << 10;
// Bytes per range: about 2 ranges per replica thread (so a thread that wakes
// late still gets work), at most what keeps every replica's slice of a range
// within a 768 KiB share of L2, at least 16 KiB (each range is one call).
size_t split_range_bytes(size_t total, uint32_t n) {
  const size_t cap = std::max<size_t>(16 << 10, ((768u << 10) / (n + 1)) & ~size_t{4095});
  const size_t want = ((total / (2 * size_t{n})) + 4095) & ~size_t{4095};
  return std::min(cap, std::max<size_t>(16 << 10, want));
}
// What the CrossDeviceOps would accept without an error, checked before the
// batch is cut (the cut views are 1-D and contiguous; anything else goes
// through one whole call, which reports the problem).
bool plain_host_tensor(const DLTensor* x) {
  if (x == nullptr || x->device.device_type != kDLCPU || !dtype_supported(x->dtype)) return false;
  if (x->ndim < 0 || (x->ndim > 0 && x->shape == nullptr)) return false;
  for (int32_t d = 0; d < x->ndim; ++d)
    if (x->shape[d] < 0) return false;
  return is_contiguous(*x) && (x->data != nullptr || element_count(*x) == 0);
}


enum class Kind { kAllReduce, kAllGather, kMergeCall, kVarUpdate };

const char* update_name(uint32_t op) {
  switch (op) {
    case STRATA_VAR_ASSIGN: return "assign";
    case STRATA_VAR_ASSIGN_ADD: return "assign_add";
    case STRATA_VAR_ASSIGN_SUB: return "assign_sub";
    default: return "update";
  }
}


}  // namespace

struct Variable {
  uint64_t magic = kVariableMagic;
  const void* owner = nullptr;
  std::string name;
  strata_var_sync sync = STRATA_VAR_SYNC_ON_WRITE;
  strata_var_aggregation agg = STRATA_VAR_AGG_NONE;
  bool trainable = false;
  DLDataType dtype{};
  std::vector<int64_t> shape;
  size_t count = 0;
  size_t bytes = 0;
  // Host memory of every copy. For a copy on a GPU (devices[c] kDLCUDA) the
  // value lives in device_data[c] and copies[c] is its host staging buffer
  // (valid only between download and upload).
  std::vector<AlignedBuffer> copies;
  std::vector<DLDevice> devices;
  std::vector<void*> device_data;
  Host host;

  Variable() = default;
  Variable(const Variable&) = delete;
  Variable& operator=(const Variable&) = delete;
  ~Variable() {
    for (size_t c = 0; c < device_data.size(); ++c) host.free_memory(devices[c], device_data[c]);
  }
  bool on_gpu(size_t c) const { return devices[c].device_type == kDLCUDA; }
  // GPU copy -> its host buffer (synchronous).
  void download(size_t c) {
    if (on_gpu(c)) host.copy(copies[c].data(), DLDevice{kDLCPU, 0}, device_data[c], devices[c], bytes);
  }
  // Host buffer -> GPU copy (synchronous).
  void upload(size_t c) {
    if (on_gpu(c)) host.copy(device_data[c], devices[c], copies[c].data(), DLDevice{kDLCPU, 0}, bytes);
  }

  // The copy where it lives (device memory for a GPU copy).
  DLTensor view(size_t copy) {
    DLTensor t = host_view(copy);
    if (on_gpu(copy)) {
      t.data = device_data[copy];
      t.device = devices[copy];
    }
    return t;
  }
  // The host buffer of a copy (for a GPU copy: what the last download left).
  DLTensor host_view(size_t copy) {
    DLTensor t{};
    t.data = copies[copy].data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.empty() ? nullptr : shape.data();
    return t;
  }
  std::string label() const { return "variable '" + name + "'"; }
  std::string type_string() const {
    std::string s = dtype_name(dtype) + "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

namespace {

struct Slot {
  Kind kind = Kind::kAllReduce;
  uint32_t op = 0;
  uint32_t num_tensors = 0;
  const DLTensor* const* inputs = nullptr;
  DLTensor* const* outputs = nullptr;
  const DLTensor* input = nullptr;
  int32_t axis = 0;
  DLManagedTensor** out = nullptr;
  strata_merge_fn fn = nullptr;
  void* merge_user = nullptr;
  void* arg = nullptr;
  Variable* var = nullptr;
};

std::string describe_slot(const Slot& s) {
  switch (s.kind) {
    case Kind::kAllReduce: {
      std::string d = std::string("all_reduce(") + reduce_op_name(s.op) + ", " +
                      std::to_string(s.num_tensors) + " tensor(s)";
      for (uint32_t t = 0; t < s.num_tensors && t < 4; ++t)
        d += (t ? ", " : ": ") + (s.inputs[t] ? tensor_string(*s.inputs[t]) : std::string("NULL"));
      if (s.num_tensors > 4) d += ", ...";
      return d + ")";
    }
    case Kind::kAllGather:
      return "all_gather(" + tensor_string(*s.input) + ", axis " + std::to_string(s.axis) + ")";
    case Kind::kMergeCall: return "merge_call";
    case Kind::kVarUpdate:
      return std::string(update_name(s.op)) + " of " + s.var->label() + " with " + tensor_string(*s.input);
  }
  return "collective";
}

// Whether two replicas' collectives are the same operation with compatible
// arguments.
bool same_collective(const Slot& a, const Slot& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kAllReduce:
      if (a.op != b.op || a.num_tensors != b.num_tensors) return false;
      for (uint32_t t = 0; t < a.num_tensors; ++t) {
        const DLTensor* x = a.inputs[t];
        const DLTensor* y = b.inputs[t];
        if (x == nullptr || y == nullptr) return false;
        if (!dtype_equal(x->dtype, y->dtype) || element_count(*x) != element_count(*y)) return false;
      }
      return true;
    case Kind::kAllGather: {
      if (a.axis != b.axis || !dtype_equal(a.input->dtype, b.input->dtype) || a.input->ndim != b.input->ndim)
        return false;
      const int32_t ax = a.axis < 0 ? a.axis + a.input->ndim : a.axis;
      for (int32_t d = 0; d < a.input->ndim; ++d)
        if (d != ax && a.input->shape[d] != b.input->shape[d]) return false;
      return true;
    }
    case Kind::kMergeCall: return true;
    case Kind::kVarUpdate: return a.var == b.var && a.op == b.op;
  }
  return false;
}

}  // namespace

struct ReplicaCtx {
  const void* impl;
  uint32_t id;
};

struct LocalStrategy::Impl {
  Host host;
  LocalStrategyConfig cfg;
  uint32_t n = 1;      // local replicas
  bool poll_pause = false;  // n <= usable cores: pause between polls (else yield), fixed at construction
  uint32_t W = 1;      // workers in the collective group
  uint32_t total = 1;  // replicas in sync: W * n
  std::chrono::nanoseconds timeout{};

  PluginRef<strata_cross_device_ops_vtable> cdo_ref;
  std::unique_ptr<LocalCrossDeviceOps> builtin_cdo;
  const strata_cross_device_ops_vtable* cdo_vt = nullptr;
  // The cross_device_ops takes device tensors only ("nccl") and a replica
  // is on a GPU: host tensors are staged (Staging).
  bool stage_host = false;
  strata_cross_device_ops_t cdo = nullptr;

  // Split all-reduce: one CrossDeviceOps per replica (cdos[0] == cdo).
  bool split = false;
  std::vector<PluginRef<strata_cross_device_ops_vtable>> extra_refs;
  std::vector<std::unique_ptr<LocalCrossDeviceOps>> extra_builtin;
  std::vector<strata_cross_device_ops_t> cdos;
  struct SplitGroup {
    size_t off, bytes, esize;
  };
  // Written by the last arrival before split_active is set (under rv_mu),
  // read by the replica threads after they see it.
  std::vector<SplitGroup> split_groups;
  size_t split_total = 0, split_range = 0;
  uint32_t split_ranges = 0;
  alignas(64) std::atomic<uint32_t> split_next{0};
  alignas(64) std::atomic<uint32_t> split_finished{0};
  // Written under rv_mu; an atomic so that a replica polling before it
  // sleeps (poll_round) can read it without the lock, as round and failed.
  std::atomic<bool> split_active{false};
  strata_status_t split_code = STRATA_OK;  // guarded by rv_mu
  std::string split_msg;               // guarded by rv_mu
  struct SplitScratch {                // one per replica thread
    std::vector<DLTensor> in, out;
    std::vector<const DLTensor*> in_p;
    std::vector<DLTensor*> out_p;
    std::vector<int64_t> lens;
    std::vector<uint32_t> group;
    std::vector<size_t> first;
  };
  std::vector<SplitScratch> split_scratch;

  std::vector<ReplicaCtx> ctxs;
  std::atomic<bool> running{false};

  // Devices (ABI 1.4). devs[r]: replica r's device; streams[r]: its CUDA
  // stream (NULL for a host replica), created with the strategy and
  // destroyed with it; param_dev: the kSingleCopy variables' device.
  std::vector<DLDevice> devs;
  std::vector<void*> streams;
  DLDevice param_dev{kDLCPU, 0};
  bool any_gpu = false;
  std::vector<std::string> device_errors;  // set_device failures of the worker threads

  // Worker pool.
  std::vector<std::thread> workers;
  std::mutex pool_mu;
  std::condition_variable pool_cv;
  alignas(64) std::atomic<uint64_t> gen{0};  // own cache line: the workers spin on it
  std::atomic<bool> stop{false};
  strata_replica_fn fn = nullptr;
  void* user = nullptr;
  alignas(64) std::atomic<uint32_t> remaining{0};  // own cache line: run() spins on it
  std::mutex done_mu;
  std::condition_variable done_cv;

  // Rendezvous (guarded by rv_mu).
  std::mutex rv_mu;
  std::condition_variable rv_cv;
  std::vector<Slot> slots;
  std::vector<char> arrived_flag;
  uint32_t arrived = 0;
  std::atomic<uint64_t> round{0};  // written under rv_mu; read without it by poll_round
  bool in_progress = false;
  strata_status_t round_status = STRATA_OK;
  std::string round_msg;
  std::atomic<bool> failed{false};  // written under rv_mu; read without it by poll_round
  strata_status_t fail_code = STRATA_OK;
  std::string fail_msg;

  // Used only by the thread performing a collective.
  std::vector<const DLTensor*> in_ptrs;
  std::vector<DLTensor*> out_ptrs;
  std::vector<void*> merge_args;
  std::vector<DLTensor> views;
  AlignedBuffer agg_buf;
  // Used only by cross-replica calls (serialised by the host).
  AlignedBuffer cross_buf;
  // GPU scratch for updates of a variable's GPU copy c (gpu_scratch[c]):
  // each buffer is used by the thread performing a collective, by
  // cross-replica calls, or by replica c's own thread (ON_READ updates),
  // never two at once; scratch_mu guards the vector itself.
  struct GpuScratch {
    DLDevice dev{kDLCPU, 0};
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::mutex scratch_mu;
  std::vector<GpuScratch> gpu_scratch;

  std::mutex vars_mu;
  std::unordered_set<Variable*> vars;

  ~Impl() {
    {
      std::lock_guard<std::mutex> l(pool_mu);
      stop.store(true, std::memory_order_release);
      gen.fetch_add(1, std::memory_order_acq_rel);
    }
    pool_cv.notify_all();
    for (auto& t : workers) t.join();
    for (Variable* v : vars) delete v;
    for (GpuScratch& g : gpu_scratch) host.free_memory(g.dev, g.ptr);
    for (void* st : streams) host.stream_destroy(st);
  }

  // `bytes` of scratch on `dev` for copy c (kept for the next update).
  void* scratch_for(size_t c, DLDevice dev, size_t bytes) {
    std::lock_guard<std::mutex> l(scratch_mu);
    if (gpu_scratch.size() <= c) gpu_scratch.resize(c + 1);
    GpuScratch& g = gpu_scratch[c];
    if (g.ptr != nullptr && g.dev.device_type == dev.device_type && g.dev.device_id == dev.device_id &&
        g.bytes >= bytes)
      return g.ptr;
    host.free_memory(g.dev, g.ptr);
    g = GpuScratch{};
    g.ptr = host.allocate(dev, bytes, 256);
    if (g.ptr == nullptr)
      STRATA_THROW(STRATA_ERR_INTERNAL, cfg.strategy_name, ": cannot allocate ", bytes,
                   " bytes of scratch on ", device_string(dev),
                   " for a variable update (out of device memory? the host's log has the CUDA error)");
    g.dev = dev;
    g.bytes = bytes;
    return g.ptr;
  }

  // ---------------------------------------------------------- devices ---
  bool gpu_replica(uint32_t id) const { return id < devs.size() && devs[id].device_type == kDLCUDA; }
  // Wait for the work enqueued on replica id's stream (user kernels,
  // copies) so that host code and other streams may read its tensors.
  void sync_stream(uint32_t id) {
    if (gpu_replica(id) && streams[id] != nullptr)
      host.stream_synchronize(streams[id], static_cast<int64_t>(cfg.timeout_s * 1000));
  }
  void sync_all_streams() {
    if (!any_gpu) return;
    for (uint32_t r = 0; r < n; ++r) sync_stream(r);
  }
  DLDevice copy_device(const Variable& v, size_t c) const { return v.copies.size() == 1 ? param_dev : devs[c]; }
  // `value`'s elements in host memory: the tensor itself, or a copy in `buf`.
  const void* host_data(const DLTensor& value, size_t bytes, AlignedBuffer& buf) {
    if (!on_cuda(value)) return data_ptr(value);
    buf.reserve(bytes);
    host.copy(buf.data(), DLDevice{kDLCPU, 0}, data_ptr(value), value.device, bytes);
    return buf.data();
  }
  // Apply `op` with host `src` to every copy of `v` (staging GPU copies).
  void apply_all(Variable& v, strata_var_update_op op, const void* src) {
    for (size_t c = 0; c < v.copies.size(); ++c) apply_one(v, c, op, src);
  }
  void apply_one(Variable& v, size_t c, strata_var_update_op op, const void* src) {
    if (v.on_gpu(c) && host.has_device_update()) {
      // The value goes up once and the GPU applies it (no download, no
      // pass on the host).
      if (op == STRATA_VAR_ASSIGN) {
        host.copy(v.device_data[c], v.devices[c], src, DLDevice{kDLCPU, 0}, v.bytes);
        return;
      }
      void* up = scratch_for(c, v.devices[c], v.bytes);
      host.copy(up, v.devices[c], src, DLDevice{kDLCPU, 0}, v.bytes);
      host.device_update(op, v.dtype, v.device_data[c], up, v.count, v.devices[c]);
      return;
    }
    if (op != STRATA_VAR_ASSIGN) v.download(c);
    kernels::apply_update(op, v.dtype, v.copies[c].data(), src, v.count);
    v.upload(c);
  }


  // ------------------------------------------------------------- pool ---
  void worker_loop(uint32_t id) {
    // A GPU replica's thread makes its device current once, for its life.
    if (gpu_replica(id)) {
      try {
        host.set_device(devs[id]);
      } catch (const std::exception& e) {
        device_errors[id] = e.what();
      }
    }
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = seen;
      if (!poll([&] { return (g = gen.load(std::memory_order_acquire)) != seen; })) {
        std::unique_lock<std::mutex> l(pool_mu);
        Asleep z(*this);
        pool_cv.wait(l, [&] { return gen.load(std::memory_order_acquire) != seen; });
        g = gen.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop.load(std::memory_order_acquire)) return;
      execute(id);
      if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> l(done_mu);
        done_cv.notify_one();
      }
    }
  }

  void execute(uint32_t id) {
    const void* prev = tls_replica_owner;
    tls_replica_owner = this;
    strata_error err;
    strata_error_init(&err);
    strata_status_t st;
    try {
      if (!device_errors[id].empty())
        STRATA_THROW(STRATA_ERR_INTERNAL, "replica ", id, " could not make ", device_string(devs[id]),
                     " current: ", device_errors[id]);
      st = fn(user, reinterpret_cast<strata_replica_t>(&ctxs[id]), id, &err);
      // What the replica enqueued on its stream is done when run returns.
      if (st == STRATA_OK) sync_stream(id);
    } catch (const Error& e) {
      st = e.code() < 0 ? e.code() : STRATA_ERR_INTERNAL;
      std::snprintf(err.message, sizeof err.message, "%s", e.what());
    } catch (...) {
      st = STRATA_ERR_INTERNAL;
      std::snprintf(err.message, sizeof err.message, "replica function threw a C++ exception");
    }
    tls_replica_owner = prev;
    if (st != STRATA_OK) {
      std::lock_guard<std::mutex> l(rv_mu);
      fail_locked(st < 0 ? st : STRATA_ERR_INTERNAL,
                  "replica " + std::to_string(id) + " failed: " +
                      (err.message[0] ? std::string(err.message) : std::string(strata_status_string(st))));
    }
  }

  void fail_locked(strata_status_t code, const std::string& msg) {
    if (!failed) {
      failed = true;
      fail_code = code;
      fail_msg = msg;
    }
    rv_cv.notify_all();
  }

  // ------------------------------------------------------ rendezvous ---
  const ReplicaCtx& check_replica(strata_replica_t r) const {
    const ReplicaCtx* c = reinterpret_cast<const ReplicaCtx*>(r);
    if (c == nullptr || c < ctxs.data() || c >= ctxs.data() + ctxs.size())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, cfg.strategy_name,
                   ": replica handle does not belong to this strategy; pass the strata_replica_t "
                   "given to the replica function");
    if (!running.load(std::memory_order_acquire))
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, cfg.strategy_name,
                   ": replica handle used outside run(); replica handles are valid only inside "
                   "the replica function");
    return *c;
  }

  void arrive(uint32_t id, const Slot& slot) {
    // The collective reads this replica's tensors from other threads and
    // streams: finish what the replica enqueued on its own stream first.
    sync_stream(id);
    std::unique_lock<std::mutex> l(rv_mu);
    if (failed)
      STRATA_THROW(STRATA_ERR_ABORTED, describe_slot(slot), " on replica ", id,
                   " aborted because the run already failed: ", fail_msg);
    slots[id] = slot;
    arrived_flag[id] = 1;
    ++arrived;
    const uint64_t my_round = round;
    if (arrived < n) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      bool worked = false, polled = false;
      while (round == my_round && !failed) {
        if (!polled) {  // before the first sleep, and again after taking ranges
          polled = true;
          l.unlock();
          poll_round(my_round, worked);
          l.lock();
          continue;
        }
        if (in_progress) {  // everybody arrived; the performer is bounded by the CDO
          if (split_active && !worked) {  // take ranges of the split all-reduce
            worked = true;
            polled = false;
            l.unlock();
            split_work(id);
            l.lock();
            continue;
          }
          Asleep z(*this);
          rv_cv.wait(l);
          continue;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
          std::string missing;
          for (uint32_t r = 0; r < n; ++r)
            if (!arrived_flag[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          const std::string msg = ::strata::detail::str_cat(
              cfg.strategy_name, ": ", describe_slot(slot), " (collective #", my_round,
              " of this run) on replica ", id, " timed out after ", cfg.timeout_s,
              " s: replica(s) [", missing,
              "] never arrived; every replica must call the same collectives in the same order "
              "(raise timeout_s if they are just slow)");
          fail_locked(STRATA_ERR_DEADLINE_EXCEEDED, msg);
          throw DeadlineExceededError(msg);
        }
        // Wake at least every 100 ms to notice a job-wide abort request.
        {
          Asleep z(*this);
          rv_cv.wait_until(l, std::min(deadline, now + std::chrono::milliseconds(100)));
        }
        if (round == my_round && !failed && host.abort_requested()) {
          const std::string msg = ::strata::detail::str_cat(cfg.strategy_name, ": ", describe_slot(slot),
                                                  " on replica ", id, " aborted: the job was asked to stop");
          fail_locked(STRATA_ERR_ABORTED, msg);
          throw AbortedError(msg);
        }
      }
      if (round != my_round) {
        if (round_status != STRATA_OK) ::strata::detail::throw_status(round_status, round_msg);
        return;
      }
      STRATA_THROW(STRATA_ERR_ABORTED, describe_slot(slot), " on replica ", id,
                   " aborted because the run failed: ", fail_msg);
    }
    // Last to arrive: perform for everybody, outside the lock so that other
    // threads (and cross-replica calls from a merge function) are not blocked.
    in_progress = true;
    l.unlock();
    bool split_started = false;
    try {
      split_started = start_split();
    } catch (const std::exception&) {
      split_started = false;  // perform reports the problem
    }
    if (split_started) {
      split_work(id);
      poll_round(my_round, true);
      l.lock();
      // The thread that finishes the last range ends the round; the other
      // replicas' ranges are bounded in-process work.
      while (round == my_round) {
        Asleep z(*this);
        rv_cv.wait(l);
      }
      if (round_status != STRATA_OK) ::strata::detail::throw_status(round_status, round_msg);
      return;
    }
    strata_status_t st = STRATA_OK;
    std::string msg;
    try {
      perform(my_round);
    } catch (const Error& e) {
      st = e.code() < 0 ? e.code() : STRATA_ERR_INTERNAL;
      msg = e.what();
    } catch (const std::bad_alloc&) {
      st = STRATA_ERR_INTERNAL;
      msg = "out of memory while performing a collective";
    } catch (const std::exception& e) {
      st = STRATA_ERR_INTERNAL;
      msg = std::string("internal error while performing a collective: ") + e.what();
    }
    l.lock();
    in_progress = false;
    arrived = 0;
    std::fill(arrived_flag.begin(), arrived_flag.end(), 0);
    round_status = st;
    round_msg = msg;
    ++round;
    if (st != STRATA_OK) fail_locked(st, msg);
    rv_cv.notify_all();
    if (st != STRATA_OK) ::strata::detail::throw_status(st, msg);
  }

  // ------------------------------------------ poll before sleeping ---
  // (see kPollUs) Threads of this strategy not asleep on a condition
  // variable: the caller's thread and the pool's, less those in Asleep.
  alignas(64) std::atomic<int> awake{0};
  transport::ThrottledSample outsiders{/*first_fills=*/true};  // runnable threads not ours
  struct Asleep {
    explicit Asleep(Impl& m) : m(m) { m.awake.fetch_sub(1, std::memory_order_relaxed); }
    ~Asleep() { m.awake.fetch_add(1, std::memory_order_relaxed); }
    Impl& m;
  };
  // Poll `done` for up to kPollUs while no other process wants the cores;
  // true as soon as it holds.
  template <class Done>
  bool poll(Done&& done) {
    if (done()) return true;
    if (!poll_pause && outsiders.get([&] {
          return std::max(0, transport::loadavg_running() - awake.load(std::memory_order_relaxed));
        }) > 0)
      return false;
    const auto until = std::chrono::steady_clock::now() + kPollUs;
    for (uint32_t i = 1;; ++i) {
      if (poll_pause) {
        cpu_relax();
        cpu_relax();
      } else {
        sched_yield();
      }
      if (done()) return true;
      if ((i & 15) == 0 && std::chrono::steady_clock::now() >= until) return false;
    }
  }
  // At the rendezvous: until the round ended, the run failed, or a split
  // all-reduce has ranges for a thread that has not taken any yet.
  void poll_round(uint64_t my_round, bool worked) {
    poll([&] {
      return round.load(std::memory_order_acquire) != my_round || failed.load(std::memory_order_acquire) ||
             (!worked && split_active.load(std::memory_order_acquire));
    });
  }

  // ------------------------------------------------ split all-reduce ---
  // Last arrival, outside rv_mu: validate (as perform does) and, for a large
  // enough all-reduce of plain host tensors, cut it into ranges and let the
  // replica threads take them. False: perform it as one call.
  bool start_split() {
    const Slot& s0 = slots[0];
    if (!split || s0.kind != Kind::kAllReduce || s0.num_tensors == 0) return false;
    for (uint32_t r = 1; r < n; ++r)
      if (!same_collective(s0, slots[r])) return false;  // perform names the mismatch
    size_t total = 0;
    split_groups.clear();
    for (uint32_t t = 0; t < s0.num_tensors; ++t) {
      const DLTensor* first = s0.inputs[t];
      for (uint32_t r = 0; r < n; ++r) {
        const DLTensor* in = slots[r].inputs[t];
        const DLTensor* out = slots[r].outputs[t];
        if (!plain_host_tensor(in) || !plain_host_tensor(out) || !dtype_equal(out->dtype, first->dtype) ||
            element_count(*out) != element_count(*first))
          return false;  // the CrossDeviceOps reports it
      }
      const size_t esize = dtype_size(first->dtype);
      const size_t bytes = static_cast<size_t>(element_count(*first)) * esize;
      split_groups.push_back(SplitGroup{total, bytes, esize});
      total += bytes;
    }
    if (total < kSplitMinBytes) return false;
    split_total = total;
    split_range = split_range_bytes(total, n);
    split_ranges = static_cast<uint32_t>((total + split_range - 1) / split_range);
    split_next.store(0, std::memory_order_relaxed);
    split_finished.store(0, std::memory_order_relaxed);
    std::lock_guard<std::mutex> l(rv_mu);
    split_code = STRATA_OK;
    split_msg.clear();
    split_active = true;
    rv_cv.notify_all();
    return true;
  }

  // Take ranges until none is left; the thread finishing the last one ends
  // the round. Never throws (every failure goes into split_code).
  void split_work(uint32_t id) {
    strata_error err;
    for (;;) {
      const uint32_t k = split_next.fetch_add(1, std::memory_order_relaxed);
      if (k >= split_ranges) return;
      strata_status_t st = STRATA_OK;
      std::string msg;
      try {
        reduce_range(id, k, err);
      } catch (const Error& e) {
        st = e.code() < 0 ? e.code() : STRATA_ERR_INTERNAL;
        msg = e.what();
      } catch (const std::exception& e) {
        st = STRATA_ERR_INTERNAL;
        msg = std::string("internal error while performing a collective: ") + e.what();
      }
      if (st != STRATA_OK) {
        std::lock_guard<std::mutex> l(rv_mu);
        if (split_code == STRATA_OK) {
          split_code = st;
          split_msg = msg;
        }
      }
      if (split_finished.fetch_add(1, std::memory_order_acq_rel) + 1 == split_ranges) {
        std::lock_guard<std::mutex> l(rv_mu);
        split_active = false;
        in_progress = false;
        arrived = 0;
        std::fill(arrived_flag.begin(), arrived_flag.end(), 0);
        round_status = split_code;
        round_msg = split_msg;
        ++round;
        if (split_code != STRATA_OK) fail_locked(split_code, split_msg);
        rv_cv.notify_all();
        return;
      }
    }
  }

  // All-reduce bytes [k * split_range, (k + 1) * split_range) of the batch
  // (its groups back to back) through replica id's own CrossDeviceOps. A cut
  // inside a group falls on the element boundary at or after it, so
  // neighbouring ranges agree and every element is reduced exactly once.
  void reduce_range(uint32_t id, uint32_t k, strata_error& err) {
    const Slot& s0 = slots[0];
    const size_t lo = static_cast<size_t>(k) * split_range;
    const size_t hi = std::min(split_total, lo + split_range);
    SplitScratch& sc = split_scratch[id];
    sc.group.clear();
    sc.first.clear();
    sc.lens.clear();
    auto it = std::partition_point(split_groups.begin(), split_groups.end(),
                                   [&](const SplitGroup& g) { return g.off + g.bytes <= lo; });
    for (; it != split_groups.end() && it->off < hi; ++it) {
      const size_t a = std::max(lo, it->off) - it->off, b = std::min(hi, it->off + it->bytes) - it->off;
      const size_t e_lo = (a + it->esize - 1) / it->esize, e_hi = (b + it->esize - 1) / it->esize;
      if (e_hi <= e_lo) continue;
      sc.group.push_back(static_cast<uint32_t>(it - split_groups.begin()));
      sc.first.push_back(e_lo);
      sc.lens.push_back(static_cast<int64_t>(e_hi - e_lo));
    }
    const uint32_t pieces = static_cast<uint32_t>(sc.group.size());
    if (pieces == 0) return;
    sc.in.resize(static_cast<size_t>(pieces) * n);
    sc.out.resize(static_cast<size_t>(pieces) * n);
    sc.in_p.resize(sc.in.size());
    sc.out_p.resize(sc.out.size());
    for (uint32_t p = 0; p < pieces; ++p) {
      const uint32_t t = sc.group[p];
      const size_t skip = sc.first[p] * split_groups[t].esize;
      for (uint32_t r = 0; r < n; ++r) {
        auto view = [&](const DLTensor& x) {
          DLTensor v{};
          v.data = x.data;
          v.byte_offset = x.byte_offset + skip;
          v.device = x.device;
          v.ndim = 1;
          v.dtype = x.dtype;
          v.shape = &sc.lens[p];
          return v;
        };
        sc.in[p * n + r] = view(*slots[r].inputs[t]);
        sc.out[p * n + r] = view(*slots[r].outputs[t]);
        sc.in_p[p * n + r] = &sc.in[p * n + r];
        sc.out_p[p * n + r] = &sc.out[p * n + r];
      }
    }
    strata_error_init(&err);
    check_cdo(cdo_vt->all_reduce(cdos[id], s0.op, pieces, n, sc.in_p.data(), sc.out_p.data(), &err), err,
              "all_reduce");
  }

  // --- calls into the strategy's cross_device_ops (cdo) -----------------
  // A cross_device_ops that takes device tensors only (nccl, stage_host)
  // gets the host tensors of GPU replicas (a tensor made on the host inside
  // a replica function, the strategy's own exchanges of sizes and counts,
  // host copies of variables) staged on the replica's GPU: inputs copied up
  // before the call, outputs copied back after it. A tensor's replica is
  // its index modulo the replica count, as the ABI lays them out.
  class Staging {
   public:
    explicit Staging(Impl& m) : m_(m) {}
    const DLTensor* in(const DLTensor* t, size_t index) {
      DLTensor* d = stage(t, index);
      if (d == nullptr) return t;
      m_.host.copy(d->data, d->device, data_ptr(*t), t->device, byte_size(*t));
      return d;
    }
    DLTensor* out(DLTensor* t, size_t index) {
      DLTensor* d = stage(t, index);
      if (d != nullptr) back_.emplace_back(t, d);
      return d != nullptr ? d : t;
    }
    void finish() {
      for (const auto& [h, d] : back_) m_.host.copy(data_ptr(*h), h->device, d->data, d->device, byte_size(*h));
    }

   private:
    DLTensor* stage(const DLTensor* t, size_t index) {
      if (!m_.stage_host || t == nullptr || t->device.device_type != kDLCPU) return nullptr;
      const DLDevice dev = m_.devs[index % m_.n];
      if (dev.device_type != kDLCUDA) return nullptr;
      keep_.push_back(make_device_tensor(m_.host, t->dtype, std::vector<int64_t>(t->shape, t->shape + t->ndim), dev));
      return &keep_.back()->dl_tensor;
    }
    Impl& m_;
    std::vector<ManagedTensorPtr> keep_;
    std::vector<std::pair<DLTensor*, DLTensor*>> back_;
  };

  // One cross_device_ops call with its host tensors staged (stage_host):
  // input k belongs to replica k % nv; output k to replica k % nv, or to
  // replica 0 when `outs_on_first` (reduce's destinations). `call(in, out,
  // err)` makes the vtable call on the arrays it is given.
  template <class Call>
  void cdo_call(uint32_t nv, size_t nin, const DLTensor* const* in, size_t nout, DLTensor* const* out,
                bool outs_on_first, const char* what, Call&& call) {
    strata_error err;
    strata_error_init(&err);
    if (!stage_host) return check_cdo(call(in, out, &err), err, what);
    Staging st(*this);
    std::vector<const DLTensor*> i2(in, in + nin);
    std::vector<DLTensor*> o2(out, out + nout);
    for (size_t k = 0; k < nin; ++k) i2[k] = st.in(i2[k], k % nv);
    for (size_t k = 0; k < nout; ++k) o2[k] = st.out(o2[k], outs_on_first ? 0 : k % nv);
    check_cdo(call(i2.data(), o2.data(), &err), err, what);
    st.finish();
  }
  void cdo_all_reduce(uint32_t op, uint32_t nt, uint32_t nv, const DLTensor* const* in, DLTensor* const* out,
                      const char* what) {
    const size_t n = size_t(nt) * nv;
    cdo_call(nv, n, in, n, out, false, what, [&](const DLTensor* const* i, DLTensor* const* o, strata_error* e) {
      return cdo_vt->all_reduce(cdo, op, nt, nv, i, o, e);
    });
  }
  void cdo_reduce(uint32_t op, uint32_t nt, uint32_t nv, const DLTensor* const* in, DLTensor* const* out,
                  const char* what) {
    cdo_call(nv, size_t(nt) * nv, in, nt, out, true, what,
             [&](const DLTensor* const* i, DLTensor* const* o, strata_error* e) {
               return cdo_vt->reduce(cdo, op, nt, nv, i, o, e);
             });
  }
  void cdo_all_gather(uint32_t nv, const DLTensor* const* in, int32_t axis, DLTensor* const* out, const char* what) {
    cdo_call(nv, nv, in, nv, out, false, what, [&](const DLTensor* const* i, DLTensor* const* o, strata_error* e) {
      return cdo_vt->all_gather(cdo, nv, i, axis, o, e);
    });
  }
  // The source stays where it is (a broadcast source may be on the host);
  // destination k belongs to replica k.
  void cdo_broadcast(const DLTensor* src, uint32_t nd, DLTensor* const* dsts, const char* what) {
    cdo_call(std::max<uint32_t>(n, 1), 0, nullptr, nd, dsts, false, what,
             [&](const DLTensor* const*, DLTensor* const* o, strata_error* e) {
               return cdo_vt->broadcast(cdo, src, nd, o, e);
             });
  }

  void check_cdo(strata_status_t st, const strata_error& err, const char* what) {
    if (st != STRATA_OK)
      ::strata::detail::throw_status(st, ::strata::detail::str_cat(cfg.strategy_name, ": cross_device_ops ", what, " failed: ",
                                               err.message[0] ? err.message : strata_status_string(st)));
  }

  void perform(uint64_t round_no) {
    for (uint32_t r = 1; r < n; ++r) {
      if (!same_collective(slots[0], slots[r]))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, cfg.strategy_name, ": mismatched collectives (#", round_no,
                     " of this run): replica 0 called ", describe_slot(slots[0]), " but replica ", r,
                     " called ", describe_slot(slots[r]),
                     "; every replica must issue the same collectives in the same order with the same "
                     "dtypes and element counts");
    }
    strata_error err;
    strata_error_init(&err);
    const Slot& s0 = slots[0];
    switch (s0.kind) {
      case Kind::kAllReduce: {
        const uint32_t nt = s0.num_tensors;
        in_ptrs.resize(static_cast<size_t>(nt) * n);
        out_ptrs.resize(static_cast<size_t>(nt) * n);
        for (uint32_t t = 0; t < nt; ++t)
          for (uint32_t r = 0; r < n; ++r) {
            in_ptrs[t * n + r] = slots[r].inputs[t];
            out_ptrs[t * n + r] = slots[r].outputs[t];
          }
        if (nt == 0) return;
        cdo_all_reduce(s0.op, nt, n, in_ptrs.data(), out_ptrs.data(), "all_reduce");
        return;
      }
      case Kind::kAllGather: {
        in_ptrs.resize(n);
        for (uint32_t r = 0; r < n; ++r) in_ptrs[r] = slots[r].input;
        std::vector<ManagedTensorPtr> results = gather_all(in_ptrs.data(), s0.axis, n, /*on_devices=*/true);
        for (uint32_t r = 0; r < n; ++r) *slots[r].out = results[r].release();
        return;
      }
      case Kind::kMergeCall: {
        merge_args.resize(n);
        for (uint32_t r = 0; r < n; ++r) merge_args[r] = slots[r].arg;
        const strata_status_t st = s0.fn(s0.merge_user, merge_args.data(), n, &err);
        if (st != STRATA_OK)
          ::strata::detail::throw_status(st < 0 ? st : STRATA_ERR_INTERNAL,
                               ::strata::detail::str_cat("merge_call function failed: ",
                                               err.message[0] ? err.message : strata_status_string(st)));
        return;
      }
      case Kind::kVarUpdate: {
        Variable& v = *s0.var;
        const void* value = data_ptr(*s0.input);  // host memory unless staged below
        if (v.agg == STRATA_VAR_AGG_SUM && n > 1 && v.bytes > 0) {
          // Every local replica passing the very same tensor is C++'s form of
          // a value that is not per-replica, which TF's SUM refuses
          // (reduce_non_distributed_value) instead of multiplying it.
          bool same = true;
          for (uint32_t r = 1; r < n && same; ++r) same = data_ptr(*slots[r].input) == value;
          if (same)
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, update_name(s0.op),
                         " of ON_WRITE ", v.label(),
                         " in replica context: every replica passed the same tensor, which is not a "
                         "per-replica value and cannot be reduced with SUM (tf.distribute refuses it too); "
                         "compute the value inside each replica, or update in cross-replica context");
        }
        if (update_on_gpus(v, static_cast<strata_var_update_op>(s0.op))) return;
        if (v.agg == STRATA_VAR_AGG_SUM || v.agg == STRATA_VAR_AGG_MEAN) {
          agg_buf.reserve(v.bytes);
          in_ptrs.resize(n);
          for (uint32_t r = 0; r < n; ++r) in_ptrs[r] = slots[r].input;
          DLTensor out{};
          out.data = agg_buf.data();
          out.device = DLDevice{kDLCPU, 0};
          out.ndim = static_cast<int32_t>(v.shape.size());
          out.dtype = v.dtype;
          out.shape = v.shape.empty() ? nullptr : v.shape.data();
          DLTensor* outs[1] = {&out};
          const uint32_t op = v.agg == STRATA_VAR_AGG_SUM ? STRATA_REDUCE_SUM : STRATA_REDUCE_MEAN;
          cdo_reduce(op, 1, n, in_ptrs.data(), outs, "reduce");
          value = agg_buf.data();
        } else if (on_cuda(*s0.input)) {
          value = host_data(*s0.input, v.bytes, agg_buf);
        }
        apply_all(v, static_cast<strata_var_update_op>(s0.op), value);
        return;
      }
    }
  }

  // A replica-context update whose copies and values all live on the
  // replicas' GPUs, done there: the values are all-reduced into GPU scratch
  // on each replica's device (SUM/MEAN) and each copy updated by the host's
  // device_update, so nothing crosses to host memory. False (nothing done)
  // when a copy or a value is elsewhere, a reduction spans workers, or the
  // host predates ABI 1.5: the caller then stages through host memory.
  bool update_on_gpus(Variable& v, strata_var_update_op op) {
    if (!host.has_device_update() || v.copies.size() != n || v.bytes == 0) return false;
    for (uint32_t r = 0; r < n; ++r) {
      const DLTensor& in = *slots[r].input;
      if (!v.on_gpu(r) || !on_cuda(in) || in.device.device_id != v.devices[r].device_id || !is_contiguous(in))
        return false;
    }
    const bool reduce = v.agg == STRATA_VAR_AGG_SUM || v.agg == STRATA_VAR_AGG_MEAN;
    // Across workers the collective must be the one every worker calls,
    // and another worker may hold its copies on the host: keep the reduce
    // of the staged path there.
    if (reduce && W > 1) return false;
    std::vector<const void*> src(n);
    if (reduce) {
      std::vector<DLTensor> outs(n);
      out_ptrs.resize(n);
      in_ptrs.resize(n);
      for (uint32_t r = 0; r < n; ++r) {
        outs[r] = *slots[r].input;
        outs[r].data = scratch_for(r, v.devices[r], v.bytes);
        outs[r].strides = nullptr;
        outs[r].byte_offset = 0;
        out_ptrs[r] = &outs[r];
        in_ptrs[r] = slots[r].input;
        src[r] = outs[r].data;
      }
      const uint32_t rop = v.agg == STRATA_VAR_AGG_SUM ? STRATA_REDUCE_SUM : STRATA_REDUCE_MEAN;
      cdo_all_reduce(rop, 1, n, in_ptrs.data(), out_ptrs.data(), "all_reduce (variable update)");
    } else {
      // ONLY_FIRST_REPLICA (or NONE with one replica in sync): the first
      // replica's value, copied to each other replica's GPU when it differs.
      const DLTensor& first = *slots[0].input;
      for (uint32_t r = 0; r < n; ++r) {
        if (first.device.device_id == v.devices[r].device_id) {
          src[r] = data_ptr(first);
        } else {
          void* dst = scratch_for(r, v.devices[r], v.bytes);
          host.copy(dst, v.devices[r], data_ptr(first), first.device, v.bytes);
          src[r] = dst;
        }
      }
    }
    for (uint32_t r = 0; r < n; ++r)
      host.device_update(op, v.dtype, v.device_data[r], src[r], v.count, v.devices[r]);
    return true;
  }

  // ------------------------------------------------------ multi-worker ---
  // Shape of the concatenation of every replica's value (all workers) along
  // `axis`. With several workers the sizes along the axis are exchanged
  // first (a collective of its own), because the CrossDeviceOps writes into
  // caller-allocated outputs.
  std::vector<int64_t> global_concat_shape(const DLTensor* const* values, int32_t axis) {
    std::vector<int64_t> shape = concat_shape(values, n, axis);
    if (W == 1) return shape;
    const int32_t ax = axis < 0 ? axis + values[0]->ndim : axis;
    // Per replica: {size along axis, elements outside the axis}, so that a
    // worker whose other dims differ is named instead of corrupting data.
    std::vector<int64_t> mine(static_cast<size_t>(n) * 2);
    for (uint32_t r = 0; r < n; ++r) {
      mine[2 * r] = values[r]->shape[ax];
      int64_t rest = 1;
      for (int32_t d = 0; d < values[r]->ndim; ++d)
        if (d != ax) rest *= values[r]->shape[d];
      mine[2 * r + 1] = rest;
    }
    std::vector<int64_t> in_shape{1, 2};
    std::vector<int64_t> out_shape{static_cast<int64_t>(total), 2};
    std::vector<DLTensor> ins(n);
    std::vector<const DLTensor*> in_p(n);
    std::vector<int64_t> all(static_cast<size_t>(total) * 2 * n);
    std::vector<DLTensor> outs(n);
    std::vector<DLTensor*> out_p(n);
    for (uint32_t r = 0; r < n; ++r) {
      ins[r] = DLTensor{};
      ins[r].data = &mine[2 * r];
      ins[r].device = DLDevice{kDLCPU, 0};
      ins[r].ndim = 2;
      ins[r].dtype = DLDataType{kDLInt, 64, 1};
      ins[r].shape = in_shape.data();
      in_p[r] = &ins[r];
      outs[r] = ins[r];
      outs[r].data = &all[static_cast<size_t>(r) * total * 2];
      outs[r].shape = out_shape.data();
      out_p[r] = &outs[r];
    }
    strata_error err;
    strata_error_init(&err);
    cdo_all_gather(n, in_p.data(), 0, out_p.data(), "all_gather (exchange of gather sizes)");
    shape[ax] = 0;
    for (uint32_t g = 0; g < total; ++g) {
      if (all[2 * g + 1] != mine[1])
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, cfg.strategy_name, ": gather along axis ", ax,
                     ": replica ", g, " (worker ", g / n, ") has ", all[2 * g + 1],
                     " elements outside the axis but replica ", cfg.worker_index * n, " has ", mine[1],
                     "; only the size along the gather axis may differ between replicas");
      shape[ax] += all[2 * g];
    }
    return shape;
  }

  // Every worker must have the same number of local replicas: replica ids
  // (worker * n + local id), the input's split and every all-gather assume
  // it, and with 2 + 1 devices workers would read overlapping rows. As in
  // tf.distribute (which refuses such a cluster), each worker learns every
  // worker's count with one all-reduce, whose size (one slot per worker)
  // does not depend on the counts, and all of them fail alike.
  void check_same_devices_everywhere() {
    if (W == 1) return;
    std::vector<int64_t> mine(static_cast<size_t>(W) * n, 0);  // replica r's row: W slots
    std::vector<int64_t> counts(static_cast<size_t>(W) * n, 0);
    mine[cfg.worker_index] = n;                                  // only replica 0 contributes
    const std::vector<int64_t> shape{static_cast<int64_t>(W)};
    std::vector<DLTensor> ins(n), outs(n);
    std::vector<const DLTensor*> in_p(n);
    std::vector<DLTensor*> out_p(n);
    for (uint32_t r = 0; r < n; ++r) {
      ins[r] = DLTensor{};
      ins[r].data = &mine[static_cast<size_t>(r) * W];
      ins[r].device = DLDevice{kDLCPU, 0};
      ins[r].ndim = 1;
      ins[r].dtype = DLDataType{kDLInt, 64, 1};
      ins[r].shape = const_cast<int64_t*>(shape.data());
      outs[r] = ins[r];
      outs[r].data = &counts[static_cast<size_t>(r) * W];
      in_p[r] = &ins[r];
      out_p[r] = &outs[r];
    }
    strata_error err;
    strata_error_init(&err);
    cdo_all_reduce(STRATA_REDUCE_SUM, 1, n, in_p.data(), out_p.data(), "all_reduce (exchange of local device counts)");
    bool same = true;
    for (uint32_t w = 0; w < W; ++w) same = same && counts[w] == counts[0];
    if (same) return;
    std::string list;
    for (uint32_t w = 0; w < W; ++w)
      list += (w ? ", " : "") + std::string("worker ") + std::to_string(w) + ": " + std::to_string(counts[w]);
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, cfg.strategy_name,
                 ": workers have different numbers of local devices (", list,
                 "); every worker needs the same number, as in tf.distribute, or replicas would share "
                 "ids and input rows. Give each worker a 'devices' list of the same length");
  }

  // Gather `values` (one per local replica) of every worker along `axis`
  // into `copies` new tensors, each the full concatenation.
  // on_devices: each replica's output on its value's device (a replica
  // all_gather of GPU tensors stays on the GPUs, as a GPU cross_device_ops
  // such as nccl wants); else host tensors.
  std::vector<ManagedTensorPtr> gather_all(const DLTensor* const* values, int32_t axis, uint32_t copies,
                                           bool on_devices = false) {
    const std::vector<int64_t> shape = global_concat_shape(values, axis);
    std::vector<ManagedTensorPtr> results;
    std::vector<DLTensor*> outs(n);
    results.reserve(copies);
    for (uint32_t r = 0; r < n; ++r) {
      // The CrossDeviceOps writes every local replica's output; extra ones
      // beyond `copies` are scratch.
      if (on_devices && values[r] != nullptr && on_cuda(*values[r]))
        results.push_back(make_device_tensor(host, values[0]->dtype, shape, values[r]->device));
      else
        results.push_back(make_tensor(values[0]->dtype, shape));
      outs[r] = &results.back()->dl_tensor;
    }
    strata_error err;
    strata_error_init(&err);
    cdo_all_gather(n, values, axis, outs.data(), "all_gather");
    results.resize(copies);
    return results;
  }

  // Make every copy of a new variable equal to worker 0's initial value.
  // `initial` is the caller's tensor, so the source never aliases a copy.
  void broadcast_initial(Variable& v, const DLTensor& initial) {
    if (W == 1) return;
    std::vector<DLTensor> views;
    std::vector<DLTensor*> dsts;
    for (size_t c = 0; c < v.copies.size(); ++c) views.push_back(v.host_view(c));  // uploaded after
    for (auto& t : views) dsts.push_back(&t);
    const DLTensor& src = initial;
    strata_error err;
    strata_error_init(&err);
    cdo_broadcast(&src, static_cast<uint32_t>(dsts.size()), dsts.data(), "broadcast (initial value of a variable)");
  }

  // ------------------------------------------------------- variables ---
  Variable& check_var(strata_variable_t h) {
    Variable* v = reinterpret_cast<Variable*>(h);
    bool known;
    {
      std::lock_guard<std::mutex> l(vars_mu);
      known = v != nullptr && vars.count(v) != 0;
    }
    if (!known)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, cfg.strategy_name,
                   ": unknown variable handle (destroyed, or created by another strategy instance)");
    return *v;
  }

  void check_value(const Variable& v, const DLTensor& value) {
    check_tensor_metadata(value, "value for " + v.label());
    bool ok = dtype_equal(value.dtype, v.dtype) && value.ndim == static_cast<int32_t>(v.shape.size());
    for (size_t d = 0; ok && d < v.shape.size(); ++d) ok = value.shape[d] == v.shape[d];
    if (!ok)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "update of ", v.label(), ": value is ", tensor_string(value),
                   " but the variable is ", v.type_string(), "; pass a value of the variable's dtype and shape");
  }

  // ON_READ aggregated into a new tensor (cross-replica read).
  ManagedTensorPtr aggregate_on_read(Variable& v) {
    auto out = make_tensor(v.dtype, v.shape);
    strata_error err;
    strata_error_init(&err);
    for (size_t c = 0; c < v.copies.size(); ++c) v.download(c);
    if (v.agg == STRATA_VAR_AGG_ONLY_FIRST_REPLICA || (v.copies.size() == 1 && W == 1)) {
      if (W == 1) {
        if (v.bytes) std::memcpy(out->dl_tensor.data, v.copies[0].data(), v.bytes);
        return out;
      }
      // The first replica in sync is worker 0's first replica.
      const DLTensor src = v.host_view(0);
      DLTensor* dsts[1] = {&out->dl_tensor};
      cdo_broadcast(&src, 1, dsts, "broadcast");
      return out;
    }
    std::vector<DLTensor> vs;
    std::vector<const DLTensor*> ps;
    for (size_t c = 0; c < v.copies.size(); ++c) vs.push_back(v.host_view(c));
    for (auto& t : vs) ps.push_back(&t);
    DLTensor* outs[1] = {&out->dl_tensor};
    const uint32_t op = v.agg == STRATA_VAR_AGG_SUM ? STRATA_REDUCE_SUM : STRATA_REDUCE_MEAN;
    cdo_reduce(op, 1, static_cast<uint32_t>(ps.size()), ps.data(), outs, "reduce");
    return out;
  }
};

// ------------------------------------------------------------ options ---

int parse_device(const std::string& device, const std::string& option) {
  return parse_device_spec(device, option).device_id;
}

std::vector<std::string> parse_device_list(const nlohmann::json& value, const std::string& option) {
  if (!value.is_array() || value.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", option,
                 "' must be a non-empty array of device names, e.g. [\"cpu:0\", \"cpu:1\"]; got ", value.dump());
  std::vector<std::string> out;
  for (const auto& d : value) {
    if (!d.is_string())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", option, "' must hold device name strings; got ",
                   d.dump());
    const std::string name = d.get<std::string>();
    parse_device(name, option);
    for (const auto& seen : out)
      if (seen == name)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "device '", name, "' appears more than once in option '",
                     option, "'; list each device once");
    out.push_back(name);
  }
  return out;
}

void parse_common_options(const nlohmann::json& o, LocalStrategyConfig& cfg, bool allow_devices) {
  const std::string comp = cfg.strategy_name + " strategy";
  if (allow_devices && o.contains("devices")) {
    cfg.devices = parse_device_list(o.at("devices"), "devices");
    cfg.devices_given = true;
  }
  if (o.contains("cross_device_ops")) {
    const auto& c = o.at("cross_device_ops");
    if (c.is_string()) {
      cfg.cross_device_ops = c.get<std::string>();
      cfg.cross_device_ops_options = "{}";
    } else if (c.is_object()) {
      check_known_keys(c, {"name", "options"}, "option 'cross_device_ops' of " + comp);
      if (!c.contains("name") || !c.at("name").is_string())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'cross_device_ops' of ", comp,
                     " needs a string \"name\", e.g. {\"name\": \"hierarchical_copy\", \"options\": {}}");
      cfg.cross_device_ops = c.at("name").get<std::string>();
      cfg.cross_device_ops_options = "{}";
      if (c.contains("options")) {
        if (!c.at("options").is_object())
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'cross_device_ops.options' of ", comp,
                       " must be a JSON object; got ", c.at("options").dump());
        cfg.cross_device_ops_options = c.at("options").dump();
      }
    } else {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'cross_device_ops' of ", comp,
                   " must be a name or {\"name\": ..., \"options\": {...}}; got ", c.dump());
    }
  }
  cfg.timeout_s = get_option<double>(o, "timeout_s", cfg.timeout_s, comp);
  if (!(cfg.timeout_s > 0) || cfg.timeout_s > 1e7)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'timeout_s' of ", comp,
                 " must be a number of seconds in (0, 1e7]; got ", cfg.timeout_s);
}

// ----------------------------------------------------------- strategy ---

LocalStrategy::LocalStrategy(Host host, LocalStrategyConfig config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.host = std::move(host);
  m.cfg = std::move(config);
  if (m.cfg.devices.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, m.cfg.strategy_name,
                 ": devices must be non-empty: pass {\"devices\": [\"cpu:0\"]}");
  // As tf.distribute's MirroredStrategy: without a "devices" option every
  // visible GPU is a replica, else the host. Multi-worker strategies decide
  // for the whole job, so they opt in themselves (default_to_gpus).
  if (m.cfg.default_to_gpus && !m.cfg.devices_given && m.cfg.num_workers == 1 &&
      m.cfg.strategy_name != "multi_worker_mirrored" && m.cfg.devices == std::vector<std::string>{"cpu:0"}) {
    const int32_t gpus = visible_gpu_count(m.host);
    if (gpus > 0) {
      m.cfg.devices.clear();
      for (int32_t g = 0; g < gpus; ++g) m.cfg.devices.push_back("gpu:" + std::to_string(g));
    }
  }
  for (const auto& d : m.cfg.devices) m.devs.push_back(parse_device_spec(d, "devices"));
  if (!m.cfg.gpu_cross_device_ops.empty() &&
      std::all_of(m.devs.begin(), m.devs.end(), [](const DLDevice& d) { return d.device_type == kDLCUDA; })) {
    m.cfg.cross_device_ops = m.cfg.gpu_cross_device_ops;
    m.cfg.split_all_reduce = false;  // one call over every GPU (NCCL groups them itself)
  }
  if (m.cfg.parameter_device.empty()) m.cfg.parameter_device = m.cfg.devices[0];
  m.param_dev = parse_device_spec(m.cfg.parameter_device, "parameter_device");
  {
    std::vector<DLDevice> all = m.devs;
    all.push_back(m.param_dev);
    check_devices(m.host, all, m.cfg.strategy_name + " strategy");
    for (const DLDevice& d : all) m.any_gpu = m.any_gpu || d.device_type == kDLCUDA;
  }
  m.stage_host = m.any_gpu && m.cfg.cross_device_ops == "nccl";
  m.n = static_cast<uint32_t>(m.cfg.devices.size());
  m.device_errors.assign(m.n, std::string());
  m.streams.assign(m.n, nullptr);
  for (uint32_t r = 0; r < m.n; ++r)
    if (m.devs[r].device_type == kDLCUDA) m.streams[r] = m.host.stream_create(m.devs[r]);
  m.poll_pause = static_cast<int>(m.n) <= transport::usable_cores();
  m.awake.store(static_cast<int>(m.n), std::memory_order_relaxed);
  if (m.cfg.num_workers == 0 || m.cfg.worker_index >= m.cfg.num_workers)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, m.cfg.strategy_name, ": worker_index ", m.cfg.worker_index,
                 " is not below num_workers ", m.cfg.num_workers,
                 "; the rank must be in [0, num_workers) (check the cluster spec and task)");
  if (m.cfg.num_workers > 1 && m.cfg.cross_device_ops.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, m.cfg.strategy_name, ": ", m.cfg.num_workers,
                 " workers need a cross_device_ops plugin that spans processes (e.g. \"ring\"); the "
                 "built-in one reduces within this process only");
  if (!m.cfg.describe_extra.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, m.cfg.strategy_name, ": describe_extra must be a JSON object");
  m.W = m.cfg.num_workers;
  m.total = m.W * m.n;
  m.timeout = std::chrono::nanoseconds(static_cast<int64_t>(m.cfg.timeout_s * 1e9));
  if (m.cfg.cross_device_ops.empty()) {
    m.builtin_cdo = std::make_unique<LocalCrossDeviceOps>(m.host.with_subsystem("cross_device_ops.builtin"));
    m.cdo_vt = CrossDeviceOpsAdapter<LocalCrossDeviceOps>::vtable();
    m.cdo = reinterpret_cast<strata_cross_device_ops_t>(m.builtin_cdo.get());
  } else {
    if (!m.host)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, m.cfg.strategy_name, ": cross_device_ops '",
                   m.cfg.cross_device_ops, "' needs the host services table to be created");
    m.cdo_ref = m.host.create_plugin<strata_cross_device_ops_vtable>(m.cfg.cross_device_ops,
                                                                     m.cfg.cross_device_ops_options);
    m.cdo_vt = m.cdo_ref.vtable();
    m.cdo = m.cdo_ref.handle<strata_cross_device_ops_t>();
  }
  m.check_same_devices_everywhere();
  m.cdos.assign(m.n, m.cdo);
  m.split = m.cfg.split_all_reduce && m.W == 1 && m.n > 1;
  if (m.split) {
    for (uint32_t r = 1; r < m.n; ++r) {
      if (m.builtin_cdo) {
        m.extra_builtin.push_back(
            std::make_unique<LocalCrossDeviceOps>(m.host.with_subsystem("cross_device_ops.builtin")));
        m.cdos[r] = reinterpret_cast<strata_cross_device_ops_t>(m.extra_builtin.back().get());
      } else {
        m.extra_refs.push_back(m.host.create_plugin<strata_cross_device_ops_vtable>(
            m.cfg.cross_device_ops, m.cfg.cross_device_ops_options));
        m.cdos[r] = m.extra_refs.back().handle<strata_cross_device_ops_t>();
      }
    }
    m.split_scratch.resize(m.n);
  }
  m.ctxs.resize(m.n);
  for (uint32_t r = 0; r < m.n; ++r) m.ctxs[r] = ReplicaCtx{&m, r};
  m.slots.resize(m.n);
  m.arrived_flag.assign(m.n, 0);
  m.workers.reserve(m.n);
  for (uint32_t r = 1; r < m.n; ++r) m.workers.emplace_back([&m, r] { m.worker_loop(r); });
  m.host.debug(m.cfg.strategy_name, ": worker ", m.cfg.worker_index, " of ", m.W, ", ", m.n,
               " local replica(s), cross_device_ops '",
               m.cfg.cross_device_ops.empty() ? "builtin" : m.cfg.cross_device_ops, "'");
}

LocalStrategy::~LocalStrategy() = default;

void LocalStrategy::forward_set_transport(const std::string& name, const std::string& options_json) {
  Impl& m = *impl_;
  if (m.builtin_cdo)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "strategy '", m.cfg.strategy_name,
                 "' has no transport to switch to '", name,
                 "': its cross_device_ops is the built-in in-process one; set_transport needs a strategy "
                 "that spans processes (multi_worker_mirrored)");
  if (!STRATA_HAS_FIELD(m.cdo_vt, strata_cross_device_ops_vtable, set_transport) || m.cdo_vt->set_transport == nullptr)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "strategy '", m.cfg.strategy_name, "' cannot switch to transport '", name,
                 "': its cross_device_ops '", m.cfg.cross_device_ops,
                 "' does not implement set_transport (ABI 1.2); use the \"ring\" cross_device_ops");
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st = m.cdo_vt->set_transport(m.cdo, name.c_str(), options_json.c_str(), &err);
  if (st != STRATA_OK)
    ::strata::detail::throw_status(st, ::strata::detail::str_cat(m.cfg.strategy_name, ": ",
                                                                 err.message[0] ? err.message : strata_status_string(st)));
}

uint32_t LocalStrategy::num_replicas() const { return impl_->n; }
uint32_t LocalStrategy::num_replicas_in_sync() const { return impl_->total; }

std::string LocalStrategy::describe() {
  const Impl& m = *impl_;
  nlohmann::json j = m.cfg.describe_extra;
  j["strategy"] = m.cfg.strategy_name;
  j["num_replicas_in_sync"] = m.total;
  j["num_local_replicas"] = m.n;
  j["worker_devices"] = m.cfg.devices;
  j["parameter_devices"] = m.cfg.placement == VariablePlacement::kPerReplica
                               ? nlohmann::json(m.cfg.devices)
                               : nlohmann::json::array({m.cfg.parameter_device});
  j["worker_index"] = m.cfg.worker_index;
  j["num_workers"] = m.W;
  j["is_chief"] = m.cfg.is_chief;
  j["cross_device_ops"] = m.cfg.cross_device_ops.empty() ? "builtin" : m.cfg.cross_device_ops;
  j["timeout_s"] = m.cfg.timeout_s;
  return j.dump();
}

void LocalStrategy::run(strata_replica_fn fn, void* user) {
  Impl& m = *impl_;
  if (tls_replica_owner == &m)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, m.cfg.strategy_name,
                 ": run() called from inside a replica function; run is not reentrant: use "
                 "replica-context collectives (all_reduce, merge_call) instead");
  if (m.running.exchange(true, std::memory_order_acq_rel))
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, m.cfg.strategy_name,
                 ": run() is already in progress on another thread; cross-replica calls must be "
                 "serialised");
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false, std::memory_order_release); }
  } done{m.running};
  {
    std::lock_guard<std::mutex> l(m.rv_mu);
    m.arrived = 0;
    std::fill(m.arrived_flag.begin(), m.arrived_flag.end(), 0);
    m.in_progress = false;
    m.round = 0;
    m.failed = false;
    m.fail_code = STRATA_OK;
    m.fail_msg.clear();
  }
  m.fn = fn;
  m.user = user;
  // Replica 0 runs on the caller's thread: make its device current there.
  if (m.gpu_replica(0)) m.host.set_device(m.devs[0]);
  if (m.n > 1) {
    m.remaining.store(m.n - 1, std::memory_order_release);
    {
      std::lock_guard<std::mutex> l(m.pool_mu);
      m.gen.fetch_add(1, std::memory_order_acq_rel);
    }
    m.pool_cv.notify_all();
  }
  m.execute(0);
  if (m.n > 1) {
    if (!m.poll([&] { return m.remaining.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> l(m.done_mu);
      Impl::Asleep z(m);
      m.done_cv.wait(l, [&] { return m.remaining.load(std::memory_order_acquire) == 0; });
    }
  }
  std::lock_guard<std::mutex> l(m.rv_mu);
  if (m.failed) ::strata::detail::throw_status(m.fail_code, m.fail_msg);
}

void* LocalStrategy::replica_stream(strata_replica_t r) noexcept {
  const Impl& m = *impl_;
  const ReplicaCtx* c = reinterpret_cast<const ReplicaCtx*>(r);
  if (c == nullptr || c < m.ctxs.data() || c >= m.ctxs.data() + m.ctxs.size()) return nullptr;
  return m.streams[c->id];
}

int32_t LocalStrategy::replica_id_in_sync_group(strata_replica_t r) {
  const Impl& m = *impl_;
  return static_cast<int32_t>(m.cfg.worker_index * m.n + m.check_replica(r).id);
}

void LocalStrategy::replica_all_reduce(strata_replica_t r, strata_reduce_op op, uint32_t num_tensors,
                                       const DLTensor* const* inputs, DLTensor* const* outputs) {
  const ReplicaCtx& c = impl_->check_replica(r);
  for (uint32_t t = 0; t < num_tensors; ++t)
    if (inputs[t] == nullptr || outputs[t] == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "replica_all_reduce: input or output ", t, " of replica ", c.id,
                   " is NULL");
  Slot s;
  s.kind = Kind::kAllReduce;
  s.op = op;
  s.num_tensors = num_tensors;
  s.inputs = inputs;
  s.outputs = outputs;
  impl_->arrive(c.id, s);
}

DLManagedTensor* LocalStrategy::replica_all_gather(strata_replica_t r, const DLTensor& input, int32_t axis) {
  const ReplicaCtx& c = impl_->check_replica(r);
  check_tensor_metadata(input, "all_gather input of replica " + std::to_string(c.id));
  DLManagedTensor* out = nullptr;
  Slot s;
  s.kind = Kind::kAllGather;
  s.input = &input;
  s.axis = axis;
  s.out = &out;
  impl_->arrive(c.id, s);
  if (!on_cuda(input) || out == nullptr || on_cuda(out->dl_tensor)) return out;
  // A gathered host tensor, moved to the input's GPU (as the result of a
  // GPU all_reduce stays on the GPU).
  ManagedTensorPtr host_out(out);
  const DLTensor& h = host_out->dl_tensor;
  auto dev = make_device_tensor(impl_->host, h.dtype, std::vector<int64_t>(h.shape, h.shape + h.ndim), input.device);
  impl_->host.copy(dev->dl_tensor.data, input.device, h.data, DLDevice{kDLCPU, 0}, byte_size(h),
                   impl_->streams[c.id]);
  return dev.release();
}

void LocalStrategy::replica_merge_call(strata_replica_t r, strata_merge_fn fn, void* merge_user,
                                       void* replica_arg) {
  const ReplicaCtx& c = impl_->check_replica(r);
  Slot s;
  s.kind = Kind::kMergeCall;
  s.fn = fn;
  s.merge_user = merge_user;
  s.arg = replica_arg;
  impl_->arrive(c.id, s);
}

void LocalStrategy::reduce_to(strata_reduce_op op, uint32_t num_values, const DLTensor* const* values,
                              DLTensor& output) {
  Impl& m = *impl_;
  if (num_values != m.n)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, m.cfg.strategy_name, ": reduce_to got ", num_values,
                 " value(s) but the strategy has ", m.n, " local replica(s); pass one value per replica");
  DLTensor* outs[1] = {&output};
  strata_error err;
  strata_error_init(&err);
  m.cdo_reduce(op, 1, m.n, values, outs, "reduce");
}

DLManagedTensor* LocalStrategy::gather_to(uint32_t num_values, const DLTensor* const* values, int32_t axis) {
  Impl& m = *impl_;
  if (num_values != m.n)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, m.cfg.strategy_name, ": gather_to got ", num_values,
                 " value(s) but the strategy has ", m.n, " local replica(s); pass one value per replica");
  if (m.W > 1) return m.gather_all(values, axis, 1)[0].release();
  // GPU values: host copies first (the result is a host tensor).
  std::vector<ManagedTensorPtr> staged;
  std::vector<const DLTensor*> host_values(values, values + num_values);
  for (uint32_t i = 0; i < num_values; ++i)
    if (values[i] != nullptr && on_cuda(*values[i])) {
      check_tensor_metadata(*values[i], "gather_to value " + std::to_string(i));
      staged.push_back(make_tensor(values[i]->dtype, std::vector<int64_t>(values[i]->shape, values[i]->shape + values[i]->ndim)));
      m.host.copy(staged.back()->dl_tensor.data, DLDevice{kDLCPU, 0}, data_ptr(*values[i]), values[i]->device,
                  byte_size(*values[i]));
      host_values[i] = &staged.back()->dl_tensor;
    }
  values = host_values.data();
  auto out = make_tensor(values[0] ? values[0]->dtype : kFloat32, concat_shape(values, num_values, axis));
  concat(values, num_values, axis, out->dl_tensor);
  return out.release();
}

strata_variable_t LocalStrategy::variable_create(const strata_variable_desc& desc, const DLTensor& initial) {
  Impl& m = *impl_;
  const std::string name = desc.name ? desc.name : "";
  uint32_t sync = desc.synchronization == STRATA_VAR_SYNC_AUTO ? static_cast<uint32_t>(STRATA_VAR_SYNC_ON_WRITE) : desc.synchronization;
  if (sync == STRATA_VAR_SYNC_NONE || sync > STRATA_VAR_SYNC_NONE)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable '", name, "': synchronization ", desc.synchronization,
                 " is not supported by ", m.cfg.strategy_name,
                 "; use AUTO/ON_WRITE (mirrored copies) or ON_READ (per-replica copies)");
  if (desc.aggregation > STRATA_VAR_AGG_ONLY_FIRST_REPLICA)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable '", name, "': aggregation ", desc.aggregation,
                 " is not NONE(0), SUM(1), MEAN(2) or ONLY_FIRST_REPLICA(3)");
  if (sync == STRATA_VAR_SYNC_ON_READ && desc.trainable)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable '", name,
                 "': synchronization ON_READ can be used only for non-trainable variables; you "
                 "specified trainable=true and synchronization=ON_READ (pass trainable=false)");
  check_tensor_metadata(initial, "initial value of variable '" + name + "'");
  auto v = std::make_unique<Variable>();
  v->host = m.host;
  v->owner = &m;
  v->name = name;
  v->sync = static_cast<strata_var_sync>(sync);
  v->agg = static_cast<strata_var_aggregation>(desc.aggregation);
  v->trainable = desc.trainable != 0;
  v->dtype = initial.dtype;
  v->shape.assign(initial.shape, initial.shape + initial.ndim);
  v->count = static_cast<size_t>(element_count(initial));
  v->bytes = byte_size(initial);
  const size_t copies =
      (sync == STRATA_VAR_SYNC_ON_READ || m.cfg.placement == VariablePlacement::kPerReplica) ? m.n : 1;
  v->copies.resize(copies);
  for (auto& c : v->copies) {
    c.reserve(v->bytes);
    if (v->bytes) m.host.copy(c.data(), DLDevice{kDLCPU, 0}, data_ptr(initial), initial.device, v->bytes);
  }
  ManagedTensorPtr host_initial;  // the broadcast source must be host memory
  const DLTensor* init = &initial;
  if (on_cuda(initial) && m.W > 1) {
    host_initial = make_tensor(initial.dtype, v->shape);
    if (v->bytes) std::memcpy(host_initial->dl_tensor.data, v->copies[0].data(), v->bytes);
    init = &host_initial->dl_tensor;
  }
  m.broadcast_initial(*v, *init);
  // A copy on a GPU lives in that GPU's memory.
  v->devices.resize(copies);
  v->device_data.assign(copies, nullptr);
  for (size_t c = 0; c < copies; ++c) {
    v->devices[c] = m.copy_device(*v, c);
    if (!v->on_gpu(c)) continue;
    v->device_data[c] = m.host.allocate(v->devices[c], v->bytes, 256);
    if (v->device_data[c] == nullptr)
      STRATA_THROW(STRATA_ERR_INTERNAL, "variable '", name, "': cannot allocate ", v->bytes, " bytes on ",
                   device_string(v->devices[c]), " (out of device memory? the host's log has the CUDA error)");
    v->upload(c);
  }
  std::lock_guard<std::mutex> l(m.vars_mu);
  m.vars.insert(v.get());
  return reinterpret_cast<strata_variable_t>(v.release());
}

void LocalStrategy::variable_destroy(strata_variable_t h) noexcept {
  Impl& m = *impl_;
  Variable* v = reinterpret_cast<Variable*>(h);
  {
    std::lock_guard<std::mutex> l(m.vars_mu);
    if (m.vars.erase(v) == 0) return;
  }
  delete v;
}

DLManagedTensor* LocalStrategy::variable_read(strata_variable_t h, strata_replica_t r) {
  Impl& m = *impl_;
  Variable& v = m.check_var(h);
  if (r != nullptr) {
    // Replica context: a tensor on the copy's device (the replica's GPU for
    // a mirrored variable), copied on the replica's stream so that it is
    // ordered after the replica's own work.
    const ReplicaCtx& c = m.check_replica(r);
    const size_t idx = v.copies.size() == 1 ? 0 : c.id;
    if (!v.on_gpu(idx)) {
      auto out = make_tensor(v.dtype, v.shape);
      if (v.bytes) std::memcpy(out->dl_tensor.data, v.copies[idx].data(), v.bytes);
      return out.release();
    }
    auto out = make_device_tensor(m.host, v.dtype, v.shape, v.devices[idx]);
    m.host.copy(out->dl_tensor.data, v.devices[idx], v.device_data[idx], v.devices[idx], v.bytes,
                m.streams[c.id]);
    return out.release();
  }
  if (v.sync == STRATA_VAR_SYNC_ON_WRITE) {
    // Cross-replica context: a host tensor (what .numpy() gives in TF), so
    // checkpoints, metrics and prints read it directly.
    m.sync_all_streams();
    auto out = make_tensor(v.dtype, v.shape);
    if (v.on_gpu(0))
      m.host.copy(out->dl_tensor.data, DLDevice{kDLCPU, 0}, v.device_data[0], v.devices[0], v.bytes);
    else if (v.bytes)
      std::memcpy(out->dl_tensor.data, v.copies[0].data(), v.bytes);
    return out.release();
  }
  if (v.agg == STRATA_VAR_AGG_NONE)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "cannot read ON_READ ", v.label(),
                 " in cross-replica context: its aggregation is NONE, which cannot be converted to a "
                 "reduce op; create it with aggregation SUM, MEAN or ONLY_FIRST_REPLICA, or read it in "
                 "replica context");
  m.sync_all_streams();
  return m.aggregate_on_read(v).release();
}

void LocalStrategy::variable_update(strata_variable_t h, strata_replica_t r, strata_var_update_op op,
                                    const DLTensor& value) {
  Impl& m = *impl_;
  Variable& v = m.check_var(h);
  m.check_value(v, value);
  if (r == nullptr) {  // cross-replica: every copy
    m.sync_all_streams();
    AlignedBuffer value_buf;
    const void* src = m.host_data(value, v.bytes, value_buf);
    if (v.sync == STRATA_VAR_SYNC_ON_READ && v.agg == STRATA_VAR_AGG_SUM) {
      if (op != STRATA_VAR_ASSIGN)
        STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "ON_READ ", v.label(), " does not support ", update_name(op),
                     " in cross-replica context when its aggregation is SUM (as in TF); assign the new "
                     "total instead, or update it in replica context");
      // The SUM of the copies must equal the assigned value.
      m.cross_buf.reserve(v.bytes);
      if (v.bytes) std::memcpy(m.cross_buf.data(), src, v.bytes);
      kernels::divide(v.dtype, m.cross_buf.data(), v.count, static_cast<double>(v.copies.size()) * m.W);
      src = m.cross_buf.data();
    }
    m.apply_all(v, op, src);
    return;
  }
  const ReplicaCtx& c = m.check_replica(r);
  if (v.sync == STRATA_VAR_SYNC_ON_READ) {
    // The replica's own copy: staged through host memory when on a GPU
    // (download, host kernel, upload), after the replica's pending work.
    m.sync_stream(c.id);
    AlignedBuffer value_buf;
    m.apply_one(v, c.id, op, m.host_data(value, v.bytes, value_buf));
    return;
  }
  if (v.agg == STRATA_VAR_AGG_NONE && (m.cfg.require_aggregation || m.total > 1))
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION,
                 "You must specify an aggregation method to update a variable in replica context: ",
                 v.label(), " of strategy ", m.cfg.strategy_name,
                 " has aggregation NONE; create it with aggregation SUM, MEAN or ONLY_FIRST_REPLICA, "
                 "or update it in cross-replica context (merge_call)");
  if (m.total > 1 && v.agg == STRATA_VAR_AGG_SUM && op == STRATA_VAR_ASSIGN)
    // tf.distribute's vars_test skips this combination because TF refuses it
    // (a value that is not per-replica cannot be SUM-reduced); the sum of N
    // assigned values is never what an assign means.
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "assign of ON_WRITE ", v.label(),
                 " in replica context: its aggregation is SUM, so the ", m.total,
                 " replicas' values would be added and the variable set to their sum (", m.total,
                 " times the value when every replica assigns the same); tf.distribute refuses this. "
                 "Use aggregation MEAN or ONLY_FIRST_REPLICA, assign_add for per-replica increments, or "
                 "assign in cross-replica context");
  if (m.total > 1 && v.agg == STRATA_VAR_AGG_MEAN && v.dtype.code != kDLFloat && v.dtype.code != kDLBfloat)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, update_name(op), " of ON_WRITE ", v.label(),
                 " in replica context: a MEAN of a non-float variable would lose precision (as in "
                 "tf.distribute); make the variable a float type or update it in cross-replica context");
  Slot s;
  s.kind = Kind::kVarUpdate;
  s.op = op;
  s.var = &v;
  s.input = &value;
  m.arrive(c.id, s);
}

DLTensor LocalStrategy::variable_view(strata_variable_t h, strata_replica_t r) {
  Impl& m = *impl_;
  Variable& v = m.check_var(h);
  size_t idx = 0;
  if (r != nullptr) {
    const ReplicaCtx& c = m.check_replica(r);
    idx = v.copies.size() == 1 ? 0 : c.id;
  }
  return v.view(idx);
}

}  // namespace strata::sdk
