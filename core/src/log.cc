// SPDX-License-Identifier: Apache-2.0
#include "log.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "strata/c/common.h"
#include "strata/error.hpp"
#include "strata/log.hpp"

namespace strata::detail {
namespace {

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : dflt;
}

// The rank shown in every line: STRATA_RANK, else TF_CONFIG's task index.
std::string rank_tag() {
  if (const char* r = std::getenv("STRATA_RANK"); r && *r) return std::string("[rank ") + r + "] ";
  if (const char* tf = std::getenv("TF_CONFIG"); tf && *tf) {
    auto doc = nlohmann::json::parse(tf, nullptr, /*allow_exceptions=*/false);
    if (doc.is_object() && doc.contains("task") && doc["task"].is_object()) {
      const auto& task = doc["task"];
      // Never throw here (this runs for every logger): a numeric type names
      // a numeric job, as TensorFlow's str() reads it; any other is shown as "task".
      std::string type = "task";
      if (const auto t = task.find("type"); t != task.end() && t->is_string()) type = t->get<std::string>();
      else if (t != task.end() && t->is_number_integer()) type = t->dump();
      if (task.contains("index") && task["index"].is_number_integer())
        return "[" + type + " " + std::to_string(task["index"].get<int64_t>()) + "] ";
    }
  }
  return "";
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Leaked on purpose: loggers must outlive every static destructor that
// might log (plugin shutdown hooks run at exit). Reachable from a static,
// so LeakSanitizer does not report it.
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  std::shared_ptr<spdlog::sinks::sink> sink;
  spdlog::level::level_enum level = spdlog::level::warn;
  std::vector<std::string> subsystems;  // empty = all
  std::string pattern;

  Registry() {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    const std::string lvl = env_or("STRATA_LOG_LEVEL", "warn");
    try {
      level = parse_log_level(lvl);
    } catch (const Error&) {
      level = spdlog::level::warn;  // a typo in the env must not stop the job; say so below
    }
    subsystems = split_commas(env_or("STRATA_LOG_SUBSYS", ""));
    pattern = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] " + rank_tag() + "[%n] %v";
    sink->set_pattern(pattern);
    if (level == spdlog::level::warn && lvl != "warn" && lvl != "warning") {
      auto l = make("core");
      l->warn("STRATA_LOG_LEVEL='{}' is not a level; using warn (valid: trace, debug, info, warn, error, critical, off)", lvl);
    }
  }

  bool selected(const std::string& subsystem) const {
    if (subsystems.empty()) return true;
    return std::any_of(subsystems.begin(), subsystems.end(), [&](const std::string& p) {
      return subsystem.compare(0, p.size(), p) == 0;
    });
  }

  // Caller holds mu (or is the constructor).
  std::shared_ptr<spdlog::logger> make(const std::string& subsystem) {
    auto l = std::make_shared<spdlog::logger>(subsystem, sink);
    l->set_level(selected(subsystem) ? level : spdlog::level::off);
    l->flush_on(spdlog::level::warn);
    loggers.emplace(subsystem, l);
    return l;
  }
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

spdlog::level::level_enum from_strata_level(int level) {
  switch (level) {
    case STRATA_LOG_TRACE: return spdlog::level::trace;
    case STRATA_LOG_DEBUG: return spdlog::level::debug;
    case STRATA_LOG_INFO: return spdlog::level::info;
    case STRATA_LOG_WARN: return spdlog::level::warn;
    case STRATA_LOG_ERROR: return spdlog::level::err;
    default: return spdlog::level::critical;
  }
}

}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.loggers.find(subsystem);
  if (it != r.loggers.end()) return it->second;
  return r.make(subsystem);
}

spdlog::level::level_enum parse_log_level(const std::string& name) {
  if (name == "trace") return spdlog::level::trace;
  if (name == "debug") return spdlog::level::debug;
  if (name == "info") return spdlog::level::info;
  if (name == "warn" || name == "warning") return spdlog::level::warn;
  if (name == "error" || name == "err") return spdlog::level::err;
  if (name == "critical") return spdlog::level::critical;
  if (name == "off") return spdlog::level::off;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown log level '", name,
               "': use one of trace, debug, info, warn, error, critical, off");
}

void set_global_log_level(spdlog::level::level_enum level) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.level = level;
  for (auto& [name, l] : r.loggers) l->set_level(r.selected(name) ? level : spdlog::level::off);
}

void log_rate_limited(int level, const std::string& subsystem, const std::string& message) {
  auto l = logger(subsystem);
  const auto lvl = from_strata_level(level);
  if (!l->should_log(lvl)) return;
  static std::mutex mu;
  static auto* last_seen =
      new std::unordered_map<std::string, std::chrono::steady_clock::time_point>();
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu);
    std::string key = subsystem;
    key += '\0';
    key += message;
    auto it = last_seen->find(key);
    if (it != last_seen->end() && now - it->second < std::chrono::seconds(1)) return;
    // Bounded memory: distinct messages are usually few; forget all when not.
    if (last_seen->size() > 4096) last_seen->clear();
    (*last_seen)[key] = now;
  }
  l->log(lvl, "{}", message);
}

}  // namespace strata::detail

namespace strata {

void set_log_level(const std::string& level) {
  detail::set_global_log_level(detail::parse_log_level(level));
}

std::string log_level() {
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mu);
  switch (r.level) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warn";
    case spdlog::level::err: return "error";
    case spdlog::level::critical: return "critical";
    default: return "off";
  }
}

}  // namespace strata
