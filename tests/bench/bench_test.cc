// SPDX-License-Identifier: Apache-2.0
// Smoke tests of strata-bench. The multi-process mode starts real worker
// processes over the tcp transport (ephemeral ports, so tests may run in
// parallel); every test kills and reaps what it started on every path.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A started strata-bench with stdout and stderr in files. The destructor
// kills and reaps it if the test did not.
class Bench {
 public:
  explicit Bench(const std::vector<std::string>& args) {
    static int counter = 0;
    const std::string base =
        ::testing::TempDir() + "bench_test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    out_path_ = base + ".out";
    err_path_ = base + ".err";
    std::vector<std::string> all{STRATA_BENCH_BIN};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      if (::getppid() != parent) ::_exit(126);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out);
    ::close(err);
  }
  ~Bench() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::remove(out_path_.c_str());
    std::remove(err_path_.c_str());
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  pid_t pid() const { return pid_; }
  std::string out() const { return slurp(out_path_); }
  std::string err() const { return slurp(err_path_); }

  /// Exit status (128 + signal when killed), or -1 when still running at the deadline (then killed).
  int wait(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (pid_ > 0) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  std::string out_path_, err_path_;
};

// Direct children of `pid` (Linux /proc/<pid>/task/<pid>/children).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t c; f >> c;) out.push_back(c);
  return out;
}

