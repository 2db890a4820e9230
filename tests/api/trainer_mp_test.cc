// SPDX-License-Identifier: Apache-2.0
// strata::Trainer on multi_worker_mirrored in 1, 2 and 4 real processes
// (trainer_mp_worker under strata-run, ring over loopback tcp) against
// one_device in this process, at the same global batch:
//  - fit / evaluate / predict: the same weights, per-epoch losses and
//    metrics (training and validation), evaluate's logs and predictions,
//    and EarlyStopping on the (cross-worker) training loss stops at the
//    same epoch; every worker holds bit-identical weights and logs.
//  - layer-by-layer gradient reduction: overlapped with the backward pass
//    it gives bit for bit what the same buckets reduced after the backward
//    pass give, and what the default one-collective step gives; and the
//    overlap happens (the model's hook holds the first layer's backward
//    pass until the last layer's all-reduce has finished, on every replica
//    of every step); also with 2 workers of 2 local replicas each.
//
// Tolerance against one_device: 1e-5 * (1 + |reference|). one_device sums a
// step's per-example gradients over the global batch on one replica; N
// workers each sum their share and the all-reduce adds the N partial sums.
// float32 addition is not associative, so each step differs by rounding
// (~1e-7 relative) and the differences carry through the steps (measured
// at most 1.2e-7 * (1 + |value|) here, 2 and 4 workers against 1). Across workers and between the reduction
// paths there is no tolerance: the all-reduce gives every rank the same
// bits, and the paths issue collectives that add the same numbers in the
// same order (the model's gradients are 131 floats, which the ring reduces
// on its direct path, folding the ranks in one fixed order whatever the packing).
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "strata/strata.hpp"
#include "test_support.h"
#include "trainer_mp_case.h"

namespace strata {
namespace {

using test::CaseResult;

#ifdef STRATA_RUN_BIN

// Run the worker on `n` processes for `cases`; returns [case][worker].
std::map<std::string, std::vector<CaseResult>> run_workers(int n, const std::string& cases,
                                                           const test::TempDir& dir, int devices = 1) {
  const std::string cmd = "timeout -k 5 300 " + std::string(STRATA_RUN_BIN) + " -n " + std::to_string(n) +
                          " --timeout 240 -- " + STRATA_TRAINER_MP_WORKER_BIN + " --out '" + dir.str() +
                          "' --cases " + cases + " --devices " + std::to_string(devices) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, k);
  const int st = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd << "\n" << out;
  std::map<std::string, std::vector<CaseResult>> got;
  std::stringstream list(cases);
  for (std::string name; std::getline(list, name, ',');)
    for (int w = 0; w < n; ++w) {
      std::ifstream f(dir.path() / (name + "-" + std::to_string(w) + ".txt"));
      EXPECT_TRUE(f.good()) << "no result of case " << name << " from worker " << w << "\n" << out;
      std::stringstream text;
      text << f.rdbuf();
      got[name].push_back(test::parse(text.str()));
    }
  return got;
}

CaseResult one_device(const std::string& name) {
  Strategy s = Strategy::create("one_device", R"({"device": "cpu:0"})");
  return test::run_case(s, name);
}

void expect_close(const CaseResult& got, const CaseResult& ref, const std::string& what) {
  for (const auto& [key, want] : ref) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << what << ": no " << key;
    ASSERT_EQ(it->second.size(), want.size()) << what << ": " << key;
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_LE(std::fabs(it->second[i] - want[i]), 1e-5 * (1 + std::fabs(want[i])))
          << what << ": " << key << "[" << i << "] = " << it->second[i] << ", one_device " << want[i];
  }
}

void expect_same_bits(const CaseResult& got, const CaseResult& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (const auto& [key, want] : ref) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << what << ": no " << key;
    EXPECT_EQ(it->second, want) << what << ": " << key;
  }
}

class TrainerMpTest : public ::testing::TestWithParam<int> {};

