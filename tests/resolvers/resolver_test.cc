// SPDX-License-Identifier: Apache-2.0
// The tf_config and simple cluster resolvers, through the plugin host and
// through `strata-info cluster`, case by case: every case runs both ways and
// must give the same answer.
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cluster_spec.h"
#include "strata/plugin_host.hpp"
#include "subprocess.h"

namespace strata {
namespace {

using nlohmann::json;
using test::EnvEdits;

void append(void* user, const char* data, uint64_t len) { static_cast<std::string*>(user)->append(data, len); }

/// Sets or unsets TF_CONFIG for one scope.
class ScopedTfConfig {
 public:
  explicit ScopedTfConfig(const std::optional<std::string>& v) {
    if (const char* old = std::getenv("TF_CONFIG")) old_ = old;
    if (v) ::setenv("TF_CONFIG", v->c_str(), 1);
    else ::unsetenv("TF_CONFIG");
  }
  ~ScopedTfConfig() {
    if (old_) ::setenv("TF_CONFIG", old_->c_str(), 1);
    else ::unsetenv("TF_CONFIG");
  }

 private:
  std::optional<std::string> old_;
};

struct Outcome {
  strata_status_t code = STRATA_OK;
  std::string message;
  json describe;
  json master;  // string, or null when master() is "" or NOT_FOUND
};

Outcome via_plugin(const std::string& resolver, const std::optional<std::string>& tf_config, const json& options) {
  ScopedTfConfig env(tf_config);
  Outcome o;
  try {
    PluginInstance inst = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, resolver, options.dump());
    const auto* vt = inst.vtable_as<strata_resolver_vtable>();
    auto r = static_cast<strata_resolver_t>(inst.handle());
    std::string text, master;
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt->describe(r, &append, &text, &err), err, "describe");
    o.describe = json::parse(text);
    strata_error_init(&err);
    const strata_status_t st = vt->master(r, nullptr, -1, nullptr, &append, &master, &err);
    if (st == STRATA_ERR_NOT_FOUND || (st == STRATA_OK && master.empty())) o.master = nullptr;
    else {
      detail::check_status(st, err, "master");
      o.master = master;
    }
  } catch (const Error& e) {
    o.code = e.code();
    o.message = e.what();
  }
  return o;
}

