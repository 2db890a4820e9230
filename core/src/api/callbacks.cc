// SPDX-License-Identifier: Apache-2.0
// Keras' callbacks for strata::Trainer (see strata/callbacks.hpp).
#include "strata/callbacks.hpp"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "log.h"
#include "strata/error.hpp"
#include "strata/records.hpp"

namespace strata {

namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool is_chief(Trainer* t) { return t == nullptr || t->strategy().extended().is_chief(); }

// Keras' number format in the bar: 4 decimals, or scientific for tiny values.
std::string metric_value(double v) {
  char buf[64];
  if (v != 0 && std::fabs(v) < 1e-3)
    std::snprintf(buf, sizeof buf, "%.4e", v);
  else
    std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

std::string duration(double s) {
  char buf[64];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%d:%02d:%02d", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60,
                  static_cast<int>(s) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%d:%02d", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ds", static_cast<int>(s));
  return buf;
}

std::string per_step(double s) {
  char buf[64];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.0fs/step", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.0fms/step", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0fus/step", s * 1e6);
  return buf;
}

bool maximize_for(const std::string& mode, const std::string& monitor) {
  if (mode == "max") return true;
  if (mode == "min") return false;
  STRATA_ENFORCE(mode == "auto", STRATA_ERR_INVALID_ARGUMENT, "mode must be \"auto\", \"min\" or \"max\"; got \"",
                 mode, "\"");
  return monitor.find("acc") != std::string::npos;
}

// The shortest decimal that reads back as the same double.
std::string exact(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

// ---------------------------------------------------------------- ProgressBar

ProgressBar::ProgressBar(std::FILE* out, std::optional<bool> terminal, int update_every)
    : out_(out ? out : stdout),
      terminal_(terminal ? *terminal : ::isatty(::fileno(out ? out : stdout)) != 0),
      update_every_(update_every) {
  STRATA_ENFORCE(update_every >= 1, STRATA_ERR_INVALID_ARGUMENT, "ProgressBar: update_every must be >= 1; got ",
                 update_every);
}

void ProgressBar::on_train_begin(const Logs&) {
  chief_ = is_chief(trainer());
  epochs_ = 0;
  known_steps_ = -1;
}

void ProgressBar::on_epoch_begin(int epoch, const Logs&) {
  steps_ = 0;
  epoch_start_ = now_s();
  ++epochs_;
  (void)epoch;
  if (!chief_ || !terminal_) return;
  std::fprintf(out_, "Epoch %d\n", epoch + 1);
  std::fflush(out_);
}

TerminateOnNaN::TerminateOnNaN(std::FILE* out) : out_(out != nullptr ? out : stdout) {}

void TerminateOnNaN::on_train_begin(const Logs&) {
  stopped_batch_ = -1;
  stopped_epoch_ = -1;
}

void TerminateOnNaN::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  const auto it = logs.find("loss");
  if (it == logs.end() || std::isfinite(it->second)) return;
  stopped_batch_ = batch;
  stopped_epoch_ = trainer()->epoch();
  trainer()->stop_training = true;
  if (is_chief(trainer())) {
    std::fprintf(out_, "Batch %lld: Invalid loss, terminating training\n", static_cast<long long>(batch));
    std::fflush(out_);
  }
}

bool ProgressBar::wants_batch_logs(std::int64_t batch) const { return (batch + 1) % update_every_ == 0; }

void ProgressBar::line(std::int64_t done, const Logs& logs, bool final) {
  const double elapsed = now_s() - epoch_start_;
  const std::string target = known_steps_ > 0 ? std::to_string(known_steps_) : std::string("Unknown");
  std::string s;
  if (terminal_) {
    const int width = 20;
    const int filled = known_steps_ > 0 ? static_cast<int>(width * std::min<std::int64_t>(done, known_steps_) / known_steps_)
                                        : (final ? width : 0);
    std::string bar;
    for (int i = 0; i < width; ++i) bar += i < filled ? "\u2501" : " ";
    s = "\r" + std::to_string(done) + "/" + target + " " + bar + " ";
    if (final || known_steps_ <= 0)
      s += duration(elapsed) + " " + per_step(done > 0 ? elapsed / static_cast<double>(done) : 0);
    else
      s += "ETA: " + duration(elapsed / static_cast<double>(std::max<std::int64_t>(done, 1)) *
                              static_cast<double>(known_steps_ - done));
  } else {
    s = "Epoch " + std::to_string(trainer() ? trainer()->epoch() + 1 : epochs_) + " - " + std::to_string(done) + "/" +
        (final ? std::to_string(done) : target) + " - " + duration(elapsed) + " - " +
        per_step(done > 0 ? elapsed / static_cast<double>(done) : 0);
  }
  for (const auto& [k, v] : logs)
    if (k.rfind("val_", 0) != 0) s += " - " + k + ": " + metric_value(v);
  for (const auto& [k, v] : logs)
    if (k.rfind("val_", 0) == 0) s += " - " + k + ": " + metric_value(v);
  if (terminal_) s += "\x1b[K";  // clear what a longer previous line left
  if (final) s += "\n";
  std::fputs(s.c_str(), out_);
  std::fflush(out_);
}

void ProgressBar::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  steps_ = batch + 1;
  if (!chief_ || !terminal_ || logs.empty()) return;
  line(steps_, logs, false);
}

