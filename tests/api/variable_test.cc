// SPDX-License-Identifier: Apache-2.0
// Variables under the Default strategy (one replica, one copy).
#include <gtest/gtest.h>

#include "strata/strata.hpp"

namespace strata {
namespace {

VariableOptions opts(Synchronization s, Aggregation a, bool trainable = false) {
  return VariableOptions{"v", trainable, s, a};
}

TEST(VariableTest, CreatedOutsideAnyScopeBelongsToTheDefaultStrategy) {
  Variable v(Tensor::from_vector<float>({1, 2}), {"w"});
  EXPECT_EQ(v.name(), "w");
  EXPECT_EQ(v.dtype(), DType::kFloat32);
  EXPECT_EQ(v.shape(), std::vector<std::int64_t>{2});
  EXPECT_EQ(v.synchronization(), Synchronization::AUTO);
  EXPECT_EQ(v.aggregation(), Aggregation::NONE);
  EXPECT_TRUE(v.trainable());
  EXPECT_EQ(v.strategy(), get_strategy());
  EXPECT_TRUE(get_strategy().extended().variable_created_in_scope(v));
  EXPECT_EQ(v.value().to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(VariableTest, CrossReplicaUpdatesOutsideAnyScope) {
  Variable v(Tensor::from_vector<std::int64_t>({10, 20}));
  v.assign_add(Tensor::from_vector<std::int64_t>({1, 2}));
  EXPECT_EQ(v.read_value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{11, 22}));
  v.assign_sub(Tensor::from_vector<std::int64_t>({11, 2}));
  EXPECT_EQ(v.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 20}));
  v.assign(Tensor::from_vector<std::int64_t>({5, 5}));
  EXPECT_EQ(v.value().to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 5}));
  EXPECT_THROW(v.assign(Tensor::from_vector<std::int64_t>({1, 2, 3})), InvalidArgumentError);
  EXPECT_THROW(v.assign(Tensor::from_vector<float>({1, 2})), InvalidArgumentError);
}

TEST(VariableTest, Float16ArithmeticRoundsToHalf) {
  Variable v(Tensor::from_doubles({1.0}, {1}, DType::kFloat16));
  v.assign_add(Tensor::from_doubles({0.5}, {1}, DType::kFloat16));
  EXPECT_EQ(v.value().to_doubles()[0], 1.5);
}

TEST(VariableTest, ReplicaContextUpdateNeedsAnAggregation) {
  Variable none(Tensor::scalar(1.0f), opts(Synchronization::ON_WRITE, Aggregation::NONE));
  EXPECT_THROW(get_strategy().run([&](ReplicaContext&) { none.assign(Tensor::scalar(2.0f)); }),
               FailedPreconditionError);
  Variable mean(Tensor::scalar(1.0f), opts(Synchronization::ON_WRITE, Aggregation::MEAN));
  get_strategy().run([&](ReplicaContext&) { mean.assign_add(Tensor::scalar(2.0f)); });
  EXPECT_EQ(mean.value().to_vector<float>()[0], 3.0f);
}

TEST(VariableTest, OnReadVariables) {
  Variable sum(Tensor::scalar(0.0), opts(Synchronization::ON_READ, Aggregation::SUM));
  get_strategy().run([&](ReplicaContext&) {
    sum.assign_add(Tensor::scalar(4.0));
    EXPECT_EQ(sum.value().to_vector<double>()[0], 4.0);
  });
  EXPECT_EQ(sum.value().to_vector<double>()[0], 4.0);
  // Cross-replica: assign stores value / num_replicas; assign_add is refused.
  sum.assign(Tensor::scalar(6.0));
  EXPECT_EQ(sum.value().to_vector<double>()[0], 6.0);
  EXPECT_THROW(sum.assign_add(Tensor::scalar(1.0)), FailedPreconditionError);

  Variable none(Tensor::scalar(0.0), opts(Synchronization::ON_READ, Aggregation::NONE));
  EXPECT_THROW(none.value(), FailedPreconditionError);
  get_strategy().run([&](ReplicaContext&) { EXPECT_EQ(none.value().to_vector<double>()[0], 0.0); });
}

TEST(VariableTest, RejectedCombinations) {
  EXPECT_THROW(Variable(Tensor::scalar(1.0f), opts(Synchronization::ON_READ, Aggregation::SUM, true)),
               InvalidArgumentError);
  EXPECT_THROW(Variable(Tensor::scalar(1.0f), opts(Synchronization::NONE, Aggregation::NONE)),
               InvalidArgumentError);
}

TEST(VariableTest, CreatingInsideRunIsAnError) {
  try {
    get_strategy().run([](ReplicaContext&) { Variable v(Tensor::scalar(1.0f), {"inside"}); });
    FAIL() << "no error";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("scope()"), std::string::npos) << e.what();
  }
  // Inside merge_call (cross-replica context) it is allowed.
  get_strategy().run([](ReplicaContext& ctx) {
    ctx.merge_call([](Strategy&) {
      Variable v(Tensor::scalar(2.0f), {"merged"});
      EXPECT_EQ(v.value().to_vector<float>()[0], 2.0f);
    });
  });
}

TEST(VariableTest, ReadViewIsZeroCopyAndTracksUpdates) {
  Variable v(Tensor::from_vector<float>({1, 2, 3}));
  std::optional<TensorView> view = v.read_view();
  ASSERT_TRUE(view.has_value());  // the Default strategy provides variable_view
  EXPECT_EQ(view->numel(), 3);
  const float* p = view->data<float>();
  v.assign_add(Tensor::from_vector<float>({1, 1, 1}));
  EXPECT_EQ(v.read_view()->data<float>(), p);
  EXPECT_EQ(p[2], 4.0f);
}

TEST(VariableTest, MovedVariableKeepsWorking) {
  Variable a(Tensor::scalar(std::int32_t{3}));
  Variable b = std::move(a);
  EXPECT_EQ(b.value().to_vector<std::int32_t>()[0], 3);
  EXPECT_THROW(a.value(), FailedPreconditionError);  // NOLINT(bugprone-use-after-move)
}

// tf.distribute.ReduceOp("SUM") and ReduceOp.from_variable_aggregation
// (python/distribute/reduce_util.py): exact upper-case names only, and only
// SUM and MEAN aggregations convert.
TEST(VariableTest, ReduceOpFromNameAndFromAggregation) {
  EXPECT_EQ(reduce_op_from_name("SUM"), ReduceOp::SUM);
  EXPECT_EQ(reduce_op_from_name("MEAN"), ReduceOp::MEAN);
  EXPECT_STREQ(reduce_op_name(reduce_op_from_name("MEAN")), "MEAN");
  for (const char* bad : {"sum", "Mean", "MAX", ""}) EXPECT_THROW(reduce_op_from_name(bad), InvalidArgumentError) << bad;
  EXPECT_EQ(reduce_op_from_aggregation(Aggregation::SUM), ReduceOp::SUM);
  EXPECT_EQ(reduce_op_from_aggregation(Aggregation::MEAN), ReduceOp::MEAN);
  EXPECT_THROW(reduce_op_from_aggregation(Aggregation::NONE), InvalidArgumentError);
  EXPECT_THROW(reduce_op_from_aggregation(Aggregation::ONLY_FIRST_REPLICA), InvalidArgumentError);
}

}  // namespace
}  // namespace strata
