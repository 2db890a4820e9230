// SPDX-License-Identifier: Apache-2.0
#include "strata/config.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace strata {

using Json = nlohmann::json;

struct Config::Impl {
  Json doc = Json::object();
};

namespace {

const char* const kComponentParts[] = {"strategy", "cross_device_ops", "transport",
                                       "cluster_resolver", "input_pipeline"};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool is_component_part(const std::string& key) {
  for (const char* p : kComponentParts)
    if (key == p) return true;
  return false;
}

// Every check names where the config came from and the JSON pointer at fault.
void validate(const Json& doc, const std::string& origin) {
  if (!doc.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": a Strata config must be a JSON object, got ",
                 doc.type_name(), "; e.g. {\"strategy\": {\"name\": \"mirrored\"}}");
  for (const auto& [key, value] : doc.items()) {
    if (is_component_part(key)) {
      if (!value.is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /", key, " must be an object like {\"name\": \"...\"}, got ",
                     value.type_name());
      for (const auto& [field, v] : value.items()) {
        if (field == "name" || field == "path") {
          if (!v.is_string())
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /", key, "/", field, " must be a string, got ",
                         v.type_name());
        } else if (field == "options") {
          if (!v.is_object())
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /", key,
                         "/options must be an object, got ", v.type_name());
        } else {
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": unknown key /", key, "/", field,
                       "; a component part may contain only \"name\", \"options\" and \"path\"");
        }
      }
    } else if (key == "timeouts") {
      if (!value.is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /timeouts must be an object like {\"collective_s\": 300}, got ",
                     value.type_name());
      for (const auto& [field, v] : value.items())
        if (!v.is_number() || v.get<double>() <= 0)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /timeouts/", field,
                       " must be a positive number of seconds, got ", v.dump());
    } else if (key == "plugins") {
      if (!value.is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /plugins must be an object like {\"search_path\": [\"/dir\"]}, got ",
                     value.type_name());
      for (const auto& [field, v] : value.items()) {
        if (field != "search_path")
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": unknown key /plugins/", field,
                       "; /plugins may contain only \"search_path\"");
        if (!v.is_array())
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /plugins/search_path must be an array of directory strings");
        for (const auto& d : v)
          if (!d.is_string())
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /plugins/search_path must contain only strings, got ",
                         d.dump());
      }
    } else if (key == "rendezvous") {
      // The multi-process key-value store: {"address": "host:port", "auth_token": "...",
      // "tls": {"cert": "server.pem", "key": "server.key", "ca": "ca.pem"}}.
      if (!value.is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin,
                     ": /rendezvous must be an object like {\"auth_token\": \"secret\"}, got ", value.type_name());
      for (const auto& [field, v] : value.items()) {
        if (field != "address" && field != "auth_token" && field != "tls")
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": unknown key /rendezvous/", field,
                       "; /rendezvous may contain only \"address\", \"auth_token\" and \"tls\"");
        if (field == "tls") {
          if (!v.is_object())
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin,
                         ": /rendezvous/tls must be an object like {\"cert\": \"server.pem\", \"key\": "
                         "\"server.key\", \"ca\": \"ca.pem\"}, got ",
                         v.type_name());
          for (const auto& [tf, tv] : v.items()) {
            if (tf != "cert" && tf != "key" && tf != "ca")
              STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": unknown key /rendezvous/tls/", tf,
                           "; /rendezvous/tls may contain only \"cert\", \"key\" and \"ca\" (PEM file paths)");
            if (!tv.is_string() || tv.get<std::string>().empty())
              STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /rendezvous/tls/", tf,
                           " must be a non-empty file path string, got ", tv.dump());
          }
          continue;
        }
        if (!v.is_string())
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": /rendezvous/", field, " must be a string, got ",
                       v.type_name());
      }
    } else {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": unknown top-level key \"", key,
                   "\"; valid keys are ", join(Config::known_parts()));
    }
  }
}

