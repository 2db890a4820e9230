// SPDX-License-Identifier: Apache-2.0
// Internal logging: one spdlog logger per subsystem ("core", "host",
// "strategy.mirrored", ...), all writing to one stderr sink.
//
// Level: STRATA_LOG_LEVEL (trace|debug|info|warn|error|critical|off, default
// warn). Subsystem filter: STRATA_LOG_SUBSYS, a comma list of prefixes
// ("host,transport" keeps "host" and "transport.tcp"); loggers outside it are
// off. The pattern carries the rank when STRATA_RANK or TF_CONFIG's task
// index is set. Loggers live until process exit (intentionally never
// destroyed, so that code running in static destructors can still log).
//
// Thread-safety: every function is thread-safe. Never include this from a
// public header (spdlog is a private dependency of core).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace strata::detail {

/// The logger of `subsystem`, created on first use. Never returns null.
std::shared_ptr<spdlog::logger> logger(const std::string& subsystem);

/// Parse a level name (trace, debug, info, warn/warning, error, critical,
/// off). Throws InvalidArgumentError listing the valid names otherwise.
spdlog::level::level_enum parse_log_level(const std::string& name);

/// Set the level of every logger, present and future (subsystems excluded
/// by STRATA_LOG_SUBSYS stay off).
void set_global_log_level(spdlog::level::level_enum level);

/// Log `message` for a plugin at strata_log_level `level`, dropping a repeat
/// of the same (subsystem, text) seen less than a second ago so that a
/// plugin stuck in a loop cannot flood stderr.
void log_rate_limited(int level, const std::string& subsystem, const std::string& message);

}  // namespace strata::detail
