// SPDX-License-Identifier: Apache-2.0
#include "tcp_transport.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <boost/asio.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "frame.h"
#include "../common/wait_pacer.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/rendezvous.hpp"

namespace strata::transport::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using detail::str_cat;

namespace {

constexpr uint64_t kStripeMinBytes = 256 << 10;  // smallest stripe of a striped message
// The ring's chunk over tcp. Every chunk costs the waiting thread a
// hand-off from the io thread; at 4 MiB (2 ranks on the 2-core VM, 3
// alternating rounds, medians) 4-64 MiB all-reduces took 0.84-0.99x the
// time they took with 1 MiB chunks (4 ranks: 0.88-0.92x at 16-64 MiB).
constexpr uint64_t kPreferredChunkBytes = 4 << 20;
// Staging buffers of unexpected messages are kept for reuse up to this many
// bytes and buffers: a ring sends a step's chunks before the peer posts
// their receives, so every large collective stages a few of them, and a
// fresh allocation each time costs a page fault per 4 KiB (first touch runs
// at a third of memcpy's speed here) plus the zero fill of a std::vector.
constexpr uint64_t kSpareStagingBytes = 64ull << 20;
constexpr size_t kSpareStagingBuffers = 32;
// Waits for messages up to this size may poll (see wait()); larger ones
// block in the reactor. 128 KiB and a few headers: the ring's direct
// all-reduce (64 KiB and its header, posted as one receive) and its
// 64-128 KiB ring chunks then poll; with 64 KiB exactly they missed it by
// their headers, and 2-rank all-reduces of 64-256 KiB were up to 2x slower
// (idle 2-core machine, alternating runs).
constexpr uint64_t kPollMaxBytes = (128 << 10) + 4096;
// The same while this job's ranks on this machine outnumber its cores
// (crowded_by_job_), where the wait yield-polls: up to 256 KiB and a few
// headers, the ring's chunks of a 4-rank 1 MiB all-reduce. 4 ranks on the
// 2-core VM, alternating with 128 KiB in 8-round runs, medians of each
// round's ratio: 1 MiB 0.84-0.91x the time idle (Open MPI's 981 us against
// 1,039 us after, 1,248 us before), 512 KiB and 2 MiB 0.99-1.02x, 8 ranks
// 2 MiB 0.96x; beside two busy loops 1 MiB 1.11x (6 rounds). Up to 1 MiB
// (the pairwise exchange's 512 KiB segments at 2 MiB) gained nothing more.
constexpr uint64_t kCrowdedPollMaxBytes = (256 << 10) + 4096;
// Frames up to this size are written by the posting thread when the
// connection is idle (try_send_inline_locked); larger ones by the io thread
// or a waiter running the reactor. Handing a frame over costs a wake-up,
// and the frame is written only once a thread runs the reactor, while the
// peer waits for it. Above 1 MiB the copy into the kernel is better left to
// overlap with the caller's own receive: 2 MiB-64 MiB 2-rank all-reduces
// (2-4 MiB frames) were 5-15% slower with every frame inline. 1 MiB and a
// few headers holds a 1 MiB ring chunk. Measured (2-core VM, 4
// alternating rounds, medians; inline up to 132 KiB before): 2-rank
// all-reduces of 512 KiB-2 MiB (256 KiB-1 MiB frames) 0.6-0.76x the time.
// mu_ is held for the copy, at most 1 MiB.
constexpr uint64_t kInlineSendMaxBytes = (1 << 20) + 4096;

// Completion condition "all of it" without asio::transfer_all()'s cap of
// 64 KiB per system call: a 1 MiB frame would otherwise take 16 sendmsg or
// recvmsg calls (each often a reactor round trip) instead of one or two.
struct TransferAllLarge {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const {
    return ec ? 0 : std::size_t(1) << 30;
  }
};

bool split_host_port(const std::string& a, std::string* host, uint16_t* port) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= a.size()) return false;
  std::string h = a.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  char* end = nullptr;
  const long p = std::strtol(a.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) return false;
  *host = h;
  *port = static_cast<uint16_t>(p);
  return true;
}

std::string join_host_port(const std::string& host, uint16_t port) {
  return host.find(':') != std::string::npos ? str_cat("[", host, "]:", port) : str_cat(host, ":", port);
}

