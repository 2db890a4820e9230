// SPDX-License-Identifier: Apache-2.0
#include "ring_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

#include "strata/error.hpp"
#include "strata/sdk/kernels.hpp"
#include "strata/sdk/rendezvous.hpp"

namespace strata::plugins::ring {
namespace {

constexpr uint32_t kMagic = 0x53524e47u;  // "SRNG"
constexpr uint64_t kDefaultChunkBytes = 1ull << 20;
// Tag layout: sequence (32 bits) | step (12 bits) | chunk (20 bits). Step 0
// (the fingerprint message) always uses tag 0 so that it pairs with the
// peer's step 0 whatever sequence the peer is at, and a skipped collective
// shows up as a sequence mismatch rather than a timeout.
constexpr uint64_t kMaxStep = (1ull << 12) - 1;
constexpr uint64_t kMaxChunks = 1ull << 20;
// Longest single transport wait between checks of the host's abort flag.
constexpr int64_t kWaitSliceMs = 100;
// How long a rank that found a peer in another collective lets its own
// messages to that peer leave before it fails (Op::drain_sends_to).
constexpr int64_t kDrainMs = 1000;

// The fingerprint at the start of every step-0 message. Peers are assumed to
// share endianness (every supported platform is little-endian).
struct WireHeader {
  uint32_t magic;
  uint32_t op;
  uint32_t reduce_op;
  uint32_t dtype;  // code | bits << 8 | lanes << 16
  uint64_t count;
  uint64_t sequence;
  uint64_t payload_bytes;
  uint64_t aux;
  uint64_t outer;
  uint64_t inner;
  uint64_t chunk_bytes;
  int32_t rank;
  int32_t world_size;
};
static_assert(std::is_trivially_copyable_v<WireHeader> && sizeof(WireHeader) == 80);
constexpr size_t kHdr = sizeof(WireHeader);
// An all-reduce's fingerprint names its algorithm in aux: 0 the direct
// exchange, these the others (recursive doubling's plus the message's
// number in the collective).
constexpr uint64_t kRingAux = 0x524e47ull << 32;      // "RNG"
constexpr uint64_t kHalvingAux = 0x484c56ull << 32;   // "HLV"
constexpr uint64_t kDoublingAux = 0x444231ull << 32;  // "DB1"
constexpr uint64_t kGatherAux = 0x444741ull << 32;    // "DGA"
constexpr uint64_t kPairwiseAux = 0x505758ull << 32;  // "PWX"

// The ring's cut of `count` elements into n segments (the first count % n
// one element longer) and of each segment into chunks of `ce` elements
// (chunk_bytes, raised where a segment would have kMaxChunks chunks).
struct Segments {
  Segments(size_t count, int32_t n, uint64_t chunk_bytes, size_t esize)
      : count_(count), n_(size_t(n)), ce(std::max<size_t>(1, chunk_bytes / esize)) {
    if (longest() / ce >= kMaxChunks) ce = longest() / (kMaxChunks - 1) + 1;
  }
  size_t longest() const { return count_ / n_ + 1; }
  size_t off(int32_t i) const { return size_t(i) * (count_ / n_) + std::min<size_t>(size_t(i), count_ % n_); }
  size_t len(int32_t i) const { return count_ / n_ + (size_t(i) < count_ % n_ ? 1 : 0); }
  size_t chunks(int32_t i) const { return (len(i) + ce - 1) / ce; }
  size_t chunk_len(int32_t i, size_t c) const { return std::min(ce, len(i) - c * ce); }