test::ProcResult run_info(const std::vector<std::string>& args, const std::optional<std::string>& tf_config,
                          EnvEdits env = {}) {
  std::vector<std::string> argv = {STRATA_INFO_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  env["TF_CONFIG"] = tf_config;
  env.emplace("STRATA_LOG_LEVEL", "off");
  env.emplace("STRATA_PLUGIN_PATH", std::nullopt);
  env.emplace("STRATA_CLUSTER_RESOLVER", std::nullopt);
  // Auto-detection prefers Slurm and falls back to TPU: keep a Slurm node or
  // TPU VM running these tests from changing the answers.
  for (const char* v : {"SLURM_PROCID", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_NAME", "TPU_CONFIG"})
    env.emplace(v, std::nullopt);
  return test::run_program(argv, env);
}

std::vector<std::string> option_args(const json& options) {
  std::vector<std::string> out;
  for (auto it = options.begin(); it != options.end(); ++it) {
    out.push_back("--option");
    out.push_back(it.key() + "=" + it.value().dump());
  }
  return out;
}

struct Case {
  const char* name;
  const char* resolver;
  std::optional<std::string> tf_config;
  json options;
  // On success: fields expected in describe(), master(), and strata-info's roles.
  json expect;       // subset of describe()
  json master;       // null = no master
  json role;         // {"is_chief", "id_in_cluster", "worker_count"}
  // On failure:
  strata_status_t code = STRATA_OK;
  const char* error = "";
};
// Short names in test listings (gtest would otherwise dump the raw bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  const json obj = json::object();
  return {
      {"chief_and_workers_list", "tf_config",
       R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 1},
           "rpc_layer": "grpc"})",
       obj,
       {{"cluster_spec", {{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:1"}}}},
        {"task_type", "worker"}, {"task_id", 1}, {"rpc_layer", "grpc"}, {"environment", nullptr},
        {"num_accelerators", obj}, {"env_after", obj}},
       "grpc://w1:1", {{"is_chief", false}, {"id_in_cluster", 2}, {"worker_count", 3}}},
      {"chief_task", "tf_config",
       R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1"]}, "task": {"type": "chief", "index": 0}})", obj,
       {{"task_type", "chief"}, {"task_id", 0}, {"rpc_layer", nullptr}},
       "c:1", {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 2}}},
      {"worker0_is_chief_without_chief_job", "tf_config",
       R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})", obj,
       {{"task_id", 0}}, "a:1", {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 2}}},
      {"sparse_worker_job", "tf_config",
       R"({"cluster": {"worker": {"1": "a:1", "3": "b:1"}, "ps": ["p:1"]}, "task": {"type": "worker", "index": 3}})",
       obj, {{"cluster_spec", {{"worker", {{"1", "a:1"}, {"3", "b:1"}}}, {"ps", {"p:1"}}}}, {"task_id", 3}},
       "b:1", {{"is_chief", false}, {"id_in_cluster", 1}, {"worker_count", 2}}},
      // The evaluator is the chief of its own cluster, ranked by its own index
      // and counting only evaluators (multi_worker_util_test.py
      // testEvaluatorIsChief, testEvaluatorId, testCountEvaluator); it may
      // run outside the cluster (testEvaluatorNotInCluster), where it has no
      // address.
      {"evaluator_outside_cluster", "tf_config",
       R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}})", obj,
       {{"task_type", "evaluator"}, {"task_id", 0}}, nullptr,
       {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      {"evaluator_in_cluster", "tf_config",
       R"({"cluster": {"worker": ["w:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}})", obj,
       {{"task_type", "evaluator"}}, "e:1", {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      // A ps task is no chief and has neither a worker count nor an id
      // (multi_worker_util_test.py testCountPs, testPsId).
      {"ps_task", "tf_config",
       R"({"cluster": {"ps": ["p:1", "p:2"], "worker": ["w:1"]}, "task": {"type": "ps", "index": 1}})", obj,
       {{"task_type", "ps"}, {"task_id", 1}}, "p:2",
       {{"is_chief", false}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      // The resolver takes any job name (tfconfig_cluster_resolver_test.py
      // testNumAcceleratorsFilterTasksByEnvVar uses "worker1"), but
      // multi_worker_util refuses a cluster with one ("Disallowed task
      // type"), so no role; one task: master() "" (testOneItemInClusterSpecMasterRead).
      {"any_job_name", "tf_config", R"({"cluster": {"trainer": ["t:1"]}, "task": {"type": "trainer", "index": 0}})",
       obj, {{"task_type", "trainer"}}, nullptr,
       {{"is_chief", nullptr}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      {"other_job_beside_workers", "tf_config",
       R"({"cluster": {"worker": ["w0:1", "w1:1"], "trainer": ["t:1"]}, "task": {"type": "worker", "index": 0}})",
       obj, {{"task_type", "worker"}}, "w0:1",
       {{"is_chief", nullptr}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      // session_master wins (testSessionMasterRead); TF_CONFIG's
      // "environment" is not the resolver's: TFConfigClusterResolver's
      // environment is only its constructor argument.
      {"session_master_and_environment", "tf_config",
       R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1},
           "session_master": "grpc://sm:9", "environment": "cloud"})",
       obj, {{"environment", nullptr}}, "grpc://sm:9",
       {{"is_chief", false}, {"id_in_cluster", 1}, {"worker_count", 2}}},
      {"environment_of_another_type_is_ignored", "tf_config",
       R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}, "environment": 5})", obj,
       {{"environment", nullptr}}, "a:1", {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 2}}},
      // No task: TF's master() cannot name one (NOT_FOUND here, null below);
      // multi_worker_util refuses a null task type.
      {"no_task", "tf_config", R"({"cluster": {"worker": ["a:1", "b:1"]}})", obj,
       {{"task_type", nullptr}, {"task_id", nullptr}}, nullptr,
       {{"is_chief", nullptr}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      // testZeroItemsInClusterSpecMasterRead: TF_CONFIG {} has master() "".
      {"empty_tf_config_object", "tf_config", "{}", obj, {{"cluster_spec", obj}, {"task_type", nullptr}}, nullptr,
       {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      // An unset TF_CONFIG reads as {} in TFConfigClusterResolver: empty
      // cluster, task_type/task_id None, master() "". An empty one too here
      // (TF's json.loads('') would raise; see README-resolvers-snippet.md).
      {"unset", "tf_config", std::nullopt, obj,
       {{"cluster_spec", obj}, {"task_type", nullptr}, {"task_id", nullptr}, {"rpc_layer", nullptr},
        {"environment", nullptr}},
       nullptr, {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      {"empty_string", "tf_config", "", obj, {{"cluster_spec", obj}, {"task_type", nullptr}, {"task_id", nullptr}},
       nullptr, {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      {"unset_with_environment_option", "tf_config", std::nullopt, {{"environment", "google"}},
       {{"cluster_spec", obj}, {"environment", "google"}}, nullptr,
       {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      // testOneItemInClusterSpecMasterRead: a one-task cluster has master()
      // "", with or without a task.
      {"one_task_cluster", "tf_config", R"({"cluster": {"worker": ["worker0:2222"]}})", obj,
       {{"task_type", nullptr}}, nullptr, {{"is_chief", nullptr}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      {"one_task_cluster_with_task", "tf_config",
       R"({"cluster": {"worker": ["worker0:2222"]}, "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"})",
       obj, {{"task_type", "worker"}, {"task_id", 0}}, nullptr,
       {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      // testTaskTypeCastToString: a numeric task type names a numeric job.
      {"numeric_task_type", "tf_config",
       R"({"cluster": {"123456": ["ps0:2222", "ps1:2222"], "worker": ["worker0:2222"]}, "rpc_layer": "grpc",
           "task": {"type": 123456, "index": 0}})",
       obj, {{"task_type", "123456"}, {"task_id", 0}}, "grpc://ps0:2222",
       {{"is_chief", nullptr}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      // testParameterOverrides: the options replace TF_CONFIG's task.
      {"parameter_overrides", "tf_config",
       R"({"cluster": {"ps": ["ps0:2222", "ps1:2222"], "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]},
           "rpc_layer": "grpc", "task": {"type": "ps", "index": 1}})",
       {{"task_type", "ps"}, {"task_id", 0}}, {{"task_type", "ps"}, {"task_id", 0}}, "grpc://ps0:2222",
       {{"is_chief", false}, {"id_in_cluster", nullptr}, {"worker_count", nullptr}}},
      {"string_task_index", "tf_config",
       R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "1"}})", obj,
       {{"task_id", 1}}, "b:1", {{"is_chief", false}, {"id_in_cluster", 1}, {"worker_count", 2}}},
      {"options_override_tf_config", "tf_config",
       R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})",
       {{"task_type", "worker"}, {"task_id", 0}, {"rpc_layer", "grpc+verbs"}, {"environment", "google"},
        {"num_accelerators", {{"GPU", 2}}}},
       {{"task_id", 0}, {"rpc_layer", "grpc+verbs"}, {"environment", "google"}, {"num_accelerators", {{"GPU", 2}}}},
       "grpc+verbs://a:1", {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 2}}},
      // ---- errors ----
      {"non_string_task_type", "tf_config",
       R"({"cluster": {"worker": ["a:1"]}, "task": {"type": true, "index": 0}})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task type must be a job name (a string, or an integer"},
      {"invalid_json", "tf_config", R"({"cluster": {"worker": ["a:1",)", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG is not valid JSON (error at byte"},
      // Found by tf_config_fuzz: a number too large for a double.
      {"number_overflow", "tf_config", R"({"cluster": {"worker": 1e999999}})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG is not valid JSON ("},
      {"not_an_object", "tf_config", R"(["a:1"])", obj, nullptr, nullptr, nullptr, STRATA_ERR_INVALID_ARGUMENT,
       "TF_CONFIG must be a JSON object, got array"},
      {"cluster_not_object", "tf_config", R"({"cluster": ["a:1"]})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG \"cluster\" must be a JSON object"},
      {"job_not_list", "tf_config", R"({"cluster": {"worker": "a:1"}})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "job 'worker' must be a list of addresses or an object"},
      {"address_not_string", "tf_config", R"({"cluster": {"worker": ["a:1", 5]}})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "address of task 1 of job 'worker' must be a non-empty \"host:port\" string"},
      {"sparse_key_not_index", "tf_config", R"({"cluster": {"worker": {"x": "a:1"}}})", obj, nullptr, nullptr,
       nullptr, STRATA_ERR_INVALID_ARGUMENT, "job 'worker' has task index \"x\""},
      {"task_type_not_in_cluster", "tf_config",
       R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "task type 'chief' is not a job of the cluster (jobs: worker)"},
      {"index_out_of_range", "tf_config",
       R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})", obj, nullptr, nullptr,
       nullptr, STRATA_ERR_INVALID_ARGUMENT, "task index 2 is out of range for job 'worker', which has 2 task(s)"},
      {"index_missing_in_sparse_job", "tf_config",
       R"({"cluster": {"worker": {"1": "a:1", "3": "b:1"}}, "task": {"type": "worker", "index": 2}})", obj,
       nullptr, nullptr, nullptr, STRATA_ERR_INVALID_ARGUMENT, "job 'worker' has no task with index 2 (its indices: 1, 3)"},
      {"negative_index", "tf_config",
       R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})", obj, nullptr, nullptr,
       nullptr, STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task index -1 is negative"},
      {"negative_index_option", "tf_config", R"({"cluster": {"worker": ["a:1"]}})",
       {{"task_type", "worker"}, {"task_id", -2}}, nullptr, nullptr, nullptr, STRATA_ERR_INVALID_ARGUMENT,
       "task id -2 is negative"},
      {"task_without_index", "tf_config", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})", obj,
       nullptr, nullptr, nullptr, STRATA_ERR_INVALID_ARGUMENT, "task type 'worker' has no task index"},
      {"two_chiefs", "tf_config", R"({"cluster": {"chief": ["a:1", "b:1"]}})", obj, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "there must be at most one chief"},
      {"unknown_option", "tf_config", R"({"cluster": {"worker": ["a:1"]}})", {{"bogus", 1}}, nullptr, nullptr,
       nullptr, STRATA_ERR_INVALID_ARGUMENT, "unknown option 'bogus' for cluster resolver 'tf_config'"},
      {"bad_num_accelerators", "tf_config", R"({"cluster": {"worker": ["a:1"]}})", {{"num_accelerators", {{"GPU", -1}}}},
       nullptr, nullptr, nullptr, STRATA_ERR_INVALID_ARGUMENT, "non-negative accelerator counts"},
      // ---- simple ----
      {"simple_spec", "simple", std::nullopt,
       {{"cluster_spec", {{"chief", {"c:1"}}, {"worker", {"w:1", "w:2"}}}}, {"task_type", "worker"}, {"task_id", 1},
        {"rpc_layer", "grpc"}, {"num_accelerators", {{"GPU", 4}}}, {"environment", "google"}},
       {{"cluster_spec", {{"chief", {"c:1"}}, {"worker", {"w:1", "w:2"}}}}, {"task_type", "worker"}, {"task_id", 1},
        {"rpc_layer", "grpc"}, {"num_accelerators", {{"GPU", 4}}}, {"environment", "google"}, {"env_after", obj}},
       "grpc://w:2", {{"is_chief", false}, {"id_in_cluster", 2}, {"worker_count", 3}}},
      {"simple_ignores_tf_config", "simple", R"({"cluster": {"worker": ["tf:1"]}, "task": {"type": "worker", "index": 0}})",
       obj, {{"cluster_spec", obj}, {"task_type", nullptr}}, nullptr,
       {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      {"simple_master_option", "simple", std::nullopt,
       {{"cluster_spec", {{"worker", {{"2", "w:2"}}}}}, {"task_type", "worker"}, {"task_id", 2}, {"master", "grpc://m:1"}},
       {{"task_id", 2}}, "grpc://m:1", {{"is_chief", true}, {"id_in_cluster", 0}, {"worker_count", 1}}},
      {"simple_spec_not_object", "simple", std::nullopt, {{"cluster_spec", {"a:1"}}}, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "option 'cluster_spec' of the simple resolver must be a JSON object"},
      {"simple_task_not_in_cluster", "simple", std::nullopt,
       {{"cluster_spec", {{"worker", {"a:1"}}}}, {"task_type", "ps"}, {"task_id", 0}}, nullptr, nullptr, nullptr,
       STRATA_ERR_INVALID_ARGUMENT, "task type 'ps' is not a job of the cluster"},
      {"simple_bad_task_id_type", "simple", std::nullopt,
       {{"cluster_spec", {{"worker", {"a:1"}}}}, {"task_type", "worker"}, {"task_id", "zero"}}, nullptr, nullptr,
       nullptr, STRATA_ERR_INVALID_ARGUMENT, "option 'task_id' of cluster resolver 'simple' must be an integer"},
  };
}

class ResolverTest : public ::testing::TestWithParam<Case> {};

TEST_P(ResolverTest, ThroughPluginHost) {
  const Case& c = GetParam();
  const Outcome o = via_plugin(c.resolver, c.tf_config, c.options);
  if (c.code != STRATA_OK) {
    ASSERT_EQ(o.code, c.code) << o.message;
    EXPECT_NE(o.message.find(c.error), std::string::npos) << o.message;
    return;
  }
  ASSERT_EQ(o.code, STRATA_OK) << o.message;
  for (auto it = c.expect.begin(); it != c.expect.end(); ++it)
    EXPECT_EQ(o.describe.at(it.key()), it.value()) << it.key() << " in " << o.describe.dump();
  for (const char* key : {"cluster_spec", "task_type", "task_id", "rpc_layer", "environment", "num_accelerators",
                          "env_after"})
    EXPECT_TRUE(o.describe.contains(key)) << key << " missing from " << o.describe.dump();
  EXPECT_EQ(o.master, c.master);
  const resolvers::ClusterRole role = resolvers::cluster_role(o.describe);
  EXPECT_EQ(role.is_chief ? json(*role.is_chief) : json(), c.role["is_chief"]);
  EXPECT_EQ(role.id_in_cluster ? json(*role.id_in_cluster) : json(), c.role["id_in_cluster"]);
  EXPECT_EQ(role.worker_count ? json(*role.worker_count) : json(), c.role["worker_count"]);
}

TEST_P(ResolverTest, ThroughStrataInfoCluster) {
  const Case& c = GetParam();
  std::vector<std::string> args = {"cluster", "--resolver", c.resolver};
  for (const auto& a : option_args(c.options)) args.push_back(a);
  const test::ProcResult r = run_info(args, c.tf_config);
  ASSERT_FALSE(r.timed_out);
  if (c.code != STRATA_OK) {
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(strata_status_string(c.code)), std::string::npos) << r.err;
    return;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);  // exactly one JSON document
  const std::vector<std::string> keys = {"resolver", "cluster_spec", "task_type", "task_id", "rpc_layer", "master",
                                         "num_accelerators", "environment", "is_chief", "id_in_cluster",
                                         "worker_count", "env_after"};
  EXPECT_EQ(out.size(), keys.size()) << out.dump();
  for (const auto& k : keys) EXPECT_TRUE(out.contains(k)) << k;
  EXPECT_EQ(out["resolver"], c.resolver);
  for (auto it = c.expect.begin(); it != c.expect.end(); ++it)
    EXPECT_EQ(out.at(it.key()), it.value()) << it.key() << " in " << out.dump();
  EXPECT_EQ(out["master"], c.master);
  for (auto it = c.role.begin(); it != c.role.end(); ++it) EXPECT_EQ(out[it.key()], it.value()) << it.key();
}

INSTANTIATE_TEST_SUITE_P(Cases, ResolverTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- master() with explicit arguments --------------------------------------

class ResolverMasterTest : public ::testing::Test {
 protected:
  static constexpr const char* kTfConfig = R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]},
                                               "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})";

  std::string master(const char* type, int32_t id, const char* layer, strata_status_t* status = nullptr,
                     const char* tf_config = kTfConfig) {
    ScopedTfConfig env{std::string(tf_config)};
    PluginInstance inst = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, "tf_config", "");
    const auto* vt = inst.vtable_as<strata_resolver_vtable>();
    std::string out;
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st =
        vt->master(static_cast<strata_resolver_t>(inst.handle()), type, id, layer, &append, &out, &err);
    if (status != nullptr) *status = st;
    else EXPECT_EQ(st, STRATA_OK) << err.message;
    return st == STRATA_OK ? out : std::string(err.message);
  }
};

