// SPDX-License-Identifier: Apache-2.0
// strata-bench fit: the Trainer's step time against the README's
// hand-written loop (strata-train's loop) on the same model (the example
// MLP), data, strategy and global batch, in the same run.
//
// --repeats times, alternating: (1) the hand-written loop for --steps steps
// (per step: next distributed batch, run() with forward/backward, one
// batched all-reduce of gradients and loss, assign_sub on every variable);
// (2) Trainer::fit for --steps steps (steps_per_epoch = steps, no progress
// bar, metrics "accuracy"). Each timed after 5 warm-up steps of its own.
// Medians of ms/step are reported with the overhead (trainer / loop - 1).
// Both end with weights that agree (checked to 1e-4: the Trainer applies
// the same SGD step, but its loss metric and accuracy reads add work, not
// different arithmetic), or the run fails.
#pragma once

#include <cstdint>
#include <string>

namespace strata::bench {

struct FitBenchOptions {
  std::string strategy = "mirrored";
  std::string devices = "cpu:0,cpu:1";
  int steps = 200;
  std::int64_t global_batch = 512;
  int features = 64, hidden = 128, classes = 8;
  int repeats = 5;
  bool json = false;
};

/// Prints a table (or one JSON object with o.json). Returns 0, or 1 when
/// the two paths' weights disagree.
int run_fit_bench(const FitBenchOptions& o);

}  // namespace strata::bench
