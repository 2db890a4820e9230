// SPDX-License-Identifier: Apache-2.0
// The Default strategy and the thread-local contexts outside any other
// strategy.
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

#include "strata/strata.hpp"

namespace strata {
namespace {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(DefaultStrategyTest, IsTheStrategyOutsideAnyScope) {
  Strategy& s = get_strategy();
  EXPECT_EQ(s.name(), "default");
  EXPECT_EQ(s.num_replicas_in_sync(), 1);
  EXPECT_FALSE(has_strategy());
  EXPECT_FALSE(in_cross_replica_context());
  ReplicaContext* ctx = get_replica_context();
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(ctx->replica_id_in_sync_group(), 0);
  EXPECT_EQ(ctx->num_replicas_in_sync(), 1);
  EXPECT_EQ(ctx->strategy(), s);
  EXPECT_EQ(s.extended().worker_devices(), std::vector<std::string>{"cpu:0"});
  EXPECT_TRUE(s.extended().is_chief());
  EXPECT_EQ(s.extended().num_workers(), 1);
  // A singleton: creating "default" gives the same instance.
  Strategy again = Strategy::create("default");
  EXPECT_EQ(again, s);
}

TEST(DefaultStrategyTest, EveryThreadStartsInTheDefaultContext) {
  bool has = true;
  std::string name;
  std::thread t([&] {
    has = has_strategy();
    name = get_strategy().name();
  });
  t.join();
  EXPECT_FALSE(has);
  EXPECT_EQ(name, "default");
}

TEST(DefaultStrategyTest, RunCallsOneReplicaOnTheCallersThread) {
  Strategy& s = get_strategy();
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  PerReplica out = s.run([&](ReplicaContext& ctx) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(ctx.replica_id_in_sync_group(), 0);
    EXPECT_EQ(get_replica_context(), &ctx);
    EXPECT_FALSE(in_cross_replica_context());
    return Tensor::scalar(7.0f);
  });
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to_vector<float>()[0], 7.0f);
}

TEST(DefaultStrategyTest, UserExceptionsKeepTheirType) {
  EXPECT_THROW(get_strategy().run([](ReplicaContext&) { throw UserError("boom"); }), UserError);
  try {
    get_strategy().run([](ReplicaContext&) { STRATA_THROW(STRATA_ERR_DATA_LOSS, "corrupt"); });
    FAIL() << "run did not throw";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos);
  }
  // The strategy is usable afterwards.
  EXPECT_NO_THROW(get_strategy().run([](ReplicaContext&) {}));
}

TEST(DefaultStrategyTest, RunIsNotReentrant) {
  EXPECT_THROW(get_strategy().run([](ReplicaContext&) { get_strategy().run([](ReplicaContext&) {}); }),
               FailedPreconditionError);
}

TEST(DefaultStrategyTest, ReductionsAreIdentities) {
  Strategy& s = get_strategy();
  PerReplica v = s.run([](ReplicaContext&) { return Tensor::from_vector<float>({1, 2, 3}); });
  EXPECT_EQ(s.reduce(ReduceOp::SUM, v).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, v).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(s.reduce(ReduceOp::SUM, v, 0).to_vector<float>(), std::vector<float>{6});
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, v, -1).to_vector<float>(), std::vector<float>{2});
  Tensor plain = Tensor::from_vector<double>({4, 5});
  EXPECT_EQ(s.reduce(ReduceOp::SUM, plain).to_vector<double>(), (std::vector<double>{4, 5}));
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, plain).to_vector<double>(), (std::vector<double>{4, 5}));
  EXPECT_EQ(s.gather(v, 0).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_THROW(s.reduce(ReduceOp::SUM, v, 1), InvalidArgumentError);
  auto local = s.experimental_local_results(v);
  ASSERT_EQ(local.size(), 1u);
  EXPECT_EQ(local[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(DefaultStrategyTest, ReplicaCollectivesAreIdentities) {
  get_strategy().run([](ReplicaContext& ctx) {
    Tensor x = Tensor::from_vector<std::int64_t>({5, 6});
    EXPECT_EQ(ctx.all_reduce(ReduceOp::SUM, x).to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 6}));
    EXPECT_EQ(ctx.all_gather(x, 0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 6}));
    bool merged = false;
    ctx.merge_call([&](Strategy& s) {
      merged = true;
      EXPECT_TRUE(in_cross_replica_context());
      EXPECT_EQ(get_strategy(), s);
      EXPECT_EQ(get_replica_context(), nullptr);
    });
    EXPECT_TRUE(merged);
    EXPECT_EQ(get_replica_context(), &ctx);
  });
  // The default replica context outside run works too.
  Tensor y = get_replica_context()->all_reduce(ReduceOp::MEAN, Tensor::scalar(2.5f));
  EXPECT_EQ(y.to_vector<float>()[0], 2.5f);
}

