// SPDX-License-Identifier: Apache-2.0
// strata-bench ps: parameter-server training costs over real processes on
// this host: one chief (this process, the ClusterCoordinator), --workers
// worker and --ps ps tasks (this binary again, serving), all over the
// transport of the job config (tcp by default).
//   closures   K no-op closures scheduled then joined: closures per second
//              and microseconds per closure end to end; also the cost of the
//              schedule() call alone (queueing and argument encoding).
//   pull/push  a float32 variable of each --sizes on ps task 0: read()
//              (pull) and assign() (push) from the coordinator, MB/s.
// Medians of --repeats runs; the load average is printed before and after
// (the machines are shared: a figure means little without it). Compare
// pull/push with `strata-bench pingpong --transport tcp -n 2 --sizes ...`.
#pragma once

#include <cstdint>
#include <string>

namespace strata::bench {

struct PsBenchOptions {
  int workers = 2;
  int ps = 1;
  std::string sizes = "4K:64M";
  std::int64_t closures = 2000;
  int repeats = 5;
  bool json = false;
};

/// Run the benchmark (starts and stops the server processes). Returns 0.
/// Throws strata::Error when the cluster cannot be started.
int run_ps_bench(const PsBenchOptions& o);

/// The server role the benchmark starts (`strata-bench ps --serve`).
int run_ps_bench_server();

}  // namespace strata::bench