void ProgressBar::on_epoch_end(int, const Logs& logs) {
  known_steps_ = steps_;
  if (!chief_) return;
  line(steps_, logs, true);
}

// ---------------------------------------------------------------- EarlyStopping

EarlyStopping::EarlyStopping(std::string monitor, double min_delta, int patience, std::string mode,
                             std::optional<double> baseline, bool restore_best_weights, int start_from_epoch)
    : monitor_(std::move(monitor)),
      min_delta_(std::fabs(min_delta)),
      patience_(patience),
      start_from_epoch_(start_from_epoch),
      maximize_(maximize_for(mode, monitor_)),
      restore_best_(restore_best_weights),
      baseline_(baseline) {
  STRATA_ENFORCE(patience >= 0, STRATA_ERR_INVALID_ARGUMENT, "EarlyStopping: patience must be >= 0; got ", patience);
}

void EarlyStopping::on_train_begin(const Logs&) {
  wait_ = 0;
  stopped_epoch_ = -1;
  best_.reset();
  best_epoch_ = 0;
  best_weights_.clear();
}

// Keras' _is_improvement: (value - min_delta) > reference for max,
// (value + min_delta) < reference for min; anything beats no reference.
bool EarlyStopping::improved(double value, std::optional<double> reference) const {
  if (!reference) return true;
  return maximize_ ? value - min_delta_ > *reference : value + min_delta_ < *reference;
}

void EarlyStopping::on_epoch_end(int epoch, const Logs& logs) {
  auto it = logs.find(monitor_);
  if (it == logs.end()) {
    if (!warned_) {
      std::string keys;
      for (const auto& kv : logs) keys += (keys.empty() ? "" : ", ") + kv.first;
      detail::logger("core")->warn("EarlyStopping: the logs have no '{}' (they have: {}); not stopping on it",
                                   monitor_, keys);
      warned_ = true;
    }
    return;
  }
  if (epoch < start_from_epoch_) return;
  auto weights = [&] {
    std::vector<Tensor> w;
    for (Variable* v : trainer()->model().trainable_variables()) w.push_back(v->value());
    return w;
  };
  if (restore_best_ && best_weights_.empty()) best_weights_ = weights();
  ++wait_;
  const double current = it->second;
  if (improved(current, best_)) {
    best_ = current;
    best_epoch_ = epoch;
    if (restore_best_) best_weights_ = weights();
    if (!baseline_ || improved(current, baseline_)) wait_ = 0;
    return;
  }
  if (wait_ >= patience_ && epoch > 0) {
    stopped_epoch_ = epoch;
    trainer()->stop_training = true;
    if (restore_best_ && !best_weights_.empty()) {
      const std::vector<Variable*> vars = trainer()->model().trainable_variables();
      for (std::size_t i = 0; i < vars.size(); ++i) vars[i]->assign(best_weights_[i]);
    }
  }
}

// ---------------------------------------------------------------- LearningRateScheduler

LearningRateScheduler::LearningRateScheduler(std::function<double(int, double)> schedule)
    : schedule_(std::move(schedule)) {
  STRATA_ENFORCE(static_cast<bool>(schedule_), STRATA_ERR_INVALID_ARGUMENT,
                 "LearningRateScheduler: the schedule is empty");
}

void LearningRateScheduler::on_epoch_begin(int epoch, const Logs&) {
  Optimizer& opt = trainer()->optimizer();
  const double lr = schedule_(epoch, opt.learning_rate());
  STRATA_ENFORCE(std::isfinite(lr) && lr >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "LearningRateScheduler: the schedule returned ", lr, " for epoch ", epoch,
                 "; a learning rate must be a finite number >= 0");
  opt.set_learning_rate(lr);
}

// ---------------------------------------------------------------- CSVLogger

CSVLogger::CSVLogger(std::string filename, char separator, bool append)
    : filename_(std::move(filename)), separator_(separator), append_(append) {}