  size_t count_, n_;
  size_t ce;  // elements per chunk
};

std::string algorithm_of(uint64_t aux) {
  if (aux == 0) return "the direct exchange";
  if (aux == kRingAux) return "the ring";
  if (aux == kHalvingAux) return "recursive halving";
  if (aux == kGatherAux) return "the direct exchange in rounds";
  if (aux == kPairwiseAux) return "the pairwise exchange";
  if ((aux >> 32) == (kDoublingAux >> 32))
    return "recursive doubling (message " + std::to_string(aux & 0xffffffffu) + ")";
  return "an unknown algorithm (" + std::to_string(aux) + ")";
}

uint32_t pack_dtype(DLDataType d) {
  return uint32_t(d.code) | (uint32_t(d.bits) << 8) | (uint32_t(d.lanes) << 16);
}
DLDataType unpack_dtype(uint32_t v) {
  return DLDataType{uint8_t(v & 0xff), uint8_t((v >> 8) & 0xff), uint16_t(v >> 16)};
}

const char* op_name(uint32_t op) {
  switch (op) {
    case STRATA_COLL_ALL_REDUCE: return "all_reduce";
    case STRATA_COLL_BROADCAST: return "broadcast";
    case STRATA_COLL_ALL_GATHER: return "all_gather";
    case STRATA_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case STRATA_COLL_REDUCE: return "reduce";
    case STRATA_COLL_BARRIER: return "barrier";
    default: return "collective";
  }
}

bool uses_reduce_op(uint32_t op) {
  return op == STRATA_COLL_ALL_REDUCE || op == STRATA_COLL_REDUCE || op == STRATA_COLL_REDUCE_SCATTER;
}

std::string args_of(const CollectiveDesc& d) {
  if (d.op == STRATA_COLL_BARRIER) return "";
  std::string s = uses_reduce_op(d.op) ? std::string(sdk::reduce_op_name(d.reduce_op)) + ", " : "";
  return s + sdk::dtype_name(d.dtype) + " x " + std::to_string(d.count);
}

CollectiveDesc desc_of(const WireHeader& h) {
  CollectiveDesc d;
  d.op = static_cast<strata_collective_op>(h.op);
  d.reduce_op = static_cast<strata_reduce_op>(h.reduce_op);
  d.dtype = unpack_dtype(h.dtype);
  d.count = h.count;
  d.outer = h.outer;
  d.inner = h.inner;
  return d;
}

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

std::string describe(const CollectiveDesc& d) {
  return std::string(op_name(d.op)) + "(" + args_of(d) + ")";
}

// ------------------------------------------------------------------ Op ---

// One collective in flight: its sequence number, the requests it posted and
// the cleanup when it fails (abort the communicator, cancel what is live).
struct RingComm::OpReq {
  strata_request_t req = nullptr;
  int32_t peer = -1;
  bool send = false;
  bool live = false;
  uint64_t step = 0;
  uint64_t chunk = 0;
  uint64_t expect = 0;
  uint64_t bytes = 0;
};

class RingComm::Op {
 public:
  using Req = OpReq;
  Op(RingComm& c, const CollectiveDesc& d) : c_(c), d_(d), uncaught_(std::uncaught_exceptions()) {
    c.check_usable();
    // The request lists keep their capacity from one collective to the next
    // (no allocation per collective once warm).
    reqs_.swap(c.reqs_cache_);
    live_sends_.swap(c.sends_cache_);
    reqs_.clear();
    live_sends_.clear();
    seq_ = c.sequence_++;
    strata_collective_fingerprint fp{};
    STRATA_INIT_HEADER(&fp, strata_collective_fingerprint);
    fp.communicator = c.opt_.name.c_str();
    fp.op = d.op;
    fp.reduce_op = d.reduce_op;
    fp.sequence = seq_;
    fp.dtype = d.dtype;
    fp.count = d.count;
    fp.rank = c.opt_.rank;
    fp.peer = d.op == STRATA_COLL_BROADCAST ? 0 : -1;
    c.host_.record_collective(fp);
    c.failed_op_ = false;
    c.recorder_.start(seq_, c.describe_cached(d), d.count * ((uint64_t(d.dtype.bits) * d.dtype.lanes + 7) / 8));
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  ~Op() {
    if (std::uncaught_exceptions() > uncaught_) {
      c_.failed_op_ = true;
      c_.failure_ = Failure{};
      c_.failure_.seq = seq_;
      c_.failure_.op = describe(d_);
      c_.failure_.kind = kind_;
      c_.failure_.peer = peer_;
      c_.failure_.message = failure_;
      c_.recorder_.finish(seq_, false, failure_);
      c_.abort(failure_.empty() ? "rank " + std::to_string(c_.opt_.rank) + " failed " + prefix() : failure_);
    } else {
      c_.recorder_.finish(seq_, true, "");
    }
    for (Req& q : reqs_)
      if (q.live) c_.vt_->cancel(c_.comm_, q.req);
    c_.reqs_cache_.swap(reqs_);
    c_.sends_cache_.swap(live_sends_);
  }

  uint64_t seq() const { return seq_; }
  const CollectiveDesc& desc() const { return d_; }
  /// "all_reduce #12 (SUM, float32 x 1000)".
  std::string prefix() const {
    return std::string(op_name(d_.op)) + " #" + std::to_string(seq_) + " (" + args_of(d_) + ")";
  }

  uint64_t tag(uint64_t step, uint64_t chunk) const {
    if (step == 0) return 0;
    return ((seq_ & 0xffffffffull) << 32) | (step << 20) | chunk;
  }

  size_t post(bool send, int32_t peer, uint64_t step, uint64_t chunk, const strata_buffer& buf) {
    if (send) {
      // Bound the sends in flight (transports may cap requests per peer).
      while (live_sends_.size() >= c_.send_window_) {
        const size_t oldest = live_sends_.front();
        wait(oldest);
      }
    }
    Req q;
    q.peer = peer;
    q.send = send;
    q.step = step;
    q.chunk = chunk;
    q.expect = buf.bytes;
    strata_error err;
    strata_error_init(&err);
    const strata_status_t s = send ? c_.vt_->isend(c_.comm_, peer, tag(step, chunk), &buf, &q.req, &err)
                                   : c_.vt_->irecv(c_.comm_, peer, tag(step, chunk), &buf, &q.req, &err);
    if (s != STRATA_OK)
      raise(s, prefix(), ": posting a ", send ? "send to" : "receive from", " rank ", peer, " (", what(q),
            ") failed: ", err.message);
    q.live = true;
    reqs_.push_back(q);
    if (send) live_sends_.push_back(reqs_.size() - 1);
    return reqs_.size() - 1;
  }

  /// Wait for request `i` (bounded by the timeout); returns the bytes moved.
  uint64_t wait(size_t i) {
    Req& q = reqs_[i];
    if (!q.live) return q.bytes;
    strata_error err;
    uint64_t bytes = 0;
    strata_status_t s;
    // Wait in slices so that a job-wide stop request (host abort flag) ends
    // the wait early; the request stays live across DEADLINE_EXCEEDED. The
    // clock is read only once a first slice ran out (most waits end within
    // it, and a clock read costs about 30 ns in a VM): the wait then dates
    // its start one slice back.
    struct Waiting {
      Watcher* w;
      explicit Waiting(Watcher* x) : w(x) { if (w) w->waiting(true); }
      ~Waiting() { if (w) w->waiting(false); }
    } waiting(c_.watcher_.get());
    const uint64_t timeout_ns = uint64_t(c_.opt_.timeout_ms) * 1000000ull;
    uint64_t start = 0;
    int64_t left_ms = c_.opt_.timeout_ms;
    for (;;) {
      strata_error_init(&err);
      const int64_t slice_ms = std::min<int64_t>(left_ms, kWaitSliceMs);
      s = c_.vt_->wait(c_.comm_, q.req, slice_ms, &bytes, &err);
      if (s != STRATA_ERR_DEADLINE_EXCEEDED || left_ms <= kWaitSliceMs) break;
      const uint64_t now = c_.host_.now_ns();
      if (start == 0) start = now - std::min<uint64_t>(now, uint64_t(slice_ms) * 1000000ull);
      left_ms = now - start >= timeout_ns ? 0 : int64_t((timeout_ns - (now - start)) / 1000000ull);
      if (c_.host_.abort_requested()) {
        kind_ = "host_abort";
        raise(STRATA_ERR_ABORTED, prefix(), ": the job was asked to stop (host abort) while waiting for rank ",
              q.peer, " (", what(q), ")");
      }
      watch(q);
    }
    if (s != STRATA_ERR_DEADLINE_EXCEEDED) q.live = false;  // released by wait
    if (q.send) forget_send(i);
    if (s != STRATA_OK) {
      int64_t waited_ms = 0;
      if (start != 0)
        waited_ms = int64_t((c_.host_.now_ns() - start) / 1000000ull);
      else if (s == STRATA_ERR_DEADLINE_EXCEEDED)
        waited_ms = std::min<int64_t>(left_ms, kWaitSliceMs);  // the only slice
      fail_request(q, s, err.message, waited_ms);
    }
    q.bytes = bytes;
    return bytes;
  }

  /// Non-blocking: true when request `i` finished (throws when it failed).
  bool test(size_t i) {
    Req& q = reqs_[i];
    if (!q.live) return true;
    strata_error err;
    strata_error_init(&err);
    int32_t done = 0;
    uint64_t bytes = 0;
    const strata_status_t s = c_.vt_->test(c_.comm_, q.req, &done, &bytes, &err);
    if (s != STRATA_OK) {
      q.live = false;
      if (q.send) forget_send(i);
      fail_request(q, s, err.message);
    }
    if (done) {
      q.live = false;
      q.bytes = bytes;
      if (q.send) forget_send(i);
    }
    return done != 0;
  }

  /// Wait for every request still live (the sends, at the end).
  void finish() {
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (reqs_[i].live) wait(i);
  }

  /// Between wait slices: what the watcher thread found (another rank's
  /// failure, a rank without heartbeat, a silent store) ends the wait.
  void watch(const Req& q) {
    Watcher* w = c_.watcher_.get();
    if (w == nullptr) return;
    const std::string inc = w->incident();
    if (!inc.empty()) {
      kind_ = "incident";
      raise(STRATA_ERR_ABORTED, prefix(), ": stopped waiting for rank ", q.peer, " (", what(q),
            ") because another rank reported a failure: ", inc);
    }
    int64_t silent_ms = 0;
    const int32_t k = w->frozen_rank(&silent_ms);
    if (k >= 0) {
      kind_ = "frozen";
      peer_ = k;
      raise(STRATA_ERR_DEADLINE_EXCEEDED, prefix(), ": rank ", k, " sent no heartbeat for ", silent_ms / 1000,
            " s (the heartbeat deadline is ", c_.opt_.heartbeat_timeout_ms / 1000.0,
            " s, /timeouts/heartbeat_s) while this rank waited for rank ", q.peer, " (", what(q), ")");
    }
    const int64_t store_ms = w->store_silent_ms();
    if (store_ms > c_.opt_.heartbeat_timeout_ms) {
      kind_ = "store";
      peer_ = 0;
      raise(STRATA_ERR_DEADLINE_EXCEEDED, prefix(), ": the rendezvous store (served by rank 0) has not answered for ",
            store_ms / 1000, " s while this rank waited for rank ", q.peer, " (", what(q), ")");
    }
  }

  void set_cause(const char* kind, int32_t peer) {
    kind_ = kind;
    peer_ = peer;
  }

  template <class... A>
  [[noreturn]] void raise(strata_status_t code, A&&... parts) {
    failure_ = ::strata::detail::str_cat(std::forward<A>(parts)...);
    STRATA_THROW(code, failure_);
  }

  const Req& req(size_t i) const { return reqs_[i]; }

  /// Gives this collective's live sends to `peer` (-1: to anyone) up to kDrainMs in all to
  /// leave (the transport may progress only inside wait). A send the peer
  /// never takes (it is blocked elsewhere) must not hold back this rank's
  /// report, which the other ranks' watchers act on: what is left stays live
  /// and is cancelled with the collective. Failures here are not the verdict.
  void drain_sends_to(int32_t peer) {
    const uint64_t until = c_.host_.now_ns() + uint64_t(kDrainMs) * 1000000ull;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      Req& q = reqs_[i];
      if (!q.send || !q.live || (peer >= 0 && q.peer != peer)) continue;
      const uint64_t now = c_.host_.now_ns();
      if (now >= until) break;
      strata_error err;
      strata_error_init(&err);
      uint64_t bytes = 0;
      const strata_status_t s =
          c_.vt_->wait(c_.comm_, q.req, int64_t((until - now) / 1000000ull) + 1, &bytes, &err);
      if (s == STRATA_ERR_DEADLINE_EXCEEDED) break;
      q.live = false;  // released by wait
      forget_send(i);
    }
  }

 private:
  void forget_send(size_t i) {
    auto it = std::find(live_sends_.begin(), live_sends_.end(), i);
    if (it != live_sends_.end()) live_sends_.erase(it);
  }

  std::string what(const Req& q) const {
    if (q.step == 0) return "the fingerprint of this collective";
    return "step " + std::to_string(q.step) + ", chunk " + std::to_string(q.chunk);
  }

