// SPDX-License-Identifier: Apache-2.0
// Runs strata-bench (STRATA_BENCH_BIN) for the nccl tests, bounded by
// coreutils' timeout(1), and returns its exit status, stdout and stderr.
// Header-only.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace strata::test {

struct BenchRun {
  int status = -1;  ///< exit status; 124 or 137 when timeout(1) stopped it
  std::string out, err;
};

/// Run `strata-bench ARGS` (ARGS already shell-quoted) for at most `seconds`.
inline BenchRun run_strata_bench(const std::string& args, int seconds) {
  BenchRun r;
  const std::string err_path = ::testing::TempDir() + "nccl-bench-" + std::to_string(::getpid()) + ".err";
  const std::string cmd = "timeout --kill-after=5 " + std::to_string(seconds) + " '" STRATA_BENCH_BIN "' " + args +
                          " 2>'" + err_path + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream f(err_path);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());
  return r;
}

}  // namespace strata::test
