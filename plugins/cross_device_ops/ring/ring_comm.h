// SPDX-License-Identifier: Apache-2.0
// RingComm: the cross-process half of the ring CrossDeviceOps. It owns one
// communicator of a point-to-point transport and runs byte-level collectives
// on buffers it owns (so that transports needing registered memory work):
// all-reduce (direct exchange for small payloads, pipelined ring
// reduce-scatter + all-gather otherwise), reduce-scatter, broadcast from
// rank 0, all-gather of blocks of different sizes, and a barrier.
//
// Protocol. Every collective gets the next sequence number of this instance
// and begins with "step 0": a message that starts with a WireHeader (the
// collective's fingerprint) sent to both ring neighbours (to every rank for
// the direct algorithms, with the payload appended). Each receiver compares
// the header with its own fingerprint before touching any data, so a
// mismatched collective fails on both sides with INVALID_ARGUMENT naming both
// ranks and both calls, never with wrong data. Step-0 messages use tag 0 and
// are matched in posting order per peer (the transport contract); data
// messages use tags encoding (sequence, step, chunk).
//
// Failures. Every transport wait is bounded by timeout_ms. The first failure
// aborts the transport communicator (so the neighbours fail fast instead of
// waiting for their own deadline), cancels this rank's pending requests and
// leaves the RingComm unusable: later calls fail with FAILED_PRECONDITION.
//
// Culprit analysis (diagnosis.h). Every collective is kept in a flight
// recorder, a watcher thread publishes this rank's heartbeat, and a failed
// collective is diagnosed with the other ranks through the store before it
// throws: the error then starts with the verdict every rank agrees on
// ("rank 2 of 4 died ...", "... is frozen ...", "... did not join ...",
// "collective mismatch ...") followed by what this rank itself saw, and a
// trace file is written when STRATA_TRACE_DIR is set.
//
// Threads. Not thread-safe: one collective at a time (the CrossDeviceOps
// serialises calls). abort() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/c/strata.h"
#include "strata/sdk/host.hpp"
#include "strata/sdk/tensor.hpp"
#include "diagnosis.h"

namespace strata::plugins::ring {

/// What the caller is doing, for fingerprints and messages. `dtype` and
/// `count` are the user's (not the wire type's).
struct CollectiveDesc {
  strata_collective_op op = STRATA_COLL_ALL_REDUCE;
  strata_reduce_op reduce_op = STRATA_REDUCE_SUM;
  DLDataType dtype{kDLFloat, 32, 1};
  uint64_t count = 0;
  // all_gather only: elements before and after the gather axis (must agree).
  uint64_t outer = 0;
  uint64_t inner = 0;
};

/// "all_reduce(SUM, float32 x 1000)", "all_gather(float32 x 10)", "barrier".
std::string describe(const CollectiveDesc& d);

struct RingCommOptions {
  std::string name;           // communicator name (rendezvous keys)
  int32_t rank = 0;
  int32_t world_size = 1;
  int64_t timeout_ms = 300000;
  int64_t setup_timeout_ms = 120000;  // the rendezvous: every rank joins, then the transport comm
  uint64_t chunk_bytes = 0;   // 0 = transport preference or 1 MiB
  uint64_t direct_max_bytes = 65536;
  // Above this many ranks nothing talks to every rank: all-reduces up to
  // direct_max_bytes use recursive doubling (log2 n rounds, one partner
  // each), other small payloads take the ring, and the barrier takes
  // ceil(log2 n) rounds with one peer each, so that a lazily connecting
  // transport holds O(log n) connections per rank instead of n - 1.
  int32_t direct_max_ranks = 16;
  // With 4 or more ranks, all-reduces up to this size use recursive doubling
  // (log2 n rounds of one message each, instead of n - 1 messages at once or
  // 2 (n - 1) ring steps); 0 = never. Up to direct_max_bytes the direct
  // exchange folds in its order (fold_in_doubling_order), so the bits are
  // the same; above, it adds in another order than the ring. The plugin
  // sets it to direct_max_bytes over tcp (ring.cc).
  uint64_t doubling_max_bytes = 0;
  // With a power of two of 4 or more ranks, larger all-reduces up to this
  // size use recursive halving then doubling (2 log2 n steps instead of the
  // ring's 2 (n - 1), the same bytes); 0 = never (off unless asked for, as
  // above).
  uint64_t halving_max_bytes = 0;
  // With 4, 8 or 16 ranks, the direct all-reduce gathers every rank's value
  // in log2 n rounds of recursive doubling (one message per round) instead
  // of n - 1 messages at once; each rank then reduces the n values in the
  // direct exchange's order, so the bits do not change. The plugin turns it
  // on over tcp (ring.cc), where doubling_max_bytes takes these sizes by
  // default.
  bool direct_doubling = false;
  // With 3 to direct_max_ranks ranks, all-reduces above direct_max_bytes and
  // pairwise_min_bytes up to pairwise_max_bytes run the ring's
  // reduce-scatter and all-gather as one round each: every segment goes
  // straight to the rank that reduces it, which folds its values in the
  // ring's order, so the bits do not change (the same bytes as the ring in
  // 2 rounds instead of 2 (n - 1) steps); max 0 = never. The plugin sets
  // both per transport (ring.cc).
  uint64_t pairwise_min_bytes = 0;
  uint64_t pairwise_max_bytes = 0;
  int64_t heartbeat_interval_ms = 1000;   // heartbeat period
  int64_t heartbeat_timeout_ms = 30000;   // no heartbeat this long while others wait: frozen
  int64_t diagnosis_timeout_ms = 5000;    // how long a failed rank gathers the others' evidence
};

class RingComm {
 public:
  /// Waits for every rank to join (sdk::rendezvous_gate), then creates the
  /// transport communicator, both within setup_timeout_ms. `transport` must
  /// outlive this object.
  RingComm(sdk::Host host, const strata_transport_vtable* vt, strata_transport_t transport,
           RingCommOptions options);
  ~RingComm();
  RingComm(const RingComm&) = delete;
  RingComm& operator=(const RingComm&) = delete;

