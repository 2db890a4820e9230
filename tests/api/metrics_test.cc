// SPDX-License-Identifier: Apache-2.0
// Metrics against a direct computation over the same examples: under the
// Default strategy, split across the replicas of every single-process
// strategy, and across 2 worker processes of multi_worker_mirrored (through
// strata-run and metrics_worker); reading in the wrong context and bad input.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include "metrics_data.h"
#include "strata/strata.hpp"
#include "test_support.h"

namespace strata {
namespace {

using test::MetricsData;

TEST(MetricsTest, EachMetricEqualsADirectComputation) {
  const MetricsData d = MetricsData::make(37, 5, 11);
  Mean mean;
  Sum sum;
  Accuracy acc;
  SparseCategoricalAccuracy sacc;
  SparseCategoricalCrossentropy ce_probs("ce", false), ce_logits("ce_logits", true);
  const Tensor x = d.values(0, d.batch), y = d.labels(0, d.batch), p = d.probs(0, d.batch),
               lg = d.logits(0, d.batch), same = d.labels(0, d.batch), guess = d.guesses(0, d.batch);
  mean.update_state(x);
  sum.update_state(x);
  acc.update_state(same, guess);
  sacc.update_state(y, p);
  ce_probs.update_state(y, p);
  ce_logits.update_state(y, lg);
  EXPECT_NEAR(mean.result(), d.mean(), 1e-12);
  EXPECT_NEAR(sum.result(), d.sum(), 1e-9);
  EXPECT_NEAR(acc.result(), d.accuracy(), 1e-12);
  EXPECT_NEAR(sacc.result(), d.sparse_accuracy(), 1e-12);
  EXPECT_NEAR(ce_probs.result(), d.crossentropy_probs(), 1e-9);
  EXPECT_NEAR(ce_logits.result(), d.crossentropy_logits(), 1e-9);
  EXPECT_GT(sacc.result(), 0.0);
  EXPECT_LT(sacc.result(), 1.0);  // the data makes both outcomes happen
  mean.reset_state();
  EXPECT_EQ(mean.result(), 0.0);  // divide_no_nan
  mean.update_state(Tensor::from_vector(std::vector<float>{4}));
  EXPECT_EQ(mean.result(), 4.0);
}

TEST(MetricsTest, SampleWeights) {
  Mean m;
  const Tensor v = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  m.update_state(v, Tensor::from_vector(std::vector<float>{1, 3}));  // per row: (1+2)*1 + (3+4)*3 = 24 / 8
  EXPECT_DOUBLE_EQ(m.result(), 3.0);
  m.reset_state();
  m.update_state(v, Tensor::scalar(2.0f));
  EXPECT_DOUBLE_EQ(m.result(), 2.5);
  m.reset_state();
  m.update_state(v, Tensor::from_vector(std::vector<float>{0, 0, 0, 1}, {2, 2}));
  EXPECT_DOUBLE_EQ(m.result(), 4.0);
  EXPECT_THROW(m.update_state(v, Tensor::from_vector(std::vector<float>{1, 2, 3})), InvalidArgumentError);
}

std::string devices(int n) {
  std::string s = R"({"devices": [)";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string("\"cpu:") + std::to_string(i) + "\"";
  return s + "]}";
}

TEST(MetricsTest, ReplicasSplittingTheBatchGiveTheSingleDeviceValue) {
  const MetricsData d = MetricsData::make(45, 4, 3);
  for (auto [name, opts] : {std::pair<std::string, std::string>{"mirrored", devices(2)},
                            {"mirrored", devices(4)}, {"central_storage", devices(3)}}) {
    SCOPED_TRACE(name + opts);
    Strategy s = Strategy::create(name, opts);
    std::optional<Scope> scope(s.scope());
    Mean mean;
    SparseCategoricalAccuracy sacc;
    SparseCategoricalCrossentropy ce("ce", true);
    scope.reset();
    const int n = s.num_replicas_in_sync();
    for (int epoch = 0; epoch < 2; ++epoch) {
      s.run([&](ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        const std::int64_t lo = d.batch * r / n, hi = d.batch * (r + 1) / n;
        mean.update_state(d.values(lo, hi));
        sacc.update_state(d.labels(lo, hi), d.probs(lo, hi));
        ce.update_state(d.labels(lo, hi), d.logits(lo, hi));
      });
      EXPECT_NEAR(mean.result(), d.mean(), 1e-12);
      EXPECT_NEAR(sacc.result(), d.sparse_accuracy(), 1e-12);
      EXPECT_NEAR(ce.result(), d.crossentropy_logits(), 1e-9);
      mean.reset_state();
      sacc.reset_state();
      ce.reset_state();
    }
    // Read inside a replica function: an error naming the metric.
    s.run([&](ReplicaContext&) {
      try {
        (void)sacc.result();
        ADD_FAILURE() << "a metric was read in replica context";
      } catch (const FailedPreconditionError& e) {
        EXPECT_NE(std::string(e.what()).find("metric 'sparse_categorical_accuracy'"), std::string::npos) << e.what();
      }
    });
    // Updates from cross-replica context add to the aggregate.
    mean.update_state(d.values(0, d.batch));
    EXPECT_NEAR(mean.result(), d.mean(), 1e-12);
  }
}

TEST(MetricsTest, StateGoesThroughACheckpoint) {
  test::TempDir dir;
  Mean a("loss");
  a.update_state(Tensor::from_vector(std::vector<float>{1, 2, 6}));
  Checkpoint ck;
  a.track(ck);
  ck.save((dir.path() / "c").string());
  Mean b("loss");
  Checkpoint ck2;
  b.track(ck2);
  ck2.restore((dir.path() / "c").string()).assert_consumed();
  EXPECT_DOUBLE_EQ(b.result(), 3.0);
}

TEST(MetricsTest, BadInputIsAClearError) {
  SparseCategoricalAccuracy s;
  const Tensor p = Tensor::from_vector(std::vector<float>{0.1f, 0.9f, 0.5f, 0.5f}, {2, 2});
  try {
    s.update_state(Tensor::from_vector(std::vector<std::int32_t>{0, 2}), p);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("label 2 is outside [0, 2)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.update_state(Tensor::from_vector(std::vector<std::int32_t>{0, 1, 1}), p), InvalidArgumentError);
  EXPECT_THROW(s.update_state(Tensor::from_vector(std::vector<float>{0, 1}), p), InvalidArgumentError);
  EXPECT_THROW(s.update_state(Tensor::from_vector(std::vector<std::int32_t>{0, 1}),
                              Tensor::from_vector(std::vector<float>{1, 2})),
               InvalidArgumentError);
  Accuracy a;
  EXPECT_THROW(a.update_state(Tensor::from_vector(std::vector<float>{1, 2}), Tensor::from_vector(std::vector<float>{1})),
               InvalidArgumentError);
  // [batch, 1] labels are accepted.
  s.update_state(Tensor::from_vector(std::vector<std::int64_t>{1, 0}, {2, 1}), p);
  EXPECT_DOUBLE_EQ(s.result(), 1.0);  // row 2 ties: the first maximum (class 0) wins
}

#ifdef STRATA_RUN_BIN
TEST(MetricsTest, TwoWorkersGiveTheSingleDeviceValue) {
  const std::string cmd = std::string(STRATA_RUN_BIN) + " -n 2 --timeout 120 -- " + STRATA_METRICS_WORKER_BIN + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, k);
  const int st = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  const MetricsData d = MetricsData::make(61, 6, 9);
  char want[256];
  std::snprintf(want, sizeof want, "mean=%.12f sacc=%.12f ce=%.12f", d.mean(), d.sparse_accuracy(),
                d.crossentropy_logits());
  EXPECT_NE(out.find(std::string("[0] ") + want), std::string::npos) << want << "\n" << out;
  EXPECT_NE(out.find(std::string("[1] ") + want), std::string::npos) << want << "\n" << out;
}
#endif

}  // namespace
}  // namespace strata
