// SPDX-License-Identifier: Apache-2.0
#include "multiproc.h"

#include <dirent.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_allreduce.h"
#include "key_json.h"
#include "sizes.h"
#include "strata/c/transport.h"
#include "strata/c/cross_device_ops.h"
#include "strata/error.hpp"
#include "strata/plugin_host.hpp"
#include "strata/store.hpp"

extern "C" char** environ;

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

constexpr const char* kStoreEnv = "STRATA_BENCH_STORE";
// -n cap of `strata-bench rendezvous` (main.cc repeats it for the CLI):
// each rank is a process with a store connection, a listening socket, its
// transport connections and a few threads; rank 0 also serves the store
// (one connection per rank), so 4,096 ranks stay far below a 20,000-fd
// limit. The data benches stay at 256.
constexpr int kMaxRendezvousRanks = 4096;
constexpr const char* kReportFdEnv = "STRATA_BENCH_REPORT_FD";
// How long the other workers get to report their own error once one failed.
constexpr std::chrono::seconds kFailureGrace{15};
// The same once rank 0 failed: it served the store, so a worker still
// connecting to it only retries until its deadline, and one in a collective
// sees rank 0's connections close at once.
constexpr std::chrono::seconds kStoreHostGrace{2};

struct DTypeInfo {
  const char* name;
  DLDataType dl;
  std::size_t size;
};

const DTypeInfo kDTypes[] = {
    {"float32", {kDLFloat, 32, 1}, 4},
    {"float64", {kDLFloat, 64, 1}, 8},
    {"int32", {kDLInt, 32, 1}, 4},
    {"int64", {kDLInt, 64, 1}, 8},
};

const DTypeInfo& dtype_info(const std::string& name) {
  for (const DTypeInfo& d : kDTypes)
    if (name == d.name) return d;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--dtype ", name, " is not supported: use float32, float64, int32 or int64");
}

// nccl-tests bus-bandwidth factor (as mpi_coll_bench.c).
double busbw_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

// The transport's options: --transport-options, then each --option KEY=JSON.
nlohmann::json transport_options(const MultiProcOptions& o) {
  return cli::apply_key_json(o.transport_option_pairs, nlohmann::json::parse(o.transport_options), "--option",
                             "'provider=\"shm\"'");
}

void validate(const MultiProcOptions& o) {
  const bool pingpong = o.op == "pingpong";
  if (o.op != "allreduce" && o.op != "broadcast" && o.op != "allgather" && !pingpong && o.op != "rendezvous")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown benchmark '", o.op,
                 "': use allreduce, broadcast, allgather, pingpong or rendezvous");
  if (pingpong && o.ranks != 2)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "-n ", o.ranks, ": pingpong runs between exactly 2 processes; pass -n 2");
  // rendezvous measures scale (issue 12: 1,024 ranks and more); the others
  // move data and stay at 256.
  const int max_ranks = o.op == "rendezvous" ? kMaxRendezvousRanks : 256;
  if (o.ranks < 2 || o.ranks > max_ranks)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "-n ", o.ranks, ": the multi-process ", o.op, " bench needs 2..",
                 max_ranks, " processes");
  const DTypeInfo& d = dtype_info(o.dtype);
  if (o.sizes.empty() && o.op != "rendezvous") STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--sizes is empty: pass e.g. --sizes 4K:64M");
  const std::uint64_t min_bytes = pingpong ? 0 : d.size * (o.op == "allgather" ? std::uint64_t(o.ranks) : 1);
  for (std::uint64_t s : o.sizes)
    if (s < min_bytes)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "size ", s, " is below one element", o.op == "allgather" ? " per rank" : "",
                   " (", min_bytes, " bytes of ", d.name, o.op == "allgather" ? " for allgather" : "",
                   "); raise the smallest --sizes");
  if (o.iters < 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--iters ", o.iters, ": use 0 (auto) or a positive count");
  if (o.trials < 1) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--repeats ", o.trials, ": use at least 1");
  if (!(o.timeout_s > 0)) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--timeout must be > 0 seconds");
  for (const auto* text : {&o.ring_options, &o.transport_options}) {
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_object())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "'", *text, "' is not a JSON object: pass e.g. '{\"chunk_bytes\": 1048576}'");
  }
  (void)transport_options(o);  // a bad --option fails here, before any worker starts
}

// ------------------------------------------------------------- launcher ---

std::string random_token() {
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 32; ++i) t.push_back(kHex[rd() & 15]);
  return t;
}

std::string self_exe() {
  std::string path(4096, '\0');
  const ssize_t len = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (len <= 0) STRATA_THROW(STRATA_ERR_INTERNAL, "cannot read /proc/self/exe (", std::strerror(errno), ")");
  path.resize(std::size_t(len));
  return path;
}