TEST_F(ResolverMasterTest, NamedTaskWithLayers) {
  EXPECT_EQ(master("chief", 0, nullptr), "grpc://c:1");
  EXPECT_EQ(master("worker", 0, "grpc+verbs"), "grpc+verbs://w0:1");
  EXPECT_EQ(master("worker", -1, nullptr), "grpc://w1:1");  // negative id: this task's index
  EXPECT_EQ(master(nullptr, 0, nullptr), "grpc://w0:1");     // own type, given index
}

// TFConfigClusterResolver.master() takes a given rpc_layer even when it is
// '' (format_master_url then adds no prefix); only None means its own.
TEST_F(ResolverMasterTest, EmptyLayerMeansNoPrefix) {
  EXPECT_EQ(master(nullptr, -1, ""), "w1:1");
  EXPECT_EQ(master("chief", 0, ""), "c:1");
}

// tfconfig_cluster_resolver_test.py testSessionMasterRead, and
// TFConfigClusterResolver.master(): session_master is returned before the
// arguments are looked at.
TEST_F(ResolverMasterTest, SessionMasterWinsOverArguments) {
  const char* tf = R"({"cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222"]},
                       "session_master": "sessionmaster:2222", "rpc_layer": "grpc",
                       "task": {"type": "ps", "index": 0}})";
  EXPECT_EQ(master(nullptr, -1, nullptr, nullptr, tf), "sessionmaster:2222");
  EXPECT_EQ(master("worker", 1, "grpc", nullptr, tf), "sessionmaster:2222");
}

