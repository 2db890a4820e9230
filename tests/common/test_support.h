// SPDX-License-Identifier: Apache-2.0
// Helpers shared by every test directory (tests/CMakeLists.txt puts this
// directory on the include path): a temporary directory removed at scope
// exit, a loopback port that nothing listens on, and reaping forked children
// with a deadline so that no test leaves a process behind. Header-only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace strata::test {

/// Whether `part` occurs in `s` (error messages in assertions).
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("strata-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::filesystem::path path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// A 127.0.0.1 port that nothing listens on, for cluster specs and for "the
/// peer never came" cases: bound, read back, released. Preferably one just
/// below the kernel's ephemeral range (as strata-run picks), where no other
/// process's outgoing connection or port-0 listener can take it before the
/// test binds it; else one the kernel picks. -1 when none can be bound.
inline int unused_port() {
  static std::mt19937 rng{std::random_device{}()};
  int lo = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "re")) {
    if (std::fscanf(f, "%d", &lo) != 1) lo = 32768;
    std::fclose(f);
  }
  const int first = std::max(1024, lo - 16384);
  for (int attempt = 0; attempt < 65; ++attempt) {
    const bool preferred = attempt < 64 && first + 256 <= lo;
    if (attempt < 64 && !preferred) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(preferred ? static_cast<uint16_t>(std::uniform_int_distribution<int>(first, lo - 1)(rng)) : 0);
    socklen_t len = sizeof a;
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    if (port > 0) return port;
  }
  return -1;
}

/// Where a process that missed its deadline is stuck, for the failure
/// output: each thread's state and kernel wait channel, then every thread's
/// stack from gdb when gdb is installed (.ci/install-deps installs it; the
/// test runs as root in CI, so attaching to a sibling is allowed). Bounded
/// by a 30 s timeout on gdb.
inline std::string thread_report(pid_t pid) {
  const auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  std::string out = "--- [test] pid " + std::to_string(pid) + " still running at its deadline; threads:\n";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const std::string stat = slurp(t.path() / "stat");
    const auto close = stat.rfind(')');  // "tid (comm) S ...": keep up to the state letter
    out += "  tid " + t.path().filename().string() + " " +
           stat.substr(0, close == std::string::npos ? 0 : close + 3) + " wchan " + slurp(t.path() / "wchan") + "\n";
  }
  if (::access("/usr/bin/gdb", X_OK) != 0) return out + "(no /usr/bin/gdb: no stacks)\n";
  const std::string cmd =
      "timeout 30 /usr/bin/gdb -p " + std::to_string(pid) + " -batch -nx -ex 'thread apply all bt' 2>&1";
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ::pclose(f);
  }
  return out;
}

/// Wait for child `pid` up to `ms`; kill and reap it on timeout (after
/// printing thread_report to stderr). Returns its exit status (128 when a
/// signal ended it), or -1 when it had to be killed.
inline int reap(pid_t pid, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "%s", thread_report(pid).c_str());
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

/// The whole text of file `path` ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// This test binary's own path (to start it again as a child role).
inline std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

/// Fork and exec `argv` (argv[0] a path) with stdout and stderr to `log`,
/// this process's environment less `unset`, plus `env`; the child dies with
/// the test (PR_SET_PDEATHSIG). Returns its pid; reap it (reap()).
inline pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                   const std::string& log, const std::vector<std::string>& unset = {}) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    for (const auto& k : unset) ::unsetenv(k.c_str());
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

/// Runs `argv` (argv[0] a path) to its end within `deadline_s`, with this
/// process's environment less the variables in `unset`, plus `env`; the
/// child dies with the test (PR_SET_PDEATHSIG). Returns {exit code (as
/// reap), its stdout and stderr}.
inline std::pair<int, std::string> run_to_end(const std::vector<std::string>& argv,
                                              const std::map<std::string, std::string>& env, int deadline_s,
                                              const std::vector<std::string>& unset = {"TF_CONFIG"}) {
  TempDir dir;
  const std::string out = dir.str() + "/out.log";
  const pid_t pid = spawn(argv, env, out, unset);
  const int code = reap(pid, deadline_s * 1000);
  return {code, read_text(out)};
}

/// Kills (waking a stopped one first) and reaps every child it holds on
/// every path out of a test.
struct Children {
  std::vector<pid_t> pids;
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    for (pid_t p : pids) {
      ::kill(p, SIGCONT);
      ::kill(p, SIGKILL);
      int st;
      ::waitpid(p, &st, 0);
    }
  }
};

}  // namespace strata::test
