// SPDX-License-Identifier: Apache-2.0
// The C++ side of a Strata plugin: one abstract interface per component kind,
// a template adapter per kind that fills the kind's C vtable with static
// trampolines, and STRATA_PLUGIN, which exports strata_plugin_entry_v1.
//
// Writing a component:
//
//   class MyStrategy : public strata::sdk::StrategyBase {
//    public:
//     MyStrategy(strata::sdk::Host host, const char* options_json);  // may throw
//     ... override every pure virtual ...
//   };
//   STRATA_PLUGIN("my library", "1.0.0",
//                 STRATA_STRATEGY_COMPONENT(MyStrategy, "my_strategy", "1.0.0"));
//
// Every implementation is constructed as `T(Host, const char* options_json)`
// (options_json never NULL; "" means {}). Methods report errors by throwing:
// a trampoline catches strata::Error (-> its code and message), std::bad_alloc
// (-> INTERNAL "out of memory") and any other exception (-> INTERNAL with its
// what()), fills the caller's strata_error (which may be NULL; messages are
// truncated to fit) and returns the status. Nothing ever propagates across the
// C ABI.
//
// Optional vtable functions are filled only when the class declares the
// matching member (detected at compile time); otherwise the slot is NULL,
// which the ABI defines as "unsupported". The optional members are listed
// with each interface. Threading and blocking rules are those of the C header
// of the kind; the adapters add no locking.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "strata/c/strata.h"
#include "strata/error.hpp"
#include "strata/sdk/host.hpp"

namespace strata::sdk {

// ---------------------------------------------------------------- errors ---

/// Fill `err` (may be NULL) with `code` and `message`, truncating safely.
inline void set_error(strata_error* err, strata_status_t code, const char* message) noexcept {
  if (err == nullptr) return;
  err->code = code;
  if (err->struct_size != 0 && err->struct_size <= offsetof(strata_error, message)) return;
  size_t cap = STRATA_ERROR_MESSAGE_MAX;
  if (err->struct_size != 0 && err->struct_size < sizeof(strata_error))
    cap = err->struct_size - offsetof(strata_error, message);
  if (message == nullptr) message = "";
  const size_t n = std::min(std::strlen(message), cap - 1);
  std::memcpy(err->message, message, n);
  err->message[n] = '\0';
}

/// Run `f` and turn any exception into a status (see file comment).
template <class F>
strata_status_t guard(strata_error* err, F&& f) noexcept {
  try {
    f();
    return STRATA_OK;
  } catch (const strata::Error& e) {
    const strata_status_t code = e.code() < 0 ? e.code() : STRATA_ERR_INTERNAL;
    set_error(err, code, e.what());
    return code;
  } catch (const std::bad_alloc&) {
    set_error(err, STRATA_ERR_INTERNAL,
              "out of memory: an allocation failed inside the plugin; reduce tensor sizes or "
              "free memory");
    return STRATA_ERR_INTERNAL;
  } catch (const std::exception& e) {
    if (err != nullptr) {
      char buf[STRATA_ERROR_MESSAGE_MAX];
      std::snprintf(buf, sizeof buf, "internal error (uncaught C++ exception): %s", e.what());
      set_error(err, STRATA_ERR_INTERNAL, buf);
    }
    return STRATA_ERR_INTERNAL;
  } catch (...) {
    set_error(err, STRATA_ERR_INTERNAL, "internal error: unknown exception inside the plugin");
    return STRATA_ERR_INTERNAL;
  }
}

namespace detail {
template <class P>
P& deref(P* p, const char* what) {
  if (p == nullptr)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " is NULL; pass a valid pointer");
  return *p;
}
inline void write_string(strata_write_fn write, void* user, const std::string& s) {
  if (write == nullptr)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "write callback is NULL; pass a strata_write_fn");
  write(user, s.data(), s.size());
}
/// Host table handed to strata_plugin_entry_v1 (one per plugin library,
/// since the SDK is linked statically with hidden visibility).
inline const strata_host_api*& plugin_host_slot() {
  static const strata_host_api* host = nullptr;
  return host;
}
}  // namespace detail

/// The host table this library was loaded by (NULL before the entry ran).
inline const strata_host_api* plugin_host() { return detail::plugin_host_slot(); }

#define STRATA_SDK_HAS_MEMBER_(Trait, member)                                           \
  template <class T, class = void>                                                     \
  struct Trait : std::false_type {};                                                   \
  template <class T>                                                                   \
  struct Trait<T, std::void_t<decltype(&T::member)>> : std::true_type {};

