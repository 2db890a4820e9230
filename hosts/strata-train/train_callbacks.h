// SPDX-License-Identifier: Apache-2.0
// strata-train's options as Trainer callbacks (strata/trainer.hpp's hooks).
// fit() runs --steps N as N / S epochs of S steps; the callbacks count in
// global steps (Trainer::global_step(), from 0 at the start of training,
// the restored step after a resume), as the hand-written loop they replace
// did. Every worker runs every callback at the same steps; what prints or
// writes a file says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/strata.hpp"

namespace strata::train {

/// --steps-per-epoch: S itself when given (it must divide `steps`), else
/// the smallest divisor of `steps` that is at least steps / 10, so that a
/// run has at most 10 epochs (10 progress lines and validations) and every
/// epoch the same length. 1 for steps <= 0.
std::int64_t steps_per_epoch(std::int64_t steps, std::int64_t requested);

/// Thrown out of fit() once a SIGTERM-triggered checkpoint is saved; the
/// program exits 128 + SIGTERM and the same command resumes.
struct Preempted : std::runtime_error {
  explicit Preempted(std::int64_t step) : std::runtime_error("preempted"), step(step) {}
  std::int64_t step;
};

/// The per-step loss check and the old progress lines: after every step the
/// loss (all-reduced with the gradients) must be finite, else DataLossError
/// ("lower --lr"); with log_every > 0 and stderr not a terminal, every
/// worker prints "step S/N  loss L  R steps/s" every log_every steps and at
/// the last. Keeps the training time without validation (on_test_*).
class StepLog : public Callback {
 public:
  StepLog(const double* loss, int total, int log_every, bool quiet);
  void on_train_batch_begin(std::int64_t, const Logs&) override;
  void on_train_batch_end(std::int64_t, const Logs&) override;
  void on_test_begin(const Logs&) override;
  void on_test_end(const Logs&) override;
  /// Seconds spent in training steps since the first one of this run.
  double train_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  const double* loss_;
  int total_, log_every_;
  bool print_;
  std::optional<std::int64_t> first_;
  Clock::time_point start_, test_start_;
  double test_seconds_ = 0;
};

/// --checkpoint-dir / --checkpoint-every / --keep-checkpoints / --restore:
/// checkpoints of the model's variables ("dense1/kernel", ...), the step,
/// the last loss and every worker's input position (the names strata-train
/// has always used, so older checkpoints restore), through
/// strata::BackupAndRestore with save_on_sigterm. on_train_begin restores
/// the newest checkpoint in the directory, else --restore, and moves fit to
/// that step (Trainer::resume_at); a SIGTERM saves at the next step's end
/// and throws Preempted; the final step is saved at the end and kept.
class StepCheckpoints : public Callback {
 public:
  struct Options {
    std::string directory;  // empty: no periodic checkpoints
    int every = 100;
    int keep = 2;
    std::string restore;  // --restore
    int total_steps = 0;
    std::int64_t steps_per_epoch = 1;
    bool quiet = false;
  };
  StepCheckpoints(Options options, double* loss);
  ~StepCheckpoints() override;
  void on_train_begin(const Logs&) override;
  void on_train_batch_end(std::int64_t, const Logs&) override;
  void on_train_end(const Logs&) override;
  /// The step training started from (0, or the restored one).
  std::int64_t start_step() const { return start_; }

 private:
  Options o_;
  double* loss_;
  std::int64_t step_ = 0, start_ = 0;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<BackupAndRestore> backup_;
};

/// --fault-kill-at STEP:RANK (tests): worker RANK SIGKILLs itself at the
/// start of global step STEP. `step` < 0: never.
class FaultKill : public Callback {
 public:
  explicit FaultKill(int step) : step_(step) {}
  void on_train_batch_begin(std::int64_t, const Logs&) override;

 private:
  int step_;
};

/// One --switch-transport entry.
struct TransportSwitch {
  int step = 0;
  std::string name;
  std::string options = "{}";
  std::string text;  // as the user wrote it, for messages
};
/// Every --switch-transport value, in step order (same step: command-line
/// order); InvalidArgumentError naming the value and the syntax.
std::vector<TransportSwitch> parse_switches(const std::vector<std::string>& values, int steps);

/// --switch-transport: at the start of global step STEP (before its
/// all-reduce) every worker calls set_transport. A failed switch is logged
/// on every worker (each gets the same error) and training goes on over the
/// old transport. Switches before a resumed step are skipped with a note.
class TransportSwitcher : public Callback {
 public:
  TransportSwitcher(std::vector<TransportSwitch> switches, bool quiet);
  void on_train_begin(const Logs&) override;
  void on_train_batch_begin(std::int64_t, const Logs&) override;

 private:
  std::vector<TransportSwitch> switches_;
  bool quiet_;
  std::size_t next_ = 0;
};

/// --save FILE: at the end of training the chief (not an evaluator) writes
/// the weights as JSON ("strata-train-weights-v1": steps, final_loss, every
/// variable's shape and data), durably: a temp file fsync'ed, renamed into
/// place, the directory fsync'ed.
class SaveWeights : public Callback {
 public:
  SaveWeights(std::string path, int steps, const double* loss);
  void on_train_end(const Logs&) override;

 private:
  std::string path_;
  int steps_;
  const double* loss_;
};

/// Remove the temps of earlier writers of `path` on this host that no
/// longer run (a writer killed mid-write leaves its temp behind).
void remove_stale_temps(const std::string& path);

}  // namespace strata::train