// Fork and exec one worker. Everything it needs is built before fork(), so
// the child only makes async-signal-safe calls.
pid_t spawn_worker(const std::string& exe, const std::vector<std::string>& base_args, int rank,
                   const std::string& store, const std::string& token, int report_fd) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v(*e);
    if (v.rfind("STRATA_BENCH_", 0) == 0 || v.rfind("STRATA_RANK=", 0) == 0 || v.rfind("STRATA_AUTH_TOKEN=", 0) == 0)
      continue;
    env.push_back(v);
  }
  env.push_back(str_cat(kStoreEnv, "=", store));
  env.push_back(str_cat("STRATA_AUTH_TOKEN=", token));
  env.push_back(str_cat("STRATA_RANK=", rank));
  if (report_fd >= 0) env.push_back(str_cat(kReportFdEnv, "=", report_fd));
  std::vector<std::string> args = base_args;
  args.push_back("--bench-worker-rank");
  args.push_back(std::to_string(rank));
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) STRATA_THROW(STRATA_ERR_UNAVAILABLE, "cannot start worker ", rank, ": fork failed (", std::strerror(errno), ")");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
    if (::getppid() != parent) ::_exit(126);  // the launcher died before prctl
    if (report_fd >= 0) ::fcntl(report_fd, F_SETFD, 0);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Read rank 0's store address ("host:port\n") from the pipe, up to the deadline.
std::string read_store_address(int fd, Clock::time_point deadline) {
  std::string got;
  while (got.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return "";
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r < 0 && errno != EINTR) return "";
    if (r <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "";  // rank 0 exited without reporting
    got.append(buf, std::size_t(n));
  }
  return got.substr(0, got.find('\n'));
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return str_cat("exited with status ", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return str_cat("was killed by signal ", WTERMSIG(st), " (", strsignal(WTERMSIG(st)), ")");
  return "stopped";
}

// Wait for every worker. Once one fails, the others get kFailureGrace
// (kStoreHostGrace after rank 0) to report their own error (the ring aborts
// its communicator, so they usually fail at once), then are killed. Every
// pid is reaped on every path.
int supervise(std::vector<pid_t>& pids, int first_rank_failed_to_start) {
  std::vector<int> status(pids.size(), 0);
  std::vector<bool> done(pids.size(), false);
  std::size_t left = 0;
  for (std::size_t i = 0; i < pids.size(); ++i) left += pids[i] > 0 ? 1 : 0;
  // The first rank that failed (-1: none yet) sets how long the others get.
  int first_failed = first_rank_failed_to_start;
  auto grace = [&] { return first_failed == 0 ? kStoreHostGrace : kFailureGrace; };
  Clock::time_point kill_at = first_failed >= 0 ? Clock::now() + grace() : Clock::time_point::max();
  while (left > 0) {
    bool progressed = false;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0 || done[i]) continue;
      int st = 0;
      const pid_t r = ::waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i] || (r < 0 && errno == ECHILD)) {
        done[i] = true;
        status[i] = r == pids[i] ? st : 0;
        --left;
        progressed = true;
        if (!(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0) && first_failed < 0) {
          first_failed = static_cast<int>(i);
          kill_at = Clock::now() + grace();
        }
      }
    }
    if (left == 0) break;
    if (Clock::now() >= kill_at) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (pids[i] > 0 && !done[i]) {
          ::kill(pids[i], SIGKILL);
          int st = 0;
          ::waitpid(pids[i], &st, 0);
          std::fprintf(stderr, "strata-bench: killed rank %zu, still running %lld s after rank %d failed\n", i,
                       static_cast<long long>(grace().count()), first_failed);
          done[i] = true;
          status[i] = st;
          --left;
        }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int rc = first_failed >= 0 ? 1 : 0;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] <= 0) continue;
    const int st = status[i];
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      std::fprintf(stderr, "strata-bench: rank %zu (pid %d) %s\n", i, static_cast<int>(pids[i]),
                   describe_status(st).c_str());
      rc = 1;
    }
  }
  return rc;
}

// ---------------------------------------------------------------- worker ---

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Mem = std::unique_ptr<void, FreeDeleter>;

Mem alloc_aligned(std::size_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, std::max<std::size_t>(bytes, 64)) != 0)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, "cannot allocate ", bytes, " bytes for the benchmark buffers; use smaller --sizes");
  return Mem(p);
}

DLTensor tensor_1d(void* data, std::int64_t* shape, DLDataType dtype) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

