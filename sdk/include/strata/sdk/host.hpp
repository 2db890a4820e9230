// SPDX-License-Identifier: Apache-2.0
// strata::sdk::Host: a thin, copyable C++ view of the host services table
// (strata_host_api) plus the plugin-side logger, and PluginRef, the RAII owner
// of an instance obtained from the host's create_plugin.
//
// A Host does not own the table (the host keeps it alive until shutdown) and
// is thread-safe because the table is. Methods throw strata::Error with the
// host's code and message when a host call fails. Plugins log only through
// Host::log (the host routes it to its own sinks); the SDK has no spdlog.
#pragma once

#include <cstdint>
#include <optional>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "strata/c/strata.h"
#include "strata/error.hpp"

namespace strata::sdk {

/// The kind constant of a vtable type, for Host::create_plugin<V>.
template <class V>
struct KindOf;
template <>
struct KindOf<strata_strategy_vtable> { static constexpr strata_plugin_kind value = STRATA_KIND_STRATEGY; };
template <>
struct KindOf<strata_cross_device_ops_vtable> { static constexpr strata_plugin_kind value = STRATA_KIND_CROSS_DEVICE_OPS; };
template <>
struct KindOf<strata_transport_vtable> { static constexpr strata_plugin_kind value = STRATA_KIND_TRANSPORT; };
template <>
struct KindOf<strata_resolver_vtable> { static constexpr strata_plugin_kind value = STRATA_KIND_CLUSTER_RESOLVER; };
template <>
struct KindOf<strata_input_vtable> { static constexpr strata_plugin_kind value = STRATA_KIND_INPUT_PIPELINE; };

/// An instance of another plugin's component. Move-only; releases it through
/// the host's release_plugin when dropped. Not thread-safe per object.
template <class Vtable>
class PluginRef {
 public:
  PluginRef() = default;
  PluginRef(const strata_host_api* host, const strata_plugin_instance& inst) : host_(host), inst_(inst) {}
  PluginRef(PluginRef&& o) noexcept : host_(o.host_), inst_(o.inst_) { o.inst_ = strata_plugin_instance{}; }
  PluginRef& operator=(PluginRef&& o) noexcept {
    if (this != &o) {
      reset();
      host_ = o.host_;
      inst_ = o.inst_;
      o.inst_ = strata_plugin_instance{};
    }
    return *this;
  }
  PluginRef(const PluginRef&) = delete;
  PluginRef& operator=(const PluginRef&) = delete;
  ~PluginRef() { reset(); }

  const Vtable* vtable() const { return static_cast<const Vtable*>(inst_.vtable); }
  template <class Handle>
  Handle handle() const { return static_cast<Handle>(inst_.handle); }
  void* raw_handle() const { return inst_.handle; }
  explicit operator bool() const { return inst_.handle != nullptr; }
  void reset() noexcept {
    if (host_ != nullptr && inst_.handle != nullptr) host_->release_plugin(host_, &inst_);
    inst_ = strata_plugin_instance{};
  }

 private:
  const strata_host_api* host_ = nullptr;
  strata_plugin_instance inst_{};
};

class Host {
 public:
  Host() = default;
  /// `subsystem` prefixes every log line of this Host ("strategy.mirrored").
  explicit Host(const strata_host_api* api, std::string subsystem = "plugin")
      : api_(api), subsystem_(std::move(subsystem)) {}

  const strata_host_api* api() const { return api_; }
  explicit operator bool() const { return api_ != nullptr; }
  const std::string& subsystem() const { return subsystem_; }
  /// A copy logging under another subsystem.
  Host with_subsystem(std::string subsystem) const { return Host(api_, std::move(subsystem)); }

  /// Log `message` at `level` (strata_log_level). No-op without a host table.
  void log(int32_t level, const std::string& message) const noexcept {
    if (api_ != nullptr && api_->log != nullptr) api_->log(api_, level, subsystem_.c_str(), message.c_str());
  }
  template <class... A> void trace(A&&... a) const { log(STRATA_LOG_TRACE, ::strata::detail::str_cat(std::forward<A>(a)...)); }
  template <class... A> void debug(A&&... a) const { log(STRATA_LOG_DEBUG, ::strata::detail::str_cat(std::forward<A>(a)...)); }
  template <class... A> void info(A&&... a) const { log(STRATA_LOG_INFO, ::strata::detail::str_cat(std::forward<A>(a)...)); }
  template <class... A> void warn(A&&... a) const { log(STRATA_LOG_WARN, ::strata::detail::str_cat(std::forward<A>(a)...)); }
  template <class... A> void error(A&&... a) const { log(STRATA_LOG_ERROR, ::strata::detail::str_cat(std::forward<A>(a)...)); }

