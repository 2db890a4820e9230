// SPDX-License-Identifier: Apache-2.0
// strata::CheckpointManager: numbering, max_to_keep, latest_checkpoint over
// directories that are not complete checkpoints, and crash safety: a forked
// writer SIGKILLed at random points never leaves a directory that restores
// wrongly, and the previous checkpoint always survives.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <random>

#include "checkpoint_test.h"
#include "strata/strata.hpp"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string name_of(const std::string& path) { return fs::path(path).filename().string(); }
std::vector<std::string> names_of(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) out.push_back(name_of(p));
  return out;
}

TEST(CheckpointManagerTest, KeepsTheNewestMaxToKeep) {
  test::TempDir dir;
  Variable w(Tensor::from_vector<std::int64_t>({0, 0}), {"w"});
  std::int64_t step = 0;
  Checkpoint ckpt;
  ckpt.track("w", w).track("step", &step);
  CheckpointManager mgr(ckpt, dir.str() + "/run", 2);
  EXPECT_EQ(mgr.latest_checkpoint(), std::nullopt);  // the directory does not exist yet
  EXPECT_TRUE(mgr.checkpoints().empty());
  EXPECT_EQ(mgr.restore_or_initialize(), std::nullopt);
  for (step = 1; step <= 5; ++step) {
    w.assign(Tensor::from_vector<std::int64_t>({step, -step}));
    EXPECT_EQ(mgr.save(step), dir.str() + "/run/ckpt-" + std::to_string(step));
  }
  EXPECT_EQ(names_of(mgr.checkpoints()), (std::vector<std::string>{"ckpt-4", "ckpt-5"}));
  EXPECT_EQ(mgr.latest_checkpoint(), dir.str() + "/run/ckpt-5");
  EXPECT_EQ(latest_checkpoint(dir.str() + "/run"), dir.str() + "/run/ckpt-5");
  EXPECT_FALSE(fs::exists(dir.path() / "run/ckpt-3"));
  // Numeric, not lexicographic, order: ckpt-10 is newer than ckpt-5.
  step = 10;
  w.assign(Tensor::from_vector<std::int64_t>({10, -10}));
  mgr.save(10);
  EXPECT_EQ(names_of(mgr.checkpoints()), (std::vector<std::string>{"ckpt-5", "ckpt-10"}));
  w.assign(Tensor::from_vector<std::int64_t>({0, 0}));
  step = 0;
  const std::optional<RestoreStatus> st = mgr.restore_or_initialize();
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step(), std::optional<std::int64_t>(10));
  EXPECT_EQ(step, 10);
  EXPECT_EQ(w.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{10, -10}));
  // Saving a step again replaces that checkpoint.
  w.assign(Tensor::from_vector<std::int64_t>({77, 78}));
  mgr.save(10);
  w.assign(Tensor::from_vector<std::int64_t>({0, 0}));
  ckpt.restore(*mgr.latest_checkpoint());
  EXPECT_EQ(w.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{77, 78}));
  EXPECT_EQ(names_of(mgr.checkpoints()), (std::vector<std::string>{"ckpt-5", "ckpt-10"}));
  EXPECT_THROW(CheckpointManager(ckpt, dir.str(), -1), InvalidArgumentError);
  EXPECT_THROW(mgr.save(-1), InvalidArgumentError);
}

TEST(CheckpointManagerTest, IgnoresWhatIsNotACompleteCheckpoint) {
  test::TempDir dir;
  Variable w(Tensor::from_vector<float>({1, 2}), {"w"});
  Checkpoint ckpt;
  ckpt.track("w", w);
  CheckpointManager mgr(ckpt, dir.str(), 0);
  mgr.save(5);
  const fs::path d = dir.path();
  // A temporary that holds a complete copy (killed just before its rename),
  // directories without a (valid) manifest, a file, other names.
  fs::copy(d / "ckpt-5", d / ".ckpt-9.tmp-123-0", fs::copy_options::recursive);
  fs::create_directories(d / "ckpt-7");
  std::ofstream(d / "ckpt-7" / Checkpoint::kTensorFile) << "x";
  fs::copy(d / "ckpt-5", d / "ckpt-8", fs::copy_options::recursive);
  std::ofstream(d / "ckpt-8" / Checkpoint::kManifestFile) << "{\"format\": \"strata.checkpoint\", \"form";
  fs::copy(d / "ckpt-5", d / "ckpt-11", fs::copy_options::recursive);
  fs::resize_file(d / "ckpt-11" / Checkpoint::kTensorFile, 10);  // manifest intact, data truncated
  std::ofstream(d / "ckpt-12") << "a file";
  fs::copy(d / "ckpt-5", d / "ckpt-x", fs::copy_options::recursive);
  fs::copy(d / "ckpt-5", d / "ckpt-013", fs::copy_options::recursive);
  EXPECT_EQ(mgr.latest_checkpoint(), (d / "ckpt-5").string());
  EXPECT_EQ(names_of(mgr.checkpoints()), std::vector<std::string>{"ckpt-5"});
  EXPECT_FALSE(is_checkpoint((d / "ckpt-7").string()));
  EXPECT_FALSE(is_checkpoint((d / "ckpt-8").string()));
  EXPECT_TRUE(is_checkpoint((d / "ckpt-5").string()));
  // The next save removes the temporary of the crashed save.
  mgr.save(6);
  EXPECT_FALSE(fs::exists(d / ".ckpt-9.tmp-123-0"));
  EXPECT_EQ(names_of(mgr.checkpoints()), (std::vector<std::string>{"ckpt-5", "ckpt-6"}));
  EXPECT_EQ(latest_checkpoint((d / "nowhere").string()), std::nullopt);
}

