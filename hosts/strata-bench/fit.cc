// SPDX-License-Identifier: Apache-2.0
// strata-bench fit (see fit.h).
#include "fit.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "bench_util.h"
#include "mlp_model.h"
#include "strata/strata.hpp"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;
using train::ModelShape;

Strategy make_strategy(const FitBenchOptions& o) {
  std::vector<std::string> devs;
  std::stringstream ss(o.devices);
  for (std::string d; std::getline(ss, d, ',');)
    if (!d.empty()) devs.push_back(d);
  nlohmann::json opts = o.strategy == "one_device" ? nlohmann::json{{"device", devs.at(0)}}
                                                   : nlohmann::json{{"devices", devs}};
  return Strategy::create(o.strategy, opts.dump());
}

Dataset make_data(const FitBenchOptions& o, const ModelShape& m) {
  const std::int64_t n = 16384;
  const train::SyntheticData data(m, n, 42);
  Element e;
  e.add("x", Tensor::from_vector(data.features(), {n, m.features}));
  e.add("y", Tensor::from_vector(data.labels(), {n}));
  return Dataset::from_tensor_slices(std::move(e)).repeat().batch(o.global_batch, true);
}

// strata-train's loop: returns seconds per step over `steps` after 5 warm-up steps.
double hand_loop(const FitBenchOptions& o, Strategy& s, const ModelShape& m, std::vector<std::vector<float>>* out) {
  std::optional<Scope> scope(s.scope());
  train::MlpModel model(m, 42);
  scope.reset();
  std::vector<Variable>& vars = model.variables();
  DistributedDataset input = s.distribute_dataset(make_data(o, m));
  DistributedIterator it = input.make_iterator();
  const int local = s.num_local_replicas();
  std::vector<std::vector<Tensor>> grads(static_cast<std::size_t>(local));
  for (auto& g : grads) {
    for (int i = 0; i < 4; ++i) g.push_back(Tensor::zeros(train::param_shape(m, i), DType::kFloat32));
    g.push_back(Tensor::zeros({1}, DType::kFloat32));
  }
  const double scale = 1.0 / static_cast<double>(o.global_batch), lr = 0.1;
  Clock::time_point start;
  for (int step = 0; step < o.steps + 5; ++step) {
    if (step == 5) start = Clock::now();
    DistributedElement batch = it.next();
    s.run([&](ReplicaContext& ctx) {
      const std::vector<std::string> names{"x", "y"};
      const Features f(&names, {&batch["x"][ctx.local_replica_id()], &batch["y"][ctx.local_replica_id()]});
      std::vector<Tensor>& g = grads[ctx.local_replica_id()];
      for (Tensor& t : g) std::fill(t.data<float>(), t.data<float>() + t.numel(), 0.0f);
      std::vector<Tensor> four;
      for (int i = 0; i < 4; ++i) four.push_back(Tensor::borrow(g[static_cast<std::size_t>(i)]));
      const ForwardResult r = model.forward_backward(f, scale, four);
      float loss = 0;
      for (std::int64_t k = 0; k < r.per_example_loss.numel(); ++k) loss += r.per_example_loss.data<float>()[k];
      g[4].data<float>()[0] = static_cast<float>(loss * scale);
      ctx.all_reduce_in_place(ReduceOp::SUM, g);
      for (int i = 0; i < 4; ++i) {
        float* p = g[static_cast<std::size_t>(i)].data<float>();
        for (std::int64_t j = 0; j < g[static_cast<std::size_t>(i)].numel(); ++j) p[j] = static_cast<float>(lr * p[j]);
        vars[static_cast<std::size_t>(i)].assign_sub(g[static_cast<std::size_t>(i)]);
      }
    });
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  out->clear();
  for (Variable& v : vars) out->push_back(v.value().to_vector<float>());
  return secs / o.steps;
}

// Times the steps after the first 5 of an epoch.
struct StepTimer : Callback {
  int warmup = 5;
  Clock::time_point start;
  void on_train_batch_begin(std::int64_t batch, const Logs&) override {
    if (batch == warmup) start = Clock::now();
  }
};

double trainer_fit(const FitBenchOptions& o, Strategy& s, const ModelShape& m, std::vector<std::vector<float>>* out) {
  std::optional<Scope> scope(s.scope());
  train::MlpModel model(m, 42);
  SGD opt(0.1);
  Trainer trainer(s, model, opt, {"accuracy"});
  scope.reset();
  StepTimer timer;
  FitOptions f;
  f.epochs = 1;
  f.steps_per_epoch = o.steps + timer.warmup;
  f.callbacks = {&timer};
  f.verbose = false;
  trainer.fit(make_data(o, m), f);
  const double secs = std::chrono::duration<double>(Clock::now() - timer.start).count();
  out->clear();
  for (Variable& v : model.variables()) out->push_back(v.value().to_vector<float>());
  return secs / o.steps;
}

std::string load() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int run_fit_bench(const FitBenchOptions& o) {
  STRATA_ENFORCE(o.steps >= 1 && o.repeats >= 1 && o.global_batch >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "fit: --steps, --repeats and --global-batch must be >= 1");
  const ModelShape m{o.features, o.hidden, o.classes};
  Strategy s = make_strategy(o);
  const std::string load_before = load();
  std::vector<double> loop_s, fit_s;
  std::vector<std::vector<float>> w_loop, w_fit;
  for (int r = 0; r < o.repeats; ++r) {
    loop_s.push_back(hand_loop(o, s, m, &w_loop));
    fit_s.push_back(trainer_fit(o, s, m, &w_fit));
  }
  double max_diff = 0;
  for (std::size_t v = 0; v < w_loop.size(); ++v)
    for (std::size_t i = 0; i < w_loop[v].size(); ++i)
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(w_loop[v][i] - w_fit[v][i])));
  const double loop_ms = median(loop_s) * 1e3, fit_ms = median(fit_s) * 1e3;
  const double overhead = fit_ms / loop_ms - 1;
  if (o.json) {
    nlohmann::json j = {{"strategy", o.strategy},       {"replicas", s.num_replicas_in_sync()},
                        {"global_batch", o.global_batch}, {"steps", o.steps},
                        {"loop_ms_per_step", loop_ms},    {"trainer_ms_per_step", fit_ms},
                        {"overhead", overhead},           {"max_weight_diff", max_diff},
                        {"load_before", load_before},     {"load_after", load()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("fit: %s on %d replica(s), global batch %lld, MLP %d-%d-%d, %d steps, median of %d (load %s -> %s)\n",
                o.strategy.c_str(), s.num_replicas_in_sync(), static_cast<long long>(o.global_batch), m.features,
                m.hidden, m.classes, o.steps, o.repeats, load_before.c_str(), load().c_str());
    std::printf("  hand-written loop  %8.3f ms/step\n  Trainer::fit       %8.3f ms/step\n  overhead           %+7.2f %%\n",
                loop_ms, fit_ms, overhead * 100);
    std::printf("  weights agree to   %.2e\n", max_diff);
  }
  if (max_diff > 1e-4) {
    std::fprintf(stderr, "strata-bench fit: the two paths' weights differ by %g: the Trainer does not train as the loop does\n",
                 max_diff);
    return 1;
  }
  return 0;
}

}  // namespace strata::bench
