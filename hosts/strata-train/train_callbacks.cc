// SPDX-License-Identifier: Apache-2.0
// strata-train's callbacks (see train_callbacks.h).
#include "train_callbacks.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace strata::train {

namespace {

// The weights file is written as <path>.tmp.<host>.<pid> and renamed into
// place. A writer killed mid-write (even by SIGKILL, which no handler sees)
// leaves its temp behind, so every run with --save first removes the temps of
// processes on this host that no longer exist; the host in the name keeps a
// run from deleting the live temp of a same-pid writer on another machine
// sharing the directory.
std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::string temp_path_for(const std::string& path) {
  return path + ".tmp." + host_name() + "." + std::to_string(::getpid());
}

// Durable replace: data fsync'ed before the rename, so that after a crash the
// name holds either the old file or the complete new one (never a renamed
// but empty file), and the directory fsync'ed after it, so the rename itself
// survives a power loss. The temp is unlinked on every failure.
void write_file_durably(const std::string& path, const std::string& data) {
  const std::string tmp = temp_path_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "--save: cannot write '", tmp, "': ", std::strerror(errno),
                 "; check the directory exists and is writable");
  auto fail = [&](const char* step) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "--save: ", step, " '", tmp, "' failed: ", std::strerror(e),
                 "; check free space and the file system, then run again");
  };
  for (size_t off = 0; off < data.size();) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync of");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "--save: closing '", tmp, "' failed: ", std::strerror(e),
                 "; check free space and the file system, then run again");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    STRATA_THROW(STRATA_ERR_INTERNAL, "--save: cannot rename '", tmp, "' to '", path, "': ", std::strerror(e),
                 "; check that '", path, "' is not a directory and that its directory is writable");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) {
    const int e = errno;
    if (dfd >= 0) ::close(dfd);
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "--save: '", path, "' was written but fsync of its directory '", dir,
                 "' failed: ", std::strerror(e), "; the file may not survive a power loss, check the file system");
  }
  ::close(dfd);
}


[[noreturn]] void bad_switch(const std::string& value, const std::string& why) {
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--switch-transport '", value, "': ", why,
               "; expected STEP:NAME, STEP:NAME:{json options} or STEP:NAME,STEP:NAME "
               "(e.g. 10:tcp or '20:libfabric:{\"provider\": \"shm\"}' quoted for the shell)");
}

// "STEP:NAME" or "STEP:NAME:{...}" (`item`, from the whole `value`).
TransportSwitch parse_switch(const std::string& value, const std::string& item, int steps) {
  TransportSwitch sw;
  sw.text = item;
  const size_t c1 = item.find(':');
  if (c1 == std::string::npos) bad_switch(value, "'" + item + "' has no ':' between the step and the transport");
  const std::string step = item.substr(0, c1);
  if (step.empty() || step.size() > 9 || step.find_first_not_of("0123456789") != std::string::npos)
    bad_switch(value, "the step '" + step + "' is not a non-negative integer");
  sw.step = std::stoi(step);
  if (sw.step >= steps)
    bad_switch(value, "step " + step + " is not below --steps " + std::to_string(steps) + ", so it would never run");
  const std::string rest = item.substr(c1 + 1);
  const size_t c2 = rest.find(':');
  sw.name = rest.substr(0, c2);
  if (sw.name.empty()) bad_switch(value, "the transport name after '" + step + ":' is empty");
  if (sw.name.find_first_of(" {}\"") != std::string::npos)
    bad_switch(value, "'" + sw.name + "' is not a transport plugin name");
  if (c2 != std::string::npos) {
    const std::string opts = rest.substr(c2 + 1);
    const nlohmann::json j = nlohmann::json::parse(opts, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      bad_switch(value, "the options '" + opts + "' of transport '" + sw.name + "' are not a JSON object");
    sw.options = j.dump();
  }
  return sw;
}


bool is_chief(const Trainer* t) { return t->strategy().extended().is_chief(); }
int worker_index(const Trainer* t) { return t->strategy().extended().worker_index(); }

}  // namespace

std::int64_t steps_per_epoch(std::int64_t steps, std::int64_t requested) {
  if (requested > 0) {
    if (steps > 0 && steps % requested != 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--steps-per-epoch ", requested, " does not divide --steps ", steps,
                   ": every epoch has the same number of steps; pass a divisor of ", steps, " (e.g. ",
                   steps_per_epoch(steps, 0), ") or leave --steps-per-epoch out");
    return requested;
  }
  if (requested < 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--steps-per-epoch must be positive (or 0: chosen from --steps); got ",
                 requested);
  if (steps <= 0) return 1;
  const std::int64_t target = (steps + 9) / 10;
  std::int64_t best = steps;
  for (std::int64_t d = 1; d * d <= steps; ++d) {
    if (steps % d != 0) continue;
    for (const std::int64_t c : {d, steps / d})
      if (c >= target && c < best) best = c;
  }
  return best;
}

