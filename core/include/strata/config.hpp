// SPDX-License-Identifier: Apache-2.0
// strata::Config: the job description (one JSON document), e.g.
//
//   {"strategy":         {"name": "mirrored", "options": {"devices": ["cpu:0", "cpu:1"]}},
//    "cross_device_ops": {"name": "hierarchical_copy"},
//    "transport":        {"name": "tcp", "path": "/opt/x/libstrata-transport-tcp.so"},
//    "cluster_resolver": {"name": "tf_config"},
//    "input_pipeline":   {"name": "arrays"},
//    "timeouts":         {"collective_s": 300, "rendezvous_s": 120},
//    "plugins":          {"search_path": ["/opt/strata/plugins"]}}
//
// Only those top-level keys are accepted. A component part is an object with
// "name" (string), optional "options" (object) and optional "path" (string,
// an explicit plugin library). Every part may be overridden from the
// environment with apply_env() (STRATA_STRATEGY, ...).
//
// A Config is a value type (copyable); it is not synchronised: do not mutate
// one from two threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/error.hpp"
#include "strata/export.hpp"

namespace strata {

class STRATA_API Config {
 public:
  /// The empty document {}.
  Config();
  Config(const Config& other);
  Config& operator=(const Config& other);
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;
  ~Config();

  /// Parse and validate `text`. Throws InvalidArgumentError naming `origin`,
  /// the position and what to fix on malformed JSON, an unknown top-level
  /// key, or a wrongly typed field.
  static Config from_json(const std::string& text, const std::string& origin = "<string>");
  /// Read and parse a file. Throws NotFoundError naming the path when it
  /// cannot be read, InvalidArgumentError (as from_json) when it is invalid.
  static Config from_file(const std::string& path);

  /// Apply environment overrides: STRATA_STRATEGY -> /strategy/name,
  /// STRATA_CROSS_DEVICE_OPS -> /cross_device_ops/name, STRATA_TRANSPORT ->
  /// /transport/name, STRATA_CLUSTER_RESOLVER -> /cluster_resolver/name,
  /// STRATA_COLLECTIVE_TIMEOUT_S -> /timeouts/collective_s,
  /// STRATA_RENDEZVOUS_TIMEOUT_S -> /timeouts/rendezvous_s,
  /// STRATA_PS_GRACE_S -> /timeouts/ps_grace_s (how long a parameter-server
  /// task may be unreachable before it counts as failed, default 5),
  /// STRATA_PS_OP_TIMEOUT_S -> /timeouts/ps_op_s (one ps operation's
  /// deadline on workers, default 60). Unset or empty
  /// variables change nothing. Throws InvalidArgumentError naming the
  /// variable when a timeout is not a positive number.
  void apply_env();

  /// The whole document as compact JSON text.
  std::string json() const;
  /// True when the top-level key `part` exists (e.g. has("strategy")).
  bool has(const std::string& part) const;
  /// /<part>/name, or `dflt` when absent.
  std::string name(const std::string& part, const std::string& dflt = "") const;
  /// /<part>/options as JSON text; "{}" when absent.
  std::string options_json(const std::string& part) const;
  /// /<part>/path, or "" when absent.
  std::string path(const std::string& part) const;
  /// /timeouts/<which> in seconds, or `dflt` when absent.
  double timeout_s(const std::string& which, double dflt) const;
  /// /plugins/search_path (empty when absent).
  std::vector<std::string> search_path() const;
  /// Set the value at RFC 6901 `json_pointer` (intermediate objects are
  /// created) to the JSON text `value_json`, then re-validate. Throws
  /// InvalidArgumentError on a bad pointer, bad JSON or an invalid result
  /// (the document is then unchanged).
  void set(const std::string& json_pointer, const std::string& value_json);

  /// The top-level keys a config may contain, in documentation order.
  static const std::vector<std::string>& known_parts();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
