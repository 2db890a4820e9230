// SPDX-License-Identifier: Apache-2.0
// strata-train --switch-transport end to end: `strata-run -n 4 --
// strata-train --strategy multi_worker_mirrored` switching transports while
// it trains ends with exactly the weights (bit for bit) of the same job that
// never switched; a switch to a transport that does not exist, or with bad
// options, is logged on every worker with the same error and the job
// finishes on its old transport with those same weights; bad
// --switch-transport syntax is a CLI error. Every command runs under
// coreutils timeout, and strata-run reaps its children on every path.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// A clean environment for the job (no inherited cluster or config), under a
// hard deadline.
Result run(const std::string& args, int deadline_s = 120, const std::string& extra_env = "") {
  std::string env = "env -u TF_CONFIG -u STRATA_CONFIG -u STRATA_STRATEGY -u STRATA_AUTH_TOKEN -u STRATA_TRANSPORT ";
  // See mwms_test.cc: GCC 12's LeakSanitizer can crash scanning the TLS of
  // processes that dlopen several plugins.
  if (std::getenv("LSAN_OPTIONS") == nullptr) env += "LSAN_OPTIONS=use_tls=0 ";
  const std::string full = "timeout -k 5 " + std::to_string(deadline_s) + " " + env + extra_env + " " + args + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The lines of `text` that contain `what`, each from `what` on (so without
// strata-run's "[rank] " prefix and the worker number).
std::vector<std::string> lines_from(const std::string& text, const std::string& what) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find(what); at != std::string::npos) out.push_back(line.substr(at));
  return out;
}

const char* const kModel =
    " --steps 50 --global-batch 96 --features 16 --hidden 32 --classes 4 --lr 0.5 --dataset-size 4096";

class SwitchTransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("strata_switch_transport_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // 4 workers under strata-run; returns the chief's weights (null on failure).
  static json train4(const std::string& tag, const std::string& switches, Result* result = nullptr,
                     const std::string& extra_env = "") {
    const fs::path out = dir_ / (tag + ".json");
    const Result r = run(std::string(STRATA_RUN_BIN) + " -n 4 --timeout 100 -- " + STRATA_TRAIN_BIN +
                             " --strategy multi_worker_mirrored --log-every 50" + kModel + " --save " + out.string() +
                             " " + switches,
                         120, extra_env);
    EXPECT_EQ(r.exit_code, 0) << tag << "\n" << r.output;
    if (result != nullptr) *result = r;
    std::ifstream in(out);
    EXPECT_TRUE(in.good()) << tag << ": no weights file\n" << r.output;
    return in.good() ? json::parse(in) : json();
  }

  // The job that never switches (computed once).
  static const json& reference() {
    static const json ref = train4("reference", "");
    return ref;
  }

  static void expect_same_weights(const json& got, const char* what) {
    const json& ref = reference();
    ASSERT_TRUE(ref.contains("weights"));
    ASSERT_TRUE(got.contains("weights")) << what;
    EXPECT_EQ(got["final_loss"], ref["final_loss"]) << what;
    for (auto& [name, w] : ref["weights"].items())
      EXPECT_TRUE(got["weights"][name] == w) << what << ": weight " << name << " is not bit-identical";
  }

  static fs::path dir_;
};

fs::path SwitchTransportTest::dir_;

TEST_F(SwitchTransportTest, SwitchingWhileTrainingKeepsTheWeightsBitIdentical) {
  Result r;
  const json got = train4("tcp_tcp_tcp",
                          "--switch-transport '10:tcp:{\"connections_per_peer\":1}' --switch-transport 25:tcp,40:tcp",
                          &r);
  EXPECT_EQ(count(r.output, "switched to transport tcp {\"connections_per_peer\":1} at step 10"), 4u) << r.output;
  EXPECT_EQ(count(r.output, "switched to transport tcp {} at step 25"), 4u) << r.output;
  EXPECT_EQ(count(r.output, "switched to transport tcp {} at step 40"), 4u) << r.output;
  expect_same_weights(got, "tcp -> tcp(1 connection) -> tcp -> tcp");
}