namespace detail {
STRATA_SDK_HAS_MEMBER_(HasVariableView, variable_view)
STRATA_SDK_HAS_MEMBER_(HasSaveState, save_state)
STRATA_SDK_HAS_MEMBER_(HasRestoreState, restore_state)
STRATA_SDK_HAS_MEMBER_(HasReduceScatter, reduce_scatter)
STRATA_SDK_HAS_MEMBER_(HasAllReduceStart, all_reduce_start)
STRATA_SDK_HAS_MEMBER_(HasRequestWait, request_wait)
STRATA_SDK_HAS_MEMBER_(HasNativeAllReduce, all_reduce)
STRATA_SDK_HAS_MEMBER_(HasNativeBroadcast, broadcast)
STRATA_SDK_HAS_MEMBER_(HasNativeAllGather, all_gather)
STRATA_SDK_HAS_MEMBER_(HasNativeReduceScatter, reduce_scatter)
STRATA_SDK_HAS_MEMBER_(HasMemExport, mem_export)
STRATA_SDK_HAS_MEMBER_(HasIwrite, iwrite)
STRATA_SDK_HAS_MEMBER_(HasDetect, detect)
STRATA_SDK_HAS_MEMBER_(HasCardinality, cardinality)
STRATA_SDK_HAS_MEMBER_(HasSetTransport, set_transport)
STRATA_SDK_HAS_MEMBER_(HasVariableRef, variable_ref)
STRATA_SDK_HAS_MEMBER_(HasReplicaStream, replica_stream)
STRATA_SDK_HAS_MEMBER_(HasVariableAttach, variable_attach)
STRATA_SDK_HAS_MEMBER_(HasSubsystem, kSubsystem)

template <class T>
Host make_host(const strata_host_api* host, const char* kind) {
  if constexpr (HasSubsystem<T>::value) return Host(host, T::kSubsystem);
  else return Host(host, kind);
}
}  // namespace detail

// -------------------------------------------------------------- strategy ---

/// tf.distribute.Strategy as a plugin. See strata/c/strategy.h for every
/// method's contract. Optional members an implementation may declare:
///   DLTensor variable_view(strata_variable_t v, strata_replica_t r);
///   std::string save_state();
///   void restore_state(const void* data, uint64_t len);
///   void set_transport(const std::string& name, const std::string& options_json);  (ABI 1.2;
///       options_json is "{}" when the caller passed NULL or "")
///   std::string variable_ref(strata_variable_t v);  (ABI 1.3)
///   void* replica_stream(strata_replica_t r) noexcept;  (ABI 1.4: the replica's
///       cudaStream_t, NULL for host replicas; must not throw)
///   strata_variable_t variable_attach(const strata_variable_desc& desc);  (ABI 1.3: called
///       instead of variable_create when desc.attach_ref is set; without it such a
///       desc is INVALID_ARGUMENT)
class StrategyBase {
 public:
  virtual ~StrategyBase() = default;
  /// JSON object (see strategy.h describe).
  virtual std::string describe() = 0;
  virtual void run(strata_replica_fn fn, void* user) = 0;
  virtual int32_t replica_id_in_sync_group(strata_replica_t r) = 0;
  virtual void replica_all_reduce(strata_replica_t r, strata_reduce_op op, uint32_t num_tensors,
                                  const DLTensor* const* inputs, DLTensor* const* outputs) = 0;
  /// Returns a new tensor owned by the caller.
  virtual DLManagedTensor* replica_all_gather(strata_replica_t r, const DLTensor& input,
                                              int32_t axis) = 0;
  virtual void replica_merge_call(strata_replica_t r, strata_merge_fn fn, void* merge_user,
                                  void* replica_arg) = 0;
  virtual void reduce_to(strata_reduce_op op, uint32_t num_values, const DLTensor* const* values,
                         DLTensor& output) = 0;
  virtual DLManagedTensor* gather_to(uint32_t num_values, const DLTensor* const* values,
                                     int32_t axis) = 0;
  virtual strata_variable_t variable_create(const strata_variable_desc& desc,
                                            const DLTensor& initial) = 0;
  virtual void variable_destroy(strata_variable_t v) noexcept = 0;
  virtual DLManagedTensor* variable_read(strata_variable_t v, strata_replica_t r) = 0;
  virtual void variable_update(strata_variable_t v, strata_replica_t r, strata_var_update_op op,
                               const DLTensor& value) = 0;
};

template <class T>
struct StrategyAdapter {
  static T& self(strata_strategy_t s) { return *reinterpret_cast<T*>(&detail::deref(s, "strategy handle")); }

  static const strata_strategy_vtable* vtable() {
    static const strata_strategy_vtable v = make();
    return &v;
  }

