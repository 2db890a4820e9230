// SPDX-License-Identifier: Apache-2.0
// How the ranks of an "nccl" communicator agree on its ncclUniqueId through
// the host's key-value store, apart from NCCL so that it is tested without a
// GPU (tests/nccl/nccl_test.cc compiles this file in).
//
// Rank 0 publishes the id under unique_id_key(name); then every rank passes
// the SDK's rendezvous gate (sdk/rendezvous.hpp), which names the ranks that
// never arrived when the deadline passes; then every other rank reads the
// id. So a missing rank is reported by name on every rank that waits, and a
// rank never starts NCCL's own (harder to diagnose) bootstrap before all
// ranks are known to be there.
#pragma once

#include <cstdint>
#include <string>

#include "strata/sdk/host.hpp"

namespace strata::transport::nccl {

/// The store key holding communicator `name`'s unique id.
std::string unique_id_key(const std::string& name);

/// Agree on communicator `name`'s id as `rank` of `world` within timeout_ms.
/// Rank 0 passes its id (`id`, id_bytes long) and gets it back; the other
/// ranks pass "" and get rank 0's. `who` prefixes error messages.
/// Throws DEADLINE_EXCEEDED naming the missing ranks (or rank 0, when its id
/// never appeared), DATA_LOSS when the stored id is not id_bytes long, and
/// the store's own errors. world == 1 uses no store. Blocks the caller.
std::string exchange_unique_id(const sdk::Host& host, const std::string& name, int rank, int world,
                               int64_t timeout_ms, const std::string& id, size_t id_bytes, const std::string& who);

}  // namespace strata::transport::nccl
