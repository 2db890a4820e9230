// SPDX-License-Identifier: Apache-2.0
// Unit tests of the Slurm environment rules in strata_resolver_common:
// hostlists, tasks-per-node lists, the block layout of ranks, job splits,
// ports, GPU assignment and every error, on SlurmEnv snapshots (no process
// environment involved). The same rules through the plugin and strata-info
// are in cluster_resolvers_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slurm.h"
#include "strata/error.hpp"
#include "test_support.h"

namespace strata::resolvers {
namespace {

using nlohmann::json;
using Hosts = std::vector<std::string>;

struct HostlistCase {
  const char* text;
  Hosts hosts;
};

TEST(SlurmHostlistTest, ExpandsEveryForm) {
  const std::vector<HostlistCase> cases = {
      {"a", {"a"}},
      {"t02n13,t02n41,t03n[01-03]", {"t02n13", "t02n41", "t03n01", "t03n02", "t03n03"}},
      {"a[1-2]b[3,5]", {"a1b3", "a1b5", "a2b3", "a2b5"}},
      {"n[08-11]", {"n08", "n09", "n10", "n11"}},
      {"n[9-11]", {"n9", "n10", "n11"}},
      {"n[1-3,7,010-011]", {"n1", "n2", "n3", "n7", "n010", "n011"}},
      {"x[1-2]-ib", {"x1-ib", "x2-ib"}},
      {"node-1,node-2.cluster", {"node-1", "node-2.cluster"}},
      {"[1-2]", {"1", "2"}},
      {"gpu[1,3],cpu[01-02],login", {"gpu1", "gpu3", "cpu01", "cpu02", "login"}},
      {"r[1-2]n[1-2]x", {"r1n1x", "r1n2x", "r2n1x", "r2n2x"}},
      {"n[5]", {"n5"}},
      {"n[007]", {"n007"}},
  };
  for (const auto& c : cases) EXPECT_EQ(expand_hostlist(c.text, "SLURM_STEP_NODELIST"), c.hosts) << c.text;
}

TEST(SlurmHostlistTest, MalformedListsNameTheVariableAndTheFix) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"", "is empty"},
      {"a,,b", "empty host name"},
      {"a,", "empty host name"},
      {",a", "empty host name"},
      {"a[1-2", "never closed"},
      {"a]1", "unmatched ']'"},
      {"a[[1]]", "do not nest"},
      {"a[]", "has the entry ''"},
      {"a[2-1]", "runs backwards"},
      {"a[x]", "has the entry 'x'"},
      {"a[1-]", "has the entry '1-'"},
      {"a[-1]", "has the entry '-1'"},
      {"a[1,,2]", "has the entry ''"},
      {"a b", "whitespace"},
      // Found by slurm_fuzz: a byte that is not text made describe() throw.
      {"a[02-03]b\x80[3,5]", "the character 0x80 at position 9"},
      {"n1;rm", "the character 0x3b"},
      {"a[0-99999999]", "more than"},
      {"a[0-999]b[0-999]c[0-9]", "more than"},
  };
  for (const auto& [text, what] : cases) {
    try {
      expand_hostlist(text, "SLURM_STEP_NODELIST");
      ADD_FAILURE() << "no error for '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << text;
      const std::string msg = e.what();
      EXPECT_NE(msg.find("SLURM_STEP_NODELIST"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << text << ": " << msg;
      EXPECT_NE(msg.find("e.g."), std::string::npos) << msg;  // every message shows a valid form
    }
  }
}

TEST(SlurmTasksPerNodeTest, ExpandsEveryForm) {
  EXPECT_EQ(expand_tasks_per_node("2(x3),1", "V"), (std::vector<int32_t>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("4", "V"), (std::vector<int32_t>{4}));
  EXPECT_EQ(expand_tasks_per_node("1,2,3", "V"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(expand_tasks_per_node("1(x1)", "V"), (std::vector<int32_t>{1}));
  EXPECT_EQ(expand_tasks_per_node("3(x2),2(x2)", "V"), (std::vector<int32_t>{3, 3, 2, 2}));
  EXPECT_EQ(expand_tasks_per_node("16(x10)", "V").size(), 10u);
}

TEST(SlurmTasksPerNodeTest, MalformedListsAreErrors) {
  for (const char* text : {"", "2(x3", "2(3)", "x", "0", "2(x0)", "2,,1", "-1", "2(x3)1", "2(x)", "(x2)", "1,",
                           "2 (x3)", "99999999999", "1(x9999999999)"}) {
    try {
      expand_tasks_per_node(text, "SLURM_STEP_TASKS_PER_NODE");
      ADD_FAILURE() << "no error for '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << text;
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << e.what();
    }
  }
}

// A Slurm step of `tasks_per_node` on `nodes`, seen from `rank`.
SlurmEnv step(int rank, const char* nodes, const char* tasks_per_node, int ntasks) {
  SlurmEnv e;
  e.procid = std::to_string(rank);
  e.nodelist = nodes;
  e.tasks_per_node = tasks_per_node;
  e.num_tasks = std::to_string(ntasks);
  return e;
}

int32_t no_driver() { return 0; }

TEST(SlurmResolveTest, DefaultJobIsAllWorkersInBlockOrderWithPortsByLocalIndex) {
  const json spec = json::parse(R"({"worker": ["n1:8888", "n1:8889", "n2:8888", "n2:8889", "n2:8890"]})");
  for (int rank = 0; rank < 5; ++rank) {
    const SlurmResult r = resolve_slurm(step(rank, "n[1-2]", "2,3", 5), json::object(), no_driver);
    EXPECT_EQ(r.resolution.cluster.json, spec);
    EXPECT_EQ(r.resolution.task_type, "worker");
    EXPECT_EQ(r.resolution.task_id, rank);
    EXPECT_EQ(r.node, rank < 2 ? "n1" : "n2");
    EXPECT_EQ(r.local_index, rank < 2 ? rank : rank - 2);
    EXPECT_EQ(r.resolution.rpc_layer, "grpc");
    EXPECT_EQ(r.resolution.master(nullptr, -1, nullptr, "x"), "grpc://" + spec["worker"][rank].get<std::string>());
  }
}

TEST(SlurmResolveTest, LayoutFollowsTheStepsDistribution) {
  // Block (default), cyclic and plane, as srun -m lays tasks out; the node
  // capacities come from the tasks per node. Seen on the CI's Slurm cluster:
  // with -m cyclic over n[1-2] / 2(x2), rank 1 runs on n2 with SLURM_LOCALID 0.
  auto places = [](const std::vector<int32_t>& tpn, const std::string& dist, int64_t plane) {
    std::string s;
    for (const TaskPlace& t : lay_out_tasks(tpn, dist, plane))
      s += std::to_string(t.node) + "." + std::to_string(t.local) + " ";
    return s;
  };
  EXPECT_EQ(places({2, 2}, "block", 1), "0.0 0.1 1.0 1.1 ");
  EXPECT_EQ(places({2, 2}, "cyclic", 1), "0.0 1.0 0.1 1.1 ");
  EXPECT_EQ(places({3, 1}, "cyclic", 1), "0.0 1.0 0.1 0.2 ");
  EXPECT_EQ(places({4, 4}, "plane", 2), "0.0 0.1 1.0 1.1 0.2 0.3 1.2 1.3 ");
  EXPECT_EQ(places({3, 1, 2}, "plane", 2), "0.0 0.1 1.0 2.0 2.1 0.2 ");

  SlurmEnv e = step(1, "n[1-2]", "2(x2)", 4);
  e.distribution = "cyclic:block";  // srun -m cyclic; the part after ':' is within a node
  const SlurmResult r = resolve_slurm(e, json::object(), no_driver);
  EXPECT_EQ(r.node, "n2");
  EXPECT_EQ(r.local_index, 0);
  EXPECT_EQ(r.resolution.cluster.json, json::parse(R"({"worker": ["n1:8888", "n2:8888", "n1:8889", "n2:8889"]})"));
  // GPUs follow the task's real place on its node.
  e.cuda_visible_devices = "0,1";
  EXPECT_EQ(resolve_slurm(e, json::object(), no_driver).visible_devices, "0");

  e.distribution = "arbitrary";
  try {
    (void)resolve_slurm(e, json::object(), no_driver);
    ADD_FAILURE() << "no error for an arbitrary distribution";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("srun -m block"), std::string::npos) << err.what();
  }
  // Found by slurm_fuzz: a huge task count once built an address per task.
  SlurmEnv huge = step(2, "n", "444217217", 444217217);
  EXPECT_THROW((void)resolve_slurm(huge, json::object(), no_driver), InvalidArgumentError);

  e.distribution = "plane";
  EXPECT_THROW((void)resolve_slurm(e, json::object(), no_driver), InvalidArgumentError);
  e.plane_size = "2";
  EXPECT_EQ(resolve_slurm(e, json::object(), no_driver).node, "n1");  // plane=2: ranks 0,1 on n1
  e.plane_size.reset();
  e.distribution = "plane=2";  // the size inline
  EXPECT_EQ(resolve_slurm(e, json::object(), no_driver).node, "n1");
  e.distribution = "plane=0";
  EXPECT_THROW((void)resolve_slurm(e, json::object(), no_driver), InvalidArgumentError);
  // Pack/NoPack after ',' does not change the node-level layout.
  e.distribution = "cyclic,Pack";
  EXPECT_EQ(resolve_slurm(e, json::object(), no_driver).node, "n2");
  e.distribution = "block:cyclic,NoPack";
  EXPECT_EQ(resolve_slurm(e, json::object(), no_driver).node, "n1");
}

TEST(SlurmResolveTest, JobsTakeConsecutiveRanksInNameOrder) {
  const json opts = {{"jobs", {{"worker", 3}, {"ps", 1}}}, {"port_base", 2222}};
  const json spec = json::parse(R"({"ps": ["a:2222"], "worker": ["a:2223", "b:2222", "b:2223"]})");
  const std::vector<std::pair<std::string, int>> want = {{"ps", 0}, {"worker", 0}, {"worker", 1}, {"worker", 2}};
  for (int rank = 0; rank < 4; ++rank) {
    const SlurmResult r = resolve_slurm(step(rank, "a,b", "2(x2)", 4), opts, no_driver);
    EXPECT_EQ(r.resolution.cluster.json, spec);
    EXPECT_EQ(r.resolution.task_type, want[rank].first);
    EXPECT_EQ(r.resolution.task_id, want[rank].second);
  }
  // "chief" sorts before "worker": the chief is rank 0.
  const SlurmResult c = resolve_slurm(step(0, "a,b", "2(x2)", 4), {{"jobs", {{"worker", 3}, {"chief", 1}}}}, no_driver);
  EXPECT_EQ(c.resolution.task_type, "chief");
  EXPECT_EQ(c.resolution.cluster.json["chief"], json::array({"a:8888"}));
  // A job of zero tasks is listed empty.
  const SlurmResult z = resolve_slurm(step(1, "a", "2", 2), {{"jobs", {{"evaluator", 0}, {"worker", 2}}}}, no_driver);
  EXPECT_EQ(z.resolution.cluster.json["evaluator"], json::array());
  EXPECT_EQ(z.resolution.task_id, 1);
}

TEST(SlurmResolveTest, GpusFromCudaVisibleDevicesAreSplitByLocalIndex) {
  SlurmEnv e = step(3, "n[1-2]", "2(x2)", 4);
  e.cuda_visible_devices = "0,1,2,3";
  bool asked_driver = false;
  SlurmResult r = resolve_slurm(e, json::object(), [&] {
    asked_driver = true;
    return 8;
  });
  EXPECT_FALSE(asked_driver);  // CUDA_VISIBLE_DEVICES is authoritative when set
  EXPECT_EQ(r.gpus_per_node, 4);
  EXPECT_EQ(r.gpus_per_task, 2);
  EXPECT_EQ(r.visible_devices, "2,3");
  EXPECT_EQ(r.env_after, json({{"CUDA_VISIBLE_DEVICES", "2,3"}}));
  EXPECT_EQ(r.resolution.num_accelerators, json({{"GPU", 2}}));
  // Physical ids given by Slurm's GRES binding are kept.
  e.cuda_visible_devices = "4,5,6,7";
  r = resolve_slurm(e, json::object(), no_driver);
  EXPECT_EQ(r.visible_devices, "6,7");
  // Explicit gpus_per_task.
  r = resolve_slurm(e, {{"gpus_per_task", 1}}, no_driver);
  EXPECT_EQ(r.visible_devices, "5");
  EXPECT_EQ(r.resolution.num_accelerators, json({{"GPU", 1}}));
  // auto_set_gpu false: the GPUs are still described, the environment is left
  // alone.
  r = resolve_slurm(e, {{"auto_set_gpu", false}}, no_driver);
  EXPECT_EQ(r.env_after, json::object());
  EXPECT_EQ(r.resolution.num_accelerators, json({{"GPU", 2}}));
  // Set but empty: no GPU, and the driver is not asked.
  e.cuda_visible_devices = "";
  r = resolve_slurm(e, json::object(), [&] {
    asked_driver = true;
    return 8;
  });
  EXPECT_FALSE(asked_driver);
  EXPECT_EQ(r.gpus_per_node, 0);
  EXPECT_EQ(r.env_after, json::object());
  EXPECT_EQ(r.resolution.num_accelerators, json({{"GPU", 0}}));
  e.cuda_visible_devices = "NoDevFiles";
  EXPECT_EQ(resolve_slurm(e, json::object(), no_driver).gpus_per_node, 0);
}

TEST(SlurmResolveTest, GpusFromTheDriverOrTheOption) {
  SlurmEnv e = step(1, "n1", "2", 2);
  SlurmResult r = resolve_slurm(e, json::object(), [] { return 4; });
  EXPECT_EQ(r.gpus_per_node, 4);
  EXPECT_EQ(r.visible_devices, "2,3");
  r = resolve_slurm(e, {{"gpus_per_node", 8}}, [] { return 4; });
  EXPECT_EQ(r.gpus_per_node, 8);
  EXPECT_EQ(r.visible_devices, "4,5,6,7");
  // Fewer GPUs than tasks: none per task, nothing set.
  r = resolve_slurm(e, json::object(), [] { return 1; });
  EXPECT_EQ(r.gpus_per_task, 0);
  EXPECT_EQ(r.env_after, json::object());
}

TEST(SlurmResolveTest, TasksPerNodeOptionOverridesTheEnvironment) {
  SlurmEnv e = step(2, "n[1-2]", "2(x2)", 4);
  const SlurmResult r = resolve_slurm(e, {{"tasks_per_node", {{"n1", 1}, {"n2", 3}}}}, no_driver);
  EXPECT_EQ(r.resolution.cluster.json, json::parse(R"({"worker": ["n1:8888", "n2:8888", "n2:8889", "n2:8890"]})"));
  EXPECT_EQ(r.node, "n2");
  EXPECT_EQ(r.local_index, 1);
  // Without the environment's counts the option is enough.
  e.tasks_per_node.reset();
  EXPECT_EQ(resolve_slurm(e, {{"tasks_per_node", {{"n1", 2}, {"n2", 2}}}}, no_driver).local_index, 0);
}

// Follows TF's slurm_cluster_resolver_test.py testSimpleSuccessfulRetrieval
// and testSimpleMasterRetrieval: an integer tasks_per_node applies to every
// node of the step's node list, and SLURM_STEP_TASKS_PER_NODE is not needed.
TEST(SlurmResolveTest, TasksPerNodeIntegerAppliesToEveryNode) {
  SlurmEnv e = step(0, "t02n13,t02n41,t02n43", "1(x3)", 3);
  e.tasks_per_node.reset();
  const json opts = {{"jobs", {{"ps", 1}, {"worker", 2}}}, {"port_base", 8888}, {"tasks_per_node", 1},
                     {"gpus_per_node", 1}, {"gpus_per_task", 1}, {"auto_set_gpu", false}};
  const SlurmResult r = resolve_slurm(e, opts, no_driver);
  EXPECT_EQ(r.resolution.cluster.json,
            json::parse(R"({"ps": ["t02n13:8888"], "worker": ["t02n41:8888", "t02n43:8888"]})"));
  EXPECT_EQ(r.tasks_per_node, (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(r.resolution.master("worker", 1, nullptr, "x"), "grpc://t02n43:8888");
  EXPECT_EQ(r.resolution.master("ps", 0, "test", "x"), "test://t02n13:8888");
  EXPECT_EQ(r.env_after, json::object());  // auto_set_gpu false

  // The integer overrides the environment's counts, as the map does.
  SlurmEnv two = step(3, "n[1-2]", "1(x2)", 4);
  const SlurmResult r2 = resolve_slurm(two, {{"tasks_per_node", 2}}, no_driver);
  EXPECT_EQ(r2.resolution.cluster.json,
            json::parse(R"({"worker": ["n1:8888", "n1:8889", "n2:8888", "n2:8889"]})"));
  EXPECT_EQ(r2.node, "n2");
  EXPECT_EQ(r2.local_index, 1);
}

// Follows TF's SlurmClusterResolver.__init__ (tasks_per_node given as a
// dict): the map is the whole task configuration, so neither a node list
// nor SLURM_STEP_TASKS_PER_NODE nor a task count is read; nodes are taken
// in name order, as TF sorts them. Only the rank (SLURM_PROCID) remains.
TEST(SlurmResolveTest, TasksPerNodeMapNeedsNoSlurmNodeVariables) {
  SlurmEnv e;
  e.procid = "1";
  const SlurmResult r = resolve_slurm(e, {{"tasks_per_node", {{"t02n41", 1}, {"t02n13", 2}}}}, no_driver);
  EXPECT_EQ(r.hosts, (Hosts{"t02n13", "t02n41"}));
  EXPECT_EQ(r.resolution.cluster.json, json::parse(R"({"worker": ["t02n13:8888", "t02n13:8889", "t02n41:8888"]})"));
  EXPECT_EQ(r.resolution.task_type, "worker");
  EXPECT_EQ(r.resolution.task_id, 1);
  EXPECT_EQ(r.node, "t02n13");
  EXPECT_EQ(r.local_index, 1);
  EXPECT_EQ(r.resolution.master(nullptr, -1, nullptr, "x"), "grpc://t02n13:8889");

  // With jobs, as in TF's multi-job examples.
  e.procid = "0";
  const SlurmResult j =
      resolve_slurm(e, {{"jobs", {{"ps", 1}, {"worker", 2}}}, {"tasks_per_node", {{"a", 1}, {"b", 2}}}}, no_driver);
  EXPECT_EQ(j.resolution.cluster.json, json::parse(R"({"ps": ["a:8888"], "worker": ["b:8888", "b:8889"]})"));
  EXPECT_EQ(j.resolution.task_type, "ps");

  // The rank is still needed: it is what no option can give.
  e.procid.reset();
  try {
    resolve_slurm(e, {{"tasks_per_node", {{"a", 1}}}}, no_driver);
    ADD_FAILURE() << "no error without SLURM_PROCID";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("SLURM_PROCID is not set"), std::string::npos) << err.what();
  }
}

TEST(SlurmResolveTest, RpcLayerAndTaskCountFallback) {
  SlurmEnv e = step(0, "n1", "1", 1);
  e.num_tasks.reset();  // neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS: the
                        // counts decide
  SlurmResult r = resolve_slurm(e, {{"rpc_layer", ""}}, no_driver);
  EXPECT_FALSE(r.resolution.rpc_layer.has_value());
  EXPECT_EQ(r.resolution.master(nullptr, -1, nullptr, "x"), "n1:8888");
  r = resolve_slurm(e, {{"rpc_layer", "grpc+verbs"}}, no_driver);
  EXPECT_EQ(r.resolution.master(nullptr, -1, nullptr, "x"), "grpc+verbs://n1:8888");
  const json d = r.describe();
  EXPECT_EQ(d["slurm"]["node"], "n1");
  EXPECT_EQ(d["env_after"], json::object());
}

struct ErrorCase {
  const char* name;
  SlurmEnv env;
  json options;
  std::vector<const char*> words;  // every one must be in the message
};

TEST(SlurmResolveTest, EveryErrorNamesTheCauseAndTheFix) {
  auto with = [](SlurmEnv e, auto&& edit) {
    edit(e);
    return e;
  };
  const SlurmEnv ok = step(0, "n[1-2]", "2(x2)", 4);
  const std::vector<ErrorCase> cases = {
      {"more GPUs than present",
       with(ok, [](SlurmEnv& e) { e.cuda_visible_devices = "0,1,2,3"; }),
       {{"gpus_per_task", 3}},
       {"requested more GPUs per node than available", "gpus_per_task", "CUDA_VISIBLE_DEVICES", "needs 6"}},
      {"jobs do not add up", ok, {{"jobs", {{"ps", 1}, {"worker", 2}}}}, {"asks for 3", "has 4", "srun -n 3"}},
      {"jobs not an object", ok, {{"jobs", 4}}, {"option 'jobs'", "{\"ps\": 1, \"worker\": 3}"}},
      {"negative job count", ok, {{"jobs", {{"worker", -4}}}}, {"option 'jobs'", "non-negative"}},
      {"malformed node list",
       with(ok, [](SlurmEnv& e) { e.nodelist = "n[1-2"; }),
       json::object(),
       {"SLURM_STEP_NODELIST", "never closed"}},
      {"malformed tasks per node",
       with(ok, [](SlurmEnv& e) { e.tasks_per_node = "2(3)"; }),
       json::object(),
       {"SLURM_STEP_TASKS_PER_NODE", "N(xM)"}},
      {"rank out of range",
       with(ok, [](SlurmEnv& e) { e.procid = "4"; }),
       json::object(),
       {"SLURM_PROCID=4", "out of range", "0..3"}},
      {"rank not a number",
       with(ok, [](SlurmEnv& e) { e.procid = "x"; }),
       json::object(),
       {"SLURM_PROCID='x'", "srun"}},
      {"no rank", with(ok, [](SlurmEnv& e) { e.procid.reset(); }), json::object(), {"SLURM_PROCID is not set", "srun"}},
      {"no node list",
       with(ok, [](SlurmEnv& e) { e.nodelist.reset(); }),
       json::object(),
       {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}},
      {"no tasks per node",
       with(ok, [](SlurmEnv& e) { e.tasks_per_node.reset(); }),
       json::object(),
       {"SLURM_STEP_TASKS_PER_NODE", "tasks_per_node"}},
      {"nodes vs counts",
       with(ok, [](SlurmEnv& e) { e.tasks_per_node = "2(x3)"; }),
       json::object(),
       {"gives 3 node(s)", "lists 2", "SLURM_STEP_NODELIST"}},
      {"task count vs counts",
       with(ok,
            [](SlurmEnv& e) {
              e.num_tasks = "5";
              e.num_tasks_var = "SLURM_NTASKS";
            }),
       json::object(),
       {"SLURM_NTASKS=5", "add up to 4"}},
      {"job node list fallback named",
       with(ok,
            [](SlurmEnv& e) {
              e.nodelist = "a,,b";
              e.nodelist_var = "SLURM_JOB_NODELIST";
            }),
       json::object(),
       {"SLURM_JOB_NODELIST", "empty host name"}},
      {"unknown option", ok, {{"port", 1}}, {"unknown option 'port'", "port_base"}},
      {"tasks_per_node misses a node", ok, {{"tasks_per_node", {{"n1", 4}}}}, {"no count for node 'n2'"}},
      {"tasks_per_node names a stranger",
       ok,
       {{"tasks_per_node", {{"n1", 2}, {"n2", 1}, {"n9", 1}}}},
       {"node 'n9'", "not in SLURM_STEP_NODELIST"}},
      {"tasks_per_node bad count", ok, {{"tasks_per_node", {{"n1", 0}, {"n2", 4}}}}, {"positive integer"}},
      {"tasks_per_node zero for every node", ok, {{"tasks_per_node", 0}}, {"every node", "positive integer"}},
      {"tasks_per_node neither count nor map",
       ok,
       {{"tasks_per_node", "2"}},
       {"option 'tasks_per_node'", "e.g. 2", "{\"node1\": 2, \"node2\": 1}"}},
      {"tasks_per_node empty map", ok, {{"tasks_per_node", json::object()}}, {"empty object", "node1"}},
      {"tasks_per_node integer needs a node list",
       with(ok, [](SlurmEnv& e) { e.nodelist.reset(); }),
       {{"tasks_per_node", 2}},
       {"SLURM_STEP_NODELIST", "tasks_per_node as a map"}},
      {"tasks_per_node map with count mismatch",
       with(ok, [](SlurmEnv& e) { e.nodelist.reset(); }),
       {{"tasks_per_node", {{"a", 1}}}},
       {"SLURM_STEP_NUM_TASKS=4", "add up to 1"}},
      {"duplicate node", with(ok, [](SlurmEnv& e) { e.nodelist = "n1,n[1-2]"; }), json::object(), {"twice"}},
      {"port range", ok, {{"port_base", 65535}}, {"beyond 65535", "port_base"}},
      {"port_base type", ok, {{"port_base", "8888"}}, {"option 'port_base'", "integer"}},
      {"auto_set_gpu type", ok, {{"auto_set_gpu", 1}}, {"auto_set_gpu", "true or false"}},
      {"rpc_layer type", ok, {{"rpc_layer", 3}}, {"rpc_layer", "string"}},
      {"two chiefs", ok, {{"jobs", {{"chief", 2}, {"worker", 2}}}}, {"at most one chief"}},
  };
  for (const auto& c : cases) {
    try {
      resolve_slurm(c.env, c.options, [] { return 0; });
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << c.name;
      for (const char* w : c.words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << c.name << ": " << e.what();
    }
  }
}

// ---- the driver probe: `nvidia-smi -L` with a deadline -----------------------

/// Puts a directory holding an executable `nvidia-smi` script first on PATH
/// for one scope.
class FakeNvidiaSmi {
 public:
  explicit FakeNvidiaSmi(const std::string& script) {
    const std::string path = dir_.str() + "/nvidia-smi";
    std::ofstream(path) << "#!/bin/sh\n" << script << "\n";
    ::chmod(path.c_str(), 0755);
    if (const char* p = std::getenv("PATH")) old_ = p;
    ::setenv("PATH", (dir_.str() + ":" + old_.value_or("/usr/bin:/bin")).c_str(), 1);
  }
  ~FakeNvidiaSmi() {
    if (old_) ::setenv("PATH", old_->c_str(), 1);
    else ::unsetenv("PATH");
  }

 private:
  test::TempDir dir_;
  std::optional<std::string> old_;
};

bool driver_lists_gpus() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia/gpus", ec);
}

TEST(SlurmDriverProbeTest, CountsTheGpuLinesOfNvidiaSmi) {
  if (driver_lists_gpus()) GTEST_SKIP() << "this machine has an NVIDIA driver; /proc answers before nvidia-smi";
  FakeNvidiaSmi smi(
      "[ \"$1\" = -L ] || exit 3\n"
      "echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n"
      "echo '  MIG 1g.10gb Device 0: (UUID: MIG-3)'");
  EXPECT_EQ(count_driver_gpus(10), 2);
}

TEST(SlurmDriverProbeTest, FailingOrMissingNvidiaSmiMeansNoGpu) {
  if (driver_lists_gpus()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  {
    FakeNvidiaSmi smi("echo 'GPU 0: X'; exit 9");  // output of a failed run is not trusted
    EXPECT_EQ(count_driver_gpus(10), 0);
  }
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", "/nonexistent", 1);
  EXPECT_EQ(count_driver_gpus(10), 0);
  ::setenv("PATH", saved.c_str(), 1);
}

TEST(SlurmDriverProbeTest, HungNvidiaSmiIsKilledAtTheDeadline) {
  if (driver_lists_gpus()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  FakeNvidiaSmi smi("echo 'GPU 0: X'\nexec sleep 30");  // a wedged driver
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(count_driver_gpus(0.3), 0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 5.0);
}

}  // namespace
}  // namespace strata::resolvers
