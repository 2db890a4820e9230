// SPDX-License-Identifier: Apache-2.0
// `strata-info transports` against this build's plugins, as a user runs it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "strata/config.h"
#include "subprocess.h"
#include "../../transports/common/rdma_devices.h"

namespace {

using json = nlohmann::json;

strata::test::ProcResult run_info(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {STRATA_INFO_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return strata::test::run_program(argv, {{"STRATA_LOG_LEVEL", "off"}, {"STRATA_PLUGIN_PATH", std::nullopt}}, 120);
}

const json* find_by(const json& arr, const char* key, const std::string& value) {
  for (const auto& e : arr)
    if (e.at(key) == value) return &e;
  return nullptr;
}

TEST(InfoTransportsTest, JsonListsEveryTransportWithCapsOrWhy) {
  const auto r = run_info({"transports", "--json"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  for (const char* key : {"transports", "interfaces", "libfabric", "auto"}) ASSERT_TRUE(doc.contains(key)) << key;
  for (const auto& t : doc["transports"]) {
    SCOPED_TRACE(t.dump());
    if (t["status"] == "usable") {
      EXPECT_TRUE(t["error"].is_null());
      ASSERT_TRUE(t["caps"].is_object());
      // A usable transport moves data: point to point, or (nccl) native collectives only.
      const auto& f = t["caps"]["flags"];
      EXPECT_TRUE(std::find(f.begin(), f.end(), "p2p") != f.end() ||
                  std::find(f.begin(), f.end(), "native_collectives") != f.end());
    } else {
      EXPECT_TRUE(t["error"].is_string() && !t["error"].get<std::string>().empty()) << "an unusable transport says why";
    }
  }
#ifdef INFO_HAVE_STRATA_TRANSPORT_TCP
  const json* tcp = find_by(doc["transports"], "name", "tcp");
  ASSERT_NE(tcp, nullptr) << doc["transports"].dump();
  EXPECT_EQ((*tcp)["status"], "usable");
  const auto& flags = (*tcp)["caps"]["flags"];
  EXPECT_NE(std::find(flags.begin(), flags.end(), "host_memory"), flags.end());
#endif
#ifdef INFO_HAVE_STRATA_TRANSPORT_NCCL
  // Listed with its caps on any machine, with or without a GPU.
  const json* nccl = find_by(doc["transports"], "name", "nccl");
  ASSERT_NE(nccl, nullptr) << doc["transports"].dump();
  EXPECT_EQ((*nccl)["status"], "usable");
  const auto& nflags = (*nccl)["caps"]["flags"];
  EXPECT_NE(std::find(nflags.begin(), nflags.end(), "native_collectives"), nflags.end());
  EXPECT_NE(std::find(nflags.begin(), nflags.end(), "cuda_memory"), nflags.end());
  EXPECT_EQ(std::find(nflags.begin(), nflags.end(), "p2p"), nflags.end());
#endif
  bool have_lo = false;
  for (const auto& i : doc["interfaces"]) have_lo = have_lo || (i["loopback"] == true && i["up"] == true);
  EXPECT_TRUE(have_lo) << doc["interfaces"].dump();
  for (const char* path : {"same_host", "network"}) {
    const auto& p = doc["auto"][path];
    EXPECT_TRUE(p["transport"].is_string()) << path;
    EXPECT_FALSE(p["reason"].get<std::string>().empty()) << path;
  }
}

TEST(InfoTransportsTest, AMissingLibfabricIsNamedWithTheFix) {
#if !STRATA_HAVE_LIBFABRIC
  GTEST_SKIP() << "this build has no libfabric support";
#else
  // libfabric is opened when needed (transports/libfabric/fabric_lib.h), so
  // the plugin still loads where the library is missing, and says so when
  // a transport is asked for.
  std::vector<std::string> argv = {STRATA_INFO_BIN, "transports", "--json"};
  const auto r = strata::test::run_program(argv,
                                           {{"STRATA_LOG_LEVEL", "off"},
                                            {"STRATA_PLUGIN_PATH", std::nullopt},
                                            {"STRATA_LIBFABRIC_LIBRARY", "/nonexistent/libfabric.so.1"}},
                                           120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  const std::string lf_error = doc["libfabric"]["error"].get<std::string>();
  EXPECT_NE(lf_error.find("/nonexistent/libfabric.so.1"), std::string::npos) << lf_error;
  EXPECT_NE(lf_error.find("STRATA_LIBFABRIC_LIBRARY"), std::string::npos) << lf_error;
  EXPECT_TRUE(doc["libfabric"]["providers"].empty());
  const json* plugin = find_by(doc["transports"], "name", "libfabric");
  ASSERT_NE(plugin, nullptr) << "the plugin loads without libfabric: " << doc["transports"].dump();
  EXPECT_NE((*plugin)["status"], "usable");
  const std::string why = (*plugin)["error"].get<std::string>();
  EXPECT_NE(why.find("cannot open libfabric"), std::string::npos) << why;
  EXPECT_NE(why.find("apt-get install libfabric1"), std::string::npos) << why;
#endif
}

TEST(InfoTransportsTest, LibfabricProvidersAndTheAutoChoiceAgree) {
#if !STRATA_HAVE_LIBFABRIC
  GTEST_SKIP() << "this build has no libfabric support";
#else
  const auto r = run_info({"transports", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  const json& lf = doc["libfabric"];
  ASSERT_TRUE(lf["library"].is_string()) << lf.dump();
  EXPECT_EQ(lf["library"].get<std::string>().rfind("libfabric.so.1 ", 0), 0u);
  const json* shm = find_by(lf["providers"], "name", "shm");
  ASSERT_NE(shm, nullptr) << "Debian's libfabric 1.17 has the shm provider";
  EXPECT_EQ((*shm)["class"], "same-host");
  const json* rxm = find_by(lf["providers"], "name", "tcp;ofi_rxm");
  ASSERT_NE(rxm, nullptr);
  EXPECT_EQ((*rxm)["class"], "software");
  for (const auto& p : lf["providers"]) {
    SCOPED_TRACE(p.dump());
    EXPECT_NE(std::find(p["caps"].begin(), p["caps"].end(), "tagged"), p["caps"].end());
    EXPECT_TRUE(p["plugin"].is_string() && !p["plugin"].get<std::string>().empty());
  }
  // "auto": shmem for this host when it runs here, else libfabric's shm
  // exactly when the libfabric transport runs on shm; the network path is
  // libfabric only with a usable NIC provider.
  const json& same = doc["auto"]["same_host"];
  const json* shmem = find_by(doc["transports"], "name", "shmem");
#ifdef INFO_HAVE_STRATA_TRANSPORT_SHMEM
  ASSERT_NE(shmem, nullptr) << "the shmem transport is built but not listed";
  EXPECT_EQ((*shmem)["status"], "usable") << "the shmem transport is built: /dev/shm works here";
#endif
  if (shmem != nullptr && (*shmem)["status"] == "usable") {
    EXPECT_EQ(same["transport"], "shmem");
  } else if ((*shm)["plugin"] == "usable") {
    EXPECT_EQ(same["transport"], "libfabric");
    EXPECT_EQ(same["options"], json({{"provider", "shm"}}));
  } else {
    EXPECT_EQ(same["transport"], "tcp");
    EXPECT_NE(same["reason"].get<std::string>().find((*shm)["plugin"].get<std::string>()), std::string::npos);
  }
#ifdef INFO_HAVE_STRATA_TRANSPORT_LIBFABRIC
  EXPECT_EQ((*shm)["plugin"], "usable") << "the libfabric transport is built: it must run on shm here";
  EXPECT_EQ((*rxm)["plugin"], "usable");
#endif
  bool nic = false;
  for (const auto& p : lf["providers"]) nic = nic || (p["class"] == "nic" && p["plugin"] == "usable");
  // auto asks libfabric only where an RDMA device exists (rdma_devices.h);
  // strata-info says the same, with the same reason.
  const bool device = strata::transport::has_rdma_device();
  EXPECT_EQ(doc["auto"]["network"]["transport"], nic && device ? "libfabric" : "tcp");
  if (!device) {
    EXPECT_EQ(doc["auto"]["network"]["reason"], strata::transport::kNoRdmaDeviceReason);
  }
#endif
}

TEST(InfoTransportsTest, TextSaysWhatAutoChoosesPerPeer) {
  const auto r = run_info({"transports"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"Transport plugins:", "Network interfaces:", "libfabric:", "\"auto\" chooses per peer:",
                        "peers on this host:", "peers on other hosts:"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " missing from:\n" << r.out;
}

}  // namespace