  [[noreturn]] void fail_request(const Req& q, strata_status_t s, const char* msg, int64_t waited_ms = 0) {
    const std::string peer = "rank " + std::to_string(q.peer);
    // ABORTED from the transport is this rank's own abort (another thread
    // destroyed the ops) unless the communicator is still intact.
    set_cause(s == STRATA_ERR_DEADLINE_EXCEEDED ? "deadline"
              : (s == STRATA_ERR_ABORTED && c_.broken_.load()) ? "error"
                                                               : "lost",
              q.peer);
    if (s == STRATA_ERR_DEADLINE_EXCEEDED) {
      // The transport's own text only covers the last wait slice, so it
      // would name a second, shorter duration for the same wait: leave it out.
      const int64_t tenths = (waited_ms + 50) / 100;
      raise(s, prefix(), ": ", q.send ? "sending to " : "receiving from ", peer, " (", what(q),
            ") did not complete within the ", c_.opt_.timeout_ms / 1000.0, " s deadline (timeout_s; waited ",
            tenths / 10, ".", tenths % 10, " s); ", peer,
            " may have stopped, crashed or be running a different collective, or raise timeout_s if it is only slow");
    }
    if (!q.send && s == STRATA_ERR_INVALID_ARGUMENT) {
      // Receives are posted valid and sized for this collective, so this is
      // the peer's message (too large): it runs another collective, whose
      // fingerprint check names the mismatch, or other options. Not a bad
      // argument of this rank's, which the culprit analysis would skip.
      set_cause("error", q.peer);
      // That peer can only name the mismatch from our own message: let ours
      // leave before this rank aborts (a send still queued in the transport,
      // e.g. behind its connect, would be cancelled, and the peer would see
      // only our abort).
      drain_sends_to(q.peer);
      raise(STRATA_ERR_DATA_LOSS, prefix(), ": receiving from ", peer, " (", what(q), ") failed: ", msg, "; ", peer,
            " sent a message of another size: it runs another collective, or its ring cross_device_ops options "
            "differ from this rank's");
    }
    raise(s, prefix(), ": ", q.send ? "sending to " : "receiving from ", peer, " (", what(q), ") failed: ",
          msg);
  }

  RingComm& c_;
  CollectiveDesc d_;
  int uncaught_;
  uint64_t seq_ = 0;
  std::vector<Req> reqs_;
  std::vector<size_t> live_sends_;  // oldest first; at most send_window_ long
  std::string failure_;
  std::string kind_ = "error";
  int32_t peer_ = -1;
};

namespace {
// Both ring neighbours (one when there are two ranks).
std::vector<int32_t> neighbours(int32_t r, int32_t n) {
  const int32_t left = (r + n - 1) % n, right = (r + 1) % n;
  std::vector<int32_t> v{left};
  if (right != left) v.push_back(right);
  return v;
}
// Every other rank, ring neighbours first.
std::vector<int32_t> everyone(int32_t r, int32_t n) {
  std::vector<int32_t> v = neighbours(r, n);
  for (int32_t p = 0; p < n; ++p)
    if (p != r && std::find(v.begin(), v.end(), p) == v.end()) v.push_back(p);
  return v;
}
int32_t mod(int64_t x, int32_t n) { return int32_t(((x % n) + n) % n); }
// The largest power of two <= n (n >= 1): recursive doubling's hypercube.
int32_t hypercube_size(int32_t n) {
  int32_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
// Virtual rank v's hypercube label (Gray code): with 4 ranks both of
// doubling's partners are ring neighbours.
int32_t hypercube_label(int32_t v) { return v ^ (v >> 1); }
}  // namespace

// ------------------------------------------------------------- RingComm ---

RingComm::RingComm(sdk::Host host, const strata_transport_vtable* vt, strata_transport_t transport,
                   RingCommOptions options)
    : host_(std::move(host)), vt_(vt), transport_(transport), opt_(std::move(options)) {
  strata_error err;
  strata_error_init(&err);
  strata_transport_caps caps{};
  STRATA_INIT_HEADER(&caps, strata_transport_caps);
  ::strata::detail::check_status(vt_->get_caps(transport_, &caps, &err), err, "ring: reading transport caps");
  if ((caps.flags & STRATA_TRANSPORT_CAP_P2P) == 0)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "ring cross_device_ops needs a transport with point-to-point "
                 "isend/irecv, but this one does not report STRATA_TRANSPORT_CAP_P2P; choose e.g. "
                 "{\"transport\": {\"name\": \"tcp\"}}");
  requires_mr_ = (caps.flags & STRATA_TRANSPORT_CAP_REQUIRES_MR) != 0;
  chunk_bytes_ = opt_.chunk_bytes != 0 ? opt_.chunk_bytes
                 : caps.preferred_chunk_bytes != 0 ? caps.preferred_chunk_bytes
                                                   : kDefaultChunkBytes;
  // The choice depends on the options and world_size only, so every rank
  // makes the same one (the fingerprints catch options that differ).
  if (opt_.world_size > opt_.direct_max_ranks) {
    doubling_max_bytes_ = std::max(opt_.doubling_max_bytes, opt_.direct_max_bytes);
    opt_.direct_max_bytes = 0;
  } else if (opt_.world_size >= 4) {
    doubling_max_bytes_ = opt_.doubling_max_bytes;
  }
  if (caps.max_message_bytes != 0) {
    chunk_bytes_ = std::min<uint64_t>(chunk_bytes_, caps.max_message_bytes);
    const uint64_t most = caps.max_message_bytes > kHdr ? caps.max_message_bytes - kHdr : 0;
    doubling_max_bytes_ = std::min<uint64_t>(doubling_max_bytes_, most);
    opt_.direct_max_bytes = std::min<uint64_t>(opt_.direct_max_bytes, most);
  }
  // Halving and the direct exchange in rounds pair ranks r and r ^ d: n must
  // be a power of two (and 2 ranks gain nothing).
  const int32_t n = opt_.world_size;
  const bool hypercube = n >= 4 && (n & (n - 1)) == 0;
  direct_in_rounds_ = hypercube && opt_.direct_doubling;
  if (hypercube) halving_max_bytes_ = opt_.halving_max_bytes;
  if (caps.max_message_bytes != 0) halving_max_bytes_ = std::min<uint64_t>(halving_max_bytes_, caps.max_message_bytes);
  // The pairwise exchange talks to every rank and keeps all of a segment's
  // chunks in flight at once (2 ranks: it would be the ring's own messages).
  if (n >= 3 && n <= opt_.direct_max_ranks && caps.max_inflight == 0) pairwise_max_bytes_ = opt_.pairwise_max_bytes;
  if (caps.max_inflight != 0) {
    recv_window_ = std::max<uint32_t>(1, std::min<uint32_t>(4, caps.max_inflight / 2));
    send_window_ = std::max<uint32_t>(1, caps.max_inflight - recv_window_);
  }
  if (2ull * uint64_t(opt_.world_size) > kMaxStep)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "ring cross_device_ops supports at most ", kMaxStep / 2,
                 " processes; got world_size ", opt_.world_size);
  // The rendezvous deadline bounds everything up to a ready communicator:
  // a worker that never starts is named at that deadline, not at the
  // (longer) collective one inside the transport's own handshake.
  const auto setup_start = std::chrono::steady_clock::now();
  // The watcher's first heartbeat goes out before the gate, so that once
  // setup is done every rank's is in the store (see Watcher::start).
  if (opt_.world_size > 1) watcher_ = std::make_unique<Watcher>(host_, diag_options(), recorder_);
  sdk::rendezvous_gate(host_, opt_.name, opt_.rank, opt_.world_size, opt_.setup_timeout_ms,
                       ::strata::detail::str_cat("ring: communicator '", opt_.name, "' rank ", opt_.rank));
  const int64_t spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                                setup_start).count();
  const int64_t create_ms = std::max<int64_t>(1000, opt_.setup_timeout_ms - spent);
  ::strata::detail::check_status(
      vt_->comm_create(transport_, opt_.name.c_str(), opt_.rank, opt_.world_size, create_ms, &comm_, &err),
      err, ::strata::detail::str_cat("ring: joining communicator '", opt_.name, "' as rank ", opt_.rank, " of ",
                                     opt_.world_size).c_str());
  if (watcher_ != nullptr) watcher_->start();
  neighbours_ = neighbours(opt_.rank, opt_.world_size);
  everyone_ = everyone(opt_.rank, opt_.world_size);
}

const std::string& RingComm::describe_cached(const CollectiveDesc& d) {
  const CollectiveDesc& c = described_;
  if (description_.empty() || c.op != d.op || c.reduce_op != d.reduce_op || c.dtype.code != d.dtype.code ||
      c.dtype.bits != d.dtype.bits || c.dtype.lanes != d.dtype.lanes || c.count != d.count || c.outer != d.outer ||
      c.inner != d.inner) {
    described_ = d;
    description_ = describe(d);
  }
  return description_;
}

DiagOptions RingComm::diag_options() const {
  DiagOptions d;
  d.comm = opt_.name;
  d.rank = opt_.rank;
  d.world = opt_.world_size;
  d.interval_ms = opt_.heartbeat_interval_ms;
  d.frozen_ms = opt_.heartbeat_timeout_ms;
  d.diagnose_ms = opt_.diagnosis_timeout_ms;
  return d;
}

template <class F>
auto RingComm::diagnosed(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    fail_diagnosed(e);
  }
}

