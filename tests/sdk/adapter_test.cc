// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/plugin.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <cstddef>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "strata/sdk/local_cross_device_ops.hpp"

namespace strata::sdk {
namespace {

// What the next call of the fake component throws.
enum class Throw { kNothing, kStrataError, kBadAlloc, kStdException, kInt, kLong };
Throw g_throw = Throw::kNothing;

void maybe_throw() {
  switch (g_throw) {
    case Throw::kNothing: return;
    case Throw::kStrataError: STRATA_THROW(STRATA_ERR_NOT_FOUND, "no such thing: add it");
    case Throw::kBadAlloc: throw std::bad_alloc();
    case Throw::kStdException: throw std::runtime_error("boom");
    case Throw::kInt: throw 42;
    case Throw::kLong: STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, std::string(5000, 'x'));
  }
}

class FakeStrategy : public StrategyBase {
 public:
  FakeStrategy(Host host, const char* options) : host_(std::move(host)) {
    if (std::string(options) == "bad") STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "bad options");
  }
  std::string describe() override {
    maybe_throw();
    return "{\"num_replicas_in_sync\": 1}";
  }
  void run(strata_replica_fn, void*) override { maybe_throw(); }
  int32_t replica_id_in_sync_group(strata_replica_t) override {
    maybe_throw();
    return 7;
  }
  void replica_all_reduce(strata_replica_t, strata_reduce_op, uint32_t, const DLTensor* const*,
                          DLTensor* const*) override { maybe_throw(); }
  DLManagedTensor* replica_all_gather(strata_replica_t, const DLTensor&, int32_t) override {
    maybe_throw();
    return nullptr;
  }
  void replica_merge_call(strata_replica_t, strata_merge_fn, void*, void*) override { maybe_throw(); }
  void reduce_to(strata_reduce_op, uint32_t, const DLTensor* const*, DLTensor&) override { maybe_throw(); }
  DLManagedTensor* gather_to(uint32_t, const DLTensor* const*, int32_t) override {
    maybe_throw();
    return nullptr;
  }
  strata_variable_t variable_create(const strata_variable_desc&, const DLTensor&) override {
    maybe_throw();
    return nullptr;
  }
  void variable_destroy(strata_variable_t) noexcept override {}
  DLManagedTensor* variable_read(strata_variable_t, strata_replica_t) override {
    maybe_throw();
    return nullptr;
  }
  void variable_update(strata_variable_t, strata_replica_t, strata_var_update_op, const DLTensor&) override {
    maybe_throw();
  }
  std::string save_state() {
    maybe_throw();
    return "state";
  }
  Host host_;
};

// What the last FakeCdo's destruction saw: before_destroy() was called,
// and it came before the destructor.
bool g_before_destroy_called = false;
bool g_destructor_saw_before_destroy = false;

class FakeCdo : public CrossDeviceOpsBase {
 public:
  FakeCdo(Host, const char*) {}
  ~FakeCdo() override { g_destructor_saw_before_destroy = g_before_destroy_called; }
  void before_destroy() noexcept override { g_before_destroy_called = true; }
  void all_reduce(strata_reduce_op, uint32_t, uint32_t, const DLTensor* const*, DLTensor* const*) override {
    maybe_throw();
  }
  void reduce(strata_reduce_op, uint32_t, uint32_t, const DLTensor* const*, DLTensor* const*) override {}
  void broadcast(const DLTensor&, uint32_t, DLTensor* const*) override {}
  void all_gather(uint32_t, const DLTensor* const*, int32_t, DLTensor* const*) override {}
};

const strata_strategy_vtable* vt() { return StrategyAdapter<FakeStrategy>::vtable(); }

strata_strategy_t make() {
  strata_strategy_t s = nullptr;
  EXPECT_EQ(vt()->create(nullptr, nullptr, &s, nullptr), STRATA_OK);
  return s;
}

void append(void* user, const char* d, uint64_t n) { static_cast<std::string*>(user)->append(d, n); }