TEST_F(SwitchTransportTest, SwitchingToLibfabricAndBackKeepsTheWeightsBitIdentical) {
  const fs::path plugin = fs::path(STRATA_PLUGIN_DIR) / "libstrata-transport-libfabric.so";
  if (!fs::exists(plugin)) GTEST_SKIP() << plugin << " is not built";
  Result r;
  const json got = train4("tcp_libfabric",
                          "--switch-transport '10:libfabric:{\"provider\": \"tcp;ofi_rxm\"}' "
                          "--switch-transport '20:libfabric:{\"provider\": \"shm\"}' --switch-transport 30:shmem "
                          "--switch-transport 40:tcp",
                          &r, "FI_TCP_IFACE=lo");
  EXPECT_EQ(count(r.output, "switched to transport libfabric {\"provider\":\"tcp;ofi_rxm\"} at step 10"), 4u)
      << r.output;
  EXPECT_EQ(count(r.output, "switched to transport libfabric {\"provider\":\"shm\"} at step 20"), 4u) << r.output;
  EXPECT_EQ(count(r.output, "switched to transport shmem {} at step 30"), 4u) << r.output;
  EXPECT_EQ(count(r.output, "switched to transport tcp {} at step 40"), 4u) << r.output;
  expect_same_weights(got, "tcp -> libfabric(tcp;ofi_rxm) -> libfabric(shm) -> shmem -> tcp");
}

TEST_F(SwitchTransportTest, FailedSwitchIsLoggedEverywhereAndTrainingGoesOn) {
  Result r;
  const json got = train4("failed",
                          "--switch-transport 10:no_such_transport "
                          "--switch-transport '20:tcp:{\"no_such_option\":1}' "
                          "--switch-transport '30:tcp:{\"connections_per_peer\":1}'",
                          &r);
  for (const char* step : {"10", "20"}) {
    const std::vector<std::string> lines = lines_from(r.output, std::string("failed at step ") + step);
    ASSERT_EQ(lines.size(), 4u) << "every worker logs the failure at step " << step << "\n" << r.output;
    for (const std::string& l : lines) EXPECT_EQ(l, lines[0]) << "the same error on every worker";
    EXPECT_NE(lines[0].find("continuing on the current transport"), std::string::npos) << lines[0];
  }
  EXPECT_NE(r.output.find("no_such_transport"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no_such_option"), std::string::npos) << r.output;
  // After two failures the swap counters still agree: the third switch works.
  EXPECT_EQ(count(r.output, "at step 30"), 4u) << r.output;
  EXPECT_EQ(count(r.output, "switched to transport"), 4u) << r.output;
  expect_same_weights(got, "after failed switches");
}

TEST_F(SwitchTransportTest, BadSyntaxIsACliError) {
  const std::string base = std::string(STRATA_TRAIN_BIN) + " --strategy one_device --steps 10 --quiet";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tcp", "has no ':'"},
      {"x:tcp", "'x' is not a non-negative integer"},
      {"=-1:tcp", "'-1' is not a non-negative integer"},
      {"5:", "transport name after '5:' is empty"},
      {"10:tcp", "not below --steps 10"},
      {"'5:tcp:{bad'", "are not a JSON object"},
      {"'5:tcp:[1]'", "are not a JSON object"},
      {"5:tcp,,6:tcp", "comma-separated list is empty"},
      {"5:tcp,", "comma-separated list is empty"},
  };
  for (const auto& [value, why] : cases) {
    const Result r = run(base + " --switch-transport" + (value[0] == '=' ? "" : " ") + value, 30);
    EXPECT_EQ(r.exit_code, 2) << value << "\n" << r.output;
    EXPECT_NE(r.output.find("--switch-transport"), std::string::npos) << value << "\n" << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << value << "\n" << r.output;
  }
  const Result help = run(std::string(STRATA_TRAIN_BIN) + " --help", 30);
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--switch-transport"), std::string::npos) << help.output;
}

TEST_F(SwitchTransportTest, StrategyWithoutATransportLogsAndTrains) {
  // one_device has no transport: every switch fails as UNIMPLEMENTED, is
  // logged, and training finishes.
  const Result r = run(std::string(STRATA_TRAIN_BIN) + " --strategy one_device --steps 5" +
                           " --global-batch 16 --features 4 --hidden 8 --classes 2 --dataset-size 64"
                           " --switch-transport 1:tcp,3:tcp",
                       30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "(UNIMPLEMENTED)"), 2u) << r.output;
  EXPECT_NE(r.output.find("'one_device'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trained 5 steps"), std::string::npos) << r.output;
}

}  // namespace