// The local address the kernel would use to reach `host` (no packet is sent).
std::string route_to(const std::string& host, bool ipv6) {
  try {
    asio::io_context io;
    tcp::resolver resolver(io);
    auto results = resolver.resolve(ipv6 ? tcp::v6() : tcp::v4(), host, "9");
    for (const auto& r : results) {
      asio::ip::udp::socket s(io);
      boost::system::error_code ec;
      const asio::ip::udp::endpoint ep(r.endpoint().address(), 9);
      s.open(ep.protocol(), ec);
      if (!ec) s.connect(ep, ec);
      if (!ec) return s.local_endpoint().address().to_string();
    }
  } catch (const std::exception&) {
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------- requests ---

struct Request {
  bool is_send = false;
  int32_t peer = -1;
  uint64_t tag = 0;
  char* data = nullptr;
  uint64_t bytes = 0;
  uint64_t seq = 0;          // sends: message number to this peer
  uint64_t moved = 0;        // bytes delivered when finished
  int pending_frames = 0;    // sends: frames not yet written
  int io_refs = 0;           // frames being read/written into/from `data` right now, or queued
  bool finished = false;
  // visible() (finished and no frame uses `data`), published for a waiting
  // thread that watches without mu_: a watcher that took mu_ on every poll
  // collided with the handlers that take it (a 2-rank 1 MiB all-reduce:
  // about 34 context switches per call, 40 % of them in futex calls for
  // mutexes). Written under mu_ by settle_locked; the waiter then takes mu_.
  std::atomic<bool> done{false};
  strata_status_t status = STRATA_OK;
  std::string error;
};

// Bytes of an unexpected message (its InMsg::total of them are in use and
// counted in unexpected_bytes_ while `data` is set). Not zero-filled: a
// frame writes every byte before the message completes and is copied out.
struct Staging {
  std::unique_ptr<char[]> data;
  uint64_t capacity = 0;
};

// One incoming message, from its first frame until its receive has it all.
struct InMsg {
  uint64_t tag = 0;
  uint64_t total = 0;
  uint64_t received = 0;
  Request* req = nullptr;     // matched receive, or null (unexpected / orphaned)
  bool direct = false;        // bytes go straight into req->data
  bool orphan = false;        // its receive was cancelled or failed: drop when complete
  Staging staging;            // when !direct
};

struct SendFrame {
  std::array<uint8_t, kFrameHeaderBytes> header;
  const char* data;
  uint64_t length;
  Request* req;
  uint64_t sent = 0;  // bytes of header + payload already written (by an inline send)
};

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    STRATA_THROW(STRATA_ERR_INTERNAL, "tcp transport: the system random generator failed (OpenSSL RAND_bytes)");
  return out;
}

// The handshake MAC (frame.h): over the encoded fields and both nonces.
std::string handshake_mac(const std::string& secret, const char* role, const uint8_t* fields,
                          const std::string& acceptor_nonce, const std::string& nonce) {
  std::string msg = std::string("strata-tcp-2 ") + role;
  msg.append(reinterpret_cast<const char*>(fields), kHandshakeFieldBytes);
  msg += acceptor_nonce;
  msg += nonce;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) == nullptr)
    STRATA_THROW(STRATA_ERR_INTERNAL, "tcp transport: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// Connections accepted but not yet through their handshake, at most, on
// top of one set per other rank (with lazy connections any rank may connect
// at any time, all at once in an all-to-all): more (a flood of idle
// strangers) drop the oldest, so fds stay bounded and a real peer's
// connection is always read.
constexpr size_t kMaxPendingHandshakes = 64;
// How long a receive from a lower rank waits for it to connect before this
// rank connects itself (see link_locked).
constexpr std::chrono::milliseconds kHigherRankConnectDelay{100};
// How long the io thread stays parked after the last waiting thread stopped
// polling with its request done, and how often a parked io thread looks
// again (see io_loop).
constexpr std::chrono::microseconds kIoLinger{250};
// How long a waiting thread blocked in the reactor stays there without any
// handler running before it hands the reactor back to the io thread and
// sleeps on its condition (see progress_blocking).
constexpr std::chrono::milliseconds kBlockIdle{2};
// The longest a parked io thread sleeps before it looks again (see io_loop).
constexpr std::chrono::microseconds kIoParkMax{2000};
// Bytes a connection reads ahead into its receive buffer: a small frame's
// header and payload arrive in one recv (two before, plus the reactor's
// turn in between), and a large frame's payload past this prefix is read
// straight into its destination, so at most this much of it is copied.
constexpr size_t kRxBufferBytes = 8 << 10;
// A payload with at least kLowatMinBytes still to come is read by
// read_payload, which sets SO_RCVLOWAT to what is left (at most
// kLowatMaxBytes) while it waits, so the reactor wakes once the rest is
// queued instead of on every 64 KiB segment the sender's kernel delivers
// (each a wake-up, an epoll_wait and a recv). Measured on the 2-core VM (7
// alternating rounds, medians of each round's ratio, 08:03-08:06, load from
// the ranks themselves): 2 ranks 4-64 MiB all-reduces 0.86-0.98x the time,
// 4 ranks 2-64 MiB 0.89-0.99x. From 64 KiB on, 2-rank 2 MiB ones (512 KiB
// frames) took 1.09-1.20x: there the receiver's copy no longer overlapped
// the sender's.
constexpr size_t kLowatMinBytes = 768 << 10;
constexpr size_t kLowatMaxBytes = 1 << 20;

struct Conn {
  explicit Conn(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  int peer = -1;
  int index = 0;
  // Read-ahead (kRxBufferBytes): bytes [rx_begin, rx_end) of rx_buf are
  // received and not yet consumed; frames are parsed from here.
  std::unique_ptr<uint8_t[]> rx_buf{new uint8_t[kRxBufferBytes]};
  size_t rx_begin = 0, rx_end = 0;
  FrameHeader rx{};
  bool parked = false;  // holds rx for a message whose lower-numbered predecessors are unknown
  bool eof = false;     // the peer closed this connection cleanly
  bool abandoned = false;  // lost a simultaneous-connect race (or its peer failed): ignore its handlers
  std::deque<SendFrame> sendq;
  bool writing = false;
  int lowat = 1;  // SO_RCVLOWAT now set on the socket (read_payload)
  std::array<uint8_t, kFrameHeaderBytes + kHandshakeBytes> hs{};  // handshake I/O
  std::string hs_nonce;  // connecting side: this connection's nonce
};

// Where the connections to one peer stand. kNone until this rank sends to
// or receives from the peer (or the peer connects); kConnecting while our
// own connections' handshakes run; kAccepting while the peer's do (it
// connected first, or won the race: the lower rank's connections win);
// kReady once all connections_per_peer are through, for the communicator's
// lifetime.
enum class Link : uint8_t { kNone, kConnecting, kAccepting, kReady };

struct Peer {
  std::string address;
  tcp::endpoint endpoint;
  std::vector<std::unique_ptr<Conn>> conns;  // the ready connections (empty before kReady)
  Link link = Link::kNone;
  std::vector<std::unique_ptr<Conn>> out;  // kConnecting: ours, by index
  std::vector<std::unique_ptr<Conn>> in;   // kAccepting: the peer's, by index (null until it arrives)
  int handshakes_done = 0;                 // of `out` or `in`
  std::deque<Request*> unsent;             // sends posted before kReady, in seq order
  std::unique_ptr<asio::steady_timer> link_timer;   // bounds kConnecting/kAccepting
  std::unique_ptr<asio::steady_timer> defer_timer;  // a higher rank's delayed connect (link_locked)
  uint64_t send_seq = 0;
  uint64_t next_announce = 0;  // lowest incoming seq not seen yet
  std::map<uint64_t, std::unique_ptr<InMsg>> msgs;
  std::unordered_map<uint64_t, std::deque<Request*>> posted;      // unmatched receives by tag
  std::unordered_map<uint64_t, std::deque<uint64_t>> unexpected;  // unmatched messages by tag
  bool failed = false;
  strata_status_t fail_code = STRATA_OK;
  std::string fail_reason;
};

// ---------------------------------------------------------------- comm ---

class TcpComm : public sdk::CommBase {
 public:
  TcpComm(sdk::Host host, const Options& opts, std::string name, int32_t rank, int32_t world)
      : host_(std::move(host)), opts_(opts), name_(std::move(name)), rank_(rank), world_(world),
        peers_(static_cast<size_t>(world)) {}
  ~TcpComm() override;

  void setup(int64_t timeout_ms);

  void abort(const char* reason) noexcept override {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      const std::string why = str_cat("communicator '", name_, "' aborted: ", reason);
      for (int p = 0; p < world_; ++p)
        if (p != rank_) fail_peer_locked(p, STRATA_ERR_ABORTED, why, false);
    } catch (...) {
    }
  }
  strata_mem_region_t mem_register(void* data, uint64_t bytes, DLDevice device) override {
    if (device.device_type != kDLCPU)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the tcp transport moves host memory only (got device type ",
                   static_cast<int>(device.device_type), "); stage device buffers in host memory");
    // No registration is needed for sockets; hand back a non-null token.
    return reinterpret_cast<strata_mem_region_t>(&region_token_);
  }
  void mem_deregister(strata_mem_region_t) noexcept override {}
  strata_request_t isend(int32_t peer, uint64_t tag, const strata_buffer& buf) override;
  strata_request_t irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) override;
  bool test(strata_request_t req, uint64_t* bytes) override;
  uint64_t wait(strata_request_t req, int64_t timeout_ms) override;
  void cancel(strata_request_t req) noexcept override;

 private:
  std::string peer_name(int p) const { return str_cat("rank ", p, " (", peers_[p].address, ")"); }
  std::string describe(const Request& r) const {
    return r.is_send ? str_cat("isend #", r.seq, " to ", peer_name(r.peer), " (tag ", r.tag, ", ", r.bytes, " bytes)")
                     : str_cat("irecv from ", peer_name(r.peer), " (tag ", r.tag, ", up to ", r.bytes, " bytes)");
  }
  void check_buffer(int32_t peer, const strata_buffer& buf, const char* op) const;
  Request* lookup_locked(strata_request_t h) const {
    auto* r = reinterpret_cast<Request*>(h);
    if (h == nullptr || live_.count(r) == 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "request ", static_cast<void*>(h),
                   " is not a live request of communicator '", name_, "' (already released?)");
    return r;
  }
  static bool visible(const Request& r) { return r.finished && r.io_refs == 0; }
  // After r changed: once visible, publish it (Request::done) and wake the
  // threads waiting on cv_ (wait, cancel), once: no frame starts on a
  // visible request, so it stays visible.
  void settle_locked(Request* r) {
    if (!visible(*r) || r->done.load(std::memory_order_relaxed)) return;
    r->done.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  uint64_t release_locked(Request* r);  // deletes r; throws its error
  void detach_locked(Request* r);       // no in-flight message may point at r after this
  void finish_locked(Request* r, strata_status_t code, const std::string& error);
  void fail_peer_locked(int p, strata_status_t code, const std::string& reason, bool log);
  void start_write_locked(Conn* c);
  void write_next(Conn* c);
  void read_header(Conn* c);
  bool process_header(Conn* c);  // true: the payload is in (read-ahead, or read at once) and done
  bool on_payload(Conn* c, InMsg* m, Request* user_req, const boost::system::error_code& ec);
  bool read_payload(Conn* c, InMsg* m, Request* user_req, char* dest, size_t left);
  void on_io_error(Conn* c, const boost::system::error_code& ec, const char* what);
  void complete_msg_locked(int p, uint64_t seq, InMsg* m);
  // A staging buffer of `bytes` (the smallest spare one that fits, else a
  // new one) and its return to the spares (kSpareStagingBytes/_Buffers).
  Staging take_staging_locked(uint64_t bytes);
  void recycle_staging_locked(Staging&& s);
  bool try_send_inline_locked(Conn* c, SendFrame& f);
  void match_posted_locked(Peer& peer, Request* r);
  void issue_send_locked(Peer& p, Request* r);

  // Connections (lazy by default): see "Link". All socket work below runs in
  // handlers (the io thread, or a waiting thread that polls: see io_loop);
  // link_locked may be called from any thread.
  void link_locked(int p, bool for_send);
  void connect_peer(int p);
  void on_connected(Conn* c, const boost::system::error_code& ec);
  void on_answer(Conn* c, const boost::system::error_code& ec);
  void accept_next();
  void on_peer_handshake(Conn* c, const boost::system::error_code& ec);
  void answer_locked(Conn* c, const Handshake& theirs, bool decline);
  void abandon_locked(std::vector<std::unique_ptr<Conn>>& conns);
  void start_link_timer_locked(int p);
  void ready_locked(int p, std::vector<std::unique_ptr<Conn>> conns);

  // Progress: who runs the Asio handlers (see io_loop).
  void io_loop();
  size_t run_handlers_locked(Clock::time_point until) noexcept;
  size_t poll_progress() noexcept;
  bool progress_polling(Request* r, transport::WaitPacer& pacer, bool always, Clock::time_point deadline);
  bool progress_blocking(Request* r, Clock::time_point deadline);
  void start_polling();
  void stop_polling(bool linger);
  void resume_io();
  void stop_io();
  void tune(tcp::socket& s) const;
  std::string check_hs(const Conn& c, Handshake* hs, uint16_t* flags) const;
  void my_hs(Conn& c, uint16_t flags, const char* role, const std::string& acceptor_nonce,
             const std::string& nonce) const;
  bool signed_by_peer(const Conn& c, const Handshake& hs, const char* role, const std::string& acceptor_nonce) const;

  sdk::Host host_;
  Options opts_;
  std::string name_;
  int32_t rank_, world_;
  asio::io_context io_;  // first: destroyed after every socket
  std::vector<Peer> peers_;
  // Handshake context, fixed after the rendezvous.
  int nconn_ = 1;
  uint64_t hash_ = 0;
  std::string who_, secret_, my_nonce_;
  std::vector<std::string> nonces_;
  // The acceptor lives as long as the communicator; strangers and losers of a
  // race are dropped. `handshaking_` (accepted, answer not yet written) and
  // `unverified_` (handshake not read yet, oldest first) belong to the thread
  // running handlers (progress_mu_).
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  std::unordered_map<Conn*, std::unique_ptr<Conn>> handshaking_;
  std::deque<Conn*> unverified_;
  size_t max_pending_ = kMaxPendingHandshakes;
  bool accept_error_logged_ = false;
  std::vector<std::unique_ptr<Conn>> graveyard_;  // abandoned (closed) until their handlers ran; under mu_
  std::thread thread_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  char region_token_ = 0;

  // Handlers run in one thread at a time, the one holding progress_mu_: the
  // io thread (around run_one) or a waiting thread (around poll). Lock order:
  // progress_mu_, then park_mu_ or mu_; never mu_ then progress_mu_.
  std::mutex progress_mu_;
  std::mutex park_mu_;
  std::condition_variable park_cv_;   // wakes a parked io thread
  std::atomic<int> pollers_{0};        // threads polling in wait(); written under park_mu_
  bool io_running_ = false;            // the io thread is in (or entering) run_one; under park_mu_
  Clock::time_point resume_at_{};      // the io thread stays parked until then; under park_mu_
  // More ranks of this communicator on this machine than this process may
  // use cores: small waits may yield-poll (see wait()). Set at setup.
  bool crowded_by_job_ = false;
  std::atomic<uint64_t> waits_{0};     // wait() calls that had to wait
  std::atomic<uint64_t> waits_self_{0};  // ... of which the waiting thread's own poll completed

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_set<Request*> live_;
  uint64_t unexpected_bytes_ = 0;
  std::vector<Staging> spare_staging_;  // reusable staging buffers, under mu_
  uint64_t spare_staging_bytes_ = 0;
  bool aborted_ = false;
};

TcpComm::~TcpComm() {
  abort("communicator destroyed");
  if (thread_.joinable()) {
    work_.reset();
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      accept_retry_.cancel();
      stop_io();
    });
    {
      // A parked io thread runs it now, not after its linger.
      std::lock_guard<std::mutex> lock(park_mu_);
      resume_at_ = Clock::time_point{};
    }
    park_cv_.notify_all();
    thread_.join();
  }
  // Read by tcp_test (WaitingThreadsDriveProgress) at debug level.
  if (waits_.load() != 0)
    host_.debug(who_, ": ", waits_self_.load(), " of ", waits_.load(),
                " waits completed by the waiting thread's own progress");
  for (Request* r : live_) delete r;
}

// ------------------------------------------------------------- progress ---
//
// Why. With only the io thread running handlers, every incoming message cost
// its wake-up from epoll_wait (tens of us on a loaded VM) before the waiting
// thread could even be told. So a thread in wait() runs the handlers itself
// while it polls (io_.poll(): epoll_wait with timeout 0 and the ready
// handlers, in its own thread), and the io thread steps aside meanwhile:
// - progress_mu_ keeps handlers from running concurrently, as before: the
//   io thread holds it around run_one(), a waiter only try_locks it;
// - while pollers_ > 0 the io thread does not enter run_one but parks on
//   park_cv_; the first poller kicks it out of epoll_wait (an empty posted
//   handler interrupts the reactor), in parallel with the network round
//   trip rather than on its critical path;
// - a waiter that should not poll (a large message, or no free core) runs
//   the reactor blocked in epoll_wait instead (progress_blocking), with
//   the io thread parked likewise (see wait());
// - a waiter whose request finished leaves the io thread parked for
//   kIoLinger more (a ring waits back to back; waking the io thread between
//   two waits would only take a core from the peer); one about to sleep on
//   cv_ resumes it at once. A parked io thread looks again after
//   kIoLinger, then less often while waiters keep the reactor (up to
//   kIoParkMax apart), so bytes that nobody waits for (a large isend while
//   the caller computes) still move.
// Handlers must therefore not assume the io thread runs them (no thread ids
// or thread_locals); they do not.

