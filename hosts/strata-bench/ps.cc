// SPDX-License-Identifier: Apache-2.0
// strata-bench ps (see ps.h).
#include "ps.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "sizes.h"
#include "strata/config.hpp"
#include "strata/coordinator.hpp"
#include "strata/plugin_host.hpp"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

STRATA_REGISTER_FUNCTION("strata.bench.noop", [](const Args&) { return Value(); });

std::string load_avg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "unknown";
  return a + ", " + b + ", " + c;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (port < 0)
    throw std::runtime_error(std::string("strata-bench ps: cannot find a free TCP port on 127.0.0.1 (") +
                             std::strerror(err) + "); check that the loopback interface is up");
  return port;
}

void load_config() {
  Config cfg;
  cfg.apply_env();
  PluginHost::global().set_config(cfg.json());
}

// Kills and reaps the servers on every path out.
struct Servers {
  std::vector<pid_t> pids;
  ~Servers() {
    for (pid_t p : pids) {
      const auto end = Clock::now() + std::chrono::seconds(10);
      int st = 0;
      while (::waitpid(p, &st, WNOHANG) != p) {
        if (Clock::now() >= end) {
          ::kill(p, SIGKILL);
          ::waitpid(p, &st, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
};

}  // namespace

int run_ps_bench_server() {
  load_config();
  ServerOptions o;
  o.coordinator_timeout_s = 10;
  try {
    Server s = Server::from_env(o);
    s.join();
    return 0;
  } catch (const UnavailableError& e) {
    std::fprintf(stderr, "strata-bench ps server: %s\n", e.what());
    return 3;
  }
}

int run_ps_bench(const PsBenchOptions& o) {
  const std::vector<std::uint64_t> sizes = parse_sizes(o.sizes);
  json spec;
  auto addr = [] { return "127.0.0.1:" + std::to_string(free_port()); };
  spec["chief"] = {addr()};
  for (int i = 0; i < o.workers; ++i) spec["worker"].push_back(addr());
  for (int i = 0; i < o.ps; ++i) spec["ps"].push_back(addr());
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  STRATA_ENFORCE(n > 0, STRATA_ERR_INTERNAL, "cannot read /proc/self/exe");
  self[n] = '\0';
  const std::string load_before = load_avg();
  Servers servers;
  for (const auto& [type, count] : std::vector<std::pair<std::string, int>>{{"worker", o.workers}, {"ps", o.ps}}) {
    for (int i = 0; i < count; ++i) {
      const std::string tf = json{{"cluster", spec}, {"task", {{"type", type}, {"index", i}}}}.dump();
      const pid_t parent = ::getpid();
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
        ::setenv("TF_CONFIG", tf.c_str(), 1);
        ::execl(self, self, "ps", "--serve", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      STRATA_ENFORCE(pid > 0, STRATA_ERR_INTERNAL, "fork failed");
      servers.pids.push_back(pid);
    }
  }
  ::setenv("TF_CONFIG", json{{"cluster", spec}, {"task", {{"type", "chief"}, {"index", 0}}}}.dump().c_str(), 1);
  load_config();
  json out;
  {
    ClusterCoordinator c;
    // Closures: warm up, then K per repeat.
    for (int i = 0; i < 200; ++i) c.schedule("strata.bench.noop", {});
    c.join();
    std::vector<double> per_closure_us, schedule_us;
    for (int r = 0; r < o.repeats; ++r) {
      const auto t0 = Clock::now();
      for (std::int64_t k = 0; k < o.closures; ++k) c.schedule("strata.bench.noop", {});
      const auto t1 = Clock::now();
      c.join();
      const auto t2 = Clock::now();
      schedule_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(o.closures));
      per_closure_us.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() /
                               static_cast<double>(o.closures));
    }
    out["closures"] = {{"workers", o.workers},
                       {"closures_per_repeat", o.closures},
                       {"schedule_call_us", median(schedule_us)},
                       {"end_to_end_us_per_closure", median(per_closure_us)},
                       {"closures_per_s", 1e6 / median(per_closure_us)}};
    // Pull / push of one variable per size on ps 0 (ps tasks take variables
    // round robin, so with --ps > 1 every size gets its own after fillers).
    json rows = json::array();
    int created = 0;
    for (std::uint64_t bytes : sizes) {
      const std::int64_t elems = static_cast<std::int64_t>(std::max<std::uint64_t>(bytes / 4, 1));
      while (created % o.ps != 0) {
        c.create_variable("filler" + std::to_string(created), Tensor::scalar<float>(0.f));
        ++created;
      }
      const Tensor value = Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(elems), 1.5f), {elems});
      RemoteVariable v = c.create_variable("v" + format_size(bytes), value);
      ++created;
      std::vector<double> pull_s, push_s;
      const int reps = std::max(o.repeats, bytes <= (1u << 20) ? 20 : 0);
      for (int r = 0; r < reps; ++r) {
        auto t0 = Clock::now();
        const Tensor got = v.read();
        pull_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        // Checks the ends only: a copy of every element (to_vector) between
        // the timed pull and push moved 16 MiB through the caches and the
        // allocator right before each push.
        const float* g = got.data<float>();  // throws unless float32
        STRATA_ENFORCE(got.numel() == elems && g[0] == 1.5f && g[elems - 1] == 1.5f, STRATA_ERR_DATA_LOSS,
                       "pull returned other data than was pushed");
        t0 = Clock::now();
        v.assign(value);
        push_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      const double b = static_cast<double>(elems) * 4;
      rows.push_back({{"bytes", static_cast<std::uint64_t>(b)},
                      {"size", format_size(static_cast<std::uint64_t>(b))},
                      {"ps_task", v.shard_ps_task(0)},
                      {"pull_us", median(pull_s) * 1e6},
                      {"push_us", median(push_s) * 1e6},
                      {"pull_MBps", b / median(pull_s) / 1e6},
                      {"push_MBps", b / median(push_s) / 1e6}});
    }
    out["variables"] = rows;
  }  // the coordinator stops the servers
  out["load_before"] = load_before;
  out["load_after"] = load_avg();
  out["transport"] = std::getenv("STRATA_TRANSPORT") != nullptr ? std::getenv("STRATA_TRANSPORT") : "tcp (or the config's)";
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("strata-bench ps: %d worker(s), %d ps task(s); load before %s, after %s\n", o.workers, o.ps,
              load_before.c_str(), out["load_after"].get<std::string>().c_str());
  const json& cl = out["closures"];
  std::printf("closures: %.1f us per closure end to end (%.0f closures/s), schedule() call %.2f us\n",
              cl["end_to_end_us_per_closure"].get<double>(), cl["closures_per_s"].get<double>(),
              cl["schedule_call_us"].get<double>());
  std::printf("%10s %12s %12s %12s %12s\n", "size", "pull us", "pull MB/s", "push us", "push MB/s");
  for (const auto& r : out["variables"])
    std::printf("%10s %12.1f %12.1f %12.1f %12.1f\n", r["size"].get<std::string>().c_str(), r["pull_us"].get<double>(),
                r["pull_MBps"].get<double>(), r["push_us"].get<double>(), r["push_MBps"].get<double>());
  return 0;
}

}  // namespace strata::bench
