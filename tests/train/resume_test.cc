// SPDX-License-Identifier: Apache-2.0
// strata-train --checkpoint-dir / --restore: a run killed mid-training (a
// real SIGKILL at a known step) and started again ends with the same weights,
// bit for bit, as a run that was never interrupted, with shuffling on, for
// in-memory and record inputs, on one process and on several under
// strata-run --max-restarts. Also SIGTERM (a preempted job) and bad input.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int exit_code;
  std::string output;
};

// A shell command with a hard deadline, stdout and stderr captured.
Result run(const std::string& cmd, int deadline_s = 240) {
  const std::string full = "timeout -k 5 " + std::to_string(deadline_s) + " " + cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in, nullptr, false);
}

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_resume_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // The model and data every run of a test shares; shuffling on.
  std::string common(int steps, int hidden = 32) const {
    return " --steps " + std::to_string(steps) + " --hidden " + std::to_string(hidden) +
           " --global-batch 96 --features 16 --classes 4 --lr 0.5 --dataset-size 2000"
           " --shuffle-buffer 700 --seed 5 --log-every 10";
  }
  // Weights of a run that nobody interrupts.
  json uninterrupted(const std::string& launcher, const std::string& args, int steps, const std::string& tag) {
    const fs::path out = dir_ / (tag + ".json");
    const Result r = run(launcher + STRATA_TRAIN_BIN + args + common(steps) + " --save " + out.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return read_json(out)["weights"];
  }
  fs::path dir_;
};

// Bitwise: the JSON holds each float32 as the shortest decimal that reads
// back to the same float, so equal JSON means equal bits.
void expect_same_weights(const json& got, const json& want) {
  ASSERT_TRUE(got.is_object() && want.is_object()) << got.dump().substr(0, 200);
  ASSERT_EQ(got.size(), want.size());
  for (auto it = want.begin(); it != want.end(); ++it) {
    ASSERT_TRUE(got.contains(it.key())) << it.key();
    const json& g = got[it.key()]["data"];
    const json& w = it.value()["data"];
    ASSERT_EQ(g.size(), w.size()) << it.key();
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i] && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << it.key() << ": " << differ << " of " << w.size()
                          << " values differ from the uninterrupted run's, first at " << first << ": " << g[first]
                          << " vs " << w[first];
  }
}

TEST_F(ResumeTest, KilledOneProcessRunResumesBitForBit) {
  for (const std::string& strategy : {std::string(" --strategy one_device"),
                                      std::string(" --strategy mirrored --devices cpu:0,cpu:1")}) {
    SCOPED_TRACE(strategy);
    const json want = uninterrupted("", strategy, 60, "want");
    fs::remove(dir_ / "got.json");
    const fs::path ckpt = dir_ / ("ckpt" + std::to_string(strategy.size()));
    const std::string cmd = std::string(STRATA_TRAIN_BIN) + strategy + common(60) + " --checkpoint-dir " +
                            ckpt.string() + " --checkpoint-every 10 --fault-kill-at 37:0 --save " +
                            (dir_ / "got.json").string();
    const Result killed = run(cmd);
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
    EXPECT_TRUE(fs::exists(ckpt / "ckpt-30")) << killed.output;
    EXPECT_FALSE(fs::exists(dir_ / "got.json"));
    // Same command again: --fault-kill-at fires only without
    // STRATA_RESTART_COUNT or at 0, so the second run says it is a restart.
    const Result resumed = run("env STRATA_RESTART_COUNT=1 " + cmd);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from " + (ckpt / "ckpt-30").string() + " at step 30"), std::string::npos)
        << resumed.output;
    EXPECT_NE(resumed.output.find("trained 30 steps"), std::string::npos) << resumed.output;
    expect_same_weights(read_json(dir_ / "got.json")["weights"], want);
    // The final step is kept for --restore, with the newest --keep-checkpoints.
    EXPECT_TRUE(fs::exists(ckpt / "ckpt-60"));
    EXPECT_TRUE(fs::exists(ckpt / "ckpt-50"));
    EXPECT_FALSE(fs::exists(ckpt / "ckpt-40"));
  }
}