// testZeroItemsInClusterSpecMasterRead, testOneItemInClusterSpecMasterRead:
// no master for an empty or one-task cluster, whatever task is asked for.
TEST_F(ResolverMasterTest, EmptyAndOneTaskClustersHaveNoMaster) {
  EXPECT_EQ(master(nullptr, -1, nullptr, nullptr, "{}"), "");
  EXPECT_EQ(master("worker", 0, "grpc", nullptr, R"({"cluster": {"worker": ["worker0:2222"]}})"), "");
  EXPECT_EQ(master(nullptr, -1, nullptr, nullptr,
                   R"({"cluster": {"worker": ["worker0:2222"]}, "task": {"type": "worker", "index": 0}})"),
            "");
}

// testSpecifiedTaskTypeAndIndexMasterRead; and with no task of its own, the
// process must name one (TF's task_address(None, None) raises).
TEST_F(ResolverMasterTest, NoOwnTaskNeedsANamedOne) {
  const char* tf = R"({"cluster": {"worker": ["worker0:2222", "worker1:2222"]}})";
  EXPECT_EQ(master("worker", 1, nullptr, nullptr, tf), "worker1:2222");
  strata_status_t st = STRATA_OK;
  const std::string msg = master(nullptr, -1, nullptr, &st, tf);
  EXPECT_EQ(st, STRATA_ERR_NOT_FOUND);
  EXPECT_NE(msg.find("this process has no task"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pass a task type and id"), std::string::npos) << msg;
}

TEST_F(ResolverMasterTest, UnknownTaskIsNotFound) {
  strata_status_t st = STRATA_OK;
  const std::string msg = master("ps", 0, nullptr, &st);
  EXPECT_EQ(st, STRATA_ERR_NOT_FOUND);
  EXPECT_NE(msg.find("has no task ps 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("jobs: chief, worker"), std::string::npos) << msg;
  master("worker", 7, nullptr, &st);
  EXPECT_EQ(st, STRATA_ERR_NOT_FOUND);
}

// ---- multi_worker_util rules ------------------------------------------------
// Each test follows the multi_worker_util_test.py test of the same name.

resolvers::ClusterSpec spec_of(const char* text) { return resolvers::parse_cluster_spec(json::parse(text), "test"); }

/// The message of the InvalidArgumentError `f` throws ("" when none).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

constexpr const char* kChiefWorkersPs =
    R"({"chief": ["127.0.0.1:1234"], "worker": ["127.0.0.1:8964", "127.0.0.1:2333"],
        "ps": ["127.0.0.1:1926", "127.0.0.1:3141"]})";
constexpr const char* kChiefWorkersEvaluator =
    R"({"chief": ["127.0.0.1:1234"], "worker": ["127.0.0.1:8964", "127.0.0.1:2333"],
        "evaluator": ["127.0.0.1:2019"]})";