 private:
  static strata_strategy_vtable make() {
    strata_strategy_vtable v{};
    STRATA_INIT_HEADER(&v, strata_strategy_vtable);
    v.create = [](const strata_host_api* host, const char* options, strata_strategy_t* out,
                  strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        auto obj = std::make_unique<T>(detail::make_host<T>(host, "strategy"), options ? options : "");
        o = reinterpret_cast<strata_strategy_t>(obj.release());
      });
    };
    v.destroy = [](strata_strategy_t s) { delete reinterpret_cast<T*>(s); };
    v.describe = [](strata_strategy_t s, strata_write_fn write, void* user, strata_error* err) {
      return guard(err, [&] { detail::write_string(write, user, self(s).describe()); });
    };
    v.run = [](strata_strategy_t s, strata_replica_fn fn, void* user, strata_error* err) {
      return guard(err, [&] {
        if (fn == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "run: replica function is NULL");
        self(s).run(fn, user);
      });
    };
    v.replica_id_in_sync_group = [](strata_strategy_t s, strata_replica_t r) -> int32_t {
      int32_t id = -1;
      strata_status_t st = guard(nullptr, [&] { id = self(s).replica_id_in_sync_group(r); });
      return st == STRATA_OK ? id : -1;
    };
    v.replica_all_reduce = [](strata_strategy_t s, strata_replica_t r, uint32_t op, uint32_t n,
                              const DLTensor* const* in, DLTensor* const* out, strata_error* err) {
      return guard(err, [&] {
        if (n > 0 && (in == nullptr || out == nullptr))
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "replica_all_reduce: inputs/outputs array is NULL");
        self(s).replica_all_reduce(r, check_reduce_op_(op), n, in, out);
      });
    };
    v.replica_all_gather = [](strata_strategy_t s, strata_replica_t r, const DLTensor* input,
                              int32_t axis, DLManagedTensor** out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        o = self(s).replica_all_gather(r, detail::deref(input, "input"), axis);
      });
    };
    v.replica_merge_call = [](strata_strategy_t s, strata_replica_t r, strata_merge_fn fn,
                              void* merge_user, void* arg, strata_error* err) {
      return guard(err, [&] {
        if (fn == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "merge_call: merge function is NULL");
        self(s).replica_merge_call(r, fn, merge_user, arg);
      });
    };
    v.reduce_to = [](strata_strategy_t s, uint32_t op, uint32_t n, const DLTensor* const* values,
                     DLTensor* output, strata_error* err) {
      return guard(err, [&] {
        if (values == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_to: values is NULL");
        self(s).reduce_to(check_reduce_op_(op), n, values, detail::deref(output, "output"));
      });
    };
    v.gather_to = [](strata_strategy_t s, uint32_t n, const DLTensor* const* values, int32_t axis,
                     DLManagedTensor** out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        if (values == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "gather_to: values is NULL");
        o = self(s).gather_to(n, values, axis);
      });
    };
    v.variable_create = [](strata_strategy_t s, const strata_variable_desc* desc,
                           const DLTensor* initial, strata_variable_t* out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        const strata_variable_desc& d = detail::deref(desc, "variable desc");
        if (STRATA_HAS_FIELD(&d, strata_variable_desc, attach_ref) && d.attach_ref != nullptr) {
          if constexpr (detail::HasVariableAttach<T>::value) {
            o = self(s).variable_attach(d);
            return;
          } else {
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable '", d.name != nullptr ? d.name : "",
                         "': this strategy cannot attach to a variable of another process; create it under "
                         "the parameter_server strategy's scope");
          }
        }
        o = self(s).variable_create(d, detail::deref(initial, "initial value"));
      });
    };
    v.variable_destroy = [](strata_strategy_t s, strata_variable_t var) {
      if (s != nullptr && var != nullptr) reinterpret_cast<T*>(s)->variable_destroy(var);
    };
    v.variable_read = [](strata_strategy_t s, strata_variable_t var, strata_replica_t r,
                         DLManagedTensor** out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        o = self(s).variable_read(var, r);
      });
    };
    v.variable_update = [](strata_strategy_t s, strata_variable_t var, strata_replica_t r,
                           uint32_t op, const DLTensor* value, strata_error* err) {
      return guard(err, [&] {
        if (op > STRATA_VAR_ASSIGN_SUB)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "variable update op ", op,
                       " is not ASSIGN(0), ASSIGN_ADD(1) or ASSIGN_SUB(2)");
        self(s).variable_update(var, r, static_cast<strata_var_update_op>(op), detail::deref(value, "value"));
      });
    };
    if constexpr (detail::HasVariableView<T>::value) {
      v.variable_view = [](strata_strategy_t s, strata_variable_t var, strata_replica_t r,
                           DLTensor* out, strata_error* err) {
        return guard(err, [&] { detail::deref(out, "out") = self(s).variable_view(var, r); });
      };
    }
    if constexpr (detail::HasSaveState<T>::value) {
      v.save_state = [](strata_strategy_t s, strata_write_fn write, void* user, strata_error* err) {
        return guard(err, [&] { detail::write_string(write, user, self(s).save_state()); });
      };
    }
    if constexpr (detail::HasRestoreState<T>::value) {
      v.restore_state = [](strata_strategy_t s, const void* data, uint64_t len, strata_error* err) {
        return guard(err, [&] { self(s).restore_state(data, len); });
      };
    }
    if constexpr (detail::HasVariableRef<T>::value) {
      v.variable_ref = [](strata_strategy_t s, strata_variable_t var, strata_write_fn write, void* user,
                          strata_error* err) {
        return guard(err, [&] { detail::write_string(write, user, self(s).variable_ref(var)); });
      };
    }
    if constexpr (detail::HasReplicaStream<T>::value) {
      v.replica_stream = [](strata_strategy_t s, strata_replica_t r) -> void* {
        try {
          return self(s).replica_stream(r);
        } catch (...) {
          return nullptr;  // no exception crosses the ABI
        }
      };
    }
    if constexpr (detail::HasSetTransport<T>::value) {
      v.set_transport = [](strata_strategy_t s, const char* name, const char* options, strata_error* err) {
        return guard(err, [&] {
          if (name == nullptr)
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "set_transport: the transport name is NULL; pass e.g. \"tcp\"");
          self(s).set_transport(std::string(name), options != nullptr && *options != '\0' ? options : "{}");
        });
      };
    }
    return v;
  }
  static strata_reduce_op check_reduce_op_(uint32_t op) {
    if (op > STRATA_REDUCE_PROD)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce op ", op,
                   " is not a strata_reduce_op; use SUM(0), MEAN(1), MIN(2), MAX(3) or PROD(4)");
    return static_cast<strata_reduce_op>(op);
  }
};

// ------------------------------------------------------ cross-device ops ---