void CSVLogger::on_train_begin(const Logs&) {
  keys_.clear();
  if (!is_chief(trainer())) return;
  if (append_) {
    std::ifstream in(filename_);
    std::string header;
    if (std::getline(in, header) && !header.empty()) {
      std::stringstream ss(header);
      std::string k;
      std::getline(ss, k, separator_);  // "epoch"
      while (std::getline(ss, k, separator_)) keys_.push_back(k);
    }
    return;
  }
  std::ofstream out(filename_, std::ios::trunc);
  STRATA_ENFORCE(out.good(), STRATA_ERR_NOT_FOUND, "CSVLogger: cannot write '", filename_,
                 "'; check that its directory exists and is writable");
}

void CSVLogger::on_epoch_end(int epoch, const Logs& logs) {
  if (!is_chief(trainer())) return;
  std::ofstream out(filename_, std::ios::app);
  STRATA_ENFORCE(out.good(), STRATA_ERR_NOT_FOUND, "CSVLogger: cannot write '", filename_, "'");
  if (keys_.empty()) {
    for (const auto& kv : logs) keys_.push_back(kv.first);  // sorted: a std::map
    out << "epoch";
    for (const std::string& k : keys_) out << separator_ << k;
    out << "\n";
  }
  out << epoch;
  for (const std::string& k : keys_) {
    auto it = logs.find(k);
    out << separator_ << (it == logs.end() ? std::string("NA") : exact(it->second));
  }
  out << "\n";
  out.flush();
  STRATA_ENFORCE(out.good(), STRATA_ERR_DATA_LOSS, "CSVLogger: writing '", filename_, "' failed");
}

// ---------------------------------------------------------------- TensorBoard

namespace {

void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void fixed(std::string& out, const void* p, int n) { out.append(static_cast<const char*>(p), static_cast<std::size_t>(n)); }

void length_delimited(std::string& out, int field, const std::string& bytes) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}

std::string event_head(double wall_time, std::int64_t step) {
  std::string e;
  varint(e, 1 << 3 | 1);  // wall_time: double
  fixed(e, &wall_time, 8);
  if (step != 0) {
    varint(e, 2 << 3 | 0);  // step: int64
    varint(e, static_cast<std::uint64_t>(step));
  }
  return e;
}

double wall_clock() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string TensorBoard::encode_scalar_event(double wall_time, std::int64_t step, const std::string& tag, float value) {
  std::string v;
  length_delimited(v, 1, tag);  // Summary.Value.tag
  varint(v, 2 << 3 | 5);        // Summary.Value.simple_value: float
  fixed(v, &value, 4);
  std::string summary;
  length_delimited(summary, 1, v);  // Summary.value
  std::string e = event_head(wall_time, step);
  length_delimited(e, 5, summary);  // Event.summary
  return e;
}

std::string TensorBoard::encode_file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  length_delimited(e, 3, "brain.Event:2");  // Event.file_version
  return e;
}

struct TensorBoard::Writers {
  std::unique_ptr<RecordWriter> train, validation;
};

TensorBoard::TensorBoard(std::string log_dir) : log_dir_(std::move(log_dir)) {}
TensorBoard::~TensorBoard() = default;

void TensorBoard::on_train_begin(const Logs&) {
  writers_.reset();
  if (!is_chief(trainer())) return;
  writers_ = std::make_unique<Writers>();
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
  const double t = wall_clock();
  auto open = [&](const char* sub) {
    const fs::path dir = fs::path(log_dir_) / sub;
    std::error_code ec;
    fs::create_directories(dir, ec);
    STRATA_ENFORCE(!ec, STRATA_ERR_NOT_FOUND, "TensorBoard: cannot create '", dir.string(), "': ", ec.message());
    const std::string name = "events.out.tfevents." + std::to_string(static_cast<long long>(t)) + "." + host + "." +
                             std::to_string(::getpid()) + ".v2";
    auto w = std::make_unique<RecordWriter>((dir / name).string());
    const std::string first = encode_file_version_event(t);
    w->write(first.data(), first.size());
    w->flush();
    return w;
  };
  writers_->train = open("train");
  writers_->validation = open("validation");
}

void TensorBoard::on_epoch_end(int epoch, const Logs& logs) {
  if (!writers_) return;
  const double t = wall_clock();
  bool any_val = false;
  for (const auto& [k, v] : logs) {
    const bool val = k.rfind("val_", 0) == 0;
    any_val = any_val || val;
    const std::string e = encode_scalar_event(t, epoch, "epoch_" + (val ? k.substr(4) : k), static_cast<float>(v));
    (val ? writers_->validation : writers_->train)->write(e.data(), e.size());
  }
  writers_->train->flush();
  if (any_val) writers_->validation->flush();
}

void TensorBoard::on_train_end(const Logs&) {
  if (!writers_) return;
  writers_->train->close();
  writers_->validation->close();
  writers_.reset();
}

// ---------------------------------------------------------------- ModelCheckpoint

