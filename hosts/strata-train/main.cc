// SPDX-License-Identifier: Apache-2.0
// strata-train: the example training program, a user of strata::Trainer::fit.
// The strategy (and so where and how the replicas run) comes from --config /
// --strategy / --devices; the program is the same for all of them.
//
// --steps N runs exactly N steps, as N / S epochs of S steps
// (--steps-per-epoch, by default the smallest divisor of N that is at least
// N / 10). After every epoch the chief's ProgressBar shows the epoch's
// training loss and accuracy and those on the held-out set (validation);
// at the end the held-out accuracy is printed. The step itself is the one
// this program always ran (mlp_trainer.h): every replica computes the
// gradient of its share of the global batch with the loss averaged over the
// global batch, one all-reduce sums the gradients and the loss, and SGD
// updates the ON_WRITE variables once; the results are bit for bit those of
// the hand-written loop it replaces.
//
// The other options are callbacks (train_callbacks.h): checkpoints and
// --restore (exact resume, SIGTERM saves and exits 143), --switch-transport
// STEP:NAME[:{options}] (every worker moves the job to another transport at
// the start of step STEP; a failed switch is logged on every worker and
// training goes on over the old transport, as every worker sees the same
// failure), --fault-kill-at (tests), --log-every lines and --save.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mlp.h"
#include "mlp_trainer.h"
#include "ps_train.h"
#include "strata/strata.hpp"
#include "train_callbacks.h"

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
  std::int64_t steps_per_epoch = 0;  // 0: chosen from --steps
  int validation_freq = 1;
  std::int64_t eval_size = 4096;
};

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
  // The MLP computes on the host. Strategies that would take every visible
  // GPU when no devices are named (mirrored, central_storage,
  // multi_worker_mirrored) get the host instead; a GPU named is an error.
  // Other strategies (the built-in default, third-party plugins) keep their
  // own options.
  const std::string strategy = cfg.name("strategy");
  const nlohmann::json opts = nlohmann::json::parse(cfg.options_json("strategy"));
  if ((strategy == "mirrored" || strategy == "central_storage" || strategy == "multi_worker_mirrored") &&
      !opts.contains("devices"))
    cfg.set("/strategy/options/devices", "[\"cpu:0\"]");
  std::vector<std::string> named;
  if (opts.contains("devices") && opts["devices"].is_array())
    for (const auto& d : opts["devices"]) named.push_back(d.is_string() ? d.get<std::string>() : "");
  if (opts.contains("device") && opts["device"].is_string()) named.push_back(opts["device"].get<std::string>());
  for (const std::string& d : named)
    if (d.rfind("gpu:", 0) == 0 || d.rfind("cuda:", 0) == 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "strata-train: device ", d,
                   ": strata-train's MLP computes on the host (cpu:N devices only); for training on GPUs see "
                   "examples/gpu (strata-gpu-example) or the README's GPU section");
  return cfg;
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

// --strategy parameter_server: asynchronous training with a coordinator
// (ps_train.h); the options that need Trainer::fit are not available there.
int train_parameter_server(const Args& a, const strata::Config& cfg) {
  const std::pair<bool, const char*> unsupported[] = {
      {!a.data.empty(), "--data"},           {!a.save.empty(), "--save"},
      {!a.checkpoint_dir.empty(), "--checkpoint-dir"}, {!a.restore.empty(), "--restore"},
      {!a.switch_transport.empty(), "--switch-transport"}, {!a.fault_kill_at.empty(), "--fault-kill-at"}};
  for (const auto& [set, flag] : unsupported)
    if (set)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, flag,
                   " is not supported with --strategy parameter_server (asynchronous training through a "
                   "ClusterCoordinator); drop it, or use a synchronous strategy");
  strata::train::PsTrainArgs p;
  p.config_json = cfg.json();
  p.steps = a.steps;
  p.global_batch = a.global_batch;
  p.lr = a.lr;
  p.seed = a.seed;
  p.dataset_size = a.dataset_size;
  p.eval_size = a.eval_size;
  p.model = a.model;
  p.quiet = a.quiet;
  return strata::train::train_parameter_server(p);
}

