// SPDX-License-Identifier: Apache-2.0
// Keras' callbacks for strata::Trainer (see trainer.hpp for the hooks and
// the rules every callback follows across workers). Those that print or
// write files do it on the chief only (strategy.extended().is_chief()).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/checkpoint.hpp"
#include "strata/trainer.hpp"

namespace strata {

/// Keras' progress bar. On a terminal: "Epoch 1/5" then a bar redrawn as
/// steps finish ("12/100 ━━━━━━━━━━━━━━━━━━━━ 1s 12ms/step - accuracy:
/// 0.5100 - loss: 1.2300"), finished with the epoch's and validation
/// metrics. Not on a terminal (a pipe, a file, a batch job's log): one line
/// per epoch ("Epoch 1/5 - 100/100 - 2s - 20ms/step - accuracy: ... -
/// loss: ... - val_loss: ..."). The running metrics are read every
/// `update_every` steps (a collective across workers), the same on every
/// worker; the step count of an epoch shows as "Unknown" until the first
/// epoch has ended. `out` defaults to stdout; `terminal` to isatty(out).
class STRATA_API ProgressBar : public Callback {
 public:
  explicit ProgressBar(std::FILE* out = nullptr, std::optional<bool> terminal = std::nullopt, int update_every = 10);
  void on_train_begin(const Logs&) override;
  void on_epoch_begin(int epoch, const Logs&) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  bool wants_batch_logs(std::int64_t batch) const override;

 private:
  void line(std::int64_t done, const Logs& logs, bool final);
  std::FILE* out_;
  bool terminal_;
  int update_every_;
  bool chief_ = true;
  int epochs_ = 0;
  std::int64_t steps_ = 0, known_steps_ = -1;
  double epoch_start_ = 0;
};

/// keras.callbacks.EarlyStopping: stop when `monitor` has not improved by
/// more than min_delta for `patience` epochs (after start_from_epoch).
/// mode "min", "max" or "auto" ("max" for names with "acc", else "min").
/// With a baseline, training also stops if the baseline is never beaten.
/// restore_best_weights puts back the model's (trainable) weights of the
/// best epoch when it stops. A monitor missing from the logs is logged
/// once and ignored.
class STRATA_API EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(std::string monitor = "val_loss", double min_delta = 0, int patience = 0,
                         std::string mode = "auto", std::optional<double> baseline = std::nullopt,
                         bool restore_best_weights = false, int start_from_epoch = 0);
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  /// The epoch at which training was stopped (-1 when it was not).
  int stopped_epoch() const { return stopped_epoch_; }
  int best_epoch() const { return best_epoch_; }

 private:
  bool improved(double value, std::optional<double> reference) const;
  std::string monitor_;
  double min_delta_;
  int patience_, start_from_epoch_;
  bool maximize_, restore_best_;
  std::optional<double> baseline_, best_;
  int wait_ = 0, stopped_epoch_ = -1, best_epoch_ = 0;
  bool warned_ = false;
  std::vector<Tensor> best_weights_;
};

/// keras.callbacks.TerminateOnNaN: when a batch ends with a NaN or infinite
/// "loss" in its logs, training stops after that batch (stop_training),
/// and the chief prints "Batch N: Invalid loss, terminating training" to
/// `out` (stdout by default). It reads the running loss after every batch:
/// a collective across workers (one small all-reduce per step), and the
/// same value on every worker, so all of them stop at the same batch.
class STRATA_API TerminateOnNaN : public Callback {
 public:
  explicit TerminateOnNaN(std::FILE* out = nullptr);
  void on_train_begin(const Logs&) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  bool wants_batch_logs(std::int64_t) const override { return true; }
  /// The batch (within its epoch) after which training stopped, or -1.
  std::int64_t stopped_batch() const { return stopped_batch_; }
  /// The epoch in which training stopped, or -1.
  int stopped_epoch() const { return stopped_epoch_; }

 private:
  std::FILE* out_;
  std::int64_t stopped_batch_ = -1;
  int stopped_epoch_ = -1;
};

/// keras.callbacks.LearningRateScheduler: at every epoch's start the
/// optimizer's learning rate becomes schedule(epoch, current rate).
class STRATA_API LearningRateScheduler : public Callback {
 public:
  explicit LearningRateScheduler(std::function<double(int epoch, double lr)> schedule);
  void on_epoch_begin(int epoch, const Logs&) override;

