// SPDX-License-Identifier: Apache-2.0
// One worker of backup_test's multi-worker cases, started by strata-run:
//   backup_worker save DIR     a mirrored variable (6.0) and a state object
//                              whose state names this worker, saved to DIR;
//   backup_worker restore DIR  restores both and prints what it got.
#include <cstdio>
#include <string>
#include <vector>

#include "strata/strata.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: backup_worker save|restore DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  try {
    // Two local replicas: the state gather must take one state per worker,
    // not per replica.
    strata::Config cfg;
    cfg.apply_env();
    cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
    cfg.set("/strategy/options/devices", R"(["cpu:0", "cpu:1"])");
    strata::Strategy s = strata::Strategy::from_config(cfg);
    auto scope = s.scope();
    const int w = s.extended().worker_index(), n = s.extended().num_workers();
    strata::Variable v(strata::Tensor::from_vector(std::vector<float>{mode == "save" ? 6.0f : 0.0f}), {"w"});
    std::vector<std::string> got;
    strata::Checkpoint ckpt;
    ckpt.track("w", v).track_state(
        "input", {[&] { return "state-of-worker-" + std::to_string(w) + "-of-" + std::to_string(n); },
                  [&](const std::vector<std::string>& all) { got = all; }});
    if (mode == "save") {
      std::printf("%s\n", ckpt.save(dir) ? "saved" : "not the chief");
      return 0;
    }
    ckpt.restore(dir);
    std::string joined;
    for (const std::string& g : got) joined += (joined.empty() ? "" : ",") + g;
    std::printf("restored w=%g states=%s\n", static_cast<double>(v.value().to_vector<float>()[0]), joined.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backup_worker: %s\n", e.what());
    return 1;
  }
}