/// tf.distribute.CrossDeviceOps as a plugin (see strata/c/cross_device_ops.h).
/// Optional members:
///   void reduce_scatter(strata_reduce_op op, uint32_t num_replicas,
///                       const DLTensor* const* inputs, DLTensor* const* outputs);
///   strata_cdo_request_t all_reduce_start(strata_reduce_op op, uint32_t num_tensors,
///       uint32_t num_replicas, const DLTensor* const* inputs, DLTensor* const* outputs);
///   void request_wait(strata_cdo_request_t request, int64_t timeout_ms);
///   (start and wait are filled only when both are declared)
///   void set_transport(const std::string& name, const std::string& options_json);  (ABI 1.2;
///       options_json is "{}" when the caller passed NULL or "")
class CrossDeviceOpsBase {
 public:
  virtual ~CrossDeviceOpsBase() = default;
  /// Called by the adapter's destroy right before `delete`, while the
  /// object's dynamic type is still the plugin's own class: stop here any
  /// thread that calls the object's virtuals (a destructor would be too
  /// late: the most-derived one runs first and changes the dynamic type).
  virtual void before_destroy() noexcept {}
  virtual void all_reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
                          const DLTensor* const* inputs, DLTensor* const* outputs) = 0;
  virtual void reduce(strata_reduce_op op, uint32_t num_tensors, uint32_t num_replicas,
                      const DLTensor* const* inputs, DLTensor* const* outputs) = 0;
  virtual void broadcast(const DLTensor& src, uint32_t num_replicas, DLTensor* const* dsts) = 0;
  virtual void all_gather(uint32_t num_replicas, const DLTensor* const* inputs, int32_t axis,
                          DLTensor* const* outputs) = 0;
};

template <class T>
struct CrossDeviceOpsAdapter {
  static T& self(strata_cross_device_ops_t c) {
    return *reinterpret_cast<T*>(&detail::deref(c, "cross_device_ops handle"));
  }
  static const strata_cross_device_ops_vtable* vtable() {
    static const strata_cross_device_ops_vtable v = make();
    return &v;
  }

 private:
  static void check_arrays(const void* in, const void* out) {
    if (in == nullptr || out == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "inputs/outputs array is NULL; pass arrays of tensors");
  }
  static strata_reduce_op op_(uint32_t op) {
    if (op > STRATA_REDUCE_PROD)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce op ", op,
                   " is not a strata_reduce_op; use SUM(0), MEAN(1), MIN(2), MAX(3) or PROD(4)");
    return static_cast<strata_reduce_op>(op);
  }
  static strata_cross_device_ops_vtable make() {
    strata_cross_device_ops_vtable v{};
    STRATA_INIT_HEADER(&v, strata_cross_device_ops_vtable);
    v.create = [](const strata_host_api* host, const char* options, strata_cross_device_ops_t* out,
                  strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        auto obj = std::make_unique<T>(detail::make_host<T>(host, "cross_device_ops"), options ? options : "");
        o = reinterpret_cast<strata_cross_device_ops_t>(obj.release());
      });
    };
    v.destroy = [](strata_cross_device_ops_t c) {
      T* obj = reinterpret_cast<T*>(c);
      if constexpr (std::is_base_of_v<CrossDeviceOpsBase, T>)
        if (obj != nullptr) static_cast<CrossDeviceOpsBase*>(obj)->before_destroy();
      delete obj;
    };
    v.all_reduce = [](strata_cross_device_ops_t c, uint32_t op, uint32_t nt, uint32_t nr,
                      const DLTensor* const* in, DLTensor* const* out, strata_error* err) {
      return guard(err, [&] {
        check_arrays(in, out);
        self(c).all_reduce(op_(op), nt, nr, in, out);
      });
    };
    v.reduce = [](strata_cross_device_ops_t c, uint32_t op, uint32_t nt, uint32_t nr,
                  const DLTensor* const* in, DLTensor* const* out, strata_error* err) {
      return guard(err, [&] {
        check_arrays(in, out);
        self(c).reduce(op_(op), nt, nr, in, out);
      });
    };
    v.broadcast = [](strata_cross_device_ops_t c, const DLTensor* src, uint32_t nr,
                     DLTensor* const* dsts, strata_error* err) {
      return guard(err, [&] {
        check_arrays(src, dsts);
        self(c).broadcast(*src, nr, dsts);
      });
    };
    v.all_gather = [](strata_cross_device_ops_t c, uint32_t nr, const DLTensor* const* in,
                      int32_t axis, DLTensor* const* out, strata_error* err) {
      return guard(err, [&] {
        check_arrays(in, out);
        self(c).all_gather(nr, in, axis, out);
      });
    };
    if constexpr (detail::HasReduceScatter<T>::value) {
      v.reduce_scatter = [](strata_cross_device_ops_t c, uint32_t op, uint32_t nr,
                            const DLTensor* const* in, DLTensor* const* out, strata_error* err) {
        return guard(err, [&] {
          check_arrays(in, out);
          self(c).reduce_scatter(op_(op), nr, in, out);
        });
      };
    }
    if constexpr (detail::HasAllReduceStart<T>::value && detail::HasRequestWait<T>::value) {
      v.all_reduce_start = [](strata_cross_device_ops_t c, uint32_t op, uint32_t nt, uint32_t nr,
                              const DLTensor* const* in, DLTensor* const* out,
                              strata_cdo_request_t* req, strata_error* err) {
        return guard(err, [&] {
          check_arrays(in, out);
          auto& r = detail::deref(req, "request");
          r = self(c).all_reduce_start(op_(op), nt, nr, in, out);
        });
      };
      v.request_wait = [](strata_cross_device_ops_t c, strata_cdo_request_t req, int64_t timeout_ms,
                          strata_error* err) {
        return guard(err, [&] {
          if (req == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "request_wait: request is NULL");
          self(c).request_wait(req, timeout_ms);
        });
      };
    }
    if constexpr (detail::HasSetTransport<T>::value) {
      v.set_transport = [](strata_cross_device_ops_t c, const char* name, const char* options, strata_error* err) {
        return guard(err, [&] {
          if (name == nullptr)
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "set_transport: the transport name is NULL; pass e.g. \"tcp\"");
          self(c).set_transport(std::string(name), options != nullptr && *options != '\0' ? options : "{}");
        });
      };
    }
    return v;
  }
};

