// SPDX-License-Identifier: Apache-2.0
// `--option KEY=JSON` for the command-line programs: each value sets one key
// of a JSON options object (strata-info cluster's resolver options,
// strata-bench's transport options).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::cli {

/// Set base[KEY] = parse(JSON) for each "KEY=JSON" in `options`, in order
/// (a later one wins), and return base (an empty object when base is not an
/// object). Throws InvalidArgumentError naming `flag` and the offending text,
/// with `example` (e.g. "task_id=1") as the form to use.
nlohmann::json apply_key_json(const std::vector<std::string>& options, nlohmann::json base, const std::string& flag,
                              const std::string& example);

}  // namespace strata::cli