TEST_F(ResumeTest, RecordInputResumesBitForBit) {
  const Result exported = run(std::string(STRATA_TRAIN_BIN) +
                              " --features 16 --classes 4 --dataset-size 2000 --seed 5 --export-files 3 --export-data " +
                              (dir_ / "data").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string data = " --data " + (dir_ / "data-00000-of-00003.rec").string() + " " +
                           (dir_ / "data-00001-of-00003.rec").string() + " " + (dir_ / "data-00002-of-00003.rec").string();
  const json want = uninterrupted("", data, 50, "want");
  const std::string cmd = std::string(STRATA_TRAIN_BIN) + data + common(50) + " --checkpoint-dir " +
                          (dir_ / "ckpt").string() + " --checkpoint-every 7 --fault-kill-at 30:0 --save " +
                          (dir_ / "got.json").string();
  ASSERT_EQ(run(cmd).exit_code, 128 + SIGKILL);
  const Result resumed = run("env STRATA_RESTART_COUNT=1 " + cmd);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 28"), std::string::npos) << resumed.output;
  expect_same_weights(read_json(dir_ / "got.json")["weights"], want);
}

TEST_F(ResumeTest, RestoreContinuesAFinishedRun) {
  const json want = uninterrupted("", " --strategy one_device", 40, "want");
  const Result first = run(std::string(STRATA_TRAIN_BIN) + common(20) + " --checkpoint-dir " + (dir_ / "a").string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(fs::exists(dir_ / "a" / "ckpt-20")) << first.output;
  // A directory of checkpoints (its newest) or one checkpoint.
  for (const fs::path& from : {dir_ / "a", dir_ / "a" / "ckpt-20"}) {
    const fs::path out = dir_ / "got.json";
    const Result more = run(std::string(STRATA_TRAIN_BIN) + common(40) + " --restore " + from.string() + " --save " +
                            out.string());
    ASSERT_EQ(more.exit_code, 0) << more.output;
    EXPECT_NE(more.output.find("at step 20"), std::string::npos) << more.output;
    expect_same_weights(read_json(out)["weights"], want);
  }
  // A finished run started again with the same --checkpoint-dir has nothing left to do.
  const Result again = run(std::string(STRATA_TRAIN_BIN) + common(20) + " --checkpoint-dir " + (dir_ / "a").string());
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("trained 0 steps"), std::string::npos) << again.output;
}

// A checkpoint that strata-train wrote before it trained through
// Trainer::fit (its hand-written loop, main at 28268f5: `--steps 20
// --checkpoint-dir`, flags as common()) restores into today's program,
// which continues to the weights that loop reached in 40 uninterrupted
// steps, bit for bit: the checkpoint names and the input position did not
// change.
TEST_F(ResumeTest, RestoresACheckpointOfTheHandWrittenLoop) {
  const fs::path golden = STRATA_TRAIN_GOLDEN_DIR;
  const fs::path out = dir_ / "got.json";
  const Result r = run(std::string(STRATA_TRAIN_BIN) + common(40) + " --restore " +
                       (golden / "loop-checkpoints" / "ckpt-20").string() + " --save " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 20"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trained 20 steps"), std::string::npos) << r.output;
  expect_same_weights(read_json(out)["weights"], read_json(golden / "loop-shuffle-40-steps.json")["weights"]);
}

