// SPDX-License-Identifier: Apache-2.0
// Parsing and validating a component's options_json with nlohmann-json.
// Header-only; a plugin using it links nlohmann_json::nlohmann_json.
// Every failure is INVALID_ARGUMENT naming the component and the option.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "strata/error.hpp"
#include "strata/sdk/host.hpp"

namespace strata::sdk {

/// Parse `options_json` (NULL or "" = {}); it must be a JSON object.
inline nlohmann::json parse_options(const char* options_json, const std::string& component) {
  if (options_json == nullptr || options_json[0] == '\0') return nlohmann::json::object();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(options_json);
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, component, " options are not valid JSON (", e.what(),
                 "); pass a JSON object such as {}");
  }
  if (j.is_null()) return nlohmann::json::object();
  if (!j.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, component, " options must be a JSON object, got ",
                 j.type_name(), "; pass e.g. {}");
  return j;
}

/// Reject keys not in `allowed`: "unknown option 'x' for <component>; allowed: a, b".
inline void check_known_keys(const nlohmann::json& options, std::initializer_list<const char*> allowed,
                             const std::string& component) {
  for (auto it = options.begin(); it != options.end(); ++it) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown option '", it.key(), "' for ", component,
                   "; allowed options: ", list.empty() ? std::string("(none)") : list);
    }
  }
}

/// options[key] converted to T, or `fallback` when absent. A value of the
/// wrong JSON type is INVALID_ARGUMENT naming the key and the expected type.
template <class T>
T get_option(const nlohmann::json& options, const char* key, T fallback, const std::string& component) {
  auto it = options.find(key);
  if (it == options.end() || it->is_null()) return fallback;
  bool ok;
  const char* expected;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
    expected = "a boolean";
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer() && (std::is_signed_v<T> || it->get<int64_t>() >= 0);
    expected = std::is_signed_v<T> ? "an integer" : "a non-negative integer";
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = it->is_number();
    expected = "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
    expected = "a string";
  } else {
    ok = true;
    expected = "a valid value";
  }
  if (!ok)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", key, "' of ", component, " must be ", expected,
                 ", got ", it->dump());
  return it->get<T>();
}

/// The "timeout_s" option of a component that waits on collectives
/// (transports, cross-device ops): the option when given, else the job
/// config's /timeouts/collective_s when it is a positive number, else 300.
/// A value that is not > 0 is INVALID_ARGUMENT naming the component.
inline double collective_timeout_s(const Host& host, const nlohmann::json& options, const std::string& component) {
  double fallback = 300;
  if (host && host.api()->get_config != nullptr) {
    if (auto t = host.get_config("/timeouts/collective_s")) {
      const nlohmann::json j = nlohmann::json::parse(*t, nullptr, false);
      if (j.is_number() && j.get<double>() > 0) fallback = j.get<double>();
    }
  }
  const double v = get_option<double>(options, "timeout_s", fallback, component);
  if (!(v > 0)) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'timeout_s' of ", component, " must be > 0, got ", v);
  return v;
}

/// Option "transport" of a component that composes a transport: a name
/// ("tcp") or {"name": ..., "options": {...}}. Returns {name, options JSON};
/// absent or null gives {default_name, "{}"}.
inline std::pair<std::string, std::string> transport_option(const nlohmann::json& options,
                                                            const std::string& default_name,
                                                            const std::string& component) {
  std::pair<std::string, std::string> out{default_name, "{}"};
  const auto it = options.find("transport");
  if (it == options.end() || it->is_null()) return out;
  if (it->is_string()) {
    out.first = it->get<std::string>();
  } else if (it->is_object()) {
    check_known_keys(*it, {"name", "options"}, "option 'transport' of " + component);
    out.first = get_option<std::string>(*it, "name", default_name, component);
    if (auto oo = it->find("options"); oo != it->end() && !oo->is_null()) {
      if (!oo->is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'transport.options' of ", component,
                     " must be a JSON object, got ", oo->dump());
      out.second = oo->dump();
    }
  } else {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'transport' of ", component,
                 " must be a name or {\"name\": ..., \"options\": {...}}, got ", it->dump());
  }
  return out;
}

}  // namespace strata::sdk