// The ring CrossDeviceOps with one local replica, called through its vtable.
class Ring {
 public:
  Ring(const MultiProcOptions& o, int rank, const std::string& communicator = "strata-bench") {
    nlohmann::json opts = nlohmann::json::parse(o.ring_options);
    opts["transport"] = {{"name", o.transport}, {"options", transport_options(o)}};
    opts["rank"] = rank;
    opts["world_size"] = o.ranks;
    opts["communicator"] = communicator;
    if (!opts.contains("timeout_s")) opts["timeout_s"] = o.timeout_s;
    inst_ = PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, "ring", opts.dump());
    vt_ = inst_.vtable_as<strata_cross_device_ops_vtable>();
    h_ = static_cast<strata_cross_device_ops_t>(inst_.handle());
  }

  void all_reduce(strata_reduce_op op, const DLTensor* in, DLTensor* out, const char* what) {
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->all_reduce(h_, op, 1, 1, &in, &out, &err), err, what);
  }
  void barrier() {
    strata_error err;
    strata_error_init(&err);
    // No tensors: the ring's barrier. The arrays must be non-NULL even when empty.
    const DLTensor* no_in[1] = {nullptr};
    DLTensor* no_out[1] = {nullptr};
    detail::check_status(vt_->all_reduce(h_, STRATA_REDUCE_SUM, 0, 1, no_in, no_out, &err), err, "barrier");
  }
  void broadcast(const DLTensor* src, DLTensor* dst, const char* what) {
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->broadcast(h_, src, 1, &dst, &err), err, what);
  }
  void all_gather(const DLTensor* in, DLTensor* out, const char* what) {
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->all_gather(h_, 1, &in, 0, &out, &err), err, what);
  }
  double max_across_ranks(double v) {
    std::int64_t shape = 1;
    double out = 0;
    DLTensor t = tensor_1d(&v, &shape, DLDataType{kDLFloat, 64, 1});
    DLTensor o = tensor_1d(&out, &shape, DLDataType{kDLFloat, 64, 1});
    all_reduce(STRATA_REDUCE_MAX, &t, &o, "all_reduce(MAX) of the batch times");
    return out;
  }
  std::int64_t sum_across_ranks(std::int64_t v) {
    std::int64_t shape = 1, out = 0;
    DLTensor t = tensor_1d(&v, &shape, DLDataType{kDLInt, 64, 1});
    DLTensor o = tensor_1d(&out, &shape, DLDataType{kDLInt, 64, 1});
    all_reduce(STRATA_REDUCE_SUM, &t, &o, "all_reduce(SUM) of the wrong-element counts");
    return out;
  }

 private:
  PluginInstance inst_;
  const strata_cross_device_ops_vtable* vt_ = nullptr;
  strata_cross_device_ops_t h_ = nullptr;
};

// Buffers filled and checked as mpi_coll_bench.c does, so that a result is
// right only when every element came from the right rank and position.
template <class T>
void fill(const std::string& op, T* send, T* recv, std::size_t count, int rank, int n) {
  const std::size_t per = count / std::size_t(n);
  for (std::size_t i = 0; i < count; ++i) {
    recv[i] = T(-1);
    send[i] = T(rank + 1);
  }
  if (op == "broadcast")
    for (std::size_t i = 0; i < count; ++i) recv[i] = rank == 0 ? T(i % 1000) : T(-1);
  if (op == "allgather")
    for (std::size_t i = 0; i < per; ++i) send[i] = T(rank * 1000 + int(i % 1000));
}

template <class T>
std::int64_t count_wrong(const std::string& op, const T* recv, std::size_t count, int n) {
  const std::size_t per = count / std::size_t(n);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    T want;
    if (op == "allreduce") want = T(n * (n + 1) / 2);
    else if (op == "broadcast") want = T(i % 1000);
    else want = T((i / per) * 1000 + (i % per) % 1000);
    wrong += recv[i] != want;
  }
  return wrong;
}

void fill_any(const DTypeInfo& d, const std::string& op, void* s, void* r, std::size_t count, int rank, int n) {
  switch (d.dl.code == kDLFloat ? d.dl.bits : d.dl.bits + 1) {
    case 32: return fill(op, static_cast<float*>(s), static_cast<float*>(r), count, rank, n);
    case 64: return fill(op, static_cast<double*>(s), static_cast<double*>(r), count, rank, n);
    case 33: return fill(op, static_cast<std::int32_t*>(s), static_cast<std::int32_t*>(r), count, rank, n);
    default: return fill(op, static_cast<std::int64_t*>(s), static_cast<std::int64_t*>(r), count, rank, n);
  }
}

std::int64_t wrong_any(const DTypeInfo& d, const std::string& op, const void* r, std::size_t count, int n) {
  switch (d.dl.code == kDLFloat ? d.dl.bits : d.dl.bits + 1) {
    case 32: return count_wrong(op, static_cast<const float*>(r), count, n);
    case 64: return count_wrong(op, static_cast<const double*>(r), count, n);
    case 33: return count_wrong(op, static_cast<const std::int32_t*>(r), count, n);
    default: return count_wrong(op, static_cast<const std::int64_t*>(r), count, n);
  }
}