void TcpComm::io_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(park_mu_);
      // While a waiter keeps the reactor (a long blocking wait), look again
      // less and less often, up to kIoParkMax apart.
      auto look = kIoLinger;
      for (;;) {
        if (io_.stopped()) return;
        const auto now = Clock::now();
        if (pollers_.load(std::memory_order_relaxed) == 0 && now >= resume_at_) break;
        park_cv_.wait_until(lock, std::max(resume_at_, now + look));
        look = std::min<std::chrono::microseconds>(look * 2, kIoParkMax);
      }
      io_running_ = true;
    }
    {
      std::lock_guard<std::mutex> progress(progress_mu_);
      // A waiter that started polling after the check above kicked us; let it.
      if (pollers_.load(std::memory_order_relaxed) == 0) {
        try {
          io_.run_one();
        } catch (const std::exception& e) {
          host_.error("communicator '", name_, "' io thread: ", e.what());
        }
      }
    }
    std::lock_guard<std::mutex> lock(park_mu_);
    io_running_ = false;
  }
}

// Runs handlers in a waiting thread that holds progress_mu_: those ready
// now when `until` is the epoch (io_.poll), else the first one to become
// ready before `until`, blocked in epoll_wait meanwhile (io_.run_one_until).
// Returns how many ran; after stop() 0 at once.
size_t TcpComm::run_handlers_locked(Clock::time_point until) noexcept {
  try {
    return until == Clock::time_point{} ? io_.poll() : io_.run_one_until(until);
  } catch (const std::exception& e) {
    try {
      host_.error("communicator '", name_, "' io handler (run by a waiting thread): ", e.what());
    } catch (...) {
    }
    return 1;
  }
}

// Runs the handlers that are ready, unless another thread is running them.
// Returns how many ran. After stop() it returns 0 at once.
size_t TcpComm::poll_progress() noexcept {
  std::unique_lock<std::mutex> progress(progress_mu_, std::try_to_lock);
  return progress.owns_lock() ? run_handlers_locked(Clock::time_point{}) : 0;
}

// A waiting thread polls the reactor while `pacer` says it pays (busy
// while cores are free; yielding while they are not and yields come back
// soon; with "poll": "always" both, whatever the load), restarted by every
// poll that ran handlers, so a reply wakes no thread. Returns whether `r`
// is done; false without polling when polling does not pay now (the one
// place that decides, for wait()).
bool TcpComm::progress_polling(Request* r, transport::WaitPacer& pacer, bool always, Clock::time_point deadline) {
  const auto polls = [&](Clock::time_point now) {
    return always ? pacer.polling(now) : pacer.busy_polling(now) || (crowded_by_job_ && pacer.yield_polling(now));
  };
  // The first poll runs even at a passed deadline (a wait with timeout 0).
  for (auto now = Clock::now(); polls(now);) {
    const size_t ran = poll_progress();
    if (r->done.load(std::memory_order_acquire)) {
      if (ran != 0) waits_self_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    now = Clock::now();  // one clock read per poll serves the pacer and the deadline
    if (ran != 0) pacer.progressed(now);
    if (now >= deadline || !polls(now)) break;
    pacer.pause(deadline, now);
  }
  return false;
}

// A waiting thread that does not poll (its message is large, the cores are
// taken, or its polling budget is spent) runs the reactor itself, blocked
// in epoll_wait, rather than sleeping on cv_ while the io thread does: an
// arriving frame then wakes one thread, the one that wants it, instead of
// the io thread and then this one. A wake-up is the dominant cost on a
// small VM (measured: 2-rank all-reduces of 1-16 MiB made half as many
// context switches). The caller is counted in pollers_ (start_polling), so
// the io thread stays parked. After kBlockIdle without any handler the
// caller sleeps on cv_ instead (its stop_polling(false) wakes the io
// thread), so a long wait for a slow peer costs nothing. Returns whether
// `r` is done.
bool TcpComm::progress_blocking(Request* r, Clock::time_point deadline) {
  Clock::time_point idle_until{};  // set from the first clock read
  for (bool ran = true;;) {
    if (r->done.load(std::memory_order_acquire)) return true;
    const auto now = Clock::now();
    if (ran) idle_until = now + kBlockIdle;
    ran = false;
    const auto until = std::min(deadline, idle_until);
    if (now >= until) return false;
    std::unique_lock<std::mutex> progress(progress_mu_, std::defer_lock);
    if (pollers_.load(std::memory_order_relaxed) == 1) {
      // No other waiter: only the io thread on its way out of run_one
      // (kicked by start_polling) or a test() poll can hold it, each for
      // one turn of the reactor without blocking.
      progress.lock();
    } else if (!progress.try_lock()) {
      // Another waiter runs the handlers; they notify cv_ when they finish
      // `r`. Look again now and then in case that waiter leaves first.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, std::min(until, now + kIoLinger), [&] { return visible(*r); });
      continue;
    }
    if (io_.stopped()) return false;
    ran = run_handlers_locked(until) != 0;
    progress.unlock();
    if (ran && r->done.load(std::memory_order_acquire)) {
      waits_self_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
}

void TcpComm::start_polling() {
  bool kick = false;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    kick = pollers_.fetch_add(1, std::memory_order_relaxed) == 0 && io_running_;
  }
  if (kick) asio::post(io_, [] {});
}

void TcpComm::stop_polling(bool linger) {
  std::lock_guard<std::mutex> lock(park_mu_);
  if (pollers_.fetch_sub(1, std::memory_order_relaxed) != 1) return;
  if (linger) {
    resume_at_ = Clock::now() + kIoLinger;
  } else {
    resume_at_ = Clock::time_point{};
    park_cv_.notify_all();
  }
}

// Work was queued for the io thread (a write) that no waiter may be there
// to run: end a linger now rather than up to kIoLinger later. While a
// waiter polls, it runs the work itself.
void TcpComm::resume_io() {
  std::lock_guard<std::mutex> lock(park_mu_);
  if (resume_at_ <= Clock::now()) return;
  resume_at_ = Clock::time_point{};
  park_cv_.notify_all();
}

// In a handler (the destructor's), on whichever thread runs it: a parked io
// thread must see it too.
void TcpComm::stop_io() {
  io_.stop();
  std::lock_guard<std::mutex> lock(park_mu_);
  park_cv_.notify_all();
}

void TcpComm::check_buffer(int32_t peer, const strata_buffer& buf, const char* op) const {
  if (peer < 0 || peer >= world_ || peer == rank_)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op, ": peer ", peer, " is not another rank of communicator '",
                 name_, "' (world size ", world_, ", this is rank ", rank_, ")");
  if (buf.device.device_type != kDLCPU)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op,
                 ": the tcp transport moves host memory only; stage device buffers in host memory");
  if (buf.data == nullptr && buf.bytes != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op, ": buffer data is NULL but bytes = ", buf.bytes);
}

void TcpComm::finish_locked(Request* r, strata_status_t code, const std::string& error) {
  if (r->finished) return;
  r->finished = true;
  r->status = code;
  r->error = error;
  // Waiters wait for visible(); while frames still use the buffer, the last
  // of them settles it instead (fewer spurious wake-ups of waiting threads).
  settle_locked(r);
}

// A receive that finished early (cancel, abort, a failed peer) can still be
// posted, or be the target of a message whose stripes are arriving; before
// the request is freed, unpost it and turn that message into an orphan that
// drains into staging, or the io thread would complete it into freed memory.
void TcpComm::detach_locked(Request* r) {
  if (r->is_send) return;
  Peer& peer = peers_[r->peer];
  // Not yet matched: no later message may be matched to it either.
  if (auto pq = peer.posted.find(r->tag); pq != peer.posted.end()) {
    auto pos = std::find(pq->second.begin(), pq->second.end(), r);
    if (pos != pq->second.end()) {
      pq->second.erase(pos);
      if (pq->second.empty()) peer.posted.erase(pq);
    }
  }
  for (auto& [seq, m] : peer.msgs)
    if (m->req == r) {
      m->req = nullptr;
      m->orphan = true;
      m->direct = false;
    }
}

uint64_t TcpComm::release_locked(Request* r) {
  if (r->status != STRATA_OK) detach_locked(r);
  live_.erase(r);
  std::unique_ptr<Request> owned(r);
  if (r->status != STRATA_OK) detail::throw_status(r->status, r->error);
  return r->moved;
}

void TcpComm::fail_peer_locked(int p, strata_status_t code, const std::string& reason, bool log) {
  Peer& peer = peers_[p];
  if (peer.failed) return;
  peer.failed = true;
  peer.fail_code = code;
  peer.fail_reason = reason;
  if (log) host_.warn(reason);
  for (auto& [tag, q] : peer.posted)
    for (Request* r : q) finish_locked(r, code, str_cat(describe(*r), ": ", reason));
  peer.posted.clear();
  for (auto& [seq, m] : peer.msgs)
    if (m->req != nullptr) {
      finish_locked(m->req, code, str_cat(describe(*m->req), ": ", reason));
      m->orphan = true;
    }
  for (auto& c : peer.conns) {
    if (!c) continue;  // never connected (failed setup)
    // Frames not yet started are dropped; the one being written finishes
    // (with an error) once the socket closes.
    while (c->sendq.size() > (c->writing ? 1u : 0u)) {
      SendFrame& f = c->sendq.back();
      f.req->io_refs--;
      finish_locked(f.req, code, str_cat(describe(*f.req), ": ", reason));
      settle_locked(f.req);  // also when it had finished before
      c->sendq.pop_back();
    }
    if (c->writing) {
      Request* r = c->sendq.front().req;
      finish_locked(r, code, str_cat(describe(*r), ": ", reason));
    }
  }
  for (Request* r : peer.unsent) finish_locked(r, code, str_cat(describe(*r), ": ", reason));
  peer.unsent.clear();
  // Sockets belong to the handlers; close them in one (connections still in
  // their handshake too: their handlers see `failed` and stop).
  asio::post(io_, [this, p] {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& peer = peers_[p];
    boost::system::error_code ec;
    for (auto* v : {&peer.conns, &peer.out, &peer.in})
      for (auto& c : *v)
        if (c) c->socket.close(ec);
    if (peer.link_timer) peer.link_timer->cancel();
    if (peer.defer_timer) peer.defer_timer->cancel();
  });
  cv_.notify_all();
}

// ---------------------------------------------------------------- sends ---

strata_request_t TcpComm::isend(int32_t peer, uint64_t tag, const strata_buffer& buf) {
  check_buffer(peer, buf, "isend");
  auto req = std::make_unique<Request>();
  req->is_send = true;
  req->peer = peer;
  req->tag = tag;
  req->data = static_cast<char*>(buf.data);
  req->bytes = buf.bytes;
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  req->seq = p.send_seq;
  if (p.failed) {
    // Fail as a request so the caller sees the peer's error at test/wait.
    Request* r = req.release();
    live_.insert(r);
    finish_locked(r, p.fail_code, str_cat(describe(*r), ": ", p.fail_reason));
    return reinterpret_cast<strata_request_t>(r);
  }
  p.send_seq++;
  Request* r = req.release();
  live_.insert(r);
  if (p.link != Link::kReady) {
    // Sent in order once the connections are up (or failed with the peer).
    p.unsent.push_back(r);
    link_locked(peer, true);
  } else {
    issue_send_locked(p, r);
  }
  return reinterpret_cast<strata_request_t>(r);
}