const Json* part_field(const Json& doc, const std::string& part, const char* field) {
  auto it = doc.find(part);
  if (it == doc.end() || !it->is_object()) return nullptr;
  auto f = it->find(field);
  return f == it->end() ? nullptr : &*f;
}

}  // namespace

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::Config(const Config& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Config& Config::operator=(const Config& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;
Config::~Config() = default;

const std::vector<std::string>& Config::known_parts() {
  static const std::vector<std::string> parts = {"strategy",       "cross_device_ops", "transport",
                                                 "cluster_resolver", "input_pipeline", "timeouts",
                                                 "plugins",        "rendezvous"};
  return parts;
}

Config Config::from_json(const std::string& text, const std::string& origin) {
  Config c;
  try {
    c.impl_->doc = Json::parse(text);
  } catch (const Json::parse_error& e) {
    // Turn the byte offset into line:column, which is what editors show.
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < e.byte - (e.byte > 0 ? 1 : 0) && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ":", line, ":", col,
                 ": malformed JSON (", e.what(), "); fix the syntax there (quotes around keys, no trailing commas)");
  } catch (const Json::exception& e) {  // e.g. a number too large for a double
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": invalid JSON (", e.what(), "); fix the value it names");
  }
  validate(c.impl_->doc, origin);
  return c;
}

Config Config::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "cannot read config file '", path,
                 "': check that it exists and is readable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

void Config::apply_env() {
  struct NameOverride {
    const char* var;
    const char* part;
  };
  static const NameOverride names[] = {{"STRATA_STRATEGY", "strategy"},
                                       {"STRATA_CROSS_DEVICE_OPS", "cross_device_ops"},
                                       {"STRATA_TRANSPORT", "transport"},
                                       {"STRATA_CLUSTER_RESOLVER", "cluster_resolver"}};
  Json next = impl_->doc;
  for (const auto& o : names) {
    const char* v = std::getenv(o.var);
    if (!v || !*v) continue;
    Json& part = next[o.part];
    // Another component's options do not carry over to a different name.
    if (part.is_object() && part.value("name", std::string()) != v) {
      part.erase("options");
      part.erase("path");
    }
    part["name"] = v;
  }
  static const NameOverride timeouts[] = {{"STRATA_COLLECTIVE_TIMEOUT_S", "collective_s"},
                                          {"STRATA_RENDEZVOUS_TIMEOUT_S", "rendezvous_s"},
                                          {"STRATA_HEARTBEAT_TIMEOUT_S", "heartbeat_s"},
                                          {"STRATA_PS_GRACE_S", "ps_grace_s"},
                                          {"STRATA_PS_OP_TIMEOUT_S", "ps_op_s"}};
  for (const auto& o : timeouts) {
    const char* v = std::getenv(o.var);
    if (!v || !*v) continue;
    char* end = nullptr;
    double d = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(d > 0))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, o.var, "='", v,
                   "' is not a positive number of seconds; set e.g. ", o.var, "=300");
    next["timeouts"][o.part] = d;
  }
  validate(next, "environment");
  impl_->doc = std::move(next);
}

std::string Config::json() const { return impl_->doc.dump(); }

bool Config::has(const std::string& part) const { return impl_->doc.contains(part); }

std::string Config::name(const std::string& part, const std::string& dflt) const {
  const auto* f = part_field(impl_->doc, part, "name");
  return f && f->is_string() ? f->get<std::string>() : dflt;
}

std::string Config::options_json(const std::string& part) const {
  const auto* f = part_field(impl_->doc, part, "options");
  return f ? f->dump() : std::string("{}");
}

std::string Config::path(const std::string& part) const {
  const auto* f = part_field(impl_->doc, part, "path");
  return f && f->is_string() ? f->get<std::string>() : std::string();
}

double Config::timeout_s(const std::string& which, double dflt) const {
  const auto* f = part_field(impl_->doc, "timeouts", which.c_str());
  return f && f->is_number() ? f->get<double>() : dflt;
}

std::vector<std::string> Config::search_path() const {
  std::vector<std::string> out;
  if (const auto* f = part_field(impl_->doc, "plugins", "search_path"); f && f->is_array())
    for (const auto& d : *f) out.push_back(d.get<std::string>());
  return out;
}

void Config::set(const std::string& json_pointer, const std::string& value_json) {
  Json value;
  try {
    value = Json::parse(value_json);
  } catch (const Json::exception& e) {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "value for ", json_pointer, " is not valid JSON (", e.what(),
                 "); quote strings, e.g. '\"mirrored\"'");
  }
  Json next = impl_->doc;
  try {
    next[Json::json_pointer(json_pointer)] = std::move(value);
  } catch (const Json::exception& e) {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "cannot set '", json_pointer, "': ", e.what(),
                 "; use a JSON pointer such as /strategy/name");
  }
  validate(next, "override " + json_pointer);
  impl_->doc = std::move(next);
}

}  // namespace strata