TEST(AdapterTest, ExceptionsBecomeStatuses) {
  strata_strategy_t s = make();
  struct Expect {
    Throw t;
    strata_status_t code;
    const char* text;
  } cases[] = {{Throw::kStrataError, STRATA_ERR_NOT_FOUND, "no such thing: add it"},
               {Throw::kBadAlloc, STRATA_ERR_INTERNAL, "out of memory"},
               {Throw::kStdException, STRATA_ERR_INTERNAL, "boom"},
               {Throw::kInt, STRATA_ERR_INTERNAL, "unknown exception"}};
  for (const auto& c : cases) {
    g_throw = c.t;
    strata_error err;
    strata_error_init(&err);
    std::string out;
    EXPECT_EQ(vt()->describe(s, &append, &out, &err), c.code);
    EXPECT_EQ(err.code, c.code);
    EXPECT_NE(std::string(err.message).find(c.text), std::string::npos) << err.message;
    // err may be NULL.
    EXPECT_EQ(vt()->run(s, [](void*, strata_replica_t, uint32_t, strata_error*) -> strata_status_t { return STRATA_OK; }, nullptr,
                        nullptr),
              c.code);
  }
  g_throw = Throw::kNothing;
  std::string out;
  EXPECT_EQ(vt()->describe(s, &append, &out, nullptr), STRATA_OK);
  EXPECT_EQ(out, "{\"num_replicas_in_sync\": 1}");
  EXPECT_EQ(vt()->replica_id_in_sync_group(s, nullptr), 7);
  g_throw = Throw::kStdException;
  EXPECT_EQ(vt()->replica_id_in_sync_group(s, nullptr), -1);
  g_throw = Throw::kNothing;
  vt()->destroy(s);
}