void TcpComm::issue_send_locked(Peer& p, Request* r) {
  const size_t nconn = p.conns.size();
  uint64_t stripes = 1;
  if (nconn > 1 && r->bytes >= 2 * kStripeMinBytes) stripes = std::min<uint64_t>(nconn, r->bytes / kStripeMinBytes);
  const uint64_t per = (r->bytes + stripes - 1) / stripes;
  r->pending_frames = static_cast<int>(stripes);
  for (uint64_t i = 0; i < stripes; ++i) {
    FrameHeader h;
    h.tag = r->tag;
    h.seq = r->seq;
    h.offset = std::min(r->bytes, i * per);
    h.length = std::min(per, r->bytes - h.offset);
    h.total = r->bytes;
    Conn* c = p.conns[(r->seq + i) % nconn].get();
    SendFrame f;
    encode_header(h, f.header.data());
    f.data = r->data != nullptr ? r->data + h.offset : nullptr;
    f.length = h.length;
    f.req = r;
    r->io_refs++;
    if (!c->writing && try_send_inline_locked(c, f)) {
      r->io_refs--;
      if (--r->pending_frames == 0) {
        r->moved = r->bytes;
        finish_locked(r, STRATA_OK, "");
      }
      continue;
    }
    c->sendq.push_back(f);
    if (!c->writing) start_write_locked(c);
  }
}

// Write as much of `f` as the socket takes now without blocking. Returns true
// when all of it went; otherwise f.sent says how much did, and the io thread
// (or a waiter running the reactor) writes the rest and reports any socket
// error with the peer's name. Safe without the io thread: the connection is
// idle (!writing, so nothing else writes to it), and its socket stays open
// while mu_ is held and the peer has not failed (sockets are closed only
// after fail_peer_locked). Frames over kInlineSendMaxBytes are left whole
// to the io thread (see there): returns false at once.
bool TcpComm::try_send_inline_locked(Conn* c, SendFrame& f) {
  if (f.length > kInlineSendMaxBytes) return false;
  iovec iov[2] = {{f.header.data(), f.header.size()}, {const_cast<char*>(f.data), static_cast<size_t>(f.length)}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = f.length != 0 ? 2 : 1;
  const ssize_t n = ::sendmsg(c->socket.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n <= 0) return false;
  f.sent = static_cast<uint64_t>(n);
  return f.sent == kFrameHeaderBytes + f.length;
}

void TcpComm::start_write_locked(Conn* c) {
  c->writing = true;
  asio::post(io_, [this, c] { write_next(c); });
  resume_io();  // lock order: mu_, then park_mu_
}

void TcpComm::write_next(Conn* c) {
  const SendFrame* f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (c->sendq.empty()) {
      c->writing = false;
      return;
    }
    f = &c->sendq.front();  // deque front stays put while other frames are pushed
  }
  // Skip what an inline send already wrote.
  const uint64_t hdr_sent = std::min<uint64_t>(f->sent, kFrameHeaderBytes);
  const uint64_t body_sent = f->sent - hdr_sent;
  const std::array<asio::const_buffer, 2> bufs = {
      asio::buffer(f->header.data() + hdr_sent, kFrameHeaderBytes - hdr_sent),
      asio::buffer(f->data + body_sent, f->length - body_sent)};
  asio::async_write(c->socket, bufs, TransferAllLarge{}, [this, c](const boost::system::error_code& ec, size_t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      SendFrame f = c->sendq.front();
      c->sendq.pop_front();
      Request* r = f.req;
      r->io_refs--;
      if (!ec) {
        if (--r->pending_frames == 0) {
          r->moved = r->bytes;
          finish_locked(r, STRATA_OK, "");
        }
      } else {
        finish_locked(r, STRATA_ERR_UNAVAILABLE, describe(*r) + ": " + ec.message());
      }
      settle_locked(r);
      if (ec) {
        c->writing = false;
        // The read side reports the loss with the peer's name; make sure it does.
        if (!peers_[c->peer].failed)
          fail_peer_locked(c->peer, STRATA_ERR_UNAVAILABLE,
                           str_cat("lost connection to ", peer_name(c->peer), ": ", ec.message()), true);
        return;
      }
      if (c->sendq.empty()) {
        c->writing = false;
        return;
      }
    }
    write_next(c);
  });
}

// ------------------------------------------------------------- receives ---

strata_request_t TcpComm::irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) {
  check_buffer(peer, buf, "irecv");
  auto req = std::make_unique<Request>();
  req->peer = peer;
  req->tag = tag;
  req->data = static_cast<char*>(buf.data);
  req->bytes = buf.bytes;
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  Request* r = req.release();
  live_.insert(r);
  // Messages that fully arrived before the peer left are still delivered.
  auto it = p.unexpected.find(tag);
  const bool buffered = it != p.unexpected.end() && !it->second.empty();
  if (p.failed && (!buffered || p.msgs.at(it->second.front())->received != p.msgs.at(it->second.front())->total)) {
    finish_locked(r, p.fail_code, str_cat(describe(*r), ": ", p.fail_reason));
    return reinterpret_cast<strata_request_t>(r);
  }
  if (!buffered) {
    p.posted[tag].push_back(r);
    // Connecting on a receive too (not only on the peer's send) finds a
    // peer that is gone at the first collective, not at the deadline.
    if (!p.failed) link_locked(peer, false);
    return reinterpret_cast<strata_request_t>(r);
  }
  const uint64_t seq = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) p.unexpected.erase(it);
  InMsg* m = p.msgs.at(seq).get();
  if (m->total > r->bytes) {
    m->orphan = true;
    finish_locked(r, STRATA_ERR_INVALID_ARGUMENT,
                  str_cat(describe(*r), ": the message is ", m->total, " bytes; post a buffer at least that large"));
  } else {
    m->req = r;
  }
  if (m->received == m->total) complete_msg_locked(peer, seq, m);
  return reinterpret_cast<strata_request_t>(r);
}

void TcpComm::complete_msg_locked(int p, uint64_t seq, InMsg* m) {
  Peer& peer = peers_[p];
  if (m->req == nullptr && !m->orphan) return;  // unexpected: wait for its receive
  if (m->req != nullptr && !m->req->finished) {
    if (!m->direct && m->total > 0) std::memcpy(m->req->data, m->staging.data.get(), m->total);
    m->req->moved = m->total;
    finish_locked(m->req, STRATA_OK, "");
  }
  if (m->staging.data) unexpected_bytes_ -= m->total;
  recycle_staging_locked(std::move(m->staging));
  peer.msgs.erase(seq);
}

Staging TcpComm::take_staging_locked(uint64_t bytes) {
  Staging s;
  if (bytes == 0) return s;
  auto best = spare_staging_.end();
  for (auto it = spare_staging_.begin(); it != spare_staging_.end(); ++it)
    if (it->capacity >= bytes && (best == spare_staging_.end() || it->capacity < best->capacity)) best = it;
  if (best == spare_staging_.end()) {
    s.data.reset(new char[bytes]);
    s.capacity = bytes;
    return s;
  }
  s.data = std::move(best->data);
  s.capacity = best->capacity;
  spare_staging_bytes_ -= s.capacity;
  spare_staging_.erase(best);
  return s;
}

void TcpComm::recycle_staging_locked(Staging&& s) {
  // The spares stay within the user's bound on staged bytes too.
  const uint64_t max_bytes = std::min(kSpareStagingBytes, opts_.max_unexpected_bytes);
  if (s.capacity == 0 || s.capacity > max_bytes) return;
  // Full: drop the smallest spare if this one is larger, so the spares
  // settle on the sizes the job's messages have.
  while (!spare_staging_.empty() &&
         (spare_staging_.size() >= kSpareStagingBuffers || spare_staging_bytes_ + s.capacity > max_bytes)) {
    auto smallest = std::min_element(spare_staging_.begin(), spare_staging_.end(),
                                      [](const Staging& a, const Staging& b) { return a.capacity < b.capacity; });
    if (smallest->capacity >= s.capacity) return;
    spare_staging_bytes_ -= smallest->capacity;
    spare_staging_.erase(smallest);
  }
  spare_staging_bytes_ += s.capacity;
  spare_staging_.push_back(std::move(s));
}

// Parses the frames the read-ahead holds, one after another (a loop, not
// recursion: a burst of small frames is parsed in one go), and reads more
// when it holds no whole header. Each payload is taken from the read-ahead
// as far as it reaches; the rest is read straight into its destination
// (process_header), after which on_payload's handler comes back here.
void TcpComm::read_header(Conn* c) {
  for (;;) {
    const size_t have = c->rx_end - c->rx_begin;
    if (have < kFrameHeaderBytes) {
      if (have > 0 && c->rx_begin > 0) std::memmove(c->rx_buf.get(), c->rx_buf.get() + c->rx_begin, have);
      c->rx_begin = 0;
      c->rx_end = have;
      c->socket.async_read_some(asio::buffer(c->rx_buf.get() + have, kRxBufferBytes - have),
                                [this, c](const boost::system::error_code& ec, size_t n) {
                                  if (ec) return on_io_error(c, ec, "reading a frame header");
                                  c->rx_end += n;
                                  read_header(c);
                                });
      return;
    }
    std::string bad = decode_header(c->rx_buf.get() + c->rx_begin, kFrameHeaderBytes, &c->rx);
    c->rx_begin += kFrameHeaderBytes;
    if (bad.empty() && c->rx.flags != kFlagData) bad = "unexpected handshake frame after setup";
    if (!bad.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      fail_peer_locked(c->peer, STRATA_ERR_DATA_LOSS,
                       str_cat("malformed frame from ", peer_name(c->peer), " on connection ", c->index, ": ", bad),
                       true);
      return;
    }
    if (!process_header(c)) return;
  }
}

