// SPDX-License-Identifier: Apache-2.0
// Runs the strata-info program and checks its exit status and output.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "strata/c/common.h"
#include "test_util.h"

namespace strata {
namespace {

using test::fixture_dir;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

RunResult run_info(const std::string& args) {
  test::TempDir dir;
  const std::string out_file = dir.str() + "/out", err_file = dir.str() + "/err";
  const std::string cmd = std::string("env -u STRATA_PLUGIN_PATH STRATA_LOG_LEVEL=off '") + STRATA_INFO_BIN + "' " +
                          args + " >'" + out_file + "' 2>'" + err_file + "'";
  RunResult r;
  int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  return r;
}

const nlohmann::json* find_plugin(const nlohmann::json& doc, const std::string& name) {
  for (const auto& p : doc["plugins"])
    if (p["name"] == name) return &p;
  return nullptr;
}

TEST(StrataInfoTest, JsonListsGoodAndRejectedPlugins) {
  RunResult r = run_info("--json --plugin-path '" + fixture_dir("good") + "' --plugin-path '" +
                         fixture_dir("init_fails") + "' --plugin-path '" + fixture_dir("no_entry") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out);  // exactly one JSON document
  ASSERT_TRUE(doc["plugins"].is_array());
  const auto* good = find_plugin(doc, "good");
  ASSERT_NE(good, nullptr) << r.out;
  EXPECT_EQ((*good)["status"], "ok");
  EXPECT_TRUE((*good)["error"].is_null());
  EXPECT_EQ((*good)["kind"], "cluster_resolver");
  EXPECT_EQ((*good)["version"], "1.2.3");
  EXPECT_EQ((*good)["abi"], "1." + std::to_string(STRATA_ABI_MINOR));
  const auto* bad = find_plugin(doc, "initfail");
  ASSERT_NE(bad, nullptr) << r.out;
  EXPECT_EQ((*bad)["status"], "rejected");
  EXPECT_NE((*bad)["error"].get<std::string>().find("fixture init failure"), std::string::npos);
  bool no_entry_seen = false;
  for (const auto& p : doc["plugins"])
    if (p["path"].get<std::string>().find("libstrata-resolver-noentry.so") != std::string::npos) {
      no_entry_seen = true;
      EXPECT_EQ(p["status"], "rejected");
      EXPECT_EQ(p["kind"], "");
      EXPECT_NE(p["error"].get<std::string>().find("strata_plugin_entry_v1"), std::string::npos);
    }
  EXPECT_TRUE(no_entry_seen) << r.out;
}

TEST(StrataInfoTest, TableShowsSearchDirectoriesAndReasons) {
  RunResult r = run_info("--plugin-path '" + fixture_dir("good") + "' --plugin-path '" + fixture_dir("throws") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Search directories"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fixture_dir("good")), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("libstrata-resolver-good.so"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rejected"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("boom from init"), std::string::npos) << r.out;
}

TEST(StrataInfoTest, ExplicitBadPathInConfigFails) {
  test::TempDir dir;
  const std::string bad = fixture_dir("null_required") + "/libstrata-resolver-nullfn.so";
  std::ofstream(dir.str() + "/job.json") << R"({"cluster_resolver": {"name": "nullfn", "path": ")" << bad << "\"}}";
  RunResult r = run_info("--config '" + dir.str() + "/job.json'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("libstrata-resolver-nullfn.so"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("required function 'master'"), std::string::npos) << r.err;
}

TEST(StrataInfoTest, BadConfigFails) {
  test::TempDir dir;
  std::ofstream(dir.str() + "/job.json") << R"({"strategy": {"name": "x",}})";
  RunResult r = run_info("--config '" + dir.str() + "/job.json'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("malformed JSON"), std::string::npos) << r.err;
}

TEST(StrataInfoTest, HelpDescribesUsageWithAnExample) {
  RunResult r = run_info("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("Example"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--plugin-path"), std::string::npos) << r.out;
  EXPECT_NE(run_info("--no-such-flag").exit_code, 0);
}

}  // namespace
}  // namespace strata
