// SPDX-License-Identifier: Apache-2.0
// strata-run: start N local processes of one program as a multi-worker job.
//
// Each process gets TF_CONFIG={"cluster": {"worker": [addr0, ...]}, "task":
// {"type": "worker", "index": i}} (ports picked free on --host), the job's
// STRATA_AUTH_TOKEN (random per job unless already set), STRATA_RANK=i and,
// with --config, STRATA_CONFIG=<absolute path>. SLURM_PROCID is removed from
// the children's environment, so that inside a Slurm allocation they resolve
// their cluster from TF_CONFIG rather than as Slurm tasks. Every output line of a child
// is copied whole, prefixed "[<rank>] ", to strata-run's stdout or stderr.
//
// Lifetime: SIGINT/SIGTERM/SIGHUP are forwarded to every child (a second
// one kills them). When a child exits non-zero or by a signal, the others
// get SIGTERM, then SIGKILL after --grace seconds, and strata-run exits with
// that child's code (128+signal for a signal). --timeout stops the job the
// same way and exits 124. Children carry PR_SET_PDEATHSIG=SIGKILL, so none
// survives strata-run itself being killed.
//
// Single-threaded by design: PR_SET_PDEATHSIG is tied to the thread that
// forked, and one poll() loop over the children's pipes and a signalfd keeps
// output lines whole without locks.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 64 * 1024;  // longer lines are split, so memory stays bounded
constexpr auto kDrainAfterExit = std::chrono::seconds(2);

struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int e) { return std::strerror(e); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// ---- setup ----------------------------------------------------------------

/// Picks `n` distinct free TCP ports on `host`: all probe sockets stay bound
/// until every port is chosen, so the kernel cannot hand out one twice.
std::vector<uint16_t> pick_ports(const std::string& host, int n) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &res); rc != 0)
    throw RunError("cannot resolve --host '" + host + "': " + gai_strerror(rc) +
                   "; pass an address of this machine such as 127.0.0.1");
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, &::freeaddrinfo);
  std::vector<int> fds;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  std::vector<uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    int last_errno = 0;
    bool bound = false;
    // A bind to port 0 only fails when the ephemeral range is momentarily
    // exhausted; a few retries ride that out.
    for (int attempt = 0; attempt < 5 && !bound; ++attempt) {
      int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last_errno = errno;
        continue;
      }
      if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
        last_errno = errno;
        ::close(fd);
        ::usleep(10000);
        continue;
      }
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        last_errno = errno;
        ::close(fd);
        continue;
      }
      fds.push_back(fd);
      ports.push_back(ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                     : reinterpret_cast<sockaddr_in*>(&ss)->sin_port));
      bound = true;
    }
    if (!bound) {
      close_all();
      throw RunError("cannot find a free TCP port on '" + host + "' (" + errno_text(last_errno) +
                     "); check --host is an address of this machine");
    }
  }
  close_all();
  return ports;
}

std::string random_token() {
  unsigned char bytes[16];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RunError("cannot open /dev/urandom for the auth token: " + errno_text(errno));
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t r = ::read(fd, bytes + got, sizeof bytes - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      throw RunError("cannot read /dev/urandom for the auth token; set STRATA_AUTH_TOKEN yourself");
    }
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

std::string format_address(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// ---- children -------------------------------------------------------------

/// Whole-line forwarding of one child stream with the rank prefix.
struct Stream {
  int fd = -1;
  int out_fd = 1;
  std::string buf;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int code = 0;  // exit code, or 128+signal
  Stream out, err;
};

/// write() all of `data` to `fd`; a closed reader (EPIPE) drops the output.
void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
      continue;
    }
    if (w <= 0) return;
    done += static_cast<std::size_t>(w);
  }
}

