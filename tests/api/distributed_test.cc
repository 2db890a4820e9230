// SPDX-License-Identifier: Apache-2.0
// The C++ API over the in-tree strategy plugins (loaded from the build
// tree's lib/strata/plugins): mirrored with 1, 2 and 4 replicas, one_device
// and central_storage.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include "strata/strata.hpp"

namespace strata {
namespace {

struct ReplicaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string devices_json(int n) {
  std::string s = R"({"devices": [)";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string("\"cpu:") + std::to_string(i) + "\"";
  return s + "], \"timeout_s\": 30}";
}

float f(const Tensor& t) { return t.to_vector<float>().at(0); }

class MirroredTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { strategy_.emplace(Strategy::create("mirrored", devices_json(GetParam()))); }
  Strategy& s() { return *strategy_; }
  int n() const { return GetParam(); }
  std::optional<Strategy> strategy_;
};

TEST_P(MirroredTest, DescribesItsReplicas) {
  EXPECT_EQ(s().name(), "mirrored");
  EXPECT_EQ(s().num_replicas_in_sync(), n());
  EXPECT_EQ(s().num_local_replicas(), n());
  EXPECT_EQ(s().extended().worker_devices().size(), static_cast<std::size_t>(n()));
  EXPECT_TRUE(s().extended().is_chief());
}

TEST_P(MirroredTest, RunsEveryReplicaOnItsOwnThreadWithItsContext) {
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::set<int> ids;
  std::atomic<int> bad{0};
  s().run([&](ReplicaContext& ctx) {
    if (get_replica_context() != &ctx || get_strategy() != s() || !has_strategy() ||
        in_cross_replica_context() || ctx.num_replicas_in_sync() != n())
      ++bad;
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(std::this_thread::get_id());
    ids.insert(ctx.replica_id_in_sync_group());
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(ids.size(), static_cast<std::size_t>(n()));
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), n() - 1);
  if (n() > 1) {
    EXPECT_EQ(threads.size(), static_cast<std::size_t>(n()));
  }
  // Back in the Default context after run.
  EXPECT_FALSE(has_strategy());
}

TEST_P(MirroredTest, ScopeContexts) {
  {
    Scope scope = s().scope();
    EXPECT_TRUE(has_strategy());
    EXPECT_TRUE(in_cross_replica_context());
    EXPECT_EQ(get_replica_context(), nullptr);
    EXPECT_EQ(get_strategy(), s());
    Scope nested = get_strategy().scope();  // same strategy: fine
    EXPECT_EQ(get_strategy(), s());
  }
  EXPECT_FALSE(has_strategy());
  EXPECT_EQ(get_strategy().name(), "default");
}

TEST_P(MirroredTest, MixingScopesIsAnError) {
  Strategy other = Strategy::create("mirrored", devices_json(1));
  Scope scope = s().scope();
  try {
    Scope bad = other.scope();
    FAIL() << "no error";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("Mixing different strategies"), std::string::npos);
  }
  EXPECT_EQ(get_strategy(), s());
}

TEST_P(MirroredTest, UserExceptionPropagatesWithItsType) {
  // The failing replica throws before the collective; the others must be
  // released (ABORTED) rather than hang, and run rethrows the user's error.
  EXPECT_THROW(s().run([&](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == n() - 1) throw ReplicaFailure("replica failed");
    ctx.all_reduce(ReduceOp::SUM, Tensor::scalar(1.0f));
  }),
               ReplicaFailure);
  // Still usable.
  PerReplica ok = s().run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::SUM, Tensor::scalar(1.0f)); });
  EXPECT_EQ(f(ok[0]), static_cast<float>(n()));
}

TEST_P(MirroredTest, NestedRunIsAnError) {
  EXPECT_THROW(s().run([&](ReplicaContext&) { s().run([](ReplicaContext&) {}); }), FailedPreconditionError);
}

