// SPDX-License-Identifier: Apache-2.0
// Optimizers and learning-rate schedules against values worked out by hand
// from Keras' formulas (the arithmetic is in the comments), the same update
// under every single-process strategy as under the Default strategy (the
// replicas' gradients summed), slots and iterations through a checkpoint,
// and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>

#include "strata/strata.hpp"
#include "test_support.h"

namespace strata {
namespace {

std::vector<float> values(const Variable& v) { return v.value().to_vector<float>(); }

Tensor f32(std::vector<float> v) { return Tensor::from_vector(v); }

TEST(OptimizerTest, SgdWithoutMomentum) {
  Variable w(f32({1, 2}), {"w"});
  SGD opt(0.1);
  opt.apply_gradients({}, {});  // nothing to do
  std::vector<Tensor> g;
  g.push_back(f32({0.5f, -1}));
  opt.apply_gradients(g, {&w});
  // w - g * lr = [1 - 0.05, 2 + 0.1]
  EXPECT_FLOAT_EQ(values(w)[0], 0.95f);
  EXPECT_FLOAT_EQ(values(w)[1], 2.1f);
  EXPECT_EQ(opt.iterations(), 1);
  EXPECT_THROW(opt.slot(w, "momentum"), NotFoundError);
}

TEST(OptimizerTest, SgdMomentumAndNesterov) {
  // w = 1, g = 1 every step, lr 0.1, momentum 0.9.
  // plain:    m = -0.1, -0.19, -0.271;  w = 0.9, 0.71, 0.439
  // nesterov: m as above; w += m * 0.9 - 0.1: 0.81, 0.539, 0.1951
  for (bool nesterov : {false, true}) {
    Variable w(f32({1}), {"w"});
    SGD opt(0.1, 0.9, nesterov);
    const std::vector<float> want = nesterov ? std::vector<float>{0.81f, 0.539f, 0.1951f}
                                             : std::vector<float>{0.9f, 0.71f, 0.439f};
    const std::vector<float> m = {-0.1f, -0.19f, -0.271f};
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor> g;
      g.push_back(f32({1}));
      opt.apply_gradients(g, {&w});
      EXPECT_NEAR(values(w)[0], want[step], 1e-6) << "nesterov " << nesterov << " step " << step;
      EXPECT_NEAR(values(opt.slot(w, "momentum"))[0], m[step], 1e-6);
    }
    EXPECT_EQ(opt.iterations(), 3);
  }
}

TEST(OptimizerTest, AdamAmsgradAndAdamW) {
  // Adam, lr 0.1, w = 1, g = 1 then 1:
  // (Exact arithmetic below; in float32 1 - 0.999f is 0.00099998713, which
  // moves the results by a few 1e-7.)
  //  t=1: m = 0.1, v = 0.001, alpha = 0.1 * sqrt(1 - 0.999) / (1 - 0.9) = 0.0316228,
  //       w -= 0.1 * alpha / (sqrt(0.001) + 1e-7) = 0.0999997 -> 0.9000003
  //  t=2: m = 0.19, v = 0.001999, alpha = 0.1 * sqrt(0.001999) / 0.19 = 0.0235317,
  //       w -= 0.19 * alpha / (0.0447102 + 1e-7) = 0.0999998 -> 0.8000005
  Variable w(f32({1}), {"w"});
  Adam adam(0.1);
  for (float want : {0.9000003f, 0.8000005f}) {
    std::vector<Tensor> g;
    g.push_back(f32({1}));
    adam.apply_gradients(g, {&w});
    EXPECT_NEAR(values(w)[0], want, 1e-6);
  }
  EXPECT_NEAR(values(adam.slot(w, "m"))[0], 0.19f, 1e-7);
  EXPECT_NEAR(values(adam.slot(w, "v"))[0], 0.001999f, 5e-8);

  // amsgrad with g = 1 then 0: v = 0.001 then 0.001 + (0 - 0.001) * 0.001 =
  // 0.000999, v_hat keeps the max 0.001.
  Variable a(f32({1}), {"a"});
  Adam ams(0.1, 0.9, 0.999, 1e-7, /*amsgrad=*/true);
  for (float gv : {1.0f, 0.0f}) {
    std::vector<Tensor> g;
    g.push_back(f32({gv}));
    ams.apply_gradients(g, {&a});
  }
  EXPECT_NEAR(values(ams.slot(a, "v"))[0], 0.000999f, 5e-8);
  EXPECT_NEAR(values(ams.slot(a, "v_hat"))[0], 0.001f, 5e-8);
  EXPECT_GT(values(ams.slot(a, "v_hat"))[0], values(ams.slot(a, "v"))[0]);
  // t=2: m = 0.09, alpha = 0.0235317, w = 0.9000003 - 0.09 * alpha / (sqrt(0.001) + 1e-7)
  EXPECT_NEAR(values(a)[0], 0.9000003f - 0.09f * 0.0235317f / 0.0316229f, 1e-6);

  // AdamW, weight_decay 0.5: w = 1 - 1 * 0.5 * 0.1 = 0.95 first, then Adam's step.
  Variable d(f32({1}), {"d"});
  AdamW adamw(0.1, 0.5);
  std::vector<Tensor> g;
  g.push_back(f32({1}));
  adamw.apply_gradients(g, {&d});
  EXPECT_NEAR(values(d)[0], 0.95f - 0.0999997f, 1e-6);
  EXPECT_STREQ(adamw.name(), "AdamW");
}

TEST(OptimizerTest, Float64VariablesUseDoubleArithmetic) {
  Variable w(Tensor::from_vector(std::vector<double>{1.0}), {"w"});
  SGD opt(0.1, 0.9);
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> g;
    g.push_back(Tensor::from_vector(std::vector<double>{1.0}));
    opt.apply_gradients(g, {&w});
  }
  EXPECT_NEAR(w.value().to_vector<double>()[0], 0.439, 1e-15);
}