bool TcpComm::process_header(Conn* c) {
  const FrameHeader& h = c->rx;
  const int p = c->peer;
  InMsg* m = nullptr;
  char* dest = nullptr;
  Request* user_req = nullptr;  // whose buffer this frame lands in, if any
  std::vector<Conn*> unpark;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& peer = peers_[p];
    if (peer.failed) return false;
    auto it = peer.msgs.find(h.seq);
    if (it != peer.msgs.end()) {
      m = it->second.get();
    } else if (h.seq == peer.next_announce) {
      // First frame of the next message: match it to a posted receive now, so
      // that (when there is one) its bytes land directly in the user buffer.
      auto owned = std::make_unique<InMsg>();
      m = owned.get();
      m->tag = h.tag;
      m->total = h.total;
      auto pq = peer.posted.find(h.tag);
      if (pq != peer.posted.end() && !pq->second.empty()) {
        Request* r = pq->second.front();
        pq->second.pop_front();
        if (pq->second.empty()) peer.posted.erase(pq);
        if (h.total > r->bytes) {
          finish_locked(r, STRATA_ERR_INVALID_ARGUMENT,
                        str_cat(describe(*r), ": the message is ", h.total,
                                " bytes; post a buffer at least that large"));
          m->orphan = true;
        } else {
          m->req = r;
          m->direct = true;
        }
      }
      if (!m->direct) {
        // Checked before the message is listed: a receive posted after the
        // peer failed must not find a listed message that was never kept.
        if (unexpected_bytes_ + h.total > opts_.max_unexpected_bytes) {
          fail_peer_locked(p, STRATA_ERR_FAILED_PRECONDITION,
                           str_cat(peer_name(p), " sent a ", h.total, "-byte message (tag ", h.tag,
                                   ") before its receive was posted, and buffering it would exceed "
                                   "max_unexpected_bytes = ", opts_.max_unexpected_bytes,
                                   "; post receives earlier or raise the option"),
                           true);
          return false;
        }
        m->staging = take_staging_locked(h.total);
        unexpected_bytes_ += h.total;
        if (!m->orphan) peer.unexpected[h.tag].push_back(h.seq);
      }
      peer.msgs.emplace(h.seq, std::move(owned));
      peer.next_announce++;
      for (auto& other : peer.conns)
        if (other->parked) {
          other->parked = false;
          unpark.push_back(other.get());
        }
    } else if (h.seq > peer.next_announce) {
      // A stripe of a later message overtook an earlier one on another
      // connection; wait until the earlier one is announced.
      c->parked = true;
      return false;
    } else {
      fail_peer_locked(p, STRATA_ERR_DATA_LOSS,
                       str_cat("malformed frame from ", peer_name(p), ": message #", h.seq,
                               " was already complete"),
                       true);
      return false;
    }
    if (m->tag != h.tag || m->total != h.total) {
      fail_peer_locked(p, STRATA_ERR_DATA_LOSS,
                       str_cat("malformed frame from ", peer_name(p), ": message #", h.seq,
                               " changed tag or size between stripes"),
                       true);
      return false;
    }
    if (m->direct && m->req != nullptr) {
      user_req = m->req;
      dest = user_req->data != nullptr ? user_req->data + h.offset : nullptr;
      user_req->io_refs++;
    } else {
      if (!m->staging.data && m->total > 0) {  // orphaned direct message: drain
        unexpected_bytes_ += m->total;
        m->staging = take_staging_locked(m->total);
      }
      dest = m->staging.data.get() + h.offset;
    }
  }
  for (Conn* o : unpark)
    asio::post(io_, [this, o] {
      if (process_header(o)) read_header(o);
    });
  // The part of the payload that is already in the read-ahead.
  const uint64_t ahead = std::min<uint64_t>(h.length, c->rx_end - c->rx_begin);
  if (ahead > 0) {
    if (dest != nullptr) std::memcpy(dest, c->rx_buf.get() + c->rx_begin, ahead);
    c->rx_begin += ahead;
  }
  if (ahead == h.length) return on_payload(c, m, user_req, {});
  if (h.length - ahead >= kLowatMinBytes)
    return read_payload(c, m, user_req, dest + ahead, h.length - ahead);
  asio::async_read(c->socket, asio::buffer(dest + ahead, h.length - ahead), TransferAllLarge{},
                   [this, c, m, user_req](const boost::system::error_code& ec, size_t) {
                     if (on_payload(c, m, user_req, ec)) read_header(c);
                   });
  return false;
}

// Reads the rest of a large payload (`left` bytes into `dest`) without
// asio's composed read: the socket's SO_RCVLOWAT is raised to what is left
// while this waits for the socket, and lowered to 1 once the payload is in
// (a frame header must wake the reactor however few bytes it has). The
// kernel caps the mark at half the receive buffer and wakes the reader anyway
// when its window closes or the peer goes, so the wait cannot outlast the
// bytes the sender will send. Returns true when the payload is in and
// accounted, so the caller parses the next frame (a loop, not recursion:
// a socket may hold many large frames); false when it waits for the socket
// (its handler goes on from there) or the connection failed.
bool TcpComm::read_payload(Conn* c, InMsg* m, Request* user_req, char* dest, size_t left) {
  const int fd = c->socket.native_handle();
  const auto mark = [&](size_t bytes) {
    const int v = static_cast<int>(bytes);
    if (v != c->lowat && ::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0) c->lowat = v;
  };
  boost::system::error_code ec;
  while (left > 0) {
    const ssize_t n = ::recv(fd, dest, left, MSG_DONTWAIT);
    if (n > 0) {
      dest += n;
      left -= size_t(n);
    } else if (n == 0) {
      ec = asio::error::eof;
      break;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      mark(std::min(left, kLowatMaxBytes));
      c->socket.async_wait(tcp::socket::wait_read, [this, c, m, user_req, dest,
                                                    left](const boost::system::error_code& e) {
        if (e ? on_payload(c, m, user_req, e) : read_payload(c, m, user_req, dest, left)) read_header(c);
      });
      return false;
    } else if (errno != EINTR) {
      ec = boost::system::error_code(errno, boost::system::system_category());
      break;
    }
  }
  if (!ec) mark(1);
  return on_payload(c, m, user_req, ec);
}

// Accounts for a frame's payload; false when the connection failed (then
// nothing more is read from it).
bool TcpComm::on_payload(Conn* c, InMsg* m, Request* user_req, const boost::system::error_code& ec) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& peer = peers_[c->peer];
    const uint64_t seq = c->rx.seq;
    if (user_req != nullptr) {
      user_req->io_refs--;
      settle_locked(user_req);
    }
    if (ec) {
      // `m` may already be gone if the peer failed meanwhile; only touch it when listed.
    } else if (peer.msgs.count(seq) != 0 && peer.msgs[seq].get() == m) {
      m->received += c->rx.length;
      if (m->received == m->total) complete_msg_locked(c->peer, seq, m);
    }
  }
  if (ec) {
    on_io_error(c, ec, "reading a payload");
    return false;
  }
  return true;
}

void TcpComm::on_io_error(Conn* c, const boost::system::error_code& ec, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peers_[c->peer].failed) return;
  const bool eof = ec == asio::error::eof;
  if (eof) {
    // A peer that finished closes all its connections; bytes it sent on the
    // others may still be unread, so only the last close ends the peer.
    c->eof = true;
    for (auto& other : peers_[c->peer].conns)
      if (!other->eof && !other->parked) return;
  }
  const std::string cause = eof ? std::string("connection closed by the peer (its process exited or destroyed the communicator)")
                                : ec.message();
  bool pending = !peers_[c->peer].posted.empty();
  for (auto& [seq, m] : peers_[c->peer].msgs) pending = pending || m->req != nullptr;
  for (auto& other : peers_[c->peer].conns) pending = pending || !other->sendq.empty();
  fail_peer_locked(c->peer, STRATA_ERR_UNAVAILABLE,
                   str_cat("lost connection to ", peer_name(c->peer), " while ", what, ": ", cause),
                   pending || !eof);
}

// ------------------------------------------------------ test/wait/cancel ---

bool TcpComm::test(strata_request_t h, uint64_t* bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  Request* r = lookup_locked(h);
  if (!visible(*r)) {
    // One poll (never blocks: skipped while another thread runs handlers),
    // unless "poll": "never" leaves every byte to the io thread.
    if (opts_.poll == Options::Poll::kNever) return false;
    lock.unlock();
    if (poll_progress() == 0) return false;
    lock.lock();
    r = lookup_locked(h);
    if (!visible(*r)) return false;
  }
  *bytes = release_locked(r);
  return true;
}

uint64_t TcpComm::wait(strata_request_t h, int64_t timeout_ms) {
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  Request* r = lookup_locked(h);
  if (!visible(*r)) {
    // Who moves the bytes while this thread waits (see io_loop):
    // - a small message (up to kPollMaxBytes, ~132 KiB) while the
    //   process has free cores: this thread polls the reactor for the
    //   pacer's budget, restarted by every poll that ran handlers (a reply
    //   then wakes no thread);
    // - the same (up to kCrowdedPollMaxBytes, ~260 KiB), yielding between
    //   polls, while this job's ranks on this machine outnumber its cores
    //   (crowded_by_job_) and yields come back soon
    //   (transport::YieldProbe: no busy program takes the core);
    // - otherwise, and once that budget is spent, this thread runs the
    //   reactor blocked in epoll_wait (progress_blocking): a frame wakes
    //   the thread that wants it, not the io thread and then this one.
    // - "poll": "never": the io thread moves every byte; this thread
    //   watches for the end while cores are free, then sleeps on cv_.
    // Never with mu_ held: handlers take it. Measured on the 2-core
    // machine: a waiter that spun while moving a large message itself made
    // 1-16 MiB all-reduces up to 2x slower, and yield-polling small ones
    // beside two busy loops made 4 KiB ones 4-10x slower (each yield gave
    // a busy loop the core for its time slice), which the yield probe now
    // catches; blocking in the reactor costs neither (progress_blocking).
    // Yield-polling while 4 ranks alone crowd 2 cores: 4 KiB all-reduces
    // 0.6-0.7x the time blocking took (notes of stop 37). A job that fits
    // the cores blocks when other programs crowd them: there the probe's
    // slow yields (a time slice each) made 2-rank all-reduces up to 1.5x
    // slower beside two busy loops.
    waits_.fetch_add(1, std::memory_order_relaxed);
    const bool small = r->bytes <= (crowded_by_job_ ? kCrowdedPollMaxBytes : kPollMaxBytes);
    // The pacer judges load from every runnable thread: the io threads are
    // this job's too, so tcp does not use yield_only_for_job (tried: with
    // no other work a 2-rank 1 MiB all-reduce took 1.7x as long).
    transport::WaitPacer pacer;
    lock.unlock();
    if (opts_.poll == Options::Poll::kNever) {
      resume_io();
      // Watched without mu_ (Request::done): the io thread's handlers take it.
      while (!r->done.load(std::memory_order_acquire) && pacer.busy_polling() && Clock::now() < deadline)
        pacer.pause(deadline);
    } else {
      start_polling();
      const bool done = (small && progress_polling(r, pacer, opts_.poll == Options::Poll::kAlways, deadline)) ||
                        progress_blocking(r, deadline);
      stop_polling(done);
    }
    lock.lock();
  }
  if (!cv_.wait_until(lock, deadline, [&] { return visible(*r); })) {
    const Link link = peers_[r->peer].link;
    if (link != Link::kReady)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, describe(*r), ": not complete after ", timeout_ms, " ms: ",
                   peer_name(r->peer),
                   link == Link::kNone ? " has not connected" : " has not finished the connection handshake",
                   " (it may be stopped, overloaded or not running communicator '", name_,
                   "'; the request is still pending)");
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, describe(*r), ": not complete after ", timeout_ms,
                 " ms; the peer may be stalled or has not posted the matching ",
                 r->is_send ? "irecv" : "isend", " (the request is still pending)");
  }
  return release_locked(r);
}

