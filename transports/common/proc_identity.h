// SPDX-License-Identifier: Apache-2.0
// ProcId: who a process on this host is (boot id, pid, start time), and
// whether it is gone, for transports whose provider or medium never reports
// a dead peer (libfabric's shm provider, Strata's own shared memory). A pid
// alone is not enough: pids are reused, so the start time (clock ticks since
// boot, /proc/<pid>/stat field 22) must match too. Header-only.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/error.hpp"

namespace strata::transport {

inline std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

/// State letter and start time of process `pid` from /proc/<pid>/stat;
/// false when there is no such process.
inline bool proc_stat(long pid, char* state, unsigned long long* start) {
  const std::string s = read_first_line(::strata::detail::str_cat("/proc/", pid, "/stat").c_str());
  const size_t paren = s.rfind(')');
  if (s.empty() || paren == std::string::npos) return false;
  std::istringstream in(s.substr(paren + 1));
  std::string tok;
  std::vector<std::string> f;
  while (in >> tok && f.size() < 20) f.push_back(tok);
  if (f.size() < 20) return false;
  *state = f[0].empty() ? '?' : f[0][0];
  *start = std::strtoull(f[19].c_str(), nullptr, 10);  // field 22 of proc(5)
  return true;
}

struct ProcId {
  std::string boot_id;
  long pid = 0;
  unsigned long long start = 0;
};

/// This process: boot id (or "host:<hostname>" where /proc has none), pid,
/// start time.
inline ProcId self_proc() {
  ProcId p;
  p.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  if (p.boot_id.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    p.boot_id = ::strata::detail::str_cat("host:", host);
  }
  p.pid = static_cast<long>(::getpid());
  char st;
  proc_stat(p.pid, &st, &p.start);
  return p;
}

/// "" = alive (or unknown); otherwise why the process is gone.
inline std::string proc_gone(const ProcId& p) {
  char state = '?';
  unsigned long long start = 0;
  if (!proc_stat(p.pid, &state, &start))
    return ::strata::detail::str_cat("its process (pid ", p.pid, " on this host) has exited");
  if (state == 'Z' || state == 'X')
    return ::strata::detail::str_cat("its process (pid ", p.pid, " on this host) has died");
  if (p.start != 0 && start != p.start)
    return ::strata::detail::str_cat("its process (pid ", p.pid,
                                     " on this host) has exited (the pid now belongs to another process)");
  return "";
}

}  // namespace strata::transport