// ------------------------------------------------------------- transport ---

/// One communicator of a transport (see strata/c/transport.h). Optional
/// members (native collectives and RMA), filled when declared:
///   void all_reduce(const void* send, void* recv, uint64_t count, DLDataType dtype,
///                   strata_reduce_op op, void* stream);
///   void broadcast(const void* send, void* recv, uint64_t count, DLDataType dtype,
///                  int32_t root, void* stream);
///   void all_gather(const void* send, void* recv, uint64_t count_per_rank,
///                   DLDataType dtype, void* stream);
///   void reduce_scatter(const void* send, void* recv, uint64_t count_per_rank,
///                       DLDataType dtype, strata_reduce_op op, void* stream);
///   std::string mem_export(strata_mem_region_t mr);
///   strata_request_t iwrite(int32_t peer, const strata_buffer& buf, const void* remote_key,
///                           uint64_t remote_key_len, uint64_t remote_offset);
class CommBase {
 public:
  virtual ~CommBase() = default;
  /// Thread-safe, never blocks.
  virtual void abort(const char* reason) noexcept = 0;
  virtual strata_mem_region_t mem_register(void* data, uint64_t bytes, DLDevice device) = 0;
  virtual void mem_deregister(strata_mem_region_t mr) noexcept = 0;
  virtual strata_request_t isend(int32_t peer, uint64_t tag, const strata_buffer& buf) = 0;
  virtual strata_request_t irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) = 0;
  /// Never blocks; true (and *bytes) when finished. A failed request throws.
  virtual bool test(strata_request_t req, uint64_t* bytes) = 0;
  /// Blocks up to timeout_ms; returns the bytes moved.
  virtual uint64_t wait(strata_request_t req, int64_t timeout_ms) = 0;
  virtual void cancel(strata_request_t req) noexcept = 0;
};

/// comm_create's argument checks, the same for every transport: a
/// non-empty name shared by the ranks, and 0 <= rank < world_size. `who`
/// starts the messages ("comm_create" by default).
inline void check_comm_create_args(const char* name, int32_t rank, int32_t world_size,
                                   const char* who = "comm_create") {
  if (name == nullptr || name[0] == '\0')
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who, ": the communicator name is empty; pass a name shared by every rank");
  if (world_size < 1 || rank < 0 || rank >= world_size)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who, "('", name, "'): rank ", rank, " is not in 0..", world_size - 1,
                 " (world size ", world_size, ")");
}

/// A transport: `using Comm = MyComm;` (derived from CommBase) is required.
class TransportBase {
 public:
  virtual ~TransportBase() = default;
  virtual strata_transport_caps caps() = 0;
  /// Returns a new communicator (owned by the caller through comm_destroy).
  virtual std::unique_ptr<CommBase> comm_create(const char* name, int32_t rank, int32_t world_size,
                                                int64_t timeout_ms) = 0;
};

template <class T>
struct TransportAdapter {
  using Comm = typename T::Comm;
  static_assert(std::is_base_of_v<CommBase, Comm>, "T::Comm must derive from strata::sdk::CommBase");
  static T& self(strata_transport_t t) { return *reinterpret_cast<T*>(&detail::deref(t, "transport handle")); }
  static Comm& comm(strata_comm_t c) { return *reinterpret_cast<Comm*>(&detail::deref(c, "communicator handle")); }
  static const strata_transport_vtable* vtable() {
    static const strata_transport_vtable v = make();
    return &v;
  }