void TcpComm::cancel(strata_request_t h) noexcept {
  try {
    std::unique_lock<std::mutex> lock(mu_);
    Request* r = lookup_locked(h);
    if (!r->finished) {
      if (r->is_send) {
        // A partly queued message cannot be skipped in the byte stream.
        fail_peer_locked(r->peer, STRATA_ERR_CANCELLED,
                         str_cat(describe(*r), " was cancelled before it was sent; the connection to ",
                                 peer_name(r->peer), " is closed because its byte stream cannot skip it"),
                         true);
      } else {
        detach_locked(r);
        finish_locked(r, STRATA_ERR_CANCELLED, describe(*r) + ": cancelled");
      }
    }
    // Bytes may still be moving into or out of the user's buffer; wait for
    // them (bounded: the socket is closed or the frame completes).
    detach_locked(r);  // also when it had already finished (e.g. aborted)
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return r->io_refs == 0; });
    if (r->io_refs == 0) {
      live_.erase(r);
      delete r;
    }
  } catch (...) {
  }
}

// ---------------------------------------------------------------- setup ---

void TcpComm::setup(int64_t timeout_ms) {
  const auto setup_start = Clock::now();
  const auto deadline = setup_start + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  };
  nconn_ = opts_.connections_per_peer;
  hash_ = comm_name_hash(name_);
  const std::string who = str_cat("comm_create('", name_, "') rank ", rank_, " of ", world_);
  who_ = str_cat("tcp communicator '", name_, "' rank ", rank_, " of ", world_);  // after setup

  // Listen.
  std::string bind = opts_.bind;
  std::string advertise;
  const auto store_addr = host_.get_config("/rendezvous/address");
  std::string store_host;
  if (store_addr) {
    uint16_t port = 0;
    std::string a;
    try {
      a = nlohmann::json::parse(*store_addr).get<std::string>();
    } catch (const std::exception&) {
    }
    if (!split_host_port(a, &store_host, &port)) store_host.clear();
  }
  if (bind.empty()) {
    bind = store_host.empty() ? "" : route_to(store_host, opts_.ipv6);
    if (bind.empty()) bind = opts_.ipv6 ? "::1" : "127.0.0.1";
  }
  boost::system::error_code ec;
  const auto bind_addr = asio::ip::make_address(bind, ec);
  if (ec)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "tcp transport option 'bind' = '", bind,
                 "' is not an IP address; pass e.g. \"0.0.0.0\" or \"127.0.0.1\"");
  if (bind_addr.is_unspecified()) {
    advertise = store_host.empty() ? "" : route_to(store_host, bind_addr.is_v6());
    if (advertise.empty()) advertise = bind_addr.is_v6() ? "::1" : "127.0.0.1";
  } else {
    advertise = bind_addr.to_string();
  }
  tcp::acceptor& acceptor = acceptor_;
  uint16_t bound = 0;
  std::string last_error;
  for (uint32_t port = opts_.port_lo; port <= opts_.port_hi; ++port) {
    const tcp::endpoint ep(bind_addr, static_cast<uint16_t>(port));
    boost::system::error_code e;
    acceptor.open(ep.protocol(), e);
    if (e)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, who, ": cannot open a ", bind_addr.is_v6() ? "IPv6" : "IPv4",
                   " socket (", e.message(), ")", bind_addr.is_v6() ? "; set \"ipv6\": false" : "");
    acceptor.bind(ep, e);
    if (!e) acceptor.listen(asio::socket_base::max_listen_connections, e);
    if (!e) {
      bound = acceptor.local_endpoint().port();
      break;
    }
    last_error = e.message();
    acceptor.close(e);
    if (port == opts_.port_hi) break;
  }
  if (bound == 0)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, who, ": no port in \"", opts_.ports_text, "\" is free on ", bind,
                 " (last error: ", last_error, "); widen the 'ports' option or use \"0\" for an ephemeral port");
  const std::string my_addr = join_host_port(advertise, bound);
  peers_[rank_].address = my_addr;
  my_nonce_ = random_bytes(kHandshakeNonceBytes);
  const std::string& my_nonce = my_nonce_;
  host_.store_set(str_cat(name_, "/nonce/", rank_), my_nonce, left_ms());
  host_.store_set(str_cat(name_, "/addr/", rank_), my_addr, left_ms());
  // The communicator's handshake secret, from rank 0 through the store.
  std::string& secret = secret_;
  if (rank_ == 0) {
    secret = random_bytes(32);
    host_.store_set(str_cat(name_, "/secret"), secret, left_ms());
  }

  nonces_.resize(static_cast<size_t>(world_));
  std::vector<std::string>& nonces = nonces_;
  try {
    if (rank_ != 0) secret = host_.store_get(str_cat(name_, "/secret"), left_ms());
  } catch (const Error& e) {
    if (e.code() == STRATA_ERR_DEADLINE_EXCEEDED)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": rank 0 never published the communicator's handshake secret (key '",
                   name_, "/secret') within ", timeout_ms, " ms; check that rank 0 creates this communicator");
    throw;
  }
  // Every rank's address and nonce in one store record, "name/peers": rank 0
  // reads them one by one (it connects to all of them anyway) and publishes
  // the list; every other rank reads that one key. So a job's setup makes
  // O(world) store requests, not 2 per pair of ranks (256 ranks: 98,000).
  // Each entry: the address, a NUL, the kHandshakeNonceBytes nonce.
  std::vector<std::string> addrs(static_cast<size_t>(world_));
  std::string peers;
  if (rank_ == 0) {
    for (int p = 0; p < world_; ++p) {
      try {
        const std::string a = p == 0 ? my_addr : host_.store_get(str_cat(name_, "/addr/", p), left_ms());
        const std::string n = p == 0 ? my_nonce : host_.store_get(str_cat(name_, "/nonce/", p), left_ms());
        peers += a;
        peers.push_back('\0');
        peers += n;
      } catch (const Error& e) {
        if (e.code() == STRATA_ERR_DEADLINE_EXCEEDED)
          STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": rank ", p, " never published its address (key '",
                       name_, "/addr/", p, "') within ", timeout_ms,
                       " ms; check that every rank creates this communicator with the same name and world size");
        throw;
      }
    }
    host_.store_set(str_cat(name_, "/peers"), peers, left_ms());
    host_.debug(who, ": read ", world_, " addresses and published the list in ",
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - setup_start).count(), " ms");
  } else {
    try {
      peers = host_.store_get(str_cat(name_, "/peers"), left_ms());
    } catch (const Error& e) {
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
      const std::string m =
          sdk::missing_ranks(host_, world_, rank_, [&](int p) { return str_cat(name_, "/addr/", p); });
      if (!m.empty())
        STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": ", m, " never published an address within ", timeout_ms,
                     " ms; check that every rank creates this communicator with the same name and world size");
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": rank 0 never published the list of addresses (key '",
                   name_, "/peers') within ", timeout_ms, " ms; see rank 0's log for the reason");
    }
  }
  {
    size_t pos = 0;
    for (int p = 0; p < world_; ++p) {
      const size_t nul = peers.find('\0', pos);
      if (nul == std::string::npos || nul + 1 + kHandshakeNonceBytes > peers.size())
        STRATA_THROW(STRATA_ERR_DATA_LOSS, who, ": the list of addresses (key '", name_,
                     "/peers') is malformed at rank ", p, "; every rank must run the same Strata version");
      addrs[size_t(p)] = peers.substr(pos, nul - pos);
      nonces[size_t(p)] = peers.substr(nul + 1, kHandshakeNonceBytes);
      pos = nul + 1 + kHandshakeNonceBytes;
    }
    if (addrs[size_t(rank_)] != my_addr || nonces[size_t(rank_)] != my_nonce)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who, ": the list of addresses names ", addrs[size_t(rank_)],
                   " for this rank, which listens at ", my_addr,
                   "; two processes joined communicator '", name_, "' as rank ", rank_);
  }
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Peer& peer = peers_[p];
    peer.address = addrs[size_t(p)];
    std::string h;
    uint16_t port = 0;
    if (!split_host_port(peer.address, &h, &port))
      STRATA_THROW(STRATA_ERR_DATA_LOSS, who, ": rank ", p, " published a malformed address '", peer.address, "'");
    const auto addr = asio::ip::make_address(h, ec);
    if (ec)
      STRATA_THROW(STRATA_ERR_DATA_LOSS, who, ": rank ", p, " published '", peer.address, "', not an IP address");
    peer.endpoint = tcp::endpoint(addr, port);
  }
  // Ranks on this machine: those that advertise this rank's address or a
  // loopback one (ranks in other network namespaces of one machine count
  // as remote, which only keeps their waits from yield-polling).
  const auto mine = asio::ip::make_address(advertise, ec);
  int here = 1;
  for (int p = 0; p < world_; ++p) {
    const auto a = peers_[p].endpoint.address();
    if (p != rank_ && (a.is_loopback() || (!ec && a == mine))) ++here;
  }
  crowded_by_job_ = here > transport::usable_cores();
  host_.debug(who, ": ", here, " of ", world_, " ranks on this machine, ", transport::usable_cores(), " cores",
              crowded_by_job_ ? str_cat(": waits for up to ", kCrowdedPollMaxBytes >> 10,
                                        " KiB yield-poll while yields come back soon")
                              : std::string());
  // Any rank may connect (lazily, any time); eagerly only the lower ones, all
  // at once. Either way a real peer's connections always fit in the quota.
  max_pending_ = kMaxPendingHandshakes + static_cast<size_t>(nconn_) *
                                             static_cast<size_t>(opts_.lazy ? world_ - 1 : rank_);

  // From here the handlers own the sockets (run by the io thread, or by a
  // thread in wait() while it polls: io_loop): the acceptor runs for the
  // communicator's lifetime, connections are made on demand (link_locked).
  work_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(io_.get_executor());
  if (world_ > 1) asio::post(io_, [this] { accept_next(); });
  thread_ = std::thread([this] { io_loop(); });
  host_.debug(who, ": ready to connect lazily after ",
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - setup_start).count(), " ms");
  if (opts_.lazy) return;

  // "connect": "eager": every connection now, each rank connecting to the
  // higher ones, within the setup deadline.
  std::unique_lock<std::mutex> lock(mu_);
  for (int p = rank_ + 1; p < world_; ++p) link_locked(p, true);
  auto settled = [&] {
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && (peers_[p].failed || peers_[p].link != Link::kReady)) return false;
    return true;
  };
  auto any_failed = [&]() -> const Peer* {
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && peers_[p].failed) return &peers_[p];
    return nullptr;
  };
  cv_.wait_until(lock, deadline, [&] { return settled() || any_failed() != nullptr; });
  if (const Peer* f = any_failed()) {
    const strata_status_t code = f->fail_code;
    const std::string why = f->fail_reason;
    lock.unlock();
    detail::throw_status(code, why);
  }
  if (!settled()) {
    // At most 16 named: a 1,024-rank mesh that missed its deadline would
    // otherwise put a thousand numbers in every rank's message.
    std::string missing;
    int count = 0;
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && peers_[p].link != Link::kReady && ++count <= 16)
        missing += str_cat(missing.empty() ? "" : ", ", p);
    if (count > 16) missing += str_cat(" and ", count - 16, " more");
    lock.unlock();
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": rank(s) ", missing, " never connected within ", timeout_ms,
                 " ms; check that every rank creates communicator '", name_, "' and can reach ", my_addr);
  }
}

