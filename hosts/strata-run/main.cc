// SPDX-License-Identifier: Apache-2.0
// strata-run: start N local processes of one program as a multi-worker job.
//
// Each process gets TF_CONFIG={"cluster": {"worker": [addr0, ...]}, "task":
// {"type": "worker", "index": i}} (free ports on --host, just below the
// kernel's ephemeral range when there is room: see pick_ports), the job's
// STRATA_AUTH_TOKEN (random per job unless already set), STRATA_RANK=i,
// STRATA_TRACE_DIR=<absolute dir> and, with --config,
// STRATA_CONFIG=<absolute path>. SLURM_PROCID is removed from
// the children's environment, so that inside a Slurm allocation they resolve
// their cluster from TF_CONFIG rather than as Slurm tasks. Every output line of a child
// is copied whole, prefixed "[<rank>] ", to strata-run's stdout or stderr.
//
// Parameter-server jobs: --chief C --workers N --ps M (instead of -n) start
// C + N + M processes (ranks in that order) with TF_CONFIG's cluster
// {"chief": [...], "worker": [...], "ps": [...]} and each its own task; their
// lines are prefixed with the role, "[worker 1] ", "[ps 0] ". The program
// runs as every role: the chief runs strata::ClusterCoordinator, the others
// strata::Server::from_env().join() (see strata/coordinator.hpp).
// A worker task that fails does not stop such a job: the coordinator runs
// its closures on the other workers, and with --restart-workers N
// strata-run starts it again in place (same task, same address) after
// --restart-delay seconds, up to N times per worker, so that it rejoins.
// A chief or ps failure stops the job as below.
//
// Lifetime: SIGINT/SIGTERM/SIGHUP are forwarded to every child (a second
// one kills them). When a child exits non-zero or by a signal, the others
// get --settle seconds (10) to fail by themselves, so that they diagnose the fault
// and write their verdict, then SIGTERM, then SIGKILL after --grace
// seconds, and strata-run exits with
// that child's code (128+signal for a signal). --timeout stops the job the
// same way and exits 124. Children carry PR_SET_PDEATHSIG=SIGKILL, so none
// survives strata-run itself being killed. A child stopped by a signal
// (SIGSTOP, SIGTSTP) still counts as running: it ignores SIGTERM until
// continued, so it ends at the SIGKILL.
//
// Failure summary: the first child to exit non-zero is only the first to
// notice; after a stall that is a healthy rank. So once every child is gone,
// a failed job's summary gives the verdict the ranks agreed on, read from the
// trace files (rank-<rank>.json, see hosts/strata-info/trace_file.h) the
// ring writes into STRATA_TRACE_DIR when a collective fails, and names the
// children that were stopped when the job failed. The trace directory is
// --trace-dir, else $STRATA_TRACE_DIR, else ${TMPDIR:-/tmp}/strata-run-<pid>,
// which strata-run creates and removes again unless a failed job left trace
// files in it; a directory the user named is never removed.
//
// Restarts (--max-restarts N, as torchrun's --max-restarts): a job that
// failed (a child exited non-zero or by a signal) is stopped and summarized
// exactly as above, and then, while fewer than N restarts happened, started
// again whole after --restart-delay seconds: every rank, new free ports (none
// that an earlier attempt of this run used, so no lingering socket of the
// previous attempt can clash, and a fresh rendezvous), the same auth token.
// Children see STRATA_RESTART_COUNT (0, 1, ...) and STRATA_MAX_RESTARTS (as
// TORCHELASTIC_RESTART_COUNT / _MAX_RESTARTS); the program must resume from
// its own latest checkpoint (strata::BackupAndRestore does). Never restarted:
// a success, --timeout (which covers all attempts together, delays
// included), SIGINT/SIGTERM/SIGHUP to strata-run (also during the delay), a
// failure to fork. With restarts exhausted strata-run exits with the last
// attempt's code. The restart line names the reason with the summary's
// logic: the verdict most ranks agreed on, else the first rank to exit. The
// children's STRATA_TRACE_DIR stays the same; the trace files of a failed
// attempt that is restarted are moved to <trace dir>/attempt-<k>/ (k = its
// STRATA_RESTART_COUNT) before the next starts, so the directory itself
// always holds the latest attempt's traces. A default directory with
// attempt-* traces is kept even when the job succeeds at last.
// Under Slurm the same is `sbatch --requeue` (Slurm starts the batch script
// again after a node failure or preemption, or after `scontrol requeue
// $SLURM_JOB_ID`, and sets SLURM_RESTART_COUNT) with the same program-side
// resume from the latest checkpoint.
//
// Single-threaded by design: PR_SET_PDEATHSIG is tied to the thread that
// forked, and one poll() loop over the children's pipes and a signalfd keeps
// output lines whole without locks.
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "trace_file.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 64 * 1024;  // longer lines are split, so memory stays bounded
constexpr auto kDrainAfterExit = std::chrono::seconds(2);
// How long the other processes may take to report a failure themselves
// (diagnose it and exit) before strata-run stops them.
// Longer than the ring's default diagnosis window (diagnosis_timeout_s, 5 s):
// with the window equal to it, survivors on a loaded machine were stopped
// while still agreeing on the culprit and left no verdict (seen once in CI).
// Survivors that finish sooner end the wait sooner; so does a job whose only
// processes left are stopped (SIGSTOP), which cannot fail by themselves.
// The default of --settle.
constexpr double kSettleS = 10;

struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int e) { return std::strerror(e); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// ---- setup ----------------------------------------------------------------

/// The ports strata-run prefers, [first, last): just below the kernel's
/// ephemeral range (net.ipv4.ip_local_port_range, where bind(port 0) and
/// every outgoing connection take their local port). A port picked there and
/// released until the chief binds it cannot be taken meanwhile by some
/// process's outgoing connection or port-0 listener (which is how a picked
/// port was sometimes "already in use" when the chief's store started on a
/// busy machine); only an explicit bind to that very port could. Empty when
/// the ephemeral range leaves no room below it.
std::pair<int, int> preferred_port_range() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "re")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    std::fclose(f);
  }
  const int first = std::max(1024, lo - 16384);
  return first + 256 <= lo ? std::make_pair(first, lo) : std::make_pair(0, 0);
}