TEST_P(MirroredTest, ReduceWithoutAxis) {
  PerReplica v = s().run([](ReplicaContext& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    return Tensor::from_vector<float>({id, 1});
  });
  ASSERT_EQ(v.size(), static_cast<std::size_t>(n()));
  const float sum_ids = static_cast<float>(n() * (n() - 1) / 2);
  EXPECT_EQ(s().reduce(ReduceOp::SUM, v).to_vector<float>(), (std::vector<float>{sum_ids, float(n())}));
  EXPECT_EQ(s().reduce(ReduceOp::MEAN, v).to_vector<float>(), (std::vector<float>{sum_ids / n(), 1}));
}

TEST_P(MirroredTest, ReduceAlongAnAxisWithUnevenBatches) {
  // Replica r holds r + 1 rows of [r, 1].
  PerReplica v = s().run([](ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<double> rows;
    for (int i = 0; i <= r; ++i) {
      rows.push_back(r);
      rows.push_back(1);
    }
    return Tensor::from_vector<double>(rows, {r + 1, 2});
  });
  double col0 = 0, rows = 0;
  for (int r = 0; r < n(); ++r) {
    col0 += r * (r + 1.0);
    rows += r + 1;
  }
  EXPECT_EQ(s().reduce(ReduceOp::SUM, v, 0).to_vector<double>(), (std::vector<double>{col0, rows}));
  // MEAN divides by the global number of rows, not by the replica count.
  EXPECT_EQ(s().reduce(ReduceOp::MEAN, v, 0).to_vector<double>(), (std::vector<double>{col0 / rows, 1}));
  EXPECT_THROW(s().reduce(ReduceOp::SUM, v, 2), InvalidArgumentError);
}

// Several axes at once: each replica sums over all of them, and MEAN
// divides by every element they held on all replicas (tf.reduce_mean's list
// of axes applied to the concatenation of the replicas' values).
TEST_P(MirroredTest, ReduceOverSeveralAxes) {
  PerReplica v = s().run([](ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    std::vector<double> x;
    for (int i = 0; i < (g + 1) * 3 * 2; ++i) x.push_back(g + 0.5 * i);
    return Tensor::from_vector(x, {g + 1, 3, 2});
  });
  double total[2] = {0, 0}, count = 0;
  for (int g = 0; g < n(); ++g)
    for (int i = 0; i < (g + 1) * 3 * 2; ++i) {
      total[i % 2] += g + 0.5 * i;
      count += 0.5;  // each of the two kept entries sees half the elements
    }
  const auto sum = s().reduce(ReduceOp::SUM, v, std::vector<int>{0, -2}).to_vector<double>();
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_DOUBLE_EQ(sum[0], total[0]);
  EXPECT_DOUBLE_EQ(sum[1], total[1]);
  const auto mean = s().reduce(ReduceOp::MEAN, v, std::vector<int>{1, 0}).to_vector<double>();
  EXPECT_DOUBLE_EQ(mean[0], total[0] / count);
  EXPECT_DOUBLE_EQ(mean[1], total[1] / count);
  // One axis in a list is the single-axis reduce.
  EXPECT_EQ(s().reduce(ReduceOp::MEAN, v, std::vector<int>{0}).to_vector<double>(),
            s().reduce(ReduceOp::MEAN, v, 0).to_vector<double>());
  EXPECT_THROW(s().reduce(ReduceOp::SUM, v, std::vector<int>{0, 0}), InvalidArgumentError);
  EXPECT_THROW(s().reduce(ReduceOp::SUM, v, std::vector<int>{}), InvalidArgumentError);
  EXPECT_THROW(s().reduce(ReduceOp::SUM, v, std::vector<int>{3}), InvalidArgumentError);
}

TEST_P(MirroredTest, ReduceOfANonDistributedValue) {
  Tensor plain = Tensor::from_vector<float>({2, 4});
  EXPECT_EQ(s().reduce(ReduceOp::MEAN, plain).to_vector<float>(), (std::vector<float>{2, 4}));
  if (n() == 1) {
    EXPECT_EQ(s().reduce(ReduceOp::SUM, plain).to_vector<float>(), (std::vector<float>{2, 4}));
  } else {
    EXPECT_THROW(s().reduce(ReduceOp::SUM, plain), InvalidArgumentError);
  }
  // With an axis the value stands for the same value on every replica.
  EXPECT_EQ(f(s().reduce(ReduceOp::SUM, plain, 0)), 6.0f * n());
  EXPECT_EQ(f(s().reduce(ReduceOp::MEAN, plain, 0)), 3.0f);
}