// ---------------------------------------------------------- connections ---

void TcpComm::tune(tcp::socket& s) const {
  boost::system::error_code e;
  s.set_option(tcp::no_delay(true), e);
  if (opts_.socket_buffer_bytes > 0) {
    s.set_option(asio::socket_base::send_buffer_size(static_cast<int>(opts_.socket_buffer_bytes)), e);
    s.set_option(asio::socket_base::receive_buffer_size(static_cast<int>(opts_.socket_buffer_bytes)), e);
  }
}

std::string TcpComm::check_hs(const Conn& c, Handshake* hs, uint16_t* flags) const {
  FrameHeader h;
  std::string bad = decode_header(c.hs.data(), kFrameHeaderBytes, &h);
  if (bad.empty() && (h.flags & kFlagHandshake) == 0) bad = "the first frame is not a handshake";
  if (bad.empty()) bad = decode_handshake(c.hs.data() + kFrameHeaderBytes, kHandshakeBytes, hs);
  if (!bad.empty()) return bad;
  *flags = h.flags;
  if (hs->name_hash != hash_)
    return "it belongs to another communicator (name hash differs); give every rank the same communicator name";
  if (hs->world != world_)
    return str_cat("it has world size ", hs->world, " but this rank has ", world_,
                   "; start every rank with the same world size");
  if (static_cast<int>(hs->conns_per_peer) != nconn_)
    return str_cat("it uses connections_per_peer = ", hs->conns_per_peer, " but this rank uses ", nconn_,
                   "; give every rank the same transport options");
  return "";
}

// Our handshake on `c`: as the connecting side (acceptor_nonce = the peer's
// published nonce, nonce = a fresh one) or as the accepting side
// (acceptor_nonce = ours, nonce = the one the peer sent).
void TcpComm::my_hs(Conn& c, uint16_t flags, const char* role, const std::string& acceptor_nonce,
                    const std::string& nonce) const {
  FrameHeader h;
  h.flags = flags;
  h.length = h.total = kHandshakeBytes;
  encode_header(h, c.hs.data());
  Handshake hs;
  hs.name_hash = hash_;
  hs.rank = rank_;
  hs.world = world_;
  hs.conn_index = static_cast<uint32_t>(c.index);
  hs.conns_per_peer = static_cast<uint32_t>(nconn_);
  uint8_t* payload = c.hs.data() + kFrameHeaderBytes;
  encode_handshake(hs, payload);  // the fields, for the MAC
  hs.nonce = nonce;
  hs.mac = handshake_mac(secret_, role, payload, acceptor_nonce, nonce);
  encode_handshake(hs, payload);
}

bool TcpComm::signed_by_peer(const Conn& c, const Handshake& hs, const char* role,
                             const std::string& acceptor_nonce) const {
  return same_secret(hs.mac, handshake_mac(secret_, role, c.hs.data() + kFrameHeaderBytes, acceptor_nonce, hs.nonce));
}

void TcpComm::link_locked(int p, bool for_send) {
  Peer& peer = peers_[p];
  if (peer.failed || peer.link != Link::kNone) return;
  // Eagerly, only the lower rank of a pair connects; lazily, whoever needs
  // the link first (both at once: the lower rank's connections win).
  if (!opts_.lazy && p < rank_) return;
  peer.link = Link::kConnecting;
  if (!opts_.lazy || p > rank_ || for_send) {
    asio::post(io_, [this, p] { connect_peer(p); });
    return;
  }
  // A receive from a lower rank gives it a moment to connect first: its
  // message can only come after its own send, which connects at once, so
  // waiting costs nothing and avoids a race (each race costs a declined
  // set; a ring's rank r+1 would race rank r's send every time). Only if
  // nothing arrives does this rank connect itself, so a peer that is gone
  // is still found at the first receive. (A send never waits: collectives
  // that wait on their sends one peer at a time would pay the delay per
  // peer.)
  asio::post(io_, [this, p] {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& peer = peers_[p];
    if (peer.failed || peer.link != Link::kConnecting) return;
    peer.defer_timer = std::make_unique<asio::steady_timer>(io_, kHigherRankConnectDelay);
    peer.defer_timer->async_wait([this, p](const boost::system::error_code& ec) {
      if (!ec) connect_peer(p);
    });
  });
}

void TcpComm::start_link_timer_locked(int p) {
  Peer& peer = peers_[p];
  if (!peer.link_timer) peer.link_timer = std::make_unique<asio::steady_timer>(io_);
  const auto ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  peer.link_timer->expires_after(std::chrono::milliseconds(ms));
  peer.link_timer->async_wait([this, p, ms](const boost::system::error_code& ec) {
    if (ec) return;
    std::lock_guard<std::mutex> lock(mu_);
    Peer& peer = peers_[p];
    if (peer.failed || peer.link == Link::kReady) return;
    fail_peer_locked(p, STRATA_ERR_DEADLINE_EXCEEDED,
                     str_cat(who_, ": ", peer_name(p),
                             peer.link == Link::kConnecting ? " did not answer" : " did not finish",
                             " the connection handshake within ", ms,
                             " ms (option timeout_s); it may be stopped, overloaded or not running communicator '",
                             name_, "'"),
                     true);
  });
}

void TcpComm::abandon_locked(std::vector<std::unique_ptr<Conn>>& conns) {
  boost::system::error_code ignored;
  for (auto& c : conns) {
    if (!c) continue;
    c->abandoned = true;
    c->socket.close(ignored);
    graveyard_.push_back(std::move(c));
  }
  conns.clear();
}

void TcpComm::connect_peer(int p) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& peer = peers_[p];
  if (peer.failed || peer.link != Link::kConnecting || !peer.out.empty()) return;
  start_link_timer_locked(p);
  peer.handshakes_done = 0;
  for (int i = 0; i < nconn_; ++i) {
    peer.out.push_back(std::make_unique<Conn>(io_));
    Conn* c = peer.out.back().get();
    c->peer = p;
    c->index = i;
    c->socket.async_connect(peer.endpoint, [this, c](const boost::system::error_code& ec) { on_connected(c, ec); });
  }
}

void TcpComm::on_connected(Conn* c, const boost::system::error_code& ec) {
  std::lock_guard<std::mutex> lock(mu_);
  const int p = c->peer;
  if (c->abandoned || peers_[p].failed) return;
  if (ec) {
    fail_peer_locked(p, STRATA_ERR_UNAVAILABLE, str_cat(who_, ": cannot connect to ", peer_name(p), ": ", ec.message()),
                     true);
    return;
  }
  tune(c->socket);
  c->hs_nonce = random_bytes(kHandshakeNonceBytes);
  my_hs(*c, kFlagHandshake, "connect", nonces_[size_t(p)], c->hs_nonce);
  asio::async_write(c->socket, asio::buffer(c->hs), [this, c](const boost::system::error_code& e2, size_t) {
    std::lock_guard<std::mutex> lock(mu_);
    const int p = c->peer;
    if (c->abandoned || peers_[p].failed) return;
    if (e2) {
      fail_peer_locked(p, STRATA_ERR_UNAVAILABLE,
                       str_cat(who_, ": lost ", peer_name(p), " during the handshake: ", e2.message()), true);
      return;
    }
    asio::async_read(c->socket, asio::buffer(c->hs),
                     [this, c](const boost::system::error_code& e3, size_t) { on_answer(c, e3); });
  });
}

void TcpComm::on_answer(Conn* c, const boost::system::error_code& ec) {
  std::lock_guard<std::mutex> lock(mu_);
  const int p = c->peer;
  Peer& peer = peers_[p];
  if (c->abandoned || peer.failed) return;
  if (ec) {
    fail_peer_locked(p, STRATA_ERR_UNAVAILABLE,
                     str_cat(who_, ": ", peer_name(p), " closed the connection during the handshake (", ec.message(),
                             "); see its log for the reason"),
                     true);
    return;
  }
  Handshake hs;
  uint16_t flags = 0;
  std::string bad = check_hs(*c, &hs, &flags);
  const bool declined = bad.empty() && (flags & kFlagDeclined) != 0;
  if (bad.empty() &&
      (hs.nonce != c->hs_nonce || !signed_by_peer(*c, hs, declined ? "decline" : "accept", nonces_[size_t(p)])))
    bad = "its answer is not signed with this communicator's secret (another job's process on that port?)";
  if (bad.empty() && (hs.rank != p || static_cast<int>(hs.conn_index) != c->index))
    bad = str_cat("it answered as rank ", hs.rank, " (a stale address from an earlier run?)");
  if (!bad.empty()) {
    fail_peer_locked(p, STRATA_ERR_FAILED_PRECONDITION, str_cat(who_, ": ", peer_name(p), " is incompatible: ", bad),
                     true);
    return;
  }
  if (declined) {
    // The peer (a lower rank) is connecting to us at the same time: its
    // connections win; the link timer keeps running until they arrive.
    if (peer.link == Link::kConnecting) {
      abandon_locked(peer.out);
      peer.link = Link::kAccepting;
      peer.handshakes_done = 0;
    }
    return;
  }
  if (++peer.handshakes_done == nconn_) ready_locked(p, std::move(peer.out));
}

void TcpComm::accept_next() {
  auto owned = std::make_unique<Conn>(io_);
  Conn* c = owned.get();
  handshaking_.emplace(c, std::move(owned));
  acceptor_.async_accept(c->socket, [this, c](const boost::system::error_code& e) {
    if (e) {
      handshaking_.erase(c);
      if (e == asio::error::operation_aborted || !acceptor_.is_open()) return;
      // Out of fds (EMFILE) and the like: the acceptor must outlive them.
      if (!accept_error_logged_) {
        accept_error_logged_ = true;
        host_.warn(who_, ": accepting a connection failed (", e.message(),
                   "); retrying every 100 ms (raise the open-file limit, ulimit -n, for large jobs)");
      }
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](const boost::system::error_code& e2) {
        if (!e2) accept_next();
      });
      return;
    }
    accept_next();
    tune(c->socket);
    if (unverified_.size() >= max_pending_) {
      boost::system::error_code ignored;
      Conn* oldest = unverified_.front();
      unverified_.pop_front();
      host_.warn(who_, ": dropped a connection that sent no handshake: more than ", max_pending_,
                 " connections were waiting to be verified (is something flooding this port?)");
      oldest->socket.close(ignored);
    }
    unverified_.push_back(c);
    asio::async_read(c->socket, asio::buffer(c->hs),
                     [this, c](const boost::system::error_code& e2, size_t) { on_peer_handshake(c, e2); });
  });
}

