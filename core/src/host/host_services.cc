// SPDX-License-Identifier: Apache-2.0
// The strata_host_api functions. Each one is a C entry point called by
// plugin code: none may throw, so every body converts exceptions to a status.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "host/cuda_device.h"
#include "host/host_state.h"
#include "ps/ps_host_api.h"
#include "log.h"
#include "strata/error.hpp"
#include "strata/plugin_host.hpp"

namespace strata::detail {

using Clock = std::chrono::steady_clock;

strata_status_t set_error(strata_error* err, strata_status_t code, const std::string& message) {
  if (err) {
    err->code = code;
    const std::size_t n = std::min(message.size(), sizeof(err->message) - 1);
    std::memcpy(err->message, message.data(), n);
    err->message[n] = '\0';
  }
  return code;
}

// ---------------------------------------------------------------- KvStore

template <class Pred>
strata_status_t KvStore::wait_until(std::unique_lock<std::mutex>& lock, int64_t timeout_ms,
                                    Pred pred, const std::string& what, strata_error* err) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred()) {
    if (abort_->load())
      return set_error(err, STRATA_ERR_ABORTED,
                       what + " aborted: the job was asked to stop (request_abort)");
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !pred()) {
      if (abort_->load()) continue;
      return set_error(err, STRATA_ERR_DEADLINE_EXCEEDED,
                       what + " timed out after " + std::to_string(timeout_ms) +
                           " ms; check that every rank reached this rendezvous, or raise "
                           "/timeouts/rendezvous_s");
    }
  }
  return STRATA_OK;
}

strata_status_t KvStore::set(const std::string& key, std::string value, int64_t /*timeout_ms*/,
                             strata_error* /*err*/) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = std::move(value);
  }
  cv_.notify_all();
  return STRATA_OK;
}

strata_status_t KvStore::get(const std::string& key, int64_t timeout_ms, std::string* out,
                             strata_error* err) {
  std::unique_lock<std::mutex> lock(mu_);
  strata_status_t st = wait_until(
      lock, timeout_ms, [&] { return data_.count(key) != 0; },
      "store_get('" + key + "'): key was never set;", err);
  if (st == STRATA_OK) *out = data_[key];
  return st;
}

strata_status_t KvStore::add(const std::string& key, int64_t delta, int64_t* result,
                             int64_t /*timeout_ms*/, strata_error* err) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      char* end = nullptr;
      const std::string& s = it->second;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || end != s.c_str() + s.size())
        return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                         "store_add('" + key + "'): the stored value is not an integer (it was set "
                         "with store_set); use a separate key for counters");
      value = v;
    }
    value += delta;
    data_[key] = std::to_string(value);
  }
  cv_.notify_all();
  if (result) *result = value;
  return STRATA_OK;
}

strata_status_t KvStore::wait(const std::vector<std::string>& keys, int64_t timeout_ms,
                              strata_error* err) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) != 0; });
  };
  strata_status_t st = wait_until(lock, timeout_ms, all_present, "store_wait", err);
  if (st == STRATA_ERR_DEADLINE_EXCEEDED) {
    std::string missing;
    for (const auto& k : keys)
      if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
    set_error(err, st, "store_wait timed out after " + std::to_string(timeout_ms) +
                           " ms; keys never set: " + missing +
                           "; check that every rank reached this rendezvous, or raise /timeouts/rendezvous_s");
  }
  return st;
}

void KvStore::notify_all() {
  // Taking the lock orders the abort flag store before the waiters re-check it.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

// ---------------------------------------------------------------- table

namespace {

strata_status_t internal_error(strata_error* err, const char* fn) {
  return set_error(err, STRATA_ERR_INTERNAL, std::string("host ") + fn + " failed unexpectedly");
}

void api_log(const strata_host_api* host, int32_t level, const char* subsystem, const char* message) {
  try {
    log_rate_limited(level, (subsystem && *subsystem) ? subsystem : "plugin", message ? message : "");
  } catch (...) {
    // Logging must never fail the caller.
  }
}

strata_status_t api_get_config(const strata_host_api* host, const char* json_pointer,
                               strata_write_fn write, void* user, strata_error* err) {
  try {
    if (!write) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "get_config: write callback is NULL");
    HostShared* s = HostShared::from(host);
    const std::string ptr = json_pointer ? json_pointer : "";
    nlohmann::json::json_pointer jp;
    try {
      jp = nlohmann::json::json_pointer(ptr);
    } catch (const nlohmann::json::exception& e) {
      return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                       "get_config: '" + ptr + "' is not a JSON pointer (" + e.what() +
                           "); use e.g. \"/timeouts/collective_s\"");
    }
    std::string text;
    {
      std::lock_guard<std::mutex> lock(s->config_mu);
      if (!s->config.contains(jp))
        return set_error(err, STRATA_ERR_NOT_FOUND, "config has no value at '" + ptr + "'");
      text = s->config[jp].dump();
    }
    write(user, text.data(), text.size());
    return STRATA_OK;
  } catch (const std::exception& e) {
    return set_error(err, STRATA_ERR_INTERNAL, std::string("get_config: ") + e.what());
  } catch (...) {
    return internal_error(err, "get_config");
  }
}