  int32_t rank() const { return opt_.rank; }
  int32_t world_size() const { return opt_.world_size; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }

  /// The work buffer, at least `bytes` long. Its contents survive until the
  /// next call of work() with a larger size.
  void* work(size_t bytes);

  /// In place on work(): every rank ends with op over all ranks' work
  /// buffers (`count` elements of `wire`; `op` is SUM, MIN, MAX or PROD).
  /// Bit-identical on every rank.
  void all_reduce(const CollectiveDesc& d, DLDataType wire, strata_reduce_op op, size_t count);
  /// The same, in place on the caller's `data` (`count` elements of `wire`,
  /// borrowed for the call) instead of work(). With a transport that needs
  /// no registered memory the collective runs in `data` itself (no copy);
  /// otherwise `data` is staged through work(), whose contents it replaces.
  void all_reduce(const CollectiveDesc& d, DLDataType wire, strata_reduce_op op, size_t count, void* data);
  /// The same, out of place: this rank's values come from `src` (`count`
  /// elements, not overlapping `data`) and the result lands in `data`. The
  /// ring reads `src` where it would first read `data`, so large tensors
  /// are never copied into `data` first (the all-gather fills what the
  /// reduce-scatter did not write); small ones, and a transport that needs
  /// registered memory, copy `src` in first.
  void all_reduce(const CollectiveDesc& d, DLDataType wire, strata_reduce_op op, size_t count, void* data,
                  const void* src);
  /// In place on work(): afterwards elements [rank*count/n, (rank+1)*count/n)
  /// hold the reduction over all ranks. `count` must divide by world_size.
  void reduce_scatter(const CollectiveDesc& d, DLDataType wire, strata_reduce_op op, size_t count);
  /// In place on work(): rank 0's first `bytes` bytes land on every rank.
  void broadcast(const CollectiveDesc& d, size_t bytes);
  /// Gathers every rank's block (rank r's in work()[0, block_bytes), with
  /// `axis_len` elements along the gather axis) into one buffer of the blocks
  /// in rank order, returned; axis_lens[r] receives each rank's length.
  const void* all_gather(const CollectiveDesc& d, size_t block_bytes, uint64_t axis_len,
                         std::vector<uint64_t>& axis_lens);
  /// Returns once every rank has called barrier().
  void barrier();

  /// Thread-safe, never blocks: fail the current and every later collective.
  void abort(const std::string& reason);

 private:
  struct Buffer {
    sdk::AlignedBuffer mem;
    strata_mem_region_t mr = nullptr;
    size_t capacity = 0;
    char* borrowed = nullptr;  // the caller's memory standing in for `mem` during one call
    char* data() const { return borrowed != nullptr ? borrowed : static_cast<char*>(mem.data()); }
  };
  // During an out-of-place all_reduce on borrowed memory: this rank's
  // values (never written), else null.
  const char* src_ = nullptr;
  // This rank's own values: src_ (borrowed by `view`) when out of place,
  // else work_.
  const Buffer& own_values(Buffer& view) const {
    if (src_ == nullptr) return work_;
    view.borrowed = const_cast<char*>(src_);
    return view;
  }
  struct Pending;
  struct OpReq;
  class Op;

  void all_reduce_impl(const CollectiveDesc& d, DLDataType wire, strata_reduce_op op, size_t count);
  void reduce_scatter_impl(const CollectiveDesc& d, DLDataType wire, strata_reduce_op op, size_t count);
  void broadcast_impl(const CollectiveDesc& d, size_t bytes);
  const void* all_gather_impl(const CollectiveDesc& d, size_t block_bytes, uint64_t axis_len,
                              std::vector<uint64_t>& axis_lens);
  void barrier_impl();