TEST(OptimizerTest, GradientClipping) {
  // global_clipnorm 1: [3, 4] and [0] have global norm 5, scaled by 1/5.
  Variable a(f32({0, 0}), {"a"}), b(f32({0}), {"b"});
  OptimizerOptions global;
  global.global_clipnorm = 1.0;
  SGD opt(1.0, 0, false, global);
  std::vector<Tensor> g;
  g.push_back(f32({3, 4}));
  g.push_back(f32({0}));
  opt.apply_gradients(g, {&a, &b});
  EXPECT_NEAR(values(a)[0], -0.6f, 1e-7);
  EXPECT_NEAR(values(a)[1], -0.8f, 1e-7);
  // A norm already below the limit is kept.
  Variable c(f32({0, 0}), {"c"});
  std::vector<Tensor> small;
  small.push_back(f32({0.3f, 0.4f}));
  opt.apply_gradients(small, {&c});
  EXPECT_NEAR(values(c)[1], -0.4f, 1e-7);
  // clipnorm 1, per tensor: [3, 4] -> [0.6, 0.8]; [0.3, 0.4] kept.
  OptimizerOptions each;
  each.clipnorm = 1.0;
  SGD per(1.0, 0, false, each);
  Variable x(f32({0, 0}), {"x"}), y(f32({0, 0}), {"y"});
  std::vector<Tensor> two;
  two.push_back(f32({3, 4}));
  two.push_back(f32({0.3f, 0.4f}));
  per.apply_gradients(two, {&x, &y});
  EXPECT_NEAR(values(x)[0], -0.6f, 1e-7);
  EXPECT_NEAR(values(y)[0], -0.3f, 1e-7);
  // A NaN gradient makes the global norm NaN, and every clipped value NaN.
  Variable n(f32({0, 0}), {"n"});
  std::vector<Tensor> bad;
  bad.push_back(f32({NAN, 1}));
  opt.apply_gradients(bad, {&n});
  EXPECT_TRUE(std::isnan(values(n)[1]));
}