TEST(MultiWorkerUtilTest, IsChiefClusterWithChief) {
  const auto spec = spec_of(kChiefWorkersPs);
  EXPECT_TRUE(resolvers::is_chief(spec, "chief", 0));
  EXPECT_FALSE(resolvers::is_chief(spec, "worker", 0));
  EXPECT_FALSE(resolvers::is_chief(spec, "ps", 0));
}

TEST(MultiWorkerUtilTest, IsChiefClusterWithoutChief) {
  const auto spec = spec_of(R"({"worker": ["127.0.0.1:8964", "127.0.0.1:2333"]})");
  EXPECT_TRUE(resolvers::is_chief(spec, "worker", 0));
  EXPECT_FALSE(resolvers::is_chief(spec, "worker", 1));
  std::string msg = refusal([&] { resolvers::is_chief(spec, "chief", 0); });
  EXPECT_NE(msg.find("task type 'chief' is not a job of the cluster (jobs: worker)"), std::string::npos) << msg;
  msg = refusal([&] { resolvers::is_chief(spec, "worker", 2); });
  EXPECT_NE(msg.find("job 'worker' has no task with index 2 (its indices: 0, 1)"), std::string::npos) << msg;
}

TEST(MultiWorkerUtilTest, EvaluatorIsChief) {
  EXPECT_TRUE(resolvers::is_chief(spec_of(kChiefWorkersEvaluator), "evaluator", 0));
  // Also when it runs outside the cluster (testEvaluatorNotInCluster).
  EXPECT_TRUE(resolvers::is_chief(spec_of(kChiefWorkersPs), "evaluator", 0));
}