/// Binds a probe socket to `port` (0: the kernel picks) on `ai`; the fd and
/// the bound port, or -1 with errno set.
int bind_probe(const addrinfo* ai, uint16_t port, uint16_t* bound) {
  sockaddr_storage ss{};
  std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
  if (ss.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
  else
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t len = ai->ai_addrlen;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  *bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

/// Picks `n` distinct free TCP ports on `host`, none of them in `avoid`,
/// preferably below the ephemeral range (preferred_port_range), else from
/// the kernel (port 0). All probe sockets stay bound until every port is
/// chosen, so none is handed out twice, and a port in `avoid` stays bound
/// too, so that the kernel moves on to another.
std::vector<uint16_t> pick_ports(const std::string& host, int n, const std::set<uint16_t>& avoid) {
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
  const auto [pref_first, pref_last] = preferred_port_range();
  std::random_device rd;
  std::mt19937 rng(rd());
  for (int i = 0; i < n; ++i) {
    int last_errno = 0;
    bool bound = false;
    // A preferred port is taken by a probe bound to it; one in use (or in
    // `avoid`) costs a try, and 64 misses give way to the kernel's choice.
    for (int tries = 0; pref_last > pref_first && tries < 64 && !bound; ++tries) {
      const auto want = static_cast<uint16_t>(std::uniform_int_distribution<int>(pref_first, pref_last - 1)(rng));
      if (avoid.count(want) != 0 || std::find(ports.begin(), ports.end(), want) != ports.end()) continue;
      uint16_t port = 0;
      const int fd = bind_probe(res, want, &port);
      if (fd < 0) continue;
      fds.push_back(fd);
      ports.push_back(port);
      bound = true;
    }
    // A bind to port 0 only fails when the ephemeral range is momentarily
    // exhausted; a few retries ride that out. A port to avoid is no failed
    // attempt: it stays held, so each comes back at most once.
    for (int attempt = 0; attempt < 5 && !bound;) {
      uint16_t port = 0;
      const int fd = bind_probe(res, 0, &port);
      if (fd < 0) {
        last_errno = errno;
        ::usleep(10000);
        ++attempt;
        continue;
      }
      fds.push_back(fd);
      if (avoid.count(port) != 0) continue;
      ports.push_back(port);
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

// ---- GPUs (--gpus) ----------------------------------------------------------

/// The CUDA devices strata-run itself sees (within its CUDA_VISIBLE_DEVICES),
/// counted through the driver, which is opened at run time so that
/// strata-run starts where there is none; 0 without a driver or a device.
/// The children exec right after fork, so initialising CUDA here is safe.
int cuda_device_count() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  const auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  const auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) n = 0;
  return n;  // the driver stays loaded: unloading an initialised driver is not supported
}

std::vector<std::string> split_gpu_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string id;
  while (std::getline(in, id, ',')) out.push_back(id);
  if (!list.empty() && list.back() == ',') out.emplace_back();
  return out;
}

/// "" when `spec` is a valid --gpus value, else why not.
std::string check_gpus_spec(const std::string& spec) {
  if (spec == "auto" || spec == "all" || spec == "none") return "";
  if (spec.empty()) return "--gpus must be auto, all, none or a list of GPU ids like 0,1,2,3; got an empty string";
  std::set<std::string> seen;
  for (const std::string& id : split_gpu_list(spec)) {
    const bool ok = !id.empty() && std::all_of(id.begin(), id.end(), [](unsigned char c) {
      return std::isalnum(c) != 0 || c == '-';
    });
    if (!ok)
      return "--gpus: '" + id + "' in '" + spec +
             "' is not a GPU id: list CUDA device numbers or UUIDs (as nvidia-smi -L prints them) separated by "
             "commas, e.g. --gpus 0,1,2,3";
    if (!seen.insert(id).second) return "--gpus: GPU '" + id + "' is listed twice in '" + spec + "'";
  }
  return "";
}

/// What each process of a -n job sees: CUDA_VISIBLE_DEVICES per rank (empty:
/// the environment is left alone) and whether ranks share a GPU.
struct GpuPlan {
  std::vector<std::string> visible;
  bool shared = false;
  std::string summary;  // printed once when the environment is set
};

/// Every process gets its own GPUs when there are at least as many as
/// processes (the same number each, consecutive ids: with 8 GPUs and 4
/// processes rank 1 sees 2,3), as one GPU per process is what NCCL needs;
/// with fewer GPUs than processes, rank i gets GPU i mod G and they share.
GpuPlan plan_gpus(const std::string& spec, int n) {
  GpuPlan p;
  if (spec == "all") return p;
  if (spec == "none") {
    p.visible.assign(static_cast<std::size_t>(n), "");
    p.summary = "strata-run: --gpus none: no process sees a GPU (CUDA_VISIBLE_DEVICES is empty)";
    return p;
  }
  std::vector<std::string> ids;
  if (spec == "auto") {
    const int count = cuda_device_count();
    if (count == 0) return p;
    const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
    if (cvd != nullptr && cvd[0] != '\0' && check_gpus_spec(cvd).empty()) {
      ids = split_gpu_list(cvd);
      if (ids.size() > static_cast<std::size_t>(count)) ids.resize(static_cast<std::size_t>(count));
    } else {
      for (int g = 0; g < count; ++g) ids.push_back(std::to_string(g));
    }
  } else {
    ids = split_gpu_list(spec);
  }
  const auto g = static_cast<int>(ids.size());
  std::ostringstream line;
  line << "strata-run: GPUs (CUDA_VISIBLE_DEVICES):";
  if (g >= n) {
    const int k = g / n;
    for (int r = 0; r < n; ++r) {
      std::string v;
      for (int j = 0; j < k; ++j) v += (j > 0 ? "," : "") + ids[static_cast<std::size_t>(r * k + j)];
      p.visible.push_back(v);
      line << " rank " << r << " -> " << v << (r + 1 < n ? ";" : "");
    }
    if (g % n != 0) line << " (" << g % n << " of " << g << " GPUs unused: every process gets the same number)";
  } else {
    p.shared = true;
    for (int r = 0; r < n; ++r) p.visible.push_back(ids[static_cast<std::size_t>(r % g)]);
    line << " " << n << " processes share " << g << " GPU(s), rank r gets GPU r mod " << g
         << "; NCCL needs a GPU of its own per process, so multi_worker_mirrored's AUTO communication uses RING "
            "(STRATA_GPUS_SHARED=1)";
  }
  p.summary = line.str();
  return p;
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
  std::string label;  // output prefix: the rank, or "worker 1" in a parameter-server job
  pid_t pid = -1;
  bool exited = false;
  int code = 0;  // exit code, or 128+signal
  int stop_signal = 0;             // the signal it is stopped by, 0 while it runs
  int stop_signal_at_failure = 0;  // stop_signal when the job began to stop
  Stream out, err;
  // A parameter-server job's worker task: its failure does not stop the
  // job; it may be started again (with `env`) at `respawn_at`.
  bool ps_worker = false;
  int restarts = 0;
  std::vector<std::pair<std::string, std::string>> env;
  std::optional<std::chrono::steady_clock::time_point> respawn_at;
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

void emit_lines(const std::string& label, Stream& s, bool at_eof) {
  const std::string prefix = "[" + label + "] ";
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
void pump(const std::string& label, Stream& s) {
  char chunk[16384];
  for (;;) {
    ssize_t r = ::read(s.fd, chunk, sizeof chunk);
    if (r > 0) {
      s.buf.append(chunk, static_cast<std::size_t>(r));
      emit_lines(label, s, false);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    emit_lines(label, s, true);
    ::close(s.fd);
    s.fd = -1;
    return;
  }
}

struct Options {
  int n = 0;
  // A parameter-server job (--chief/--workers/--ps): n = chief + workers + ps.
  bool ps_job = false;
  int chief = 1, workers = 0, ps = 0;
  std::string config;
  double timeout_s = 0;
  double grace_s = 5;
  // How long the others may take to fail by themselves after the first
  // failure (--settle).
  double settle_s = kSettleS;
  std::string host = "127.0.0.1";
  std::string trace_dir;  // --trace-dir, empty when not given
  int max_restarts = 0;
  double restart_delay_s = 1;
  int restart_workers = 0;  // parameter-server jobs: restarts of each failed worker task
  std::string gpus = "auto";  // --gpus: auto, all, none or a list of GPU ids
  std::vector<std::string> command;
};

/// The directory the children write their failure traces into.
struct TraceDir {
  std::filesystem::path path;  // absolute
  bool own = false;            // created by strata-run, so removed by it
  // rank-*.json already there before the job (a user directory of an
  // earlier job): identity and mtime, so that only this job's files count.
  std::map<std::string, std::pair<ino_t, struct timespec>> before;
};

std::optional<std::pair<ino_t, struct timespec>> file_identity(const std::filesystem::path& p) {
  struct stat st{};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(st.st_ino, st.st_mtim);
}

/// Identity of every rank-*.json now in `dir`.
std::map<std::string, std::pair<ino_t, struct timespec>> snapshot_trace_files(const std::filesystem::path& dir) {
  std::map<std::string, std::pair<ino_t, struct timespec>> out;
  for (const auto& f : strata::trace::list_trace_files(dir))
    if (auto id = file_identity(f)) out[f.string()] = *id;
  return out;
}

/// Resolve (and create) the trace directory: --trace-dir, else
/// $STRATA_TRACE_DIR, else a fresh ${TMPDIR:-/tmp}/strata-run-<pid>.
TraceDir make_trace_dir(const std::string& option) {
  TraceDir td;
  const char* env = std::getenv("STRATA_TRACE_DIR");
  const bool from_option = !option.empty();
  const std::string given = from_option ? option : (env != nullptr ? env : "");
  std::error_code ec;
  if (!given.empty()) {
    const std::string origin = from_option ? "--trace-dir" : "STRATA_TRACE_DIR";
    td.path = std::filesystem::absolute(given, ec).lexically_normal();
    if (!ec) std::filesystem::create_directories(td.path, ec);
    if (ec || !std::filesystem::is_directory(td.path) || ::access(td.path.c_str(), W_OK | X_OK) != 0)
      throw RunError("cannot use the trace directory '" + given + "' (from " + origin + "): " +
                     (ec ? ec.message() : "it is not a writable directory") +
                     "; pass --trace-dir with a directory strata-run can create and write");
    td.before = snapshot_trace_files(td.path);
    if (!td.before.empty())
      std::cerr << "strata-run: the trace directory " << td.path.string() << " (" << origin << ") already holds "
                << td.before.size()
                << " rank-*.json file(s) of an earlier job; this job's summary ignores them, but strata-info trace "
                   "reads every file there, so remove them or choose another directory"
                << std::endl;
    return td;
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path base =
      std::filesystem::absolute(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp", ec).lexically_normal();
  // Never adopt an existing directory: its contents would be removed with ours.
  const std::string stem = "strata-run-" + std::to_string(::getpid());
  for (int attempt = 0; attempt < 100; ++attempt) {
    td.path = base / (attempt == 0 ? stem : stem + "-" + std::to_string(attempt));
    if (::mkdir(td.path.c_str(), 0700) == 0) {
      td.own = true;
      return td;
    }
    if (errno != EEXIST) break;
  }
  throw RunError("cannot create a trace directory in " + base.string() + " (" + errno_text(errno) +
                 "); set TMPDIR to a writable directory or pass --trace-dir DIR");
}

/// This job's trace files: those not in the directory before it started, or
/// rewritten since.
std::vector<std::filesystem::path> job_trace_files(const TraceDir& td) {
  std::vector<std::filesystem::path> out;
  for (const auto& f : strata::trace::list_trace_files(td.path)) {
    auto it = td.before.find(f.string());
    const auto now = file_identity(f);
    if (it == td.before.end() || !now || now->first != it->second.first ||
        now->second.tv_sec != it->second.second.tv_sec || now->second.tv_nsec != it->second.second.tv_nsec)
      out.push_back(f);
  }
  return out;
}

class Launcher {
 public:
  explicit Launcher(Options opt) : opt_(std::move(opt)) {}

  int run() {
    std::vector<uint16_t> ports = pick_ports(opt_.host, opt_.n, used_ports_);
    trace_ = make_trace_dir(opt_.trace_dir);
    try {
      prepare();
      if (!opt_.ps_job) {
        gpus_ = plan_gpus(opt_.gpus, opt_.n);
        if (!gpus_.summary.empty()) std::cerr << gpus_.summary << std::endl;
      }
      for (int attempt = 0;; ++attempt) {
        // Never a port an earlier attempt used: its sockets may linger
        // (TIME_WAIT, a listener bound with SO_REUSEADDR) or a grandchild
        // may still hold one.
        if (attempt > 0) ports = pick_ports(opt_.host, opt_.n, used_ports_);
        used_ports_.insert(ports.begin(), ports.end());
        if (attempt > 0)
          std::cerr << "strata-run: starting attempt " << attempt + 1 << " of " << opt_.max_restarts + 1
                    << " (STRATA_RESTART_COUNT=" << attempt << ")" << std::endl;
        launch(ports, attempt);
        if (!finish_attempt(attempt) || !wait_restart_delay()) break;
      }
    } catch (...) {
      // The job never ran to an end, so its traces, if any, are kept for the user.
      if (trace_.own && !holds_traces()) remove_trace_dir();
      if (sfd_ >= 0) ::close(sfd_);
      throw;
    }
    ::close(sfd_);
    sfd_ = -1;
    if (exit_code_ == 0 && !attempt_dirs_.empty()) {
      std::cerr << "strata-run: the job succeeded after " << attempt_dirs_.size()
                << " failed attempt(s) that left traces; they are kept:";
      for (const auto& d : attempt_dirs_) std::cerr << " strata-info trace " << d.string() << ";";
      std::cerr << std::endl;
    }
    // Kept: a failed job's traces, and those of failed attempts before a
    // success, which the restart lines pointed to.
    if (trace_.own && ((exit_code_ == 0 && attempt_dirs_.empty()) || !holds_traces())) remove_trace_dir();
    return exit_code_;
  }

 private:
  /// Once per run: the signals go to a signalfd from here on, for every
  /// attempt and the delays between them.
  void prepare() {
    token_ = [] {
      const char* preset = std::getenv("STRATA_AUTH_TOKEN");
      return (preset != nullptr && preset[0] != '\0') ? std::string(preset) : random_token();
    }();
    if (!opt_.config.empty()) config_path_ = std::filesystem::absolute(opt_.config).lexically_normal().string();
    if (opt_.timeout_s > 0)
      deadline_ =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.timeout_s));

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
  }

  /// One attempt: start every rank and run until all are gone.
  void launch(const std::vector<uint16_t>& ports, int attempt) {
    children_.assign(static_cast<std::size_t>(opt_.n), Child{});
    stopping_ = false;
    exit_code_ = 0;
    kill_deadline_.reset();
    settle_deadline_.reset();
    first_failure_.reset();

    nlohmann::json workers = nlohmann::json::array();
    for (uint16_t p : ports) workers.push_back(format_address(opt_.host, p));
    // The task of rank i: {"worker", i}, or in a parameter-server job the
    // chiefs, then the workers, then the ps tasks, in rank order.
    auto task_of = [&](int i) -> std::pair<std::string, int> {
      if (!opt_.ps_job) return {"worker", i};
      if (i < opt_.chief) return {"chief", i};
      if (i < opt_.chief + opt_.workers) return {"worker", i - opt_.chief};
      return {"ps", i - opt_.chief - opt_.workers};
    };
    nlohmann::json cluster = {{"worker", workers}};
    if (opt_.ps_job) {
      cluster = nlohmann::json::object();
      for (int i = 0; i < opt_.n; ++i) cluster[task_of(i).first].push_back(workers[static_cast<std::size_t>(i)]);
    }
    for (int i = 0; i < opt_.n; ++i) {
      const auto [type, index] = task_of(i);
      nlohmann::json tf = {{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}};
      children_[static_cast<std::size_t>(i)].label = opt_.ps_job ? type + " " + std::to_string(index) : std::to_string(i);
      std::vector<std::pair<std::string, std::string>> env = {{"TF_CONFIG", tf.dump()},
                                                              {"STRATA_AUTH_TOKEN", token_},
                                                              {"STRATA_RANK", std::to_string(i)},
                                                              {"STRATA_TRACE_DIR", trace_.path.string()},
                                                              {"STRATA_RESTART_COUNT", std::to_string(attempt)},
                                                              {"STRATA_MAX_RESTARTS", std::to_string(opt_.max_restarts)}};
      if (!config_path_.empty()) env.emplace_back("STRATA_CONFIG", config_path_);
      if (!gpus_.visible.empty()) {
        env.emplace_back("CUDA_VISIBLE_DEVICES", gpus_.visible[static_cast<std::size_t>(i)]);
        env.emplace_back("STRATA_GPUS_SHARED", gpus_.shared ? "1" : "0");
      }
      children_[static_cast<std::size_t>(i)].ps_worker = opt_.ps_job && type == "worker";
      children_[static_cast<std::size_t>(i)].env = env;
      spawn(children_[static_cast<std::size_t>(i)], i, env);
      if (stopping_) break;  // a spawn failed; stop the ones already running
    }
    loop();
  }

  /// After every child of `attempt` is gone: the failure summary, then
  /// whether to restart (and the line saying so, or why not).
  bool finish_attempt(int attempt) {
    if (exit_code_ == 0) return false;
    std::vector<std::filesystem::path> files = job_trace_files(trace_);
    const bool may_restart = !interrupted_ && !timed_out_ && !fork_failed_;
    const bool restart = may_restart && attempt < opt_.max_restarts;
    std::filesystem::path shown = trace_.path;
    if (restart && !files.empty()) {
      // Before the summary, so that its strata-info line names where they are.
      shown = trace_.path / ("attempt-" + std::to_string(attempt));
      files = keep_attempt_traces(shown, files);
    }
    const strata::trace::TraceSet set = strata::trace::read_trace_files(files);
    summarize(set, !files.empty(), shown);
    const std::string reason = failure_reason(set);
    if (restart) {
      std::cerr << "strata-run: restarting the job (restart " << attempt + 1 << " of " << opt_.max_restarts << ") in "
                << opt_.restart_delay_s << " s: " << reason << std::endl;
    } else if (opt_.max_restarts > 0) {
      if (may_restart)
        std::cerr << "strata-run: restarts exhausted: attempt " << attempt + 1 << " of " << opt_.max_restarts + 1
                  << " failed too (--max-restarts " << opt_.max_restarts << "): " << reason << "; exiting with code "
                  << exit_code_ << std::endl;
      else
        std::cerr << "strata-run: not restarting the job: "
                  << (timed_out_ ? "--timeout expired" : interrupted_ ? "strata-run was interrupted" : "a fork failed")
                  << std::endl;
    }
    return restart;
  }

  /// --restart-delay, unless the run's --timeout or a signal ends it first
  /// (also one that came while the attempt was summarized, even with no delay).
  bool wait_restart_delay() {
    const auto until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.restart_delay_s));
    for (;;) {
      signalfd_siginfo si;
      while (::read(sfd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        if (si.ssi_signo == SIGCHLD) continue;  // every child of the attempt is reaped already
        std::cerr << "strata-run: received " << signal_name(static_cast<int>(si.ssi_signo))
                  << " during the restart delay; not restarting the job" << std::endl;
        exit_code_ = 128 + static_cast<int>(si.ssi_signo);
        interrupted_ = true;
        return false;
      }
      const auto now = Clock::now();
      if (deadline_ && now >= *deadline_) {
        std::cerr << "strata-run: timeout: the job ran longer than --timeout " << opt_.timeout_s
                  << " s (all attempts together); not restarting it" << std::endl;
        exit_code_ = 124;
        timed_out_ = true;
        return false;
      }
      if (now >= until) return true;
      auto next = until;
      if (deadline_) next = std::min(next, *deadline_);
      const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
      pollfd p{sfd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(wait_ms, 1000))) < 0 && errno != EINTR)
        throw RunError("poll failed: " + errno_text(errno));
    }
  }

  /// Moves a failed attempt's trace files into `dir` (created; rank-*.json
  /// left there by an earlier job are removed, so that the directory holds
  /// one attempt's) and returns where they are now. A file that cannot be
  /// moved stays, with a warning, and is read from where it is.
  std::vector<std::filesystem::path> keep_attempt_traces(const std::filesystem::path& dir,
                                                         const std::vector<std::filesystem::path>& files) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    for (const auto& stale : strata::trace::list_trace_files(dir)) std::filesystem::remove(stale, ec);
    std::vector<std::filesystem::path> out;
    bool moved_any = false;
    for (const auto& f : files) {
      const auto to = dir / f.filename();
      std::filesystem::rename(f, to, ec);
      if (ec) {
        std::cerr << "strata-run: cannot move the trace file " << f.string() << " to " << dir.string() << ": "
                  << ec.message() << "; the next attempt may overwrite it" << std::endl;
        out.push_back(f);
      } else {
        out.push_back(to);
        moved_any = true;
      }
    }
    if (moved_any) attempt_dirs_.push_back(dir);
    // What is left are the files of an earlier job (or ones that could not
    // be moved): the next attempt's summary ignores them unless rewritten.
    trace_.before = snapshot_trace_files(trace_.path);
    return out;
  }

  /// True when the trace directory, or an attempt-* directory of this run,
  /// holds trace files.
  bool holds_traces() const {
    if (!strata::trace::list_trace_files(trace_.path).empty()) return true;
    return std::any_of(attempt_dirs_.begin(), attempt_dirs_.end(),
                       [](const auto& d) { return !strata::trace::list_trace_files(d).empty(); });
  }

  void remove_trace_dir() {
    std::error_code ec;
    std::filesystem::remove_all(trace_.path, ec);
    if (ec)
      std::cerr << "strata-run: cannot remove the trace directory " << trace_.path.string() << ": " << ec.message()
                << std::endl;
  }

  /// After every child is gone: what the ranks agreed caused the failure,
  /// and which children were stopped, since the first exit only names the
  /// rank that noticed first. `shown` is where the traces are now.
  void summarize(const strata::trace::TraceSet& set, bool any_files, const std::filesystem::path& shown) {
    for (const auto& w : set.warnings) std::cerr << "strata-run: " << w << std::endl;
    for (const auto& line : strata::trace::verdict_lines(set.ranks)) std::cerr << "strata-run: " << line << std::endl;
    for (const Child& c : children_)
      if (c.stop_signal_at_failure != 0)
        std::cerr << "strata-run: rank " << c.rank << " (pid " << c.pid << ") was stopped ("
                  << signal_name(c.stop_signal_at_failure) << ") when the job failed" << std::endl;
    if (any_files)
      std::cerr << "strata-run: the last collectives of every rank: strata-info trace " << shown.string() << std::endl;
  }

  /// One line for why the attempt failed, by the summary's logic: the
  /// verdict most ranks agreed on, else the first rank to exit (plus any
  /// rank that was stopped, which the first exit may only have noticed).
  std::string failure_reason(const strata::trace::TraceSet& set) const {
    const auto groups = strata::trace::group_verdicts(set.ranks);
    if (!groups.empty())
      return groups.front().first + " (verdict of " + strata::trace::rank_list(groups.front().second) + ")";
    std::string reason;
    if (first_failure_) {
      const Failure& f = *first_failure_;
      reason = "rank " + std::to_string(f.rank) +
               (f.signal != 0 ? " was killed by " + signal_name(f.signal) : " exited with code " + std::to_string(f.code));
    }
    for (const Child& c : children_)
      if (c.stop_signal_at_failure != 0)
        reason += (reason.empty() ? "" : "; ") + ("rank " + std::to_string(c.rank) + " was stopped (" +
                                                  signal_name(c.stop_signal_at_failure) + ")");
    return reason.empty() ? "exit code " + std::to_string(exit_code_) : reason;
  }

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
      fork_failed_ = true;
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

  // Processes still running that are not stopped (SIGSTOP, SIGTSTP): only
  // these can still fail by themselves during the settle time.
  std::size_t alive_and_running() const {
    return static_cast<std::size_t>(std::count_if(children_.begin(), children_.end(), [](const Child& c) {
      return c.pid > 0 && !c.exited && c.stop_signal == 0;
    }));
  }

  void signal_all(int sig) {
    for (const Child& c : children_)
      if (c.pid > 0 && !c.exited) ::kill(c.pid, sig);
  }

  void stop_all(int sig) {
    if (!stopping_)
      for (Child& c : children_)
        if (c.pid > 0 && !c.exited) c.stop_signal_at_failure = c.stop_signal;
    stopping_ = true;
    signal_all(sig);
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(opt_.grace_s));
  }

  void on_exit(Child& c, int status) {
    c.exited = true;
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (c.code == 0 || stopping_ || settle_deadline_) return;
    if (c.ps_worker && chief_alive()) {
      // The coordinator reschedules the closures of a lost worker; the job
      // goes on without it, or with it again once restarted.
      const std::string how = WIFEXITED(status) ? "exited with code " + std::to_string(c.code)
                                                : "was killed by " + signal_name(WTERMSIG(status));
      std::cerr << "strata-run: " << c.label << " (rank " << c.rank << ", pid " << c.pid << ") " << how
                << "; the coordinator runs its closures on the other workers";
      if (c.restarts < opt_.restart_workers) {
        std::cerr << "; restarting it in " << opt_.restart_delay_s << " s (restart " << c.restarts + 1 << " of "
                  << opt_.restart_workers << ", --restart-workers)";
        c.respawn_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(opt_.restart_delay_s));
      } else {
        std::cerr << "; not restarting it (--restart-workers " << opt_.restart_workers << ")";
      }
      std::cerr << std::endl;
      return;
    }
    // Worded as an observation: after a stall the first to exit is the rank
    // that noticed first, not the culprit; the summary at the end names that.
    const std::string how = WIFEXITED(status) ? ", with code " + std::to_string(c.code)
                                              : ": it was killed by " + signal_name(WTERMSIG(status));
    std::cerr << "strata-run: rank " << c.rank << " (pid " << c.pid << ") exited first" << how;
    if (alive() > 0) std::cerr << "; stopping the other " << alive() << " running process(es)";
    std::cerr << std::endl;
    exit_code_ = c.code;
    first_failure_ = Failure{c.rank, c.code, WIFSIGNALED(status) ? WTERMSIG(status) : 0};
    // The others usually fail within a second too, once they have agreed on
    // the culprit (a dead peer is named within 1 s); a SIGTERM now would cut
    // that short and leave no verdict. They get --settle seconds to exit by
    // themselves, then are stopped.
    if (alive() == 0) return;
    for (Child& o : children_)
      if (o.pid > 0 && !o.exited) o.stop_signal_at_failure = o.stop_signal;
    settle_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opt_.settle_s));
  }

  bool chief_alive() const {
    for (const Child& c : children_)
      if (c.label.rfind("chief", 0) == 0 && c.pid > 0 && !c.exited) return true;
    return false;
  }

  /// Start the worker tasks whose restart is due (parameter-server jobs).
  void respawn_due() {
    for (Child& c : children_) {
      if (!c.respawn_at || Clock::now() < *c.respawn_at) continue;
      c.respawn_at.reset();
      if (stopping_ || settle_deadline_ || !chief_alive()) continue;
      for (Stream* s : {&c.out, &c.err})  // the old process's last lines
        if (s->fd >= 0) pump(c.label, *s);
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) {
          emit_lines(c.label, *s, true);
          ::close(s->fd);
          s->fd = -1;
        }
      ++c.restarts;
      c.exited = false;
      c.code = 0;
      c.stop_signal = 0;
      c.out.buf.clear();
      c.err.buf.clear();
      std::cerr << "strata-run: starting " << c.label << " again (rank " << c.rank << ", restart " << c.restarts
                << " of " << opt_.restart_workers << ")" << std::endl;
      spawn(c, c.rank, c.env);
    }
  }

  void reap() {
    // Stops and continues of every child are applied before any exit, so the
    // stopped state recorded when the job begins to stop is current.
    std::vector<std::pair<Child*, int>> exits;
    for (Child& c : children_) {
      if (c.pid <= 0 || c.exited) continue;
      for (;;) {
        int status = 0;
        const pid_t r = ::waitpid(c.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
        if (r != c.pid) break;
        if (WIFSTOPPED(status)) {
          c.stop_signal = WSTOPSIG(status);
          std::cerr << "strata-run: rank " << c.rank << " (pid " << c.pid << ") is stopped ("
                    << signal_name(c.stop_signal) << "); it runs again after kill -CONT " << c.pid << std::endl;
          continue;
        }
        if (WIFCONTINUED(status)) {
          if (c.stop_signal != 0)
            std::cerr << "strata-run: rank " << c.rank << " (pid " << c.pid << ") continued" << std::endl;
          c.stop_signal = 0;
          continue;
        }
        exits.emplace_back(&c, status);
        break;
      }
    }
    for (auto& [c, status] : exits) on_exit(*c, status);
  }

  void on_signal(int sig) {
    interrupted_ = true;
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
    const std::optional<Clock::time_point> timeout = deadline_;
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
                emit_lines(c.label, *s, true);
                ::close(s->fd);
                s->fd = -1;
              }
          return;
        }
      }
      auto next = Clock::now() + std::chrono::seconds(1);
      if (timeout && !stopping_) next = std::min(next, *timeout);
      if (kill_deadline_) next = std::min(next, *kill_deadline_);
      if (settle_deadline_ && !stopping_) next = std::min(next, *settle_deadline_);
      if (drain_deadline) next = std::min(next, *drain_deadline);
      for (const Child& c : children_)
        if (c.respawn_at) next = std::min(next, *c.respawn_at);
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
              if (&c.out == streams[i] || &c.err == streams[i]) pump(c.label, *streams[i]);
          }
      }
      reap();  // SIGCHLD coalesces; a periodic check keeps no exit unnoticed
      respawn_due();
      const auto now = Clock::now();
      if (timeout && !stopping_ && now >= *timeout) {
        std::cerr << "strata-run: timeout: the job ran longer than --timeout " << opt_.timeout_s
                  << " s" << (opt_.max_restarts > 0 ? " (all attempts together)" : "") << "; stopping " << alive()
                  << " process(es)" << std::endl;
        exit_code_ = 124;
        timed_out_ = true;
        stop_all(SIGTERM);
      }
      if (settle_deadline_ && !stopping_ && (now >= *settle_deadline_ || alive_and_running() == 0)) {
        // (stop_signal_at_failure was taken when the first one failed.)
        stopping_ = true;
        signal_all(SIGTERM);
        kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(opt_.grace_s));
      }
      if (kill_deadline_ && now >= *kill_deadline_) {
        if (alive() > 0) {
          std::vector<int> stopped;
          for (const Child& c : children_)
            if (c.pid > 0 && !c.exited && c.stop_signal != 0) stopped.push_back(c.rank);
          std::cerr << "strata-run: " << alive() << " process(es) still running " << opt_.grace_s
                    << " s after SIGTERM"
                    << (stopped.empty() ? "" : " (" + strata::trace::rank_list(stopped) +
                                                   " stopped, so SIGTERM waits)")
                    << "; sending SIGKILL" << std::endl;
        }
        signal_all(SIGKILL);
        kill_deadline_.reset();
      }
    }
  }

  /// The first child of an attempt to fail: the restart line's reason
  /// when no verdict was written.
  struct Failure {
    int rank = 0;
    int code = 0;
    int signal = 0;  // the signal that killed it, 0 for an exit code
  };

  Options opt_;
  TraceDir trace_;
  std::string token_;        // one per run: every attempt gets the same
  std::string config_path_;  // absolute --config, empty without one
  GpuPlan gpus_;             // -n jobs: what --gpus gives each rank, the same for every attempt
  std::vector<Child> children_;
  sigset_t orig_mask_{};
  int sfd_ = -1;
  std::optional<Clock::time_point> deadline_;  // --timeout, over all attempts
  std::set<uint16_t> used_ports_;              // by every attempt so far
  std::vector<std::filesystem::path> attempt_dirs_;  // attempt-<k> directories this run filled
  // Run-wide: each ends the run, so no restart follows.
  bool interrupted_ = false;  // SIGINT/SIGTERM/SIGHUP to strata-run
  bool timed_out_ = false;
  bool fork_failed_ = false;
  // Per attempt:
  std::optional<Failure> first_failure_;
  bool stopping_ = false;
  int exit_code_ = 0;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> settle_deadline_;  // set when the first process failed
};

}  // namespace

