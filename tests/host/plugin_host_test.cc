// SPDX-License-Identifier: Apache-2.0
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "strata/plugin_host.hpp"
#include "test_support.h"
#include "test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using test::fixture_dir;
using test::ScopedEnv;

using test::contains;

std::string master_of(const PluginInstance& inst, const char* rpc_layer = nullptr) {
  std::string out;
  strata_error err;
  strata_error_init(&err);
  const auto* vt = inst.vtable_as<strata_resolver_vtable>();
  strata_status_t st = vt->master(static_cast<strata_resolver_t>(inst.handle()), nullptr, 0, rpc_layer,
                                  test::append_to_string, &out, &err);
  EXPECT_EQ(st, STRATA_OK) << err.message;
  return out;
}

std::vector<PluginInfo> rows_for(const std::vector<PluginInfo>& infos, const std::string& dir) {
  std::vector<PluginInfo> out;
  const std::string canon = fs::canonical(dir).string();
  for (const auto& i : infos)
    if (i.path.rfind(canon + "/", 0) == 0) out.push_back(i);
  return out;
}

std::string lib_path(const std::string& case_name, const std::string& file) {
  return fs::canonical(fixture_dir(case_name) + "/libstrata-resolver-" + file + ".so").string();
}

TEST(PluginHostTest, KindNamesRoundTrip) {
  for (auto k : {STRATA_KIND_STRATEGY, STRATA_KIND_CROSS_DEVICE_OPS, STRATA_KIND_TRANSPORT,
                 STRATA_KIND_CLUSTER_RESOLVER, STRATA_KIND_INPUT_PIPELINE})
    EXPECT_EQ(kind_from_name(kind_name(k)), k);
  EXPECT_EQ(kind_from_name("resolver"), STRATA_KIND_CLUSTER_RESOLVER);
  EXPECT_EQ(kind_from_name("input"), STRATA_KIND_INPUT_PIPELINE);
  EXPECT_THROW(kind_from_name("strategies"), InvalidArgumentError);
  EXPECT_THROW(kind_name(static_cast<strata_plugin_kind>(42)), InvalidArgumentError);
}

TEST(PluginHostTest, GoodPluginIsDiscoveredAndWorks) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("good"));
  PluginHost host;
  auto rows = rows_for(host.discover(), fixture_dir("good"));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].ok) << rows[0].error;
  EXPECT_EQ(rows[0].path, lib_path("good", "good"));
  EXPECT_EQ(rows[0].kind, "cluster_resolver");
  EXPECT_EQ(rows[0].name, "good");
  EXPECT_EQ(rows[0].version, "1.2.3");
  EXPECT_EQ(rows[0].abi, "1." + std::to_string(STRATA_ABI_MINOR));
  EXPECT_EQ(rows[0].error, "");

  PluginInstance inst = host.create(STRATA_KIND_CLUSTER_RESOLVER, "good", "");
  ASSERT_TRUE(inst);
  EXPECT_EQ(inst.kind(), STRATA_KIND_CLUSTER_RESOLVER);
  EXPECT_EQ(inst.name(), "good");
  EXPECT_EQ(master_of(inst), "localhost:1234");
  EXPECT_EQ(master_of(inst, "grpc"), "grpc://localhost:1234");
  PluginInstance with_opts = host.create(STRATA_KIND_CLUSTER_RESOLVER, "good", R"({"rpc_layer": "grpc"})");
  EXPECT_EQ(master_of(with_opts), "grpc://localhost:1234");

  // Move-only ownership: the moved-from instance is empty, the handle moves.
  void* handle = inst.handle();
  PluginInstance moved = std::move(inst);
  EXPECT_FALSE(inst);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(moved.handle(), handle);
  moved = std::move(with_opts);
  EXPECT_EQ(master_of(moved), "grpc://localhost:1234");
}

TEST(PluginHostTest, CreateErrorFromThePluginPropagatesWithItsCode) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("good"));
  PluginHost host;
  try {
    host.create(STRATA_KIND_CLUSTER_RESOLVER, "good", R"({"fail": true})");
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "fixture create failed as asked by options")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cluster_resolver 'good'")) << e.what();
  }
}

