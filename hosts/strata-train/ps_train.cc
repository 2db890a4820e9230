// SPDX-License-Identifier: Apache-2.0
#include "ps_train.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "strata/coordinator.hpp"
#include "strata/plugin_host.hpp"
#include "strata/strata.hpp"

namespace strata::train {
namespace {

// Set before this process serves (a worker runs the same command line as
// the chief, so it knows the model, data and strategy options).
PsTrainArgs g_args;

struct WorkerState {
  std::optional<Strategy> strategy;
  std::optional<SyntheticData> data;
};

// Built on the first closure (a worker runs one closure at a time) and
// destroyed when the server stops, so that the strategy's replica threads
// end before the process does.
WorkerState g_worker;

WorkerState& worker_state() {
  if (!g_worker.strategy) {
    g_worker.strategy.emplace(Strategy::from_config(Config::from_json(g_args.config_json)));
    g_worker.data.emplace(g_args.model, g_args.dataset_size, g_args.seed);
  }
  return g_worker;
}

// One training step on this worker. Args: step, lr, W1, b1, W2, b2.
Value ps_train_step(const Args& args) {
  WorkerState& ws = worker_state();
  Strategy& strategy = *ws.strategy;
  const SyntheticData& data = *ws.data;
  const ModelShape& m = g_args.model;
  const std::int64_t step = get_arg<std::int64_t>(args, 0);
  const double lr = get_arg<double>(args, 1);
  const std::int64_t batch = g_args.global_batch;
  std::vector<Variable> vars;
  {
    auto scope = strategy.scope();
    for (std::size_t i = 0; i < 4; ++i) vars.emplace_back(get_arg<RemoteVariable>(args, 2 + i));
  }
  // The weights this step starts from, pulled once for every replica.
  std::vector<Tensor> weights;
  const float* params[4];
  for (int i = 0; i < 4; ++i) {
    weights.push_back(vars[static_cast<std::size_t>(i)].value());
    params[i] = weights.back().data<float>();
  }
  // The step's batch: examples step*B .. step*B+B-1 of the repeated data
  // set, as dataset.repeat().batch(B) gives the synchronous strategies.
  const std::int64_t n = data.size();
  std::vector<float> x(static_cast<std::size_t>(batch * m.features));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (std::int64_t k = 0; k < batch; ++k) {
    const std::int64_t e = (step * batch + k) % n;
    std::copy_n(&data.features()[static_cast<std::size_t>(e * m.features)], m.features,
                &x[static_cast<std::size_t>(k * m.features)]);
    y[static_cast<std::size_t>(k)] = data.labels()[static_cast<std::size_t>(e)];
  }
  const int replicas = strategy.num_local_replicas();
  PerReplica losses = strategy.run([&](ReplicaContext& ctx) {
    const std::int64_t r = ctx.replica_id_in_sync_group();
    const std::int64_t lo = batch * r / replicas, hi = batch * (r + 1) / replicas;
    std::vector<Tensor> grads;
    float* g[4];
    for (int i = 0; i < 4; ++i) {
      grads.push_back(Tensor::zeros(param_shape(m, i), DType::kFloat32));
      g[i] = grads.back().data<float>();
    }
    const double loss = forward_backward(m, params, &x[static_cast<std::size_t>(lo * m.features)],
                                         &y[static_cast<std::size_t>(lo)], hi - lo, 1.0 / static_cast<double>(batch), g);
    for (int i = 0; i < 4; ++i) {
      float* p = grads[static_cast<std::size_t>(i)].data<float>();
      for (std::int64_t j = 0; j < m.num_params(i); ++j) p[j] = static_cast<float>(lr * p[j]);
      vars[static_cast<std::size_t>(i)].assign_sub(grads[static_cast<std::size_t>(i)]);  // SUM over replicas
    }
    return Tensor::scalar<double>(loss);
  });
  return Value(strategy.reduce(ReduceOp::SUM, losses).to_vector<double>()[0]);
}

STRATA_REGISTER_FUNCTION("strata_train.ps_step", ps_train_step);

double dataset_loss(const ModelShape& m, const float* const params[4], const SyntheticData& d) {
  return forward_backward(m, params, d.features().data(), d.labels().data(), d.size(),
                          1.0 / static_cast<double>(d.size()), nullptr);
}

int coordinate(const PsTrainArgs& a, Strategy& strategy) {
  const ModelShape& m = a.model;
  CoordinatorOptions co;
  ClusterCoordinator coordinator(co);
  std::vector<Variable> vars;
  {
    auto scope = strategy.scope();
    for (int i = 0; i < 4; ++i)
      vars.emplace_back(Tensor::from_vector(initial_param(m, i, a.seed), param_shape(m, i)),
                        VariableOptions{param_name(i), true, Synchronization::ON_WRITE, Aggregation::SUM});
  }
  std::vector<RemoteVariable> remote;
  for (auto& v : vars) remote.push_back(v.remote());
  if (!a.quiet)
    std::fprintf(stderr,
                 "strata-train: strategy parameter_server, %d worker(s) of %d replica(s), %d ps task(s), global batch "
                 "%lld, %d steps (asynchronous)\n",
                 coordinator.num_workers(), strategy.num_replicas_in_sync(), coordinator.num_ps(),
                 static_cast<long long>(a.global_batch), a.steps);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RemoteValue> steps;
  steps.reserve(static_cast<std::size_t>(a.steps));
  for (int s = 0; s < a.steps; ++s)
    steps.push_back(coordinator.schedule_fn("strata_train.ps_step", s, a.lr, remote[0], remote[1], remote[2],
                                            remote[3]));
  coordinator.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int> per_worker(static_cast<std::size_t>(coordinator.num_workers()), 0);
  for (auto& r : steps) ++per_worker[static_cast<std::size_t>(r.worker())];
  // The last step's batch loss, as the synchronous strategies report it
  // (the loss of the weights that step started from).
  const double final_loss = steps.empty() ? 0.0 : std::get<double>(coordinator.fetch(steps.back()));
  std::vector<Tensor> w;
  const float* params[4];
  for (int i = 0; i < 4; ++i) {
    w.push_back(vars[static_cast<std::size_t>(i)].value());
    params[i] = w.back().data<float>();
  }
  const SyntheticData train_set(m, a.dataset_size, a.seed);
  std::printf("trained %d steps in %.2f s (%.1f steps/s, %.0f examples/s) with parameter_server on %d worker(s) of %d "
              "replica(s); final loss %.6f\n",
              a.steps, secs, secs > 0 ? a.steps / secs : 0.0,
              secs > 0 ? static_cast<double>(a.steps) * static_cast<double>(a.global_batch) / secs : 0.0,
              coordinator.num_workers(), strategy.num_replicas_in_sync(), final_loss);
  std::printf("steps per worker %s; training-set loss of the final weights %.6f\n",
              nlohmann::json(per_worker).dump().c_str(), dataset_loss(m, params, train_set));
  if (a.eval_size > 0) {
    const SyntheticData held_out(m, a.eval_size, a.seed, /*stream=*/1);
    std::printf("held-out accuracy %.4f on %lld examples (chance %.4f)\n", accuracy(m, params, held_out),
                static_cast<long long>(a.eval_size), 1.0 / m.classes);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int train_parameter_server(const PsTrainArgs& a) {
  g_args = a;
  if (a.global_batch <= 0 || a.steps < 0 || a.dataset_size <= 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--global-batch and --dataset-size must be positive and --steps non-negative");
  const Config cfg = Config::from_json(a.config_json);
  PluginHost::global().set_config(cfg.json());
  const std::string role = current_task_type();
  if (role == "worker" || role == "ps") {
    Server server = Server::from_env();
    server.join();
    g_worker.strategy.reset();
    return 0;
  }
  // The chief (or a process outside any cluster: the strategy then says
  // what is missing).
  Strategy strategy = Strategy::from_config(cfg);
  STRATA_ENFORCE(role == "chief", STRATA_ERR_INVALID_ARGUMENT, "strata-train --strategy parameter_server runs as ",
                 role.empty() ? std::string("no task") : "task type '" + role + "'",
                 "; the coordinator is the \"chief\" task: run under strata-run --chief 1 --workers N --ps M");
  return coordinate(a, strategy);
}

}  // namespace strata::train