void emit_lines(int rank, Stream& s, bool at_eof) {
  const std::string prefix = "[" + std::to_string(rank) + "] ";
  std::string out;
  std::size_t start = 0;
  for (;;) {
    std::size_t nl = s.buf.find('\n', start);
    if (nl == std::string::npos) {
      if (s.buf.size() - start >= kMaxLine || (at_eof && start < s.buf.size())) nl = s.buf.size();
      else break;
      out += prefix + s.buf.substr(start, nl - start) + "\n";
      start = nl;
      break;
    }
    out += prefix + s.buf.substr(start, nl - start + 1);
    start = nl + 1;
  }
  s.buf.erase(0, start);
  if (!out.empty()) write_all(s.out_fd, out);
}

/// Read what is available; at EOF flush the last partial line and close.
void pump(int rank, Stream& s) {
  char chunk[16384];
  for (;;) {
    ssize_t r = ::read(s.fd, chunk, sizeof chunk);
    if (r > 0) {
      s.buf.append(chunk, static_cast<std::size_t>(r));
      emit_lines(rank, s, false);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    emit_lines(rank, s, true);
    ::close(s.fd);
    s.fd = -1;
    return;
  }
}

struct Options {
  int n = 0;
  std::string config;
  double timeout_s = 0;
  double grace_s = 5;
  std::string host = "127.0.0.1";
  std::vector<std::string> command;
};

class Launcher {
 public:
  explicit Launcher(Options opt) : opt_(std::move(opt)) {}

  int run() {
    const std::vector<uint16_t> ports = pick_ports(opt_.host, opt_.n);
    nlohmann::json workers = nlohmann::json::array();
    for (uint16_t p : ports) workers.push_back(format_address(opt_.host, p));
    const char* preset = std::getenv("STRATA_AUTH_TOKEN");
    const std::string token = (preset != nullptr && preset[0] != '\0') ? std::string(preset) : random_token();
    std::string config_path;
    if (!opt_.config.empty()) config_path = std::filesystem::absolute(opt_.config).lexically_normal().string();

    // Block the signals we handle before the first fork so no SIGCHLD is lost;
    // children restore the original mask before exec.
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&mask, s);
    if (::sigprocmask(SIG_BLOCK, &mask, &orig_mask_) != 0)
      throw RunError("sigprocmask failed: " + errno_text(errno));
    sfd_ = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd_ < 0) throw RunError("signalfd failed: " + errno_text(errno));
    // A closed stdout must not kill the launcher and orphan nothing; reset in children.
    ::signal(SIGPIPE, SIG_IGN);

    children_.resize(static_cast<std::size_t>(opt_.n));
    for (int i = 0; i < opt_.n; ++i) {
      nlohmann::json tf = {{"cluster", {{"worker", workers}}}, {"task", {{"type", "worker"}, {"index", i}}}};
      std::vector<std::pair<std::string, std::string>> env = {
          {"TF_CONFIG", tf.dump()}, {"STRATA_AUTH_TOKEN", token}, {"STRATA_RANK", std::to_string(i)}};
      if (!config_path.empty()) env.emplace_back("STRATA_CONFIG", config_path);
      spawn(children_[static_cast<std::size_t>(i)], i, env);
      if (stopping_) break;  // a spawn failed; stop the ones already running
    }
    loop();
    ::close(sfd_);
    return exit_code_;
  }

 private:
  void spawn(Child& c, int rank, const std::vector<std::pair<std::string, std::string>>& vars) {
    c.rank = rank;
    // Everything the child needs is built before fork: after it only
    // async-signal-safe calls are made.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      bool replaced = std::any_of(vars.begin(), vars.end(), [&](const auto& v) { return v.first == key; });
      // Inside a Slurm allocation the children would otherwise inherit
      // strata-run's own SLURM_PROCID, and cluster auto-detection (slurm
      // before tf_config) would place every child at strata-run's rank
      // instead of the TF_CONFIG task given here.
      if (!replaced && key != "SLURM_PROCID") env_strings.push_back(std::move(kv));
    }
    for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = opt_.command;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw RunError("pipe failed: " + errno_text(errno));
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ::close(out[0]);
      ::close(out[1]);
      throw RunError("pipe failed: " + errno_text(errno));
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(128 + SIGKILL);  // the launcher died before prctl took effect
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      if (rank != 0) {
        // Only rank 0 reads the terminal, as with mpirun.
        int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      }
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &orig_mask_, nullptr);
      ::execvpe(argv[0], argv.data(), envp.data());
      const int e = errno;
      const char* msg1 = "strata-run: cannot start '";
      ::write(STDERR_FILENO, msg1, std::strlen(msg1));
      ::write(STDERR_FILENO, argv[0], std::strlen(argv[0]));
      const char* msg2 = "': ";
      ::write(STDERR_FILENO, msg2, std::strlen(msg2));
      const char* reason = ::strerror(e);
      ::write(STDERR_FILENO, reason, std::strlen(reason));
      ::write(STDERR_FILENO, "\n", 1);
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      const int e = errno;
      ::close(out[0]);
      ::close(err[0]);
      c.exited = true;
      std::cerr << "strata-run: cannot start rank " << rank << ": fork failed: " << errno_text(e) << std::endl;
      exit_code_ = 1;
      stop_all(SIGTERM);
      return;
    }
    c.pid = pid;
    c.out.fd = out[0];
    c.out.out_fd = STDOUT_FILENO;
    c.err.fd = err[0];
    c.err.out_fd = STDERR_FILENO;
    ::fcntl(c.out.fd, F_SETFL, ::fcntl(c.out.fd, F_GETFL) | O_NONBLOCK);
    ::fcntl(c.err.fd, F_SETFL, ::fcntl(c.err.fd, F_GETFL) | O_NONBLOCK);
  }

  std::size_t alive() const {
    return static_cast<std::size_t>(std::count_if(children_.begin(), children_.end(),
                                                  [](const Child& c) { return c.pid > 0 && !c.exited; }));
  }

  void signal_all(int sig) {
    for (const Child& c : children_)
      if (c.pid > 0 && !c.exited) ::kill(c.pid, sig);
  }

  void stop_all(int sig) {
    stopping_ = true;
    signal_all(sig);
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(opt_.grace_s));
  }

  void on_exit(Child& c, int status) {
    c.exited = true;
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (c.code == 0 || stopping_) return;
    const std::string how = WIFEXITED(status) ? "exited with code " + std::to_string(c.code)
                                              : "was killed by " + signal_name(WTERMSIG(status));
    std::cerr << "strata-run: rank " << c.rank << " (pid " << c.pid << ") failed first: it " << how;
    if (alive() > 0) std::cerr << "; stopping the other " << alive() << " running process(es)";
    std::cerr << std::endl;
    exit_code_ = c.code;
    stop_all(SIGTERM);
  }

  void reap() {
    for (Child& c : children_) {
      if (c.pid <= 0 || c.exited) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid) on_exit(c, status);
    }
  }

  void on_signal(int sig) {
    if (!stopping_) {
      std::cerr << "strata-run: received " << signal_name(sig) << "; forwarding it to " << alive()
                << " process(es)" << std::endl;
      exit_code_ = 128 + sig;
      stop_all(sig);
    } else {
      std::cerr << "strata-run: received " << signal_name(sig) << " while stopping; killing " << alive()
                << " process(es)" << std::endl;
      signal_all(SIGKILL);
    }
  }

  void loop() {
    std::optional<Clock::time_point> timeout;
    if (opt_.timeout_s > 0)
      timeout = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.timeout_s));
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      const bool all_exited = alive() == 0;
      std::vector<pollfd> fds{{sfd_, POLLIN, 0}};
      std::vector<Stream*> streams;
      for (Child& c : children_)
        for (Stream* s : {&c.out, &c.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back(s);
          }
      if (all_exited) {
        if (streams.empty()) return;
        // A grandchild may hold a pipe open; give it a moment, not forever.
        if (!drain_deadline) drain_deadline = Clock::now() + kDrainAfterExit;
        if (Clock::now() >= *drain_deadline) {
          for (Child& c : children_)
            for (Stream* s : {&c.out, &c.err})
              if (s->fd >= 0) {
                emit_lines(c.rank, *s, true);
                ::close(s->fd);
                s->fd = -1;
              }
          return;
        }
      }
      auto next = Clock::now() + std::chrono::seconds(1);
      if (timeout && !stopping_) next = std::min(next, *timeout);
      if (kill_deadline_) next = std::min(next, *kill_deadline_);
      if (drain_deadline) next = std::min(next, *drain_deadline);
      const auto wait_ms = std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1);
      int n = ::poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
      if (n < 0 && errno != EINTR) throw RunError("poll failed: " + errno_text(errno));
      if (n > 0) {
        if (fds[0].revents & POLLIN) {
          signalfd_siginfo si;
          while (::read(sfd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
            if (si.ssi_signo == SIGCHLD) reap();
            else on_signal(static_cast<int>(si.ssi_signo));
          }
        }
        for (std::size_t i = 0; i < streams.size(); ++i)
          if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
            for (Child& c : children_)
              if (&c.out == streams[i] || &c.err == streams[i]) pump(c.rank, *streams[i]);
          }
      }
      reap();  // SIGCHLD coalesces; a periodic check keeps no exit unnoticed
      const auto now = Clock::now();
      if (timeout && !stopping_ && now >= *timeout) {
        std::cerr << "strata-run: timeout: the job ran longer than --timeout " << opt_.timeout_s
                  << " s; stopping " << alive() << " process(es)" << std::endl;
        exit_code_ = 124;
        stop_all(SIGTERM);
      }
      if (kill_deadline_ && now >= *kill_deadline_) {
        if (alive() > 0)
          std::cerr << "strata-run: " << alive() << " process(es) still running " << opt_.grace_s
                    << " s after SIGTERM; sending SIGKILL" << std::endl;
        signal_all(SIGKILL);
        kill_deadline_.reset();
      }
    }
  }

  Options opt_;
  std::vector<Child> children_;
  sigset_t orig_mask_{};
  int sfd_ = -1;
  bool stopping_ = false;
  int exit_code_ = 0;
  std::optional<Clock::time_point> kill_deadline_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "strata-run: start N local processes of PROGRAM as one multi-worker Strata job.\n\n"
      "Each process gets TF_CONFIG (a worker cluster on free ports of --host, task index = rank),\n"
      "STRATA_AUTH_TOKEN (random per job unless already set), STRATA_RANK and, with --config,\n"
      "STRATA_CONFIG; SLURM_PROCID is removed so that, inside a Slurm allocation, they resolve\n"
      "their cluster from TF_CONFIG. Output lines are prefixed \"[<rank>] \". SIGINT/SIGTERM/SIGHUP are\n"
      "forwarded.\n"
      "When a process fails the others are stopped (SIGTERM, then SIGKILL after --grace) and\n"
      "strata-run exits with its code (128+signal for a signal); --timeout exits 124.\n\n"
      "Example:\n"
      "  strata-run -n 4 --config job.json -- strata-train --steps 100\n"
      "  strata-run -n 2 --timeout 600 -- ./my_trainer --batch 64"};
  Options opt;
  app.add_option("-n,--num-processes", opt.n, "number of processes to start")->required()->check(CLI::Range(1, 4096));
  app.add_option("--config", opt.config, "job config (JSON) passed to every process as STRATA_CONFIG")
      ->check(CLI::ExistingFile);
  app.add_option("--timeout", opt.timeout_s, "stop the job and exit 124 after S seconds (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", opt.grace_s, "seconds between SIGTERM and SIGKILL when stopping (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--host", opt.host, "address the processes listen on (default 127.0.0.1)");
  app.add_option("command", opt.command, "PROGRAM ARGS... (after --)")->required();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);

  try {
    return Launcher(std::move(opt)).run();
  } catch (const std::exception& e) {
    std::cerr << "strata-run: " << e.what() << std::endl;
    return 1;
  }
}