// One communicator of a transport plugin, driven through its vtable.
class P2P {
 public:
  P2P(const MultiProcOptions& o, int rank) : timeout_ms_(static_cast<std::int64_t>(o.timeout_s * 1000)) {
    inst_ = PluginHost::global().create(STRATA_KIND_TRANSPORT, o.transport, transport_options(o).dump());
    vt_ = inst_.vtable_as<strata_transport_vtable>();
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->comm_create(static_cast<strata_transport_t>(inst_.handle()), "strata-bench-pingpong",
                                          rank, o.ranks, timeout_ms_, &comm_, &err),
                         err, "comm_create");
  }
  ~P2P() {
    for (strata_mem_region_t mr : regions_) vt_->mem_deregister(comm_, mr);
    if (comm_ != nullptr) vt_->comm_destroy(comm_);
  }
  P2P(const P2P&) = delete;
  P2P& operator=(const P2P&) = delete;

  // A buffer registered for the life of this object.
  strata_buffer buffer(void* data, std::uint64_t bytes) {
    strata_error err;
    strata_error_init(&err);
    strata_mem_region_t mr = nullptr;
    detail::check_status(vt_->mem_register(comm_, data, bytes, DLDevice{kDLCPU, 0}, &mr, &err), err, "mem_register");
    regions_.push_back(mr);
    strata_buffer b{};
    STRATA_INIT_HEADER(&b, strata_buffer);
    b.data = data;
    b.bytes = bytes;
    b.device = DLDevice{kDLCPU, 0};
    b.mr = mr;
    return b;
  }
  strata_request_t isend(int peer, std::uint64_t tag, const strata_buffer& b) {
    strata_error err;
    strata_error_init(&err);
    strata_request_t r = nullptr;
    detail::check_status(vt_->isend(comm_, peer, tag, &b, &r, &err), err, "isend");
    return r;
  }
  strata_request_t irecv(int peer, std::uint64_t tag, const strata_buffer& b) {
    strata_error err;
    strata_error_init(&err);
    strata_request_t r = nullptr;
    detail::check_status(vt_->irecv(comm_, peer, tag, &b, &r, &err), err, "irecv");
    return r;
  }
  void wait(strata_request_t r, const char* what) {
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt_->wait(comm_, r, timeout_ms_, nullptr, &err), err, what);
  }

 private:
  std::int64_t timeout_ms_;
  PluginInstance inst_;
  const strata_transport_vtable* vt_ = nullptr;
  strata_comm_t comm_ = nullptr;
  std::vector<strata_mem_region_t> regions_;
};

// The references that `pingpong` measures beside the transport, in the
// same processes and run: a plain loopback TCP socket pair (TCP_NODELAY)
// bouncing the same bytes, received once by busy-polling (recv with
// MSG_DONTWAIT until complete: the floor for a transport whose waiting
// thread polls) and once by blocking recv (what a thread that sleeps in the
// kernel pays). Every socket call has a deadline (poll/SO_RCVTIMEO).
class SocketRef {
 public:
  // Rank 0 listens on 127.0.0.1 and sends its port to rank 1 through `p2p`.
  template <class P2P>
  SocketRef(P2P& p2p, int rank, double timeout_s) : timeout_s_(timeout_s) {
    std::uint64_t port = 0;
    strata_buffer pb = p2p.buffer(&port, sizeof port);
    if (rank == 0) {
      const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (ls < 0) fail("socket");
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof a;
      if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
          ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        ::close(ls);
        fail("bind/listen on 127.0.0.1");
      }
      port = ntohs(a.sin_port);
      p2p.wait(p2p.isend(1, 1, pb), "socket reference: sending the port");
      pollfd pf{ls, POLLIN, 0};
      const int n = ::poll(&pf, 1, int(timeout_s * 1000));
      fd_ = n == 1 ? ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC) : -1;
      ::close(ls);
      if (fd_ < 0) fail("accept (rank 1 did not connect in time)");
    } else {
      p2p.wait(p2p.irecv(0, 1, pb), "socket reference: receiving the port");
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(std::uint16_t(port));
      if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("connect to rank 0");
    }
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_s);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  ~SocketRef() {
    if (fd_ >= 0) ::close(fd_);
  }
  SocketRef(const SocketRef&) = delete;
  SocketRef& operator=(const SocketRef&) = delete;

  void send_all(const unsigned char* p, std::uint64_t n) {
    while (n > 0) {
      const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail("send");
      p += k;
      n -= std::uint64_t(k);
    }
  }
  void recv_all(unsigned char* p, std::uint64_t n, bool busy) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    while (n > 0) {
      const ssize_t k = ::recv(fd_, p, n, busy ? MSG_DONTWAIT : 0);
      if (k > 0) {
        p += k;
        n -= std::uint64_t(k);
        continue;
      }
      if (k == 0) fail("recv (rank closed the socket)");
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && Clock::now() < deadline) continue;
      fail("recv");
    }
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, "pingpong socket reference: ", what, " failed (", std::strerror(errno), ")");
  }
  int fd_ = -1;
  double timeout_s_;
};