void RingComm::fail_diagnosed(const Error& e) {
  // Only failures that involve other ranks are diagnosed: a bad argument is
  // reported by every rank alike, a stop request is the user's, and a
  // communicator already broken was diagnosed when it broke.
  const bool involves_others = failed_op_ && watcher_ != nullptr && failure_.kind != "host_abort" &&
                               e.code() != STRATA_ERR_FAILED_PRECONDITION &&
                               (e.code() != STRATA_ERR_INVALID_ARGUMENT || failure_.kind == "mismatch");
  failed_op_ = false;
  if (!involves_others || host_.abort_requested()) throw e;
  Failure f = failure_;
  f.code = e.code();
  if (f.message.empty()) f.message = e.what();
  const Verdict v = diagnose(host_, diag_options(), watcher_.get(), f, recorder_);  // also writes the trace file
  std::string own = e.what();
  if (const size_t at = own.rfind(" ["); at != std::string::npos && !own.empty() && own.back() == ']') own.resize(at);
  ::strata::detail::throw_status(v.code, ::strata::detail::str_cat(v.text, " [rank ", opt_.rank, " saw: ", own, "]"));
}

RingComm::~RingComm() {
  watcher_.reset();
  for (Buffer* b : {&work_, &stage_, &hdr_recv_, &hdr_send_, &gather_}) release(*b);
  if (comm_ != nullptr) vt_->comm_destroy(comm_);
}

void RingComm::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (broken_.load()) return;
  broken_reason_ = reason;
  broken_.store(true);
  if (comm_ != nullptr) vt_->comm_abort(comm_, reason.c_str());
}

void RingComm::check_usable() const {
  if (!broken_.load()) return;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    reason = broken_reason_;
  }
  STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "ring communicator '", opt_.name,
               "' is unusable after an earlier failure (", reason,
               "); destroy this cross_device_ops and create a new one (every rank must)");
}

void RingComm::ensure(Buffer& b, size_t bytes) {
  if (bytes <= b.capacity && b.mem.data() != nullptr) return;
  release(b);
  const size_t want = round_up(std::max<size_t>(bytes + bytes / 4, 4096), 4096);
  b.mem.reserve(want);
  // Touch every page now so that the collectives never page-fault on it.
  std::memset(b.mem.data(), 0, want);
  b.capacity = want;
  if (requires_mr_) {
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(vt_->mem_register(comm_, b.mem.data(), want, DLDevice{kDLCPU, 0}, &b.mr, &err),
                                   err, "ring: registering a scratch buffer with the transport");
  }
}

void RingComm::release(Buffer& b) noexcept {
  if (b.mr != nullptr && comm_ != nullptr) vt_->mem_deregister(comm_, b.mr);
  b.mr = nullptr;
  b.capacity = 0;
}

strata_buffer RingComm::buffer_of(const Buffer& b, size_t offset, size_t bytes) const {
  strata_buffer sb{};
  STRATA_INIT_HEADER(&sb, strata_buffer);
  sb.data = b.data() + offset;
  sb.bytes = bytes;
  sb.device = DLDevice{kDLCPU, 0};
  sb.mr = b.borrowed != nullptr ? nullptr : b.mr;
  sb.stream = nullptr;
  return sb;
}

void* RingComm::work(size_t bytes) {
  ensure(work_, bytes);
  return work_.mem.data();
}

void RingComm::write_fingerprint(Op& op, size_t payload_bytes, uint64_t aux) {
  const CollectiveDesc& d = op.desc();
  ensure(hdr_send_, kHdr + payload_bytes);
  WireHeader mine{};
  mine.magic = kMagic;
  mine.op = d.op;
  mine.reduce_op = d.reduce_op;
  mine.dtype = pack_dtype(d.dtype);
  mine.count = d.count;
  mine.sequence = op.seq();
  mine.payload_bytes = payload_bytes;
  mine.aux = aux;
  mine.outer = d.outer;
  mine.inner = d.inner;
  mine.chunk_bytes = chunk_bytes_;
  mine.rank = opt_.rank;
  mine.world_size = opt_.world_size;
  std::memcpy(hdr_send_.mem.data(), &mine, kHdr);
}

void RingComm::check_fingerprint(Op& op, int32_t p, const char* got, uint64_t bytes,
                                 int64_t expect_aux) {
  const CollectiveDesc& d = op.desc();
  WireHeader mine{};
  std::memcpy(&mine, hdr_send_.mem.data(), kHdr);
  WireHeader h{};
  if (bytes >= kHdr) std::memcpy(&h, got, kHdr);
  if (bytes < kHdr || h.magic != kMagic || h.rank != p)
    op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", p, " sent a malformed fingerprint (", bytes,
             " bytes); every process must use the same version of the ring cross_device_ops");
  const bool same_op = h.op == mine.op && h.dtype == mine.dtype &&
                       (!uses_reduce_op(h.op) || h.reduce_op == mine.reduce_op) &&
                       (h.op == STRATA_COLL_ALL_GATHER ? (h.outer == mine.outer && h.inner == mine.inner)
                                                       : h.count == mine.count);
  if (!same_op || h.sequence != mine.sequence) {
    // Let our own fingerprint leave, so that the peers can report the
    // mismatch too instead of seeing a dropped connection.
    op.drain_sends_to(-1);
    const CollectiveDesc theirs = desc_of(h);
    const bool me_first = opt_.rank < p;
    const std::string a = "rank " + std::to_string(opt_.rank) + " called " + describe(d) +
                          (h.sequence != mine.sequence ? " as #" + std::to_string(mine.sequence) : "");
    const std::string b = "rank " + std::to_string(p) + " called " + describe(theirs) +
                          (h.sequence != mine.sequence ? " as #" + std::to_string(h.sequence) : "");
    op.set_cause("mismatch", p);
    op.raise(STRATA_ERR_INVALID_ARGUMENT, "collective mismatch at #", std::min(mine.sequence, h.sequence),
             " of communicator '", opt_.name, "': ", me_first ? a : b, ", ", me_first ? b : a,
             "; every process must issue the same collectives in the same order");
  }
  // Below, as above, the peer can only name the difference from our own
  // message: let it leave first.
  if (h.chunk_bytes != mine.chunk_bytes || h.world_size != mine.world_size) {
    op.drain_sends_to(p);
    op.set_cause("mismatch", p);
    op.raise(STRATA_ERR_INVALID_ARGUMENT, op.prefix(), ": rank ", p, " uses chunk_bytes ", h.chunk_bytes,
             " and world_size ", h.world_size, " but rank ", opt_.rank, " uses ", mine.chunk_bytes, " and ",
             mine.world_size, "; give every process the same ring cross_device_ops options");
  }
  if (expect_aux >= 0 && h.aux != uint64_t(expect_aux)) {
    op.drain_sends_to(p);
    op.set_cause("mismatch", p);
    op.raise(STRATA_ERR_INVALID_ARGUMENT, op.prefix(), ": rank ", p, " runs this collective with another "
             "algorithm: it sent ", algorithm_of(h.aux), " where rank ", opt_.rank, " expects ",
             algorithm_of(uint64_t(expect_aux)), "; the options 'direct_max_bytes', 'direct_max_ranks', "
             "'direct_doubling', 'doubling_max_bytes', 'halving_max_bytes', 'pairwise_min_bytes' or "
             "'pairwise_max_bytes' (or the transport, which sets the defaults of the direct_doubling and "
             "pairwise options) differ between them: "
             "give every process the same ring cross_device_ops options");
  }
  if (h.payload_bytes != bytes - kHdr)
    op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", p, " announced ", h.payload_bytes,
             " payload bytes but sent ", bytes - kHdr);
}

// Step 0: send this rank's fingerprint (and an optional payload) to
// `send_to`, receive the peers' from `recv_from` into one slot per rank and
// compare them with ours. Receives are checked in the order given (ring
// neighbours first). A mismatch is reported in preference to a transport
// error seen while looking for it.
void RingComm::step0(Op& op, const std::vector<int32_t>& send_to, const std::vector<int32_t>& recv_from,
                     const void* payload, size_t payload_bytes, uint64_t aux, bool wait_sends) {
  const size_t slot = round_up(kHdr + opt_.direct_max_bytes, 64);
  ensure(hdr_recv_, slot * size_t(opt_.world_size));
  write_fingerprint(op, payload_bytes, aux);
  if (payload_bytes != 0) std::memcpy(static_cast<char*>(hdr_send_.mem.data()) + kHdr, payload, payload_bytes);

  std::vector<size_t>& recvs = step0_recvs_;
  recvs.clear();
  for (int32_t p : recv_from) recvs.push_back(op.post(false, p, 0, 0, buffer_of(hdr_recv_, slot * size_t(p), slot)));
  std::vector<size_t>& sends = step0_sends_;
  sends.clear();
  for (int32_t p : send_to) sends.push_back(op.post(true, p, 0, 0, buffer_of(hdr_send_, 0, kHdr + payload_bytes)));

  // An all-reduce's aux names its algorithm (0 here, kDoublingAux + k in
  // recursive doubling); an all-gather's is the rank's own length.
  const int64_t expect_aux = op.desc().op == STRATA_COLL_ALL_REDUCE ? int64_t(aux) : -1;
  auto check = [&](int32_t p, uint64_t bytes) {
    check_fingerprint(op, p, static_cast<const char*>(hdr_recv_.mem.data()) + slot * size_t(p), bytes, expect_aux);
  };

  for (size_t i = 0; i < recvs.size(); ++i) {
    uint64_t bytes = 0;
    try {
      bytes = op.wait(recvs[i]);
    } catch (const Error&) {
      // A peer that detected a mismatch aborts; look at what already arrived
      // so that this rank reports the mismatch rather than the disconnect.
      for (size_t j = i + 1; j < recvs.size(); ++j) {
        bool done = false;
        try {
          done = op.test(recvs[j]);
        } catch (const Error&) {
          continue;
        }
        if (done) check(recv_from[j], op.req(recvs[j]).bytes);
      }
      throw;
    }
    check(recv_from[i], bytes);
  }
  // A caller that rewrites hdr_send_ next (the barrier's next round) must
  // not do so while a send of it is still queued (e.g. behind a connect).
  if (wait_sends)
    for (size_t s : sends) op.wait(s);
}


