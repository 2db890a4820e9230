// SPDX-License-Identifier: Apache-2.0
// `srun -n 2 strata-train --strategy multi_worker_mirrored` without srun:
// two strata-train processes get the environment srun gives the two tasks
// of a one-node step (SLURM_PROCID, SLURM_STEP_*, CUDA_VISIBLE_DEVICES) and
// no TF_CONFIG. Core must auto-detect the slurm resolver, apply its
// env_after (each task's CUDA_VISIBLE_DEVICES) and train to the same
// weights as one process with one device. The real Slurm cluster run is in
// CI (.ci/run); this one runs everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subprocess.h"

namespace strata {
namespace {

using nlohmann::json;
using test::EnvEdits;

const std::vector<std::string> kModel = {"--steps",        "30",   "--global-batch", "64", "--features", "8",
                                         "--hidden",       "16",   "--classes",      "3",  "--lr",       "0.5",
                                         "--dataset-size", "1024", "--quiet"};

EnvEdits clean_env() {
  EnvEdits env;
  for (const char* v : {"TF_CONFIG", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_NODELIST",
                        "SLURM_JOB_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                        "CUDA_VISIBLE_DEVICES", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_NAME", "TPU_CONFIG",
                        "STRATA_CLUSTER_RESOLVER", "STRATA_STRATEGY", "STRATA_CONFIG", "STRATA_PLUGIN_PATH"})
    env[v] = std::nullopt;
  env["STRATA_AUTH_TOKEN"] = "slurm-train-test";
  // See tests/mwms: GCC 12's LeakSanitizer can crash reading dynamic TLS.
  if (std::getenv("LSAN_OPTIONS") == nullptr) env["LSAN_OPTIONS"] = "use_tls=0";
  return env;
}

std::vector<std::string> train(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {STRATA_TRAIN_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), kModel.begin(), kModel.end());
  return argv;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return in.good() ? json::parse(in) : json();
}

TEST(SlurmTrainTest, TwoTasksOfAStepTrainLikeOneDevice) {
  test::TempDir dir;
  const std::string ref_path = dir.str() + "/ref.json";
  {
    const auto r = test::run_program(train({"--strategy", "one_device", "--save", ref_path}), clean_env(), 120);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  // The chief serves the rendezvous on port_base (its local index is 0):
  // a free port keeps parallel test runs apart. No name: auto-detection
  // still chooses the resolver, the options apply to it.
  const uint16_t port = test::unused_port();
  const std::string cfg = dir.str() + "/job.json";
  std::ofstream(cfg) << json{{"cluster_resolver", {{"options", {{"port_base", port}}}}}}.dump();

  std::vector<std::unique_ptr<test::Subprocess>> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    EnvEdits env = clean_env();
    env["SLURM_PROCID"] = std::to_string(rank);
    env["SLURM_STEP_NUM_TASKS"] = "2";
    env["SLURM_STEP_NODELIST"] = "127.0.0.1";
    env["SLURM_STEP_TASKS_PER_NODE"] = "2";
    env["CUDA_VISIBLE_DEVICES"] = "0,1";  // two GPUs on the node, one per task
    env["STRATA_LOG_LEVEL"] = "info";
    env["STRATA_LOG_SUBSYS"] = "cluster";
    tasks.push_back(
        std::make_unique<test::Subprocess>(train({"--strategy", "multi_worker_mirrored", "--config", cfg, "--save",
                                                  dir.str() + "/rank" + std::to_string(rank) + ".json"}),
                                           env));
  }
  std::vector<test::ProcResult> results;
  for (auto& t : tasks) results.push_back(t->wait(180));
  for (int rank = 0; rank < 2; ++rank) {
    const auto& r = results[static_cast<std::size_t>(rank)];
    ASSERT_FALSE(r.timed_out) << "rank " << rank;
    ASSERT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out << r.err;
    const std::string log = r.out + r.err;
    EXPECT_NE(log.find("cluster resolver 'slurm': auto-detected: SLURM_PROCID and SLURM_STEP_NODELIST are set"), std::string::npos) << log;
    EXPECT_NE(log.find("sets CUDA_VISIBLE_DEVICES=" + std::to_string(rank) + " (was '0,1')"), std::string::npos) << log;
  }
  const json ref = read_json(ref_path);
  const json got = read_json(dir.str() + "/rank0.json");
  ASSERT_TRUE(ref.contains("weights"));
  ASSERT_TRUE(got.contains("weights")) << "the chief (rank 0) writes --save";
  EXPECT_FALSE(read_json(dir.str() + "/rank1.json").contains("weights")) << "only the chief writes --save";
  for (auto& [name, w] : ref["weights"].items()) {
    const json& a = got["weights"][name]["data"];
    const json& b = w["data"];
    ASSERT_EQ(a.size(), b.size()) << name;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double x = a[i].get<double>(), y = b[i].get<double>();
      EXPECT_LE(std::fabs(x - y), 1e-5 * std::fabs(y) + 1e-7) << name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace strata
