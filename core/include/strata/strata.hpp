// SPDX-License-Identifier: Apache-2.0
// The umbrella header of the Strata C++ API: include this one.
#pragma once

#include "strata/callbacks.hpp"
#include "strata/checkpoint.hpp"
#include "strata/config.hpp"
#include "strata/data.hpp"
#include "strata/distribute.hpp"
#include "strata/distributed_data.hpp"
#include "strata/records.hpp"
#include "strata/error.hpp"
#include "strata/metrics.hpp"
#include "strata/optimizers.hpp"
#include "strata/partitioners.hpp"
#include "strata/strategy.hpp"
#include "strata/tensor.hpp"
#include "strata/trainer.hpp"
#include "strata/values.hpp"
#include "strata/variable.hpp"
