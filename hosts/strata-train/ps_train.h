// SPDX-License-Identifier: Apache-2.0
// strata-train --strategy parameter_server: asynchronous training of the
// example MLP with a coordinator (chief), worker and ps tasks. Every role
// runs strata-train with the same arguments (strata-run --chief 1 --workers
// N --ps M -- strata-train --strategy parameter_server ...): the chief
// creates the four weights under the strategy's scope (they live on the ps
// tasks) and schedules one closure per step; a worker runs the closure on
// its local replicas (strategy.run: each replica computes the gradient of
// its share of the step's batch, the loss averaged over the whole batch;
// assign_sub of lr * gradient on SUM-aggregated variables applies the
// batch's gradient once) and returns the step's loss (strategy.reduce);
// ps tasks serve the variables. Workers do not wait for each other: a step
// may use weights a few updates old, as in TF's parameter-server training.
#pragma once

#include <cstdint>
#include <string>

#include "mlp.h"

namespace strata::train {

struct PsTrainArgs {
  std::string config_json;  // the job config (strategy options: devices, variable_partitioner)
  int steps = 1000;
  std::int64_t global_batch = 512;
  double lr = 0.5;
  std::uint64_t seed = 42;
  std::int64_t dataset_size = 65536;
  std::int64_t eval_size = 4096;
  ModelShape model;
  bool quiet = false;
};

/// Run this process's role; returns the exit code.
int train_parameter_server(const PsTrainArgs& a);

}  // namespace strata::train