 private:
  std::function<double(int, double)> schedule_;
};

/// keras.callbacks.CSVLogger: one row per epoch, "epoch" then the logs'
/// keys sorted, header first (append: keep an existing file's rows and
/// header). Values in the shortest form that reads back exactly.
class STRATA_API CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string filename, char separator = ',', bool append = false);
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;

 private:
  std::string filename_;
  char separator_;
  bool append_;
  std::vector<std::string> keys_;
};

/// keras.callbacks.TensorBoard (scalars): after every epoch, "epoch_<name>"
/// scalars of the training logs into <log_dir>/train and of the
/// validation logs (their "val_" removed) into <log_dir>/validation, as
/// TensorBoard event files (events.out.tfevents.<seconds>.<host>: TFRecord
/// framing around protobuf Event messages, written without a protobuf
/// library), at step = epoch.
class STRATA_API TensorBoard : public Callback {
 public:
  explicit TensorBoard(std::string log_dir);
  ~TensorBoard() override;
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs&) override;

  /// The protobuf bytes of an Event {wall_time, step, summary {value {tag,
  /// simple_value}}} (exposed for tests and other writers).
  static std::string encode_scalar_event(double wall_time, std::int64_t step, const std::string& tag, float value);
  /// The first event of every file: {wall_time, file_version: "brain.Event:2"}.
  static std::string encode_file_version_event(double wall_time);

 private:
  struct Writers;
  std::string log_dir_;
  std::unique_ptr<Writers> writers_;
};

/// keras.callbacks.ModelCheckpoint: after every epoch (or only when
/// `monitor` improved, with save_best_only), a strata::Checkpoint of the
/// model's trainable variables and the optimizer's state into
/// <directory>/ckpt-<epoch + 1> (the newest max_to_keep kept; 0 keeps all).
class STRATA_API ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(std::string directory, std::string monitor = "val_loss", bool save_best_only = false,
                           std::string mode = "auto", int max_to_keep = 0);
  void on_epoch_end(int epoch, const Logs& logs) override;
  /// Restore the model and optimizer from the newest checkpoint in
  /// `directory`; returns the epoch to continue from (fit's
  /// initial_epoch), 0 when there is none.
  static int restore_latest(Trainer& trainer, const std::string& directory);

 private:
  std::string directory_, monitor_;
  bool save_best_only_, maximize_;
  int max_to_keep_;
  std::optional<double> best_;
};

/// keras.callbacks.BackupAndRestore for Trainer::fit: a job that is killed
/// (or preempted) and started again continues where the last backup was
/// taken, as if nothing had happened. Backups hold the model's trainable
/// variables, the optimizer's slots and iterations, the metrics' running
/// state, the epoch and step, and every worker's input position (the
/// DistributedIterator's state), so the resumed run sees exactly the
/// batches the lost one would have seen. save_every_steps: 0 saves at the
/// end of every epoch (Keras' save_freq="epoch"); N also every N training
/// steps. The newest backup is kept in <directory>/ckpt-<global step>;
/// training_end deletes them (delete_checkpoint, as Keras), unless training
/// was stopped by a callback. Every worker must see `directory`.
class STRATA_API BackupAndRestoreCallback : public Callback {
 public:
  explicit BackupAndRestoreCallback(std::string directory, std::int64_t save_every_steps = 0,
                                    bool delete_checkpoint = true);
  ~BackupAndRestoreCallback() override;
  void on_train_begin(const Logs&) override;
  void on_train_batch_end(std::int64_t batch, const Logs&) override;
  void on_epoch_end(int epoch, const Logs&) override;
  void on_train_end(const Logs&) override;
  /// Whether on_train_begin restored a backup, and its global step.
  std::optional<std::int64_t> restored_step() const { return restored_; }

 private:
  void save(bool epoch_done);
  std::string directory_;
  std::int64_t every_;
  bool delete_;
  std::int64_t step_ = 0, epoch_ = 0, step_in_epoch_ = 0, epoch_done_ = 0;
  std::unique_ptr<Checkpoint> ckpt_;
  std::optional<std::int64_t> restored_;
};

}  // namespace strata
