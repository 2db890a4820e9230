// SPDX-License-Identifier: Apache-2.0
// The Default strategy (tf.distribute's default strategy): built into core,
// one replica on the caller's thread, one copy per variable. It implements
// strata_strategy_vtable directly, so the C++ API drives it exactly like a
// plugin, and it is what get_strategy() returns outside any scope.
#pragma once

#include "strata/c/strategy.h"

namespace strata::detail {

inline constexpr const char* kDefaultStrategyName = "default";

/// The vtable (static storage).
const strata_strategy_vtable* default_strategy_vtable();
/// The replica handle the Default strategy passes to its only replica; also
/// used for the default replica context outside any run().
strata_replica_t default_replica_handle();
/// Register "default" with PluginHost::global() (once; thread-safe).
void ensure_default_registered();

}  // namespace strata::detail
