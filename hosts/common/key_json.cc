// SPDX-License-Identifier: Apache-2.0
#include "key_json.h"

#include "strata/error.hpp"

namespace strata::cli {

nlohmann::json apply_key_json(const std::vector<std::string>& options, nlohmann::json base, const std::string& flag,
                              const std::string& example) {
  if (!base.is_object()) base = nlohmann::json::object();
  for (const std::string& opt : options) {
    const auto eq = opt.find('=');
    if (eq == std::string::npos || eq == 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, flag, " '", opt, "' is not KEY=JSON; write e.g. ", flag, " ", example,
                   " (strings quoted as JSON: ", flag, " 'KEY=\"text\"')");
    const std::string key = opt.substr(0, eq);
    try {
      base[key] = nlohmann::json::parse(opt.substr(eq + 1));
    } catch (const nlohmann::json::exception& e) {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, flag, " '", opt, "': the value of '", key, "' is not valid JSON (",
                   e.what(), "); quote strings as JSON, e.g. ", flag, " '", key, "=\"text\"'");
    }
  }
  return base;
}

}  // namespace strata::cli
