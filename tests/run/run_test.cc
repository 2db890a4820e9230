// SPDX-License-Identifier: Apache-2.0
// strata-run end to end, with run_probe as the program: environment, output
// prefixes, failure propagation, timeouts, signal forwarding, the trace
// directory and the failure summary, and that no child outlives the launcher
// on any path.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "subprocess.h"

namespace strata {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class RunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Children orphaned by a killed strata-run are re-parented to this
    // process, so the test can reap them and see that they died.
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }
  void TearDown() override {
    for (pid_t pid : pids(16))
      if (test::process_alive(pid)) ::kill(pid, SIGKILL);
    reap_orphans();
  }

  static void reap_orphans() {
    int st;
    while (::waitpid(-1, &st, WNOHANG) > 0) {
    }
  }

  std::vector<std::string> run_args(int n, std::vector<std::string> probe_args, std::vector<std::string> opts = {}) {
    std::vector<std::string> argv = {STRATA_RUN_BIN, "-n", std::to_string(n)};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.push_back("--");
    argv.push_back(RUN_PROBE_BIN);
    argv.push_back("--dir");
    argv.push_back(dir_.str());
    argv.insert(argv.end(), probe_args.begin(), probe_args.end());
    return argv;
  }

  /// Pids the probes recorded (ranks 0..n-1 that started).
  std::vector<pid_t> pids(int n) const {
    std::vector<pid_t> out;
    for (int r = 0; r < n; ++r) {
      std::ifstream in(dir_.str() + "/pid." + std::to_string(r));
      pid_t p = 0;
      if (in >> p) out.push_back(p);
    }
    return out;
  }

  bool wait_for_pids(int n, std::chrono::seconds timeout) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (static_cast<int>(pids(n).size()) == n) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  /// True once every pid is gone (reaping orphans meanwhile), within the timeout.
  static bool all_dead(const std::vector<pid_t>& ps, std::chrono::seconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      reap_orphans();
      bool any = false;
      for (pid_t p : ps) any = any || test::process_alive(p);
      if (!any) return true;
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(20ms);
    }
  }

  bool term_seen(int rank) const { return std::ifstream(dir_.str() + "/term." + std::to_string(rank)).good(); }

  test::TempDir dir_;
};

/// rank -> lines (without prefix); fails the test on an unprefixed line.
std::map<int, std::vector<std::string>> split_by_rank(const std::string& text) {
  static const std::regex line_re(R"(^\[(\d+)\] (.*)$)");
  std::map<int, std::vector<std::string>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, line_re)) out[std::stoi(m[1])].push_back(m[2]);
    else ADD_FAILURE() << "line without a rank prefix: '" << line << "'";
  }
  return out;
}

std::string value_of(const std::vector<std::string>& lines, const std::string& key) {
  for (const auto& l : lines)
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  return "";
}

TEST_F(RunTest, StartsNProcessesWithClusterEnvironmentAndPrefixedOutput) {
  int ephemeral_lo = 0;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "re")) {
    if (std::fscanf(f, "%d", &ephemeral_lo) != 1) ephemeral_lo = 0;
    std::fclose(f);
  }
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const test::ProcResult r = test::run_program(run_args(n, {}), {{"STRATA_AUTH_TOKEN", std::nullopt}}, 60);
    ASSERT_FALSE(r.timed_out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto out = split_by_rank(r.out);
    const auto err = split_by_rank(r.err);
    ASSERT_EQ(out.size(), static_cast<size_t>(n)) << r.out;
    std::set<std::string> tokens, addresses;
    json cluster0;
    for (int rank = 0; rank < n; ++rank) {
      const auto& lines = out.at(rank);
      EXPECT_EQ(value_of(lines, "rank"), std::to_string(rank));
      EXPECT_NE(std::find(lines.begin(), lines.end(), "chunked-a-b-c"), lines.end()) << r.out;
      const json tf = json::parse(value_of(lines, "tf_config"));
      EXPECT_EQ(tf["task"]["type"], "worker");
      EXPECT_EQ(tf["task"]["index"], rank);
      ASSERT_EQ(tf["cluster"]["worker"].size(), static_cast<size_t>(n));
      EXPECT_EQ(tf["cluster"].size(), 1u);
      if (rank == 0) cluster0 = tf["cluster"];
      EXPECT_EQ(tf["cluster"], cluster0) << "every rank sees the same cluster";
      tokens.insert(value_of(lines, "token"));
      EXPECT_EQ(value_of(lines, "config"), "-");
      ASSERT_EQ(err.count(rank), 1u) << r.err;
      EXPECT_EQ(err.at(rank).front(), "probe stderr rank=" + std::to_string(rank));
    }
    for (const auto& a : cluster0["worker"]) {
      const std::string addr = a.get<std::string>();
      EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
      const int port = std::stoi(addr.substr(addr.find(':') + 1));
      EXPECT_GT(port, 0);
      EXPECT_LT(port, 65536);
      // Below the kernel's ephemeral range, where no outgoing connection
      // or port-0 listener can take it before the chief binds it.
      if (ephemeral_lo >= 1024 + 256) {
        EXPECT_TRUE(port >= std::max(1024, ephemeral_lo - 16384) && port < ephemeral_lo)
            << "port " << port << " is not just below the ephemeral range starting at " << ephemeral_lo;
      }
      addresses.insert(addr);
    }
    EXPECT_EQ(addresses.size(), static_cast<size_t>(n)) << "ports must be distinct: " << cluster0.dump();
    ASSERT_EQ(tokens.size(), 1u) << "one token per job";
    EXPECT_TRUE(std::regex_match(*tokens.begin(), std::regex("[0-9a-f]{32}"))) << *tokens.begin();
    EXPECT_TRUE(all_dead(pids(n), 5s));
  }
}

