// SPDX-License-Identifier: Apache-2.0
// strata-digits: a libtorch MLP (64-64-10, ReLU) trained on the 1,797 8x8
// handwritten digits with a custom training loop written once against
// strata::Strategy, so the same program runs on one_device, mirrored (one
// process, one replica per device) and multi_worker_mirrored (one process
// per worker, started by strata-run).
//
// Torch does the model: every local replica owns its own module, built from
// the same seed, and its own optimizer. Strata does the distribution: the
// data comes from Dataset::from_tensor_slices(...).shuffle(seed).batch(B)
// through distribute_dataset, so every step's GLOBAL batch is the same set
// of rows whatever the number of workers and replicas; each replica runs
// forward/backward on its rows with the loss scaled by 1/(rows in the
// global batch), and the gradients are summed across all replicas with ONE
// batched ctx.all_reduce_in_place on DLPack views of the torch .grad()
// tensors themselves (no copy in or out), so the sum is the mean gradient
// of the global batch. Every replica then takes the same optimizer step on
// the same gradient, so every module stays identical (checked at the end).
#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <torch/torch.h>
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
#include <memory>
#include <string>
#include <vector>

#include "digits_data.h"
#include "strata/strata.hpp"

namespace {

namespace fs = std::filesystem;
using strata::examples::DigitsData;
using strata::examples::kDigitsClasses;
using strata::examples::kDigitsPixels;
using Clock = std::chrono::steady_clock;

// The held-out split never depends on --seed: accuracies of runs with
// different seeds are measured on the same test rows.
constexpr std::uint64_t kSplitSeed = 0;
constexpr const char* kSklearnDigits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct Args {
  std::string data;
  std::string config_file;
  std::string strategy;
  std::string devices;
  int epochs = 20;
  std::int64_t global_batch = 64;
  std::int64_t hidden = 64;
  double lr = 0.05;
  double momentum = 0.9;
  std::uint64_t seed = 1;
  std::string save;
  bool quiet = false;
};

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    if (comma > start) out.push_back(s.substr(start, comma - start));
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

// --data, else $STRATA_DIGITS, else where .ci/get-digits puts it for a build
// tree (<build>/data next to <build>/bin), else python3-sklearn's own copy.
std::string find_data(const Args& a) {
  if (!a.data.empty()) return a.data;
  if (const char* env = std::getenv("STRATA_DIGITS"); env != nullptr && *env != '\0') return env;
  std::vector<std::string> tried;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back((exe.parent_path().parent_path() / "data" / "digits.csv.gz").string());
  tried.emplace_back(kSklearnDigits);
  for (const std::string& p : tried)
    if (fs::exists(p, ec)) return p;
  std::string list;
  for (const std::string& p : tried) list += (list.empty() ? "" : ", ") + p;
  STRATA_THROW(STRATA_ERR_NOT_FOUND, "no digits data: --data and $STRATA_DIGITS are unset and none of ", list,
               " exists; run .ci/get-digits DIR (it extracts digits.csv.gz from Debian's python3-sklearn) and pass "
               "--data DIR/digits.csv.gz");
}

// As strata-train: --config (else $STRATA_CONFIG), STRATA_* environment,
// then the flags. Without a strategy anywhere: multi_worker_mirrored when
// TF_CONFIG says this process is part of a cluster (strata-run sets it),
// else one_device.
strata::Config make_config(const Args& a) {
  std::string file = a.config_file;
  if (file.empty())
    if (const char* env = std::getenv("STRATA_CONFIG"); env != nullptr) file = env;
  strata::Config cfg = file.empty() ? strata::Config() : strata::Config::from_file(file);
  cfg.apply_env();
  if (!a.strategy.empty()) cfg.set("/strategy/name", nlohmann::json(a.strategy).dump());
  if (cfg.name("strategy").empty()) {
    const char* tf_config = std::getenv("TF_CONFIG");
    cfg.set("/strategy/name", tf_config != nullptr && *tf_config != '\0' ? "\"multi_worker_mirrored\"" : "\"one_device\"");
  }
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

// The model: 64 pixels -> hidden (ReLU) -> 10 logits.
struct Net : torch::nn::Module {
  explicit Net(std::int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(kDigitsPixels, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, kDigitsClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

// One local replica: its module, its optimizer, and Strata's views of the
// module's gradient buffers.
struct Replica {
  std::shared_ptr<Net> net;
  std::unique_ptr<torch::optim::SGD> opt;
  std::vector<torch::Tensor> params;
  // at::toDLPack(p.grad()) adopted by a strata::Tensor: it shares the grad's
  // memory and holds a torch reference to it (released by the DLPack
  // deleter when the strata::Tensor dies). Nothing is copied, ever.
  std::vector<strata::Tensor> grads;
  std::vector<void*> grad_data;  // where each grad lived when adopted
  // [sum over this replica's rows of loss/rows_in_global_batch, correct
  // predictions]; reduced in the same collective as the gradients.
  strata::Tensor stats = strata::Tensor::zeros({2}, strata::DType::kFloat32);
  std::vector<strata::TensorView> reduce;  // grads..., stats: one all-reduce per step
};

Replica make_replica(const Args& a) {
  Replica r;
  // Same seed, same initial weights: in every replica of every process.
  torch::manual_seed(a.seed);
  r.net = std::make_shared<Net>(a.hidden);
  r.params = r.net->parameters();
  for (torch::Tensor& p : r.params) {
    // Allocate the gradient buffers now, so that backward() accumulates into
    // them in place (it only replaces an undefined grad) and the views below
    // stay valid for the whole run.
    p.mutable_grad() = torch::zeros_like(p);
    r.grads.push_back(strata::Tensor::adopt(at::toDLPack(p.grad())));
    r.grad_data.push_back(p.grad().data_ptr());
    STRATA_ENFORCE(r.grads.back().raw_data() == r.grad_data.back(), STRATA_ERR_INTERNAL,
                   "the DLPack view of a gradient does not share torch's memory");
  }
  r.opt = std::make_unique<torch::optim::SGD>(r.params, torch::optim::SGDOptions(a.lr).momentum(a.momentum));
  for (const strata::Tensor& g : r.grads) r.reduce.emplace_back(g);
  r.reduce.emplace_back(r.stats);
  return r;
}

// Torch on 2 cores shared by several processes: one intra-op thread per
// replica thread. at::set_num_threads also sets the count each new thread
// starts its OpenMP pool with; repeating it per replica thread is cheap and
// does not depend on that.
void one_torch_thread() {
  thread_local bool done = false;
  if (!done) {
    at::set_num_threads(1);
    done = true;
  }
}

// Accuracy and mean loss of `net` on `d`.
std::pair<double, double> evaluate(Net& net, const DigitsData& d) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::from_blob(const_cast<float*>(d.x.data()), {d.rows(), kDigitsPixels}, torch::kFloat32);
  const torch::Tensor y = torch::from_blob(const_cast<std::int64_t*>(d.y.data()), {d.rows()}, torch::kInt64);
  const torch::Tensor logits = net.forward(x);
  const double acc = logits.argmax(1).eq(y).to(torch::kFloat64).mean().item<double>();
  const double loss = torch::nn::functional::cross_entropy(logits, y).item<double>();
  return {acc, loss};
}

void write_file(const std::string& path, const std::string& data) {
  // Written beside the target and renamed: a reader never sees half a file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "--save: cannot write '", tmp, "': ", std::strerror(errno),
                 "; check the directory exists and is writable");
  std::size_t off = 0;
  int err = 0;
  while (off < data.size() && err == 0) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n > 0) off += static_cast<std::size_t>(n);
    else if (n == 0 || errno != EINTR) err = n == 0 ? EIO : errno;
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "--save: writing '", path, "' failed: ", std::strerror(err),
                 "; check free space and that the directory is writable");
  }
}

