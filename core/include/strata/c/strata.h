/* SPDX-License-Identifier: Apache-2.0 */
/** @file strata.h @brief The whole Strata C ABI v1. */
#ifndef STRATA_C_STRATA_H_
#define STRATA_C_STRATA_H_
#include "strata/c/common.h"
#include "strata/c/host.h"
#include "strata/c/plugin.h"
#include "strata/c/strategy.h"
#include "strata/c/cross_device_ops.h"
#include "strata/c/transport.h"
#include "strata/c/resolver.h"
#include "strata/c/input.h"
#endif