// ---------------------------------------------------------------- crash safety

constexpr std::int64_t kElems = 1 << 20;  // 8 MiB of int64: a save takes a while

// Element i of the checkpoint of step s: a pattern that a stale or mixed
// file cannot reproduce.
std::int64_t pattern(std::int64_t step, std::int64_t i) { return step * 1000003 + i * 7; }

// The child: resume after the latest checkpoint and save steps forever.
[[noreturn]] void writer(const std::string& dir) {
  try {
    std::vector<std::int64_t> v(kElems);
    Variable w(Tensor::zeros({kElems}, DType::kInt64), {"w"});
    std::int64_t step = 0;
    Checkpoint ckpt;
    ckpt.track("w", w).track("step", &step);
    CheckpointManager mgr(ckpt, dir, 3);
    if (mgr.restore_or_initialize()) ++step;
    for (;; ++step) {
      for (std::int64_t i = 0; i < kElems; ++i) v[static_cast<std::size_t>(i)] = pattern(step, i);
      w.assign(Tensor::from_vector(v));
      mgr.save(step);
    }
  } catch (...) {
  }
  ::_exit(3);
}

// Restore `path` and check that it holds exactly the state of its step.
void expect_consistent(const std::string& path) {
  Variable w(Tensor::zeros({kElems}, DType::kInt64), {"w"});
  std::int64_t step = -1;
  Checkpoint ckpt;
  ckpt.track("w", w).track("step", &step);
  const RestoreStatus st = ckpt.restore(path);
  ASSERT_TRUE(st.step().has_value()) << path;
  EXPECT_EQ(*st.step(), step) << path;
  const std::string name = name_of(path);
  if (name.rfind("ckpt-", 0) == 0) {
    EXPECT_EQ(name, "ckpt-" + std::to_string(step));
  }
  const Tensor t = w.value();
  const std::int64_t* p = t.data<std::int64_t>();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < kElems; ++i) bad += p[i] != pattern(step, i);
  EXPECT_EQ(bad, 0) << path << " (step " << step << ")";
}

TEST(CheckpointCrashTest, KilledWritersNeverLeaveACheckpointThatRestoresWrongly) {
  test::TempDir dir;
  const std::string run = dir.str() + "/run";
  std::mt19937 rng(20261126);
  std::int64_t previous = -1;
  int kills_mid_save = 0;
  for (int round = 0; round < 8; ++round) {
    test::Children children;
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) writer(run);
    children.pids.push_back(pid);
    // Wait until it has finished a save past the last round's (however slow
    // the build: sanitizers make a save many times slower), then kill it at
    // a random moment after that, most likely inside a later save.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      const std::optional<std::string> now = latest_checkpoint(run);
      if (now && std::stoll(name_of(*now).substr(5)) > previous) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 120));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    children.pids.clear();
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited on its own (status " << status << ")";

    // Whatever the directory holds, each entry restore accepts is exact.
    bool temporary = false;
    for (const auto& e : fs::directory_iterator(run)) {
      const std::string path = e.path().string();
      temporary |= name_of(path).find(".tmp-") != std::string::npos;
      if (!e.is_directory()) continue;
      try {
        expect_consistent(path);
      } catch (const NotFoundError&) {  // a temporary without its files or manifest yet
        EXPECT_NE(name_of(path).find(".tmp-"), std::string::npos) << path;
      } catch (const DataLossError& err) {  // a temporary caught mid-write
        EXPECT_NE(name_of(path).find(".tmp-"), std::string::npos) << err.what();
      }
    }
    kills_mid_save += temporary;
    // The latest checkpoint restores, and it is never older than the last
    // round's (a killed save does not take the previous one with it).
    const std::optional<std::string> latest = latest_checkpoint(run);
    ASSERT_TRUE(latest.has_value()) << "round " << round;
    expect_consistent(*latest);
    const std::int64_t step = std::stoll(name_of(*latest).substr(5));
    EXPECT_GE(step, previous) << "round " << round;
    previous = step;
  }
  // Every round waited for a save past the previous round's. SIGKILL
  // landing inside a save is likely but not certain on every round.
  EXPECT_GE(previous, 7) << "the writers made too little progress to test anything";
  std::cout << "[ info ] " << kills_mid_save << " of 8 kills left a temporary behind; latest step " << previous
            << "\n";
}

}  // namespace
}  // namespace strata
