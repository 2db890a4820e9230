// SPDX-License-Identifier: Apache-2.0
// REQUIRE_GPUS(n) for GPU tests: skip (with the reason Strata itself gives,
// strata::gpu_unavailable_reason()) unless at least n CUDA devices are
// visible. Tests that use it carry the ctest label "gpu".
#pragma once

#include <gtest/gtest.h>

#include "strata/tensor.hpp"

#define REQUIRE_GPUS(n)                                                                          \
  do {                                                                                           \
    const int have_gpus_ = ::strata::num_gpus();                                                 \
    if (have_gpus_ == 0) GTEST_SKIP() << ::strata::gpu_unavailable_reason();                     \
    if (have_gpus_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << have_gpus_ << " visible"; \
  } while (0)