TEST(MultiWorkerUtilTest, CountWorker) {
  const auto spec = spec_of(kChiefWorkersPs);
  EXPECT_EQ(resolvers::worker_count(spec, "chief"), 3);
  EXPECT_EQ(resolvers::worker_count(spec, "worker"), 3);
}

TEST(MultiWorkerUtilTest, CountEvaluator) {
  EXPECT_EQ(resolvers::worker_count(spec_of(kChiefWorkersEvaluator), "evaluator"), 1);
  // Outside the cluster it is a cluster of its own (TF has no answer there).
  EXPECT_EQ(resolvers::worker_count(spec_of(kChiefWorkersPs), "evaluator"), 1);
}

TEST(MultiWorkerUtilTest, TaskTypeNotFound) {
  const std::string msg = refusal([] { resolvers::worker_count(spec_of("{}"), "worker"); });
  EXPECT_NE(msg.find("task type 'worker' is not a job of the cluster"), std::string::npos) << msg;
}

TEST(MultiWorkerUtilTest, CountPs) {
  const std::string msg =
      refusal([] { resolvers::worker_count(spec_of(R"({"chief": ["c:1"], "ps": ["p:1", "p:2"]})"), "ps"); });
  EXPECT_NE(msg.find("does not count for task type 'ps'"), std::string::npos) << msg;
}

