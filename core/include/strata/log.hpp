// SPDX-License-Identifier: Apache-2.0
// Public control of Strata's logging (which goes to stderr through spdlog
// inside libstrata_core; no spdlog type appears here).
//
// The initial level comes from STRATA_LOG_LEVEL (default "warn") and the
// subsystem filter from STRATA_LOG_SUBSYS. Thread-safe.
#pragma once

#include <string>

#include "strata/export.hpp"

namespace strata {

/// Set the level of every Strata logger: "trace", "debug", "info", "warn",
/// "error", "critical" or "off". Throws InvalidArgumentError otherwise.
STRATA_API void set_log_level(const std::string& level);

/// The current global level name (one of the names above).
STRATA_API std::string log_level();

}  // namespace strata
