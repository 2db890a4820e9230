// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/options.hpp"

#include <gtest/gtest.h>

#include "strata/sdk/local_strategy.hpp"

namespace strata::sdk {
namespace {

TEST(OptionsTest, ParsesAndRejectsUnknownKeys) {
  EXPECT_TRUE(parse_options(nullptr, "x").empty());
  EXPECT_TRUE(parse_options("", "x").empty());
  EXPECT_THROW(parse_options("[1]", "x"), InvalidArgumentError);
  EXPECT_THROW(parse_options("{bad", "x"), InvalidArgumentError);
  const auto o = parse_options(R"({"a": 1, "zzz": 2})", "comp");
  try {
    check_known_keys(o, {"a", "b"}, "comp");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'zzz'"), std::string::npos) << m;
    EXPECT_NE(m.find("a, b"), std::string::npos) << m;
  }
}

TEST(OptionsTest, TypedOptions) {
  const auto o = parse_options(R"({"n": 3, "s": "x", "neg": -1, "f": 1.5})", "comp");
  EXPECT_EQ(get_option<int>(o, "n", 0, "comp"), 3);
  EXPECT_EQ(get_option<int>(o, "missing", 9, "comp"), 9);
  EXPECT_EQ(get_option<std::string>(o, "s", "", "comp"), "x");
  EXPECT_DOUBLE_EQ(get_option<double>(o, "f", 0, "comp"), 1.5);
  EXPECT_THROW(get_option<uint32_t>(o, "neg", 0u, "comp"), InvalidArgumentError);
  EXPECT_THROW(get_option<std::string>(o, "n", "", "comp"), InvalidArgumentError);
  EXPECT_THROW(get_option<int>(o, "s", 0, "comp"), InvalidArgumentError);
}

TEST(OptionsTest, Devices) {
  EXPECT_EQ(parse_device("cpu:3", "devices"), 3);
  // GPU names parse here; whether the GPU exists is the strategy's check
  // (through the host), see tests/gpu.
  EXPECT_EQ(parse_device("gpu:0", "devices"), 0);
  EXPECT_EQ(parse_device("cuda:2", "devices"), 2);
  EXPECT_THROW(parse_device("cpu:", "devices"), InvalidArgumentError);
  EXPECT_THROW(parse_device("tpu:0", "devices"), InvalidArgumentError);
  EXPECT_THROW(parse_device_list(nlohmann::json::array(), "devices"), InvalidArgumentError);
  EXPECT_THROW(parse_device_list(nlohmann::json{"cpu:0", "cpu:0"}, "devices"), InvalidArgumentError);
  EXPECT_EQ(parse_device_list(nlohmann::json{"cpu:0", "cpu:1"}, "devices").size(), 2u);
  LocalStrategyConfig cfg;
  parse_common_options(parse_options(R"({"cross_device_ops": {"name": "ring", "options": {"k": 1}},
                                         "timeout_s": 2.5})", "s"),
                       cfg, true);
  EXPECT_EQ(cfg.cross_device_ops, "ring");
  EXPECT_EQ(cfg.cross_device_ops_options, R"({"k":1})");
  EXPECT_DOUBLE_EQ(cfg.timeout_s, 2.5);
  EXPECT_THROW(parse_common_options(parse_options(R"({"timeout_s": -1})", "s"), cfg, true), InvalidArgumentError);
  EXPECT_THROW(parse_common_options(parse_options(R"({"cross_device_ops": {"nam": "x"}})", "s"), cfg, true),
               InvalidArgumentError);
}

}  // namespace
}  // namespace strata::sdk