 private:
  static strata_reduce_op op_(uint32_t op) {
    if (op > STRATA_REDUCE_PROD)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce op ", op, " is not a strata_reduce_op");
    return static_cast<strata_reduce_op>(op);
  }
  static strata_transport_vtable make() {
    strata_transport_vtable v{};
    STRATA_INIT_HEADER(&v, strata_transport_vtable);
    v.create = [](const strata_host_api* host, const char* options, strata_transport_t* out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        auto obj = std::make_unique<T>(detail::make_host<T>(host, "transport"), options ? options : "");
        o = reinterpret_cast<strata_transport_t>(obj.release());
      });
    };
    v.destroy = [](strata_transport_t t) { delete reinterpret_cast<T*>(t); };
    v.get_caps = [](strata_transport_t t, strata_transport_caps* caps, strata_error* err) {
      return guard(err, [&] {
        auto& c = detail::deref(caps, "caps");
        strata_transport_caps mine = self(t).caps();
        STRATA_INIT_HEADER(&mine, strata_transport_caps);
        const uint32_t n = c.struct_size != 0 && c.struct_size < sizeof mine ? c.struct_size : sizeof mine;
        std::memcpy(&c, &mine, n);
        c.struct_size = n;
      });
    };
    v.comm_create = [](strata_transport_t t, const char* name, int32_t rank, int32_t world,
                       int64_t timeout_ms, strata_comm_t* out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        std::unique_ptr<CommBase> c = self(t).comm_create(name ? name : "", rank, world, timeout_ms);
        if (dynamic_cast<Comm*>(c.get()) == nullptr)
          STRATA_THROW(STRATA_ERR_INTERNAL, "comm_create returned an object that is not T::Comm");
        o = reinterpret_cast<strata_comm_t>(static_cast<Comm*>(c.release()));
      });
    };
    v.comm_destroy = [](strata_comm_t c) { delete reinterpret_cast<Comm*>(c); };
    v.comm_abort = [](strata_comm_t c, const char* reason) {
      if (c != nullptr) reinterpret_cast<Comm*>(c)->abort(reason ? reason : "aborted");
    };
    v.mem_register = [](strata_comm_t c, void* data, uint64_t bytes, DLDevice dev, strata_mem_region_t* out,
                        strata_error* err) {
      return guard(err, [&] { detail::deref(out, "out") = comm(c).mem_register(data, bytes, dev); });
    };
    v.mem_deregister = [](strata_comm_t c, strata_mem_region_t mr) {
      if (c != nullptr) reinterpret_cast<Comm*>(c)->mem_deregister(mr);
    };
    v.isend = [](strata_comm_t c, int32_t peer, uint64_t tag, const strata_buffer* buf, strata_request_t* out,
                 strata_error* err) {
      return guard(err, [&] { detail::deref(out, "out") = comm(c).isend(peer, tag, detail::deref(buf, "buffer")); });
    };
    v.irecv = [](strata_comm_t c, int32_t peer, uint64_t tag, const strata_buffer* buf, strata_request_t* out,
                 strata_error* err) {
      return guard(err, [&] { detail::deref(out, "out") = comm(c).irecv(peer, tag, detail::deref(buf, "buffer")); });
    };
    v.test = [](strata_comm_t c, strata_request_t req, int32_t* done, uint64_t* bytes, strata_error* err) {
      return guard(err, [&] {
        uint64_t b = 0;
        const bool d = comm(c).test(req, &b);
        detail::deref(done, "done") = d ? 1 : 0;
        if (bytes != nullptr && d) *bytes = b;
      });
    };
    v.wait = [](strata_comm_t c, strata_request_t req, int64_t timeout_ms, uint64_t* bytes, strata_error* err) {
      return guard(err, [&] {
        const uint64_t b = comm(c).wait(req, timeout_ms);
        if (bytes != nullptr) *bytes = b;
      });
    };
    v.cancel = [](strata_comm_t c, strata_request_t req) {
      if (c != nullptr) reinterpret_cast<Comm*>(c)->cancel(req);
    };
    if constexpr (detail::HasNativeAllReduce<Comm>::value) {
      v.all_reduce = [](strata_comm_t c, const void* s, void* r, uint64_t n, DLDataType dt, uint32_t op,
                        void* stream, strata_error* err) {
        return guard(err, [&] { comm(c).all_reduce(s, r, n, dt, op_(op), stream); });
      };
    }
    if constexpr (detail::HasNativeBroadcast<Comm>::value) {
      v.broadcast = [](strata_comm_t c, const void* s, void* r, uint64_t n, DLDataType dt, int32_t root,
                       void* stream, strata_error* err) {
        return guard(err, [&] { comm(c).broadcast(s, r, n, dt, root, stream); });
      };
    }
    if constexpr (detail::HasNativeAllGather<Comm>::value) {
      v.all_gather = [](strata_comm_t c, const void* s, void* r, uint64_t n, DLDataType dt, void* stream,
                        strata_error* err) {
        return guard(err, [&] { comm(c).all_gather(s, r, n, dt, stream); });
      };
    }
    if constexpr (detail::HasNativeReduceScatter<Comm>::value) {
      v.reduce_scatter = [](strata_comm_t c, const void* s, void* r, uint64_t n, DLDataType dt, uint32_t op,
                            void* stream, strata_error* err) {
        return guard(err, [&] { comm(c).reduce_scatter(s, r, n, dt, op_(op), stream); });
      };
    }
    if constexpr (detail::HasMemExport<Comm>::value) {
      v.mem_export = [](strata_comm_t c, strata_mem_region_t mr, strata_write_fn write, void* user,
                        strata_error* err) {
        return guard(err, [&] { detail::write_string(write, user, comm(c).mem_export(mr)); });
      };
    }
    if constexpr (detail::HasIwrite<Comm>::value) {
      v.iwrite = [](strata_comm_t c, int32_t peer, const strata_buffer* buf, const void* key, uint64_t key_len,
                    uint64_t off, strata_request_t* out, strata_error* err) {
        return guard(err, [&] {
          detail::deref(out, "out") = comm(c).iwrite(peer, detail::deref(buf, "buffer"), key, key_len, off);
        });
      };
    }
    return v;
  }
};

// ------------------------------------------------------ cluster resolver ---

