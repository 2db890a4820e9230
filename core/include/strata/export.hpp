// SPDX-License-Identifier: Apache-2.0
// STRATA_API marks what libstrata_core exports; everything else is hidden.
#pragma once
#if defined(_WIN32)
#define STRATA_API __declspec(dllexport)
#else
#define STRATA_API __attribute__((visibility("default")))
#endif