strata_status_t api_create_plugin(const strata_host_api* host, uint32_t kind, const char* name,
                                  const char* options_json, strata_plugin_instance* out,
                                  strata_error* err) {
  if (!out) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "create_plugin: out is NULL");
  if (!name) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "create_plugin: name is NULL");
  std::memset(out, 0, sizeof(*out));
  STRATA_INIT_HEADER(out, strata_plugin_instance);
  try {
    HostShared* s = HostShared::from(host);
    PluginHost* h = nullptr;
    {
      std::lock_guard<std::mutex> lock(s->host_mu);
      h = s->host;
    }
    if (!h)
      return set_error(err, STRATA_ERR_FAILED_PRECONDITION,
                       "create_plugin: the plugin host has shut down (process exit); create "
                       "instances before exit");
    kind_name(static_cast<strata_plugin_kind>(kind));  // throws InvalidArgumentError for a bad kind
    auto inst = std::make_unique<PluginInstance>(
        h->create(static_cast<strata_plugin_kind>(kind), name, options_json ? options_json : ""));
    out->kind = kind;
    out->vtable = inst->vtable();
    out->handle = inst->handle();
    out->host_token = inst.release();
    return STRATA_OK;
  } catch (const Error& e) {
    return set_error(err, e.code(), e.what());
  } catch (const std::exception& e) {
    return set_error(err, STRATA_ERR_INTERNAL, std::string("create_plugin: ") + e.what());
  } catch (...) {
    return internal_error(err, "create_plugin");
  }
}

void api_release_plugin(const strata_host_api* host, strata_plugin_instance* inst) {
  if (!inst || !inst->host_token) return;
  delete static_cast<PluginInstance*>(inst->host_token);  // destroys the instance
  inst->host_token = nullptr;
  inst->handle = nullptr;
  inst->vtable = nullptr;
}

void* api_allocate(const strata_host_api* host, DLDevice device, uint64_t bytes, uint64_t alignment) {
  if (device.device_type == kDLCUDA || device.device_type == kDLCUDAHost) {
    // CUDA allocations are aligned to at least 256 bytes.
    if (alignment > 256 || (alignment & (alignment - 1)) != 0) return nullptr;
    try {
      std::string why;
      void* p = cuda::allocate(device, bytes, &why);
      if (p == nullptr) logger("host")->warn("allocate: {}", why);
      return p;
    } catch (...) {
      return nullptr;
    }
  }
  if (device.device_type != kDLCPU) return nullptr;
  if (alignment == 0) alignment = 64;
  if ((alignment & (alignment - 1)) != 0) return nullptr;
  alignment = std::max<uint64_t>(alignment, sizeof(void*));
  // aligned_alloc wants a size that is a multiple of the alignment (and > 0).
  uint64_t size = std::max<uint64_t>(bytes, 1);
  if (size > UINT64_MAX - alignment) return nullptr;
  size = (size + alignment - 1) / alignment * alignment;
  return std::aligned_alloc(static_cast<std::size_t>(alignment), static_cast<std::size_t>(size));
}

void api_free_memory(const strata_host_api* host, DLDevice device, void* ptr) {
  if (device.device_type == kDLCPU)
    std::free(ptr);
  else if (device.device_type == kDLCUDA || device.device_type == kDLCUDAHost)
    cuda::free_memory(device, ptr);
}

// ---- 1.4: CUDA devices (cuda_device.h does the work) ----

strata_status_t api_device_count(const strata_host_api* host, int32_t device_type, int32_t* count,
                                 strata_error* err) {
  if (!count) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = 0;
  try {
    if (device_type == kDLCPU) {
      *count = 1;
      return STRATA_OK;
    }
    if (device_type != kDLCUDA)
      return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                       "device_count: device type " + std::to_string(device_type) +
                           " is not supported; ask for kDLCPU (1) or kDLCUDA (2)");
    std::string why;
    const strata_status_t st = cuda::device_count(count, &why);
    return st == STRATA_OK ? st : set_error(err, st, why);
  } catch (...) {
    return internal_error(err, "device_count");
  }
}