namespace {

// Validators whose messages say what is expected (CLI11's range check would
// print the whole double range).
const CLI::Validator kRestartCount(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.size() <= 9 && std::all_of(v.begin(), v.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
      return digits ? "" : "expects a whole number of restarts, 0 or more (0 = never restart), not '" + v + "'";
    },
    "N>=0");
const CLI::Validator kRestartDelay(
    [](std::string& v) -> std::string {
      constexpr double kMaxDelay = 86400;
      std::size_t used = 0;
      double d = -1;
      try {
        d = std::stod(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      const bool ok = used == v.size() && !v.empty() && d >= 0 && d <= kMaxDelay;
      return ok ? "" : "expects seconds from 0 to 86400, not '" + v + "'";
    },
    "S>=0");

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "strata-run: start N local processes of PROGRAM as one multi-worker Strata job.\n\n"
      "Each process gets TF_CONFIG (a worker cluster on free ports of --host, just below the kernel's\n"
      "ephemeral range, net.ipv4.ip_local_port_range; task index = rank),\n"
      "STRATA_AUTH_TOKEN (random per job unless already set), STRATA_RANK, STRATA_TRACE_DIR and,\n"
      "with --config, STRATA_CONFIG; SLURM_PROCID is removed so that, inside a Slurm allocation, they\n"
      "resolve their cluster from TF_CONFIG. Output lines are prefixed \"[<rank>] \". SIGINT/SIGTERM/SIGHUP\n"
      "are forwarded.\n"
      "When a process fails the others get 5 s to report it themselves (the culprit verdict), then\n"
      "are stopped (SIGTERM, then SIGKILL after --grace; a stopped process ends at the SIGKILL) and strata-run exits with its code (128+signal for a signal);\n"
      "--timeout exits 124.\n\n"
      "The first process to exit is only the first to notice a failure. Every rank whose collective\n"
      "fails writes STRATA_TRACE_DIR/rank-<rank>.json with the verdict the ranks agreed on; when the\n"
      "job fails, strata-run prints that verdict (\"verdict (ranks 0, 1, 3 agree): rank 2 of 4 ...\"),\n"
      "the processes that were stopped (SIGSTOP/SIGTSTP) at the time, and the command that shows every\n"
      "rank's last collectives: strata-info trace DIR. The trace directory is --trace-dir, else\n"
      "$STRATA_TRACE_DIR, else a new ${TMPDIR:-/tmp}/strata-run-<pid> that strata-run removes unless a\n"
      "failed job left trace files in it (a directory you name is never removed).\n\n"
      "Restarts (--max-restarts N, as torchrun's): a failed job is stopped and summarized as above,\n"
      "then started again whole after --restart-delay seconds (every rank, new free ports, a fresh\n"
      "rendezvous), at most N times; every process sees STRATA_RESTART_COUNT (0 on the first attempt,\n"
      "then 1, 2, ...) and STRATA_MAX_RESTARTS. The program must resume from its own latest checkpoint\n"
      "(strata::BackupAndRestore does that); strata-run keeps no state. A success ends the run; with\n"
      "restarts exhausted it exits with the last attempt's code. --timeout covers all attempts and\n"
      "delays together and is never restarted, nor is SIGINT/SIGTERM/SIGHUP to strata-run. A failed\n"
      "attempt's trace files move to DIR/attempt-<k>/ (k = its STRATA_RESTART_COUNT); DIR keeps the\n"
      "latest attempt's. Under Slurm: sbatch --requeue, with the same resume in the program.\n\n"
      "Example:\n"
      "  strata-run -n 4 --config job.json -- strata-train --steps 100\n"
      "  strata-run -n 2 --timeout 600 -- ./my_trainer --batch 64\n"
      "  strata-run --max-restarts 2 -n 4 -- strata-train --checkpoint-dir /tmp/ckpt --steps 1000\n\n"
      "Parameter-server jobs: --chief 1 --workers N --ps M instead of -n start the chief, N workers and\n"
      "M ps tasks (ranks in that order), TF_CONFIG {\"chief\": [...], \"worker\": [...], \"ps\": [...]}, output\n"
      "prefixed \"[worker 1] \"; e.g. strata-run --chief 1 --workers 2 --ps 1 -- ./my_ps_program. A failed\n"
      "worker does not stop such a job (the coordinator reschedules its closures); --restart-workers N\n"
      "starts it again in place, up to N times per worker, after --restart-delay seconds"};
  Options opt;
  auto* n_opt =
      app.add_option("-n,--num-processes", opt.n, "number of processes to start")->check(CLI::Range(1, 4096));
  auto* chief_opt = app.add_option("--chief", opt.chief, "parameter-server job: chief tasks (default 1)")
                        ->check(CLI::Range(1, 1));
  auto* workers_opt =
      app.add_option("--workers", opt.workers, "parameter-server job: worker tasks")->check(CLI::Range(1, 4096));
  auto* ps_opt = app.add_option("--ps", opt.ps, "parameter-server job: ps tasks")->check(CLI::Range(1, 4096));
  n_opt->excludes(chief_opt)->excludes(workers_opt)->excludes(ps_opt);
  app.add_option("--config", opt.config, "job config (JSON) passed to every process as STRATA_CONFIG")
      ->check(CLI::ExistingFile);
  app.add_option("--timeout", opt.timeout_s, "stop the job and exit 124 after S seconds (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--settle", opt.settle_s,
                 "seconds the other processes get to fail by themselves (and agree on the culprit) after the first "
                 "failure, before they are stopped (default 10; raise it on slow or oversubscribed machines)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", opt.grace_s, "seconds between SIGTERM and SIGKILL when stopping (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--host", opt.host, "address the processes listen on (default 127.0.0.1)");
  app.add_option("--trace-dir", opt.trace_dir,
                 "directory for the failure traces (rank-<rank>.json), passed as STRATA_TRACE_DIR; created "
                 "if missing, never removed (default: $STRATA_TRACE_DIR, else a temporary one)");
  app.add_option("--max-restarts", opt.max_restarts,
                 "restart the whole job up to N times when a process fails (default 0: never)")
      ->check(kRestartCount);
  app.add_option("--restart-delay", opt.restart_delay_s, "seconds to wait before a restart (default 1)")
      ->check(kRestartDelay);
  app.add_option("--restart-workers", opt.restart_workers,
                 "parameter-server jobs: start a failed worker task again, up to N times per worker "
                 "(default 0); a failed worker never stops such a job")
      ->check(kRestartCount);
  app.add_option("--gpus", opt.gpus,
                 "-n jobs: the GPUs each process sees, through CUDA_VISIBLE_DEVICES. auto (default): every GPU "
                 "strata-run sees, split evenly (8 GPUs, 4 processes: rank 1 gets 2,3), or shared round-robin when "
                 "there are fewer GPUs than processes (then STRATA_GPUS_SHARED=1 and multi_worker_mirrored's AUTO "
                 "communication uses RING: NCCL needs a GPU per process); nothing is set without a GPU. LIST "
                 "(0,1,2,3 or GPU UUIDs): split these the same way. all: leave CUDA_VISIBLE_DEVICES alone. none: "
                 "hide every GPU")
      ->check(CLI::Validator([](std::string& v) { return check_gpus_spec(v); }, "auto|all|none|LIST"));
  app.add_option("command", opt.command, "PROGRAM ARGS... (after --)")->required();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);
  if (*workers_opt || *ps_opt || *chief_opt) {
    if (!*workers_opt || !*ps_opt) {
      std::cerr << "strata-run: a parameter-server job needs --workers N and --ps M (and optionally --chief 1)"
                << std::endl;
      return 2;
    }
    opt.ps_job = true;
    opt.n = opt.chief + opt.workers + opt.ps;
    if (opt.gpus != "auto") {
      std::cerr << "strata-run: --gpus applies to -n jobs; a parameter-server job's processes keep "
                   "CUDA_VISIBLE_DEVICES as strata-run has it"
                << std::endl;
      return 2;
    }
  } else if (opt.n < 1) {
    std::cerr << "strata-run: pass -n N (a multi-worker job) or --workers N --ps M (a parameter-server job)"
              << std::endl;
    return 2;
  }

  try {
    return Launcher(std::move(opt)).run();
  } catch (const std::exception& e) {
    std::cerr << "strata-run: " << e.what() << std::endl;
    return 1;
  }
}
