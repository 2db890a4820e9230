// SPDX-License-Identifier: Apache-2.0
// LocalCrossDeviceOps: a complete CrossDeviceOps for the tensors of replicas
// living in this process (host memory), built on the SDK kernels. It
// validates every call (dtype, element counts, contiguity, host memory),
// implements reduce, broadcast, all_gather, reduce_scatter and the start/wait
// pair, and leaves the batch all-reduce algorithm to subclasses through
// batch_all_reduce (the default reduces each tensor group a block at a time
// into a small buffer and stores it into every output: kernels::reduce_broadcast).
//
// Threads: one call at a time per instance (as the ABI says); scratch
// buffers are reused between calls, so steady-state blocking calls do not
// allocate.
//
// Overlap: all_reduce_start validates the batch at once (bad arguments fail
// there), copies the tensor descriptors and hands the batch to a worker
// thread of the instance (started on first use), then returns, so that the
// caller computes while the worker reduces. A batch below 64 KiB whose
// queue is empty is done at once instead (waking a thread costs more than
// the work). Started batches run one at a time in start order, so they
// complete in order. request_wait waits with a deadline; when the batch has
// not been picked up yet, the waiting thread runs it (and any started
// before it) itself instead of sleeping while another thread wakes up
// (timeout 0 only polls; a negative timeout waits without limit, the work
// being bounded in-process computation). Every blocking call first finishes
// the started batches, so later calls see their results.
//
// Subclasses: batch_all_reduce (and every other virtual) may run on the
// worker thread, never concurrently with another call of the instance. A
// plugin's instance is destroyed through CrossDeviceOpsAdapter, which calls
// before_destroy() (shutdown()) first, so the worker has finished before any
// subclass destructor changes the object's dynamic type or destroys its
// members. Code that deletes a subclass some other way calls shutdown()
// itself first.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "strata/sdk/kernels.hpp"
#include "strata/sdk/device.hpp"
#include "strata/sdk/plugin.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::sdk {

class LocalCrossDeviceOps : public CrossDeviceOpsBase {
 public:
  explicit LocalCrossDeviceOps(Host host) : host_(std::move(host)) {}
  /// As a standalone component: accepts no options ({} only).
  LocalCrossDeviceOps(Host host, const char* options_json);
  ~LocalCrossDeviceOps() override;
  void before_destroy() noexcept override { shutdown(); }

  void all_reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
                  const DLTensor* const* inputs, DLTensor* const* outputs) override;
  void reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
              const DLTensor* const* inputs, DLTensor* const* outputs) override;
  void broadcast(const DLTensor& src, uint32_t num_replicas, DLTensor* const* dsts) override;
  void all_gather(uint32_t num_replicas, const DLTensor* const* inputs, int32_t axis,
                  DLTensor* const* outputs) override;
  void reduce_scatter(strata_reduce_op op, uint32_t num_replicas, const DLTensor* const* inputs,
                      DLTensor* const* outputs);
  strata_cdo_request_t all_reduce_start(strata_reduce_op op, uint32_t num_tensors,
                                        uint32_t num_replicas, const DLTensor* const* inputs,
                                        DLTensor* const* outputs);
  void request_wait(strata_cdo_request_t request, int64_t timeout_ms);

 protected:
  /// Finish every started batch and stop the worker thread (idempotent;
  /// before_destroy() and the destructor call it).
  void shutdown() noexcept;

  /// The batch all-reduce after validation (every group checked: same dtype
  /// and count, outputs matching). Outputs may alias inputs.
  virtual void batch_all_reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
                                const DLTensor* const* inputs, DLTensor* const* outputs);
  /// Validate a batch: inputs[t*nr + r] (and outputs with the same layout,
  /// or one output per tensor when `outputs_per_tensor` is 1).
  void validate_batch(const char* what, uint32_t num_tensors, uint32_t num_replicas,
                      const DLTensor* const* inputs, const DLTensor* const* outputs,
                      uint32_t outputs_per_tensor) const;
  /// op over inputs[0..nr) (each `count` elements of `dtype`) into `dst`;
  /// MEAN divides by nr. dst may alias an input.
  void reduce_into(strata_reduce_op op, DLDataType dtype, uint32_t num_replicas,
                   const DLTensor* const* group, void* dst, size_t count);

  Host host_;
  /// GPU tensors (kDLCUDA) given to all_reduce, reduce, broadcast,
  /// all_gather or reduce_scatter are staged through pinned host memory:
  /// copied in, handled by the host code (batch_all_reduce included, so a
  /// subclass sees host tensors only) and copied back, giving the same bits
  /// as host replicas. Staged calls are serialised (staging_mu_).
  HostStaging& staging();
  std::mutex staging_mu_;
  std::unique_ptr<HostStaging> staging_;
  std::vector<const void*> ptrs_;  // reused pointer arrays for the kernels
  std::vector<void*> out_ptrs_;
  AlignedBuffer scratch_;

 private:
  struct Request;
  // A lockable with a deadline, built from a mutex and a condition variable
  // (std::timed_mutex's try_lock_until uses pthread_mutex_clocklock, which
  // ThreadSanitizer does not see, so it reported the unlock as unpaired).
  class ExecGate {
   public:
    void lock() {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return !busy_; });
      busy_ = true;
    }
    bool try_lock() {
      std::lock_guard<std::mutex> l(m_);
      if (busy_) return false;
      busy_ = true;
      return true;
    }
    template <class TimePoint>
    bool try_lock_until(TimePoint deadline) {
      std::unique_lock<std::mutex> l(m_);
      if (!cv_.wait_until(l, deadline, [&] { return !busy_; })) return false;
      busy_ = true;
      return true;
    }
    void unlock() {
      {
        std::lock_guard<std::mutex> l(m_);
        busy_ = false;
      }
      cv_.notify_one();
    }

   private:
    std::mutex m_;
    std::condition_variable cv_;
    bool busy_ = false;
  };
  // Run queued batches, oldest first, until `until` has run (nullptr: all).
  // The caller holds exec_mu_.
  void run_queued_locked(const Request* until);
  void execute(Request& req) noexcept;
  void worker_loop();

  std::unordered_set<void*> requests_;  // started, not yet waited for (API thread only)
  // Held by whoever runs a batch or a blocking call: one at a time, in order.
  ExecGate exec_mu_;
  std::mutex q_mu_;  // guards queue_, stop_ and Request::state (after exec_mu_ when both)
  std::condition_variable q_cv_;
  std::deque<Request*> queue_;  // started, not yet running
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace strata::sdk