TEST(AdapterTest, LongMessagesAreTruncatedSafely) {
  strata_strategy_t s = make();
  g_throw = Throw::kLong;
  strata_error err;
  strata_error_init(&err);
  std::memset(err.message, 'z', sizeof err.message);
  std::string out;
  EXPECT_EQ(vt()->describe(s, &append, &out, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::strlen(err.message), STRATA_ERROR_MESSAGE_MAX - 1u);
  // A caller compiled with a smaller error struct gets a shorter message.
  struct Small {
    strata_error e;
  } small;
  strata_error_init(&small.e);
  small.e.struct_size = static_cast<uint32_t>(offsetof(strata_error, message) + 16);
  EXPECT_EQ(vt()->describe(s, &append, &out, &small.e), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::strlen(small.e.message), 15u);
  g_throw = Throw::kNothing;
  vt()->destroy(s);
}

TEST(AdapterTest, CreateFailureAndNullArguments) {
  strata_strategy_t s = nullptr;
  strata_error err;
  strata_error_init(&err);
  EXPECT_EQ(vt()->create(nullptr, "bad", &s, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_NE(std::string(err.message).find("bad options"), std::string::npos);
  EXPECT_EQ(vt()->create(nullptr, "{}", nullptr, &err), STRATA_ERR_INVALID_ARGUMENT);
  s = make();
  EXPECT_EQ(vt()->run(s, nullptr, nullptr, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vt()->reduce_to(s, 99, 0, nullptr, nullptr, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vt()->variable_update(s, nullptr, nullptr, 7, nullptr, &err), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vt()->describe(nullptr, &append, nullptr, &err), STRATA_ERR_INVALID_ARGUMENT);
  vt()->destroy(s);
}

// A cross_device_ops whose worker thread calls its virtuals stops it in
// before_destroy(), which destroy must call while the object is whole.
TEST(AdapterTest, DestroyCallsBeforeDestroyBeforeTheDestructor) {
  const auto* cdo = CrossDeviceOpsAdapter<FakeCdo>::vtable();
  strata_cross_device_ops_t c = nullptr;
  ASSERT_EQ(cdo->create(nullptr, nullptr, &c, nullptr), STRATA_OK);
  g_before_destroy_called = g_destructor_saw_before_destroy = false;
  cdo->destroy(c);
  EXPECT_TRUE(g_before_destroy_called);
  EXPECT_TRUE(g_destructor_saw_before_destroy);
}

TEST(AdapterTest, OptionalSlotsFollowDeclaredMembers) {
  EXPECT_NE(vt()->save_state, nullptr);
  EXPECT_EQ(vt()->restore_state, nullptr);
  EXPECT_EQ(vt()->variable_view, nullptr);
  const auto* cdo = CrossDeviceOpsAdapter<FakeCdo>::vtable();
  EXPECT_EQ(cdo->reduce_scatter, nullptr);
  EXPECT_EQ(cdo->all_reduce_start, nullptr);
  EXPECT_EQ(cdo->request_wait, nullptr);
  const auto* local = CrossDeviceOpsAdapter<LocalCrossDeviceOps>::vtable();
  EXPECT_NE(local->reduce_scatter, nullptr);
  EXPECT_NE(local->all_reduce_start, nullptr);
  EXPECT_NE(local->request_wait, nullptr);
  EXPECT_EQ(vt()->struct_size, sizeof(strata_strategy_vtable));
  EXPECT_EQ(vt()->abi_minor, static_cast<uint32_t>(STRATA_ABI_MINOR));
}

}  // namespace
}  // namespace strata::sdk

STRATA_PLUGIN("sdk test library", "9.9.9",
              STRATA_STRATEGY_COMPONENT(strata::sdk::FakeStrategy, "fake", "1.0.0"),
              STRATA_CROSS_DEVICE_OPS_COMPONENT(strata::sdk::FakeCdo, "fake_cdo", "2.0.0"))

namespace strata::sdk {
namespace {

TEST(AdapterTest, PluginMacroExportsDescriptor) {
  const strata_plugin_desc* desc = nullptr;
  strata_host_api host{};
  STRATA_INIT_HEADER(&host, strata_host_api);
  ASSERT_EQ(strata_plugin_entry_v1(&host, STRATA_ABI_MINOR, &desc), STRATA_OK);
  ASSERT_NE(desc, nullptr);
  EXPECT_EQ(plugin_host(), &host);
  EXPECT_EQ(desc->struct_size, sizeof(strata_plugin_desc));
  EXPECT_STREQ(desc->library_name, "sdk test library");
  EXPECT_STREQ(desc->library_version, "9.9.9");
  ASSERT_EQ(desc->num_components, 2u);
  EXPECT_EQ(desc->components[0].kind, static_cast<uint32_t>(STRATA_KIND_STRATEGY));
  EXPECT_STREQ(desc->components[0].name, "fake");
  EXPECT_EQ(desc->components[0].vtable, StrategyAdapter<FakeStrategy>::vtable());
  EXPECT_EQ(desc->components[1].kind, static_cast<uint32_t>(STRATA_KIND_CROSS_DEVICE_OPS));
  EXPECT_STREQ(desc->components[1].version, "2.0.0");
  ASSERT_NE(desc->init, nullptr);
  EXPECT_EQ(desc->init(&host, nullptr), STRATA_OK);
  EXPECT_EQ(strata_plugin_entry_v1(&host, STRATA_ABI_MINOR, nullptr), STRATA_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace strata::sdk

namespace strata::sdk {
namespace {

// A minimal host table recording what the SDK's Host wrapper does.
struct FakeHost {
  strata_host_api api{};
  std::string last_subsystem, last_message;
  int32_t last_level = -1;
  int aborts = 0;
  static FakeHost& of(const strata_host_api* h) { return *reinterpret_cast<FakeHost*>(const_cast<strata_host_api*>(h)); }
  FakeHost() {
    STRATA_INIT_HEADER(&api, strata_host_api);
    api.log = [](const strata_host_api* h, int32_t level, const char* sub, const char* msg) {
      of(h).last_level = level;
      of(h).last_subsystem = sub;
      of(h).last_message = msg;
    };
    api.get_config = [](const strata_host_api*, const char* ptr, strata_write_fn write, void* user,
                        strata_error* err) -> strata_status_t {
      if (std::string(ptr) != "/timeouts/collective_s") {
        set_error(err, STRATA_ERR_NOT_FOUND, "absent");
        return STRATA_ERR_NOT_FOUND;
      }
      write(user, "1", 1);
      write(user, "20", 2);
      return STRATA_OK;
    };
    api.create_plugin = [](const strata_host_api*, uint32_t kind, const char* name, const char*,
                           strata_plugin_instance*, strata_error* err) -> strata_status_t {
      set_error(err, STRATA_ERR_NOT_FOUND, (std::string("no ") + name + " of kind " + std::to_string(kind)).c_str());
      return STRATA_ERR_NOT_FOUND;
    };
    api.abort_requested = [](const strata_host_api* h) -> int32_t { return of(h).aborts; };
    api.request_abort = [](const strata_host_api* h, const char*) { ++of(h).aborts; };
  }
};
static_assert(offsetof(FakeHost, api) == 0, "FakeHost::of relies on api being first");

TEST(AdapterTest, HostWrapper) {
  FakeHost fh;
  Host host(&fh.api, "strategy.test");
  host.warn("value ", 3, " is odd");
  EXPECT_EQ(fh.last_level, STRATA_LOG_WARN);
  EXPECT_EQ(fh.last_subsystem, "strategy.test");
  EXPECT_EQ(fh.last_message, "value 3 is odd");
  EXPECT_EQ(host.get_config("/timeouts/collective_s"), std::optional<std::string>("120"));
  EXPECT_EQ(host.get_config("/missing"), std::nullopt);
  try {
    host.create_plugin<strata_cross_device_ops_vtable>("ring", "{}");
    FAIL();
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("no ring of kind 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(host.abort_requested());
  EXPECT_TRUE(host.request_abort("stop"));
  EXPECT_TRUE(host.abort_requested());
  // A 1.0 host table has no request_abort.
  fh.api.struct_size = STRATA_HOST_API_STRUCT_SIZE_1_0;
  EXPECT_FALSE(host.request_abort("stop"));
  EXPECT_EQ(fh.aborts, 1);
  // Without a table, logging is a no-op and services fail cleanly.
  Host none;
  none.info("dropped");
  EXPECT_THROW(none.now_ns(), FailedPreconditionError);
}

}  // namespace
}  // namespace strata::sdk
