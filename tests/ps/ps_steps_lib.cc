// SPDX-License-Identifier: Apache-2.0
// A user's step library for `strata-server --load` (ps_test's
// StrataServerLoadsAStepLibrary): the function is registered only here, so
// a worker knows it only when it loaded this library.
#include <cstdint>

#include "strata/coordinator.hpp"

STRATA_REGISTER_FUNCTION("lib_cube", [](const strata::Args& a) -> strata::Value {
  const std::int64_t x = strata::get_arg<std::int64_t>(a, 0);
  return strata::Value(x * x * x);
});