strata_status_t api_set_device(const strata_host_api* host, DLDevice device, strata_error* err) {
  try {
    std::string why;
    const strata_status_t st = cuda::set_device(device, &why);
    return st == STRATA_OK ? st : set_error(err, st, "set_device: " + why);
  } catch (...) {
    return internal_error(err, "set_device");
  }
}

strata_status_t api_stream_create(const strata_host_api* host, DLDevice device, void** stream,
                                  strata_error* err) {
  try {
    std::string why;
    const strata_status_t st = cuda::stream_create(device, stream, &why);
    return st == STRATA_OK ? st : set_error(err, st, "stream_create: " + why);
  } catch (...) {
    return internal_error(err, "stream_create");
  }
}

void api_stream_destroy(const strata_host_api* host, void* stream) {
  try {
    cuda::stream_destroy(stream);
  } catch (...) {
  }
}

int64_t collective_timeout_ms(HostShared* s) {
  std::lock_guard<std::mutex> lock(s->config_mu);
  double sec = 300.0;
  auto jp = nlohmann::json::json_pointer("/timeouts/collective_s");
  if (s->config.contains(jp) && s->config[jp].is_number()) sec = s->config[jp].get<double>();
  return static_cast<int64_t>(sec * 1000.0);
}

strata_status_t api_stream_synchronize(const strata_host_api* host, void* stream, int64_t timeout_ms,
                                       strata_error* err) {
  try {
    HostShared* s = HostShared::from(host);
    if (timeout_ms < 0) timeout_ms = collective_timeout_ms(s);
    std::string why;
    const strata_status_t st =
        cuda::stream_synchronize(stream, timeout_ms, [s] { return s->abort.load(); }, &why);
    return st == STRATA_OK ? st : set_error(err, st, why);
  } catch (...) {
    return internal_error(err, "stream_synchronize");
  }
}

strata_status_t api_memcpy_async(const strata_host_api* host, void* dst, DLDevice dst_device, const void* src,
                                 DLDevice src_device, uint64_t bytes, void* stream, strata_error* err) {
  try {
    std::string why;
    const strata_status_t st = cuda::memcpy_async(dst, dst_device, src, src_device, bytes, stream, &why);
    return st == STRATA_OK ? st : set_error(err, st, why);
  } catch (...) {
    return internal_error(err, "memcpy_async");
  }
}

strata_status_t api_device_update(const strata_host_api* host, uint32_t op, DLDataType dtype, void* dst,
                                  const void* src, uint64_t count, DLDevice device, void* stream, strata_error* err) {
  try {
    HostShared* s = HostShared::from(host);
    std::string why;
    const strata_status_t st = cuda::update(op, dtype, dst, src, count, device, stream, collective_timeout_ms(s),
                                            [s] { return s->abort.load(); }, &why);
    return st == STRATA_OK ? st : set_error(err, st, why);
  } catch (...) {
    return internal_error(err, "device_update");
  }
}

int64_t effective_timeout(HostShared* s, int64_t timeout_ms) {
  return timeout_ms < 0 ? s->default_store_timeout_ms() : timeout_ms;
}

strata_status_t api_store_set(const strata_host_api* host, const char* key, const void* value,
                              uint64_t len, int64_t timeout_ms, strata_error* err) {
  if (!key) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "store_set: key is NULL");
  if (!value && len) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "store_set: value is NULL");
  try {
    HostShared* s = HostShared::from(host);
    return s->store_backend()->set(key, std::string(static_cast<const char*>(value), len),
                                   effective_timeout(s, timeout_ms), err);
  } catch (...) {
    return internal_error(err, "store_set");
  }
}

strata_status_t api_store_get(const strata_host_api* host, const char* key, strata_write_fn write,
                              void* user, int64_t timeout_ms, strata_error* err) {
  if (!key || !write)
    return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "store_get: key and write must be non-NULL");
  try {
    HostShared* s = HostShared::from(host);
    std::string value;
    strata_status_t st = s->store_backend()->get(key, effective_timeout(s, timeout_ms), &value, err);
    if (st == STRATA_OK) write(user, value.data(), value.size());
    return st;
  } catch (...) {
    return internal_error(err, "store_get");
  }
}

strata_status_t api_store_add(const strata_host_api* host, const char* key, int64_t delta,
                              int64_t* result, int64_t timeout_ms, strata_error* err) {
  if (!key) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "store_add: key is NULL");
  try {
    HostShared* s = HostShared::from(host);
    return s->store_backend()->add(key, delta, result, effective_timeout(s, timeout_ms), err);
  } catch (...) {
    return internal_error(err, "store_add");
  }
}

