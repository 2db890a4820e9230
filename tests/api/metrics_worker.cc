// SPDX-License-Identifier: Apache-2.0
// One worker of MetricsTest.TwoWorkersGiveTheSingleDeviceValue (started by
// strata-run): multi_worker_mirrored with 2 local replicas; each of the 4
// replicas updates the metrics with its quarter of the examples, and every
// worker prints the aggregated results.
#include <cstdio>

#include "metrics_data.h"
#include "strata/strata.hpp"

int main() {
  try {
    strata::Config cfg;
    cfg.apply_env();
    cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
    cfg.set("/strategy/options/devices", R"(["cpu:0", "cpu:1"])");
    strata::Strategy s = strata::Strategy::from_config(cfg);
    auto scope = s.scope();
    strata::Mean mean;
    strata::SparseCategoricalAccuracy sacc;
    strata::SparseCategoricalCrossentropy ce("ce", true);
    const auto d = strata::test::MetricsData::make(61, 6, 9);
    const int n = s.num_replicas_in_sync();
    s.run([&](strata::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const std::int64_t lo = d.batch * r / n, hi = d.batch * (r + 1) / n;
      mean.update_state(d.values(lo, hi));
      sacc.update_state(d.labels(lo, hi), d.probs(lo, hi));
      ce.update_state(d.labels(lo, hi), d.logits(lo, hi));
    });
    std::printf("mean=%.12f sacc=%.12f ce=%.12f\n", mean.result(), sacc.result(), ce.result());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metrics_worker: %s\n", e.what());
    return 1;
  }
}
