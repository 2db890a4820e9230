// SPDX-License-Identifier: Apache-2.0
// One process of the distributed resume checks, started by
// distributed_resume_test under strata-run: runs dist_resume_case.h and
// writes its JSON record to --out ("{rank}" becomes $STRATA_RANK, also in
// --save-to). Errors go to stderr with exit code 3.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "dist_resume_case.h"

namespace {
void expand_rank(std::string& s) {
  const char* rank = std::getenv("STRATA_RANK");
  if (const auto p = s.find("{rank}"); p != std::string::npos) s.replace(p, 6, rank ? rank : "0");
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dist_resume_worker: one process of the distributed resume tests"};
  strata::test::ResumeArgs a;
  std::string out;
  app.add_option("--strategy", a.base.strategy);
  app.add_option("--devices", a.base.devices);
  app.add_option("--source", a.base.source);
  app.add_option("--files", a.base.files);
  app.add_option("--length", a.base.length);
  app.add_option("--batch", a.base.batch);
  app.add_option("--policy", a.base.policy);
  app.add_option("--prefetch", a.base.prefetch);
  app.add_option("--composite", a.base.composite);
  app.add_option("--cycle", a.base.cycle);
  app.add_option("--block", a.base.block);
  app.add_option("--shuffle", a.shuffle);
  app.add_option("--epochs-before", a.epochs_before);
  app.add_option("--save-after", a.save_after);
  app.add_option("--save-to", a.save_to);
  app.add_option("--restore-from", a.restore_from);
  app.add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);
  expand_rank(out);
  expand_rank(a.save_to);
  try {
    const auto doc = strata::test::run_resume(a);
    std::ofstream(out) << doc.dump() << '\n';
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