void RingComm::direct_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count) {
  const int32_t n = opt_.world_size, r = opt_.rank;
  const size_t bytes = count * sdk::dtype_size(wire);
  const std::vector<int32_t>& peers = everyone_;
  // Out of place, this rank's values are read from the caller's source
  // (sent from there and folded in from there: no copy into the output).
  Buffer own_view;
  const void* own = own_values(own_view).data();
  step0(op, peers, peers, own, bytes, 0);
  // Every rank folds the same n buffers in the same order (rank order up to
  // 3 ranks, recursive doubling's from 4), so the results are bit-identical
  // everywhere.
  const size_t slot = round_up(kHdr + opt_.direct_max_bytes, 64);
  std::vector<const void*>& ptrs = reduce_ptrs_;
  ptrs.resize(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k)
    ptrs[size_t(k)] = k == r ? own : static_cast<const char*>(hdr_recv_.mem.data()) + slot * size_t(k) + kHdr;
  if (count != 0 && n >= 4)
    fold_in_doubling_order(wire, rop, count, ptrs.data(), work_.data());
  else if (count != 0)
    sdk::kernels::reduce(rop, wire, size_t(n), ptrs.data(), work_.data(), count);
  op.finish();
}

// Recursive doubling's order (see doubling_all_reduce): first each odd rank
// r below 2 * rem combines op(v[r - 1], v[r]); then the p = n - rem values
// sit at hypercube labels (virtual rank v at label v ^ v/2) and each round k
// combines labels L and L + 2^k (L a multiple of 2^(k+1)), lower label
// first: the balanced pairwise tree over the labels, which
// sdk::kernels::reduce_tree folds in one pass over memory, each step
// rounded to the wire type as doubling's messages are.
void RingComm::fold_in_doubling_order(DLDataType wire, strata_reduce_op rop, size_t count,
                                      const void* const* vals, void* out) {
  const int32_t n = opt_.world_size;
  const int32_t p = hypercube_size(n);
  const int32_t rem = n - p;
  std::vector<const void*>& leaves = fold_ptrs_;
  leaves.assign(2 * size_t(p), nullptr);
  for (int32_t v = 0; v < p; ++v) {
    const size_t label = size_t(hypercube_label(v));
    if (v < rem) {
      leaves[2 * label] = vals[2 * v];
      leaves[2 * label + 1] = vals[2 * v + 1];
    } else {
      leaves[2 * label] = vals[v + rem];
    }
  }
  sdk::kernels::reduce_tree(rop, wire, size_t(p), leaves.data(), out, count);
}

// The direct exchange in log2 n rounds (n = 4, 8, 16): rank r swaps with
// r ^ 1, r ^ 2, ... every value its group of ranks holds so far, so each
// message is one contiguous run of blocks [fingerprint | value] in rank
// order and after the last round every rank holds all n. Each then reduces
// them in recursive doubling's order, as direct_all_reduce does: the same
// bits. Like recursive doubling, every message travels with tag 0 and each
// block's fingerprint is checked (aux kGatherAux), so there is no step 0.
void RingComm::gather_doubling_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count) {
  const int32_t n = opt_.world_size, r = opt_.rank;
  const size_t bytes = count * sdk::dtype_size(wire);
  const size_t block = round_up(kHdr + bytes, 64);
  ensure(stage_, block * size_t(n));
  Buffer own_view;
  const void* own = own_values(own_view).data();
  char* g = stage_.data();
  // Ours is what every received block is checked against (hdr_send_).
  write_fingerprint(op, bytes, kGatherAux);
  std::memcpy(g + block * size_t(r), hdr_send_.data(), kHdr);
  if (bytes != 0) std::memcpy(g + block * size_t(r) + kHdr, own, bytes);
  // Blocks are only read once written, so the sends are waited for at the end.
  std::vector<size_t>& sends = step0_sends_;
  sends.clear();
  for (int32_t d = 1; d < n; d *= 2) {
    const int32_t peer = r ^ d;
    const int32_t mine_lo = r & ~(d - 1), theirs_lo = peer & ~(d - 1);
    const size_t rq = op.post(false, peer, 0, 0, buffer_of(stage_, block * size_t(theirs_lo), block * size_t(d)));
    sends.push_back(op.post(true, peer, 0, 0, buffer_of(stage_, block * size_t(mine_lo), block * size_t(d))));
    const uint64_t got = op.wait(rq);
    if (got != block * size_t(d)) {
      // A peer in another collective: its first block's fingerprint says so.
      check_fingerprint(op, peer, g + block * size_t(theirs_lo), std::min<uint64_t>(got, kHdr + bytes),
                        int64_t(kGatherAux));
      op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", peer, " sent ", got, " bytes where ", block * size_t(d),
               " were expected");
    }
    // Each block passed on is its rank's own fingerprint and value.
    for (int32_t k = theirs_lo; k < theirs_lo + d; ++k)
      check_fingerprint(op, k, g + block * size_t(k), kHdr + bytes, int64_t(kGatherAux));
  }
  std::vector<const void*>& ptrs = reduce_ptrs_;
  ptrs.resize(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) ptrs[size_t(k)] = k == r ? own : g + block * size_t(k) + kHdr;
  if (count != 0) fold_in_doubling_order(wire, rop, count, ptrs.data(), work_.data());
  op.finish();
}

// Recursive doubling (all-reduces up to doubling_max_bytes with 4 or more
// ranks): with p the largest power of two <= n and rem = n - p, each even
// rank below 2*rem first hands its value to the odd rank above it and sits
// out; the p remaining ranks (virtual rank v, hypercube label g) then swap
// values with g ^ 1, g ^ 2, g ^ 4, ... and combine them, and the odd ranks
// finally hand the result back. Each pair combines its two values lower
// label first, so both partners hold the same bits after every round and
// all ranks end bit-identical. 2 + log2 p messages per rank, each with one
// partner.
//
// There is no step 0: every message carries the fingerprint ahead of the
// value and travels with tag 0, as step 0's do, so a peer in another
// collective (or another sequence) is reported as a mismatch, and one round
// costs one message. Its aux field numbers the message within the
// collective (kDoublingAux + 0 the hand-over, + 1 + k round k, + 1 + log2 p
// the hand-back), which catches ranks whose options pick another algorithm.
void RingComm::doubling_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count) {
  const int32_t n = opt_.world_size, r = opt_.rank;
  const size_t bytes = count * sdk::dtype_size(wire);
  const int32_t p = hypercube_size(n);
  int32_t rounds = 0;
  while ((1 << rounds) < p) ++rounds;
  const int32_t rem = n - p;
  // Room for this message or any step 0 (a peer in another collective
  // is then named by its fingerprint), but no more: a transport may wait
  // for a small receive differently from a large one (tcp polls).
  const size_t cap = kHdr + std::max<uint64_t>(bytes, opt_.direct_max_bytes);
  ensure(stage_, cap);
  // Ours is checked against the peers' from the first receive on (a rank
  // may receive before it sends); the sizing here keeps hdr_send_ in place.
  write_fingerprint(op, bytes, kDoublingAux);
  std::vector<size_t>& sends = step0_sends_;
  auto exchange = [&](int32_t peer, uint64_t msg, bool send, bool recv) {
    sends.clear();
    size_t rq = 0;
    if (recv) rq = op.post(false, peer, 0, 0, buffer_of(stage_, 0, cap));
    if (send) {
      write_fingerprint(op, bytes, kDoublingAux + msg);
      if (bytes != 0) std::memcpy(hdr_send_.data() + kHdr, work_.data(), bytes);
      sends.push_back(op.post(true, peer, 0, 0, buffer_of(hdr_send_, 0, kHdr + bytes)));
    }
    if (recv) {
      const uint64_t got = op.wait(rq);
      check_fingerprint(op, peer, stage_.data(), got, int64_t(kDoublingAux + msg));
    }
    if (send) op.wait(sends[0]);  // the next message rewrites hdr_send_
  };
  auto combine = [&](bool mine_first) {
    if (count == 0) return;
    const char* theirs = stage_.data() + kHdr;
    const void* ptrs[2] = {mine_first ? work_.data() : theirs, mine_first ? theirs : work_.data()};
    sdk::kernels::reduce(rop, wire, 2, ptrs, work_.data(), count);
  };
  int32_t v = -1;  // virtual rank; -1 while sitting out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      exchange(r + 1, 0, true, false);
    } else {
      exchange(r - 1, 0, false, true);
      combine(false);  // rank r - 1's value first
      v = r / 2;
    }
  } else {
    v = r - rem;
  }
  if (v >= 0) {
    // Virtual ranks sit on the hypercube in Gray-code order: with 4 ranks
    // both partners are ring neighbours, the ranks whose connections the
    // ring uses anyway.
    const int32_t me = hypercube_label(v);
    for (int32_t k = 0; k < rounds; ++k) {
      const int32_t pl = me ^ (1 << k);
      int32_t pv = 0;
      for (int32_t g = pl; g != 0; g >>= 1) pv ^= g;  // the inverse Gray code
      const int32_t peer = pv < rem ? 2 * pv + 1 : pv + rem;
      exchange(peer, 1 + uint64_t(k), true, true);
      combine(me < pl);
    }
  }
  if (r < 2 * rem) {
    const uint64_t last = 1 + uint64_t(rounds);
    if (r % 2 == 1) {
      exchange(r - 1, last, true, false);
    } else {
      exchange(r + 1, last, false, true);
      if (bytes != 0) std::memcpy(work_.data(), stage_.data() + kHdr, bytes);
    }
  }
  op.finish();
}