void save_weights(const std::string& path, Net& net, const Args& a, const std::string& strategy, int replicas,
                  double test_accuracy) {
  nlohmann::json doc;
  doc["format"] = "strata-digits-weights-v1";
  doc["strategy"] = strategy;
  doc["replicas"] = replicas;
  doc["epochs"] = a.epochs;
  doc["global_batch"] = a.global_batch;
  doc["test_accuracy"] = test_accuracy;
  for (const auto& item : net.named_parameters()) {
    const torch::Tensor t = item.value().contiguous();
    const float* p = t.data_ptr<float>();
    doc["weights"][item.key()] = {{"shape", t.sizes().vec()}, {"data", std::vector<float>(p, p + t.numel())}};
  }
  write_file(path, doc.dump() + "\n");
}

int train(const Args& a) {
  if (a.epochs < 1 || a.global_batch < 1 || a.hidden < 1 || !(a.lr > 0) || a.momentum < 0 || a.momentum >= 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "--epochs, --global-batch and --hidden must be positive, --lr > 0 and 0 <= --momentum < 1");
  if (!a.save.empty()) {
    // Checked now rather than after the training it would throw away.
    const fs::path dir = fs::absolute(a.save).parent_path();
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--save '", a.save, "': the directory '", dir.string(),
                   "' does not exist; create it first");
  }
  one_torch_thread();
  // The data first: a bad path fails at once on every worker, before any
  // of them waits for the others at the rendezvous.
  const std::string path = find_data(a);
  const strata::examples::DigitsSplit data = strata::examples::split_digits(strata::examples::load_digits(path), kSplitSeed);
  const std::int64_t n_train = data.train.rows();
  if (data.test.rows() == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "'", path, "' has ", n_train, " rows, too few to hold out a test set");

  strata::Strategy strategy = strata::Strategy::from_config(make_config(a));
  const bool chief = strategy.extended().is_chief();
  const bool talk = chief && !a.quiet;
  const int local = strategy.num_local_replicas();
  const int replicas = strategy.num_replicas_in_sync();
  if (talk)
    std::printf("strata-digits: %s on %d replica(s) (%d worker(s)); %lld training and %lld held-out images from %s; "
                "global batch %lld, %d epochs, SGD lr %g momentum %g\n",
                strategy.name().c_str(), replicas, strategy.extended().num_workers(), static_cast<long long>(n_train),
                static_cast<long long>(data.test.rows()), path.c_str(), static_cast<long long>(a.global_batch),
                a.epochs, a.lr, a.momentum);

  strata::Element rows;
  rows.add("x", strata::Tensor::from_vector(data.train.x, {n_train, kDigitsPixels}));
  rows.add("y", strata::Tensor::from_vector(data.train.y, {n_train}));
  // A full shuffle, seeded (every worker must read the same global batches),
  // a new order each epoch; the last batch of an epoch may be short.
  const strata::Dataset dataset =
      strata::Dataset::from_tensor_slices(std::move(rows)).shuffle(n_train, a.seed).batch(a.global_batch);
  strata::DistributedDataset input = strategy.distribute_dataset(dataset);

  std::vector<Replica> reps;
  for (int i = 0; i < local; ++i) reps.push_back(make_replica(a));

  double train_s = 0, test_acc = 0;
  for (int epoch = 1; epoch <= a.epochs; ++epoch) {
    const auto t0 = Clock::now();
    std::int64_t step = 0;
    double loss_sum = 0, correct = 0;
    for (strata::DistributedElement& batch : input) {
      // Rows in this step's global batch (all replicas of all workers):
      // the shuffled epoch cut into batches of B, the last one shorter.
      const std::int64_t in_batch = std::min(a.global_batch, n_train - step * a.global_batch);
      const double scale = 1.0 / static_cast<double>(in_batch);
      strategy.run([&](strata::ReplicaContext& ctx) {
        one_torch_thread();
        const std::uint32_t id = ctx.local_replica_id();
        Replica& r = reps[id];
        const strata::Tensor& x = batch["x"][id];
        const strata::Tensor& y = batch["y"][id];
        const std::int64_t n = x.shape()[0];
        for (torch::Tensor& p : r.params) p.mutable_grad().zero_();
        float* stats = r.stats.data<float>();
        stats[0] = stats[1] = 0;
        if (n > 0) {  // a replica may get no rows in a short last batch: it adds zeros
          // Torch reads Strata's batch in place (from_blob copies nothing).
          const torch::Tensor xt = torch::from_blob(x.raw_data(), {n, kDigitsPixels}, torch::kFloat32);
          const torch::Tensor yt = torch::from_blob(y.raw_data(), {n}, torch::kInt64);
          const torch::Tensor logits = r.net->forward(xt);
          const torch::Tensor loss =
              torch::nn::functional::cross_entropy(
                  logits, yt, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
              scale;
          loss.backward();
          stats[0] = loss.item<float>();
          stats[1] = logits.argmax(1).eq(yt).sum().item<float>();
        }
        for (std::size_t i = 0; i < r.params.size(); ++i)
          STRATA_ENFORCE(r.params[i].grad().data_ptr() == r.grad_data[i], STRATA_ERR_INTERNAL,
                         "torch replaced the gradient buffer of parameter ", i,
                         "; the DLPack views Strata reduces would be stale");
        ctx.all_reduce_in_place(strata::ReduceOp::SUM, r.reduce);  // every gradient and the stats, one collective
        r.opt->step();
      });
      const float* stats = reps[0].stats.data<float>();
      loss_sum += static_cast<double>(stats[0]) * static_cast<double>(in_batch);
      correct += stats[1];
      ++step;
    }
    STRATA_ENFORCE(step * a.global_batch >= n_train && (step - 1) * a.global_batch < n_train, STRATA_ERR_INTERNAL,
                   "epoch ", epoch, " ran ", step, " steps for ", n_train, " rows at global batch ", a.global_batch);
    train_s += std::chrono::duration<double>(Clock::now() - t0).count();
    const double loss = loss_sum / static_cast<double>(n_train);
    if (!std::isfinite(loss))
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "the training loss became ", loss, " in epoch ", epoch, ": lower --lr");
    if (chief && (!a.quiet || epoch == a.epochs)) {
      const auto [acc, test_loss] = evaluate(*reps[0].net, data.test);
      test_acc = acc;
      if (!a.quiet)
        std::printf("epoch %d/%d  loss %.4f  train accuracy %.4f  test loss %.4f  test accuracy %.4f\n", epoch,
                    a.epochs, loss, correct / static_cast<double>(n_train), test_loss, acc);
      std::fflush(stdout);
    }
  }
  // Same gradient, same step: every local replica must hold the same weights.
  for (int i = 1; i < local; ++i)
    for (std::size_t k = 0; k < reps[0].params.size(); ++k)
      STRATA_ENFORCE(torch::equal(reps[0].params[k], reps[static_cast<std::size_t>(i)].params[k]), STRATA_ERR_INTERNAL,
                     "local replica ", i, " diverged from replica 0 in parameter ", k);
  if (chief) {
    const double samples = static_cast<double>(n_train) * a.epochs;
    std::printf("trained %d epochs (%.0f samples) in %.2f s: %.0f samples/s with %s on %d replica(s)\n", a.epochs,
                samples, train_s, train_s > 0 ? samples / train_s : 0.0, strategy.name().c_str(), replicas);
    std::printf("test accuracy: %.4f\n", test_acc);
    std::fflush(stdout);
    if (!a.save.empty()) save_weights(a.save, *reps[0].net, a, strategy.name(), replicas, test_acc);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "strata-digits: a libtorch MLP (64-64-10) trained on scikit-learn's 8x8 handwritten digits with any Strata\n"
      "strategy; prints the held-out test accuracy. The gradients are all-reduced in place as DLPack views of\n"
      "torch's own gradient tensors.\n\n"
      "Examples (from the repository root, after a build):\n"
      "  .ci/get-digits build/data     (digits.csv.gz from Debian's python3-sklearn)\n"
      "  build/bin/strata-run -n 2 -- build/bin/strata-digits --data build/data/digits.csv.gz\n"
      "  build/bin/strata-digits --strategy mirrored --devices cpu:0,cpu:1\n"
      "  build/bin/strata-digits --strategy one_device --epochs 30 --save /tmp/digits.json\n\n"
      "Under strata-run (TF_CONFIG set) the default strategy is multi_worker_mirrored, else one_device.\n"
      "The final weights do not depend on the number of workers or replicas at the same --global-batch\n"
      "(up to float32 rounding of the gradient sum's order).\n"};
  Args a;
  app.add_option("--data", a.data,
                 "digits.csv.gz (or the plain CSV); default: $STRATA_DIGITS, else <build>/data/digits.csv.gz "
                 "beside this program's bin/, else python3-sklearn's copy");
  app.add_option("--config", a.config_file, "Job config (JSON): strategy, cross_device_ops, timeouts, ...")
      ->check(CLI::ExistingFile);
  app.add_option("--strategy", a.strategy, "one_device, mirrored, multi_worker_mirrored, central_storage, default");
  app.add_option("--devices", a.devices, "Comma-separated devices, one replica each, e.g. cpu:0,cpu:1");
  app.add_option("--epochs", a.epochs, "Passes over the training set")->capture_default_str();
  app.add_option("--global-batch", a.global_batch, "Rows per step over all replicas of all workers")
      ->capture_default_str();
  app.add_option("--hidden", a.hidden, "Hidden units")->capture_default_str();
  app.add_option("--lr", a.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the initial weights and the shuffle (the test split is fixed)")
      ->capture_default_str();
  app.add_option("--save", a.save, "Write the final weights as JSON to this file (chief only)");
  app.add_flag("-q,--quiet", a.quiet, "Only the summary lines");
  CLI11_PARSE(app, argc, argv);
  try {
    return train(a);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-digits: error: %s (%s)\n", e.what(), e.code_name());
    return 1;
  } catch (const std::exception& e) {  // c10::Error and the like
    std::fprintf(stderr, "strata-digits: error: %s\n", e.what());
    return 1;
  }
}
