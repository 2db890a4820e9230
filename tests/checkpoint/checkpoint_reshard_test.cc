// SPDX-License-Identifier: Apache-2.0
// Restore across worker counts with real processes: checkpoint_worker
// processes under multi_worker_mirrored (one replica each, TF_CONFIG over
// loopback, as strata-run or a cluster scheduler starts them) train and
// save with 4 workers, then restore and save with 2, with 1, and with 4
// again. At every hop each worker prints the cross-replica value of every
// variable (every dtype ON_WRITE, ON_READ SUM and MEAN) and the step; all
// must equal, bit for bit, what the first hop saved.
//
// Every child gets PR_SET_PDEATHSIG and a deadline and is killed and reaped
// on every path (test::Children); ports come from the OS.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Start `argv` with `env` set on top of ours (value "" unsets); stdout and
// stderr go to `log`.
pid_t start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, const fs::path& log) {
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
    for (const auto& [k, v] : env) {
      if (v.empty())
        ::unsetenv(k.c_str());
      else
        ::setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// The worker's JSON line, or null.
json result_of(const std::string& log) {
  std::istringstream lines(log);
  json j;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') j = json::parse(line, nullptr, false);
  return j.is_object() ? j : json();
}

TEST(CheckpointReshardTest, FourToTwoToOneToFourWorkersIsBitExact) {
  strata::test::TempDir dir;
  struct Hop {
    int workers;
    const char* mode;
  };
  const std::vector<Hop> hops{{4, "train"}, {2, "restore"}, {1, "restore"}, {4, "restore"}};
  json saved;  // name -> hex, as the first hop saved it
  for (std::size_t h = 0; h < hops.size(); ++h) {
    const int n = hops[h].workers;
    SCOPED_TRACE("hop " + std::to_string(h) + ": " + hops[h].mode + " with " + std::to_string(n) + " workers");
    const std::string save_dir = (dir.path() / ("hop" + std::to_string(h))).string();
    json cluster;
    for (int i = 0; i < n; ++i)
      cluster["worker"].push_back("127.0.0.1:" + std::to_string(strata::test::unused_port()));
    strata::test::Children children;
    std::vector<fs::path> logs;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv{STRATA_CHECKPOINT_WORKER_BIN, hops[h].mode};
      if (h > 0) argv.push_back((dir.path() / ("hop" + std::to_string(h - 1))).string());
      argv.push_back(save_dir);
      const std::map<std::string, std::string> env{
          {"TF_CONFIG", json{{"cluster", cluster}, {"task", {{"type", "worker"}, {"index", i}}}}.dump()},
          {"STRATA_AUTH_TOKEN", "checkpoint-reshard-test"},
          {"STRATA_CONFIG", ""},
          {"STRATA_STRATEGY", ""},
          {"STRATA_LOG_LEVEL", "warn"}};
      logs.push_back(dir.path() / ("hop" + std::to_string(h) + "-worker" + std::to_string(i) + ".log"));
      children.pids.push_back(start(argv, env, logs.back()));
    }
    std::string all_logs;
    std::vector<int> status;
    for (int i = 0; i < n; ++i) {
      status.push_back(strata::test::reap(children.pids[static_cast<std::size_t>(i)], 120000));
      all_logs += "--- worker " + std::to_string(i) + ":\n" + slurp(logs[static_cast<std::size_t>(i)]);
    }
    children.pids.clear();  // all reaped
    for (int i = 0; i < n; ++i) ASSERT_EQ(status[static_cast<std::size_t>(i)], 0) << all_logs;

    for (int i = 0; i < n; ++i) {
      const json r = result_of(slurp(logs[static_cast<std::size_t>(i)]));
      ASSERT_TRUE(r.is_object()) << all_logs;
      EXPECT_EQ(r["worker"], i);
      EXPECT_EQ(r["num_workers"], n);
      EXPECT_EQ(r["step"], 2) << "the step is tracked too";
      if (h == 0 && i == 0) saved = r["values"];
      ASSERT_EQ(r["values"].size(), saved.size()) << all_logs;
      for (const auto& [name, hex] : saved.items())
        EXPECT_EQ(r["values"][name], hex) << name << " on worker " << i << " differs from what hop 0 saved";
    }
    // The hop's checkpoint was written once, by its chief, with n workers.
    const json manifest = json::parse(slurp(fs::path(save_dir) / "manifest.json"), nullptr, false);
    ASSERT_TRUE(manifest.is_object()) << all_logs;
    EXPECT_EQ(manifest["written_by"]["num_workers"], n);
    EXPECT_EQ(manifest["written_by"]["worker_index"], 0);
    EXPECT_EQ(manifest["step"], 2);
  }
  // Not a vacuous comparison: the values are there and differ from one another.
  ASSERT_EQ(saved.size(), 12u);
  EXPECT_NE(saved["r_sum_f32"], saved["r_mean_f64"]);
  EXPECT_EQ(saved["w_big"].get<std::string>().size(), 2u * 4u * 300000u);
}

}  // namespace
