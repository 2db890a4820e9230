// SPDX-License-Identifier: Apache-2.0
// Which cross-device implementation the mirrored strategies pick, read back
// from describe(): multi_worker_mirrored's CommunicationOptions (AUTO, RING,
// NCCL) and mirrored's default, in one process (no cluster). The GPU side
// (AUTO -> NCCL, mirrored -> nccl on gpu:N) is in tests/nccl_cdo.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "strata/config.h"
#include "strata/strategy.hpp"

namespace strata::test {
namespace {

using nlohmann::json;

json describe(const std::string& name, const std::string& options) {
  Strategy s = Strategy::create(name, options);
  return json::parse(s.extended().describe_json());
}

TEST(MwmsCommunicationTest, AutoPicksRingForCpuDevices) {
  for (const char* options : {R"({"devices": ["cpu:0", "cpu:1"]})",
                              R"({"devices": ["cpu:0"], "communication": {"implementation": "auto"}})", R"({})"}) {
    const json d = describe("multi_worker_mirrored", options);
    EXPECT_EQ(d.value("communication", ""), "RING") << options << ": " << d.dump();
    EXPECT_EQ(d.value("cross_device_ops", ""), "ring") << options << ": " << d.dump();
  }
  const json d = describe("multi_worker_mirrored", R"({"communication": {"implementation": "RING"}})");
  EXPECT_EQ(d.value("communication", ""), "RING") << d.dump();
}

TEST(MwmsCommunicationTest, NcclWithCpuDevicesIsRefused) {
  try {
    describe("multi_worker_mirrored", R"({"devices": ["cpu:0"], "communication": {"implementation": "NCCL"}})");
    FAIL() << "NCCL with CPU devices was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
#if STRATA_HAVE_CUDA
    EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << m;
    EXPECT_EQ(m.find("needs a CUDA build"), std::string::npos) << m;
    EXPECT_NE(m.find("NCCL needs every replica on a GPU"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu:0"), std::string::npos) << m;
#else
    EXPECT_EQ(e.code(), STRATA_ERR_UNIMPLEMENTED) << m;
    EXPECT_NE(m.find("NCCL needs a CUDA build"), std::string::npos) << m;
#endif
  }
}

TEST(MwmsCommunicationTest, MirroredKeepsItsDefaultOnCpuAndAnExplicitChoiceWins) {
  EXPECT_EQ(describe("mirrored", R"({"devices": ["cpu:0", "cpu:1"]})").value("cross_device_ops", ""),
            "reduction_to_one_device");
  EXPECT_EQ(describe("mirrored", R"({})").value("cross_device_ops", ""), "reduction_to_one_device");
  EXPECT_EQ(describe("mirrored", R"({"devices": ["cpu:0", "cpu:1"], "cross_device_ops": "hierarchical_copy"})")
                .value("cross_device_ops", ""),
            "hierarchical_copy");
}

}  // namespace
}  // namespace strata::test
