// SPDX-License-Identifier: Apache-2.0
// strata-bench allreduce --device gpu: all-reduce (SUM) of device buffers,
// Strata's path against raw NCCL in the same processes.
//
// Each rank uses GPU (rank % visible GPUs), one process per rank (-n, by
// default one per visible GPU; with one rank no worker is started and the
// store is in-process, otherwise the launcher of multiproc.h starts them).
// Every rank creates the "nccl" transport through the plugin host and joins
// one communicator, and beside it a raw NCCL communicator over the same
// ranks and GPU (ncclCommInitRankConfig, its unique id passed through the
// same store). Per size: the first all-reduce of each path is checked
// against the host's expected sums; then batches of `iters` all-reduces are
// timed for each path alternately (Strata, raw, Strata, ...), each batch
// enqueued on one CUDA stream and synchronised once at its end, as
// nccl-tests does (--blocking: Strata's blocking call, stream NULL, against
// raw NCCL synchronised after every operation). A batch's time is the
// slowest rank's; the median of --repeats batches is printed with
// nccl-tests' algbw and busbw (busbw = algbw * 2(n-1)/n, 0 at world 1) and
// the time ratio Strata / raw.
//
// Every wait has the --timeout deadline. Without a visible GPU (or in a
// build without CUDA) it fails with FAILED_PRECONDITION saying what to check.
#pragma once

#include "multiproc.h"

namespace strata::bench {

/// Visible CUDA devices (> 0). Throws FailedPreconditionError naming
/// cudaGetDeviceCount's error and what to check when there is none, or when
/// this strata-bench was built without CUDA.
int gpu_count_or_throw();

/// The benchmark body of `rank` of o.ranks (o.ranks == 1: this process
/// alone, in-process store; else a worker started by run_launcher, whose
/// store is connected). Rank 0 prints. Returns the exit status; throws
/// strata::Error on failure.
int run_gpu_allreduce(const MultiProcOptions& o, int rank);

}  // namespace strata::bench
