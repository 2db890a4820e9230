// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "strata/error.hpp"
#include "strata/log.hpp"

namespace strata {
namespace {

TEST(LogTest, SetLevelRoundTripsAndRejectsUnknownNames) {
  const std::string before = log_level();
  set_log_level("debug");
  EXPECT_EQ(log_level(), "debug");
  set_log_level("off");
  EXPECT_EQ(log_level(), "off");
  try {
    set_log_level("verbose");
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("trace, debug, info, warn"), std::string::npos) << e.what();
  }
  EXPECT_EQ(log_level(), "off");
  set_log_level(before);
}

}  // namespace
}  // namespace strata