namespace {

// What every trainer checkpoint holds: the model's trainable variables and
// the optimizer's slots and iterations.
void track_model(Checkpoint& ckpt, Trainer& t) {
  for (Variable* v : t.model().trainable_variables()) ckpt.track("model/" + v->name(), *v);
  t.optimizer().track(ckpt, "optimizer");
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(std::string directory, std::string monitor, bool save_best_only, std::string mode,
                                 int max_to_keep)
    : directory_(std::move(directory)),
      monitor_(std::move(monitor)),
      save_best_only_(save_best_only),
      maximize_(maximize_for(mode, monitor_)),
      max_to_keep_(max_to_keep) {
  STRATA_ENFORCE(max_to_keep >= 0, STRATA_ERR_INVALID_ARGUMENT, "ModelCheckpoint: max_to_keep must be >= 0; got ",
                 max_to_keep);
}

void ModelCheckpoint::on_epoch_end(int epoch, const Logs& logs) {
  if (save_best_only_) {
    auto it = logs.find(monitor_);
    if (it == logs.end()) {
      detail::logger("core")->warn("ModelCheckpoint: the logs have no '{}'; not saving epoch {}", monitor_, epoch + 1);
      return;
    }
    if (best_ && !(maximize_ ? it->second > *best_ : it->second < *best_)) return;
    best_ = it->second;
  }
  std::int64_t done = epoch + 1;
  Checkpoint ckpt;
  track_model(ckpt, *trainer());
  ckpt.track("step", &done);
  CheckpointManager(ckpt, directory_, max_to_keep_).save(done);  // every worker; the chief writes
}

int ModelCheckpoint::restore_latest(Trainer& trainer, const std::string& directory) {
  const std::optional<std::string> latest = latest_checkpoint(directory);
  if (!latest) return 0;
  std::int64_t done = 0;
  Checkpoint ckpt;
  track_model(ckpt, trainer);
  ckpt.track("step", &done);
  ckpt.restore(*latest);
  return static_cast<int>(done);
}

// ---------------------------------------------------------------- BackupAndRestoreCallback

BackupAndRestoreCallback::BackupAndRestoreCallback(std::string directory, std::int64_t save_every_steps,
                                                   bool delete_checkpoint)
    : directory_(std::move(directory)), every_(save_every_steps), delete_(delete_checkpoint) {
  STRATA_ENFORCE(!directory_.empty(), STRATA_ERR_INVALID_ARGUMENT, "BackupAndRestoreCallback: the directory is empty");
  STRATA_ENFORCE(save_every_steps >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "BackupAndRestoreCallback: save_every_steps must be >= 0 (0: every epoch); got ", save_every_steps);
}

BackupAndRestoreCallback::~BackupAndRestoreCallback() = default;

void BackupAndRestoreCallback::on_train_begin(const Logs&) {
  Trainer& t = *trainer();
  ckpt_ = std::make_unique<Checkpoint>();
  track_model(*ckpt_, t);
  for (Metric* m : t.metrics()) m->track(*ckpt_, "metrics/" + m->name());
  ckpt_->track("step", &step_).track("epoch", &epoch_).track("step_in_epoch", &step_in_epoch_);
  ckpt_->track("epoch_done", &epoch_done_);
  ckpt_->track_state("input", {[&t] { return t.input_iterator()->save_state(); },
                               [&t](const std::vector<std::string>& all) { t.input_iterator()->restore_state(all); }});
  restored_.reset();
  const std::optional<std::string> latest = latest_checkpoint(directory_);
  if (!latest) return;
  ckpt_->restore(*latest);
  restored_ = step_;
  t.resume_at(static_cast<int>(epoch_), step_in_epoch_, step_, epoch_done_ != 0);
  detail::logger("core")->info("BackupAndRestoreCallback: resumed from {} (epoch {}, step {} of it{})", *latest,
                               epoch_, step_in_epoch_, epoch_done_ ? ", which had ended" : "");
}

void BackupAndRestoreCallback::save(bool epoch_done) {
  Trainer& t = *trainer();
  step_ = t.global_step();
  epoch_ = t.epoch();
  step_in_epoch_ = t.step_in_epoch();
  epoch_done_ = epoch_done ? 1 : 0;
  CheckpointManager(*ckpt_, directory_, 1).save(step_);
}

void BackupAndRestoreCallback::on_train_batch_end(std::int64_t, const Logs&) {
  if (every_ > 0 && trainer()->global_step() % every_ == 0) save(false);
}

void BackupAndRestoreCallback::on_epoch_end(int, const Logs&) { save(true); }

void BackupAndRestoreCallback::on_train_end(const Logs&) {
  Trainer& t = *trainer();
  ckpt_.reset();
  if (!delete_ || t.stop_training || !t.strategy().extended().is_chief()) return;
  Checkpoint nothing;
  CheckpointManager(nothing, directory_, 0).delete_all();
}

}  // namespace strata
