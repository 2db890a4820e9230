// SPDX-License-Identifier: Apache-2.0
// One worker of trainer_mp_test (started by strata-run -n N):
// multi_worker_mirrored with one replica per process runs each case named
// by --cases and writes its results to OUT/<case>-<worker index>.txt.
//
//   trainer_mp_worker --out DIR --cases fit,plain,deferred,overlap
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "strata/strata.hpp"
#include "trainer_mp_case.h"

int main(int argc, char** argv) {
  std::string out, cases;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
    else if (std::strcmp(argv[i], "--cases") == 0) cases = argv[i + 1];
  }
  if (out.empty() || cases.empty()) {
    std::fprintf(stderr, "usage: trainer_mp_worker --out DIR --cases fit,plain,deferred,overlap\n");
    return 2;
  }
  try {
    strata::Config cfg;
    cfg.apply_env();
    cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
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
