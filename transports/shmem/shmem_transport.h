// SPDX-License-Identifier: Apache-2.0
// The "shmem" transport: point-to-point messages between the ranks of a
// communicator that all run on this host, through shared memory that Strata
// manages itself (no libfabric, no sockets, no kernel copy per message).
//
// Options (JSON object; unknown keys are rejected):
//   "ring_bytes"           bytes of each sender's ring in this rank's
//                          segment: a power of two, 64 KiB .. 64 MiB.
//                          Default: 1 MiB, halved (down to 64 KiB) until
//                          this rank's rings take at most 1 / (2 * world)
//                          of /dev/shm's free space (a container's 64 MiB
//                          /dev/shm then still fits 8 ranks), logged at info
//                          when smaller. Each rank's segment holds one ring
//                          per other rank, so a host with N ranks uses about
//                          N * (N - 1) * ring_bytes of /dev/shm. Ranks may
//                          differ: a sender uses the receiver's size.
//   "timeout_s"            deadline for comm_create and for wait given a
//                          negative timeout (default /timeouts/collective_s,
//                          else 300).
//   "max_unexpected_bytes" bound on bytes staged for messages that arrive
//                          before their receive is posted and must be moved
//                          out of the ring (default 1 GiB); past it the
//                          pair's requests fail with FAILED_PRECONDITION.
//
// Model. comm_create makes one segment per rank in /dev/shm (shm_open,
// mode 0600, a name with 64 random bits; its pages are reserved with
// posix_fallocate, so a full /dev/shm is an error at comm_create naming the
// sizes, never a SIGBUS later), publishes the segment's name and this
// process's identity (boot id, pid, start time) under
// "<name>/shmem/seg/<rank>" in the host store, reads every other rank's and
// maps their segments. When every rank has mapped every segment (a
// rendezvous gate), each rank unlinks its own name, so nothing stays in
// /dev/shm once the communicator is up, whatever happens to the processes
// later (names of processes killed inside comm_create are removed by the
// next comm_create on this host). Ranks on another host (a different boot
// id) fail comm_create with FAILED_PRECONDITION naming them.
//
// A segment holds a header (owner, state, a 32-bit doorbell) and one
// single-producer single-consumer byte ring per sender. A message is one or
// more records (a 32-byte header with the user tag and total size, then up
// to ring_bytes / 4 payload bytes) that the sender copies into the ring and
// publishes by advancing the ring's tail (release); the receiver copies them
// out, straight into the posted receive buffer, and advances the head. A
// sender whose ring is full streams the rest as the receiver frees room, so
// a large message is pipelined: the sender's copy of one record overlaps
// the receiver's copy of the previous one. Messages between a pair are
// matched to receives per (peer, tag) in posting order. A message whose
// receive is not posted yet stays in the ring (it lands directly when the
// receive comes) unless a receive with another tag from that peer waits
// behind it or its sender waits for room; then it is staged in memory and
// copied once more when its receive is posted. A receive smaller than its
// message fails with INVALID_ARGUMENT; the message is drained. An isend is
// complete when its last byte is in the ring: small messages complete
// inside isend.
//
// Progress and waiting. Every test/wait/isend/irecv moves what it can for
// every peer (one mutex per communicator; caps: P2P | MEM_HOST |
// THREAD_SAFE). A wait polls its segment's doorbell for up to 0.4 ms
// without progress (busy; yielding between polls only when the
// communicator's own ranks outnumber the cores and more threads want to run
// than there are: transports/common/wait_pacer.h) and then sleeps on the
// doorbell with a futex; a sender rings the
// receiver's doorbell after it publishes, and a receiver rings the sender's
// after it frees room the sender waits for, waking it only when it sleeps.
// No thread of its own: a rank makes progress inside its transport calls,
// as with MPI; a sender whose message does not fit the ring must come back
// (test or wait) to stream the rest.
//
// Failures. abort() marks the communicator (every pending and later request
// fails with ABORTED and the reason), wakes its waiters and posts the
// reason in its segment; comm_destroy posts a goodbye. A peer that posted
// either is closed: what it sent before stays receivable, requests that
// still need it fail with UNAVAILABLE naming its rank, pid and, after an
// abort, its reason. While requests wait, peers in other processes of this
// pid namespace are checked every 100 ms: a process that is gone, a zombie
// or a reused pid fails that peer with UNAVAILABLE (a peer in another pid
// namespace, e.g. a container that shares /dev/shm, only through its notices
// and the deadline). A stalled peer (SIGSTOP, or a rank that
// never posts the matching call) ends in DEADLINE_EXCEEDED at wait's
// deadline naming it and what is missing.
//
// Security. A segment is readable and writable by its owner only (0600) and
// its name is published only through the host store, which is guarded by
// the job's token. A process of the same user can still find a segment in
// /dev/shm while comm_create runs and map it, and can read any process's
// memory anyway (ptrace); same-user processes are not a trust boundary here,
// as with libfabric's shm provider.
#pragma once

#include <memory>
#include <string>

#include "strata/sdk/plugin.hpp"

namespace strata::transport::shmem {

struct Options {
  uint64_t ring_bytes = 0;  // 0 = chosen at comm_create (see above)
  double timeout_s = 300;
  uint64_t max_unexpected_bytes = 1ull << 30;
};

class ShmemComm;

class ShmemTransport : public sdk::TransportBase {
 public:
  using Comm = ShmemComm;
  static constexpr const char* kSubsystem = "transport.shmem";
  ShmemTransport(sdk::Host host, const char* options_json);
  strata_transport_caps caps() override;
  std::unique_ptr<sdk::CommBase> comm_create(const char* name, int32_t rank, int32_t world_size,
                                             int64_t timeout_ms) override;

 private:
  sdk::Host host_;
  Options opts_;
};

}  // namespace strata::transport::shmem
