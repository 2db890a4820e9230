// SPDX-License-Identifier: Apache-2.0
// The "nccl" transport: NCCL collectives (all_reduce, broadcast, all_gather,
// reduce_scatter) on CUDA device buffers, one NCCL communicator per Strata
// communicator, one GPU per rank.
//
// Options (JSON object; unknown keys are rejected):
//   "device"           CUDA device ordinal every communicator of this
//                      instance uses. Default: the calling thread's current
//                      device (cudaGetDevice) at comm_create.
//   "timeout_s"        deadline of a blocking collective (stream NULL) and of
//                      a stream-ordered one, counted from its enqueue
//                      (default /timeouts/collective_s, else 300).
//   "setup_timeout_s"  deadline of comm_create when it is given a negative
//                      timeout (default /timeouts/rendezvous_s, else 120).
//
// Model. comm_create checks that a GPU is visible (else FAILED_PRECONDITION
// saying what to check), then rank 0 makes the ncclUniqueId and publishes it
// through the host store under the communicator's name, every rank passes
// the rendezvous gate (missing ranks are named at the deadline) and creates
// its NCCL communicator non-blocking (ncclConfig_t blocking = 0), polling
// ncclCommGetAsyncError until it is ready; at the deadline it calls
// ncclCommAbort and fails DEADLINE_EXCEEDED.
//
// Collectives take count elements of float16, bfloat16, float32, float64,
// int8, int32, int64, uint8, uint32 or uint64 and the ops SUM, MEAN (ncclAvg),
// MIN, MAX, PROD; buffers must be device (or managed) memory of the
// communicator's GPU. With a stream they are enqueued on it and return at
// once; without one they run on the communicator's own stream (ordered
// after the caller's work on the legacy default stream) and the call blocks
// until they are done, polling cudaStreamQuery and ncclCommGetAsyncError up
// to timeout_s. In place: send == recv (all_reduce, broadcast), send == recv
// + rank * count (all_gather), recv == send + rank * count (reduce_scatter);
// other overlaps are INVALID_ARGUMENT.
//
// Failure. Each communicator has a watchdog thread that polls
// ncclCommGetAsyncError, the abort request of comm_abort, and the deadline
// of every stream-ordered collective (through a CUDA event recorded after
// it); on any of them it calls ncclCommAbort, so kernels waiting for a dead
// peer return instead of hanging the GPU, and every later call fails ABORTED
// with the reason, which names the collective ("all_reduce #17 of
// communicator 'x' ..."). A blocking collective fails the same way itself.
// After an error the communicator is unusable: destroy it and create another.
//
// Caps: NATIVE_COLLECTIVES | MEM_CUDA | THREAD_SAFE (calls on one
// communicator are serialised inside; NCCL needs one order of collectives on
// every rank, so concurrent callers must still agree on that order). No P2P:
// isend/irecv/iwrite fail UNIMPLEMENTED (NCCL has no tags); use tcp or
// libfabric for point-to-point. mem_register returns a token region.
#pragma once

#include <memory>
#include <string>

#include "strata/sdk/plugin.hpp"

namespace strata::transport::nccl {

struct Options {
  int device = -1;  ///< -1: the caller's current device at comm_create
  double timeout_s = 300;
  double setup_timeout_s = 120;
  /// Watch every stream-ordered collective with a CUDA event (reaped by the
  /// watchdog), so that its deadline holds. Off: no event per call (up to
  /// 1.5 us less on an H100), and a stream-ordered collective that never
  /// completes is no longer caught by its deadline (NCCL's errors and
  /// abort still are).
  bool watch_enqueued = true;
};

class NcclComm;

class NcclTransport : public sdk::TransportBase {
 public:
  using Comm = NcclComm;
  static constexpr const char* kSubsystem = "transport.nccl";
  NcclTransport(sdk::Host host, const char* options_json);
  strata_transport_caps caps() override;
  std::unique_ptr<sdk::CommBase> comm_create(const char* name, int32_t rank, int32_t world_size,
                                             int64_t timeout_ms) override;

 private:
  sdk::Host host_;
  Options opts_;
};

}  // namespace strata::transport::nccl
