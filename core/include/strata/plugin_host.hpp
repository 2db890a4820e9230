// SPDX-License-Identifier: Apache-2.0
// The plugin host: finds, loads, validates and keeps alive plugin libraries,
// and creates instances of their components.
//
// Search order (DESIGN.md): an explicit "path" in the job config for a
// component, then STRATA_PLUGIN_PATH (colon-separated directories), then
// lib/strata/plugins next to libstrata_core (found with dladdr). Candidate
// files are named libstrata-<kind>-<name>.so. A library that fails to load
// or validate is recorded as rejected with the reason; when it was named
// explicitly (config path) that is a hard error, otherwise it is skipped with
// one log line. Libraries are never dlclose'd before the host is destroyed
// (process exit), so no object can outlive its code.
//
// Thread-safety: every member is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/c/strata.h"
#include "strata/error.hpp"
#include "strata/export.hpp"
#include "strata/store.hpp"

namespace strata {

/// Short kind names used in file names, JSON and messages.
/// "strategy", "cross_device_ops", "transport", "cluster_resolver", "input_pipeline".
STRATA_API const char* kind_name(strata_plugin_kind kind);
/// Inverse of kind_name; also accepts the file-name forms "resolver" and
/// "input". Throws InvalidArgumentError for anything else.
STRATA_API strata_plugin_kind kind_from_name(const std::string& name);

/// One row of `strata-info`: a component of a library, or a rejected library.
struct PluginInfo {
  std::string path;     ///< canonical path of the library ("<builtin>" for core's own)
  std::string kind;     ///< kind_name(), or "" when rejected before the descriptor was read
  std::string name;     ///< component name ("" when unknown)
  std::string version;  ///< component version ("" when unknown)
  std::string abi;      ///< "MAJOR.MINOR" the library was built against ("" when unknown)
  bool ok = false;      ///< loaded and validated
  std::string error;    ///< rejection reason when !ok
};

/// A live instance of a plugin component. Move-only; destroys the instance
/// (through the component's own destroy) when dropped.
class STRATA_API PluginInstance {
 public:
  PluginInstance() = default;
  PluginInstance(strata_plugin_kind kind, const void* vtable, void* handle, std::string name,
                 std::shared_ptr<void> keep_alive);
  PluginInstance(PluginInstance&& o) noexcept;
  PluginInstance& operator=(PluginInstance&& o) noexcept;
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;
  ~PluginInstance();

  strata_plugin_kind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  const void* vtable() const { return vtable_; }
  void* handle() const { return handle_; }
  template <class V>
  const V* vtable_as() const { return static_cast<const V*>(vtable_); }
  explicit operator bool() const { return handle_ != nullptr; }
  /// Give up ownership (the caller now destroys the handle through the
  /// vtable's destroy) and return it. The library stays loaded until the
  /// PluginHost is destroyed, not longer: keep the host alive meanwhile.
  void* release();

 private:
  void reset();
  strata_plugin_kind kind_{};
  const void* vtable_ = nullptr;
  void* handle_ = nullptr;
  std::string name_;
  std::shared_ptr<void> keep_alive_;  // the library record
};

/// Which cluster resolver a process uses, and why (issue 5's detection order).
struct ResolverChoice {
  std::string name;    ///< resolver to create; "" = a single process (no resolver)
  std::string reason;  ///< one sentence for logs and `strata-info cluster`
  /// Each detection step in order: {resolver, what it found}; empty when a
  /// resolver was configured explicitly.
  std::vector<std::pair<std::string, std::string>> probes;
};

class STRATA_API PluginHost {
 public:
  /// The process-wide host (created on first use, destroyed at exit).
  static PluginHost& global();

  PluginHost();
  ~PluginHost();
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  /// Set the job configuration (JSON text) that host services expose through
  /// get_config and that may name explicit plugin paths:
  /// {"strategy": {"name": "x", "path": "/p/libstrata-strategy-x.so"}, ...}.
  /// Throws InvalidArgumentError on malformed JSON or an invalid config (see
  /// strata::Config). Every "path" named is loaded at once, as by
  /// load_explicit, and its failure is thrown (the config stays set). An
  /// explicitly loaded component takes precedence over an auto-discovered
  /// one of the same kind and name. /plugins/search_path directories are
  /// searched after STRATA_PLUGIN_PATH.
  void set_config(const std::string& config_json);