  /// Create another plugin's component. Throws the host's error.
  template <class Vtable>
  PluginRef<Vtable> create_plugin(const std::string& name, const std::string& options_json) const {
    require("create_plugin");
    strata_plugin_instance inst{};
    STRATA_INIT_HEADER(&inst, strata_plugin_instance);
    strata_error err;
    strata_error_init(&err);
    const strata_status_t s =
        api_->create_plugin(api_, KindOf<Vtable>::value, name.c_str(), options_json.c_str(), &inst, &err);
    ::strata::detail::check_status(s, err, ::strata::detail::str_cat("creating ", name).c_str());
    return PluginRef<Vtable>(api_, inst);
  }

  /// Host memory on `device`; NULL when the host cannot allocate it.
  void* allocate(DLDevice device, uint64_t bytes, uint64_t alignment = 64) const {
    return api_ != nullptr ? api_->allocate(api_, device, bytes, alignment) : nullptr;
  }
  void free_memory(DLDevice device, void* ptr) const {
    if (api_ != nullptr && ptr != nullptr) api_->free_memory(api_, device, ptr);
  }

  // ---- since 1.4: CUDA devices through the host (the SDK links no CUDA) ----
  /// Whether the host table has the 1.4 device services.
  bool has_device_services() const {
    return STRATA_HAS_FIELD(api_, strata_host_api, memcpy_async) && api_->device_count != nullptr &&
           api_->memcpy_async != nullptr;
  }
  /// Visible CUDA devices. Throws the host's error when there are none
  /// (FAILED_PRECONDITION "no CUDA device visible: ..."), UNIMPLEMENTED
  /// when the host has no CUDA or predates ABI 1.4.
  int32_t cuda_device_count() const {
    require_devices("device_count");
    int32_t count = 0;
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->device_count(api_, kDLCUDA, &count, &err), err, "GPU devices");
    return count;
  }
  /// Make `device` current for the calling thread (kDLCPU: no-op).
  void set_device(DLDevice device) const {
    if (device.device_type == kDLCPU) return;
    require_devices("set_device");
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->set_device(api_, device, &err), err, "set_device");
  }
  /// A new non-blocking stream on `device`; give it back with stream_destroy.
  void* stream_create(DLDevice device) const {
    require_devices("stream_create");
    void* stream = nullptr;
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->stream_create(api_, device, &stream, &err), err, "stream_create");
    return stream;
  }
  void stream_destroy(void* stream) const noexcept {
    if (stream != nullptr && has_device_services()) api_->stream_destroy(api_, stream);
  }
  /// Wait (polling, at most timeout_ms; < 0 = the host's collective timeout)
  /// for the work on `stream`.
  void stream_synchronize(void* stream, int64_t timeout_ms = -1) const {
    require_devices("stream_synchronize");
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->stream_synchronize(api_, stream, timeout_ms, &err), err,
                                   "stream_synchronize");
  }
  /// Enqueue a copy on `stream` (see strata_host_api.memcpy_async).
  void memcpy_async(void* dst, DLDevice dst_device, const void* src, DLDevice src_device, uint64_t bytes,
                    void* stream) const {
    if (bytes == 0) return;
    require_devices("memcpy_async");
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(
        api_->memcpy_async(api_, dst, dst_device, src, src_device, bytes, stream, &err), err, "memcpy_async");
  }
  /// memcpy_async, then stream_synchronize: `dst` is ready on return
  /// (stream NULL: a synchronous copy). Host to host is a memcpy.
  void copy(void* dst, DLDevice dst_device, const void* src, DLDevice src_device, uint64_t bytes,
            void* stream = nullptr) const {
    if (bytes == 0) return;
    if (dst_device.device_type != kDLCUDA && src_device.device_type != kDLCUDA) {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
      return;
    }
    memcpy_async(dst, dst_device, src, src_device, bytes, stream);
    if (stream != nullptr) stream_synchronize(stream);
  }

  // ---- since 1.5: arithmetic on GPU memory ----
  /// Whether the host can update GPU memory in place (device_update).
  bool has_device_update() const {
    return STRATA_HAS_FIELD(api_, strata_host_api, device_update) && api_->device_update != nullptr;
  }
  /// dst = src, dst += src or dst -= src (strata_var_update_op) on `count`
  /// elements of `dtype` in `device`'s memory, ordered on `stream` (NULL:
  /// synchronous); see strata_host_api.device_update. UNIMPLEMENTED when
  /// the host predates ABI 1.5 (check has_device_update() first).
  void device_update(uint32_t op, DLDataType dtype, void* dst, const void* src, uint64_t count, DLDevice device,
                     void* stream = nullptr) const {
    if (!has_device_update())
      STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "device_update needs a host of ABI 1.5 or newer");
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->device_update(api_, op, dtype, dst, src, count, device, stream, &err), err,
                                   "device_update");
  }

  uint64_t now_ns() const { require("now_ns"); return api_->now_ns(api_); }
  bool abort_requested() const { return api_ != nullptr && api_->abort_requested(api_) != 0; }
  /// Since 1.1; returns false when the host is older (nothing was done).
  bool request_abort(const std::string& reason) const {
    if (!STRATA_HAS_FIELD(api_, strata_host_api, request_abort) || api_->request_abort == nullptr) return false;
    api_->request_abort(api_, reason.c_str());
    return true;
  }
  void record_collective(const strata_collective_fingerprint& fp) const {
    if (api_ != nullptr && api_->record_collective != nullptr) api_->record_collective(api_, &fp);
  }

  /// The job configuration at `json_pointer` as JSON text, or nullopt when absent.
  std::optional<std::string> get_config(const std::string& json_pointer) const {
    require("get_config");
    std::string out;
    strata_error err;
    strata_error_init(&err);
    const strata_status_t s = api_->get_config(api_, json_pointer.c_str(), &append, &out, &err);
    if (s == STRATA_ERR_NOT_FOUND) return std::nullopt;
    ::strata::detail::check_status(s, err, "get_config");
    return out;
  }

  void store_set(const std::string& key, const std::string& value, int64_t timeout_ms) const {
    require("store_set");
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->store_set(api_, key.c_str(), value.data(), value.size(), timeout_ms, &err), err,
                         "store_set");
  }
  std::string store_get(const std::string& key, int64_t timeout_ms) const {
    require("store_get");
    std::string out;
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->store_get(api_, key.c_str(), &append, &out, timeout_ms, &err), err, "store_get");
    return out;
  }
  int64_t store_add(const std::string& key, int64_t delta, int64_t timeout_ms) const {
    require("store_add");
    int64_t result = 0;
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->store_add(api_, key.c_str(), delta, &result, timeout_ms, &err), err, "store_add");
    return result;
  }
  void store_wait(const std::vector<std::string>& keys, int64_t timeout_ms) const {
    require("store_wait");
    std::vector<const char*> ptrs;
    ptrs.reserve(keys.size());
    for (const auto& k : keys) ptrs.push_back(k.c_str());
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(api_->store_wait(api_, ptrs.data(), ptrs.size(), timeout_ms, &err), err, "store_wait");
  }

  /// strata_write_fn that appends to a std::string passed as `user`.
  static void append(void* user, const char* data, uint64_t len) {
    static_cast<std::string*>(user)->append(data, static_cast<size_t>(len));
  }

 private:
  void require_devices(const char* what) const {
    require(what);
    if (!has_device_services())
      STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "host service ", what,
                   ": GPU devices need a host of ABI 1.4 or newer (this host's table predates the device "
                   "services); run with a newer Strata");
  }
  void require(const char* what) const {
    if (api_ == nullptr)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "host service ", what,
                   " needs a host table; this object was created without one");
  }
  const strata_host_api* api_ = nullptr;
  std::string subsystem_ = "plugin";
};

}  // namespace strata::sdk