TEST_F(RunTest, TokensDifferBetweenJobsAndAPresetTokenAndConfigArePassed) {
  auto token_of = [&](const test::EnvEdits& env, std::vector<std::string> opts = {}) {
    const test::ProcResult r = test::run_program(run_args(2, {}, opts), env, 60);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto out = split_by_rank(r.out);
    return std::make_pair(value_of(out[0], "token"), value_of(out[1], "config"));
  };
  const auto a = token_of({{"STRATA_AUTH_TOKEN", std::nullopt}});
  const auto b = token_of({{"STRATA_AUTH_TOKEN", ""}});
  EXPECT_NE(a.first, b.first);
  EXPECT_EQ(b.first.size(), 32u);
  const std::string cfg = dir_.str() + "/job.json";
  std::ofstream(cfg) << "{}";
  const auto c = token_of({{"STRATA_AUTH_TOKEN", "preset-token"}}, {"--config", cfg});
  EXPECT_EQ(c.first, "preset-token");
  EXPECT_EQ(c.second, cfg);
}

TEST_F(RunTest, FailingRankStopsTheOthersAndItsCodeIsReturned) {
  const auto start = std::chrono::steady_clock::now();
  const test::ProcResult r = test::run_program(
      run_args(3, {"--sleep", "60", "--fail-rank", "1", "--fail-code", "7", "--fail-after", "2"}), {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_NE(r.err.find("strata-run: rank 1 (pid "), std::string::npos) << r.err;
  // An observation, not a blame: the first to exit may only have noticed first.
  EXPECT_NE(r.err.find(") exited first, with code 7; stopping the other 2 running process(es)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("failed first"), std::string::npos) << r.err;
  const auto ps = pids(3);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_TRUE(all_dead(ps, 5s));
  EXPECT_TRUE(term_seen(0));
  EXPECT_TRUE(term_seen(2));
  EXPECT_FALSE(term_seen(1));
}

TEST_F(RunTest, RankKilledByASignalExitsWith128PlusSignal) {
  const test::ProcResult r = test::run_program(
      run_args(2, {"--sleep", "60", "--fail-rank", "0", "--fail-signal", std::to_string(SIGUSR1)}), {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGUSR1) << r.err;
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited first: it was killed by SIGUSR1"), std::string::npos) << r.err;
  EXPECT_TRUE(all_dead(pids(2), 5s));
}

TEST_F(RunTest, TimeoutStopsTheJobWithExitCode124) {
  const test::ProcResult r = test::run_program(run_args(2, {"--sleep", "60"}, {"--timeout", "2"}), {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;
  EXPECT_TRUE(all_dead(pids(2), 5s));
  EXPECT_TRUE(term_seen(0));
  EXPECT_TRUE(term_seen(1));
}

TEST_F(RunTest, ProcessesIgnoringSigtermAreKilledAfterTheGrace) {
  const test::ProcResult r = test::run_program(
      run_args(2, {"--sleep", "60", "--ignore-term"}, {"--timeout", "2", "--grace", "1"}), {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
  EXPECT_TRUE(term_seen(0));
  EXPECT_TRUE(all_dead(pids(2), 5s));
}

TEST_F(RunTest, SigtermIsForwardedToEveryProcess) {
  test::Subprocess run(run_args(3, {"--sleep", "60"}), {});
  ASSERT_TRUE(wait_for_pids(3, 30s)) << run.err();
  run.signal(SIGTERM);
  const test::ProcResult r = run.wait(30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM"), std::string::npos) << r.err;
  for (int rank = 0; rank < 3; ++rank) EXPECT_TRUE(term_seen(rank)) << rank;
  EXPECT_TRUE(all_dead(pids(3), 5s));
}

TEST_F(RunTest, ChildrenDieWhenStrataRunIsKilled) {
  // A killed strata-run cannot remove its default trace directory: keep it in
  // the test's own directory.
  test::Subprocess run(run_args(3, {"--sleep", "60", "--ignore-term"}),
                       {{"STRATA_TRACE_DIR", std::nullopt}, {"TMPDIR", dir_.str()}});
  ASSERT_TRUE(wait_for_pids(3, 30s)) << run.err();
  const auto ps = pids(3);
  for (pid_t p : ps) EXPECT_TRUE(test::process_alive(p));
  run.signal(SIGKILL);
  const test::ProcResult r = run.wait(30);
  EXPECT_EQ(r.term_signal, SIGKILL);
  EXPECT_TRUE(all_dead(ps, 10s)) << "PR_SET_PDEATHSIG must kill every child";
}

/// Entries of a directory (names), empty when it does not exist.
std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.insert(it->path().filename().string());
  return out;
}

TEST_F(RunTest, SummaryGivesTheAgreedVerdictAndTheStoppedRankNotTheFirstExit) {
  // Ranks 0 and 1 wrote the same verdict; rank 2 froze (SIGSTOP); rank 0
  // exits first. The summary must name what the ranks agreed on and the
  // stopped rank, and the stopped rank must still be reaped (at the SIGKILL).
  const std::string traces = dir_.str() + "/traces";
  const std::string verdict = "rank 2 of 3 is frozen (no heartbeat for 30 s) during all_reduce #4";
  const auto start = std::chrono::steady_clock::now();
  const test::ProcResult r = test::run_program(
      run_args(3,
               {"--sleep", "60", "--trace-rank", "0", "--trace-rank", "1", "--verdict", verdict, "--stop-rank", "2",
                "--fail-rank", "0", "--fail-after", "0.2"},
               {"--grace", "1", "--trace-dir", traces}),
      {}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  const auto ps = pids(3);
  ASSERT_EQ(ps.size(), 3u) << r.err;
  EXPECT_TRUE(all_dead(ps, 5s));
  EXPECT_NE(r.err.find("strata-run: rank 2 (pid " + std::to_string(ps[2]) + ") is stopped (SIGSTOP)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("strata-run: rank 0 (pid " + std::to_string(ps[0]) + ") exited first, with code 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("(rank 2 stopped, so SIGTERM waits); sending SIGKILL"), std::string::npos) << r.err;
  const auto v = r.err.find("strata-run: verdict (ranks 0, 1 agree): " + verdict + "\n");
  const auto stopped =
      r.err.find("strata-run: rank 2 (pid " + std::to_string(ps[2]) + ") was stopped (SIGSTOP) when the job failed\n");
  const auto hint = r.err.find("strata-run: the last collectives of every rank: strata-info trace " + traces + "\n");
  ASSERT_NE(v, std::string::npos) << r.err;
  ASSERT_NE(stopped, std::string::npos) << r.err;
  ASSERT_NE(hint, std::string::npos) << r.err;
  EXPECT_LT(v, stopped);
  EXPECT_LT(stopped, hint);
  EXPECT_EQ(entries(traces), (std::set<std::string>{"rank-0.json", "rank-1.json"})) << "a user directory is kept";
}

TEST_F(RunTest, TraceDirFromTheEnvironmentIsUsedAndAOneRankVerdictNamesThatRank) {
  const std::string traces = dir_.str() + "/traces";
  const test::ProcResult r = test::run_program(
      run_args(2, {"--trace-rank", "1", "--verdict", "rank 0 of 2 died", "--fail-rank", "1", "--fail-after", "0.5",
                   "--sleep", "60"},
               {"--grace", "1"}),
      {{"STRATA_TRACE_DIR", traces}}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("strata-run: verdict (rank 1): rank 0 of 2 died\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("was stopped"), std::string::npos) << r.err;
  EXPECT_TRUE(all_dead(pids(2), 5s));
  // STRATA_TRACE_DIR from the environment is the user's: kept, and this job's
  // file is in it.
  EXPECT_EQ(entries(traces), std::set<std::string>{"rank-1.json"});
}

TEST_F(RunTest, DefaultTraceDirIsGivenToEveryChildAndRemovedAfterSuccess) {
  const std::filesystem::path tmp = dir_.path() / "tmp";
  std::filesystem::create_directories(tmp);
  test::Subprocess run(run_args(3, {}), {{"STRATA_TRACE_DIR", std::nullopt}, {"TMPDIR", tmp.string()}});
  const test::ProcResult r = run.wait(60);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = split_by_rank(r.out);
  const std::string expected = (tmp / ("strata-run-" + std::to_string(run.pid()))).string();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(value_of(out.at(rank), "trace_dir"), expected) << rank;
    EXPECT_EQ(value_of(out.at(rank), "trace_dir_exists"), "1") << rank;
  }
  EXPECT_TRUE(entries(tmp).empty()) << "the default trace directory is removed after a successful job";
  EXPECT_EQ(r.err.find("verdict"), std::string::npos) << r.err;
}

TEST_F(RunTest, DefaultTraceDirIsKeptOnlyWhenAFailedJobLeftTraces) {
  const std::filesystem::path tmp = dir_.path() / "tmp";
  std::filesystem::create_directories(tmp);
  const test::EnvEdits env = {{"STRATA_TRACE_DIR", std::nullopt}, {"TMPDIR", tmp.string()}};
  {
    // Failed, no trace: nothing to look at afterwards, so nothing is left.
    const test::ProcResult r =
        test::run_program(run_args(2, {"--fail-rank", "1", "--sleep", "60"}, {"--grace", "1"}), env, 60);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(entries(tmp).empty()) << r.err;
    EXPECT_EQ(r.err.find("strata-info trace"), std::string::npos) << r.err;
  }
  {
    test::Subprocess run(run_args(2, {"--trace-rank", "0", "--verdict", "rank 1 of 2 died", "--fail-rank", "0",
                                      "--sleep", "60"},
                                  {"--grace", "1"}),
                         env);
    const test::ProcResult r = run.wait(60);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    const std::string kept = "strata-run-" + std::to_string(run.pid());
    EXPECT_EQ(entries(tmp), std::set<std::string>{kept}) << r.err;
    EXPECT_EQ(entries(tmp / kept), std::set<std::string>{"rank-0.json"});
    EXPECT_NE(r.err.find("strata-info trace " + (tmp / kept).string()), std::string::npos) << r.err;
    EXPECT_TRUE(all_dead(pids(2), 5s));
  }
}

TEST_F(RunTest, UserTraceDirIsKeptWithItsFilesAndOldTracesAreNotReported) {
  const std::filesystem::path traces = dir_.path() / "user-traces";
  std::filesystem::create_directories(traces);
  std::ofstream(traces / "notes.txt") << "not strata's";
  std::ofstream(traces / "rank-5.json") << R"({"rank": 5, "verdict": "a verdict of an earlier job"})";
  test::ProcResult r =
      test::run_program(run_args(2, {}, {"--trace-dir", traces.string()}), {{"STRATA_TRACE_DIR", std::nullopt}}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [rank, lines] : split_by_rank(r.out)) EXPECT_EQ(value_of(lines, "trace_dir"), traces.string()) << rank;
  EXPECT_EQ(entries(traces), (std::set<std::string>{"notes.txt", "rank-5.json"}));
  EXPECT_NE(r.err.find("already holds 1 rank-*.json file(s) of an earlier job"), std::string::npos) << r.err;
  // A failed job that wrote no trace of its own must not report the old one.
  r = test::run_program(run_args(2, {"--fail-rank", "0", "--sleep", "60"}, {"--trace-dir", traces.string(), "--grace", "1"}),
                        {}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.find("verdict ("), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("the last collectives of every rank"), std::string::npos) << r.err;
  EXPECT_EQ(entries(traces), (std::set<std::string>{"notes.txt", "rank-5.json"}));
  EXPECT_TRUE(all_dead(pids(2), 5s));
}

TEST_F(RunTest, AStoppedRankIsNamedEvenWithoutTraceFiles) {
  const test::ProcResult r = test::run_program(
      run_args(2, {"--stop-rank", "1", "--fail-rank", "0", "--fail-after", "0.2", "--sleep", "60"}, {"--grace", "1"}),
      {{"STRATA_TRACE_DIR", std::nullopt}, {"TMPDIR", dir_.str()}}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto ps = pids(2);
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_NE(r.err.find("strata-run: rank 1 (pid " + std::to_string(ps[1]) + ") was stopped (SIGSTOP) when the job failed"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("verdict"), std::string::npos) << r.err;
  EXPECT_TRUE(all_dead(ps, 5s));
}

TEST_F(RunTest, UnusableTraceDirIsAnErrorNamingIt) {
  const std::string file = dir_.str() + "/a-file";
  std::ofstream(file) << "x";
  const test::ProcResult r =
      test::run_program({STRATA_RUN_BIN, "-n", "1", "--trace-dir", file + "/sub", "--", RUN_PROBE_BIN}, {}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot use the trace directory '" + file + "/sub' (from --trace-dir)"), std::string::npos)
      << r.err;
}

TEST_F(RunTest, MissingProgramFailsWith127) {
  const test::ProcResult r = test::run_program({STRATA_RUN_BIN, "-n", "2", "--", "/nonexistent/program"}, {}, 60);
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("cannot start '/nonexistent/program'"), std::string::npos) << r.err;
}

TEST_F(RunTest, UsageErrorsAndHelp) {
  test::ProcResult r = test::run_program({STRATA_RUN_BIN, "--help"}, {});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("Example"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("strata-run -n 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--trace-dir"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("strata-info trace DIR"), std::string::npos) << r.out;
  EXPECT_NE(test::run_program({STRATA_RUN_BIN, "--", RUN_PROBE_BIN}, {}).exit_code, 0);  // no -n
  EXPECT_NE(test::run_program({STRATA_RUN_BIN, "-n", "2"}, {}).exit_code, 0);            // no program
  EXPECT_NE(test::run_program({STRATA_RUN_BIN, "-n", "0", "--", RUN_PROBE_BIN}, {}).exit_code, 0);
  r = test::run_program({STRATA_RUN_BIN, "-n", "1", "--host", "no-such-host.invalid", "--", RUN_PROBE_BIN}, {});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot resolve --host"), std::string::npos) << r.err;
}

// ---- GPUs (--gpus) -----------------------------------------------------------

TEST_F(RunTest, GpusListedAreSplitEvenlyOrSharedRoundRobin) {
  // (processes, --gpus, what each rank sees, STRATA_GPUS_SHARED, the line strata-run prints)
  struct Case {
    int n;
    std::string gpus;
    std::vector<std::string> visible;
    std::string shared, says;
  };
  const std::vector<Case> cases = {
      {2, "3,5,7,9", {"3,5", "7,9"}, "0", "rank 0 -> 3,5; rank 1 -> 7,9"},
      {2, "0,1,2", {"0", "1"}, "0", "1 of 3 GPUs unused"},
      {3, "GPU-aa11,GPU-bb22", {"GPU-aa11", "GPU-bb22", "GPU-aa11"}, "1", "3 processes share 2 GPU(s)"},
      {2, "none", {"", ""}, "0", "no process sees a GPU"},
      {2, "all", {"preset", "preset"}, "-", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("--gpus " + c.gpus);
    const test::ProcResult r =
        test::run_program(run_args(c.n, {}, {"--gpus", c.gpus}), {{"CUDA_VISIBLE_DEVICES", "preset"}}, 60);
    ASSERT_FALSE(r.timed_out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto out = split_by_rank(r.out);
    ASSERT_EQ(out.size(), static_cast<size_t>(c.n)) << r.out;
    for (int rank = 0; rank < c.n; ++rank) {
      EXPECT_EQ(value_of(out.at(rank), "cuda_visible"), c.visible[static_cast<size_t>(rank)]) << "rank " << rank;
      EXPECT_EQ(value_of(out.at(rank), "gpus_shared"), c.shared) << "rank " << rank;
    }
    if (!c.says.empty()) EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    else EXPECT_EQ(r.err.find("strata-run: GPUs"), std::string::npos) << r.err;
  }
}

TEST_F(RunTest, BadGpusValuesAreUsageErrorsNamingTheProblem) {
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"", "empty string"},
           {"0,,1", "'' in '0,,1' is not a GPU id"},
           {"0,1,", "is not a GPU id"},
           {"0;1", "'0;1' in '0;1' is not a GPU id"},
           {"1,2,1", "GPU '1' is listed twice"}}) {
    SCOPED_TRACE("--gpus '" + value + "'");
    const test::ProcResult r = test::run_program(run_args(2, {}, {"--gpus", value}), {}, 30);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_TRUE(pids(2).empty()) << "no process may start";
  }
  const test::ProcResult ps = test::run_program(
      {STRATA_RUN_BIN, "--workers", "1", "--ps", "1", "--gpus", "0", "--", RUN_PROBE_BIN}, {}, 30);
  EXPECT_EQ(ps.exit_code, 2);
  EXPECT_NE(ps.err.find("--gpus applies to -n jobs"), std::string::npos) << ps.err;
  const test::ProcResult help = test::run_program({STRATA_RUN_BIN, "--help"}, {});
  EXPECT_NE(help.out.find("--gpus"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("STRATA_GPUS_SHARED=1"), std::string::npos) << help.out;
}

// ---- restarts (--max-restarts) ---------------------------------------------

/// One start of a rank, from the probe's run.<restart>.<rank> file.
struct RunRecord {
  pid_t pid = 0;
  std::string restart, max_restarts;
};

/// (restart, rank) -> what that start of the rank recorded.
std::map<std::pair<int, int>, RunRecord> runs(const std::filesystem::path& dir) {
  std::map<std::pair<int, int>, RunRecord> out;
  static const std::regex name_re(R"(run\.(\d+)\.(\d+))");
  for (const auto& name : entries(dir)) {
    std::smatch m;
    if (!std::regex_match(name, m, name_re)) continue;
    std::ifstream in(dir / name);
    RunRecord r;
    if (in >> r.pid >> r.restart >> r.max_restarts) out[{std::stoi(m[1]), std::stoi(m[2])}] = r;
  }
  return out;
}

std::vector<pid_t> pids_of(const std::map<std::pair<int, int>, RunRecord>& rs) {
  std::vector<pid_t> out;
  for (const auto& [key, r] : rs) out.push_back(r.pid);
  return out;
}

/// Live (not zombie) processes whose command line contains `text`.
std::vector<pid_t> processes_naming(const std::string& text) {
  std::vector<pid_t> out;
  for (const auto& name : entries("/proc")) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    std::string cmdline = test::slurp("/proc/" + name + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (cmdline.find(text) != std::string::npos && test::process_alive(pid)) out.push_back(pid);
  }
  return out;
}

/// How often `needle` occurs in `text`.
std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

/// Every value of "key=" lines of one rank, in order (one per attempt).
std::vector<std::string> values_of(const std::vector<std::string>& lines, const std::string& key) {
  std::vector<std::string> out;
  for (const auto& l : lines)
    if (l.rfind(key + "=", 0) == 0) out.push_back(l.substr(key.size() + 1));
  return out;
}

TEST_F(RunTest, ARankThatFailsOnceSucceedsAfterARestartWithFreshPortsAndTheSameToken) {
  const std::vector<std::string> probe = {"--fail-rank", "1", "--fail-code", "3", "--fail-after", "0.3",
                                          "--healthy-from-restart", "1"};
  const auto start = std::chrono::steady_clock::now();
  const test::ProcResult r = test::run_program(run_args(3, probe, {"--max-restarts", "1", "--restart-delay", "0.2"}),
                                               {{"STRATA_AUTH_TOKEN", std::nullopt}}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  const auto rs = runs(dir_.path());
  ASSERT_EQ(rs.size(), 6u) << "every rank runs once per attempt: " << r.err;
  std::set<pid_t> distinct;
  for (int attempt = 0; attempt < 2; ++attempt)
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_EQ(rs.count({attempt, rank}), 1u) << attempt << " " << rank;
      const RunRecord& rec = rs.at({attempt, rank});
      EXPECT_EQ(rec.restart, std::to_string(attempt)) << "STRATA_RESTART_COUNT";
      EXPECT_EQ(rec.max_restarts, "1") << "STRATA_MAX_RESTARTS";
      distinct.insert(rec.pid);
    }
  EXPECT_EQ(distinct.size(), 6u);
  EXPECT_NE(r.err.find("strata-run: restarting the job (restart 1 of 1) in 0.2 s: rank 1 exited with code 3\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("strata-run: starting attempt 2 of 2 (STRATA_RESTART_COUNT=1)\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("exhausted"), std::string::npos) << r.err;
  // Each rank printed its environment once per attempt: the second attempt
  // is a new cluster on ports no earlier one used, with the run's token.
  const auto out = split_by_rank(r.out);
  std::set<std::string> tokens;
  std::vector<std::set<std::string>> workers(2);
  for (int rank = 0; rank < 3; ++rank) {
    const auto tf = values_of(out.at(rank), "tf_config");
    ASSERT_EQ(tf.size(), 2u) << r.out;
    for (int attempt = 0; attempt < 2; ++attempt) {
      const json parsed = json::parse(tf[attempt]);
      for (const auto& w : parsed["cluster"]["worker"]) workers[attempt].insert(w.get<std::string>());
    }
    EXPECT_EQ(values_of(out.at(rank), "restart"), (std::vector<std::string>{"0", "1"}));
    for (const auto& t : values_of(out.at(rank), "token")) tokens.insert(t);
  }
  ASSERT_EQ(workers[0].size(), 3u);
  ASSERT_EQ(workers[1].size(), 3u);
  for (const auto& w : workers[1]) EXPECT_EQ(workers[0].count(w), 0u) << "port reused by the restart: " << w;
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));

  // Without --max-restarts the same job fails as before, once.
  for (const auto& name : entries(dir_.path())) std::filesystem::remove(dir_.path() / name);
  const test::ProcResult once = test::run_program(run_args(3, probe), {}, 60);
  ASSERT_FALSE(once.timed_out) << once.err;
  EXPECT_EQ(once.exit_code, 3) << once.err;
  const auto rs0 = runs(dir_.path());
  ASSERT_EQ(rs0.size(), 3u) << once.err;
  for (const auto& [key, rec] : rs0) {
    EXPECT_EQ(key.first, 0);
    EXPECT_EQ(rec.restart, "0");
    EXPECT_EQ(rec.max_restarts, "0");
  }
  EXPECT_EQ(once.err.find("restart"), std::string::npos) << once.err;
  EXPECT_NE(once.err.find("strata-run: rank 1 (pid " + std::to_string(rs0.at({0, 1}).pid) + ") exited first, with code 3"),
            std::string::npos)
      << once.err;
}

TEST_F(RunTest, ExhaustedRestartsExitWithTheLastAttemptsCodeAndSaySo) {
  const test::ProcResult r = test::run_program(
      run_args(2, {"--fail-rank", "1", "--fail-code", "3", "--fail-after", "0.2"},
               {"--max-restarts", "2", "--restart-delay", "0.1"}),
      {}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const auto rs = runs(dir_.path());
  EXPECT_EQ(rs.size(), 6u) << "N+1 attempts of every rank: " << r.err;
  for (int attempt = 0; attempt < 3; ++attempt)
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(rs.count({attempt, rank}), 1u) << attempt << " " << rank;
      EXPECT_EQ(rs.at({attempt, rank}).restart, std::to_string(attempt));
      EXPECT_EQ(rs.at({attempt, rank}).max_restarts, "2");
    }
  EXPECT_EQ(rs.count({3, 0}), 0u);
  EXPECT_NE(r.err.find("restarting the job (restart 1 of 2) in 0.1 s: rank 1 exited with code 3\n"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restarting the job (restart 2 of 2) in 0.1 s: rank 1 exited with code 3\n"), std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.err, "strata-run: restarting the job"), 2u) << r.err;
  EXPECT_NE(r.err.find("strata-run: restarts exhausted: attempt 3 of 3 failed too (--max-restarts 2): rank 1 exited "
                       "with code 3; exiting with code 3\n"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));
}

TEST_F(RunTest, ARankKilledFromOutsideRestartsTheJobWhichThenSucceeds) {
  test::Subprocess run(run_args(3, {"--sleep", "60", "--healthy-from-restart", "1"},
                                {"--max-restarts", "1", "--restart-delay", "0.2", "--grace", "1"}),
                       {});
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (runs(dir_.path()).size() < 3u && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(20ms);
  const auto first = runs(dir_.path());
  ASSERT_EQ(first.size(), 3u) << run.err();
  const pid_t victim = first.at({0, 2}).pid;
  EXPECT_GE(processes_naming(dir_.str()).size(), 4u) << "strata-run and its 3 ranks";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const test::ProcResult r = run.wait(60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("strata-run: rank 2 (pid " + std::to_string(victim) + ") exited first: it was killed by SIGKILL"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("strata-run: restarting the job (restart 1 of 1) in 0.2 s: rank 2 was killed by SIGKILL\n"),
            std::string::npos)
      << r.err;
  const auto rs = runs(dir_.path());
  EXPECT_EQ(rs.size(), 6u) << r.err;
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(rs.count({1, rank}), 1u) << rank;
  EXPECT_TRUE(term_seen(0)) << "the survivors of attempt 0 were stopped before the restart";
  EXPECT_TRUE(term_seen(1));
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));
  EXPECT_TRUE(processes_naming(dir_.str()).empty());
}

TEST_F(RunTest, TimeoutCoversTheWholeRestartLoopAndIsNeverRestarted) {
  // A rank that always fails, restarted quickly: the loop runs until the
  // run's --timeout, which ends it with 124 wherever it strikes.
  auto start = std::chrono::steady_clock::now();
  test::ProcResult r = test::run_program(
      run_args(2, {"--fail-rank", "1", "--fail-after", "0.3"},
               {"--max-restarts", "100", "--restart-delay", "0.2", "--timeout", "3", "--grace", "1"}),
      {}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  auto rs = runs(dir_.path());
  std::set<int> attempts;
  for (const auto& [key, rec] : rs) attempts.insert(key.first);
  EXPECT_GE(attempts.size(), 2u) << r.err;
  EXPECT_LT(attempts.size(), 30u) << r.err;
  const auto timeout_at = r.err.find("strata-run: timeout: the job ran longer than --timeout 3 s (all attempts together)");
  ASSERT_NE(timeout_at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("strata-run: restarting the job", timeout_at), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("starting attempt", timeout_at), std::string::npos) << r.err;
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));

  // Striking in the restart delay: no further attempt starts.
  for (const auto& name : entries(dir_.path())) std::filesystem::remove(dir_.path() / name);
  start = std::chrono::steady_clock::now();
  r = test::run_program(run_args(2, {"--fail-rank", "1", "--fail-after", "0.3"},
                                 {"--max-restarts", "5", "--restart-delay", "30", "--timeout", "2"}),
                        {}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s) << "the timeout cuts the delay short";
  EXPECT_NE(r.err.find("restarting the job (restart 1 of 5) in 30 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("strata-run: timeout: the job ran longer than --timeout 2 s (all attempts together); not "
                       "restarting it\n"),
            std::string::npos)
      << r.err;
  rs = runs(dir_.path());
  EXPECT_EQ(rs.size(), 2u) << r.err;
  EXPECT_EQ(rs.count({1, 0}), 0u) << r.err;

  // Striking while a failed attempt settles: stopped, not restarted.
  for (const auto& name : entries(dir_.path())) std::filesystem::remove(dir_.path() / name);
  r = test::run_program(run_args(2, {"--sleep", "60", "--fail-rank", "1", "--fail-after", "0.3"},
                                 {"--max-restarts", "5", "--restart-delay", "0", "--timeout", "2", "--grace", "1"}),
                        {}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_EQ(r.err.find("strata-run: restarting the job"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("strata-run: not restarting the job: --timeout expired\n"), std::string::npos) << r.err;
  rs = runs(dir_.path());
  EXPECT_EQ(rs.size(), 2u) << r.err;
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));
}

TEST_F(RunTest, SigtermDuringTheRestartDelayEndsTheRunWithoutAnotherAttemptOrChild) {
  test::Subprocess run(run_args(2, {"--fail-rank", "1", "--fail-after", "0.3"},
                                {"--max-restarts", "3", "--restart-delay", "30"}),
                       {});
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (run.err().find("restarting the job") == std::string::npos && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(20ms);
  ASSERT_NE(run.err().find("restarting the job (restart 1 of 3) in 30 s: rank 1 exited with code 1"),
            std::string::npos)
      << run.err();
  const auto signalled = std::chrono::steady_clock::now();
  run.signal(SIGTERM);
  const test::ProcResult r = run.wait(30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, 5s);
  EXPECT_NE(r.err.find("strata-run: received SIGTERM during the restart delay; not restarting the job\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("starting attempt"), std::string::npos) << r.err;
  const auto rs = runs(dir_.path());
  EXPECT_EQ(rs.size(), 2u) << "only attempt 0 ran: " << r.err;
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));
  // Whatever the run started has this test's directory on its command line.
  EXPECT_TRUE(processes_naming(dir_.str()).empty()) << "a process of the run is still alive";
}

TEST_F(RunTest, SigtermDuringAnAttemptIsForwardedAndNeverRestarted) {
  test::Subprocess run(run_args(2, {"--sleep", "60"}, {"--max-restarts", "2", "--restart-delay", "0"}), {});
  ASSERT_TRUE(wait_for_pids(2, 30s)) << run.err();
  run.signal(SIGTERM);
  const test::ProcResult r = run.wait(30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("strata-run: not restarting the job: strata-run was interrupted\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restarting the job ("), std::string::npos) << r.err;
  const auto rs = runs(dir_.path());
  EXPECT_EQ(rs.size(), 2u) << r.err;
  EXPECT_TRUE(term_seen(0));
  EXPECT_TRUE(term_seen(1));
  EXPECT_TRUE(all_dead(pids_of(rs), 5s));
}

TEST_F(RunTest, ARestartedAttemptsTracesMoveToAttemptDirAndTheLastAttemptsStayOnTop) {
  const std::filesystem::path traces = dir_.path() / "traces";
  const std::vector<std::string> probe = {"--trace-rank", "0", "--verdict", "rank 1 of 2 died",
                                          "--fail-rank",  "1", "--fail-after", "0.3"};
  const test::ProcResult r = test::run_program(
      run_args(2, probe, {"--max-restarts", "1", "--restart-delay", "0", "--trace-dir", traces.string()}), {}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(entries(traces), (std::set<std::string>{"attempt-0", "rank-0.json"})) << r.err;
  EXPECT_EQ(entries(traces / "attempt-0"), std::set<std::string>{"rank-0.json"}) << r.err;
  // The verdict names the culprit for the restart, as in the summary; each
  // attempt's summary points at where its traces are.
  EXPECT_NE(r.err.find("strata-run: restarting the job (restart 1 of 1) in 0 s: rank 1 of 2 died (verdict of rank 0)\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.err, "strata-run: verdict (rank 0): rank 1 of 2 died\n"), 2u) << r.err;
  const auto first = r.err.find("strata-info trace " + (traces / "attempt-0").string() + "\n");
  const auto last = r.err.find("strata-info trace " + traces.string() + "\n");
  ASSERT_NE(first, std::string::npos) << r.err;
  ASSERT_NE(last, std::string::npos) << r.err;
  EXPECT_LT(first, last);
  EXPECT_NE(r.err.find("restarts exhausted: attempt 2 of 2 failed too (--max-restarts 1): rank 1 of 2 died (verdict "
                       "of rank 0); exiting with code 1\n"),
            std::string::npos)
      << r.err;

  // The default directory: kept after a success when a failed attempt left
  // traces (the restart line pointed there), removed when none did.
  const std::filesystem::path tmp = dir_.path() / "tmp";
  std::filesystem::create_directories(tmp);
  const test::EnvEdits env = {{"STRATA_TRACE_DIR", std::nullopt}, {"TMPDIR", tmp.string()}};
  test::Subprocess ok(run_args(2, {"--trace-rank", "0", "--verdict", "rank 1 of 2 died", "--fail-rank", "1",
                                   "--fail-after", "0.3", "--healthy-from-restart", "1"},
                               {"--max-restarts", "1", "--restart-delay", "0"}),
                      env);
  const test::ProcResult okr = ok.wait(60);
  ASSERT_FALSE(okr.timed_out) << okr.err;
  EXPECT_EQ(okr.exit_code, 0) << okr.err;
  const std::string kept = "strata-run-" + std::to_string(ok.pid());
  EXPECT_EQ(entries(tmp), std::set<std::string>{kept}) << okr.err;
  EXPECT_EQ(entries(tmp / kept), std::set<std::string>{"attempt-0"}) << okr.err;
  EXPECT_EQ(entries(tmp / kept / "attempt-0"), std::set<std::string>{"rank-0.json"}) << okr.err;
  EXPECT_NE(okr.err.find("they are kept: strata-info trace " + (tmp / kept / "attempt-0").string()), std::string::npos)
      << okr.err;
  std::filesystem::remove_all(tmp / kept);
  const test::ProcResult clean = test::run_program(
      run_args(2, {"--fail-rank", "1", "--fail-after", "0.3", "--healthy-from-restart", "1"},
               {"--max-restarts", "1", "--restart-delay", "0"}),
      env, 60);
  EXPECT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_NE(clean.err.find("restarting the job"), std::string::npos) << clean.err;
  EXPECT_TRUE(entries(tmp).empty()) << clean.err;
}

TEST_F(RunTest, RestartOptionsAreCheckedAndDocumented) {
  const test::ProcResult help = test::run_program({STRATA_RUN_BIN, "--help"}, {});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* text : {"--max-restarts", "--restart-delay", "STRATA_RESTART_COUNT", "STRATA_MAX_RESTARTS",
                           "strata-run --max-restarts 2 -n 4 -- strata-train --checkpoint-dir /tmp/ckpt",
                           "strata::BackupAndRestore", "sbatch --requeue", "attempt-<k>"})
    EXPECT_NE(help.out.find(text), std::string::npos) << text << "\n" << help.out;
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--max-restarts", "-1"}, "--max-restarts: expects a whole number of restarts, 0 or more (0 = never restart), not '-1'"},
      {{"--max-restarts", "1.5"}, "--max-restarts: expects a whole number of restarts"},
      {{"--max-restarts", "many"}, "--max-restarts: expects a whole number of restarts"},
      {{"--restart-delay", "-1"}, "--restart-delay: expects seconds from 0 to 86400, not '-1'"},
      {{"--restart-delay", "soon"}, "--restart-delay: expects seconds from 0 to 86400, not 'soon'"},
      {{"--restart-delay", "inf"}, "--restart-delay: expects seconds from 0 to 86400, not 'inf'"},
  };
  for (const auto& [opts, message] : bad) {
    const test::ProcResult r = test::run_program(run_args(1, {}, opts), {}, 60);
    EXPECT_NE(r.exit_code, 0) << opts[0] << " " << opts[1];
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_TRUE(runs(dir_.path()).empty()) << "a usage error starts nothing";
}

}  // namespace
}  // namespace strata