// Recursive halving, then doubling (Rabenseifner's all-reduce; n a power
// of two): the elements are cut into n blocks. In the reduce-scatter, rank r
// and rank r ^ d (d = n/2, n/4, ..., 1) split the range of blocks they share:
// each sends the half it gives up and combines the half it keeps with the
// partner's copy (lower rank's value first), so r ends owning block r reduced
// over all ranks, each element reduced by one rank only. The all-gather then
// swaps owned ranges with r ^ 1, r ^ 2, ..., doubling them. 2 log2 n steps of
// n/2, n/4, ... blocks: the ring's bytes in fewer steps.
void RingComm::halving_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count) {
  const int32_t n = opt_.world_size, r = opt_.rank;
  const size_t esize = sdk::dtype_size(wire);
  // Blocks are the ring's segments (their chunking is not used here).
  const Segments sg(count, n, chunk_bytes_, esize);
  auto off = [&](int32_t b) { return sg.off(b); };
  const std::vector<int32_t>& nb = neighbours_;
  step0(op, nb, nb, nullptr, 0, kHalvingAux);
  // This rank's own values: the caller's source when out of place (read by
  // the first step only; the all-gather fills what it sent away).
  Buffer own_view;
  const Buffer& own = own_values(own_view);
  ensure(stage_, (off(n / 2) + 1) * esize);
  auto expect = [&](uint64_t got, size_t want, int32_t peer, uint64_t step) {
    if (got != want)
      op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", peer, " sent ", got, " bytes for step ", step, " but ",
               want, " were expected");
  };
  int32_t lo = 0, hi = n;  // the blocks this rank is responsible for
  uint64_t step = 1;
  for (int32_t d = n / 2; d >= 1; d /= 2, ++step) {
    const int32_t peer = r ^ d, mid = lo + (hi - lo) / 2;
    const bool low = (r & d) == 0;
    const int32_t keep_lo = low ? lo : mid, keep_hi = low ? mid : hi;
    const int32_t give_lo = low ? mid : lo, give_hi = low ? hi : mid;
    const Buffer& from = step == 1 ? own : work_;
    const size_t keep = off(keep_hi) - off(keep_lo);
    const size_t rq = op.post(false, peer, step, 0, buffer_of(stage_, 0, keep * esize));
    const size_t sq = op.post(true, peer, step, 0,
                              buffer_of(from, off(give_lo) * esize, (off(give_hi) - off(give_lo)) * esize));
    expect(op.wait(rq), keep * esize, peer, step);
    if (keep != 0) {
      const char* mine = from.data() + off(keep_lo) * esize;
      const void* in[2] = {r < peer ? mine : stage_.data(), r < peer ? stage_.data() : mine};
      sdk::kernels::reduce(rop, wire, 2, in, work_.data() + off(keep_lo) * esize, keep);
    }
    op.wait(sq);  // the all-gather writes where it read (and stage_ is reused)
    lo = keep_lo;
    hi = keep_hi;
  }
  for (int32_t d = 1; d < n; d *= 2, ++step) {
    const int32_t peer = r ^ d, width = hi - lo;
    const int32_t their_lo = (r & d) == 0 ? hi : lo - width;
    const size_t want = (off(their_lo + width) - off(their_lo)) * esize;
    const size_t rq = op.post(false, peer, step, 0, buffer_of(work_, off(their_lo) * esize, want));
    const size_t sq = op.post(true, peer, step, 0, buffer_of(work_, off(lo) * esize, (off(hi) - off(lo)) * esize));
    expect(op.wait(rq), want, peer, step);
    op.wait(sq);
    lo = std::min(lo, their_lo);
    hi = lo + 2 * width;
  }
  op.finish();
}

// The pairwise exchange (all-reduces above direct_max_bytes and
// pairwise_min_bytes up to pairwise_max_bytes, 3 to direct_max_ranks
// ranks): the ring's reduce-scatter and all-gather with every segment sent
// straight to the rank that reduces it, so each phase is one round of n - 1
// messages per rank instead of n - 1 ring steps, and the same bytes. Rank
// g reduces segment g and folds its n values in the order the ring does
// (acc = v_g, then acc = op(v_k, acc) for k = g + 1, ..., g - 1 around the
// ring), two at a time as the ring's ranks do: the ring's bits, on any
// transport.
void RingComm::pairwise_all_reduce(Op& op, DLDataType wire, strata_reduce_op rop, size_t count) {
  const int32_t n = opt_.world_size, r = opt_.rank;
  const size_t esize = sdk::dtype_size(wire);
  const Segments sg(count, n, chunk_bytes_, esize);
  const size_t ce = sg.ce;
  const size_t mine = sg.len(r);
  const size_t nck = sg.chunks(r);
  step0(op, everyone_, everyone_, nullptr, 0, kPairwiseAux);
  Buffer own_view;
  const Buffer& own = own_values(own_view);
  auto region = [&](const Buffer& b, int32_t seg, size_t c) {
    return buffer_of(b, (sg.off(seg) + c * ce) * esize, sg.chunk_len(seg, c) * esize);
  };
  // Peer k steps around the ring from this rank: (r + k) % n, whose value
  // this rank folds k-th, lands in stage_ slot k - 1.
  ensure(stage_, size_t(n - 1) * mine * esize);
  std::vector<size_t> recvs, sends, gathers;
  recvs.reserve(size_t(n - 1) * nck);
  for (int32_t k = 1; k < n; ++k)
    for (size_t c = 0; c < nck; ++c)
      recvs.push_back(op.post(false, (r + k) % n, 1, c,
                              buffer_of(stage_, (size_t(k - 1) * mine + c * ce) * esize, sg.chunk_len(r, c) * esize)));
  // Left neighbour first: it folds this rank's value first.
  for (int32_t k = 1; k < n; ++k) {
    const int32_t p = mod(int64_t(r) - k, n);
    for (size_t c = 0; c < sg.chunks(p); ++c)
      sends.push_back(op.post(true, p, 1, c, region(own, p, c)));
  }
  // Out of place the all-gather's receives can land at once: the sends read
  // the caller's source, not work_.
  auto post_gathers = [&](int32_t p) {
    for (size_t c = 0; c < sg.chunks(p); ++c) gathers.push_back(op.post(false, p, 2, c, region(work_, p, c)));
  };
  if (src_ != nullptr)
    for (int32_t k = 1; k < n; ++k) post_gathers((r + k) % n);
  char* acc = work_.data() + sg.off(r) * esize;
  const char* first = own.data() + sg.off(r) * esize;
  for (int32_t k = 1; k < n; ++k) {
    const int32_t p = (r + k) % n;
    for (size_t c = 0; c < nck; ++c) {
      const size_t len = sg.chunk_len(r, c);
      const uint64_t got = op.wait(recvs[size_t(k - 1) * nck + c]);
      if (got != len * esize)
        op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", p, " sent ", got, " bytes for segment ", r,
                 " chunk ", c, " but ", len * esize, " were expected");
      const void* in[2] = {stage_.data() + (size_t(k - 1) * mine + c * ce) * esize,
                           (k == 1 ? first : acc) + c * ce * esize};
      sdk::kernels::reduce(rop, wire, 2, in, acc + c * ce * esize, len);
    }
  }
  if (src_ == nullptr) {
    // In place, segment p's receive may only land once its send has left.
    for (size_t s : sends) op.wait(s);
    for (int32_t k = 1; k < n; ++k) post_gathers((r + k) % n);
  }
  for (int32_t k = 1; k < n; ++k)
    for (size_t c = 0; c < nck; ++c) op.post(true, (r + k) % n, 2, c, region(work_, r, c));
  size_t i = 0;
  for (int32_t k = 1; k < n; ++k) {
    const int32_t p = (r + k) % n;
    for (size_t c = 0; c < sg.chunks(p); ++c, ++i) {
      const uint64_t got = op.wait(gathers[i]);
      if (got != sg.chunk_len(p, c) * esize)
        op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", p, " sent ", got, " bytes of its reduced segment ",
                 "(chunk ", c, ") but ", sg.chunk_len(p, c) * esize, " were expected");
    }
  }
  op.finish();
}