// Rank 0 and rank 1 bounce one message of each size (see multiproc.h).
int pingpong_body(const MultiProcOptions& o, int rank) {
  P2P p2p(o, rank);
  const int peer = 1 - rank;
  const std::uint64_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  Mem sbuf = alloc_aligned(max_bytes), rbuf = alloc_aligned(max_bytes);
  std::uint64_t token = 0;
  const strata_buffer sync_send = p2p.buffer(&token, sizeof token);
  std::uint64_t token_in = 0;
  const strata_buffer sync_recv = p2p.buffer(&token_in, sizeof token_in);
  strata_buffer sfull = p2p.buffer(sbuf.get(), std::max<std::uint64_t>(max_bytes, 64));
  strata_buffer rfull = p2p.buffer(rbuf.get(), std::max<std::uint64_t>(max_bytes, 64));
  // Tag 0 synchronises; each size uses its own tag so a late message can never be taken for another size's.
  auto sync = [&] {
    strata_request_t r = p2p.irecv(peer, 0, sync_recv);
    p2p.wait(p2p.isend(peer, 0, sync_send), "pingpong sync send");
    p2p.wait(r, "pingpong sync receive");
  };
  std::unique_ptr<SocketRef> sock;
  if (o.socket_reference) sock = std::make_unique<SocketRef>(p2p, rank, o.timeout_s);
  if (rank == 0 && !o.json) {
    std::printf("# pingpong, transport=%s, options=%s, trials=%d (one-way time = median round trip / 2)\n",
                o.transport.c_str(), transport_options(o).dump().c_str(), o.trials);
    if (sock)
      std::printf("# sock_busy/sock_block: plain loopback TCP sockets between the same two processes, same sizes "
                  "and iterations, recv busy-polling (MSG_DONTWAIT) / blocking; x_busy, x_block = time / that\n");
    if (sock)
      std::printf("%10s %10s %12s %12s %8s %14s %14s %8s %8s\n", "size", "iters", "time(us)", "bw(GB/s)", "wrong",
                  "sock_busy(us)", "sock_block(us)", "x_busy", "x_block");
    else
      std::printf("%10s %10s %12s %12s %8s\n", "size", "iters", "time(us)", "bw(GB/s)", "wrong");
    std::fflush(stdout);
  }
  nlohmann::json results = nlohmann::json::array();
  std::vector<double> times(std::size_t(o.trials));
  std::uint64_t tag = 1;
  for (const std::uint64_t bytes : o.sizes) {
    ++tag;
    strata_buffer sb = sfull, rb = rfull;
    sb.bytes = bytes;
    rb.bytes = bytes;
    auto* sp = static_cast<unsigned char*>(sbuf.get());
    auto* rp = static_cast<unsigned char*>(rbuf.get());
    for (std::uint64_t i = 0; i < bytes; ++i) sp[i] = static_cast<unsigned char>((i * 7 + std::uint64_t(rank) * 13) & 0xff);
    std::memset(rp, 0, bytes);
    auto round_trip = [&] {
      if (rank == 0) {
        strata_request_t r = p2p.irecv(peer, tag, rb);
        p2p.wait(p2p.isend(peer, tag, sb), "pingpong send");
        p2p.wait(r, "pingpong receive");
      } else {
        p2p.wait(p2p.irecv(peer, tag, rb), "pingpong receive");
        p2p.wait(p2p.isend(peer, tag, sb), "pingpong send");
      }
    };
    sync();
    round_trip();  // checked: every byte must be the peer's pattern
    std::int64_t wrong = 0;
    for (std::uint64_t i = 0; i < bytes; ++i)
      wrong += rp[i] != static_cast<unsigned char>((i * 7 + std::uint64_t(peer) * 13) & 0xff);
    if (wrong != 0)
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "pingpong of ", bytes, " bytes over ", o.transport, ": ", wrong,
                   " byte(s) on rank ", rank, " differ from what rank ", peer, " sent");
    std::int64_t iters = o.iters;
    if (iters == 0) iters = std::clamp<std::int64_t>(std::int64_t((64ull << 20) / std::max<std::uint64_t>(bytes, 1)), 20, 2000);
    const std::int64_t warmup = o.warmup >= 0 ? o.warmup : iters / 5;
    for (std::int64_t i = 0; i < warmup; ++i) round_trip();
    for (int t = 0; t < o.trials; ++t) {
      sync();
      const auto t0 = Clock::now();
      for (std::int64_t i = 0; i < iters; ++i) round_trip();
      times[std::size_t(t)] = std::chrono::duration<double>(Clock::now() - t0).count() / double(iters) / 2;
    }
    // The socket references, with the same bytes and iterations (the peer's
    // pattern is checked once more on the busy-polling exchange).
    double sock_med[2] = {0, 0};
    if (sock) {
      std::vector<double> st(std::size_t(o.trials));
      for (int mode = 0; mode < 2; ++mode) {
        const bool busy = mode == 0;
        auto sock_trip = [&] {
          if (rank == 0) {
            sock->send_all(sp, bytes);
            sock->recv_all(rp, bytes, busy);
          } else {
            sock->recv_all(rp, bytes, busy);
            sock->send_all(sp, bytes);
          }
        };
        std::memset(rp, 0, bytes);
        sync();
        sock_trip();
        for (std::uint64_t i = 0; i < bytes; ++i)
          wrong += rp[i] != static_cast<unsigned char>((i * 7 + std::uint64_t(peer) * 13) & 0xff);
        for (std::int64_t i = 0; i < warmup; ++i) sock_trip();
        for (int t = 0; t < o.trials; ++t) {
          sync();
          const auto t0 = Clock::now();
          for (std::int64_t i = 0; i < iters; ++i) sock_trip();
          st[std::size_t(t)] = std::chrono::duration<double>(Clock::now() - t0).count() / double(iters) / 2;
        }
        std::sort(st.begin(), st.end());
        sock_med[mode] = st[st.size() / 2];
      }
      if (wrong != 0)
        STRATA_THROW(STRATA_ERR_DATA_LOSS, "pingpong socket reference of ", bytes, " bytes: ", wrong,
                     " byte(s) on rank ", rank, " differ from what rank ", peer, " sent");
    }
    if (rank != 0) continue;
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    const double bw = double(bytes) / med / 1e9;
    if (o.json) {
      results.push_back({{"op", "pingpong"}, {"transport", o.transport}, {"options", transport_options(o)},
                         {"bytes", bytes}, {"iters", iters}, {"trials", o.trials}, {"time_us", med * 1e6},
                         {"time_min_us", sorted.front() * 1e6}, {"time_max_us", sorted.back() * 1e6},
                         {"bw_gbps", bw}, {"wrong", wrong}});
      if (sock) {
        results.back()["socket_busy_poll_us"] = sock_med[0] * 1e6;
        results.back()["socket_blocking_us"] = sock_med[1] * 1e6;
      }
    } else if (sock) {
      std::printf("%10s %10lld %12.2f %12.3f %8lld %14.2f %14.2f %8.2f %8.2f\n", format_size(bytes).c_str(),
                  static_cast<long long>(iters), med * 1e6, bw, static_cast<long long>(wrong), sock_med[0] * 1e6,
                  sock_med[1] * 1e6, med / sock_med[0], med / sock_med[1]);
      std::fflush(stdout);
    } else {
      std::printf("%10s %10lld %12.2f %12.3f %8lld\n", format_size(bytes).c_str(), static_cast<long long>(iters),
                  med * 1e6, bw, static_cast<long long>(wrong));
      std::fflush(stdout);
    }
  }
  if (rank == 0 && o.json) {
    std::printf("%s\n", nlohmann::json{{"results", results}}.dump(2).c_str());
    std::fflush(stdout);
  }
  sync();  // leave together, so neither side sees the other's endpoint close mid-exchange
  return 0;
}

