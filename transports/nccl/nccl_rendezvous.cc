// SPDX-License-Identifier: Apache-2.0
#include "nccl_rendezvous.h"

#include <algorithm>
#include <chrono>

#include "strata/error.hpp"
#include "strata/sdk/rendezvous.hpp"

namespace strata::transport::nccl {

using ::strata::detail::str_cat;

std::string unique_id_key(const std::string& name) { return str_cat(name, "/nccl/unique_id"); }

std::string exchange_unique_id(const sdk::Host& host, const std::string& name, int rank, int world,
                               int64_t timeout_ms, const std::string& id, size_t id_bytes, const std::string& who) {
  if (rank == 0 && id.size() != id_bytes)
    STRATA_THROW(STRATA_ERR_INTERNAL, who, ": rank 0's unique id is ", id.size(), " bytes, expected ", id_bytes);
  if (world <= 1) return id;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
  auto left_ms = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  };
  // Published before the gate, so that once the gate opens the id is there.
  if (rank == 0) host.store_set(unique_id_key(name), id, left_ms());
  sdk::rendezvous_gate(host, name, rank, world, left_ms(), who);
  if (rank == 0) return id;
  std::string got;
  try {
    // Rank 0 set the key before it checked in, so this does not wait in
    // practice; the floor covers a gate that opened at its deadline.
    got = host.store_get(unique_id_key(name), std::max<int64_t>(left_ms(), 1000));
  } catch (const Error& e) {
    if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who,
                 ": rank 0 passed the rendezvous but its NCCL unique id (store key '",
                 unique_id_key(name), "') never appeared within ", timeout_ms,
                 " ms; is another job using the communicator name '", name, "' with this store?");
  }
  if (got.size() != id_bytes)
    STRATA_THROW(STRATA_ERR_DATA_LOSS, who, ": the NCCL unique id under store key '", unique_id_key(name), "' is ",
                 got.size(), " bytes, expected ", id_bytes,
                 "; another program wrote that key (use a communicator name of your own)");
  return got;
}

}  // namespace strata::transport::nccl
