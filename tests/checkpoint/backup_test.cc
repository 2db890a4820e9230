// SPDX-License-Identifier: Apache-2.0
// Checkpoint::track_state (objects that serialise their own position, one
// state per worker) and BackupAndRestore (Keras' callback for a custom loop):
// single-process cases here, several workers through strata-run and
// backup_worker at the end.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint_test.h"
#include "strata/strata.hpp"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// A state object whose restore records what it was given.
struct Recorder {
  std::string mine;
  std::vector<std::string> got;
  bool refuse = false;
  Checkpoint::State hooks() {
    return {[this] { return mine; },
            [this](const std::vector<std::string>& all) {
              if (refuse) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "refused on purpose");
              got = all;
            }};
  }
};

TEST(CheckpointStateTest, OneWorkersStateRoundTripsBitExact) {
  test::TempDir dir;
  Recorder r;
  r.mine = std::string("pos\0ition\xff", 10);
  Checkpoint ckpt;
  ckpt.track_state("input", r.hooks());
  ASSERT_TRUE(ckpt.save((dir.path() / "c").string()));
  Recorder back;
  Checkpoint ckpt2;
  ckpt2.track_state("input", back.hooks());
  const RestoreStatus st = ckpt2.restore((dir.path() / "c").string());
  ASSERT_EQ(back.got.size(), 1u);
  EXPECT_EQ(back.got[0], r.mine);
  EXPECT_EQ(st.restored(), std::vector<std::string>{"input"});
}

TEST(CheckpointStateTest, EmptyStateRoundTrips) {
  test::TempDir dir;
  Recorder r, back;
  Checkpoint a, b;
  a.track_state("s", r.hooks());
  a.save((dir.path() / "c").string());
  b.track_state("s", back.hooks());
  b.restore((dir.path() / "c").string());
  ASSERT_EQ(back.got.size(), 1u);
  EXPECT_EQ(back.got[0], "");
}

TEST(CheckpointStateTest, HooksAreRequired) {
  Checkpoint c;
  EXPECT_THROW(c.track_state("s", Checkpoint::State{}), InvalidArgumentError);
  EXPECT_THROW(c.track_state("s", Checkpoint::State{[] { return std::string(); }, nullptr}), InvalidArgumentError);
}