TEST(PluginHostTest, CreateUnknownNameListsAvailableNamesAndDirectories) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("good"));
  PluginHost host;
  try {
    host.create(STRATA_KIND_CLUSTER_RESOLVER, "nope", "{}");
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "no cluster_resolver plugin named 'nope'")) << m;
    EXPECT_TRUE(contains(m, "available: ")) << m;
    EXPECT_TRUE(contains(m, "good")) << m;
    EXPECT_TRUE(contains(m, "searched: " + fixture_dir("good"))) << m;
    EXPECT_TRUE(contains(m, "STRATA_PLUGIN_PATH")) << m;
  }
}

struct BadCase {
  const char* case_name;
  const char* file;  // libstrata-resolver-<file>.so
  const char* component;
  strata_status_t code;
  std::vector<std::string> causes;
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.case_name; }

class BadPluginTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadPluginTest, AutoDiscoveredIsSkippedWithReason) {
  const BadCase& c = GetParam();
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir(c.case_name));
  PluginHost host;
  auto rows = rows_for(host.discover(), fixture_dir(c.case_name));
  ASSERT_FALSE(rows.empty());
  for (const auto& r : rows) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.path, lib_path(c.case_name, c.file));
    for (const auto& cause : c.causes) EXPECT_TRUE(contains(r.error, cause)) << r.error;
  }
  // Asking for it by name gives the rejection reason, not "not found".
  try {
    host.create(STRATA_KIND_CLUSTER_RESOLVER, c.component, "{}");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), c.code) << e.what();
    EXPECT_TRUE(contains(e.what(), "was rejected")) << e.what();
    EXPECT_TRUE(contains(e.what(), lib_path(c.case_name, c.file))) << e.what();
    for (const auto& cause : c.causes) EXPECT_TRUE(contains(e.what(), cause)) << e.what();
  }
}

TEST_P(BadPluginTest, ExplicitPathThrowsWithPathAndCause) {
  const BadCase& c = GetParam();
  ScopedEnv env("STRATA_PLUGIN_PATH", std::nullopt);
  PluginHost host;
  const std::string path = lib_path(c.case_name, c.file);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second answer comes from the record
    try {
      host.load_explicit(path);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_TRUE(contains(e.what(), path)) << e.what();
      for (const auto& cause : c.causes) EXPECT_TRUE(contains(e.what(), cause)) << e.what();
    }
  }
  // The same through the config.
  PluginHost host2;
  try {
    host2.set_config(R"({"cluster_resolver": {"name": ")" + std::string(c.component) + R"(", "path": ")" +
                     path + "\"}}");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), c.code) << e.what();
    EXPECT_TRUE(contains(e.what(), path)) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadPluginTest,
    ::testing::Values(
        BadCase{"no_entry", "noentry", "noentry", STRATA_ERR_NOT_FOUND,
                {"does not export strata_plugin_entry_v1"}},
        BadCase{"abi_v2", "abi2", "abi2", STRATA_ERR_ABI_MISMATCH,
                {"built for ABI major 2", "this host supports major 1",
                 "rebuild the plugin against Strata 1.x SDK"}},
        BadCase{"small_struct", "small", "small", STRATA_ERR_ABI_MISMATCH,
                {"cluster_resolver vtable struct_size " +
                     std::to_string(STRATA_RESOLVER_VTABLE_STRUCT_SIZE_1_0 - 2 * sizeof(void*)) + " < " +
                     std::to_string(STRATA_RESOLVER_VTABLE_STRUCT_SIZE_1_0) + " required by ABI 1.0"}},
        BadCase{"null_required", "nullfn", "nullfn", STRATA_ERR_INVALID_ARGUMENT,
                {"required function 'master'", "is NULL"}},
        BadCase{"init_fails", "initfail", "initfail", STRATA_ERR_FAILED_PRECONDITION,
                {"init failed", "fixture init failure: license file /nonexistent/license missing"}},
        BadCase{"throws", "throws", "throws", STRATA_ERR_INTERNAL,
                {"threw a C++ exception across the C ABI", "boom from init",
                 "plugins must return a status"}}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.case_name); });

