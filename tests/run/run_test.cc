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

}  // namespace
}  // namespace strata
