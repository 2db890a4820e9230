// SPDX-License-Identifier: Apache-2.0
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "strata/config.hpp"
#include "test_support.h"
#include "test_util.h"

namespace strata {
namespace {

using test::ScopedEnv;

template <class E, class F>
std::string expect_throw(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected exception was not thrown";
  return "";
}

using test::contains;

TEST(ConfigTest, ParsesAllPartsAndAccessors) {
  Config c = Config::from_json(R"({
    "strategy": {"name": "mirrored", "options": {"devices": ["cpu:0", "cpu:1"]}},
    "cross_device_ops": {"name": "ring", "options": {"bytes_per_pack": 33554432}},
    "transport": {"name": "tcp", "path": "/opt/libstrata-transport-tcp.so"},
    "cluster_resolver": {"name": "tf_config"},
    "input_pipeline": {"name": "arrays"},
    "timeouts": {"collective_s": 30, "rendezvous_s": 12.5},
    "plugins": {"search_path": ["/a", "/b"]}})");
  EXPECT_TRUE(c.has("strategy"));
  EXPECT_EQ(c.name("strategy"), "mirrored");
  EXPECT_EQ(nlohmann::json::parse(c.options_json("strategy"))["devices"][1], "cpu:1");
  EXPECT_EQ(c.path("transport"), "/opt/libstrata-transport-tcp.so");
  EXPECT_EQ(c.path("strategy"), "");
  EXPECT_DOUBLE_EQ(c.timeout_s("collective_s", 300), 30);
  EXPECT_DOUBLE_EQ(c.timeout_s("rendezvous_s", 300), 12.5);
  EXPECT_EQ(c.search_path(), (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(nlohmann::json::parse(c.json())["cross_device_ops"]["name"], "ring");
}

TEST(ConfigTest, EmptyConfigGivesDefaults) {
  Config c;
  EXPECT_EQ(c.json(), "{}");
  EXPECT_FALSE(c.has("strategy"));
  EXPECT_EQ(c.name("strategy", "default"), "default");
  EXPECT_EQ(c.options_json("strategy"), "{}");
  EXPECT_DOUBLE_EQ(c.timeout_s("collective_s", 300), 300);
  EXPECT_TRUE(c.search_path().empty());
}

TEST(ConfigTest, MalformedJsonNamesOriginAndPosition) {
  std::string msg = expect_throw<InvalidArgumentError>(
      [] { Config::from_json("{\n  \"strategy\": {\"name\": \"x\",}\n}", "job.json"); });
  EXPECT_TRUE(contains(msg, "job.json:2:")) << msg;
  EXPECT_TRUE(contains(msg, "malformed JSON")) << msg;
}

TEST(ConfigTest, UnknownTopLevelKeyListsValidKeys) {
  std::string msg = expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"stratgey": {}})"); });
  EXPECT_TRUE(contains(msg, "\"stratgey\"")) << msg;
  EXPECT_TRUE(contains(msg, "strategy, cross_device_ops, transport, cluster_resolver, input_pipeline, timeouts, plugins, rendezvous"))
      << msg;
}

TEST(ConfigTest, NumberOverflowIsAnErrorNotACrash) {
  // Found by the TF_CONFIG fuzzer: nlohmann-json reports this as out_of_range, not parse_error.
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([] {
                         Config::from_json(R"({"timeouts": {"collective_s": 1e999999}})", "job.json");
                       }),
                       "job.json"));
}

TEST(ConfigTest, RendezvousSectionIsValidated) {
  const Config ok = Config::from_json(R"({"rendezvous": {"auth_token": "s3cret", "address": "10.0.0.1:2222"}})");
  EXPECT_TRUE(ok.has("rendezvous"));
  EXPECT_TRUE(contains(
      expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"rendezvous": {"token": "x"}})"); }),
      "unknown key /rendezvous/token"));
  EXPECT_TRUE(contains(
      expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"rendezvous": {"auth_token": 7}})"); }),
      "/rendezvous/auth_token must be a string"));
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"rendezvous": "x"})"); }),
                       "/rendezvous must be an object"));
}

TEST(ConfigTest, WrongTypesAreRejectedWithThePointer) {
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"strategy": {"name": 3}})"); }),
                       "/strategy/name must be a string"));
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"strategy": "mirrored"})"); }),
                       "/strategy must be an object"));
  EXPECT_TRUE(contains(
      expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"transport": {"options": []}})"); }),
      "/transport/options must be an object"));
  EXPECT_TRUE(contains(
      expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"transport": {"nmae": "tcp"}})"); }),
      "unknown key /transport/nmae"));
  EXPECT_TRUE(contains(
      expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"timeouts": {"collective_s": -1}})"); }),
      "/timeouts/collective_s must be a positive number"));
  EXPECT_TRUE(contains(
      expect_throw<InvalidArgumentError>([] { Config::from_json(R"({"plugins": {"search_path": "/x"}})"); }),
      "/plugins/search_path must be an array"));
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([] { Config::from_json("[1, 2]"); }),
                       "must be a JSON object"));
}