TEST(PluginHostTest, TextFileNamedLikeAPluginIsRejected) {
  test::TempDir dir;
  const std::string path = dir.str() + "/libstrata-x-y.so";
  std::ofstream(path) << "this is not a shared library\n";
  ScopedEnv env("STRATA_PLUGIN_PATH", dir.str());
  PluginHost host;
  auto rows = rows_for(host.discover(), dir.str());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_FALSE(rows[0].ok);
  EXPECT_EQ(rows[0].kind, "");
  EXPECT_TRUE(contains(rows[0].error, "cannot be loaded")) << rows[0].error;
  EXPECT_TRUE(contains(rows[0].error, "is not a shared library (ELF header missing)")) << rows[0].error;
  EXPECT_TRUE(contains(rows[0].error, "remove it from the plugin directory or rebuild it")) << rows[0].error;
  // dlopen sets no errno; Boost.DLL's stale one is noise.
  EXPECT_FALSE(contains(rows[0].error, "Bad file descriptor")) << rows[0].error;

  PluginHost host2;
  try {
    host2.load_explicit(path);
    FAIL() << "expected an error";
  } catch (const FailedPreconditionError& e) {
    EXPECT_TRUE(contains(e.what(), fs::canonical(path).string())) << e.what();
    EXPECT_TRUE(contains(e.what(), "cannot be loaded")) << e.what();
    EXPECT_TRUE(contains(e.what(), "not a shared library")) << e.what();
    EXPECT_FALSE(contains(e.what(), "Bad file descriptor")) << e.what();
  }
}

TEST(PluginHostTest, TruncatedLibraryIsRejected) {
  test::TempDir dir;
  const std::string good = lib_path("good", "good");
  const std::string path = dir.str() + "/libstrata-resolver-trunc.so";
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 1000u);
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  ScopedEnv env("STRATA_PLUGIN_PATH", dir.str());
  PluginHost host;
  auto rows = rows_for(host.discover(), dir.str());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_FALSE(rows[0].ok);
  EXPECT_TRUE(contains(rows[0].error, "is truncated or corrupt")) << rows[0].error;
  EXPECT_TRUE(contains(rows[0].error, "bytes; reinstall or rebuild the plugin")) << rows[0].error;
  PluginHost host2;
  try {
    host2.load_explicit(path);
    FAIL() << "expected an error";
  } catch (const DataLossError& e) {
    EXPECT_TRUE(contains(e.what(), fs::canonical(path).string())) << e.what();
    EXPECT_TRUE(contains(e.what(), "is truncated or corrupt")) << e.what();
  }
}

TEST(PluginHostTest, MissingExplicitPathIsNotFound) {
  PluginHost host;
  EXPECT_THROW(host.load_explicit("/nonexistent/libstrata-strategy-x.so"), NotFoundError);
  try {
    host.set_config(R"({"strategy": {"name": "x", "path": "/nonexistent/libstrata-strategy-x.so"}})");
    FAIL();
  } catch (const NotFoundError& e) {
    EXPECT_TRUE(contains(e.what(), "/nonexistent/libstrata-strategy-x.so")) << e.what();
  }
}

TEST(PluginHostTest, DuplicateNameSecondLibraryIsRejectedNamingBoth) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("dup"));
  PluginHost host;
  auto rows = rows_for(host.discover(), fixture_dir("dup"));
  ASSERT_EQ(rows.size(), 2u);
  const std::string a = lib_path("dup", "dup_a"), b = lib_path("dup", "dup_b");
  const PluginInfo& first = rows[0].path == a ? rows[0] : rows[1];
  const PluginInfo& second = rows[0].path == a ? rows[1] : rows[0];
  EXPECT_TRUE(first.ok);
  EXPECT_FALSE(second.ok);
  EXPECT_EQ(second.path, b);
  EXPECT_EQ(second.name, "dup");
  EXPECT_TRUE(contains(second.error, "duplicate cluster_resolver 'dup': already provided by " + a)) << second.error;
  EXPECT_TRUE(contains(second.error, "remove one of them or set STRATA_PLUGIN_PATH")) << second.error;
  EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "dup", "{}")), "from-a");
}