/// tf.distribute.cluster_resolver as a plugin (see strata/c/resolver.h).
/// Optional: `static bool detect(const Host& host);` for auto-detection.
class ResolverBase {
 public:
  virtual ~ResolverBase() = default;
  /// The resolved cluster as one JSON object.
  virtual std::string describe() = 0;
  /// task_type / rpc_layer NULL mean this task's / the resolver's own.
  virtual std::string master(const char* task_type, int32_t task_id, const char* rpc_layer) = 0;
};

template <class T>
struct ResolverAdapter {
  static T& self(strata_resolver_t r) { return *reinterpret_cast<T*>(&detail::deref(r, "resolver handle")); }
  static const strata_resolver_vtable* vtable() {
    static const strata_resolver_vtable v = make();
    return &v;
  }

 private:
  static strata_resolver_vtable make() {
    strata_resolver_vtable v{};
    STRATA_INIT_HEADER(&v, strata_resolver_vtable);
    v.create = [](const strata_host_api* host, const char* options, strata_resolver_t* out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        auto obj = std::make_unique<T>(detail::make_host<T>(host, "cluster_resolver"), options ? options : "");
        o = reinterpret_cast<strata_resolver_t>(obj.release());
      });
    };
    v.destroy = [](strata_resolver_t r) { delete reinterpret_cast<T*>(r); };
    v.describe = [](strata_resolver_t r, strata_write_fn write, void* user, strata_error* err) {
      return guard(err, [&] { detail::write_string(write, user, self(r).describe()); });
    };
    v.master = [](strata_resolver_t r, const char* task_type, int32_t task_id, const char* rpc_layer,
                  strata_write_fn write, void* user, strata_error* err) {
      return guard(err, [&] { detail::write_string(write, user, self(r).master(task_type, task_id, rpc_layer)); });
    };
    if constexpr (detail::HasDetect<T>::value) {
      v.detect = [](const strata_host_api* host) -> int32_t {
        bool yes = false;
        guard(nullptr, [&] { yes = T::detect(detail::make_host<T>(host, "cluster_resolver")); });
        return yes ? 1 : 0;
      };
    }
    return v;
  }
};

// -------------------------------------------------------- input pipeline ---

/// Element-wise (DATA) sharding for input pipelines that are not file-based:
/// keep elements first, first + stride, ... A second shard() composes with
/// the first (keeps every n-th of the elements kept so far), as tf.data does.
struct DataShard {
  int64_t first = 0;
  int64_t stride = 1;

  /// Apply shard(policy, num_shards, index) for `component` (e.g. "memory
  /// input pipeline", as errors name it).
  /// FILE is refused with `why_not_file` (why this pipeline has no files);
  /// a shard after reading started is refused too.
  void apply(const char* component, const char* why_not_file, strata_shard_policy policy, int32_t num_shards,
             int32_t index, bool started) {
    if (policy == STRATA_SHARD_OFF) return;
    if (policy == STRATA_SHARD_FILE)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "FILE sharding is impossible for the ", component, ": ",
                   why_not_file, "; use AutoShardPolicy DATA or AUTO");
    if (num_shards < 1 || index < 0 || index >= num_shards)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, component, ": shard(DATA, ", num_shards, ", ", index,
                   ") is invalid; need num_shards >= 1 and 0 <= index < num_shards");
    if (started)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, component, ": shard() after next(); shard before reading");
    first += static_cast<int64_t>(index) * stride;
    stride *= num_shards;
  }
  /// Whether element `i` (0-based, in source order) belongs to this shard.
  bool keeps(int64_t i) const { return i >= first && (i - first) % stride == 0; }
  /// How many of `total` elements this shard keeps.
  int64_t count(int64_t total) const { return first >= total ? 0 : (total - first + stride - 1) / stride; }
};

/// An input pipeline (see strata/c/input.h). Constructed as
/// `T(Host, const char* options_json, const strata_input_context& ctx)`.
/// Optional: `int64_t cardinality();`, `std::string save_state();`,
/// `void restore_state(const void* data, uint64_t len);`.
class InputPipelineBase {
 public:
  virtual ~InputPipelineBase() = default;
  /// Sets *flags; returns the file list as a JSON array ("" when not file-based).
  virtual std::string shard_info(uint32_t* flags) = 0;
  virtual void shard(strata_shard_policy policy, int32_t num_shards, int32_t index) = 0;
  /// Fill `out`; throw OutOfRangeError at the end of data.
  virtual void next(int64_t timeout_ms, strata_element& out) = 0;
};

template <class T>
struct InputPipelineAdapter {
  static T& self(strata_input_t in) { return *reinterpret_cast<T*>(&detail::deref(in, "input handle")); }
  static const strata_input_vtable* vtable() {
    static const strata_input_vtable v = make();
    return &v;
  }