TEST(LearningRateTest, SchedulesMatchKerasFormulas) {
  const LearningRate pc = PiecewiseConstantDecay({10, 20}, {1.0, 0.5, 0.1});
  EXPECT_EQ(pc(0), 1.0);
  EXPECT_EQ(pc(10), 1.0);  // step <= boundary
  EXPECT_EQ(pc(11), 0.5);
  EXPECT_EQ(pc(20), 0.5);
  EXPECT_EQ(pc(21), 0.1);
  // 0.1 * 0.5^(5/10) and, staircase, 0.1 * 0.5^0
  EXPECT_NEAR(ExponentialDecay(0.1, 10, 0.5)(5), 0.1 * std::sqrt(0.5), 1e-15);
  EXPECT_EQ(ExponentialDecay(0.1, 10, 0.5, true)(5), 0.1);
  EXPECT_NEAR(ExponentialDecay(0.1, 10, 0.5, true)(25), 0.025, 1e-15);
  // cosine: 0.5 * (1 + cos(pi * 50/100)) = 0.5; clamped after decay_steps.
  const LearningRate cos = CosineDecay(1.0, 100);
  EXPECT_NEAR(cos(0), 1.0, 1e-15);
  EXPECT_NEAR(cos(50), 0.5, 1e-15);
  EXPECT_NEAR(cos(100), 0.0, 1e-15);
  EXPECT_NEAR(cos(1000), 0.0, 1e-15);
  EXPECT_NEAR(CosineDecay(1.0, 100, 0.1)(100), 0.1, 1e-15);  // alpha floor
  // warm-up from 0 to 1 over 10 steps, then cosine from 1 over 100 steps.
  const LearningRate warm = CosineDecay(0.0, 100, 0.0, 1.0, 10);
  EXPECT_NEAR(warm(5), 0.5, 1e-15);
  EXPECT_NEAR(warm(10), 1.0, 1e-15);
  EXPECT_NEAR(warm(60), 0.5, 1e-15);
  EXPECT_NEAR(warm(5000), 0.0, 1e-15);
}

