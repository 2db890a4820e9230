// SPDX-License-Identifier: Apache-2.0
// The "auto" transport: one communicator whose peers are reached over
// different transports, chosen per peer pair as Open MPI's and NCCL's
// transport selection does: peers on this host over a same-host transport,
// peers on other hosts over the best network transport present. It moves no
// bytes itself; it composes other transport plugins obtained through the host
// services (create_plugin), never by linking them.
//
// Options (JSON object; unknown keys are rejected):
//   "local"      same-host transport: "name" or {"name": ..., "options": {...}}.
//                Default: "shmem" (Strata's own shared memory) when that
//                plugin loads and /dev/shm is usable, else "libfabric" with
//                {"provider": "shm"} when that plugin accepts the shm
//                provider, else "tcp".
//   "remote"     cross-host transport, same forms. Default: "libfabric" on the
//                first NIC provider it accepts of verbs, efa, psm3, psm2, opx,
//                cxi, else "tcp".
//   "host_id"    string that replaces the host identity (containers whose
//                heuristics fail; tests that emulate several hosts).
//   "timeout_s"  deadline for comm_create and wait given a negative timeout
//                (default /timeouts/collective_s, else 300).
// A transport named explicitly that cannot be created is a hard error naming
// it, the option and the cause. A default's fallback is logged at info with
// the reason; nothing falls back silently. "auto" cannot name itself.
//
// Why NIC detection creates the libfabric plugin instead of calling
// fi_getinfo here: the plugin that will carry the data is the authority on
// whether a provider works for it (its own endpoint and MR requirements), and
// this library then neither links nor dlopens libfabric (no second copy of its
// provider initialisation, nothing for sanitizers to attribute to "auto").
// Each try costs one create (the first one initialises libfabric, ~0.2 s).
//
// Host identity: hostname, /proc/sys/kernel/random/boot_id and the network
// namespace (readlink /proc/self/ns/net) joined, or "host_id". Namespaces
// count because CI emulates several hosts with them on one machine, and the
// same-host path must not be used across them.
//
// Model. comm_create(name, rank, world) publishes "<name>/auto/host/<rank>"
// (identity, display label, local and remote transport labels) in the host
// store and reads every rank's record. Ranks are grouped by identity; groups
// are numbered by their lowest rank. Then, in this order and within the one
// deadline:
//   - when this rank's group has more than one rank, a local sub-communicator
//     "<name>/auto/local/<group>" among the group's ranks (sub-rank = index
//     in the group, in global rank order) over the local transport;
//   - when there is more than one group, a remote sub-communicator
//     "<name>/auto/remote" over the remote transport spanning ALL ranks
//     (sub-rank = global rank) so that any pair of hosts can talk; only
//     off-host peers use it (same-host pairs hold idle connections in it).
// Every rank of a group must agree on the local transport and every rank on
// the remote one (a mismatch fails comm_create with FAILED_PRECONDITION
// naming the ranks). Each peer maps to (sub-communicator, sub-rank); isend,
// irecv and their requests go to that sub-communicator, so the matching and
// ordering contract of transport.h holds per peer unchanged.
//
// Observability. Each rank publishes its routes as JSON at
// "<name>/auto/route/<rank>": {"rank", "host", "routes": [{"peer", "scope"
// ("local"|"remote"), "transport", "sub_rank"}]}. Rank 0 logs the plan once
// per communicator at info, e.g. "auto 'job': ranks {0,1} on host a via
// shmem; ranks {2,3} on host b via shmem; across hosts via
// tcp (no RDMA provider: ...)".
//
// Errors. A sub-communicator knows only sub-ranks, so every error it reports
// is prefixed with the global rank and the route, e.g. "rank 3 (host b, via
// libfabric/shm as its local rank 1): <the sub-transport's message>".
//
// Caps (computed from both sub-transports, whichever a communicator uses):
// P2P | MEM_HOST; THREAD_SAFE when both are; REQUIRES_MR when either is;
// preferred_chunk_bytes and max_message_bytes the smaller non-zero;
// max_inflight the smaller non-zero. mem_register registers with every
// sub-communicator that exists and returns a region holding each sub-region;
// pass it as usual and each sub-communicator gets its own. abort aborts every
// sub-communicator (thread-safe, never blocks). Destroy every communicator
// before the transport.
#pragma once

#include <memory>
#include <string>

#include "strata/sdk/plugin.hpp"

namespace strata::transport::auto_select {

/// One sub-transport instance and how it was chosen.
struct SubTransport {
  std::string name;     // plugin name ("tcp", "libfabric")
  std::string options;  // JSON text passed to its create
  std::string label;    // "tcp", "libfabric/shm": in logs, errors and routes
  std::string why;      // why it was chosen, for the plan log ("" = named explicitly)
  sdk::PluginRef<strata_transport_vtable> ref;
  strata_transport_caps caps{};
};

class AutoComm;

class AutoTransport : public sdk::TransportBase {
 public:
  using Comm = AutoComm;
  static constexpr const char* kSubsystem = "transport.auto";
  AutoTransport(sdk::Host host, const char* options_json);
  strata_transport_caps caps() override;
  std::unique_ptr<sdk::CommBase> comm_create(const char* name, int32_t rank, int32_t world_size,
                                             int64_t timeout_ms) override;

 private:
  sdk::Host host_;
  SubTransport local_, remote_;
  std::string identity_;    // what decides "same host"
  std::string host_label_;  // how this host is named in logs
  double timeout_s_ = 300;
};

}  // namespace strata::transport::auto_select
