// SPDX-License-Identifier: Apache-2.0
// Test helper: run a program with a modified environment, its stdout and
// stderr captured in files (readable while it runs), and every wait bounded
// by a deadline. A Subprocess that is still running when destroyed is
// SIGKILLed and reaped, so no test leaves a process behind on any path.
// Not thread-safe; one object per child.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"  // TempDir

extern char** environ;

namespace strata::test {


inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// True while `pid` exists and is not a zombie.
inline bool process_alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

struct ProcResult {
  int exit_code = -1;    ///< exit status, or -1 when killed by a signal
  int term_signal = 0;   ///< signal that ended it, or 0
  bool timed_out = false;
  std::string out, err;
};

/// Environment edits: name -> value, or nullopt to unset.
using EnvEdits = std::map<std::string, std::optional<std::string>>;

class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const EnvEdits& env) {
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      if (env.count(kv.substr(0, kv.find('='))) == 0) envs.push_back(kv);
    }
    for (const auto& [k, v] : env)
      if (v) envs.push_back(k + "=" + *v);
    std::vector<char*> envp, args;
    for (auto& s : envs) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    out_path_ = dir_.str() + "/out";
    err_path_ = dir_.str() + "/err";
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      const int o = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      const int e = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (o < 0 || e < 0 || ::dup2(o, STDOUT_FILENO) < 0 || ::dup2(e, STDERR_FILENO) < 0) ::_exit(126);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
  }
  ~Subprocess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  std::string out() const { return slurp(out_path_); }
  std::string err() const { return slurp(err_path_); }

  /// Wait up to `timeout_s`; past it the process is SIGKILLed and timed_out set.
  ProcResult wait(double timeout_s) {
    ProcResult r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int status = 0;
    for (;;) {
      pid_t w = ::waitpid(pid_, &status, WNOHANG);
      if (w == pid_) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        r.timed_out = true;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped_ = true;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
    r.out = out();
    r.err = err();
    return r;
  }

 private:
  TempDir dir_;
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

/// Run to completion (bounded by `timeout_s`).
inline ProcResult run_program(const std::vector<std::string>& argv, const EnvEdits& env, double timeout_s = 60) {
  Subprocess p(argv, env);
  return p.wait(timeout_s);
}

}  // namespace strata::test