TEST(PluginHostTest, SearchPathOrderDecidesWhichLibraryWins) {
  {
    ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("order_b") + ":" + fixture_dir("order_a"));
    PluginHost host;
    auto dirs = host.search_dirs();
    ASSERT_GE(dirs.size(), 3u);  // two from the env, then the core's own
    EXPECT_EQ(dirs[0], fixture_dir("order_b"));
    EXPECT_EQ(dirs[1], fixture_dir("order_a"));
    EXPECT_TRUE(contains(dirs.back(), "strata/plugins")) << dirs.back();
    EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "ordered", "{}")), "from-order-b");
  }
  {
    ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("order_a") + "::" + fixture_dir("order_b"));
    PluginHost host;
    EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "ordered", "{}")), "from-order-a");
  }
}

TEST(PluginHostTest, ConfigSearchPathComesAfterTheEnvironment) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("order_a"));
  PluginHost host;
  host.set_config(R"({"plugins": {"search_path": [")" + fixture_dir("order_b") + R"(", ")" +
                  fixture_dir("good") + "\"]}}");
  auto dirs = host.search_dirs();
  ASSERT_GE(dirs.size(), 3u);
  EXPECT_EQ(dirs[0], fixture_dir("order_a"));
  EXPECT_EQ(dirs[1], fixture_dir("order_b"));
  EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "ordered", "{}")), "from-order-a");
  EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "good", "{}")), "localhost:1234");
}

TEST(PluginHostTest, ExplicitConfigPathWinsOverDiscovery) {
  ScopedEnv env("STRATA_PLUGIN_PATH", fixture_dir("order_b"));
  PluginHost host;
  // Discovered first, then named explicitly: the explicit one takes over.
  EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "ordered", "{}")), "from-order-b");
  host.set_config(R"({"cluster_resolver": {"name": "ordered", "path": ")" + lib_path("order_a", "ordered") +
                  "\"}}");
  EXPECT_EQ(master_of(host.create(STRATA_KIND_CLUSTER_RESOLVER, "ordered", "{}")), "from-order-a");
  // Explicit before discovery: the discovered same-named library is the duplicate.
  PluginHost host2;
  host2.set_config(R"({"cluster_resolver": {"name": "ordered", "path": ")" + lib_path("order_a", "ordered") +
                   "\"}}");
  auto rows = rows_for(host2.discover(), fixture_dir("order_b"));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_FALSE(rows[0].ok);
  EXPECT_TRUE(contains(rows[0].error, "already provided by " + lib_path("order_a", "ordered"))) << rows[0].error;
  EXPECT_EQ(master_of(host2.create(STRATA_KIND_CLUSTER_RESOLVER, "ordered", "{}")), "from-order-a");
}

TEST(PluginHostTest, SetConfigRejectsMalformedJson) {
  PluginHost host;
  EXPECT_THROW(host.set_config("{not json"), InvalidArgumentError);
  EXPECT_THROW(host.set_config(R"({"unknown_part": {}})"), InvalidArgumentError);
}

// ---- builtins

}  // namespace
}  // namespace strata

// The opaque handle type is a global-namespace C struct.
struct strata_resolver_s {
  int dummy;
};