TEST_P(MirroredTest, GatherAndLocalResults) {
  PerReplica v = s().run([](ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return Tensor::from_vector<std::int32_t>(std::vector<std::int32_t>(static_cast<std::size_t>(r + 1), r));
  });
  std::vector<std::int32_t> expect;
  for (int r = 0; r < n(); ++r) expect.insert(expect.end(), static_cast<std::size_t>(r + 1), r);
  EXPECT_EQ(s().gather(v, 0).to_vector<std::int32_t>(), expect);
  std::vector<Tensor> local = s().experimental_local_results(v);
  ASSERT_EQ(local.size(), static_cast<std::size_t>(n()));
  for (int i = 0; i < n(); ++i) EXPECT_EQ(local[static_cast<std::size_t>(i)].numel(), v[static_cast<std::size_t>(i)].numel());
}

TEST_P(MirroredTest, ReplicaAllReduceAllGather) {
  const float sum_ids = static_cast<float>(n() * (n() - 1) / 2);
  std::atomic<int> bad{0};
  s().run([&](ReplicaContext& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    if (f(ctx.all_reduce(ReduceOp::SUM, Tensor::scalar(id))) != sum_ids) ++bad;
    if (f(ctx.all_reduce(ReduceOp::MEAN, Tensor::scalar(id))) != sum_ids / n()) ++bad;
    std::vector<Tensor> batch;
    batch.push_back(Tensor::scalar(id));
    batch.push_back(Tensor::from_vector<double>({1, 2}));
    std::vector<Tensor> out = ctx.all_reduce(ReduceOp::SUM, batch);
    if (f(out[0]) != sum_ids || out[1].to_vector<double>() != std::vector<double>{1.0 * n(), 2.0 * n()}) ++bad;
    ctx.all_reduce_in_place(ReduceOp::SUM, batch);
    if (f(batch[0]) != sum_ids) ++bad;
    std::vector<float> user = {id};  // zero-copy from user memory
    ctx.all_reduce_in_place(ReduceOp::SUM, std::vector<TensorView>{TensorView(user.data(), {1}, DType::kFloat32)});
    if (user[0] != sum_ids) ++bad;
    Tensor g = ctx.all_gather(Tensor::from_vector<float>({id, id}), 0);
    std::vector<float> expect;
    for (int r = 0; r < n(); ++r) expect.insert(expect.end(), {float(r), float(r)});
    if (g.to_vector<float>() != expect) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(MirroredTest, MergeCall) {
  std::atomic<int> merges{0}, bad{0};
  PerReplica out = s().run([&](ReplicaContext& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    ctx.merge_call([&](Strategy& st) {
      ++merges;
      if (!in_cross_replica_context() || get_replica_context() != nullptr || st != s()) ++bad;
    });
    Tensor total = ctx.merge_call(
        [&](Strategy& st, const PerReplica& args) {
          if (args.size() != static_cast<std::size_t>(n())) ++bad;
          return st.reduce(ReduceOp::SUM, args);
        },
        Tensor::scalar(id));
    Tensor mine = ctx.merge_call_per_replica(
        [](Strategy&, const PerReplica& args) {
          std::vector<Tensor> doubled;
          for (const Tensor& a : args.values()) doubled.push_back(Tensor::scalar(2 * f(a)));
          return PerReplica(std::move(doubled));
        },
        Tensor::scalar(id));
    if (f(mine) != 2 * id) ++bad;
    if (get_replica_context() != &ctx) ++bad;
    return total;
  });
  EXPECT_EQ(merges.load(), 1);
  EXPECT_EQ(bad.load(), 0);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(f(out[i]), static_cast<float>(n() * (n() - 1) / 2));
}

TEST_P(MirroredTest, ExceptionInMergeCallPropagates) {
  EXPECT_THROW(s().run([](ReplicaContext& ctx) { ctx.merge_call([](Strategy&) { throw ReplicaFailure("merge"); }); }),
               ReplicaFailure);
}

TEST_P(MirroredTest, RunWithPerReplicaArgsAndValuesFromFunction) {
  PerReplica in = s().experimental_distribute_values_from_function([](const ValueContext& vc) {
    return Tensor::scalar(static_cast<float>(vc.replica_id_in_sync_group * 100 + vc.num_replicas_in_sync));
  });
  ASSERT_EQ(in.size(), static_cast<std::size_t>(n()));
  PerReplica out = s().run([](ReplicaContext& ctx, const Tensor& arg) {
    EXPECT_EQ(f(arg), static_cast<float>(ctx.replica_id_in_sync_group() * 100 + ctx.num_replicas_in_sync()));
    return Tensor::scalar(f(arg) + 1);
  },
                           in);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(f(out[i]), f(in[i]) + 1);
  PerReplica wrong;
  if (n() > 1) {
    EXPECT_THROW(s().run([](ReplicaContext&, const Tensor&) {}, wrong), InvalidArgumentError);
  }
}

TEST_P(MirroredTest, ExtendedReduceToAndBroadcast) {
  PerReplica v = s().run([](ReplicaContext& ctx) { return Tensor::scalar(float(ctx.replica_id_in_sync_group() + 1)); });
  const float sum = static_cast<float>(n() * (n() + 1) / 2);
  EXPECT_EQ(f(s().extended().reduce_to(ReduceOp::SUM, v)), sum);
  auto both = s().extended().batch_reduce_to(ReduceOp::MEAN, {&v, &v});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(f(both[1]), sum / n());
  Mirrored m = s().extended().broadcast_to(Tensor::scalar(9.0f));
  ASSERT_EQ(m.size(), static_cast<std::size_t>(n()));
  EXPECT_EQ(f(m[m.size() - 1]), 9.0f);
  EXPECT_EQ(f(s().reduce(ReduceOp::SUM, m)), 9.0f * n());
}

TEST_P(MirroredTest, OnWriteVariables) {
  Variable outside(Tensor::scalar(1.0f));
  Scope scope = s().scope();
  Variable mean(Tensor::scalar(1.0f), {"mean", true, Synchronization::ON_WRITE, Aggregation::MEAN});
  Variable sum(Tensor::scalar(0.0f), {"sum", true, Synchronization::AUTO, Aggregation::SUM});
  Variable first(Tensor::scalar(0.0f), {"first", true, Synchronization::ON_WRITE, Aggregation::ONLY_FIRST_REPLICA});
  Variable none(Tensor::scalar(0.0f), {"none", true, Synchronization::ON_WRITE, Aggregation::NONE});
  EXPECT_TRUE(s().extended().variable_created_in_scope(mean));
  EXPECT_FALSE(s().extended().variable_created_in_scope(outside));
  std::atomic<int> bad{0};
  s().run([&](ReplicaContext& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    mean.assign_add(Tensor::scalar(id));
    sum.assign_add(Tensor::scalar(id));
    first.assign(Tensor::scalar(id + 5));
    // Every replica's copy reflects the aggregate.
    if (f(mean.value()) != 1.0f + static_cast<float>(n() - 1) / 2) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_FLOAT_EQ(f(mean.value()), 1.0f + static_cast<float>(n() - 1) / 2);
  EXPECT_EQ(f(sum.value()), static_cast<float>(n() * (n() - 1) / 2));
  EXPECT_EQ(f(first.value()), 5.0f);
  EXPECT_THROW(s().run([&](ReplicaContext&) { none.assign(Tensor::scalar(1.0f)); }), FailedPreconditionError);
  // Cross-replica assign reaches every copy.
  none.assign(Tensor::scalar(3.0f));
  s().run([&](ReplicaContext&) {
    if (f(none.value()) != 3.0f) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
}

// Follows tensorflow/python/distribute/vars_test.py (OnWriteVariableSync:
// testAssign*/"assign in replica context with SUM does not make sense"),
// values.py's _on_write_update_replica (MEAN of a non-float variable) and
// cross_device_ops.reduce_non_distributed_value (SUM of a value that is the
// same object on every replica raises; with one replica it is the value).
TEST_P(MirroredTest, OnWriteAggregationRefusesWhatTfDistributeRefuses) {
  Scope scope = s().scope();
  Variable sum(Tensor::scalar(1.0f), {"sum", true, Synchronization::ON_WRITE, Aggregation::SUM});
  Variable imean(Tensor::scalar(std::int32_t{4}), {"imean", true, Synchronization::ON_WRITE, Aggregation::MEAN});
  Variable fmean(Tensor::scalar(4.0f), {"fmean", true, Synchronization::ON_WRITE, Aggregation::MEAN});
  const Tensor shared = Tensor::scalar(2.0f);
  if (n() == 1) {
    // One replica in sync: SUM, MEAN of the single value is the value.
    s().run([&](ReplicaContext&) {
      sum.assign(shared);
      sum.assign_add(shared);
      imean.assign_add(Tensor::scalar(std::int32_t{3}));
    });
    EXPECT_EQ(f(sum.value()), 4.0f);
    EXPECT_EQ(imean.value().to_vector<std::int32_t>()[0], 7);
    return;
  }
  try {
    s().run([&](ReplicaContext& ctx) { sum.assign(Tensor::scalar(static_cast<float>(ctx.replica_id_in_sync_group()))); });
    ADD_FAILURE() << "assign of an ON_WRITE SUM variable in replica context must be refused";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("aggregation is SUM"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'sum'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f(sum.value()), 1.0f) << "a refused assign must leave the variable as it was";
  // The same tensor passed by every replica is not a per-replica value.
  EXPECT_THROW(s().run([&](ReplicaContext&) { sum.assign_add(shared); }), InvalidArgumentError);
  EXPECT_EQ(f(sum.value()), 1.0f);
  // Per-replica values are summed.
  s().run([&](ReplicaContext&) { sum.assign_add(Tensor::scalar(2.0f)); });
  EXPECT_EQ(f(sum.value()), 1.0f + 2.0f * n());
  // MEAN of a non-float variable in replica context: refused; in
  // cross-replica context an update applies as given.
  EXPECT_THROW(s().run([&](ReplicaContext&) { imean.assign_add(Tensor::scalar(std::int32_t{1})); }),
               InvalidArgumentError);
  imean.assign_add(Tensor::scalar(std::int32_t{1}));
  EXPECT_EQ(imean.value().to_vector<std::int32_t>()[0], 5);
  // A float MEAN still works after the refusals (the strategy is usable).
  s().run([&](ReplicaContext& ctx) { fmean.assign(Tensor::scalar(static_cast<float>(ctx.replica_id_in_sync_group()))); });
  EXPECT_FLOAT_EQ(f(fmean.value()), static_cast<float>(n() - 1) / 2);
}

// tf.distribute reduces tf.IndexedSlices by gathering rows (cross_device_ops
// CollectiveAllReduce and ReductionToOneDevice: values and indices
// concatenated, MEAN scaling the values), never by densifying; the dense
// form must equal the sum of every replica's dense form.
TEST_P(MirroredTest, SparseRowsAreGatheredNotDensified) {
  std::vector<std::vector<std::int64_t>> idx(static_cast<std::size_t>(n()));
  std::vector<std::vector<float>> dense(static_cast<std::size_t>(n()));
  auto slices_of = [&](int g) {
    return IndexedSlices{Tensor::from_vector(std::vector<float>{1.0f + g, 2.0f, 3.0f, 4.0f * g}, {2, 2}),
                         Tensor::from_vector(std::vector<std::int64_t>{g % 3, 2}, {2}),
                         {3, 2}};
  };
  std::atomic<int> bad{0};
  s().run([&](ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    IndexedSlices sum = ctx.all_reduce(ReduceOp::SUM, slices_of(g));
    IndexedSlices mean = ctx.all_reduce(ReduceOp::MEAN, slices_of(g));
    idx[static_cast<std::size_t>(g)] = sum.indices.to_vector<std::int64_t>();
    dense[static_cast<std::size_t>(g)] = sum.to_dense().to_vector<float>();
    if (mean.values.shape() != std::vector<std::int64_t>{2 * n(), 2} ||
        std::fabs(mean.values.to_vector<float>()[0] - 1.0f / static_cast<float>(n())) > 1e-6f)
      ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
  std::vector<std::int64_t> want_idx;
  std::vector<float> want_dense(6, 0.0f);
  for (int g = 0; g < n(); ++g) {
    const IndexedSlices one = slices_of(g);
    for (auto i : one.indices.to_vector<std::int64_t>()) want_idx.push_back(i);
    const auto d = one.to_dense().to_vector<float>();
    for (std::size_t k = 0; k < d.size(); ++k) want_dense[k] += d[k];
  }
  for (int g = 0; g < n(); ++g) {
    EXPECT_EQ(idx[static_cast<std::size_t>(g)], want_idx) << "replica " << g;
    EXPECT_EQ(dense[static_cast<std::size_t>(g)], want_dense) << "replica " << g;
  }
  // Cross-replica: one IndexedSlices per local replica.
  std::vector<IndexedSlices> per;
  for (int g = 0; g < n(); ++g) per.push_back(slices_of(g));
  IndexedSlices r = s().reduce(ReduceOp::SUM, per);
  EXPECT_EQ(r.indices.to_vector<std::int64_t>(), want_idx);
  EXPECT_EQ(r.to_dense().to_vector<float>(), want_dense);
  // Bad input names the problem.
  IndexedSlices out_of_range = slices_of(0);
  out_of_range.indices = Tensor::from_vector(std::vector<std::int64_t>{0, 3}, {2});
  EXPECT_THROW(out_of_range.to_dense(), InvalidArgumentError);
  IndexedSlices float_indices = slices_of(0);
  float_indices.indices = Tensor::from_vector(std::vector<float>{0, 1}, {2});
  EXPECT_THROW(s().run([&](ReplicaContext& ctx) { ctx.all_reduce(ReduceOp::SUM, float_indices); }),
               InvalidArgumentError);
  if (n() > 1) {
    // Replicas that disagree on the dense shape.
    EXPECT_THROW(s().run([&](ReplicaContext& ctx) {
      IndexedSlices mine = slices_of(0);
      mine.dense_shape[0] = 3 + ctx.replica_id_in_sync_group();
      ctx.all_reduce(ReduceOp::SUM, mine);
    }),
                 InvalidArgumentError);
  }
  per.pop_back();
  EXPECT_THROW(s().reduce(ReduceOp::SUM, per), InvalidArgumentError);
}

TEST_P(MirroredTest, OnReadVariables) {
  Scope scope = s().scope();
  auto make = [](Aggregation a) {
    return Variable(Tensor::scalar(0.0), {"r", false, Synchronization::ON_READ, a});
  };
  Variable sum = make(Aggregation::SUM), mean = make(Aggregation::MEAN),
           first = make(Aggregation::ONLY_FIRST_REPLICA), none = make(Aggregation::NONE);
  std::atomic<int> bad{0};
  s().run([&](ReplicaContext& ctx) {
    const double v = ctx.replica_id_in_sync_group() + 1.0;
    for (Variable* var : {&sum, &mean, &first, &none}) var->assign(Tensor::scalar(v));
    // In replica context a read is the replica's own copy.
    if (sum.value().to_vector<double>()[0] != v) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
  const double total = n() * (n() + 1) / 2.0;
  EXPECT_EQ(sum.value().to_vector<double>()[0], total);
  EXPECT_EQ(mean.value().to_vector<double>()[0], total / n());
  EXPECT_EQ(first.value().to_vector<double>()[0], 1.0);
  EXPECT_THROW(none.value(), FailedPreconditionError);
  // Cross-replica assign of a SUM variable divides among the copies.
  sum.assign(Tensor::scalar(8.0));
  EXPECT_DOUBLE_EQ(sum.value().to_vector<double>()[0], 8.0);
  EXPECT_THROW(sum.assign_add(Tensor::scalar(1.0)), FailedPreconditionError);
  EXPECT_THROW(Variable(Tensor::scalar(0.0), {"t", true, Synchronization::ON_READ, Aggregation::SUM}),
               InvalidArgumentError);
  EXPECT_THROW(Variable(Tensor::scalar(0.0), {"n", false, Synchronization::NONE, Aggregation::NONE}),
               InvalidArgumentError);
}

TEST_P(MirroredTest, VariableCreationInsideRunIsAnError) {
  Scope scope = s().scope();
  EXPECT_THROW(s().run([](ReplicaContext&) { Variable v(Tensor::scalar(1.0f)); }), FailedPreconditionError);
}

TEST_P(MirroredTest, LossHelpers) {
  PerReplica losses = s().run([](ReplicaContext&) {
    Tensor l = compute_average_loss(Tensor::from_vector<float>({1, 3}));
    Tensor r = scale_regularization_loss(Tensor::scalar(2.0f));
    return Tensor::from_vector<float>({f(l), f(r)});
  });
  for (std::size_t i = 0; i < losses.size(); ++i)
    EXPECT_EQ(losses[i].to_vector<float>(), (std::vector<float>{4.0f / (2 * n()), 2.0f / n()}));
  // Summing the per-replica scaled losses gives the global mean.
  EXPECT_FLOAT_EQ(s().reduce(ReduceOp::SUM, losses).to_vector<float>()[0], 2.0f);
  Scope scope = s().scope();
  EXPECT_THROW(compute_average_loss(Tensor::from_vector<float>({1, 3})), FailedPreconditionError);
  EXPECT_FLOAT_EQ(f(compute_average_loss(Tensor::from_vector<float>({1, 3}), 4)), 1.0f);
  EXPECT_THROW(scale_regularization_loss(Tensor::scalar(1.0f)), FailedPreconditionError);
}

TEST_P(MirroredTest, StrategyOutlivesItsHandleWhileVariablesLive) {
  std::optional<Variable> v;
  {
    Strategy local = Strategy::create("mirrored", devices_json(n()));
    Scope scope = local.scope();
    v.emplace(Tensor::scalar(4.0f), VariableOptions{"kept"});
  }
  EXPECT_EQ(f(v->value()), 4.0f);
  EXPECT_EQ(v->strategy().num_replicas_in_sync(), n());
}

INSTANTIATE_TEST_SUITE_P(Replicas, MirroredTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

TEST(OneDeviceTest, Basics) {
  Strategy s = Strategy::create("one_device", R"({"device": "cpu:0"})");
  EXPECT_EQ(s.num_replicas_in_sync(), 1);
  Scope scope = s.scope();
  Variable v(Tensor::scalar(1.0f), {"v", true, Synchronization::ON_WRITE, Aggregation::SUM});
  PerReplica out = s.run([&](ReplicaContext& ctx) {
    EXPECT_EQ(get_replica_context(), &ctx);
    v.assign_add(Tensor::scalar(2.0f));
    return ctx.all_reduce(ReduceOp::SUM, Tensor::scalar(5.0f));
  });
  EXPECT_EQ(f(s.reduce(ReduceOp::SUM, out)), 5.0f);
  EXPECT_EQ(f(v.value()), 3.0f);
}

TEST(CentralStorageTest, Basics) {
  Strategy s = Strategy::create("central_storage", devices_json(2));
  EXPECT_EQ(s.num_replicas_in_sync(), 2);
  EXPECT_EQ(s.extended().parameter_devices().size(), 1u);
  Scope scope = s.scope();
  Variable v(Tensor::scalar(1.0f), {"v", true, Synchronization::ON_WRITE, Aggregation::MEAN});
  PerReplica out = s.run([&](ReplicaContext& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    v.assign_add(Tensor::scalar(id * 2));  // mean of {0, 2} = 1
    return ctx.all_reduce(ReduceOp::SUM, Tensor::scalar(id));
  });
  EXPECT_EQ(f(v.value()), 2.0f);
  EXPECT_EQ(f(out[0]), 1.0f);
  EXPECT_EQ(f(s.reduce(ReduceOp::MEAN, out)), 1.0f);
}

}  // namespace
}  // namespace strata
