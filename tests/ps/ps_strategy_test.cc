// SPDX-License-Identifier: Apache-2.0
// The parameter_server strategy over real processes (strata-run --chief 1
// --workers 2 --ps 2 -- this binary --auto SCENARIO): variables created
// under the strategy's scope on the chief live on the ps tasks (round robin,
// sharded by the strategy's variable_partitioner); a worker attaches to them
// in its scheduled function and updates them from every local replica inside
// strategy.run, aggregated as tf.distribute's ParameterServerStrategy does
// (AggregatingVariable: SUM adds, MEAN averages, ONLY_FIRST_REPLICA takes
// replica 0's value, each applied once per run); strategy.run + reduce on a
// worker; and the errors TF raises, here with the fix named. Also
// strata-train --strategy parameter_server: it refuses to run without ps
// tasks, and its asynchronous training reaches one_device's loss.
//
// The chief prints one "RESULT {json}" line; the test checks it. Every child
// is reaped with a deadline (strata-run stops its own children).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "strata/config.hpp"
#include "strata/coordinator.hpp"
#include "strata/plugin_host.hpp"
#include "strata/strata.hpp"
#include "test_support.h"

namespace {

using nlohmann::json;

constexpr const char* kStrategyOptions =
    R"({"devices": ["cpu:0", "cpu:1"], "variable_partitioner": {"name": "fixed_shards", "num_shards": 2}})";

// ---- the worker side ----

// Created on the first closure (closures of one worker run one at a time),
// destroyed when the server stops: its replica threads must end before the
// process does (LSan reports the thread-local state of threads still alive).
std::optional<strata::Strategy> g_worker_strategy;

strata::Strategy& worker_strategy() {
  if (!g_worker_strategy) g_worker_strategy.emplace(strata::Strategy::create("parameter_server", kStrategyOptions));
  return *g_worker_strategy;
}

std::vector<strata::Variable> attach(const strata::Args& a, std::size_t first, std::size_t count) {
  std::vector<strata::Variable> v;
  auto scope = worker_strategy().scope();
  for (std::size_t i = first; i < first + count; ++i) v.emplace_back(strata::get_arg<strata::RemoteVariable>(a, i));
  return v;
}

strata::Tensor floats(std::vector<float> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return strata::Tensor::from_vector(v, {n});
}

// Args: sum, mean, first, first_assign, mean_assign. Replica k (0, 1) adds
// (k+1)*[1,2,3] to the first three and assigns (k+1)*[1,1,1] to the others.
STRATA_REGISTER_FUNCTION("agg_step", [](const strata::Args& a) -> strata::Value {
  std::vector<strata::Variable> v = attach(a, 0, 5);
  strata::Strategy& s = worker_strategy();
  s.run([&](strata::ReplicaContext& ctx) {
    const float k = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    const strata::Tensor d = floats({k, 2 * k, 3 * k});
    v[0].assign_add(d);
    v[1].assign_add(d);
    v[2].assign_add(d);
    v[3].assign(floats({k, k, k}));
    v[4].assign(floats({k, k, k}));
  });
  return strata::Value(static_cast<std::int64_t>(s.num_replicas_in_sync()));
});

// Args: var. Replica k returns (k+1) * var[0] (read in replica context);
// the result is [SUM, MEAN] of those over the replicas.
STRATA_REGISTER_FUNCTION("run_and_reduce", [](const strata::Args& a) -> strata::Value {
  std::vector<strata::Variable> v = attach(a, 0, 1);
  strata::Strategy& s = worker_strategy();
  strata::PerReplica per = s.run([&](strata::ReplicaContext& ctx) {
    const float k = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    return floats({k * v[0].value().to_vector<float>()[0]});
  });
  const float sum = s.reduce(strata::ReduceOp::SUM, per).to_vector<float>()[0];
  const float mean = s.reduce(strata::ReduceOp::MEAN, per).to_vector<float>()[0];
  return strata::Value(floats({sum, mean}));
});

// Args: a NONE-aggregation var, updated from both replicas (TF raises).
STRATA_REGISTER_FUNCTION("none_update", [](const strata::Args& a) -> strata::Value {
  std::vector<strata::Variable> v = attach(a, 0, 1);
  worker_strategy().run([&](strata::ReplicaContext&) { v[0].assign_add(floats({1, 1, 1})); });
  return strata::Value();
});

// Misuse on a worker; returns what each attempt raised.
STRATA_REGISTER_FUNCTION("misuse", [](const strata::Args& a) -> strata::Value {
  json out;
  try {  // attach outside the strategy's scope: the Default strategy keeps variables locally
    strata::Variable v(strata::get_arg<strata::RemoteVariable>(a, 0));
    out["attach_outside_scope"] = "no error";
  } catch (const strata::Error& e) {
    out["attach_outside_scope"] = std::string(e.code_name()) + ": " + e.what();
  }
  try {  // create a variable on a worker: only the chief's coordinator places variables
    auto scope = worker_strategy().scope();
    strata::Variable v(floats({1}));
    out["create_on_worker"] = "no error";
  } catch (const strata::Error& e) {
    out["create_on_worker"] = std::string(e.code_name()) + ": " + e.what();
  }
  return strata::Value(out.dump());
});

void load_config() {
  strata::Config cfg;
  cfg.apply_env();
  strata::PluginHost::global().set_config(cfg.json());
}

int serve() {
  load_config();
  strata::Server s = strata::Server::from_env();
  s.join();
  g_worker_strategy.reset();
  return 0;
}

std::string err_text(const strata::Error& e) { return std::string(e.code_name()) + ": " + e.what(); }

json values(const strata::Variable& v) { return v.value().to_vector<float>(); }

int coordinate(const std::string& scenario) {
  load_config();
  json out;
  try {
    if (scenario != "aggregation") throw std::runtime_error("unknown scenario " + scenario);
    strata::Strategy strategy = strata::Strategy::create("parameter_server", kStrategyOptions);
    out["num_replicas_in_sync"] = strategy.num_replicas_in_sync();
    try {  // no ClusterCoordinator yet: nowhere to place it
      auto scope = strategy.scope();
      strata::Variable v(floats({1}), {"early"});
      out["before_coordinator"] = "no error";
    } catch (const strata::Error& e) {
      out["before_coordinator"] = err_text(e);
    }
    strata::CoordinatorOptions co;
    co.join_timeout_s = 120;
    co.op_timeout_s = 30;
    strata::ClusterCoordinator c(co);
    using strata::Aggregation;
    using strata::Synchronization;
    std::vector<strata::Variable> vars;
    {
      auto scope = strategy.scope();
      auto make = [&](const char* name, std::vector<float> init, Aggregation agg) {
        vars.emplace_back(floats(std::move(init)), strata::VariableOptions{name, true, Synchronization::ON_WRITE, agg});
      };
      make("sum", {10, 20, 30}, Aggregation::SUM);
      make("mean", {10, 20, 30}, Aggregation::MEAN);
      make("first", {10, 20, 30}, Aggregation::ONLY_FIRST_REPLICA);
      make("first_assign", {0, 0, 0}, Aggregation::ONLY_FIRST_REPLICA);
      make("mean_assign", {0, 0, 0}, Aggregation::MEAN);
      make("none", {0, 0, 0}, Aggregation::NONE);
      try {
        strata::Variable bad(floats({1}), {"bad_agg", true, Synchronization::ON_WRITE, static_cast<Aggregation>(7)});
        out["unknown_aggregation"] = "no error";
      } catch (const strata::Error& e) {
        out["unknown_aggregation"] = err_text(e);
      }
      try {
        strata::Variable bad(floats({1}), {"bad_sync", true, Synchronization::ON_READ, Aggregation::SUM});
        out["on_read_trainable"] = "no error";
      } catch (const strata::Error& e) {
        out["on_read_trainable"] = err_text(e);
      }
    }
    // Placement: every [3] variable is split 2 + 1 rows; shards go round robin.
    for (auto& v : vars) {
      const strata::RemoteVariable r = v.remote();
      json shards;
      for (std::int64_t i = 0; i < r.num_shards(); ++i) shards.push_back(r.shard_ps_task(i));
      out["shards"][v.name()] = shards;
    }
    strata::Variable local(floats({5}), {"local"});  // outside the scope: the Default strategy's
    try {
      c.schedule_fn("run_and_reduce", local.remote());
      out["outside_scope"] = "no error";
    } catch (const strata::Error& e) {
      out["outside_scope"] = err_text(e);
    }
    std::vector<strata::RemoteValue> runs;
    for (int w = 0; w < c.num_workers(); ++w)
      runs.push_back(c.schedule_fn("agg_step", vars[0].remote(), vars[1].remote(), vars[2].remote(),
                                   vars[3].remote(), vars[4].remote()));
    c.join();
    for (auto& r : runs) out["worker_replicas"].push_back(std::get<std::int64_t>(c.fetch(r)));
    for (auto& v : vars) out["values"][v.name()] = values(v);
    auto rr = c.schedule_fn("run_and_reduce", vars[0].remote());
    out["run_and_reduce"] = c.fetch(rr).index() == 4 ? json(std::get<strata::Tensor>(c.fetch(rr)).to_vector<float>())
                                                      : json("not a tensor");
    c.schedule_fn("none_update", vars[5].remote());
    try {
      c.join();
      out["none_update"] = "no error";
    } catch (const strata::Error& e) {
      out["none_update"] = err_text(e);
    }
    out["none_after"] = values(vars[5]);
    auto m = c.schedule_fn("misuse", vars[0].remote());
    c.join();
    out["misuse"] = json::parse(std::get<std::string>(c.fetch(m)));
  } catch (const strata::Error& e) {
    out["fatal"] = err_text(e);
  } catch (const std::exception& e) {
    out["fatal"] = e.what();
  }
  std::printf("RESULT %s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// ---- the test side ----

std::string self_path() { return strata::test::self_exe(); }

// Runs `argv` with the test environment plus `env` (no TF_CONFIG unless
// `env` has it) to its end within `deadline_s`; {exit code, output}.
std::pair<int, std::string> run_to_end(const std::vector<std::string>& argv, std::map<std::string, std::string> env,
                                       int deadline_s) {
  env.emplace("STRATA_PLUGIN_PATH", STRATA_PS_PLUGIN_DIR);
  env.emplace("STRATA_LOG_LEVEL", "warn");
  env.emplace("STRATA_RENDEZVOUS_TIMEOUT_S", "60");
  return strata::test::run_to_end(argv, env, deadline_s, {"TF_CONFIG", "STRATA_CONFIG"});
}

json chief_result(const std::string& log) {
  const auto p = log.find("[chief 0] RESULT ");
  if (p == std::string::npos) return json();
  return json::parse(log.substr(p + 17, log.find('\n', p) - p - 17), nullptr, false);
}

bool has(const json& j, const std::string& text) {
  return j.is_string() && j.get<std::string>().find(text) != std::string::npos;
}

TEST(PsStrategyTest, AggregationOfReplicaUpdatesRunReduceAndErrorsFollowTfDistribute) {
  const auto [code, log] = run_to_end({STRATA_RUN_BIN, "--timeout", "200", "--chief", "1", "--workers", "2", "--ps",
                                       "2", "--", self_path(), "--auto", "aggregation"},
                                      {}, 240);
  ASSERT_EQ(code, 0) << log;
  const json r = chief_result(log);
  ASSERT_TRUE(r.is_object()) << log;
  ASSERT_FALSE(r.contains("fatal")) << r.dump(2) << "\n" << log;
  EXPECT_EQ(r["num_replicas_in_sync"], 2);  // TF: the local replicas of one worker
  EXPECT_EQ(r["worker_replicas"], json({2, 2}));
  // agg_step ran twice (one closure per worker, on whichever worker took it);
  // in each run replica k contributed (k+1)*[1,2,3].
  EXPECT_EQ(r["values"]["sum"], json({16, 32, 48}));    // += 2 * (1+2) * [1,2,3]
  EXPECT_EQ(r["values"]["mean"], json({13, 26, 39}));   // += 2 * 1.5 * [1,2,3]
  EXPECT_EQ(r["values"]["first"], json({12, 24, 36}));  // += 2 * 1 * [1,2,3]
  EXPECT_EQ(r["values"]["first_assign"], json({1, 1, 1}));
  EXPECT_EQ(r["values"]["mean_assign"], json({1.5, 1.5, 1.5}));
  EXPECT_EQ(r["values"]["none"], json({0, 0, 0}));
  // run + reduce on a worker: replicas hold 1*16 and 2*16.
  EXPECT_EQ(r["run_and_reduce"], json({48, 24}));
  // fixed_shards(2) on 3 rows: 2 shards each, placed round robin on 2 ps tasks.
  for (const char* v : {"sum", "mean", "first", "first_assign", "mean_assign", "none"})
    EXPECT_EQ(r["shards"][v], json({0, 1})) << v;
  // Errors, each naming the problem and the fix.
  EXPECT_TRUE(has(r["before_coordinator"], "FAILED_PRECONDITION") &&
              has(r["before_coordinator"], "create the strata::ClusterCoordinator on the chief before"))
      << r["before_coordinator"];
  EXPECT_TRUE(has(r["unknown_aggregation"], "INVALID_ARGUMENT") &&
              has(r["unknown_aggregation"], "Invalid variable aggregation mode: 7 for variable: 'bad_agg'") &&
              has(r["unknown_aggregation"], "use NONE, SUM, MEAN or ONLY_FIRST_REPLICA"))
      << r["unknown_aggregation"];
  EXPECT_TRUE(has(r["on_read_trainable"], "INVALID_ARGUMENT") && has(r["on_read_trainable"], "pass trainable = false"))
      << r["on_read_trainable"];
  EXPECT_TRUE(has(r["outside_scope"], "FAILED_PRECONDITION") && has(r["outside_scope"], "'local'") &&
              has(r["outside_scope"], "create it under a parameter_server strategy's scope"))
      << r["outside_scope"];
  EXPECT_TRUE(has(r["none_update"], "FAILED_PRECONDITION") &&
              has(r["none_update"], "variable 'none': You must specify an aggregation method") &&
              has(r["none_update"], "VariableOptions::aggregation = SUM, MEAN or ONLY_FIRST_REPLICA"))
      << r["none_update"];
  EXPECT_TRUE(has(r["misuse"]["attach_outside_scope"], "INVALID_ARGUMENT") &&
              has(r["misuse"]["attach_outside_scope"], "attach it under a parameter_server strategy's scope"))
      << r["misuse"];
  EXPECT_TRUE(has(r["misuse"]["create_on_worker"], "FAILED_PRECONDITION") &&
              has(r["misuse"]["create_on_worker"], "cannot be created on worker task ") &&
              has(r["misuse"]["create_on_worker"], "create it on the chief under the parameter_server strategy's scope"))
      << r["misuse"];
}

TEST(PsStrategyTest, StrataTrainParameterServerWithoutPsTasksNamesTheFix) {
  const auto [code, out] =
      run_to_end({STRATA_TRAIN_BIN, "--strategy", "parameter_server", "--steps", "5", "--quiet"}, {}, 60);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("parameter_server strategy needs at least one \"ps\" task in the cluster"), std::string::npos)
      << out;
  EXPECT_NE(out.find("strata-run --chief 1 --workers N --ps M"), std::string::npos) << out;
}

double number_after(const std::string& text, const std::string& key) {
  const std::regex re(key + " ([0-9.eE+-]+)");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return std::nan("");
  return std::stod(m[1].str());
}

// Under a sanitizer the run trains 300 steps (1000 took 148 s of the 300 s
// limit under ThreadSanitizer); the tolerance below holds at 300 too.
#ifdef PS_STRATEGY_TEST_SANITIZED
constexpr const char* kSteps = "300";
#else
constexpr const char* kSteps = "1000";
#endif

TEST(PsStrategyTest, StrataTrainParameterServerReachesTheLossOfOneDevice) {
  const std::vector<std::string> common = {"--steps", kSteps, "--dataset-size", "8192", "--eval-size", "2048",
                                           "--global-batch", "256", "--quiet"};
  std::vector<std::string> sync = {STRATA_TRAIN_BIN, "--strategy", "one_device"};
  sync.insert(sync.end(), common.begin(), common.end());
  const auto [scode, sout] = run_to_end(sync, {}, 240);
  ASSERT_EQ(scode, 0) << sout;
  std::vector<std::string> ps = {STRATA_RUN_BIN, "--timeout", "280", "--chief", "1", "--workers", "2", "--ps", "1",
                                 "--", STRATA_TRAIN_BIN, "--strategy", "parameter_server", "--devices", "cpu:0,cpu:1"};
  ps.insert(ps.end(), common.begin(), common.end());
  const auto [pcode, pout] = run_to_end(ps, {}, 300);
  ASSERT_EQ(pcode, 0) << pout;
  const double sync_loss = number_after(sout, "final loss");
  const double ps_loss = number_after(pout, "final loss");
  const double sync_acc = number_after(sout, "held-out accuracy");
  const double ps_acc = number_after(pout, "held-out accuracy");
  std::printf("one_device: final loss %.6f, held-out accuracy %.4f; parameter_server (2 workers x 2 replicas, 1 ps): "
              "final loss %.6f, held-out accuracy %.4f\n",
              sync_loss, sync_acc, ps_loss, ps_acc);
  ASSERT_FALSE(std::isnan(sync_loss) || std::isnan(ps_loss) || std::isnan(sync_acc) || std::isnan(ps_acc))
      << sout << "\n" << pout;
  // Both workers trained (asynchronously).
  EXPECT_NE(pout.find("with parameter_server on 2 worker(s) of 2 replica(s)"), std::string::npos) << pout;
  // Tolerance: the asynchronous run's last batch loss within 5% (relative)
  // of one_device's, its held-out accuracy within 0.01. Measured on this
  // machine (1000 steps, 5 runs): 0.0942-0.0947 against one_device's
  // 0.0942 (at most 0.6% apart; 1.3% at 300 steps), accuracy 0.9224-0.9238
  // against 0.9219. Stale gradients (each worker starts its step from
  // weights up to one update old) cost little at this learning rate; the
  // margin covers scheduling differences on a loaded machine.
  EXPECT_LE(std::fabs(ps_loss - sync_loss), 0.05 * sync_loss) << sout << "\n" << pout;
  EXPECT_LE(std::fabs(ps_acc - sync_acc), 0.01) << sout << "\n" << pout;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--auto") {
    load_config();
    return strata::current_task_type() == "chief" ? coordinate(argv[2]) : serve();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