// One HMAC-SHA256 over a handshake-sized message (the store's and the tcp
// transport's proofs), median of 2001 timed calls in this process.
double hmac_sha256_us() {
  const std::string key(32, 'k'), msg(96, 'm');
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  std::vector<double> t(2001);
  for (double& x : t) {
    const auto t0 = Clock::now();
    HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out,
         &len);
    x = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  std::nth_element(t.begin(), t.begin() + 1000, t.end());
  return t[1000];
}

// This process's connected TCP sockets that are not the store's (every
// rank has one to the store, rank 0 one from each rank): the transport's.
// And its open fds and memory (PSS), for what a large job needs.
struct ProcessUse {
  int transport_sockets = 0;
  int fds = 0;
  double pss_mib = 0;
};

ProcessUse process_use(int store_port) {
  ProcessUse u;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      ++u.fds;
      const int fd = std::atoi(e->d_name);
      int type = 0;
      socklen_t tl = sizeof type;
      if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
      sockaddr_storage self{}, peer{};
      socklen_t sl = sizeof self, pl = sizeof peer;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
      if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;  // listening
      auto port = [](const sockaddr_storage& a) -> int {
        if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
        if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
        return -1;
      };
      if (port(self) < 0 || port(self) == store_port || port(peer) == store_port) continue;
      ++u.transport_sockets;
    }
    ::closedir(d);
  }
  // Proportional set size: shared pages (the libraries every rank maps)
  // count 1/N each, so N times this is what N ranks take.
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f != nullptr) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::strncmp(line, "Pss:", 4) == 0) u.pss_mib = std::atof(line + 4) / 1024.0;
    std::fclose(f);
  }
  return u;
}