TEST_F(ResumeTest, BadRestoresAreClearErrors) {
  Result r = run(std::string(STRATA_TRAIN_BIN) + common(10) + " --restore " + (dir_ / "nothing").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is neither a checkpoint nor a directory holding one"), std::string::npos) << r.output;
  ASSERT_EQ(run(std::string(STRATA_TRAIN_BIN) + common(20) + " --checkpoint-dir " + (dir_ / "a").string()).exit_code, 0);
  r = run(std::string(STRATA_TRAIN_BIN) + common(10) + " --restore " + (dir_ / "a").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("beyond --steps 10"), std::string::npos) << r.output;
  // A different model: the shapes do not match, nothing is trained.
  r = run(std::string(STRATA_TRAIN_BIN) + common(30, 8) + " --restore " + (dir_ / "a").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("but it is float32[16, 8]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(INVALID_ARGUMENT)"), std::string::npos) << r.output;
  r = run(std::string(STRATA_TRAIN_BIN) + common(30) + " --checkpoint-every 0 --checkpoint-dir " + (dir_ / "b").string());
  EXPECT_NE(r.exit_code, 0) << r.output;
}

#ifdef STRATA_RUN_BIN
// The acceptance case: strata-run --max-restarts 2 -n 4 with one
// worker SIGKILLed mid-training finishes, and its final weights equal those
// of an uninterrupted run bit for bit (in-memory input with shuffling, and
// record files sharded by file).
TEST_F(ResumeTest, StrataRunMaxRestartsSurvivesAKilledWorkerBitForBit) {
  const std::string run_n4 = std::string(STRATA_RUN_BIN) + " -n 4 --timeout 200 -- ";
  const Result exported = run(std::string(STRATA_TRAIN_BIN) +
                              " --features 16 --classes 4 --dataset-size 2000 --seed 5 --export-files 4 --export-data " +
                              (dir_ / "data").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  std::string files;
  for (int k = 0; k < 4; ++k) files += " " + (dir_ / ("data-0000" + std::to_string(k) + "-of-00004.rec")).string();
  for (const std::string& input : {std::string(""), " --data" + files}) {
    SCOPED_TRACE(input.empty() ? "memory" : "records");
    const std::string args = " --strategy multi_worker_mirrored" + input;
    const json want = uninterrupted(run_n4, args, 60, "want");
    fs::remove_all(dir_ / "ckpt");
    const Result r = run(std::string(STRATA_RUN_BIN) + " --max-restarts 2 --restart-delay 0 -n 4 --timeout 200 -- " +
                         STRATA_TRAIN_BIN + args + common(60) + " --checkpoint-dir " + (dir_ / "ckpt").string() +
                         " --checkpoint-every 10 --fault-kill-at 35:2 --save " + (dir_ / "got.json").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("restarting the job (restart 1 of 2)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("rank 2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("resumed from " + (dir_ / "ckpt" / "ckpt-30").string() + " at step 30"), std::string::npos)
        << r.output;
    expect_same_weights(read_json(dir_ / "got.json")["weights"], want);
  }
}
#endif

// SIGTERM (what Slurm sends before preempting a job): the run saves the step
// it is at and exits 143; the same command then finishes it, bit for bit.
TEST_F(ResumeTest, SigtermSavesAndTheSameCommandFinishes) {
  const json want = uninterrupted("", " --strategy one_device", 3000, "want");
  const fs::path ckpt = dir_ / "ckpt", out = dir_ / "got.json", log = dir_ / "run.log";
  const std::string cmd = std::string(STRATA_TRAIN_BIN) + common(3000) + " --checkpoint-every 1000 --checkpoint-dir " +
                          ckpt.string() + " --save " + out.string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait for training to be under way (a progress line), then SIGTERM.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("step 10/3000") != std::string::npos || text.find("step 300/3000") != std::string::npos) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      FAIL() << "no progress line: " << text;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) GTEST_SKIP() << "the run finished before SIGTERM reached it";
  ASSERT_TRUE(WIFEXITED(st)) << text;
  EXPECT_EQ(WEXITSTATUS(st), 143) << text;
  EXPECT_NE(text.find("stopped by SIGTERM after step"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out));
  const Result resumed = run(cmd);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_weights(read_json(out)["weights"], want);
}

}  // namespace