  /// Scan every search directory, load and validate each candidate not yet
  /// loaded, and return one PluginInfo per component (ok) or per rejected
  /// file. Never throws for a bad plugin file.
  std::vector<PluginInfo> discover();

  /// Load one library explicitly (as if named in the config); throws an
  /// Error naming the path and the cause when it cannot be used.
  void load_explicit(const std::string& path);

  /// Create an instance of component `name` of `kind` with `options_json`
  /// ("" = {}). Discovers on first use. Throws NotFoundError listing the
  /// names available and the directories searched; throws the rejection
  /// reason when the named component's library was rejected; throws the
  /// component's own create error otherwise.
  PluginInstance create(strata_plugin_kind kind, const std::string& name,
                        const std::string& options_json);

  /// Auto-detection: call the optional detect() of cluster resolver `name`
  /// (the only kind with one today). Returns true when the resolver says the
  /// current environment is its own; false when it says no, has no detect(),
  /// or is not installed (auto-detection skips what it cannot ask). Discovers
  /// on first use. Throws InvalidArgumentError for a kind without detect().
  /// Never blocks beyond the plugin's detect(), which must not block.
  bool detect(strata_plugin_kind kind, const std::string& name);

  /// True when a usable component `name` of `kind` is known (rescans once
  /// on a miss, as create() does).
  bool has_component(strata_plugin_kind kind, const std::string& name);

  /// Register a component compiled into the host (e.g. the Default
  /// strategy). Shows in discover() with path "<builtin>".
  void register_builtin(strata_plugin_kind kind, const std::string& name,
                        const std::string& version, const void* vtable);

  /// The host services table handed to plugins.
  const strata_host_api* host_api();

  /// Directories searched, in order (for messages and strata-info).
  std::vector<std::string> search_dirs() const;

  // ---- additions beyond the first draft of this header ----

  /// create() for an input pipeline with its tf.distribute InputContext
  /// (create() of STRATA_KIND_INPUT_PIPELINE uses 1 pipeline, id 0, 1 replica).
  PluginInstance create_input_pipeline(const std::string& name, const std::string& options_json,
                                       const strata_input_context& ctx);

  /// The last collective fingerprint recorded through the host table per
  /// communicator, as a JSON object {communicator: {"op", "reduce_op",
  /// "sequence", "dtype", "count", "rank", "peer"}} (for hang reports).
  std::string last_collectives_json() const;

  /// True once request_abort was called through the host table.
  bool abort_requested() const;

  /// Switch this host's store_* services from the in-process store to the
  /// TCP rendezvous store at cfg.address; with cfg.serve, first start the
  /// server in this process (one Boost.Asio thread, stopped with the host).
  /// An empty cfg.auth_token falls back to env STRATA_AUTH_TOKEN, then to
  /// config /rendezvous/auth_token. Connecting retries until cfg.timeout_s.
  /// Records the address at config /rendezvous/address (so transports can
  /// pick the interface that reaches the store). Call once, before any
  /// plugin uses the store; blocks while connecting. Throws
  /// FailedPreconditionError when already connected, AlreadyExistsError when
  /// the port to serve is taken, DeadlineExceededError naming the address
  /// when the server never answered, PermissionDeniedError on a token
  /// mismatch, InvalidArgumentError for a malformed address.
  void connect_store(const StoreConfig& cfg);

  /// "host:port" of the connected TCP store (with the real port when served
  /// on port 0), or "" while the in-process store is in use.
  std::string store_address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Resolvers tried by auto-detection, in order: "slurm" (its detect():
/// SLURM_PROCID and SLURM_STEP_NODELIST set, i.e. a task of a job step),
/// "tf_config" (TF_CONFIG set and non-empty), "tpu" (its detect():
/// KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_NAME or TPU_CONFIG set).
STRATA_API const std::vector<std::string>& cluster_resolver_detect_order();

/// The resolver to use: `configured` (the job config's /cluster_resolver/name,
/// which STRATA_CLUSTER_RESOLVER overrides) when non-empty, else the first of
/// cluster_resolver_detect_order() that detects its environment, else none
/// (a single process). A resolver whose plugin is not installed is skipped
/// and its probe says so. Reads the environment; never blocks beyond the
/// plugins' detect().
STRATA_API ResolverChoice choose_cluster_resolver(PluginHost& host, const std::string& configured);

}  // namespace strata