TEST(CheckpointStateTest, ARefusedStateChangesNoVariable) {
  test::TempDir dir;
  Variable v(Tensor::from_vector(std::vector<float>{1, 2, 3}), {"v"});
  std::int64_t step = 7;
  Recorder r;
  r.mine = "x";
  Checkpoint ckpt;
  ckpt.track("v", v).track("step", &step).track_state("input", r.hooks());
  ckpt.save((dir.path() / "c").string());
  v.assign(Tensor::from_vector(std::vector<float>{9, 9, 9}));
  step = 99;
  r.refuse = true;
  EXPECT_THROW(ckpt.restore((dir.path() / "c").string()), InvalidArgumentError);
  EXPECT_EQ(v.value().to_vector<float>(), (std::vector<float>{9, 9, 9}));
  EXPECT_EQ(step, 99);
  r.refuse = false;
  ckpt.restore((dir.path() / "c").string());
  EXPECT_EQ(v.value().to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(step, 7);
  EXPECT_EQ(r.got, std::vector<std::string>{"x"});
}

// The state entry is a uint8 tensor in the safetensors file; a corrupt one
// (with a CRC that matches, i.e. written so) is DataLossError naming it,
// and a state saved where a variable is expected is InvalidArgumentError.
TEST(CheckpointStateTest, CorruptOrMistypedStateEntriesAreRefused) {
  test::TempDir dir;
  {
    // A uint8 variable named "input" stands in for a state entry whose
    // framing is wrong.
    Variable fake(Tensor::from_vector(std::vector<std::uint8_t>{'S', 'T', 'S', 'T', 1, 0, 0, 0, 2, 0, 0, 0, 5}),
                  {"fake"});
    Checkpoint c;
    c.track("input", fake);
    c.save((dir.path() / "bad").string());
  }
  Recorder r;
  Checkpoint c;
  c.track_state("input", r.hooks());
  try {
    c.restore((dir.path() / "bad").string());
    FAIL() << "a corrupt state restored";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("state 'input' is corrupt"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(r.got.empty());
  Variable v(Tensor::from_vector(std::vector<float>{1}), {"v"});
  Checkpoint as_var;
  as_var.track("input", v);
  {
    Recorder s;
    s.mine = "abc";
    Checkpoint w;
    w.track_state("input", s.hooks());
    w.save((dir.path() / "state").string());
  }
  EXPECT_THROW(as_var.restore((dir.path() / "state").string()), InvalidArgumentError);
}

// ---------------------------------------------------------------- BackupAndRestore

class BackupTest : public ::testing::Test {
 protected:
  // One "training run": steps [step, total) each add step+1 to w; returns
  // whether it completed.
  bool run(int total, int kill_after = -1, const BackupOptions* opts = nullptr) {
    Variable w(Tensor::from_vector(std::vector<double>{0.0}), {"w"});
    std::int64_t step = 0;
    Recorder input;
    Checkpoint ckpt;
    ckpt.track("w", w).track("step", &step);
    BackupOptions o;
    o.save_every_steps = 3;
    if (opts) o = *opts;
    BackupAndRestore backup(ckpt, (dir_.path() / "backup").string(), o);
    resumed_from_ = backup.restore();
    while (step < total) {
      w.assign_add(Tensor::from_vector(std::vector<double>{static_cast<double>(step + 1)}));
      ++step;
      saved_.push_back(backup.step_end());
      if (step == kill_after) return false;  // "killed": no training_end
      if (backup.preempted()) {
        preempted_at_ = step;
        return false;
      }
    }
    final_w_ = w.value().to_vector<double>()[0];
    backup.training_end();
    return true;
  }
  test::TempDir dir_;
  std::optional<std::int64_t> resumed_from_;
  std::vector<bool> saved_;
  double final_w_ = -1;
  std::int64_t preempted_at_ = -1;
};

TEST_F(BackupTest, ResumesFromTheNewestBackupAndDeletesItAtTheEnd) {
  EXPECT_FALSE(run(10, /*kill_after=*/7));
  EXPECT_FALSE(resumed_from_.has_value());
  EXPECT_EQ(saved_, (std::vector<bool>{false, false, true, false, false, true, false}));
  ASSERT_TRUE(latest_checkpoint((dir_.path() / "backup").string()).has_value());
  EXPECT_EQ(fs::path(*latest_checkpoint((dir_.path() / "backup").string())).filename(), "ckpt-6");
  // max_to_keep 1: ckpt-3 is gone.
  EXPECT_FALSE(fs::exists(dir_.path() / "backup" / "ckpt-3"));
  saved_.clear();
  EXPECT_TRUE(run(10));
  ASSERT_TRUE(resumed_from_.has_value());
  EXPECT_EQ(*resumed_from_, 6);
  EXPECT_EQ(saved_, (std::vector<bool>{false, false, true, false}));  // steps 7..10: 9 saves
  EXPECT_EQ(final_w_, 55.0);  // 1 + ... + 10, each step exactly once
  EXPECT_FALSE(fs::exists(dir_.path() / "backup")) << "training_end keeps the backups";
  // A new run starts from scratch.
  EXPECT_TRUE(run(4));
  EXPECT_FALSE(resumed_from_.has_value());
  EXPECT_EQ(final_w_, 10.0);
}

TEST_F(BackupTest, KeptBackupsMakeARerunRestoreTheFinalStep) {
  BackupOptions o;
  o.save_every_steps = 5;
  o.delete_on_completion = false;
  o.max_to_keep = 2;
  EXPECT_TRUE(run(10, -1, &o));
  EXPECT_TRUE(fs::exists(dir_.path() / "backup" / "ckpt-5"));
  EXPECT_TRUE(fs::exists(dir_.path() / "backup" / "ckpt-10"));
  saved_.clear();
  EXPECT_TRUE(run(10, -1, &o));
  EXPECT_EQ(*resumed_from_, 10);
  EXPECT_TRUE(saved_.empty());
  EXPECT_EQ(final_w_, 55.0);
}

TEST_F(BackupTest, SigtermSavesAtTheNextStepEndAndKeepsTheBackup) {
  BackupOptions o;
  o.save_every_steps = 100;
  o.save_on_sigterm = true;
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  {
    Variable w(Tensor::from_vector(std::vector<double>{0.0}), {"w"});
    std::int64_t step = 0;
    Checkpoint ckpt;
    ckpt.track("w", w).track("step", &step);
    BackupAndRestore backup(ckpt, (dir_.path() / "backup").string(), o);
    for (; step < 50;) {
      w.assign_add(Tensor::from_vector(std::vector<double>{1.0}));
      ++step;
      if (step == 4) {
        ASSERT_EQ(::raise(SIGTERM), 0);  // the handler only records it
      }
      if (backup.step_end()) break;
    }
    EXPECT_TRUE(backup.preempted());
    EXPECT_EQ(step, 4);
    backup.training_end();  // after a preemption: keeps the backup
  }
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "the SIGTERM handler was not put back";
  EXPECT_TRUE(fs::exists(dir_.path() / "backup" / "ckpt-4"));
  o.save_on_sigterm = false;
  o.save_every_steps = 3;
  EXPECT_TRUE(run(6, -1, &o));
  EXPECT_EQ(*resumed_from_, 4);
  EXPECT_EQ(final_w_, 4.0 + 5 + 6);
}

TEST(BackupAndRestoreTest, BadUseIsAClearError) {
  test::TempDir dir;
  Variable w(Tensor::from_vector(std::vector<float>{0}), {"w"});
  Checkpoint no_step;
  no_step.track("w", w);
  try {
    BackupAndRestore b(no_step, dir.path().string(), 10);
    FAIL() << "no step tracked";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("\"step\""), std::string::npos) << e.what();
  }
  std::int64_t step = 0;
  Checkpoint ok;
  ok.track("step", &step);
  EXPECT_THROW(BackupAndRestore(ok, dir.path().string(), 0), InvalidArgumentError);
  BackupOptions o;
  o.save_every_steps = 1;
  o.max_to_keep = 0;
  EXPECT_THROW(BackupAndRestore(ok, dir.path().string(), o), InvalidArgumentError);
}

#ifdef STRATA_RUN_BIN
// Several workers: every worker's state reaches the checkpoint (gathered to
// the chief), and every worker restores the full list, also with another
// number of workers.
std::string run_job(int n, const std::string& mode, const fs::path& dir) {
  const std::string cmd = std::string(STRATA_RUN_BIN) + " -n " + std::to_string(n) + " --timeout 120 -- " +
                          STRATA_BACKUP_WORKER_BIN + " " + mode + " " + dir.string() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, k);
  const int st = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  return out;
}

TEST(CheckpointStateTest, EveryWorkersStateIsSavedAndRestoredOnAnyWorkerCount) {
  test::TempDir dir;
  const std::string saved = run_job(3, "save", dir.path() / "c");
  EXPECT_NE(saved.find("[0] saved"), std::string::npos) << saved;
  for (int n : {3, 2}) {
    const std::string out = run_job(n, "restore", dir.path() / "c");
    for (int w = 0; w < n; ++w) {
      EXPECT_NE(out.find("[" + std::to_string(w) + "] restored w=6 states=state-of-worker-0-of-3,state-of-worker-1-of-3,"
                         "state-of-worker-2-of-3"),
                std::string::npos)
          << out;
    }
  }
}
#endif

}  // namespace
}  // namespace strata