void RingComm::ring_reduce_scatter(Op& op, DLDataType wire, strata_reduce_op rop, size_t count, int shift) {
  const int32_t n = opt_.world_size, r = opt_.rank, right = (r + 1) % n, left = (r + n - 1) % n;
  const size_t esize = sdk::dtype_size(wire);
  const Segments sg(count, n, chunk_bytes_, esize);
  const size_t ce = sg.ce;
  char* base = work_.data();
  // This rank's own values: the caller's source when out of place (they
  // are read once, by the first send or the reduction of that segment).
  Buffer own_view;
  const Buffer& own = own_values(own_view);
  const char* own_base = own.data();

  struct Item {
    int32_t step, seg;
    size_t chunk;
  };
  std::vector<Item> items;
  for (int32_t s = 0; s + 1 < n; ++s) {
    const int32_t seg = mod(int64_t(r) - s - 1 + shift, n);
    for (size_t c = 0; c < sg.chunks(seg); ++c) items.push_back({s, seg, c});
  }
  const size_t w = recv_window_;
  // A staging slot holds one chunk, or a whole segment when that is
  // smaller: a small all-reduce does not allocate w large chunks.
  const size_t slot = std::min(ce, sg.longest()) * esize;
  ensure(stage_, std::min(w, items.size()) * slot);
  std::vector<size_t> posted(w);
  auto post_recv = [&](size_t i) {
    const Item& it = items[i];
    posted[i % w] = op.post(false, left, 1 + uint64_t(it.step), it.chunk,
                            buffer_of(stage_, (i % w) * slot, sg.chunk_len(it.seg, it.chunk) * esize));
  };
  for (size_t i = 0; i < std::min(w, items.size()); ++i) post_recv(i);

  const int32_t first = mod(int64_t(r) + shift, n);
  for (size_t c = 0; c < sg.chunks(first); ++c)
    op.post(true, right, 1, c, buffer_of(own, (sg.off(first) + c * ce) * esize, sg.chunk_len(first, c) * esize));

  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    const size_t len = sg.chunk_len(it.seg, it.chunk);
    const uint64_t got = op.wait(posted[i % w]);
    if (got != len * esize)
      op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", left, " sent ", got, " bytes for step ", it.step + 1,
               " chunk ", it.chunk, " but ", len * esize, " were expected");
    const size_t at = (sg.off(it.seg) + it.chunk * ce) * esize;
    char* dst = base + at;
    const void* in[2] = {own_base + at, static_cast<char*>(stage_.mem.data()) + (i % w) * slot};
    sdk::kernels::reduce(rop, wire, 2, in, dst, len);
    if (i + w < items.size()) post_recv(i + w);
    // The chunk just reduced is the one this rank forwards in the next step.
    if (it.step + 2 < n)
      op.post(true, right, 2 + uint64_t(it.step), it.chunk, buffer_of(work_, size_t(dst - base), len * esize));
  }
  // The all-gather writes into the regions these sends read from.
  op.finish();
}

void RingComm::ring_all_gather(Op& op, size_t esize, size_t count, int shift) {
  const int32_t n = opt_.world_size, r = opt_.rank, right = (r + 1) % n, left = (r + n - 1) % n;
  const Segments sg(count, n, chunk_bytes_, esize);
  const size_t ce = sg.ce;
  const uint64_t step_base = uint64_t(n);  // after the reduce-scatter's steps 1..n-1

  struct Item {
    int32_t step, seg;
    size_t chunk;
  };
  std::vector<Item> items;
  for (int32_t s = 0; s + 1 < n; ++s) {
    const int32_t seg = mod(int64_t(r) + shift - s, n);
    for (size_t c = 0; c < sg.chunks(seg); ++c) items.push_back({s, seg, c});
  }
  auto region = [&](int32_t seg, size_t c) {
    return buffer_of(work_, (sg.off(seg) + c * ce) * esize, sg.chunk_len(seg, c) * esize);
  };
  const size_t w = std::max<size_t>(recv_window_, 16);
  std::vector<size_t> posted(items.size());
  for (size_t i = 0; i < std::min(w, items.size()); ++i)
    posted[i] = op.post(false, left, step_base + items[i].step, items[i].chunk, region(items[i].seg, items[i].chunk));
  const int32_t mine = mod(int64_t(r) + 1 + shift, n);
  for (size_t c = 0; c < sg.chunks(mine); ++c) op.post(true, right, step_base, c, region(mine, c));
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    const uint64_t got = op.wait(posted[i]);
    if (got != sg.chunk_len(it.seg, it.chunk) * esize)
      op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", left, " sent ", got, " bytes for all-gather step ",
               it.step, " chunk ", it.chunk, " but ", sg.chunk_len(it.seg, it.chunk) * esize, " were expected");
    if (i + w < items.size())
      posted[i + w] = op.post(false, left, step_base + items[i + w].step, items[i + w].chunk,
                              region(items[i + w].seg, items[i + w].chunk));
    if (it.step + 2 < n) op.post(true, right, step_base + it.step + 1, it.chunk, region(it.seg, it.chunk));
  }
}

void RingComm::all_reduce(const CollectiveDesc& d, DLDataType wire, strata_reduce_op rop, size_t count,
                          void* data) {
  const size_t bytes = count * sdk::dtype_size(wire);
  if (requires_mr_) {
    // Registered memory only: stage through the work buffer.
    ensure(work_, bytes);
    if (bytes != 0) std::memcpy(work_.mem.data(), data, bytes);
    all_reduce(d, wire, rop, count);
    if (bytes != 0) std::memcpy(data, work_.mem.data(), bytes);
    return;
  }
  struct Borrow {
    Buffer& b;
    ~Borrow() { b.borrowed = nullptr; }
  } borrow{work_};
  work_.borrowed = static_cast<char*>(data);
  all_reduce(d, wire, rop, count);
}

void RingComm::all_reduce(const CollectiveDesc& d, DLDataType wire, strata_reduce_op rop, size_t count, void* data,
                          const void* src) {
  const size_t bytes = count * sdk::dtype_size(wire);
  const char* s = static_cast<const char*>(src);
  const char* o = static_cast<const char*>(data);
  // Recursive doubling works in place (it sends this rank's value as it goes).
  if (src == data || bytes == 0 || requires_mr_ || bytes <= doubling_max_bytes_ ||
      (s < o + bytes && o < s + bytes)) {
    if (src != data && bytes != 0) std::memmove(data, src, bytes);
    all_reduce(d, wire, rop, count, data);
    return;
  }
  struct Source {
    const char*& p;
    ~Source() { p = nullptr; }
  } source{src_};
  src_ = s;
  all_reduce(d, wire, rop, count, data);
}

void RingComm::all_reduce(const CollectiveDesc& d, DLDataType wire, strata_reduce_op rop, size_t count) {
  diagnosed([&] { all_reduce_impl(d, wire, rop, count); });
}

void RingComm::all_reduce_impl(const CollectiveDesc& d, DLDataType wire, strata_reduce_op rop, size_t count) {
  Op op(*this, d);
  const size_t bytes = count * sdk::dtype_size(wire);
  if (work_.borrowed == nullptr) ensure(work_, bytes);
  if (bytes <= doubling_max_bytes_) {
    doubling_all_reduce(op, wire, rop, count);
    return;
  }
  if (bytes <= opt_.direct_max_bytes) {
    if (direct_in_rounds_)
      gather_doubling_all_reduce(op, wire, rop, count);
    else
      direct_all_reduce(op, wire, rop, count);
    return;
  }
  if (bytes <= halving_max_bytes_) {
    halving_all_reduce(op, wire, rop, count);
    return;
  }
  if (bytes > opt_.pairwise_min_bytes && bytes <= pairwise_max_bytes_) {
    pairwise_all_reduce(op, wire, rop, count);
    return;
  }
  const std::vector<int32_t>& nb = neighbours_;
  step0(op, nb, nb, nullptr, 0, kRingAux);
  ring_reduce_scatter(op, wire, rop, count, 0);
  ring_all_gather(op, sdk::dtype_size(wire), count, 0);
  op.finish();
}

