// SPDX-License-Identifier: Apache-2.0
// One process of the distributed-input checks, started by
// distributed_data_test under strata-run: runs the case (dist_data_case.h)
// and writes its JSON record to --out, where "{rank}" becomes $STRATA_RANK.
// Errors go to stderr with exit code 3.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "dist_data_case.h"

int main(int argc, char** argv) {
  CLI::App app{"dist_data_worker: one process of the distributed input tests"};
  strata::test::Args a;
  std::string out;
  app.add_option("--strategy", a.strategy);
  app.add_option("--devices", a.devices);
  app.add_option("--source", a.source);
  app.add_option("--files", a.files);
  app.add_option("--length", a.length);
  app.add_option("--batch", a.batch);
  app.add_flag("--drop", a.drop);
  app.add_option("--policy", a.policy);
  app.add_option("--epochs", a.epochs);
  app.add_option("--mode", a.mode);
  app.add_option("--prefetch", a.prefetch);
  app.add_option("--variant-rank", a.variant_rank);
  app.add_option("--composite", a.composite);
  app.add_option("--cycle", a.cycle);
  app.add_option("--block", a.block);
  app.add_option("--split", a.split);
  app.add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);
  const char* rank = std::getenv("STRATA_RANK");
  if (const auto p = out.find("{rank}"); p != std::string::npos) out.replace(p, 6, rank ? rank : "0");
  try {
    const auto doc = strata::test::run_distributed(a);
    std::ofstream(out) << doc.dump() << '\n';
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