namespace strata {
namespace {

strata_resolver_s g_builtin_instance{0};
int g_builtin_destroyed = 0;

strata_status_t b_create(const strata_host_api*, const char*, strata_resolver_t* out, strata_error*) {
  *out = &g_builtin_instance;
  return STRATA_OK;
}
strata_status_t b_create_throws(const strata_host_api*, const char*, strata_resolver_t*, strata_error*) {
  throw std::logic_error("builtin create threw");
}
void b_destroy(strata_resolver_t) { ++g_builtin_destroyed; }
strata_status_t b_describe(strata_resolver_t, strata_write_fn write, void* user, strata_error*) {
  write(user, "{}", 2);
  return STRATA_OK;
}
strata_status_t b_master(strata_resolver_t, const char*, int32_t, const char*, strata_write_fn write, void* user,
                         strata_error*) {
  write(user, "builtin:1", 9);
  return STRATA_OK;
}

strata_resolver_vtable make_builtin_vtable() {
  strata_resolver_vtable vt{};
  STRATA_INIT_HEADER(&vt, strata_resolver_vtable);
  vt.create = b_create;
  vt.destroy = b_destroy;
  vt.describe = b_describe;
  vt.master = b_master;
  return vt;
}

TEST(PluginHostTest, RegisterBuiltinShowsInDiscoveryAndCreates) {
  static const strata_resolver_vtable vt = make_builtin_vtable();
  ScopedEnv env("STRATA_PLUGIN_PATH", std::nullopt);
  PluginHost host;
  host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "builtin_res", "9.9.9", &vt);
  host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "builtin_res", "9.9.9", &vt);  // idempotent
  bool found = false;
  for (const auto& i : host.discover())
    if (i.name == "builtin_res") {
      found = true;
      EXPECT_EQ(i.path, "<builtin>");
      EXPECT_EQ(i.kind, "cluster_resolver");
      EXPECT_EQ(i.version, "9.9.9");
      EXPECT_TRUE(i.ok);
    }
  EXPECT_TRUE(found);
  const int destroyed = g_builtin_destroyed;
  {
    PluginInstance inst = host.create(STRATA_KIND_CLUSTER_RESOLVER, "builtin_res", "{}");
    EXPECT_EQ(inst.handle(), &g_builtin_instance);
    EXPECT_EQ(master_of(inst), "builtin:1");
  }
  EXPECT_EQ(g_builtin_destroyed, destroyed + 1);
  {
    // release() hands the handle over: destroy is no longer called for it.
    PluginInstance inst = host.create(STRATA_KIND_CLUSTER_RESOLVER, "builtin_res", "{}");
    EXPECT_EQ(inst.release(), &g_builtin_instance);
    EXPECT_FALSE(inst);
  }
  EXPECT_EQ(g_builtin_destroyed, destroyed + 1);

  static const strata_resolver_vtable other = make_builtin_vtable();
  EXPECT_THROW(host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "builtin_res", "1", &other), AlreadyExistsError);
}

TEST(PluginHostTest, RegisterBuiltinValidatesLikeAPlugin) {
  PluginHost host;
  strata_resolver_vtable missing = make_builtin_vtable();
  missing.master = nullptr;
  try {
    host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "broken", "1", &missing);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "required function 'master'")) << e.what();
  }
  strata_resolver_vtable small = make_builtin_vtable();
  small.struct_size = 16;
  EXPECT_THROW(host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "small", "1", &small), AbiMismatchError);
  EXPECT_THROW(host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "Bad-Name", "1", &missing), InvalidArgumentError);
}

TEST(PluginHostTest, ExceptionFromCreateBecomesAnError) {
  static strata_resolver_vtable vt = [] {
    strata_resolver_vtable v = make_builtin_vtable();
    v.create = b_create_throws;
    return v;
  }();
  PluginHost host;
  host.register_builtin(STRATA_KIND_CLUSTER_RESOLVER, "throwing_builtin", "1", &vt);
  try {
    host.create(STRATA_KIND_CLUSTER_RESOLVER, "throwing_builtin", "{}");
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_TRUE(contains(e.what(), "threw a C++ exception across the C ABI")) << e.what();
    EXPECT_TRUE(contains(e.what(), "builtin create threw")) << e.what();
  }
}

TEST(PluginHostTest, GlobalHostIsASingleton) {
  EXPECT_EQ(&PluginHost::global(), &PluginHost::global());
  EXPECT_NE(PluginHost::global().host_api(), nullptr);
}

}  // namespace
}  // namespace strata