TEST_P(TrainerMpTest, FitEvaluatePredictMatchOneDevice) {
  const int n = GetParam();
  const CaseResult ref = one_device("fit");
  // The stop epoch is robust: the loss improvements are away from
  // min_delta by far more than the tolerance.
  const std::vector<double>& loss = ref.at("hist:loss");
  const int stopped = static_cast<int>(ref.at("stopped_epoch")[0]);
  ASSERT_GE(stopped, 2) << "the reference run should train a few epochs before it stops";
  ASSERT_EQ(loss.size(), static_cast<std::size_t>(stopped + 1));
  for (std::size_t e = 1; e < loss.size(); ++e)
    EXPECT_GT(std::fabs((loss[e - 1] - loss[e]) - test::kEarlyStopDelta), 1e-4) << "epoch " << e;
  EXPECT_GT(ref.at("eval:accuracy")[0], 0.9);  // it learns (chance is 1/3)

  test::TempDir dir;
  const auto got = run_workers(n, "fit", dir);
  const std::vector<CaseResult>& workers = got.at("fit");
  ASSERT_EQ(workers.size(), static_cast<std::size_t>(n));
  // Predictions: each worker returns the rows it saw. Under DATA sharding
  // worker w got rows [w * G / n, (w + 1) * G / n) of every global batch.
  std::vector<double> rows;
  const std::int64_t per = test::kPredictBatch / n;
  const std::size_t width = static_cast<std::size_t>(test::kMpClasses);
  for (std::int64_t step = 0; step < test::kPredictRows / test::kPredictBatch; ++step)
    for (int w = 0; w < n; ++w) {
      const std::vector<double>& p = workers[static_cast<std::size_t>(w)].at("predict");
      ASSERT_EQ(p.size(), static_cast<std::size_t>(test::kPredictRows / n) * width) << "worker " << w;
      rows.insert(rows.end(), p.begin() + static_cast<std::ptrdiff_t>(step * per * test::kMpClasses),
                  p.begin() + static_cast<std::ptrdiff_t>((step + 1) * per * test::kMpClasses));
    }
  for (int w = 0; w < n; ++w) {
    CaseResult r = workers[static_cast<std::size_t>(w)];
    r["predict"] = rows;
    expect_close(r, ref, "worker " + std::to_string(w) + " of " + std::to_string(n));
    EXPECT_EQ(r.at("stopped_epoch"), ref.at("stopped_epoch")) << "worker " << w;
    EXPECT_EQ(r.at("epochs"), ref.at("epochs")) << "worker " << w;
    CaseResult a = workers[static_cast<std::size_t>(w)], b = workers[0];
    a.erase("predict");
    b.erase("predict");
    expect_same_bits(a, b, "worker " + std::to_string(w) + " against worker 0");
  }
}

// n workers of `devices` replicas each.
void check_layered(int n, int devices) {
  const CaseResult ref = one_device("plain");
  test::TempDir dir;
  const auto got = run_workers(n, "plain,deferred,overlap", dir, devices);
  for (int w = 0; w < n; ++w) {
    const std::string who = "worker " + std::to_string(w) + " of " + std::to_string(n);
    const auto i = static_cast<std::size_t>(w);
    CaseResult plain = got.at("plain")[i], deferred = got.at("deferred")[i], overlap = got.at("overlap")[i];
    // 2 epochs of 512 / 32 steps on every local replica.
    const std::vector<double> steps{32.0 * devices};
    EXPECT_EQ(overlap.at("backward_steps"), steps) << who;
    EXPECT_EQ(overlap.at("seen_reduced"), steps) << who;  // the hook saw the overlap every step
    EXPECT_EQ(deferred.at("seen_reduced"), std::vector<double>{0}) << who;  // and without overlap, never
    EXPECT_EQ(plain.at("backward_steps"), std::vector<double>{0}) << who;   // plain never reports layers
    for (CaseResult* r : {&plain, &deferred, &overlap}) {
      r->erase("seen_reduced");
      r->erase("backward_steps");
    }
    expect_same_bits(overlap, deferred, who + ": overlap against deferred");
    expect_same_bits(overlap, plain, who + ": overlap against the one-collective step");
    CaseResult first = got.at("overlap")[0];
    first.erase("seen_reduced");
    first.erase("backward_steps");
    expect_same_bits(overlap, first, who + ": against worker 0");
    CaseResult r = ref;
    r.erase("seen_reduced");
    r.erase("backward_steps");
    expect_close(overlap, r, who + ": against one_device");
  }
}

TEST_P(TrainerMpTest, LayeredReductionOverlapsAndIsBitIdentical) { check_layered(GetParam(), 1); }

// A NaN in one worker's share of batch 5: every worker stops after batch 5
// of epoch 0 (no worker goes on alone into a collective nobody joins).
TEST_P(TrainerMpTest, TerminateOnNaNStopsEveryWorkerAtTheSameBatch) {
  const int n = GetParam();
  test::TempDir dir;
  const auto got = run_workers(n, "nan", dir);
  ASSERT_EQ(got.at("nan").size(), static_cast<std::size_t>(n));
  for (int w = 0; w < n; ++w) {
    const CaseResult& r = got.at("nan")[static_cast<std::size_t>(w)];
    ASSERT_TRUE(r.count("stopped") && r.count("epochs")) << "worker " << w;
    EXPECT_EQ(r.at("stopped"), (std::vector<double>{0, 5, 6})) << "worker " << w;
    EXPECT_EQ(r.at("epochs"), (std::vector<double>{0})) << "worker " << w;
  }
}

// Local replicas and workers together: 2 workers of 2 replicas each.
TEST(TrainerMpReplicasTest, LayeredReductionWithTwoReplicasPerWorker) { check_layered(2, 2); }

INSTANTIATE_TEST_SUITE_P(Workers, TrainerMpTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

#endif

}  // namespace
}  // namespace strata