TEST(DefaultStrategyTest, ReduceInsideRunIsAnError) {
  EXPECT_THROW(get_strategy().run([](ReplicaContext&) {
    get_strategy().reduce(ReduceOp::SUM, Tensor::scalar(1.0f));
  }),
               FailedPreconditionError);
}

TEST(DefaultStrategyTest, ScopeOfTheDefaultStrategyChangesNothing) {
  Strategy& s = get_strategy();
  {
    Scope scope = s.scope();
    EXPECT_FALSE(has_strategy());
    EXPECT_EQ(get_strategy(), s);
    EXPECT_NE(get_replica_context(), nullptr);
  }
  EXPECT_FALSE(has_strategy());
}

TEST(DefaultStrategyTest, CreateErrors) {
  EXPECT_THROW(Strategy::create("no_such_strategy"), NotFoundError);
  EXPECT_THROW(Strategy::create("default", R"({"devices": ["cpu:0"]})"), InvalidArgumentError);
  EXPECT_THROW(Strategy::create("default", "not json"), InvalidArgumentError);
}

TEST(DefaultStrategyTest, FromConfigPassesTimeoutAndCrossDeviceOps) {
  Config config = Config::from_json(
      R"({"strategy": {"name": "default"}, "cross_device_ops": {"name": "ring"},
          "timeouts": {"collective_s": 5}})");
  Strategy s = Strategy::from_config(config);
  EXPECT_EQ(s.name(), "default");
  EXPECT_EQ(s, get_strategy());  // still the singleton
  EXPECT_EQ(s.num_replicas_in_sync(), 1);
  EXPECT_THROW(Strategy::from_config(Config::from_json(R"({"strategy": {"name": "nope_x"}})")),
               NotFoundError);
}

TEST(DefaultStrategyTest, DistributeValuesFromFunction) {
  PerReplica v = get_strategy().experimental_distribute_values_from_function(
      [](const ValueContext& vc) {
        return Tensor::scalar(static_cast<std::int32_t>(vc.replica_id_in_sync_group * 10 +
                                                        vc.num_replicas_in_sync));
      });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].to_vector<std::int32_t>()[0], 1);
}

TEST(DefaultStrategyTest, ComputeAverageLoss) {
  Tensor loss = Tensor::from_vector<float>({1, 2, 3, 4});
  EXPECT_FLOAT_EQ(compute_average_loss(loss).to_vector<float>()[0], 2.5f);
  EXPECT_FLOAT_EQ(compute_average_loss(loss, 8).to_vector<float>()[0], 1.25f);
  Tensor w = Tensor::from_vector<float>({1, 0, 0, 1});
  EXPECT_FLOAT_EQ(compute_average_loss(loss, std::nullopt, TensorView(w)).to_vector<float>()[0], 1.25f);
  EXPECT_FLOAT_EQ(compute_average_loss(loss, 2, TensorView(Tensor::scalar(2.0f))).to_vector<float>()[0], 10.0f);
  // Per-example weights broadcast over the other dimensions.
  Tensor loss2 = Tensor::from_vector<double>({1, 1, 2, 2}, {2, 2});
  Tensor w2 = Tensor::from_vector<double>({1, 3});
  EXPECT_DOUBLE_EQ(compute_average_loss(loss2, std::nullopt, TensorView(w2)).to_vector<double>()[0], 7.0);
  Tensor h = Tensor::from_doubles({1, 3}, {2}, DType::kFloat16);
  Tensor hl = compute_average_loss(h);
  EXPECT_EQ(hl.dtype(), DType::kFloat16);
  EXPECT_EQ(hl.to_doubles()[0], 2.0);
  EXPECT_THROW(compute_average_loss(Tensor::scalar(1.0f)), InvalidArgumentError);
  EXPECT_THROW(compute_average_loss(Tensor::from_vector<int>({1})), InvalidArgumentError);
  EXPECT_THROW(compute_average_loss(loss, 0), InvalidArgumentError);
  EXPECT_THROW(compute_average_loss(loss, std::nullopt, TensorView(Tensor::from_vector<float>({1, 2, 3}))),
               InvalidArgumentError);
  EXPECT_FLOAT_EQ(scale_regularization_loss(Tensor::from_vector<float>({1.5f, 2})).to_vector<float>()[0], 3.5f);
}

}  // namespace
}  // namespace strata
