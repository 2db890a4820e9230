// SPDX-License-Identifier: Apache-2.0
// strata-train: the example training program. A custom training loop
// written once against strata::Strategy; the strategy (and so where and how
// the replicas run) comes from --config / --strategy / --devices.
//
// Each step: every replica computes the gradient of its slice of the global
// batch (the loss is averaged over the *global* batch, as
// compute_average_loss does), the replicas all-reduce their gradients (one
// batched collective), and each replica applies SGD to the variables; the
// variables are ON_WRITE with ONLY_FIRST_REPLICA aggregation, so the update
// is applied once to every copy from replica 0's (identical) value.
//
// --switch-transport STEP:NAME[:{options}] moves a running multi-worker job
// to another transport at the start of step STEP (before that step's
// all-reduce) through StrategyExtended::set_transport on every worker. A
// failed switch is logged on every worker and training goes on over the old
// transport: the switch is an optional reconfiguration, and every worker
// sees the same failure, so they all stay in step.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mlp.h"
#include "strata/strata.hpp"

namespace {

using strata::train::ModelShape;

struct Args {
  std::string config_file;
  std::string strategy;
  std::string devices;
  int steps = 1000;
  std::int64_t global_batch = 512;
  double lr = 0.5;
  std::uint64_t seed = 42;
  std::int64_t dataset_size = 65536;
  ModelShape model;
  std::string save;
  std::vector<std::string> data;  // record files (--data)
  std::string export_prefix;      // --export-data
  int export_files = 4;
  std::int64_t shuffle_buffer = 0;
  bool skip_corrupt = false;  // --skip-corrupt
  bool quiet = false;
  int log_every = 0;
  std::vector<std::string> switch_transport;  // raw --switch-transport values
  std::string checkpoint_dir;                 // --checkpoint-dir
  int checkpoint_every = 100;
  int keep_checkpoints = 2;
  std::string restore;        // --restore
  std::string fault_kill_at;  // --fault-kill-at STEP:RANK (tests)
  std::int64_t eval_size = 4096;
};

// One --switch-transport entry.
struct TransportSwitch {
  int step = 0;
  std::string name;
  std::string options = "{}";
  std::string text;  // as the user wrote it, for messages
};

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

// Every --switch-transport value, in step order (same step: command-line order).
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

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The job config: --config (else $STRATA_CONFIG, which strata-run sets from
// its own --config), then STRATA_* environment, then the flags.
strata::Config make_config(const Args& a) {
  std::string file = a.config_file;
  if (file.empty()) {
    const char* env = std::getenv("STRATA_CONFIG");
    if (env != nullptr) file = env;
  }
  strata::Config cfg = file.empty() ? strata::Config() : strata::Config::from_file(file);
  cfg.apply_env();
  if (!a.strategy.empty()) cfg.set("/strategy/name", nlohmann::json(a.strategy).dump());
  if (cfg.name("strategy").empty()) cfg.set("/strategy/name", "\"one_device\"");
  if (!a.devices.empty()) {
    const std::vector<std::string> devices = split_csv(a.devices);
    if (cfg.name("strategy") == "one_device") {
      if (devices.size() != 1)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--devices: one_device runs on exactly one device, got ", devices.size(),
                     "; pass --devices cpu:0 or use --strategy mirrored");
      cfg.set("/strategy/options/device", nlohmann::json(devices[0]).dump());
    } else {
      cfg.set("/strategy/options/devices", nlohmann::json(devices).dump());
    }
  }
  return cfg;
}

class Progress {
 public:
  // `first`: the step this run starts at (after a restore).
  Progress(int total, bool quiet, int log_every, int first = 0)
      : total_(total), first_(first), quiet_(quiet), tty_(isatty(2) != 0),
        log_every_(log_every > 0 ? log_every : std::max(1, total / 10)), start_(std::chrono::steady_clock::now()) {}
  void update(int step, double loss) {
    if (quiet_) return;
    const double secs = elapsed();
    const double rate = secs > 0 ? (step - first_) / secs : 0.0;
    if (tty_) {
      const int width = 30, filled = total_ ? width * step / total_ : width;
      std::fprintf(stderr, "\r[%s%s] step %d/%d  loss %.4f  %.1f steps/s ", std::string(filled, '#').c_str(),
                   std::string(width - filled, ' ').c_str(), step, total_, loss, rate);
      if (step == total_) std::fputc('\n', stderr);
    } else if (step % log_every_ == 0 || step == total_) {
      std::fprintf(stderr, "step %d/%d  loss %.4f  %.1f steps/s\n", step, total_, loss, rate);
    }
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  int total_, first_;
  bool quiet_, tty_;
  int log_every_;
  std::chrono::steady_clock::time_point start_;
};

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

void save_weights(const std::string& path, const std::vector<strata::Variable>& vars, const Args& a, double loss) {
  nlohmann::json doc;
  doc["format"] = "strata-train-weights-v1";
  doc["steps"] = a.steps;
  doc["final_loss"] = loss;
  for (const strata::Variable& v : vars) {
    strata::Tensor t = v.value();
    doc["weights"][v.name()] = {{"shape", t.shape()}, {"data", t.to_vector<float>()}};
  }
  write_file_durably(path, doc.dump() + "\n");
}

// The record layout strata-train reads and writes: x float32 [features],
// y int32 (scalar label).
strata::RecordOptions record_options(const Args& a) {
  strata::RecordOptions o;
  o.features = {{"x", strata::DType::kFloat32, {a.model.features}}, {"y", strata::DType::kInt32, {}}};
  o.skip_corrupt = a.skip_corrupt;
  return o;
}

// The training data: --data record files, else the synthetic set in memory.
strata::Dataset make_dataset(const Args& a) {
  if (!a.data.empty()) return strata::Dataset::from_records(a.data, record_options(a));
  const strata::train::SyntheticData data(a.model, a.dataset_size, a.seed);
  strata::Element e;
  e.add("x", strata::Tensor::from_vector(data.features(), {a.dataset_size, a.model.features}));
  e.add("y", strata::Tensor::from_vector(data.labels(), {a.dataset_size}));
  return strata::Dataset::from_tensor_slices(std::move(e));
}

// --export-data PREFIX: write the synthetic set as --export-files record
// files PREFIX-00000-of-0000N.rec (contiguous, nearly equal parts).
int export_data(const Args& a) {
  if (a.export_files <= 0 || a.dataset_size <= 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--export-files and --dataset-size must be positive");
  const strata::train::SyntheticData data(a.model, a.dataset_size, a.seed);
  const std::int64_t n = a.dataset_size, files = a.export_files;
  const auto& xs = data.features();
  auto ys = data.labels();
  for (std::int64_t k = 0; k < files; ++k) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, "-%05lld-of-%05lld.rec", static_cast<long long>(k), static_cast<long long>(files));
    const std::string path = a.export_prefix + suffix;
    strata::RecordWriter out(path);
    for (std::int64_t i = n * k / files; i < n * (k + 1) / files; ++i) {
      out.write_features({strata::TensorView(const_cast<float*>(&xs[static_cast<std::size_t>(i * a.model.features)]),
                                             {a.model.features}, strata::DType::kFloat32),
                          strata::TensorView(&ys[static_cast<std::size_t>(i)], {}, strata::DType::kInt32)});
    }
    out.close();
    std::printf("%s\n", path.c_str());
  }
  return 0;
}

// Where training starts: the newest checkpoint in --checkpoint-dir (a
// restarted job), else --restore (a checkpoint, or a directory of them),
// else step 0. Every worker restores the same checkpoint.
int resume(const Args& a, strata::Checkpoint& ckpt, std::optional<strata::BackupAndRestore>& backup) {
  std::string from;
  if (backup) {
    if (std::optional<std::string> latest = strata::latest_checkpoint(a.checkpoint_dir)) {
      backup->restore();
      from = *latest;
    }
  }
  if (from.empty() && !a.restore.empty()) {
    from = a.restore;
    if (!strata::is_checkpoint(from)) {
      std::optional<std::string> latest = strata::latest_checkpoint(from);
      if (!latest)
        STRATA_THROW(STRATA_ERR_NOT_FOUND, "--restore '", a.restore,
                     "' is neither a checkpoint nor a directory holding one (ckpt-<step>); pass a path that "
                     "--checkpoint-dir wrote");
      from = *latest;
    }
    ckpt.restore(from);
  }
  if (from.empty()) return 0;
  const std::int64_t step = *ckpt.step();
  if (step > a.steps)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "checkpoint ", from, " is at step ", step, ", beyond --steps ", a.steps,
                 "; raise --steps to train further");
  if (!a.quiet) std::fprintf(stderr, "strata-train: resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(step));
  return static_cast<int>(step);
}

// --fault-kill-at STEP:RANK: the step at which this worker SIGKILLs itself,
// on the first attempt of a job only (STRATA_RESTART_COUNT unset or 0), or -1.
int fault_kill_step(const Args& a, int worker) {
  if (a.fault_kill_at.empty()) return -1;
  const char* restarts = std::getenv("STRATA_RESTART_COUNT");
  if (restarts != nullptr && std::string(restarts) != "0") return -1;
  const size_t colon = a.fault_kill_at.find(':');
  try {
    const int step = std::stoi(a.fault_kill_at.substr(0, colon));
    const int rank = colon == std::string::npos ? 0 : std::stoi(a.fault_kill_at.substr(colon + 1));
    return rank == worker ? step : -1;
  } catch (const std::exception&) {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--fault-kill-at '", a.fault_kill_at, "' is not STEP:RANK");
  }
}

int train(const Args& a) {
  if (a.global_batch <= 0 || a.steps < 0 || a.dataset_size <= 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--global-batch and --dataset-size must be positive and --steps non-negative");
  const std::vector<TransportSwitch> switches = parse_switches(a.switch_transport, a.steps);
  if (!a.save.empty()) remove_stale_temps(a.save);
  strata::Strategy strategy = strata::Strategy::from_config(make_config(a));
  const int replicas = strategy.num_replicas_in_sync();
  if (a.global_batch < replicas)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--global-batch ", a.global_batch, " is smaller than the ", replicas,
                 " replicas in sync: every replica needs at least one example");
  if (!a.quiet)
    std::fprintf(stderr, "strata-train: strategy %s, %d replica(s) in sync, global batch %lld, %d steps\n",
                 strategy.name().c_str(), replicas, static_cast<long long>(a.global_batch), a.steps);

  const ModelShape& m = a.model;
  strata::Dataset dataset = make_dataset(a);
  if (a.shuffle_buffer > 0) dataset = dataset.shuffle(a.shuffle_buffer, a.seed);
  // repeat() before batch(): batches run across epoch boundaries, so every
  // step has a full global batch for as many steps as asked.
  dataset = dataset.repeat().batch(a.global_batch, /*drop_remainder=*/true);
  strata::DistributedDataset input = strategy.distribute_dataset(dataset);
  strata::DistributedIterator batches = input.make_iterator();
  if (!a.quiet)
    std::fprintf(stderr, "strata-train: input %s, sharded by %s (%s)\n",
                 a.data.empty() ? "synthetic (in memory)" : (std::to_string(a.data.size()) + " record file(s)").c_str(),
                 input.applied_policy().c_str(), input.policy_reason().c_str());
  std::vector<strata::Variable> vars;
  {
    auto scope = strategy.scope();
    for (int i = 0; i < 4; ++i)
      vars.emplace_back(strata::Tensor::from_vector(strata::train::initial_param(m, i, a.seed), strata::train::param_shape(m, i)),
                        strata::VariableOptions{strata::train::param_name(i), true, strata::Synchronization::ON_WRITE,
                                                strata::Aggregation::ONLY_FIRST_REPLICA});
  }

  // Gradient buffers per local replica (4 gradients + the loss), reused every step.
  const int local = strategy.num_local_replicas();
  std::vector<std::vector<strata::Tensor>> grads(static_cast<std::size_t>(local));
  for (auto& g : grads) {
    for (int i = 0; i < 4; ++i) g.push_back(strata::Tensor::zeros(strata::train::param_shape(m, i), strata::DType::kFloat32));
    g.push_back(strata::Tensor::zeros({1}, strata::DType::kFloat32));
  }

  // What a checkpoint holds: the weights, the step, the last loss and the
  // input's position, so that a resumed run continues bit for bit.
  double loss = std::nan("");
  std::int64_t step64 = 0;
  strata::Checkpoint ckpt;
  for (int i = 0; i < 4; ++i) ckpt.track(strata::train::param_name(i), vars[i]);
  ckpt.track("step", &step64).track("loss", &loss).track("input", batches);
  std::optional<strata::BackupAndRestore> backup;
  if (!a.checkpoint_dir.empty()) {
    strata::BackupOptions o;
    o.save_every_steps = a.checkpoint_every;
    o.delete_on_completion = false;  // the final checkpoint stays for --restore
    o.max_to_keep = a.keep_checkpoints;
    o.save_on_sigterm = true;
    backup.emplace(ckpt, a.checkpoint_dir, o);
  }
  const int start = resume(a, ckpt, backup);
  const int fault_step = fault_kill_step(a, strategy.extended().worker_index());

  Progress progress(a.steps, a.quiet, a.log_every, start);
  const double scale = 1.0 / static_cast<double>(a.global_batch);
  size_t next_switch = 0;
  for (; next_switch < switches.size() && switches[next_switch].step < start; ++next_switch)
    if (!a.quiet)
      std::fprintf(stderr, "strata-train: --switch-transport %s is before the resumed step %d; not applied\n",
                   switches[next_switch].text.c_str(), start);
  for (int step = start; step < a.steps; ++step) {
    if (step == fault_step) {
      std::fprintf(stderr, "strata-train: --fault-kill-at: worker %d kills itself (SIGKILL) at step %d\n",
                   strategy.extended().worker_index(), step);
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
    for (; next_switch < switches.size() && switches[next_switch].step == step; ++next_switch) {
      const TransportSwitch& sw = switches[next_switch];
      try {
        strategy.extended().set_transport(sw.name, sw.options);
        if (!a.quiet)
          std::fprintf(stderr, "strata-train: worker %d: switched to transport %s %s at step %d\n",
                       strategy.extended().worker_index(), sw.name.c_str(), sw.options.c_str(), step);
      } catch (const strata::Error& e) {
        // Every worker gets the same error and stays on the old transport,
        // so training can go on in step.
        std::fprintf(stderr,
                     "strata-train: worker %d: --switch-transport %s failed at step %d (%s), continuing on the "
                     "current transport: %s\n",
                     strategy.extended().worker_index(), sw.text.c_str(), step, e.code_name(), e.what());
      }
    }
    std::vector<double> step_loss(static_cast<std::size_t>(local), 0.0);
    strata::DistributedElement batch = batches.next();
    const strata::PerReplica& xs = batch["x"];
    const strata::PerReplica& ys = batch["y"];
    strategy.run([&](strata::ReplicaContext& ctx) {
      const strata::Tensor& x = xs[ctx.local_replica_id()];
      const strata::Tensor& y = ys[ctx.local_replica_id()];
      std::vector<strata::Tensor>& g = grads[ctx.local_replica_id()];
      float* gp[4];
      for (int i = 0; i < 4; ++i) {
        gp[i] = g[i].data<float>();
        std::fill(gp[i], gp[i] + g[i].numel(), 0.0f);
      }
      // Read this replica's copy of the weights without copying when the
      // strategy allows it.
      std::vector<strata::Tensor> copies;
      const float* params[4];
      for (int i = 0; i < 4; ++i) {
        if (auto view = vars[i].read_view()) {
          params[i] = view->data<float>();
        } else {
          copies.push_back(vars[i].value());
          params[i] = copies.back().data<float>();
        }
      }
      g[4].data<float>()[0] =
          static_cast<float>(strata::train::forward_backward(m, params, x.data<float>(), y.data<std::int32_t>(),
                                                             x.shape()[0], scale, gp));
      ctx.all_reduce_in_place(strata::ReduceOp::SUM, g);  // one collective for all gradients and the loss
      for (int i = 0; i < 4; ++i) {
        float* p = gp[i];
        for (std::int64_t j = 0; j < g[i].numel(); ++j) p[j] = static_cast<float>(a.lr * p[j]);
        vars[i].assign_sub(g[i]);
      }
      step_loss[ctx.local_replica_id()] = g[4].data<float>()[0];
    });
    loss = step_loss[0];
    if (!std::isfinite(loss))
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "the loss became ", loss, " at step ", step + 1, ": lower --lr");
    progress.update(step + 1, loss);
    step64 = step + 1;
    if (backup) {
      backup->step_end();
      if (backup->preempted()) {
        std::fprintf(stderr,
                     "strata-train: worker %d: stopped by SIGTERM after step %d; a checkpoint of that step is in "
                     "%s and the same command resumes from it\n",
                     strategy.extended().worker_index(), step + 1, a.checkpoint_dir.c_str());
        return 128 + SIGTERM;
      }
    }
  }
  if (backup && start < a.steps) backup->save();  // the final step, unless it was just saved
  const double secs = progress.elapsed();
  const int trained = a.steps - start;
  std::printf("trained %d steps in %.2f s (%.1f steps/s, %.0f examples/s) with %s on %d replica(s); final loss %.6f%s\n",
              trained, secs, secs > 0 ? trained / secs : 0.0, secs > 0 ? trained * a.global_batch / secs : 0.0,
              strategy.name().c_str(), replicas, loss,
              start > 0 ? (" (resumed at step " + std::to_string(start) + ")").c_str() : "");
  {
    // Held-out examples of the same task (the teacher of --seed, inputs of
    // another stream): how well the model learnt, against chance.
    const strata::train::SyntheticData held_out(m, a.eval_size, a.seed, /*stream=*/1);
    std::vector<strata::Tensor> values;
    const float* params[4];
    for (int i = 0; i < 4; ++i) {
      values.push_back(vars[i].value());
      params[i] = values.back().data<float>();
    }
    if (a.eval_size > 0 && strategy.extended().is_chief())
      std::printf("held-out accuracy %.4f on %lld examples (chance %.4f)\n",
                  strata::train::accuracy(m, params, held_out), static_cast<long long>(a.eval_size), 1.0 / m.classes);
  }
  if (!a.save.empty()) {
    auto scope = strategy.scope();
    // The chief saves; an evaluator is the chief of its own one-process
    // group (as in tf.distribute) but never trained the job's model.
    const bool evaluator = nlohmann::json::parse(strategy.extended().describe_json()).value("task_type", nlohmann::json()) ==
                           "evaluator";
    if (strategy.extended().is_chief() && !evaluator) save_weights(a.save, vars, a, loss);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "strata-train: train a small MLP on synthetic data with any Strata strategy.\n"
      "The training loop is written once; the strategy comes from the config or flags.\n\n"
      "Examples:\n"
      "  strata-train --strategy mirrored --devices cpu:0,cpu:1,cpu:2,cpu:3\n"
      "  strata-train --config job.json --save weights.json\n"
      "  STRATA_STRATEGY=central_storage strata-train --devices cpu:0,cpu:1\n"
      "  strata-run -n 4 -- strata-train --strategy multi_worker_mirrored   (4 processes over TCP)\n"
      "  strata-run -n 4 -- strata-train --strategy multi_worker_mirrored --switch-transport 100:tcp,300:tcp \\\n"
      "    --switch-transport '200:libfabric:{\"provider\": \"shm\"}'   (change transport while training)\n"
      "  strata-train --export-data /tmp/mlp --export-files 4 && \\\n"
      "    strata-run -n 2 -- strata-train --strategy multi_worker_mirrored --data /tmp/mlp-*.rec\n\n"
      "Without --config, the file named by $STRATA_CONFIG is used when set.\n"};
  Args a;
  app.add_option("--config", a.config_file, "Job config (JSON): strategy, cross_device_ops, timeouts, ...")->check(CLI::ExistingFile);
  app.add_option("--strategy", a.strategy, "Strategy plugin name (overrides the config): one_device, mirrored, central_storage, multi_worker_mirrored, default");
  app.add_option("--devices", a.devices, "Comma-separated devices, e.g. cpu:0,cpu:1 (one per replica)");
  app.add_option("--steps", a.steps, "Training steps")->capture_default_str();
  app.add_option("--global-batch", a.global_batch, "Global batch size, split across all replicas in sync")->capture_default_str();
  app.add_option("--lr", a.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the data and the initial weights")->capture_default_str();
  app.add_option("--dataset-size", a.dataset_size, "Examples in the synthetic data set")->capture_default_str();
  app.add_option("--features", a.model.features, "Input features")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hidden", a.model.hidden, "Hidden units")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--classes", a.model.classes, "Output classes")->capture_default_str()->check(CLI::Range(2, 1000));
  app.add_option("--data", a.data,
                 "Train on these record files (TFRecord format, x float32[features] + y int32 per record, as "
                 "--export-data writes them) instead of the synthetic set; across workers the files are "
                 "sharded by the AUTO policy")
      ->check(CLI::ExistingFile);
  app.add_option("--export-data", a.export_prefix,
                 "Write the synthetic set as record files PREFIX-0000k-of-0000n.rec and exit (see --data)");
  app.add_option("--export-files", a.export_files, "Number of files --export-data writes")->capture_default_str();
  app.add_option("--shuffle-buffer", a.shuffle_buffer,
                 "Shuffle the examples through a buffer of this size, seeded by --seed (0: data order)")
      ->capture_default_str();
  app.add_flag("--skip-corrupt", a.skip_corrupt,
               "With --data: skip records whose checksum fails (a corrupt length skips the rest of that file) "
               "and log each skip, instead of stopping at the first one");
  app.add_option("--save", a.save, "Write the final weights as JSON to this file (chief only)");
  app.add_option("--log-every", a.log_every, "Print a progress line every N steps when stderr is not a terminal");
  app.add_option("--switch-transport", a.switch_transport,
                 "At the start of step STEP (counted from 0, before its all-reduce) every worker switches the job "
                 "to another transport: STEP:NAME or STEP:NAME:{json options}, repeatable; STEP:NAME,STEP:NAME "
                 "lists several when none has options. Needs a strategy with a cross-process transport "
                 "(multi_worker_mirrored). A failed switch is logged on every worker and training continues on "
                 "the old transport")
      ->type_name("STEP:NAME[:{OPTS}]")
      ->take_all();
  app.add_option("--eval-size", a.eval_size,
                 "Held-out examples (same task, other inputs) whose accuracy is printed at the end; 0: none")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "Save a checkpoint (weights, step, input position) every --checkpoint-every steps and at the end "
                 "into DIR/ckpt-<step>, and resume from the newest one there when started again (e.g. by "
                 "strata-run --max-restarts or a requeued Slurm job). SIGTERM saves at the next step and exits 143. "
                 "Every worker must see DIR (one machine or a shared file system)");
  app.add_option("--checkpoint-every", a.checkpoint_every, "Steps between checkpoints")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--keep-checkpoints", a.keep_checkpoints, "Newest checkpoints kept in --checkpoint-dir")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--restore", a.restore,
                 "Start from this checkpoint (or the newest in this directory) unless --checkpoint-dir already "
                 "holds one; --steps counts from 0, so training continues up to --steps");
  app.add_option("--fault-kill-at", a.fault_kill_at,
                 "Fault injection for tests: worker RANK SIGKILLs itself at the start of step STEP, on a job's "
                 "first attempt only ($STRATA_RESTART_COUNT unset or 0)")
      ->type_name("STEP:RANK")
      ->group("");
  app.add_flag("-q,--quiet", a.quiet, "No progress output");
  CLI11_PARSE(app, argc, argv);
  try {
    return a.export_prefix.empty() ? train(a) : export_data(a);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-train: error: %s (%s)\n", e.what(), e.code_name());
    // The reader's advice names its option (skip_corrupt); say what it is
    // called on this command line.
    if (!a.skip_corrupt && e.code() == STRATA_ERR_DATA_LOSS &&
        std::string(e.what()).find("corrupt record") != std::string::npos)
      std::fprintf(stderr,
                   "strata-train: to train on the remaining records, run again with --skip-corrupt (each skipped "
                   "record is logged), or write the damaged file again\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-train: error: %s\n", e.what());
    return 2;
  }
}