TEST(ConfigTest, FromFileReadsAndReportsMissingFiles) {
  test::TempDir dir;
  const std::string path = dir.str() + "/job.json";
  std::ofstream(path) << R"({"strategy": {"name": "one_device"}})";
  EXPECT_EQ(Config::from_file(path).name("strategy"), "one_device");
  std::string msg = expect_throw<NotFoundError>([&] { Config::from_file(dir.str() + "/missing.json"); });
  EXPECT_TRUE(contains(msg, dir.str() + "/missing.json")) << msg;
  std::ofstream(dir.str() + "/bad.json") << "{ nope";
  msg = expect_throw<InvalidArgumentError>([&] { Config::from_file(dir.str() + "/bad.json"); });
  EXPECT_TRUE(contains(msg, dir.str() + "/bad.json:1:")) << msg;
}

TEST(ConfigTest, EnvironmentOverridesNamesAndTimeouts) {
  ScopedEnv s("STRATA_STRATEGY", "mirrored");
  ScopedEnv x("STRATA_CROSS_DEVICE_OPS", "ring");
  ScopedEnv t("STRATA_TRANSPORT", "");
  ScopedEnv r("STRATA_CLUSTER_RESOLVER", "slurm");
  ScopedEnv c("STRATA_COLLECTIVE_TIMEOUT_S", "42");
  ScopedEnv z("STRATA_RENDEZVOUS_TIMEOUT_S", "7.5");
  ScopedEnv g("STRATA_PS_GRACE_S", "3");
  ScopedEnv o("STRATA_PS_OP_TIMEOUT_S", "20");
  Config cfg = Config::from_json(R"({"strategy": {"name": "one_device", "options": {"device": "cpu:0"}},
                                     "cross_device_ops": {"name": "ring", "options": {"num_packs": 2}},
                                     "transport": {"name": "tcp"}})");
  cfg.apply_env();
  EXPECT_EQ(cfg.name("strategy"), "mirrored");
  // A different component does not inherit the old one's options...
  EXPECT_EQ(cfg.options_json("strategy"), "{}");
  // ...the same one keeps them.
  EXPECT_EQ(nlohmann::json::parse(cfg.options_json("cross_device_ops"))["num_packs"], 2);
  EXPECT_EQ(cfg.name("transport"), "tcp");  // empty variable: no change
  EXPECT_EQ(cfg.name("cluster_resolver"), "slurm");
  EXPECT_DOUBLE_EQ(cfg.timeout_s("collective_s", 0), 42);
  EXPECT_DOUBLE_EQ(cfg.timeout_s("rendezvous_s", 0), 7.5);
  EXPECT_DOUBLE_EQ(cfg.timeout_s("ps_grace_s", 0), 3);
  EXPECT_DOUBLE_EQ(cfg.timeout_s("ps_op_s", 0), 20);
}

TEST(ConfigTest, BadTimeoutEnvironmentNamesTheVariable) {
  ScopedEnv c("STRATA_COLLECTIVE_TIMEOUT_S", "soon");
  Config cfg;
  std::string msg = expect_throw<InvalidArgumentError>([&] { cfg.apply_env(); });
  EXPECT_TRUE(contains(msg, "STRATA_COLLECTIVE_TIMEOUT_S='soon'")) << msg;
  EXPECT_EQ(cfg.json(), "{}");
}

TEST(ConfigTest, SetByPointerValidatesAndKeepsDocumentOnError) {
  Config cfg;
  cfg.set("/strategy/name", "\"mirrored\"");
  cfg.set("/strategy/options", R"({"devices": ["cpu:0"]})");
  EXPECT_EQ(cfg.name("strategy"), "mirrored");
  const std::string before = cfg.json();
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([&] { cfg.set("/strategy/name", "mirrored"); }),
                       "not valid JSON"));
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([&] { cfg.set("/bogus", "1"); }), "unknown top-level key"));
  EXPECT_TRUE(contains(expect_throw<InvalidArgumentError>([&] { cfg.set("no-slash", "1"); }), "JSON pointer"));
  EXPECT_EQ(cfg.json(), before);
}

TEST(ConfigTest, CopiesAreIndependent) {
  Config a = Config::from_json(R"({"strategy": {"name": "a"}})");
  Config b = a;
  b.set("/strategy/name", "\"b\"");
  EXPECT_EQ(a.name("strategy"), "a");
  EXPECT_EQ(b.name("strategy"), "b");
  Config c = std::move(b);
  EXPECT_EQ(c.name("strategy"), "b");
}

}  // namespace
}  // namespace strata