void RingComm::reduce_scatter(const CollectiveDesc& d, DLDataType wire, strata_reduce_op rop, size_t count) {
  diagnosed([&] { reduce_scatter_impl(d, wire, rop, count); });
}

void RingComm::reduce_scatter_impl(const CollectiveDesc& d, DLDataType wire, strata_reduce_op rop, size_t count) {
  Op op(*this, d);
  if (count % size_t(opt_.world_size) != 0)
    op.raise(STRATA_ERR_INVALID_ARGUMENT, op.prefix(), ": ", count, " elements do not split into ",
             opt_.world_size, " equal parts");
  ensure(work_, count * sdk::dtype_size(wire));
  const std::vector<int32_t>& nb = neighbours_;
  step0(op, nb, nb, nullptr, 0, 0);
  // Shift -1: rank r ends up owning segment r.
  ring_reduce_scatter(op, wire, rop, count, -1);
  op.finish();
}

void RingComm::broadcast(const CollectiveDesc& d, size_t bytes) {
  diagnosed([&] { broadcast_impl(d, bytes); });
}

void RingComm::broadcast_impl(const CollectiveDesc& d, size_t bytes) {
  Op op(*this, d);
  ensure(work_, bytes);
  const int32_t n = opt_.world_size, r = opt_.rank;
  const std::vector<int32_t>& nb = neighbours_;
  if (bytes <= opt_.direct_max_bytes) {
    // Rank 0 sends the value with its fingerprint to everyone.
    if (r == 0) {
      step0(op, everyone_, nb, work_.mem.data(), bytes, 0);
    } else {
      std::vector<int32_t> from = nb;
      if (std::find(from.begin(), from.end(), 0) == from.end()) from.push_back(0);
      step0(op, nb, from, nullptr, 0, 0);
      // Rank 0's slot is the first one.
      if (bytes != 0) std::memcpy(work_.mem.data(), static_cast<char*>(hdr_recv_.mem.data()) + kHdr, bytes);
    }
    op.finish();
    return;
  }
  step0(op, nb, nb, nullptr, 0, 0);
  // A pipelined chain 0 -> 1 -> ... -> n-1, one chunk at a time.
  const int32_t right = (r + 1) % n, left = (r + n - 1) % n;
  const size_t ce = std::max<size_t>(chunk_bytes_, (bytes + kMaxChunks - 2) / (kMaxChunks - 1));
  const size_t chunks = (bytes + ce - 1) / ce;
  auto region = [&](size_t c) { return buffer_of(work_, c * ce, std::min(ce, bytes - c * ce)); };
  if (r == 0) {
    for (size_t c = 0; c < chunks; ++c) op.post(true, right, 1, c, region(c));
  } else {
    const size_t w = std::max<size_t>(recv_window_, 16);
    std::vector<size_t> posted(chunks);
    for (size_t c = 0; c < std::min(w, chunks); ++c) posted[c] = op.post(false, left, 1, c, region(c));
    for (size_t c = 0; c < chunks; ++c) {
      const uint64_t got = op.wait(posted[c]);
      if (got != region(c).bytes)
        op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", left, " sent ", got, " bytes for chunk ", c,
                 " but ", region(c).bytes, " were expected");
      if (c + w < chunks) posted[c + w] = op.post(false, left, 1, c + w, region(c + w));
      if (right != 0) op.post(true, right, 1, c, region(c));
    }
  }
  op.finish();
}

const void* RingComm::all_gather(const CollectiveDesc& d, size_t block_bytes, uint64_t axis_len,
                                 std::vector<uint64_t>& axis_lens) {
  return diagnosed([&] { return all_gather_impl(d, block_bytes, axis_len, axis_lens); });
}

const void* RingComm::all_gather_impl(const CollectiveDesc& d, size_t block_bytes, uint64_t axis_len,
                                      std::vector<uint64_t>& axis_lens) {
  Op op(*this, d);
  const int32_t n = opt_.world_size, r = opt_.rank;
  const size_t esize = sdk::dtype_size(d.dtype);
  const uint64_t row = d.outer * d.inner * esize;  // bytes per unit of axis length
  ensure(work_, block_bytes);
  const std::vector<int32_t>& peers = everyone_;
  const bool inline_mine = block_bytes <= opt_.direct_max_bytes;
  step0(op, peers, peers, work_.mem.data(), inline_mine ? block_bytes : 0, axis_len);

  const size_t slot = round_up(kHdr + opt_.direct_max_bytes, 64);
  axis_lens.assign(size_t(n), 0);
  std::vector<size_t> bytes(static_cast<size_t>(n)), offset(static_cast<size_t>(n) + 1, 0);
  for (int32_t k = 0; k < n; ++k) {
    if (k == r) {
      axis_lens[size_t(k)] = axis_len;
    } else {
      WireHeader h{};
      std::memcpy(&h, static_cast<char*>(hdr_recv_.mem.data()) + slot * size_t(k), kHdr);
      axis_lens[size_t(k)] = h.aux;
    }
    bytes[size_t(k)] = size_t(axis_lens[size_t(k)] * row);
    offset[size_t(k) + 1] = offset[size_t(k)] + bytes[size_t(k)];
  }
  ensure(gather_, offset[size_t(n)]);
  char* g = static_cast<char*>(gather_.mem.data());
  if (block_bytes != 0) std::memcpy(g + offset[size_t(r)], work_.mem.data(), block_bytes);
  for (int32_t k = 0; k < n; ++k)
    if (k != r && bytes[size_t(k)] <= opt_.direct_max_bytes && bytes[size_t(k)] != 0)
      std::memcpy(g + offset[size_t(k)], static_cast<char*>(hdr_recv_.mem.data()) + slot * size_t(k) + kHdr,
                  bytes[size_t(k)]);

  // Blocks too large for step 0 travel directly to every rank in chunks,
  // in rounds small enough for the transport's in-flight limit.
  const size_t ce = std::max<size_t>(chunk_bytes_, (offset[size_t(n)] + kMaxChunks - 2) / (kMaxChunks - 1));
  size_t max_chunks = 0;
  for (int32_t k = 0; k < n; ++k)
    if (bytes[size_t(k)] > opt_.direct_max_bytes) max_chunks = std::max(max_chunks, (bytes[size_t(k)] + ce - 1) / ce);
  const size_t round = std::max<size_t>(1, std::min<size_t>(recv_window_, send_window_) * 4);
  for (size_t c0 = 0; c0 < max_chunks; c0 += round) {
    std::vector<size_t> recvs;
    for (size_t c = c0; c < std::min(max_chunks, c0 + round); ++c) {
      for (int32_t k : peers) {
        const size_t b = bytes[size_t(k)];
        if (b <= opt_.direct_max_bytes || c * ce >= b) continue;
        recvs.push_back(op.post(false, k, 1, c, buffer_of(gather_, offset[size_t(k)] + c * ce, std::min(ce, b - c * ce))));
      }
      if (!inline_mine && c * ce < block_bytes)
        for (int32_t k : peers)
          op.post(true, k, 1, c, buffer_of(gather_, offset[size_t(r)] + c * ce, std::min(ce, block_bytes - c * ce)));
    }
    for (size_t i : recvs) {
      const uint64_t got = op.wait(i);
      if (got != op.req(i).expect)
        op.raise(STRATA_ERR_DATA_LOSS, op.prefix(), ": rank ", op.req(i).peer, " sent ", got, " bytes for chunk ",
                 op.req(i).chunk, " but ", op.req(i).expect, " were expected");
    }
    op.finish();
  }
  op.finish();
  return gather_.mem.data();
}

void RingComm::barrier() {
  diagnosed([&] { barrier_impl(); });
}

void RingComm::barrier_impl() {
  CollectiveDesc d;
  d.op = STRATA_COLL_BARRIER;
  d.dtype = DLDataType{kDLUInt, 8, 1};
  Op op(*this, d);
  const int32_t n = opt_.world_size, r = opt_.rank;
  if (n <= opt_.direct_max_ranks) {
    const std::vector<int32_t>& peers = everyone_;
    step0(op, peers, peers, nullptr, 0, 0);
  } else {
    // A dissemination barrier: in round k every rank tells rank + 2^k and
    // hears from rank - 2^k, so after ceil(log2 n) rounds each has heard,
    // through others, from every rank. Each pair meets at most once per
    // direction (the distances differ), so one tag serves every round.
    for (int32_t k = 1; k < n; k *= 2) step0(op, {(r + k) % n}, {(r + n - k) % n}, nullptr, 0, 0, /*wait_sends=*/true);
  }
  op.finish();
}

}  // namespace strata::plugins::ring