TEST(MultiWorkerUtilTest, ChiefId) { EXPECT_EQ(resolvers::id_in_cluster(spec_of(kChiefWorkersPs), "chief", 0), 0); }

TEST(MultiWorkerUtilTest, WorkerId) {
  EXPECT_EQ(resolvers::id_in_cluster(spec_of(kChiefWorkersPs), "worker", 1), 2);
  EXPECT_EQ(resolvers::id_in_cluster(spec_of(R"({"worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]})"), "worker", 1),
            1);
}

TEST(MultiWorkerUtilTest, EvaluatorId) {
  EXPECT_EQ(resolvers::id_in_cluster(spec_of(kChiefWorkersEvaluator), "evaluator", 0), 0);
}

TEST(MultiWorkerUtilTest, PsId) {
  const std::string msg =
      refusal([] { resolvers::id_in_cluster(spec_of(R"({"chief": ["c:1"], "ps": ["p:1"]})"), "ps", 0); });
  EXPECT_NE(msg.find("has no id for task type 'ps'"), std::string::npos) << msg;
}

TEST(MultiWorkerUtilTest, MultipleChiefs) {
  const std::string msg = refusal([] { resolvers::id_in_cluster(spec_of(R"({"chief": ["a:1", "b:1"]})"), "chief", 0); });
  EXPECT_NE(msg.find("there must be at most one chief"), std::string::npos) << msg;
}

TEST(MultiWorkerUtilTest, EvaluatorNotInCluster) {
  const auto spec = spec_of(kChiefWorkersPs);
  for (const char* type : {"chief", "worker", "ps", "evaluator"})
    EXPECT_NO_THROW(resolvers::validate_multi_worker(spec, std::string(type), 0)) << type;
}

TEST(MultiWorkerUtilTest, WorkerNotInCluster) {
  const auto spec = spec_of(R"({"chief": ["c:1"], "ps": ["p:1", "p:2"]})");
  EXPECT_NO_THROW(resolvers::validate_multi_worker(spec, std::string("evaluator"), 0));
  const std::string msg = refusal([&] { resolvers::validate_multi_worker(spec, std::string("worker"), 0); });
  EXPECT_NE(msg.find("task type 'worker' is not a job of the cluster"), std::string::npos) << msg;
}

// _validate_cluster_spec: jobs and task types other than chief, worker,
// evaluator and ps are refused ("Disallowed task type", "Unrecognized
// task_type"), although the resolvers accept such jobs.
TEST(MultiWorkerUtilTest, OtherJobNamesAreRefused) {
  std::string msg = refusal([] { resolvers::worker_count(spec_of(R"({"worker": ["w:1"], "trainer": ["t:1"]})"), "worker"); });
  EXPECT_NE(msg.find("the cluster has job 'trainer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rename the job"), std::string::npos) << msg;
  msg = refusal([] { resolvers::is_chief(spec_of(R"({"worker": ["w:1"]})"), "trainer", 0); });
  EXPECT_NE(msg.find("task type 'trainer' is not a multi-worker task type"), std::string::npos) << msg;
}

// Strata numbers a sparse worker job densely (TF has no sparse ranks).
TEST(MultiWorkerUtilTest, SparseWorkersAreRankedDensely) {
  const auto spec = spec_of(R"({"chief": ["c:1"], "worker": {"1": "a:1", "3": "b:1"}})");
  EXPECT_EQ(resolvers::id_in_cluster(spec, "worker", 3), 2);
  EXPECT_EQ(resolvers::worker_count(spec, "worker"), 3);
  EXPECT_TRUE(resolvers::is_chief(spec_of(R"({"worker": {"1": "a:1", "3": "b:1"}})"), "worker", 1));
}