// strata-bench rendezvous: what joining a job costs. Each rank times its
// connect_store (the authenticated store handshake: challenge, HELLO with
// its HMAC proof, the server's proof) once, then, --repeats times, builds a
// ring communicator (rendezvous gate, address exchange; with the tcp
// transport's lazy connections nothing else) and does one all-reduce of one
// value (which makes the connections it needs: with the tcp transport's
// lazy connections and --ring-options '{"direct_max_bytes": 0}' a signed
// handshake with each ring neighbour; with the ring's default, a payload
// this small goes straight to every rank, and so connects to all of them),
// and times both; every figure is the slowest rank's.
// Then it counts each rank's transport sockets (connected TCP sockets other
// than the store's), open fds and memory.
int rendezvous_body(const MultiProcOptions& o, int rank, double store_s) {
  std::vector<double> setup(std::size_t(o.trials)), ready(std::size_t(o.trials));
  double store_max = 0;
  int store_port = -1;
  {
    const std::string a = PluginHost::global().store_address();
    if (a.rfind(':') != std::string::npos) store_port = std::atoi(a.c_str() + a.rfind(':') + 1);
  }
  double sockets_max = 0, sockets_min = 0, fds_max = 0, pss_max = 0;
  for (int t = 0; t < o.trials; ++t) {
    const auto t0 = Clock::now();
    Ring ring(o, rank, str_cat("strata-bench-rendezvous-", t));
    const double dt_setup = std::chrono::duration<double>(Clock::now() - t0).count();
    (void)ring.sum_across_ranks(1);  // ready: the communicator did its first all-reduce
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    setup[std::size_t(t)] = ring.max_across_ranks(dt_setup);
    ready[std::size_t(t)] = ring.max_across_ranks(dt);
    if (t == 0) store_max = ring.max_across_ranks(store_s);
    if (t == o.trials - 1) {
      // (Not ring.barrier(): the ring's barrier, like its all-reduces up to
      // direct_max_bytes, talks to every rank, which would connect them all.)
      (void)ring.sum_across_ranks(0);
      const ProcessUse u = process_use(store_port);
      sockets_max = ring.max_across_ranks(u.transport_sockets);
      sockets_min = -ring.max_across_ranks(-u.transport_sockets);
      fds_max = ring.max_across_ranks(u.fds);
      pss_max = ring.max_across_ranks(u.pss_mib);
    }
    (void)ring.sum_across_ranks(0);  // every rank is done with this communicator
  }
  if (rank != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double med = median(ready), setup_med = median(setup);
  const double lo = *std::min_element(ready.begin(), ready.end()), hi = *std::max_element(ready.begin(), ready.end());
  const double hmac_us = hmac_sha256_us();
  // Per rank: 2 HMACs for the store (its proof and the check of the
  // server's) plus 2 per transport connection (its proof, the check of the
  // peer's).
  const int hmacs_per_rank = 2 + 2 * static_cast<int>(sockets_max);
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"results",
                                        {{{"op", "rendezvous"},
                                          {"transport", o.transport},
                                          {"ranks", o.ranks},
                                          {"trials", o.trials},
                                          {"connect_store_max_ms", store_max * 1e3},
                                          {"communicator_create_ms", setup_med * 1e3},
                                          {"communicator_setup_ms", med * 1e3},
                                          {"communicator_setup_min_ms", lo * 1e3},
                                          {"communicator_setup_max_ms", hi * 1e3},
                                          {"transport_sockets_per_rank_max", sockets_max},
                                          {"transport_sockets_per_rank_min", sockets_min},
                                          {"open_fds_per_rank_max", fds_max},
                                          {"pss_mib_per_rank_max", pss_max},
                                          {"hmac_sha256_us", hmac_us},
                                          {"hmacs_per_rank", hmacs_per_rank}}}}}
                                 .dump(2)
                                 .c_str());
  } else {
    std::printf("# rendezvous, ranks=%d, transport=%s, trials=%d (slowest rank of each)\n", o.ranks,
                o.transport.c_str(), o.trials);
    std::printf("connect_store (authenticated store handshake, once per process): %.2f ms\n", store_max * 1e3);
    std::printf("communicator create (gate + addresses): median %.2f ms\n", setup_med * 1e3);
    std::printf("ready (create + first all-reduce, with its connections): median %.2f ms (min %.2f, max %.2f)\n",
                med * 1e3, lo * 1e3, hi * 1e3);
    std::printf("transport sockets per rank: %.0f..%.0f; open fds per rank: max %.0f; memory per rank (PSS): max "
                "%.1f MiB\n",
                sockets_min, sockets_max, fds_max, pss_max);
    std::printf("HMAC-SHA256 of a handshake: %.2f us; %d per rank = %.1f us of each rank's setup\n", hmac_us,
                hmacs_per_rank, hmac_us * hmacs_per_rank);
  }
  std::fflush(stdout);
  return 0;
}

