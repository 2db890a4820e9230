// SPDX-License-Identifier: Apache-2.0
// Whether this machine has an RDMA device, for the choices that would
// otherwise ask libfabric (the "auto" transport's network path, and
// strata-info's account of it). Header-only.
//
// Every NIC provider auto tries (verbs, efa, psm3, psm2, opx, cxi) drives a
// device listed in /sys/class/infiniband (verbs, EFA, Omni-Path, RDMA NICs
// under PSM3) or /sys/class/cxi (Slingshot). Without one, asking libfabric
// only loads it and the provider libraries it links: about 0.2 s per process
// on the 2-core CI machine.
#pragma once

#include <filesystem>
#include <system_error>

namespace strata::transport {

/// Why the network path skips libfabric when has_rdma_device() is false.
inline constexpr const char* kNoRdmaDeviceReason =
    "this machine has no RDMA device (/sys/class/infiniband and /sys/class/cxi list none)";

/// True when /sys/class/infiniband or /sys/class/cxi has an entry.
inline bool has_rdma_device() {
  for (const char* dir : {"/sys/class/infiniband", "/sys/class/cxi"}) {
    std::error_code ec;
    if (std::filesystem::directory_iterator(dir, ec) != std::filesystem::directory_iterator()) return true;
  }
  return false;
}

}  // namespace strata::transport
