// SPDX-License-Identifier: Apache-2.0
// One worker of trainer_mp_test (started by strata-run -n N):
// multi_worker_mirrored with one replica per process runs each case named
// by --cases and writes its results to OUT/<case>-<worker index>.txt.
//
//   trainer_mp_worker --out DIR --cases fit,plain,deferred,overlap [--devices N]
//
// --devices N gives each worker N local replicas (cpu:0 .. cpu:N-1).
//
// With --time WIDTH instead, it times the layered model (64 features,
// WIDTH hidden units and WIDTH classes, so that the last layer's gradients
// are the big ones; global batch 64) through the three reduction paths and
// the chief prints the median step time of fit (8 steps per fit) of each:
//
//   strata-run -n 2 -- trainer_mp_worker --time 512
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "strata/strata.hpp"
#include "trainer_mp_case.h"

namespace {

// Median seconds per step of 5 fits of 8 steps each, per reduction path.
void time_paths(strata::Strategy& s, std::int64_t hidden) {
  const std::int64_t features = 64, classes = hidden, batch = 64;
  const strata::Dataset data =
      strata::Dataset::from_tensor_slices(strata::test::clusters(batch * 8, features, classes, 5)).batch(batch);
  for (const char* path : {"plain", "deferred", "overlap"}) {
    std::optional<strata::Scope> scope(s.scope());
    strata::test::LayeredModel model(features, hidden, classes);
    model.by_layer = std::strcmp(path, "plain") != 0;
    strata::SGD opt(0.01);
    strata::Trainer trainer(s, model, opt);
    scope.reset();
    trainer.gradient_reduction.overlap = std::strcmp(path, "overlap") == 0;
    trainer.gradient_reduction.bucket_bytes = 0;
    strata::FitOptions o;
    o.verbose = false;
    trainer.fit(data, o);  // warm-up
    std::vector<double> per_step;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      trainer.fit(data, o);
      per_step.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 8);
    }
    std::sort(per_step.begin(), per_step.end());
    if (s.extended().is_chief())
      std::printf("%-8s width %lld: %.3f ms/step\n", path, static_cast<long long>(hidden), per_step[2] * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, cases;
  long long time_hidden = 0;
  int devices = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
    else if (std::strcmp(argv[i], "--cases") == 0) cases = argv[i + 1];
    else if (std::strcmp(argv[i], "--time") == 0) time_hidden = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--devices") == 0) devices = std::atoi(argv[i + 1]);
  }
  if (time_hidden > 0) {
    try {
      strata::Config cfg;
      cfg.apply_env();
      cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
      strata::Strategy s = strata::Strategy::from_config(cfg);
      time_paths(s, time_hidden);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trainer_mp_worker: %s\n", e.what());
      return 1;
    }
  }
  if (out.empty() || cases.empty()) {
    std::fprintf(stderr, "usage: trainer_mp_worker --out DIR --cases fit,plain,deferred,overlap | --time WIDTH\n");
    return 2;
  }
  try {
    strata::Config cfg;
    cfg.apply_env();
    cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
    std::string list_json = "[";
    for (int d = 0; d < devices; ++d) list_json += (d ? ",\"cpu:" : "\"cpu:") + std::to_string(d) + "\"";
    cfg.set("/strategy/options/devices", list_json + "]");
    strata::Strategy s = strata::Strategy::from_config(cfg);
    const int worker = s.extended().worker_index();
    std::stringstream list(cases);
    for (std::string name; std::getline(list, name, ',');) {
      const strata::test::CaseResult r = strata::test::run_case(s, name);
      const std::string path = out + "/" + name + "-" + std::to_string(worker) + ".txt";
      std::ofstream f(path);
      f << strata::test::serialize(r);
      if (!f.good()) {
        std::fprintf(stderr, "trainer_mp_worker: cannot write %s\n", path.c_str());
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_mp_worker: %s\n", e.what());
    return 1;
  }
}
