// SPDX-License-Identifier: Apache-2.0
// The resume check shared by dist_resume_worker (one process of a
// multi-worker run) and distributed_resume_test (single-process cases run
// in-process): distributes a shuffled dataset of element ids, and either
// runs `epochs_before` epochs and then one epoch saving this worker's
// iterator state after `save_after` steps, or restores the saved states
// into a fresh iterator of a newly built dataset. Either way it records the
// ids every local replica got at every step after the save point and in
// the following epoch.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

#include "dist_data_case.h"
#include "strata/strata.hpp"

namespace strata::test {

struct ResumeArgs {
  Args base;                 // strategy, devices, source, files, length, batch, drop, policy, prefetch
  std::int64_t shuffle = 8;  // shuffle buffer (seed 7, reshuffled every epoch)
  int epochs_before = 1;
  int save_after = 3;
  std::string save_to;                    // where to write this worker's state
  std::vector<std::string> restore_from;  // the states, in worker order: restore instead of saving
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline json step_ids(strata::DistributedElement& batch) {
  json step = json::array();
  for (const strata::Tensor& t : batch["id"].values()) step.push_back(t.to_vector<std::int64_t>());
  return step;
}

inline json drain_steps(strata::DistributedIterator& it) {
  json steps = json::array();
  while (auto batch = it.get_next_as_optional()) steps.push_back(step_ids(*batch));
  return steps;
}

inline json run_resume(const ResumeArgs& a) {
  json opts = {{"devices", split_csv(a.base.devices)}};
  strata::Strategy strategy = strata::Strategy::create(a.base.strategy, opts.dump());
  strata::InputOptions io;
  io.prefetch_depth = a.base.prefetch;
  strata::DatasetOptions dopts;
  dopts.auto_shard_policy = parse_policy(a.base.policy);
  strata::Dataset ds = source(a.base);
  if (a.base.policy == "HINT") ds = ds.shard(strata::SHARD_HINT, strata::SHARD_HINT);
  ds = ds.shuffle(a.shuffle, 7).batch(a.base.batch, a.base.drop).with_options(dopts);
  strata::DistributedDataset dist = strategy.distribute_dataset(ds, io);
  const auto& ext = strategy.extended();
  json doc = {{"worker", ext.worker_index()},
              {"num_workers", ext.num_workers()},
              {"local", strategy.num_local_replicas()},
              {"policy", dist.applied_policy()}};
  if (a.restore_from.empty()) {
    for (int e = 0; e < a.epochs_before; ++e) {
      strata::DistributedIterator it = dist.make_iterator();
      (void)drain_steps(it);
    }
    strata::DistributedIterator it = dist.make_iterator();
    json before = json::array();
    for (int s = 0; s < a.save_after; ++s) {
      auto batch = it.get_next_as_optional();
      if (!batch) break;
      before.push_back(step_ids(*batch));
    }
    // Let the input thread run ahead: the state must not include it.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string state = it.save_state();
    if (!a.save_to.empty()) std::ofstream(a.save_to, std::ios::binary) << state;
    doc["state_bytes"] = state.size();
    doc["before"] = before;
    doc["after"] = drain_steps(it);
  } else {
    std::vector<std::string> states;
    for (const std::string& f : a.restore_from) states.push_back(read_bytes(f));
    strata::DistributedIterator it = dist.make_iterator();
    it.restore_state(states);
    doc["after"] = drain_steps(it);
  }
  strata::DistributedIterator next = dist.make_iterator();
  doc["next_epoch"] = drain_steps(next);
  return doc;
}

}  // namespace strata::test