int worker_body(const MultiProcOptions& o, int rank) {
  const char* store = std::getenv(kStoreEnv);
  if (store == nullptr || *store == '\0')
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "--bench-worker-rank is internal: run strata-bench ", o.op,
                 " --transport ", o.transport, " -n N, which starts the workers itself");
  StoreConfig cfg;
  cfg.address = store;
  cfg.serve = rank == 0;
  cfg.timeout_s = o.timeout_s;
  const auto store_t0 = Clock::now();
  PluginHost::global().connect_store(cfg);
  const double store_s = std::chrono::duration<double>(Clock::now() - store_t0).count();
  if (rank == 0) {
    const char* fd_text = std::getenv(kReportFdEnv);
    if (fd_text == nullptr) STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "rank 0 has no report pipe (", kReportFdEnv, ")");
    const int fd = std::atoi(fd_text);
    const std::string line = PluginHost::global().store_address() + "\n";
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, "rank 0 cannot report the store address to the launcher (",
                   std::strerror(errno), ")");
    ::close(fd);
  }
  if (o.device == "gpu") return run_gpu_allreduce(o, rank);
  if (o.op == "pingpong") return pingpong_body(o, rank);
  if (o.op == "rendezvous") return rendezvous_body(o, rank, store_s);
  Ring ring(o, rank);
  const DTypeInfo& d = dtype_info(o.dtype);
  const int n = o.ranks;
  const double factor = busbw_factor(o.op, n);
  nlohmann::json results = nlohmann::json::array();
  if (rank == 0 && !o.json) {
    std::printf("# %s %s%s, ranks=%d, transport=%s, trials=%d, busbw factor=%.3f\n", o.op.c_str(), d.name,
                o.op == "allreduce" ? " SUM" : "", n, o.transport.c_str(), o.trials, factor);
    std::printf("%10s %12s %8s %12s %12s %12s %8s\n", "size", "count", "dtype", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "wrong");
    std::fflush(stdout);
  }
  std::vector<double> times(std::size_t(o.trials));
  for (std::uint64_t requested : o.sizes) {
    std::size_t count = std::size_t(requested / d.size);
    if (o.op == "allgather") count -= count % std::size_t(n);
    const std::size_t bytes = count * d.size;
    const std::size_t per = count / std::size_t(n);
    Mem send = alloc_aligned(bytes), recv = alloc_aligned(bytes);
    std::int64_t full = std::int64_t(count), part = std::int64_t(per);
    const DLTensor in = tensor_1d(send.get(), o.op == "allgather" ? &part : &full, d.dl);
    DLTensor out = tensor_1d(recv.get(), &full, d.dl);
    const std::string what = str_cat(o.op, " of ", format_size(bytes), " bytes");
    const bool all_reduce = o.op == "allreduce", broadcast = o.op == "broadcast";  // not compared per call
    auto run_op = [&] {
      if (all_reduce) ring.all_reduce(STRATA_REDUCE_SUM, &in, &out, what.c_str());
      else if (broadcast) ring.broadcast(&out, &out, what.c_str());  // in place, as MPI_Bcast
      else ring.all_gather(&in, &out, what.c_str());
    };
    std::int64_t iters = o.iters;
    if (iters == 0) iters = std::clamp<std::int64_t>(std::int64_t((256ull << 20) / bytes), 5, 1000);
    const std::int64_t warmup = o.warmup >= 0 ? o.warmup : iters / 5;

    // Warm-up with a correctness check of its first operation.
    fill_any(d, o.op, send.get(), recv.get(), count, rank, n);
    ring.barrier();
    run_op();
    const std::int64_t wrong = ring.sum_across_ranks(wrong_any(d, o.op, recv.get(), count, n));
    for (std::int64_t i = 0; i < warmup; ++i) run_op();

    // Each batch: the slowest rank's time per operation.
    for (int t = 0; t < o.trials; ++t) {
      ring.barrier();
      const auto t0 = Clock::now();
      for (std::int64_t i = 0; i < iters; ++i) run_op();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count() / double(iters);
      times[std::size_t(t)] = ring.max_across_ranks(dt);
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    const double algbw = double(bytes) / med / 1e9;
    if (rank != 0) continue;
    if (o.json) {
      results.push_back({{"op", o.op}, {"transport", o.transport}, {"ranks", n}, {"bytes", bytes},
                         {"count", count}, {"dtype", d.name}, {"iters", iters}, {"trials", o.trials},
                         {"time_us", med * 1e6}, {"time_min_us", sorted.front() * 1e6},
                         {"time_max_us", sorted.back() * 1e6}, {"algbw_gbps", algbw},
                         {"busbw_gbps", algbw * factor}, {"wrong", wrong}});
    } else {
      std::printf("%10s %12zu %8s %12.1f %12.3f %12.3f %8lld\n", format_size(bytes).c_str(), count, d.name,
                  med * 1e6, algbw, algbw * factor, static_cast<long long>(wrong));
      std::fflush(stdout);
    }
  }
  if (rank == 0 && o.json) {
    std::printf("%s\n", nlohmann::json{{"results", results}}.dump(2).c_str());
    std::fflush(stdout);
  }
  // Leave together: a rank that exits early would make a slower one see a
  // closed connection in its last collective.
  ring.barrier();
  return 0;
}

}  // namespace

int run_launcher(const MultiProcOptions& o, int argc, char** argv) {
  validate(o);
  // A transport that is not installed would fail rank 0 and leave the others
  // waiting for its store until they are killed: say so once, before any
  // rank starts.
  PluginHost& host = PluginHost::global();
  if (!host.has_component(STRATA_KIND_TRANSPORT, o.transport)) {
    std::string names;
    for (const PluginInfo& p : host.discover())
      if (p.ok && p.kind == "transport") names += (names.empty() ? "" : ", ") + p.name;
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "--transport ", o.transport, ": no such transport is installed; available: ",
                 names.empty() ? "(none)" : names, " (strata-info lists them and where it looked)");
  }
  const char* env_token = std::getenv("STRATA_AUTH_TOKEN");
  const std::string token = env_token != nullptr && *env_token != '\0' ? env_token : random_token();
  const std::string exe = self_exe();
  const std::vector<std::string> args(argv, argv + argc);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, "cannot create a pipe for the workers (", std::strerror(errno), ")");
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  pid_t first = -1;
  try {
    first = spawn_worker(exe, args, 0, "127.0.0.1:0", token, fds[1]);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  ::close(fds[1]);
  pids.push_back(first);
  const std::string addr =
      read_store_address(fds[0], Clock::now() + std::chrono::milliseconds(static_cast<long long>(o.timeout_s * 1000)));
  ::close(fds[0]);
  if (addr.empty()) {
    std::fprintf(stderr, "strata-bench: rank 0 did not report its rendezvous store address within %.0f s\n",
                 o.timeout_s);
    ::kill(first, SIGKILL);  // stuck, or already gone (then this does nothing to it: it is not reaped yet)
    supervise(pids, 0);
    return 1;
  }
  int failed_to_start = -1;
  for (int r = 1; r < o.ranks; ++r) {
    try {
      pids.push_back(spawn_worker(exe, args, r, addr, token, -1));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata-bench: %s\n", e.what());
      failed_to_start = r;
      break;
    }
  }
  return supervise(pids, failed_to_start);
}

int run_worker(const MultiProcOptions& o, int rank) {
  try {
    return worker_body(o, rank);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "strata-bench: rank %d: error: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace strata::bench