  void ensure(Buffer& b, size_t bytes);
  void release(Buffer& b) noexcept;
  strata_buffer buffer_of(const Buffer& b, size_t offset, size_t bytes) const;
  void check_usable() const;
  // Runs one public collective; a failure is diagnosed with the other ranks
  // and rethrown with the verdict (see the file comment).
  template <class F>
  auto diagnosed(F&& body) -> decltype(body());
  [[noreturn]] void fail_diagnosed(const Error& e);
  DiagOptions diag_options() const;

  // The pieces of one collective; `Op` carries the sequence and cleanup.
  void step0(Op& op, const std::vector<int32_t>& send_to, const std::vector<int32_t>& recv_from,
             const void* payload, size_t payload_bytes, uint64_t aux, bool wait_sends = false);
  // This rank's fingerprint of the collective, into the start of hdr_send_.
  void write_fingerprint(Op& op, size_t payload_bytes, uint64_t aux);
  // Compares rank p's fingerprint (the first `bytes` bytes at `got`) with
  // ours (hdr_send_) and raises a mismatch naming both collectives; with
  // expect_aux >= 0 its aux must equal that too. Before raising, our own
  // sends get up to kDrainMs to leave (Op::drain_sends_to), so that the peer
  // can report the mismatch too.
  void check_fingerprint(Op& op, int32_t p, const char* got, uint64_t bytes, int64_t expect_aux = -1);
  void ring_reduce_scatter(Op& op, DLDataType wire, strata_reduce_op rop, size_t count, int shift);
  void ring_all_gather(Op& op, size_t esize, size_t count, int shift);
  void direct_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count);
  void doubling_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count);
  void halving_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count);
  void gather_doubling_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count);
  void pairwise_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count);
  // Reduces the n ranks' values vals[0..n) into `out` in the order recursive
  // doubling combines them (doubling_all_reduce), so that the direct
  // exchange, in one round or in rounds, gives doubling's bits: with 4 or
  // more ranks every small all-reduce has one order whatever its algorithm
  // and transport. `out` may be one of the values.
  void fold_in_doubling_order(DLDataType wire, strata_reduce_op rop, size_t count, const void* const* vals,
                              void* out);

  sdk::Host host_;
  const strata_transport_vtable* vt_;
  strata_transport_t transport_;
  RingCommOptions opt_;
  strata_comm_t comm_ = nullptr;
  bool requires_mr_ = false;
  uint64_t chunk_bytes_ = 0;
  uint64_t doubling_max_bytes_ = 0;  // all-reduces up to this size: recursive doubling
  bool direct_in_rounds_ = false;    // then up to direct_max_bytes: the direct exchange in rounds
  uint64_t halving_max_bytes_ = 0;   // then up to this size: recursive halving and doubling
  uint64_t pairwise_max_bytes_ = 0;  // then above opt_.pairwise_min_bytes up to this size: the pairwise exchange
  uint32_t recv_window_ = 4;   // staged receives in flight per ring step
  uint32_t send_window_ = 64;  // sends in flight before the oldest is waited for
  uint64_t sequence_ = 0;

  // Per-communicator scratch so that a warm collective allocates nothing:
  // the Op's request lists (swapped in and out), the peer lists (fixed for
  // the communicator) and step 0's and the direct reduction's index lists.
  std::vector<OpReq> reqs_cache_;
  std::vector<size_t> sends_cache_;
  std::vector<int32_t> neighbours_;  // ring neighbours (one when there are two ranks)
  std::vector<int32_t> everyone_;    // every other rank, ring neighbours first
  std::vector<size_t> step0_recvs_, step0_sends_;
  std::vector<const void*> reduce_ptrs_;
  std::vector<const void*> fold_ptrs_;  // fold_in_doubling_order's leaves by hypercube label
  // describe() of the last collective, reused while the next one matches it.
  CollectiveDesc described_;
  std::string description_;
  const std::string& describe_cached(const CollectiveDesc& d);

  Buffer work_;
  Buffer stage_;      // recv_window_ chunk slots for reduce-scatter
  Buffer hdr_recv_;   // one step-0 slot per rank
  Buffer hdr_send_;   // the step-0 message this rank sends
  Buffer gather_;     // all_gather result

  FlightRecorder recorder_;
  std::unique_ptr<Watcher> watcher_;  // world_size > 1 only
  bool failed_op_ = false;            // set by the Op that failed during the current call
  Failure failure_;

  mutable std::mutex abort_mu_;
  std::atomic<bool> broken_{false};
  std::string broken_reason_;  // guarded by abort_mu_
};

}  // namespace strata::plugins::ring
