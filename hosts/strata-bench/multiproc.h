// SPDX-License-Identifier: Apache-2.0
// Multi-process benchmarks. Collectives (strata-bench allreduce|broadcast|
// allgather --transport tcp -n N): the launcher re-executes this program N
// times as workers; the workers join one "ring" CrossDeviceOps over the
// transport and time its collectives with the method and conventions of
// /work/shared/bench/mpi_coll_bench.c (nccl-tests bandwidths), so the two
// programs' figures compare directly. Point to point (strata-bench pingpong
// --transport T -n 2): two workers drive the transport's own vtable, as
// osu_latency and fi_pingpong do: rank 0 sends, rank 1 answers with a message
// of the same size; the one-way time is half the median round trip and the
// bandwidth is size / one-way time. Buffers are always registered through
// mem_register and passed with their region, so transports that need
// registered memory run their registered path.
//
// Process model. The launcher (the process the user started) forks and execs
// /proc/self/exe with the same arguments plus a hidden --bench-worker-rank R.
// Rank 0 serves the TCP rendezvous store on 127.0.0.1:0 and reports the
// bound address through a pipe; the launcher then starts ranks 1..N-1 with
// that address. Every worker dies with the launcher (PR_SET_PDEATHSIG); the
// launcher reaps every worker on every path, and when one fails it gives the
// others a grace period to report their error, then kills them. Rank 0 alone
// prints the results (stdout is shared).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::bench {

struct MultiProcOptions {
  std::string op;                  ///< "allreduce", "broadcast", "allgather" or "pingpong"
  std::string transport = "tcp";   ///< transport plugin name
  int ranks = 2;                   ///< processes (-n)
  std::vector<std::uint64_t> sizes;  ///< bytes: the per-rank buffer (allgather: the whole output)
  std::string dtype = "float32";   ///< float32, float64, int32, int64
  std::int64_t iters = 0;          ///< operations per timed batch; 0 = 256 MiB per batch, 5..1000
  std::int64_t warmup = -1;        ///< untimed operations after the checked one; -1 = iters / 5
  int trials = 7;                  ///< timed batches per size; the median is reported
  bool json = false;
  bool socket_reference = true;    ///< pingpong: also time plain loopback sockets (busy-poll, blocking)
  double timeout_s = 120;          ///< deadline of every collective and of the rendezvous
  std::string ring_options = "{}";       ///< extra options of the ring cross_device_ops (JSON object)
  std::string transport_options = "{}";  ///< options of the transport (JSON object)
  std::vector<std::string> transport_option_pairs;  ///< --option KEY=JSON, applied on top of transport_options
  std::string device = "cpu";      ///< allreduce: "gpu" runs gpu_allreduce.h's benchmark in the workers
  bool blocking = false;           ///< --device gpu: blocking collectives instead of stream-ordered batches
};

/// Validate `o` (throws InvalidArgumentError naming the bad option), start
/// o.ranks workers running `argv` again, wait for them and return the exit
/// status: 0 when every worker succeeded, else non-zero after printing which
/// ranks failed to stderr. Blocks until every worker is reaped.
int run_launcher(const MultiProcOptions& o, int argc, char** argv);

/// Body of worker `rank` (reads the store address, auth token and report
/// pipe from the environment the launcher set). Returns the exit status;
/// errors are printed to stderr naming the rank.
int run_worker(const MultiProcOptions& o, int rank);

}  // namespace strata::bench