// ---------------------------------------------------------------- StepLog

StepLog::StepLog(const double* loss, int total, int log_every, bool quiet)
    : loss_(loss), total_(total), log_every_(log_every), print_(!quiet && log_every > 0 && ::isatty(2) == 0) {}

void StepLog::on_train_batch_begin(std::int64_t, const Logs&) {
  if (first_) return;
  first_ = trainer()->global_step();
  start_ = Clock::now();
  test_seconds_ = 0;
}

double StepLog::train_seconds() const {
  if (!first_) return 0;
  return std::chrono::duration<double>(Clock::now() - start_).count() - test_seconds_;
}

void StepLog::on_train_batch_end(std::int64_t, const Logs&) {
  const std::int64_t step = trainer()->global_step();  // steps done, this one included
  if (!std::isfinite(*loss_))
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the loss became ", *loss_, " at step ", step, ": lower --lr");
  if (!print_ || (step % log_every_ != 0 && step != total_)) return;
  const double secs = train_seconds();
  std::fprintf(stderr, "step %lld/%d  loss %.4f  %.1f steps/s\n", static_cast<long long>(step), total_, *loss_,
               secs > 0 ? static_cast<double>(step - *first_) / secs : 0.0);
}

void StepLog::on_test_begin(const Logs&) { test_start_ = Clock::now(); }

void StepLog::on_test_end(const Logs&) {
  if (first_) test_seconds_ += std::chrono::duration<double>(Clock::now() - test_start_).count();
}

// ---------------------------------------------------------------- StepCheckpoints

StepCheckpoints::StepCheckpoints(Options options, double* loss) : o_(std::move(options)), loss_(loss) {}
StepCheckpoints::~StepCheckpoints() = default;

void StepCheckpoints::on_train_begin(const Logs&) {
  Trainer& t = *trainer();
  start_ = 0;
  step_ = 0;
  backup_.reset();
  ckpt_ = std::make_unique<Checkpoint>();
  for (Variable* v : t.model().trainable_variables()) ckpt_->track(v->name(), *v);
  ckpt_->track("step", &step_).track("loss", loss_).track("input", *t.input_iterator());
  if (!o_.directory.empty()) {
    BackupOptions b;
    b.save_every_steps = o_.every;
    b.delete_on_completion = false;  // the final checkpoint stays for --restore
    b.max_to_keep = o_.keep;
    b.save_on_sigterm = true;
    backup_ = std::make_unique<BackupAndRestore>(*ckpt_, o_.directory, b);
  }
  // Where training starts: the newest checkpoint in --checkpoint-dir (a
  // restarted job), else --restore (a checkpoint, or a directory of them),
  // else step 0. Every worker restores the same checkpoint.
  std::string from;
  if (backup_) {
    if (std::optional<std::string> latest = latest_checkpoint(o_.directory)) {
      backup_->restore();
      from = *latest;
    }
  }
  if (from.empty() && !o_.restore.empty()) {
    from = o_.restore;
    if (!is_checkpoint(from)) {
      std::optional<std::string> latest = latest_checkpoint(from);
      if (!latest)
        STRATA_THROW(STRATA_ERR_NOT_FOUND, "--restore '", o_.restore,
                     "' is neither a checkpoint nor a directory holding one (ckpt-<step>); pass a path that "
                     "--checkpoint-dir wrote");
      from = *latest;
    }
    ckpt_->restore(from);
  }
  if (from.empty()) return;
  if (step_ > o_.total_steps)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "checkpoint ", from, " is at step ", step_, ", beyond --steps ",
                 o_.total_steps, "; raise --steps to train further");
  if (!o_.quiet) std::fprintf(stderr, "strata-train: resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(step_));
  start_ = step_;
  // The restored input position is the iterator every epoch reads (fit
  // keeps one pass across epochs when steps_per_epoch is set).
  t.resume_at(static_cast<int>(step_ / o_.steps_per_epoch), step_ % o_.steps_per_epoch, step_, false);
}

void StepCheckpoints::on_train_batch_end(std::int64_t, const Logs&) {
  if (!backup_) return;
  step_ = trainer()->global_step();
  backup_->step_end();
  if (backup_->preempted()) throw Preempted(step_);
}