int train(const Args& a) {
  using strata::train::steps_per_epoch;
  if (const strata::Config cfg = make_config(a); cfg.name("strategy") == "parameter_server")
    return train_parameter_server(a, cfg);
  if (a.global_batch <= 0 || a.steps < 0 || a.dataset_size <= 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--global-batch and --dataset-size must be positive and --steps non-negative");
  if (a.validation_freq < 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--validation-freq must be >= 1; got ", a.validation_freq);
  const std::int64_t per_epoch = steps_per_epoch(a.steps, a.steps_per_epoch);
  const int epochs = static_cast<int>(a.steps / per_epoch);
  std::vector<strata::train::TransportSwitch> switches = strata::train::parse_switches(a.switch_transport, a.steps);
  if (!a.save.empty()) strata::train::remove_stale_temps(a.save);
  strata::Strategy strategy = strata::Strategy::from_config(make_config(a));
  const int replicas = strategy.num_replicas_in_sync();
  if (a.global_batch < replicas)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--global-batch ", a.global_batch, " is smaller than the ", replicas,
                 " replicas in sync: every replica needs at least one example");
  if (!a.quiet)
    std::fprintf(stderr,
                 "strata-train: strategy %s, %d replica(s) in sync, global batch %lld, %d steps (%d epoch(s) of "
                 "%lld)\n",
                 strategy.name().c_str(), replicas, static_cast<long long>(a.global_batch), a.steps, epochs,
                 static_cast<long long>(per_epoch));

  const ModelShape& m = a.model;
  strata::Dataset dataset = make_dataset(a);
  if (a.shuffle_buffer > 0) dataset = dataset.shuffle(a.shuffle_buffer, a.seed);
  // repeat() before batch(): batches run across epoch boundaries, so every
  // step has a full global batch for as many steps as asked; fit() reads
  // one pass of it across all epochs (steps_per_epoch is set).
  dataset = dataset.repeat().batch(a.global_batch, /*drop_remainder=*/true);
  if (!a.quiet) {
    const strata::DistributedDataset input = strategy.distribute_dataset(dataset);
    std::fprintf(stderr, "strata-train: input %s, sharded by %s (%s)\n",
                 a.data.empty() ? "synthetic (in memory)" : (std::to_string(a.data.size()) + " record file(s)").c_str(),
                 input.applied_policy().c_str(), input.policy_reason().c_str());
  }
  // Held-out examples of the same task (the teacher of --seed, inputs of
  // another stream): validated after every epoch and scored at the end.
  const strata::train::SyntheticData held_out(m, a.eval_size, a.seed, /*stream=*/1);

  std::optional<strata::Scope> scope(strategy.scope());
  strata::train::MlpModel model(m, a.seed);
  strata::train::LoopSgd sgd(a.lr);
  strata::train::MlpTrainer trainer(strategy, model, sgd, {"accuracy"});
  scope.reset();

  strata::train::StepLog log(trainer.last_loss(), a.steps, a.log_every, a.quiet);
  strata::train::StepCheckpoints::Options co;
  co.directory = a.checkpoint_dir;
  co.every = a.checkpoint_every;
  co.keep = a.keep_checkpoints;
  co.restore = a.restore;
  co.total_steps = a.steps;
  co.steps_per_epoch = per_epoch;
  co.quiet = a.quiet;
  strata::train::StepCheckpoints checkpoints(co, trainer.last_loss());
  strata::train::FaultKill fault(fault_kill_step(a, strategy.extended().worker_index()));
  strata::train::TransportSwitcher switcher(std::move(switches), a.quiet);
  std::optional<strata::train::SaveWeights> save;
  if (!a.save.empty()) save.emplace(a.save, a.steps, trainer.last_loss());

  strata::FitOptions fo;
  fo.epochs = epochs;
  fo.steps_per_epoch = per_epoch;
  if (a.eval_size > 0) {
    strata::Element e;
    e.add("x", strata::Tensor::from_vector(held_out.features(), {a.eval_size, m.features}));
    e.add("y", strata::Tensor::from_vector(held_out.labels(), {a.eval_size}));
    fo.validation_data = strata::Dataset::from_tensor_slices(std::move(e)).batch(a.global_batch);
    fo.validation_freq = a.validation_freq;
  }
  // Order matters: the loss check before a checkpoint of the step; the
  // restore (on_train_begin) before the switches look at the start step;
  // the fault before the switches of the same step, as the loop had them.
  fo.callbacks = {&log, &checkpoints, &fault, &switcher};
  if (save) fo.callbacks.push_back(&*save);
  fo.verbose = !a.quiet;  // the ProgressBar, on the chief
  try {
    trainer.fit(dataset, fo);
  } catch (const strata::train::Preempted& p) {
    std::fprintf(stderr,
                 "strata-train: worker %d: stopped by SIGTERM after step %lld; a checkpoint of that step is in "
                 "%s and the same command resumes from it\n",
                 strategy.extended().worker_index(), static_cast<long long>(p.step), a.checkpoint_dir.c_str());
    return 128 + SIGTERM;
  }
  const std::int64_t start = checkpoints.start_step();
  const double secs = log.train_seconds();
  const long long trained = a.steps - start;
  std::printf("trained %lld steps in %.2f s (%.1f steps/s, %.0f examples/s) with %s on %d replica(s); final loss %.6f%s\n",
              trained, secs, secs > 0 ? static_cast<double>(trained) / secs : 0.0,
              secs > 0 ? static_cast<double>(trained * a.global_batch) / secs : 0.0, strategy.name().c_str(), replicas,
              *trainer.last_loss(), start > 0 ? (" (resumed at step " + std::to_string(start) + ")").c_str() : "");
  if (a.eval_size > 0 && strategy.extended().is_chief()) {
    std::vector<strata::Tensor> values;
    const float* params[4];
    for (int i = 0; i < 4; ++i) {
      values.push_back(model.variables()[static_cast<std::size_t>(i)].value());
      params[i] = values.back().data<float>();
    }
    std::printf("held-out accuracy %.4f on %lld examples (chance %.4f)\n",
                strata::train::accuracy(m, params, held_out), static_cast<long long>(a.eval_size), 1.0 / m.classes);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "strata-train: train a small MLP on synthetic data with any Strata strategy, through strata::Trainer::fit.\n"
      "The program is written once; the strategy comes from the config or flags.\n\n"
      "Examples:\n"
      "  strata-train --strategy mirrored --devices cpu:0,cpu:1,cpu:2,cpu:3\n"
      "  strata-train --config job.json --save weights.json\n"
      "  STRATA_STRATEGY=central_storage strata-train --devices cpu:0,cpu:1\n"
      "  strata-run -n 4 -- strata-train --strategy multi_worker_mirrored   (4 processes over TCP)\n"
      "  strata-run --chief 1 --workers 2 --ps 1 -- strata-train --strategy parameter_server   (asynchronous)\n"
      "  strata-run -n 4 -- strata-train --strategy multi_worker_mirrored --switch-transport 100:tcp,300:tcp \\\n"
      "    --switch-transport '200:libfabric:{\"provider\": \"shm\"}'   (change transport while training)\n"
      "  strata-train --export-data /tmp/mlp --export-files 4 && \\\n"
      "    strata-run -n 2 -- strata-train --strategy multi_worker_mirrored --data /tmp/mlp-*.rec\n\n"
      "Without --config, the file named by $STRATA_CONFIG is used when set.\n"};
  Args a;
  app.add_option("--config", a.config_file, "Job config (JSON): strategy, cross_device_ops, timeouts, ...")->check(CLI::ExistingFile);
  app.add_option("--strategy", a.strategy, "Strategy plugin name (overrides the config): one_device, mirrored, central_storage, multi_worker_mirrored, "
                 "parameter_server (under strata-run --chief 1 --workers N --ps M), default");
  app.add_option("--devices", a.devices,
                 "Comma-separated devices, e.g. cpu:0,cpu:1 (one per replica; default cpu:0: the MLP computes on the "
                 "host, so GPUs are refused, see examples/gpu)");
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
  app.add_option("--log-every", a.log_every,
                 "Also print a line 'step S/N  loss L  R steps/s' every N steps on every worker when stderr is not "
                 "a terminal (the chief's progress bar shows each epoch)");
  app.add_option("--steps-per-epoch", a.steps_per_epoch,
                 "Steps per epoch, a divisor of --steps (0: the smallest divisor of --steps that is at least "
                 "--steps / 10). Each epoch ends with a progress line and a validation on the held-out set")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--validation-freq", a.validation_freq, "Validate on the held-out set after every N-th epoch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--switch-transport", a.switch_transport,
                 "At the start of step STEP (counted from 0, before its all-reduce) every worker switches the job "
                 "to another transport: STEP:NAME or STEP:NAME:{json options}, repeatable; STEP:NAME,STEP:NAME "
                 "lists several when none has options. Needs a strategy with a cross-process transport "
                 "(multi_worker_mirrored). A failed switch is logged on every worker and training continues on "
                 "the old transport")
      ->type_name("STEP:NAME[:{OPTS}]")
      ->take_all();
  app.add_option("--eval-size", a.eval_size,
                 "Held-out examples (same task, other inputs): validated after every epoch and their accuracy "
                 "printed at the end; 0: none")
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
  app.add_flag("-q,--quiet", a.quiet, "No progress bar, no progress lines");
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