// The worker rank a process was started as (its --bench-worker-rank), or -1.
int worker_rank_of(pid_t pid) {
  std::string cmd = slurp("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  std::string cur;
  for (char ch : cmd) {
    if (ch == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--bench-worker-rank") return std::stoi(args[i + 1]);
  return -1;
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

nlohmann::json run_json(const std::vector<std::string>& args) {
  Bench b(args);
  const int rc = b.wait(std::chrono::seconds(180));
  EXPECT_EQ(rc, 0) << "stderr:\n" << b.err();
  if (rc != 0) return nlohmann::json();
  const nlohmann::json j = nlohmann::json::parse(b.out(), nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("results")) << "stdout:\n" << b.out();
  return j;
}

void check_entry(const nlohmann::json& r, const std::string& op, int ranks, uint64_t bytes, double factor) {
  SCOPED_TRACE(r.dump());
  EXPECT_EQ(r.at("op"), op);
  EXPECT_EQ(r.at("ranks"), ranks);
  EXPECT_EQ(r.at("bytes").get<uint64_t>(), bytes);
  EXPECT_EQ(r.at("wrong").get<int64_t>(), 0);
  const double t = r.at("time_us").get<double>();
  const double algbw = r.at("algbw_gbps").get<double>();
  const double busbw = r.at("busbw_gbps").get<double>();
  EXPECT_GT(t, 0.0);
  EXPECT_NEAR(algbw, double(bytes) / (t * 1e-6) / 1e9, algbw * 1e-9);
  EXPECT_NEAR(busbw, algbw * factor, algbw * 1e-9);
}

TEST(BenchTest, AllReduceAcrossTwoProcessesPrintsJson) {
  // 4K takes the direct path, 64K and 1M (with 256K chunks) the pipelined ring.
  const nlohmann::json j = run_json({"allreduce", "--transport", "tcp", "-n", "2", "--sizes", "4K,64K,1M", "--iters",
                                     "3", "--warmup", "1", "--repeats", "3", "--ring-options",
                                     R"({"chunk_bytes": 262144})", "--json"});
  ASSERT_TRUE(j.contains("results"));
  const auto& res = j["results"];
  ASSERT_EQ(res.size(), 3u);
  const uint64_t want[] = {4096, 65536, 1 << 20};
  for (size_t i = 0; i < 3; ++i) {
    check_entry(res[i], "allreduce", 2, want[i], 1.0);
    EXPECT_EQ(res[i].at("count").get<uint64_t>(), want[i] / 4);
    EXPECT_EQ(res[i].at("iters"), 3);
    EXPECT_EQ(res[i].at("trials"), 3);
    EXPECT_EQ(res[i].at("transport"), "tcp");
  }
}

TEST(BenchTest, BroadcastAndAllGatherAcrossThreeProcesses) {
  const nlohmann::json b = run_json({"broadcast", "-n", "3", "--sizes", "4K,1M", "--iters", "2", "--repeats", "1",
                                     "--json"});
  ASSERT_TRUE(b.contains("results"));
  ASSERT_EQ(b["results"].size(), 2u);
  check_entry(b["results"][0], "broadcast", 3, 4096, 1.0);
  check_entry(b["results"][1], "broadcast", 3, 1 << 20, 1.0);

  // allgather sizes are the whole output, rounded down to whole elements per rank.
  const nlohmann::json g = run_json({"allgather", "-n", "3", "--sizes", "4K,1M", "--iters", "2", "--repeats", "1",
                                     "--dtype", "int64", "--json"});
  ASSERT_TRUE(g.contains("results"));
  ASSERT_EQ(g["results"].size(), 2u);
  check_entry(g["results"][0], "allgather", 3, 4080, 2.0 / 3.0);  // 510 int64 = 3 x 170
  check_entry(g["results"][1], "allgather", 3, 1048560, 2.0 / 3.0);
  EXPECT_EQ(g["results"][0].at("dtype"), "int64");
}

TEST(BenchTest, TableHasTheNcclTestsColumns) {
  Bench b({"allreduce", "--transport", "tcp", "-n", "3", "--sizes", "4K:16K", "--iters", "2", "--repeats", "1"});
  ASSERT_EQ(b.wait(std::chrono::seconds(120)), 0) << b.err();
  const std::string out = b.out();
  for (const char* col : {"size", "count", "dtype", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong"})
    EXPECT_NE(out.find(col), std::string::npos) << col << " missing from:\n" << out;
  std::istringstream lines(out);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string size, count, dtype;
    double t = 0, alg = 0, bus = 0;
    long long wrong = -1;
    if (!(f >> size >> count >> dtype >> t >> alg >> bus >> wrong)) continue;
    ++rows;
    EXPECT_EQ(dtype, "float32");
    EXPECT_EQ(wrong, 0) << line;
    EXPECT_NEAR(bus, alg * 4.0 / 3.0, 0.002) << line;
  }
  EXPECT_EQ(rows, 3) << out;  // 4K, 8K, 16K
}

TEST(BenchTest, DeadWorkerFailsTheBenchAndLeavesNoProcess) {
  // Runs until a worker dies: many iterations of a 4 MiB all-reduce.
  Bench b({"allreduce", "--transport", "tcp", "-n", "3", "--sizes", "4M", "--iters", "100000", "--timeout", "30"});
  // Wait until rank 0 has printed the table header: every rank has joined.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (b.out().find("wrong") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(b.out().find("wrong"), std::string::npos) << "the workers never started:\n" << b.err();
  std::vector<pid_t> workers = children_of(b.pid());
  ASSERT_EQ(workers.size(), 3u);
  pid_t victim = -1;
  for (pid_t w : workers)
    if (worker_rank_of(w) == 1) victim = w;
  ASSERT_GT(victim, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto t0 = Clock::now();
  const int rc = b.wait(std::chrono::seconds(60));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << "the bench did not end after a worker died";
  EXPECT_LT(secs, 20.0) << "the survivors should fail fast, not at their deadline";
  const std::string err = b.err();
  EXPECT_NE(err.find("rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9"), std::string::npos) << err;
  // The survivors report the collective that failed and name the lost peer:
  // an all-reduce, or the barrier before the timed loop when the kill lands
  // first (a sanitizer build on a slow machine still sets up 300 ms later).
  EXPECT_TRUE(err.find("all_reduce #") != std::string::npos || err.find("barrier #0") != std::string::npos) << err;
  EXPECT_NE(err.find("rank 1 of 3"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 0: error"), std::string::npos) << err;
  for (pid_t w : workers) EXPECT_FALSE(process_exists(w)) << "worker " << w << " outlived the bench";
}

TEST(BenchTest, BadOptionsAreRejectedWithWhatToDo) {
  {
    Bench b({"allreduce", "--transport", "tcp", "-n", "2", "--dtype", "float16"});
    EXPECT_EQ(b.wait(std::chrono::seconds(30)), 2);
    EXPECT_NE(b.err().find("use float32, float64, int32 or int64"), std::string::npos) << b.err();
  }
  {
    Bench b({"allgather", "-n", "4", "--sizes", "8"});
    EXPECT_EQ(b.wait(std::chrono::seconds(30)), 2);
    EXPECT_NE(b.err().find("raise the smallest --sizes"), std::string::npos) << b.err();
  }
  {
    Bench b({"broadcast", "-n", "2", "--ring-options", "[1]"});
    EXPECT_EQ(b.wait(std::chrono::seconds(30)), 2);
    EXPECT_NE(b.err().find("not a JSON object"), std::string::npos) << b.err();
  }
}

TEST(BenchTest, PingPongReportsLatencyAndBandwidthPerSize) {
  // --option goes on top of --transport-options; the checked first round trip
  // must deliver every byte of each size, including 0 and odd sizes.
  const nlohmann::json j = run_json({"pingpong", "--transport", "tcp", "-n", "2", "--sizes", "0,1,4095,1M",
                                     "--transport-options", R"({"connections_per_peer": 2})", "--option",
                                     "connections_per_peer=1", "--iters", "20", "--repeats", "3", "--json"});
  ASSERT_TRUE(j.contains("results"));
  const auto& res = j["results"];
  ASSERT_EQ(res.size(), 4u);
  const uint64_t want[] = {0, 1, 4095, 1 << 20};
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(res[i].dump());
    EXPECT_EQ(res[i].at("op"), "pingpong");
    EXPECT_EQ(res[i].at("transport"), "tcp");
    EXPECT_EQ(res[i].at("options"), nlohmann::json({{"connections_per_peer", 1}}));
    EXPECT_EQ(res[i].at("bytes").get<uint64_t>(), want[i]);
    EXPECT_EQ(res[i].at("wrong").get<int64_t>(), 0);
    EXPECT_EQ(res[i].at("iters"), 20);
    const double t = res[i].at("time_us").get<double>();
    EXPECT_GT(t, 0.0);
    EXPECT_LE(res[i].at("time_min_us").get<double>(), t);
    EXPECT_GE(res[i].at("time_max_us").get<double>(), t);
    EXPECT_NEAR(res[i].at("bw_gbps").get<double>(), double(want[i]) / (t * 1e-6) / 1e9, 1e-9 + want[i] * 1e-12);
  }
}

TEST(BenchTest, PingPongBadUsageSaysWhatToDo) {
  {
    Bench b({"pingpong", "-n", "3"});
    EXPECT_EQ(b.wait(std::chrono::seconds(30)), 2);
    EXPECT_NE(b.err().find("exactly 2 processes; pass -n 2"), std::string::npos) << b.err();
  }
  {
    Bench b({"pingpong", "--option", "provider"});
    EXPECT_EQ(b.wait(std::chrono::seconds(30)), 2);
    EXPECT_NE(b.err().find("--option 'provider' is not KEY=JSON"), std::string::npos) << b.err();
  }
  {
    // Rank 0 fails creating its transport; rank 1, which may still be
    // connecting to rank 0's store, is stopped 2 s later, not 15.
    Bench b({"pingpong", "--option", "connections_per_peer=9"});
    EXPECT_GT(b.wait(std::chrono::seconds(10)), 0);
    EXPECT_NE(b.err().find("connections_per_peer"), std::string::npos) << b.err();
  }
  {
    // Refused before any rank starts (it used to leave rank 1 waiting for
    // rank 0's store until the launcher killed it 15 s later).
    Bench b({"pingpong", "--transport", "no_such_transport", "--sizes", "64"});
    EXPECT_EQ(b.wait(std::chrono::seconds(10)), 2);
    EXPECT_NE(b.err().find("--transport no_such_transport: no such transport is installed; available: "),
              std::string::npos)
        << b.err();
    EXPECT_NE(b.err().find("tcp"), std::string::npos) << b.err();
    EXPECT_EQ(b.err().find("rank 1"), std::string::npos) << b.err();
  }
}

TEST(BenchTest, RendezvousReportsTheCostOfJoiningAJob) {
  // 4 processes build 3 communicators in a row; each figure is the slowest
  // rank's, so it can only be positive, and the median lies between min and max.
  const nlohmann::json j = run_json({"rendezvous", "-n", "4", "--repeats", "3", "--json"});
  ASSERT_TRUE(j.contains("results"));
  ASSERT_EQ(j["results"].size(), 1u);
  const auto& r = j["results"][0];
  SCOPED_TRACE(r.dump());
  EXPECT_EQ(r.at("op"), "rendezvous");
  EXPECT_EQ(r.at("ranks"), 4);
  EXPECT_EQ(r.at("trials"), 3);
  EXPECT_GT(r.at("connect_store_max_ms").get<double>(), 0.0);
  const double med = r.at("communicator_setup_ms").get<double>();
  EXPECT_GT(med, 0.0);
  EXPECT_LE(r.at("communicator_setup_min_ms").get<double>(), med);
  EXPECT_GE(r.at("communicator_setup_max_ms").get<double>(), med);
  EXPECT_GT(r.at("hmac_sha256_us").get<double>(), 0.0);
  Bench bad({"rendezvous", "-n", "1"});
  EXPECT_NE(bad.wait(std::chrono::seconds(30)), 0);
  EXPECT_NE(bad.err().find("--ranks: Value 1 not in range 2 to 4096"), std::string::npos) << bad.err();
}

TEST(BenchTest, InProcessModesStillWork) {
  const nlohmann::json j =
      run_json({"allreduce", "--replicas", "2", "--sizes", "4K", "--repeats", "1", "--json"});
  ASSERT_TRUE(j.contains("results"));
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["results"][0].at("transport"), "in-process");
  EXPECT_EQ(j["results"][0].at("wrong"), 0);
  const nlohmann::json d =
      run_json({"dispatch", "--strategies", "default,mirrored:2", "--iters", "100", "--repeats", "1", "--json"});
  ASSERT_TRUE(d.contains("results"));
  EXPECT_EQ(d["results"].size(), 2u);
}

// strata-bench checkpoint: a small run prints every figure and the load,
// checks what it restored, and leaves nothing in --dir. No speed threshold:
// the figures are the bench's business, not a test's.
TEST(BenchTest, CheckpointPrintsEveryFigure) {
  const std::string dir = ::testing::TempDir() + "bench_test-ckpt-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  Bench b({"checkpoint", "--size-mb", "8", "--repeats", "1", "--dir", dir});
  ASSERT_EQ(b.wait(std::chrono::seconds(180)), 0) << b.err();
  const std::string out = b.out();
  for (const char* row : {"save         Checkpoint::save", "write        plain write(2) + fsync",
                          "restore warm Checkpoint::restore", "read warm    plain read(2)",
                          "restore cold Checkpoint::restore", "read cold    plain read(2)"}) {
    const std::size_t at = out.find(row);
    ASSERT_NE(at, std::string::npos) << row << " missing in:\n" << out;
    // "<label>   1234.5" or, on checkpoint rows, "<label>   1234.5   0.93".
    const std::string line = out.substr(at, out.find('\n', at) - at);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, std::regex(R"(\s([0-9]+\.[0-9])(\s+[0-9]+\.[0-9]{2})?$)"))) << line;
    EXPECT_GT(std::stod(m[1].str()), 0.0) << line;
    EXPECT_EQ(m[2].matched, std::string(row).find("Checkpoint::") != std::string::npos) << line;
  }
  for (const char* text : {"checkpoint: 8 float32 variables, 8 MiB", "load average (uptime) before: ",
                           "load average (uptime) after: ", "cold reads: at most ", "RSS: before the first save",
                           "wrong: 0 "})
    EXPECT_NE(out.find(text), std::string::npos) << text << " missing in:\n" << out;
  Bench j({"checkpoint", "--size-mb", "8", "--variables", "3", "--repeats", "1", "--dir", dir, "--json"});
  ASSERT_EQ(j.wait(std::chrono::seconds(180)), 0) << j.err();
  const nlohmann::json r = nlohmann::json::parse(j.out(), nullptr, false);
  ASSERT_TRUE(r.is_object()) << j.out();
  for (const char* k : {"save_mbps", "write_mbps", "restore_warm_mbps", "read_warm_mbps", "restore_cold_mbps",
                        "read_cold_mbps", "save_ratio", "restore_warm_ratio", "restore_cold_ratio"})
    EXPECT_GT(r.at(k).get<double>(), 0.0) << k;
  EXPECT_EQ(r.at("variables"), 3);
  EXPECT_EQ(r.at("wrong"), 0);
  EXPECT_GT(r.at("file_bytes").get<std::uint64_t>(), 8u << 20);
  EXPECT_TRUE(r.at("load_before").is_string());
  // The bench removed its files.
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << dir << " is not empty";
  Bench bad({"checkpoint", "--size-mb", "0"});
  EXPECT_NE(bad.wait(std::chrono::seconds(30)), 0);
}

}  // namespace