// ---- detection and strata-info selection -----------------------------------

TEST(ResolverDetectTest, TfConfigDetectsOnlyANonEmptyTfConfig) {
  PluginInstance inst;
  {
    ScopedTfConfig env(R"({"cluster": {"worker": ["a:1"]}})");
    inst = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, "tf_config", "");
  }
  const auto* vt = inst.vtable_as<strata_resolver_vtable>();
  ASSERT_NE(vt->detect, nullptr);
  const strata_host_api* api = PluginHost::global().host_api();
  {
    ScopedTfConfig env(R"({"cluster": {}})");
    EXPECT_NE(vt->detect(api), 0);
  }
  {
    ScopedTfConfig env{std::string()};
    EXPECT_EQ(vt->detect(api), 0);
  }
  {
    ScopedTfConfig env(std::nullopt);
    EXPECT_EQ(vt->detect(api), 0);
  }
  PluginInstance simple = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, "simple", "");
  EXPECT_EQ(simple.vtable_as<strata_resolver_vtable>()->detect, nullptr);
}

TEST(StrataInfoClusterTest, AutoDetectsTfConfig) {
  const auto r = run_info({"cluster"}, R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["resolver"], "tf_config");
  EXPECT_EQ(out["master"], "b:1");
  EXPECT_EQ(out["id_in_cluster"], 1);
}

TEST(StrataInfoClusterTest, FallsBackToLocalSingleProcess) {
  for (const std::optional<std::string>& tf : {std::optional<std::string>(), std::optional<std::string>("")}) {
    const auto r = run_info({"cluster"}, tf);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json out = json::parse(r.out);
    EXPECT_EQ(out["detection"]["chosen"], "local");  // no --resolver: the detection steps are shown
    out.erase("detection");
    EXPECT_EQ(out, json::parse(R"({"resolver": "local", "cluster_spec": {}, "task_type": null, "task_id": null,
        "rpc_layer": null, "master": null, "num_accelerators": {}, "environment": null, "is_chief": true,
        "id_in_cluster": 0, "worker_count": 1, "env_after": {}})"));
  }
}

TEST(StrataInfoClusterTest, OptionsWithoutAResolverAreAnError) {
  const auto r = run_info({"cluster", "--option", "task_id=1"}, std::nullopt);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no cluster resolver was chosen or detected"), std::string::npos) << r.err;
}

TEST(StrataInfoClusterTest, BadOptionsNameTheOption) {
  auto r = run_info({"cluster", "--resolver", "simple", "--option", "task_type=worker"}, std::nullopt);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--option 'task_type=worker'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  r = run_info({"cluster", "--resolver", "simple", "--option", "=1"}, std::nullopt);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is not KEY=JSON"), std::string::npos) << r.err;
}

TEST(StrataInfoClusterTest, UnknownResolverIsNotFound) {
  const auto r = run_info({"cluster", "--resolver", "no_such_resolver"}, std::nullopt);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no_such_resolver"), std::string::npos) << r.err;
}

TEST(StrataInfoClusterTest, ConfigChoosesResolverAndOptionsOverrideIt) {
  test::TempDir dir;
  const std::string cfg = dir.str() + "/job.json";
  std::ofstream(cfg) << R"({"cluster_resolver": {"name": "simple", "options": {
      "cluster_spec": {"worker": ["a:1", "b:1"]}, "task_type": "worker", "task_id": 0}}})";
  // The config wins over auto-detection; --option overrides its options.
  auto r = run_info({"--config", cfg, "cluster", "--option", "task_id=1"}, R"({"cluster": {"worker": ["tf:1"]}})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["resolver"], "simple");
  EXPECT_EQ(out["task_id"], 1);
  EXPECT_EQ(out["master"], "b:1");
  // STRATA_CLUSTER_RESOLVER overrides the config's name (so its options no longer apply).
  // (Two tasks: a one-task TF_CONFIG cluster has master() "", as in TF.)
  r = run_info({"--config", cfg, "cluster"},
               R"({"cluster": {"worker": ["tf:1", "tf:2"]}, "task": {"type": "worker", "index": 0}})",
               {{"STRATA_CLUSTER_RESOLVER", "tf_config"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  out = json::parse(r.out);
  EXPECT_EQ(out["resolver"], "tf_config");
  EXPECT_EQ(out["master"], "tf:1");
}

TEST(StrataInfoClusterTest, HelpShowsTheClusterCommand) {
  const auto r = run_info({"cluster", "--help"}, std::nullopt);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--resolver"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--option"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Example"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace strata