strata_status_t api_store_wait(const strata_host_api* host, const char* const* keys,
                               uint64_t num_keys, int64_t timeout_ms, strata_error* err) {
  if (!keys && num_keys)
    return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "store_wait: keys is NULL");
  try {
    std::vector<std::string> ks;
    for (uint64_t i = 0; i < num_keys; ++i) {
      if (!keys[i]) return set_error(err, STRATA_ERR_INVALID_ARGUMENT, "store_wait: a key is NULL");
      ks.emplace_back(keys[i]);
    }
    HostShared* s = HostShared::from(host);
    return s->store_backend()->wait(ks, effective_timeout(s, timeout_ms), err);
  } catch (...) {
    return internal_error(err, "store_wait");
  }
}

uint64_t api_now_ns(const strata_host_api* host) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

int32_t api_abort_requested(const strata_host_api* host) {
  return HostShared::from(host)->abort.load() ? 1 : 0;
}

void api_record_collective(const strata_host_api* host, const strata_collective_fingerprint* fp) {
  if (!fp) return;
  try {
    HostShared* s = HostShared::from(host);
    strata_collective_fingerprint copy{};
    std::memcpy(&copy, fp, std::min<std::size_t>(sizeof(copy), fp->struct_size));
    copy.struct_size = sizeof(copy);
    const std::string_view comm = fp->communicator ? fp->communicator : "";
    copy.communicator = nullptr;  // borrowed by the caller; the map key keeps the name
    std::lock_guard<std::mutex> lock(s->fingerprint_mu);
    // Called for every collective: a known communicator costs no allocation.
    if (auto it = s->last_fingerprint.find(comm); it != s->last_fingerprint.end())
      it->second = copy;
    else
      s->last_fingerprint.emplace(std::string(comm), copy);
  } catch (...) {
    // Bookkeeping only; never fail the collective.
  }
}

void api_request_abort(const strata_host_api* host, const char* reason) {
  HostShared* s = HostShared::from(host);
  const bool was = s->abort.exchange(true);
  if (!was) {
    try {
      logger("host")->warn("abort requested: {}", reason ? reason : "(no reason given)");
    } catch (...) {
    }
  }
  s->store.notify_all();
  if (auto remote = s->store_backend(); remote.get() != &s->store) remote->notify_all();
}

}  // namespace

HostShared::HostShared() {
  strata_host_api& a = table.api;
  std::memset(&a, 0, sizeof(a));
  STRATA_INIT_HEADER(&a, strata_host_api);
  a.log = api_log;
  a.get_config = api_get_config;
  a.create_plugin = api_create_plugin;
  a.release_plugin = api_release_plugin;
  a.allocate = api_allocate;
  a.free_memory = api_free_memory;
  a.store_set = api_store_set;
  a.store_get = api_store_get;
  a.store_add = api_store_add;
  a.store_wait = api_store_wait;
  a.now_ns = api_now_ns;
  a.abort_requested = api_abort_requested;
  a.record_collective = api_record_collective;
  a.request_abort = api_request_abort;
  a.ps_variable_create = ps_detail::host_ps_variable_create;
  a.ps_variable_read = ps_detail::host_ps_variable_read;
  a.ps_variable_update = ps_detail::host_ps_variable_update;
  a.device_count = api_device_count;
  a.set_device = api_set_device;
  a.stream_create = api_stream_create;
  a.stream_destroy = api_stream_destroy;
  a.stream_synchronize = api_stream_synchronize;
  a.memcpy_async = api_memcpy_async;
  a.device_update = api_device_update;
  table.shared = this;
  static_assert(std::is_standard_layout_v<HostTable>, "HostTable must map back from its first member");
}

std::shared_ptr<StoreBackend> HostShared::store_backend() {
  std::lock_guard<std::mutex> lock(store_mu);
  if (remote_store) return remote_store;
  // Non-owning: `store` lives as long as this HostShared, which outlives the call.
  return std::shared_ptr<StoreBackend>(std::shared_ptr<void>(), &store);
}

bool HostShared::set_remote_store(std::shared_ptr<StoreBackend> backend) {
  std::lock_guard<std::mutex> lock(store_mu);
  if (remote_store) return false;
  remote_store = std::move(backend);
  return true;
}

int64_t HostShared::default_store_timeout_ms() const {
  std::lock_guard<std::mutex> lock(config_mu);
  double s = 120.0;  // /timeouts/rendezvous_s default (shared decision 5)
  auto jp = nlohmann::json::json_pointer("/timeouts/rendezvous_s");
  if (config.contains(jp) && config[jp].is_number()) s = config[jp].get<double>();
  return static_cast<int64_t>(s * 1000.0);
}

}  // namespace strata::detail