void TcpComm::on_peer_handshake(Conn* c, const boost::system::error_code& ec) {
  unverified_.erase(std::remove(unverified_.begin(), unverified_.end(), c), unverified_.end());
  boost::system::error_code ignored;
  const auto remote = c->socket.remote_endpoint(ignored);
  const std::string from = join_host_port(remote.address().to_string(), remote.port());
  if (ec == asio::error::operation_aborted) {
    handshaking_.erase(c);
    return;
  }
  if (ec) {
    // Also the loser of a simultaneous connect that gave up before its handshake.
    host_.debug(who_, ": dropped a connection from ", from, " that closed before its handshake (", ec.message(), ")");
    handshaking_.erase(c);
    return;
  }
  FrameHeader fh;
  Handshake hs;
  if (!decode_header(c->hs.data(), kFrameHeaderBytes, &fh).empty() || fh.flags != kFlagHandshake ||
      !decode_handshake(c->hs.data() + kFrameHeaderBytes, kHandshakeBytes, &hs).empty() ||
      !signed_by_peer(*c, hs, "connect", my_nonce_)) {
    // Not a rank of this communicator (a port scanner, a process of another
    // job, a replay): drop it, keep accepting.
    host_.warn(who_, ": dropped a connection from ", from,
               " whose handshake is not signed with this communicator's secret (a stranger, or a rank of "
               "another job or an earlier run)");
    handshaking_.erase(c);
    return;
  }
  uint16_t flags = 0;
  std::string bad = check_hs(*c, &hs, &flags);
  if (bad.empty() && hs.rank == rank_) bad = str_cat("it claims to be this rank (", rank_, ")");
  std::lock_guard<std::mutex> lock(mu_);
  if (!bad.empty()) {
    // Signed with our secret: one of our ranks, started differently.
    const std::string why = str_cat(who_, ": rejected a connection from ", from, ": ", bad);
    if (hs.rank >= 0 && hs.rank < world_ && hs.rank != rank_)
      fail_peer_locked(hs.rank, STRATA_ERR_FAILED_PRECONDITION, why, true);
    else
      host_.warn(why);
    handshaking_.erase(c);
    return;
  }
  const int q = hs.rank;
  Peer& peer = peers_[q];
  if (peer.failed) {
    handshaking_.erase(c);
    return;
  }
  c->peer = q;
  c->index = static_cast<int>(hs.conn_index);
  bool decline = false;
  switch (peer.link) {
    case Link::kNone:
      peer.link = Link::kAccepting;
      peer.handshakes_done = 0;
      start_link_timer_locked(q);
      break;
    case Link::kConnecting:
      // Both connect at once: the lower rank's connections win.
      if (q < rank_) {
        abandon_locked(peer.out);
        peer.link = Link::kAccepting;
        peer.handshakes_done = 0;
        start_link_timer_locked(q);  // (connect_peer may not have run yet)
      } else {
        decline = true;
      }
      break;
    case Link::kAccepting:
      if (!peer.in.empty() && peer.in[size_t(c->index)] != nullptr) {
        host_.warn(who_, ": ", peer_name(q), " opened connection ", c->index, " twice; declined the second");
        decline = true;
      }
      break;
    case Link::kReady:
      // From a higher rank: the rest of a set that lost a race and was
      // given up (its first connection was declined). A lower rank never
      // loses a race, so from one this is a fault worth a warning.
      if (q < rank_)
        host_.warn(who_, ": ", peer_name(q), " connected again although its connections are up; declined");
      decline = true;
      break;
  }
  answer_locked(c, hs, decline);
}

// Answer a verified handshake: accept (the connection joins the peer's set)
// or decline (the answer is written, then the connection closed).
void TcpComm::answer_locked(Conn* c, const Handshake& theirs, bool decline) {
  const int q = c->peer;
  Peer& peer = peers_[q];
  auto owned = std::move(handshaking_.at(c));
  handshaking_.erase(c);
  if (decline) {
    my_hs(*c, kFlagHandshake | kFlagDeclined, "decline", my_nonce_, theirs.nonce);
    graveyard_.push_back(std::move(owned));
    asio::async_write(c->socket, asio::buffer(c->hs), [c](const boost::system::error_code&, size_t) {
      boost::system::error_code ignored;
      c->socket.shutdown(tcp::socket::shutdown_send, ignored);
      c->socket.close(ignored);
    });
    return;
  }
  if (peer.in.empty()) peer.in.resize(static_cast<size_t>(nconn_));
  peer.in[size_t(c->index)] = std::move(owned);
  my_hs(*c, kFlagHandshake, "accept", my_nonce_, theirs.nonce);
  asio::async_write(c->socket, asio::buffer(c->hs), [this, c](const boost::system::error_code& e, size_t) {
    std::lock_guard<std::mutex> lock(mu_);
    const int q = c->peer;
    Peer& peer = peers_[q];
    if (c->abandoned || peer.failed) return;
    if (e) {
      fail_peer_locked(q, STRATA_ERR_UNAVAILABLE,
                       str_cat(who_, ": lost ", peer_name(q), " during the handshake: ", e.message()), true);
      return;
    }
    if (++peer.handshakes_done == nconn_) ready_locked(q, std::move(peer.in));
  });
}

void TcpComm::ready_locked(int p, std::vector<std::unique_ptr<Conn>> conns) {
  Peer& peer = peers_[p];
  peer.conns = std::move(conns);
  peer.out.clear();
  peer.in.clear();
  peer.link = Link::kReady;
  if (peer.link_timer) peer.link_timer->cancel();
  if (peer.defer_timer) peer.defer_timer->cancel();
  for (auto& c : peer.conns) {
    Conn* cp = c.get();
    asio::post(io_, [this, cp] { read_header(cp); });
  }
  while (!peer.unsent.empty()) {
    Request* r = peer.unsent.front();
    peer.unsent.pop_front();
    issue_send_locked(peer, r);
  }
  cv_.notify_all();
}

// ------------------------------------------------------------ transport ---

TcpTransport::TcpTransport(sdk::Host host, const char* options_json) : host_(std::move(host)) {
  const std::string comp = "transport 'tcp'";
  const auto o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o,
                        {"bind", "ports", "connections_per_peer", "ipv6", "socket_buffer_bytes", "timeout_s",
                         "max_unexpected_bytes", "connect", "poll"},
                        comp);
  {
    const std::string connect = sdk::get_option<std::string>(o, "connect", "lazy", comp);
    if (connect != "lazy" && connect != "eager")
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'connect' of ", comp, " is '", connect,
                   "'; use \"lazy\" (connect to a peer at its first send or receive) or \"eager\" (connect to "
                   "every peer in comm_create)");
    opts_.lazy = connect == "lazy";
    const std::string poll = sdk::get_option<std::string>(o, "poll", "auto", comp);
    if (poll != "auto" && poll != "always" && poll != "never")
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'poll' of ", comp, " is '", poll,
                   "'; use \"auto\" (a wait for a small message moves the bytes itself while cores are free), "
                   "\"always\" (also when they are not, yielding between polls) or \"never\" (the io thread "
                   "moves every byte)");
    opts_.poll = poll == "always" ? Options::Poll::kAlways : poll == "never" ? Options::Poll::kNever
                                                                             : Options::Poll::kAuto;
  }
  opts_.bind = sdk::get_option<std::string>(o, "bind", "", comp);
  opts_.ipv6 = sdk::get_option<bool>(o, "ipv6", false, comp);
  opts_.connections_per_peer = sdk::get_option<int>(o, "connections_per_peer", 2, comp);
  if (opts_.connections_per_peer < 1 || opts_.connections_per_peer > 8)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'connections_per_peer' of ", comp, " must be 1..8, got ",
                 opts_.connections_per_peer);
  opts_.socket_buffer_bytes = sdk::get_option<int64_t>(o, "socket_buffer_bytes", 4 << 20, comp);
  if (opts_.socket_buffer_bytes < 0 || opts_.socket_buffer_bytes > (1ll << 30))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'socket_buffer_bytes' of ", comp,
                 " must be 0 (kernel default) .. 1 GiB, got ", opts_.socket_buffer_bytes);
  opts_.max_unexpected_bytes = sdk::get_option<uint64_t>(o, "max_unexpected_bytes", 1ull << 30, comp);
  opts_.timeout_s = sdk::collective_timeout_s(host_, o, comp);
  opts_.ports_text = sdk::get_option<std::string>(o, "ports", "0", comp);
  {
    const std::string& s = opts_.ports_text;
    const size_t dash = s.find('-');
    auto parse = [&](const std::string& t) -> long {
      char* end = nullptr;
      const long v = t.empty() ? -1 : std::strtol(t.c_str(), &end, 10);
      if (t.empty() || *end != '\0' || v < 0 || v > 65535)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'ports' of ", comp, " is '", s,
                     "'; use \"0\" (ephemeral), a port such as \"29500\" or a range such as \"29500-29600\"");
      return v;
    };
    const long lo = parse(dash == std::string::npos ? s : s.substr(0, dash));
    const long hi = dash == std::string::npos ? lo : parse(s.substr(dash + 1));
    if (hi < lo || (lo == 0 && hi != 0))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'ports' of ", comp, " is '", s,
                   "'; a range must be low-high with 0 < low <= high");
    opts_.port_lo = static_cast<uint16_t>(lo);
    opts_.port_hi = static_cast<uint16_t>(hi);
  }
  if (!opts_.bind.empty()) {
    boost::system::error_code ec;
    const auto a = asio::ip::make_address(opts_.bind, ec);
    if (ec)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'bind' of ", comp, " is '", opts_.bind,
                   "', not an IP address; pass e.g. \"0.0.0.0\" or \"127.0.0.1\"");
    if (a.is_v6() != opts_.ipv6)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'bind' of ", comp, " is '", opts_.bind, "', an IPv",
                   a.is_v6() ? 6 : 4, " address, but 'ipv6' is ", opts_.ipv6 ? "true" : "false",
                   "; make them agree");
  }
}

strata_transport_caps TcpTransport::caps() {
  strata_transport_caps c{};
  c.flags = STRATA_TRANSPORT_CAP_P2P | STRATA_TRANSPORT_CAP_MEM_HOST | STRATA_TRANSPORT_CAP_THREAD_SAFE;
  c.max_inflight = 0;
  c.max_message_bytes = kMaxMessageBytes;
  c.preferred_chunk_bytes = kPreferredChunkBytes;
  return c;
}

std::unique_ptr<sdk::CommBase> TcpTransport::comm_create(const char* name, int32_t rank, int32_t world_size,
                                                         int64_t timeout_ms) {
  sdk::check_comm_create_args(name, rank, world_size);
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  auto comm = std::make_unique<TcpComm>(host_, opts_, name, rank, world_size);
  comm->setup(timeout_ms);
  return comm;
}

}  // namespace strata::transport::tcp

STRATA_PLUGIN("strata-transport-tcp", "0.1.0",
              STRATA_TRANSPORT_COMPONENT(strata::transport::tcp::TcpTransport, "tcp", "0.1.0"));