 private:
  static strata_input_vtable make() {
    strata_input_vtable v{};
    STRATA_INIT_HEADER(&v, strata_input_vtable);
    v.open = [](const strata_host_api* host, const char* options, const strata_input_context* ctx,
                strata_input_t* out, strata_error* err) {
      return guard(err, [&] {
        auto& o = detail::deref(out, "out");
        auto obj = std::make_unique<T>(detail::make_host<T>(host, "input_pipeline"), options ? options : "",
                                       detail::deref(ctx, "input context"));
        o = reinterpret_cast<strata_input_t>(obj.release());
      });
    };
    v.close = [](strata_input_t in) { delete reinterpret_cast<T*>(in); };
    v.shard_info = [](strata_input_t in, uint32_t* flags, strata_write_fn write, void* user, strata_error* err) {
      return guard(err, [&] {
        const std::string files = self(in).shard_info(&detail::deref(flags, "flags"));
        if (!files.empty()) detail::write_string(write, user, files);
      });
    };
    v.shard = [](strata_input_t in, uint32_t policy, int32_t n, int32_t index, strata_error* err) {
      return guard(err, [&] {
        if (policy > STRATA_SHARD_DATA)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "shard policy ", policy, " is not OFF(0), FILE(1) or DATA(2)");
        self(in).shard(static_cast<strata_shard_policy>(policy), n, index);
      });
    };
    v.next = [](strata_input_t in, int64_t timeout_ms, strata_element* out, strata_error* err) {
      return guard(err, [&] { self(in).next(timeout_ms, detail::deref(out, "element")); });
    };
    if constexpr (detail::HasCardinality<T>::value) {
      v.cardinality = [](strata_input_t in) -> int64_t {
        int64_t n = -1;
        guard(nullptr, [&] { n = self(in).cardinality(); });
        return n;
      };
    }
    if constexpr (detail::HasSaveState<T>::value) {
      v.save_state = [](strata_input_t in, strata_write_fn write, void* user, strata_error* err) {
        return guard(err, [&] { detail::write_string(write, user, self(in).save_state()); });
      };
    }
    if constexpr (detail::HasRestoreState<T>::value) {
      v.restore_state = [](strata_input_t in, const void* data, uint64_t len, strata_error* err) {
        return guard(err, [&] { self(in).restore_state(data, len); });
      };
    }
    return v;
  }
};

// ---------------------------------------------------------------- export ---

/// A descriptor entry; use the STRATA_*_COMPONENT macros.
inline strata_plugin_component make_component(strata_plugin_kind kind, const char* name,
                                              const char* version, const void* vtable) {
  strata_plugin_component c{};
  STRATA_INIT_HEADER(&c, strata_plugin_component);
  c.kind = kind;
  c.name = name;
  c.version = version;
  c.vtable = vtable;
  return c;
}

namespace detail {
inline strata_status_t sdk_init(const strata_host_api* host, strata_error*) {
  plugin_host_slot() = host;
  return STRATA_OK;
}
inline strata_plugin_desc make_desc(const char* lib, const char* version, const strata_plugin_component* comps,
                                    uint32_t n) {
  strata_plugin_desc d{};
  STRATA_INIT_HEADER(&d, strata_plugin_desc);
  d.library_name = lib;
  d.library_version = version;
  d.num_components = n;
  d.components = comps;
  d.init = &sdk_init;
  d.shutdown = nullptr;
  return d;
}
inline strata_status_t plugin_entry(const strata_host_api* host, const strata_plugin_desc* desc,
                                    const strata_plugin_desc** out) {
  if (out == nullptr) return STRATA_ERR_INVALID_ARGUMENT;
  if (host != nullptr) plugin_host_slot() = host;
  *out = desc;
  return STRATA_OK;
}
}  // namespace detail

}  // namespace strata::sdk

#define STRATA_STRATEGY_COMPONENT(T, name, version) \
  ::strata::sdk::make_component(STRATA_KIND_STRATEGY, name, version, ::strata::sdk::StrategyAdapter<T>::vtable())
#define STRATA_CROSS_DEVICE_OPS_COMPONENT(T, name, version)                             \
  ::strata::sdk::make_component(STRATA_KIND_CROSS_DEVICE_OPS, name, version,            \
                                ::strata::sdk::CrossDeviceOpsAdapter<T>::vtable())
#define STRATA_TRANSPORT_COMPONENT(T, name, version) \
  ::strata::sdk::make_component(STRATA_KIND_TRANSPORT, name, version, ::strata::sdk::TransportAdapter<T>::vtable())
#define STRATA_RESOLVER_COMPONENT(T, name, version)                                     \
  ::strata::sdk::make_component(STRATA_KIND_CLUSTER_RESOLVER, name, version,            \
                                ::strata::sdk::ResolverAdapter<T>::vtable())
#define STRATA_INPUT_PIPELINE_COMPONENT(T, name, version)                               \
  ::strata::sdk::make_component(STRATA_KIND_INPUT_PIPELINE, name, version,              \
                                ::strata::sdk::InputPipelineAdapter<T>::vtable())

/// Export the library: STRATA_PLUGIN("name", "1.0.0", COMPONENT, ...) at
/// namespace scope in exactly one source file of the plugin. Defines the
/// only exported symbol, strata_plugin_entry_v1; the descriptor and the
/// vtables are function-local statics (built on the first call, thread-safe).
#define STRATA_PLUGIN(library_name, library_version, ...)                                           \
  extern "C" STRATA_EXPORT strata_status_t strata_plugin_entry_v1(                                 \
      const strata_host_api* host, uint32_t host_abi_minor, const strata_plugin_desc** out) {       \
    (void)host_abi_minor;                                                                           \
    static const strata_plugin_component strata_components_[] = {__VA_ARGS__};                      \
    static const strata_plugin_desc strata_desc_ = ::strata::sdk::detail::make_desc(                \
        library_name, library_version, strata_components_,                                          \
        static_cast<uint32_t>(sizeof(strata_components_) / sizeof(strata_components_[0])));         \
    return ::strata::sdk::detail::plugin_entry(host, &strata_desc_, out);                           \
  }