TEST(LearningRateTest, TheScheduleDrivesTheOptimizer) {
  // lr 1 for steps 0-1, then 0.5: w = 0 - 1 - 1 - 0.5 - 0.5
  Variable w(f32({0}), {"w"});
  SGD opt(PiecewiseConstantDecay({1}, {1.0, 0.5}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(opt.learning_rate(), i <= 1 ? 1.0 : 0.5);
    std::vector<Tensor> g;
    g.push_back(f32({1}));
    opt.apply_gradients(g, {&w});
  }
  EXPECT_FLOAT_EQ(values(w)[0], -3.0f);
}

std::string devices(int n) {
  std::string s = R"({"devices": [)";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string("\"cpu:") + std::to_string(i) + "\"";
  return s + "]}";
}

// Under a strategy, each replica passes its own gradient from run(): the
// update is the Default strategy's update with the replicas' sum, on every
// copy, bit for bit.
TEST(OptimizerTest, ReplicaGradientsAreSummedAndAppliedOnceOnEveryStrategy) {
  struct Case {
    const char* name;
    std::string options;
  };
  for (const Case& c : {Case{"mirrored", devices(2)}, Case{"mirrored", devices(4)},
                        Case{"central_storage", devices(3)}, Case{"one_device", R"({"device": "cpu:0"})"}}) {
    SCOPED_TRACE(std::string(c.name) + " " + c.options);
    Strategy s = Strategy::create(c.name, c.options);
    const int n = s.num_replicas_in_sync();
    // Reference: the Default strategy, gradient = sum over replicas of (r + 1) * g0.
    Variable ref(f32({1, -2, 3}), {"ref"});
    Adam ref_opt(0.01, 0.9, 0.999, 1e-7, false, {});
    std::optional<Scope> scope(s.scope());
    Variable w(f32({1, -2, 3}), {"w"});
    Adam opt(0.01);
    opt.build({&w});  // the slots are made in the strategy, here in its scope
    Variable w2(f32({0.5f}), {"w2"});
    SGD lazy(0.1, 0.9);  // its slot is made inside run(), in the merge_call
    scope.reset();
    for (int step = 0; step < 3; ++step) {
      std::vector<float> sum(3, 0.0f);
      for (int r = 0; r < n; ++r)
        for (int i = 0; i < 3; ++i) sum[static_cast<std::size_t>(i)] += static_cast<float>((r + 1) * (i + step + 1)) * 0.25f;
      {
        std::vector<Tensor> g;
        g.push_back(f32(sum));
        ref_opt.apply_gradients(g, {&ref});
      }
      s.run([&](ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        std::vector<float> mine(3);
        for (int i = 0; i < 3; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * (i + step + 1)) * 0.25f;
        std::vector<Tensor> g;
        g.push_back(f32(mine));
        opt.apply_gradients(g, {&w});
        std::vector<Tensor> one;
        one.push_back(f32({1.0f / static_cast<float>(n)}));
        lazy.apply_gradients(one, {&w2});
      });
    }
    // Sum of the replicas' 1/n is 1 (exact for n = 1, 2, 4; n = 3 rounds):
    // w2 = 0.5 - 0.1, - 0.19, - 0.271 = -0.061.
    EXPECT_NEAR(w2.value().to_vector<float>()[0], -0.061f, 1e-6);
    EXPECT_EQ(opt.iterations(), 3);
    const std::vector<float> want = ref.value().to_vector<float>();
    // Every replica's copy, read in replica context.
    std::vector<std::vector<float>> seen(static_cast<std::size_t>(s.num_local_replicas()));
    s.run([&](ReplicaContext& ctx) { seen[ctx.local_replica_id()] = w.value().to_vector<float>(); });
    for (const auto& copy : seen) EXPECT_EQ(copy, want);
    EXPECT_EQ(opt.slot(w, "m").value().to_vector<float>(), ref_opt.slot(ref, "m").value().to_vector<float>());
  }
}

TEST(OptimizerTest, CheckpointRestoresSlotsAndIterations) {
  test::TempDir dir;
  auto train = [](Variable& w, Optimizer& opt, int steps) {
    for (int i = 0; i < steps; ++i) {
      std::vector<Tensor> g;
      g.push_back(f32({1.0f + static_cast<float>(i), -0.5f}));
      opt.apply_gradients(g, {&w});
    }
  };
  Variable a(f32({1, 1}), {"w"});
  Adam opt_a(0.05);
  opt_a.build({&a});
  Checkpoint ck;
  ck.track("w", a);
  opt_a.track(ck);
  train(a, opt_a, 2);
  ck.save((dir.path() / "c").string());
  train(a, opt_a, 2);
  // A fresh program: same variable, fresh optimizer, restored, then the same 2 steps.
  Variable b(f32({0, 0}), {"w"});
  Adam opt_b(0.05);
  opt_b.build({&b});
  Checkpoint ck2;
  ck2.track("w", b);
  opt_b.track(ck2);
  ck2.restore((dir.path() / "c").string()).assert_consumed();
  EXPECT_EQ(opt_b.iterations(), 2);
  train(b, opt_b, 2);
  EXPECT_EQ(values(b), values(a));
  EXPECT_EQ(values(opt_b.slot(b, "v")), values(opt_a.slot(a, "v")));
  Adam unbuilt(0.1);
  EXPECT_THROW(unbuilt.track(ck2), FailedPreconditionError);
}

TEST(OptimizerTest, BadUseIsAClearError) {
  Variable w(f32({1, 2}), {"w"});
  SGD opt(0.1);
  std::vector<Tensor> wrong_shape;
  wrong_shape.push_back(f32({1, 2, 3}));
  try {
    opt.apply_gradients(wrong_shape, {&w});
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("variable 'w' is float32[3]"), std::string::npos) << e.what();
  }
  std::vector<Tensor> one;
  one.push_back(f32({1, 2}));
  EXPECT_THROW(opt.apply_gradients(one, {&w, &w}), InvalidArgumentError);
  Variable frozen(f32({1}), {"frozen", false});
  std::vector<Tensor> g1;
  g1.push_back(f32({1}));
  EXPECT_THROW(opt.apply_gradients(g1, {&frozen}), InvalidArgumentError);
  Variable half(Tensor::from_doubles({1.0}, {1}, DType::kFloat16), {"half"});
  std::vector<Tensor> gh;
  gh.push_back(Tensor::from_doubles({1.0}, {1}, DType::kFloat16));
  EXPECT_THROW(opt.apply_gradients(gh, {&half}), UnimplementedError);
  EXPECT_THROW(SGD(-1.0), InvalidArgumentError);
  EXPECT_THROW(SGD(0.1, 1.5), InvalidArgumentError);
  EXPECT_THROW(Adam(0.1, 1.0), InvalidArgumentError);
  EXPECT_THROW(AdamW(0.1, -1), InvalidArgumentError);
  OptimizerOptions both;
  both.clipnorm = 1;
  both.global_clipnorm = 1;
  EXPECT_THROW(SGD(0.1, 0, false, both), InvalidArgumentError);
  EXPECT_THROW(PiecewiseConstantDecay({1, 2}, {1.0}), InvalidArgumentError);
  EXPECT_THROW(PiecewiseConstantDecay({2, 1}, {1.0, 2.0, 3.0}), InvalidArgumentError);
  EXPECT_THROW(ExponentialDecay(0.1, 0, 0.5), InvalidArgumentError);
  EXPECT_THROW(CosineDecay(0.1, 10, 0, 1.0, 0), InvalidArgumentError);
}

}  // namespace
}  // namespace strata
