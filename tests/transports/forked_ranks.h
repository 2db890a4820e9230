// SPDX-License-Identifier: Apache-2.0
// Ranks as forked processes for the transport tests: the test process is
// rank 0 and serves the TCP rendezvous store; ranks 1..world-1 are children
// that connect to it (20 s deadline) and run the test's function. Children
// are held in a test::Children, so they are killed and reaped on every path.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "strata/plugin_host.hpp"
#include "strata/store.hpp"
#include "test_support.h"

namespace strata::test {

/// fn(host, rank) in a child process per rank 1..world-1; its return value is
/// the child's exit code (0 = pass), an exception exits 1 after printing it.
template <class F>
void forked_ranks(int world, const std::string& store_addr, Children& kids, F fn) {
  for (int rank = 1; rank < world; ++rank) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        PluginHost host;
        StoreConfig c;
        c.address = store_addr;
        c.timeout_s = 20;
        c.auth_token = "tok";
        host.connect_store(c);
        code = fn(host, rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 1;
      }
      ::_exit(code);
    }
    kids.pids.push_back(pid);
  }
}

/// Rank 0's side: serve the store the children connect to.
inline void serve_store(PluginHost& host, const std::string& store_addr) {
  StoreConfig c;
  c.address = store_addr;
  c.serve = true;
  c.auth_token = "tok";
  host.connect_store(c);
}

/// A whole world of processes: ranks 1..world-1 forked (forked_ranks), rank 0
/// here over a host that serves the store; expects body to return 0 on every
/// rank, each child reaped within 30 s. Then after(host), if given, while the
/// store still serves (the children are gone by then).
template <class F>
void run_forked_world(int world, const std::string& store_addr, F body,
                      const std::function<void(PluginHost&)>& after = nullptr) {
  Children kids;
  forked_ranks(world, store_addr, kids, body);
  if (::testing::Test::HasFatalFailure()) return;
  PluginHost host;
  serve_store(host, store_addr);
  EXPECT_EQ(body(host, 0), 0);
  for (size_t i = 0; i < kids.pids.size(); ++i) EXPECT_EQ(reap(kids.pids[i], 30000), 0) << "rank " << i + 1;
  kids.pids.clear();
  if (after) after(host);
}

}  // namespace strata::test