void StepCheckpoints::on_train_end(const Logs&) {
  // The final step, unless this run trained none.
  if (backup_ && trainer()->global_step() > start_) {
    step_ = trainer()->global_step();
    backup_->save();
  }
  backup_.reset();
}

// ---------------------------------------------------------------- FaultKill

void FaultKill::on_train_batch_begin(std::int64_t, const Logs&) {
  if (step_ < 0 || trainer()->global_step() != step_) return;
  std::fprintf(stderr, "strata-train: --fault-kill-at: worker %d kills itself (SIGKILL) at step %d\n",
               worker_index(trainer()), step_);
  std::fflush(stderr);
  ::raise(SIGKILL);
}

// ---------------------------------------------------------------- TransportSwitcher

TransportSwitcher::TransportSwitcher(std::vector<TransportSwitch> switches, bool quiet)
    : switches_(std::move(switches)), quiet_(quiet) {}

void TransportSwitcher::on_train_begin(const Logs&) {
  const std::int64_t start = trainer()->global_step();  // after a restore: the restored step
  for (next_ = 0; next_ < switches_.size() && switches_[next_].step < start; ++next_)
    if (!quiet_)
      std::fprintf(stderr, "strata-train: --switch-transport %s is before the resumed step %lld; not applied\n",
                   switches_[next_].text.c_str(), static_cast<long long>(start));
}

void TransportSwitcher::on_train_batch_begin(std::int64_t, const Logs&) {
  const std::int64_t step = trainer()->global_step();
  Strategy& strategy = trainer()->strategy();
  for (; next_ < switches_.size() && switches_[next_].step == step; ++next_) {
    const TransportSwitch& sw = switches_[next_];
    try {
      strategy.extended().set_transport(sw.name, sw.options);
      if (!quiet_)
        std::fprintf(stderr, "strata-train: worker %d: switched to transport %s %s at step %lld\n",
                     worker_index(trainer()), sw.name.c_str(), sw.options.c_str(), static_cast<long long>(step));
    } catch (const Error& e) {
      // Every worker gets the same error and stays on the old transport,
      // so training can go on in step.
      std::fprintf(stderr,
                   "strata-train: worker %d: --switch-transport %s failed at step %lld (%s), continuing on the "
                   "current transport: %s\n",
                   worker_index(trainer()), sw.text.c_str(), static_cast<long long>(step), e.code_name(), e.what());
    }
  }
}

// ---------------------------------------------------------------- SaveWeights

SaveWeights::SaveWeights(std::string path, int steps, const double* loss)
    : path_(std::move(path)), steps_(steps), loss_(loss) {}

void SaveWeights::on_train_end(const Logs&) {
  Strategy& strategy = trainer()->strategy();
  std::optional<Scope> scope;
  if (get_strategy() != strategy) scope.emplace(strategy.scope());
  // The chief saves; an evaluator is the chief of its own one-process
  // group (as in tf.distribute) but never trained the job's model.
  const bool evaluator =
      nlohmann::json::parse(strategy.extended().describe_json()).value("task_type", nlohmann::json()) == "evaluator";
  if (!is_chief(trainer()) || evaluator) return;
  nlohmann::json doc;
  doc["format"] = "strata-train-weights-v1";
  doc["steps"] = steps_;
  doc["final_loss"] = *loss_;
  for (Variable* v : trainer()->model().trainable_variables()) {
    Tensor t = v->value();
    doc["weights"][v->name()] = {{"shape", t.shape()}, {"data", t.to_vector<float>()}};
  }
  write_file_durably(path_, doc.dump() + "\n");
}

std::vector<TransportSwitch> parse_switches(const std::vector<std::string>& values, int steps) {
  std::vector<TransportSwitch> out;
  for (const std::string& v : values) {
    if (v.find('{') != std::string::npos) {
      // JSON may hold commas, so a value with options is one switch.
      out.push_back(parse_switch(v, v, steps));
      continue;
    }
    if (v.empty()) bad_switch(v, "the value is empty");
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item.empty()) bad_switch(v, "an entry of the comma-separated list is empty");
      out.push_back(parse_switch(v, item, steps));
    }
    if (v.back() == ',') bad_switch(v, "an entry of the comma-separated list is empty");
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TransportSwitch& x, const TransportSwitch& y) { return x.step < y.step; });
  return out;
}


void remove_stale_temps(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp." + host_name() + ".";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    // ESRCH only: EPERM means the pid is alive (another user's process).
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm))
      std::fprintf(stderr, "strata-train: removed '%s', left by a writer (pid %s) that no longer runs\n",
                   it->path().c_str(), pid.c_str());
  }
}

}  // namespace strata::train
