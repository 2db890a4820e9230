// SPDX-License-Identifier: Apache-2.0
#include "shmem_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <vector>

#include "strata/sdk/options.hpp"
#include "strata/sdk/rendezvous.hpp"
#include "../common/proc_identity.h"
#include "../common/wait_pacer.h"

namespace strata::transport::shmem {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

namespace {

constexpr uint64_t kMagic = 0x314d454853415453ull;  // "STASHEM1"
constexpr uint32_t kLayoutVersion = 1;
constexpr uint64_t kRecHeader = 32;
constexpr uint32_t kFirst = 1;  // RecHeader::flags: the message's first record
enum : uint32_t { kOpen = 0, kGoodbye = 1, kAborted = 2 };
constexpr uint64_t kMinRing = 64 << 10, kMaxRing = 64ull << 20, kDefaultRing = 1 << 20;
// A sender whose ring lacks room for a whole record writes a shorter one
// once at least this much (or the rest of its message) fits.
constexpr uint64_t kMinPartial = 8 << 10;
constexpr auto kLivenessEvery = std::chrono::milliseconds(100);
constexpr auto kStuckAfter = std::chrono::milliseconds(2);
constexpr int kSpinChecks = 256;

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the shmem transport needs address-free atomics in shared memory");

// The start of every segment. Only its owner writes the fixed fields (before
// it publishes the segment's name); `bell` is rung by any rank that has
// something for the owner, `state` is written by the owner only.
struct alignas(64) SegHeader {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t world;
  uint32_t reserved;
  uint64_t ring_bytes;
  alignas(64) std::atomic<uint32_t> bell;  // futex word: bumped for every event the owner may wait for
  std::atomic<uint32_t> sleepers;          // owner threads asleep on bell
  alignas(64) std::atomic<uint32_t> state;  // kOpen, kGoodbye, kAborted (then `reason` is set)
  char reason[448];
};

// One sender's ring in a receiver's segment. tail: bytes the sender has
// published; head: bytes the receiver has consumed; sender_waiting: the
// sender found no room and wants its bell rung when there is.
struct alignas(64) RingCtl {
  std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> sender_waiting;
};

struct RecHeader {
  uint64_t tag;
  uint64_t total;  // the message's size
  uint32_t len;    // payload bytes in this record
  uint32_t flags;
  uint64_t reserved;
};
static_assert(sizeof(RecHeader) == kRecHeader, "record header is 32 bytes");

uint64_t seg_bytes(int world, uint64_t ring) {
  return sizeof(SegHeader) + static_cast<uint64_t>(world) * (sizeof(RingCtl) + ring);
}
RingCtl* ring_ctl(char* base, int sender) { return reinterpret_cast<RingCtl*>(base + sizeof(SegHeader)) + sender; }
uint64_t ring_offset(int world, int sender, uint64_t ring) {
  return sizeof(SegHeader) + static_cast<uint64_t>(world) * sizeof(RingCtl) + static_cast<uint64_t>(sender) * ring;
}
char* ring_data(char* base, int world, int sender, uint64_t ring) { return base + ring_offset(world, sender, ring); }
uint64_t rec_bytes(uint64_t len) { return kRecHeader + ((len + 31) & ~uint64_t(31)); }

void copy_in(char* ring, uint64_t size, uint64_t pos, const void* src, uint64_t n) {
  const uint64_t off = pos & (size - 1), first = std::min(n, size - off);
  std::memcpy(ring + off, src, first);
  if (n > first) std::memcpy(ring, static_cast<const char*>(src) + first, n - first);
}
void copy_out(const char* ring, uint64_t size, uint64_t pos, void* dst, uint64_t n) {
  const uint64_t off = pos & (size - 1), first = std::min(n, size - off);
  std::memcpy(dst, ring + off, first);
  if (n > first) std::memcpy(static_cast<char*>(dst) + first, ring, n - first);
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

// Tell the owner of `h` that something changed; a system call only when one
// of its threads sleeps.
void ring_bell(SegHeader* h) {
  h->bell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) != 0) futex(&h->bell, FUTEX_WAKE, INT_MAX, nullptr);
}

constexpr const char* kPrefix = "strata-shmem-";

// This process's pid namespace (the inode of /proc/self/ns/pid; 0 when
// unknown). Pids mean something only inside one: containers that share
// /dev/shm but not their pid namespace must not judge each other's pids.
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Segments of processes that were killed inside comm_create (before their
// names were unlinked): "strata-shmem-<pid>-<start>-<pid namespace>-<random>"
// whose process is gone, looked up in this pid namespace only. Only this
// user's can be removed; others are left alone.
void remove_stale_segments(const ProcId& me, uint64_t pidns) {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) != 0) continue;
    ProcId p;
    p.boot_id = me.boot_id;
    char* end = nullptr;
    p.pid = std::strtol(n.c_str() + std::strlen(kPrefix), &end, 10);
    if (end == nullptr || *end != '-' || p.pid <= 0) continue;
    p.start = std::strtoull(end + 1, &end, 10);
    if (end == nullptr || *end != '-' || std::strtoull(end + 1, nullptr, 10) != pidns || pidns == 0) continue;
    if (p.pid == me.pid && p.start == me.start) continue;
    if (!proc_gone(p).empty()) ::shm_unlink(("/" + n).c_str());
  }
  ::closedir(d);
}

std::string random_hex() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string mib(uint64_t b) {
  std::ostringstream o;
  o.precision(3);
  o << static_cast<double>(b) / (1 << 20) << " MiB";
  return o.str();
}

// new_request_locked resets every field when it reuses a slot: a field added
// here must be reset there too.
struct Request {
  bool is_send = false;
  int32_t peer = -1;
  uint64_t tag = 0;
  char* data = nullptr;
  uint64_t bytes = 0;
  uint64_t done = 0;     // bytes moved
  bool started = false;  // send: first record written; receive: matched to a message
  bool finished = false;
  strata_status_t status = STRATA_OK;
  std::string error;
  std::vector<char> owned;  // a cancelled, half-sent send: the bytes still to go (from `owned_from`)
  uint64_t owned_from = 0;
  uint32_t idx = 0, gen = 0;  // its slot in the communicator's pool and the slot's use count
  bool live = false;          // handed out (or internal) and not released yet
};

// A message moved out of the ring before its receive was posted.
struct Staged {
  uint64_t tag = 0;
  uint64_t total = 0;
  uint64_t got = 0;
  std::vector<char> data;
};

// The message a peer's ring is delivering: into `req`, into `staged`, or
// (neither) drained.
struct Incoming {
  bool active = false;
  uint64_t total = 0, got = 0;
  Request* req = nullptr;
  Staged* staged = nullptr;
};

struct Peer {
  std::string segment;  // "/strata-shmem-..."
  ProcId proc;
  bool other_process = false;
  bool same_pidns = false;  // its pid means the same here (liveness checks by pid)
  char* base = nullptr;  // the peer's segment, mapped here
  uint64_t map_bytes = 0;
  SegHeader* hdr = nullptr;
  RingCtl* out = nullptr;  // this rank's ring in the peer's segment
  uint64_t out_ring = 0, out_frag = 0;  // its size (the peer chose it) and largest record payload
  char* out_data = nullptr;
  uint64_t out_tail = 0;
  RingCtl* in = nullptr;  // the peer's ring in this rank's segment
  char* in_data = nullptr;
  uint64_t in_head = 0;
  std::deque<Request*> sendq;   // in order; the front may be partly in the ring
  std::deque<Request*> posted;  // receives not matched yet, in posting order
  std::list<Staged> staged;
  Incoming cur;
  bool failed = false;
  strata_status_t fail_code = STRATA_OK;
  std::string fail_reason;
};

}  // namespace

class ShmemComm : public sdk::CommBase {
 public:
  ShmemComm(sdk::Host host, const Options& o, std::string name, int32_t rank, int32_t world)
      : host_(std::move(host)), opts_(o), name_(std::move(name)), rank_(rank), world_(world),
        peers_(static_cast<size_t>(world)) {}
  ~ShmemComm() override;
  void setup(int64_t timeout_ms);

  void abort(const char* reason) noexcept override;
  strata_mem_region_t mem_register(void*, uint64_t, DLDevice device) override {
    if (device.device_type != kDLCPU)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the shmem transport moves host memory only (got device type ",
                   static_cast<int>(device.device_type), "); stage device buffers in host memory");
    return reinterpret_cast<strata_mem_region_t>(&region_token_);  // nothing to register
  }
  void mem_deregister(strata_mem_region_t) noexcept override {}
  strata_request_t isend(int32_t peer, uint64_t tag, const strata_buffer& buf) override;
  strata_request_t irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) override;
  bool test(strata_request_t req, uint64_t* bytes) override;
  uint64_t wait(strata_request_t req, int64_t timeout_ms) override;
  void cancel(strata_request_t req) noexcept override;

 private:
  std::string peer_name(int p) const {
    return peers_[p].proc.pid > 0 ? str_cat("rank ", p, " (pid ", peers_[p].proc.pid, " on this host)")
                                  : str_cat("rank ", p);
  }
  std::string describe(const Request& r) const {
    return r.is_send ? str_cat("send of ", r.bytes, " bytes with tag ", r.tag, " to ", peer_name(r.peer))
                     : str_cat("receive of up to ", r.bytes, " bytes with tag ", r.tag, " from ", peer_name(r.peer));
  }
  void check_buffer(int32_t peer, const strata_buffer& buf, const char* op) const;
  // A request handle is its pool slot and the slot's use count, so a
  // released handle is rejected even after its slot is reused.
  static strata_request_t handle_of(const Request* r) {
    return reinterpret_cast<strata_request_t>(static_cast<uintptr_t>((uint64_t(r->gen) << 32) | (uint64_t(r->idx) + 1)));
  }
  Request* find_locked(strata_request_t h) const {
    const uint64_t v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h));
    const uint64_t idx = (v & 0xffffffffu) - 1;
    if (v == 0 || idx >= slots_.size()) return nullptr;
    Request* r = slots_[idx].get();
    return r->live && r->gen == uint32_t(v >> 32) ? r : nullptr;
  }
  Request* lookup_locked(strata_request_t h) const {
    Request* r = find_locked(h);
    if (r == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "request ", static_cast<void*>(h),
                   " is not a live request of communicator '", name_, "' (already released?)");
    return r;
  }
  Request* new_request_locked(bool is_send, int32_t peer, uint64_t tag, const strata_buffer& buf);
  void finish_locked(Request* r, strata_status_t code, std::string error = {});
  uint64_t release_locked(Request* r);
  bool progress_locked();
  bool send_locked(int p);
  bool receive_locked(int p);
  void fail_peer_locked(int p, strata_status_t code, const std::string& reason);
  // Another thread of this rank may sleep in wait() on a request that this
  // thread's progress just completed: ring its bell (a system call only when
  // one sleeps).
  void wake_local_waiters() {
    if (hdr_->sleepers.load(std::memory_order_seq_cst) != 0) ring_bell(hdr_);
  }
  void fail_all_aborted_locked();
  void fail_aborted_locked(Request* r);  // ABORTED with abort()'s reason
  // True once abort() was called; the first call after it fails every live
  // request (with the reason) and empties the queues.
  bool aborted_locked() {
    if (!aborted_.load(std::memory_order_acquire)) return false;
    if (!abort_handled_) fail_all_aborted_locked();
    return true;
  }
  void fail_too_small_locked(Request* r, uint64_t total) {
    finish_locked(r, STRATA_ERR_INVALID_ARGUMENT,
                  str_cat(describe(*r), ": the message is ", total,
                          " bytes, larger than the receive buffer; post a receive of at least that size"));
  }
  void malformed_locked(int p, const std::string& what) {
    fail_peer_locked(p, STRATA_ERR_DATA_LOSS,
                     str_cat("malformed record from ", peer_name(p), " in shared memory (", what,
                             "): every rank must run the same Strata version; otherwise its memory was "
                             "overwritten"));
  }
  void check_peers_locked(bool liveness);
  std::string deadline_text(const Request& r, int64_t timeout_ms) const;

  sdk::Host host_;
  Options opts_;
  std::string name_;
  int32_t rank_, world_;
  uint64_t ring_ = 0;      // bytes of each ring in this rank's segment
  uint64_t max_frag_ = 0;  // ring_ / 4: the largest record payload a sender may put there
  ProcId me_;
  uint64_t pidns_ = 0;
  bool oversubscribed_by_job_ = false;  // more ranks of this communicator than cores (all run on this host)
  std::string segment_;  // this rank's segment name
  bool unlinked_ = false;
  char* base_ = nullptr;
  uint64_t bytes_ = 0;
  SegHeader* hdr_ = nullptr;
  std::vector<Peer> peers_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Request>> slots_;  // the request pool: a warm communicator allocates none
  std::vector<uint32_t> free_slots_;
  uint64_t staged_bytes_ = 0;
  // Messages staged over the communicator's life, by cause: another receive
  // waited behind it, its sender was stuck, its sender left (debug log).
  uint64_t staged_why_[3] = {0, 0, 0};
  Clock::time_point next_liveness_{};
  // test()'s measure of stuck: progress_locked and isend/irecv count the
  // times bytes moved (moves_), and test() timestamps a new count when it
  // sees one (last_progress_), so that moving bytes never reads the clock
  // (a clock read costs about 30 ns here, a 4 KiB all-reduce about 1.5 us).
  uint64_t moves_ = 0, moves_seen_ = 0;
  Clock::time_point last_progress_ = Clock::now();
  // Set by a test or wait whose caller has seen nothing move for
  // kStuckAfter: only then does a sender waiting for room get its unmatched
  // message staged (two ranks that wait on large sends to each other).
  bool stuck_ = false;
  std::atomic<bool> aborted_{false};
  bool abort_handled_ = false;  // under mu_
  std::mutex abort_mu_;
  std::string abort_reason_;  // under abort_mu_
  int region_token_ = 0;
};

// ---------------------------------------------------------------- setup ---

void ShmemComm::setup(int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  };
  me_ = self_proc();
  oversubscribed_by_job_ = world_ > usable_cores();
  pidns_ = pid_namespace();
  remove_stale_segments(me_, pidns_);

  // This rank's segment.
  segment_ = str_cat("/", kPrefix, me_.pid, "-", me_.start, "-", pidns_, "-", random_hex());
  const int fd = ::shm_open(segment_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, "transport 'shmem': cannot create shared memory /dev/shm",
                 segment_, " for communicator '", name_, "' (", std::strerror(errno),
                 "); check that /dev/shm is mounted and writable by this user");
  // The ring size: the option, or 1 MiB halved (down to 64 KiB) until this
  // rank's rings take at most a 2 * world-th of what /dev/shm has free, so
  // that a small /dev/shm (a container's 64 MiB) still fits every rank.
  // Each receiver sizes its own rings; senders read the size from its
  // segment, so ranks need not agree on it.
  struct statvfs sv {};
  const uint64_t shm_free = ::statvfs("/dev/shm", &sv) == 0 ? uint64_t(sv.f_bavail) * sv.f_frsize : 0;
  ring_ = opts_.ring_bytes;
  if (ring_ == 0) {
    ring_ = kDefaultRing;
    const uint64_t budget = shm_free / (2 * uint64_t(world_));
    while (ring_ > kMinRing && uint64_t(world_ - 1) * ring_ > budget) ring_ /= 2;
    if (ring_ < kDefaultRing)
      host_.info("shmem '", name_, "' rank ", rank_, ": rings of ", mib(ring_), " instead of ", mib(kDefaultRing),
                 " because /dev/shm has ", mib(shm_free), " free for ", world_, " ranks");
  }
  max_frag_ = ring_ / 4;
  bytes_ = seg_bytes(world_, ring_);
  int rc = ::ftruncate(fd, static_cast<off_t>(bytes_));
  if (rc != 0) {
    rc = errno;
  } else {
    // Reserve every page but those of this rank's own ring (never used), so
    // that a full /dev/shm fails here and not as a SIGBUS later.
    const off_t own = static_cast<off_t>(ring_offset(world_, rank_, ring_));
    rc = ::posix_fallocate(fd, 0, own);
    if (rc == 0 && rank_ + 1 < world_) rc = ::posix_fallocate(fd, own + off_t(ring_), off_t(bytes_) - own - off_t(ring_));
  }
  if (rc != 0) {
    ::close(fd);
    ::shm_unlink(segment_.c_str());
    const uint64_t free_b = ::statvfs("/dev/shm", &sv) == 0 ? uint64_t(sv.f_bavail) * sv.f_frsize : 0;
    STRATA_THROW(STRATA_ERR_UNAVAILABLE,
                 "transport 'shmem': cannot reserve ", mib(bytes_), " in /dev/shm for rank ", rank_,
                 " of communicator '", name_, "' (", std::strerror(rc), "; ", mib(free_b),
                 " free there): each rank needs (world_size - 1) x ring_bytes (", world_ - 1, " x ",
                 mib(ring_), "); lower option 'ring_bytes' or enlarge /dev/shm (docker: --shm-size)");
  }
  void* m = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    ::shm_unlink(segment_.c_str());
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, "transport 'shmem': cannot map /dev/shm", segment_, " (",
                 std::strerror(errno), ")");
  }
  base_ = static_cast<char*>(m);
  hdr_ = new (base_) SegHeader();
  hdr_->magic = kMagic;
  hdr_->version = kLayoutVersion;
  hdr_->rank = rank_;
  hdr_->world = world_;
  hdr_->ring_bytes = ring_;
  // Peers read these fields only after they read this segment's name from
  // the store, which orders them (a lock or a socket round trip).
  for (int s = 0; s < world_; ++s) new (ring_ctl(base_, s)) RingCtl();

  const std::string key = str_cat(name_, "/shmem/seg/");
  host_.store_set(key + std::to_string(rank_), str_cat(segment_, " ", me_.boot_id, " ", me_.pid, " ", me_.start, " ", pidns_),
                  left_ms());
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    std::string rec;
    try {
      rec = host_.store_get(key + std::to_string(p), left_ms());
    } catch (const Error& e) {
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
      const std::string missing =
          sdk::missing_ranks(host_, world_, rank_, [&](int r) { return key + std::to_string(r); });
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "transport 'shmem': communicator '", name_, "' rank ", rank_,
                   ": ", missing.empty() ? peer_name(p) : missing, " never joined within ", timeout_ms,
                   " ms (not started, crashed, or slow to start)", sdk::refused_connections_text(host_));
    }
    Peer& P = peers_[p];
    std::istringstream in(rec);
    uint64_t peer_pidns = 0;
    in >> P.segment >> P.proc.boot_id >> P.proc.pid >> P.proc.start >> peer_pidns;
    if (!in || P.segment.rfind(std::string("/") + kPrefix, 0) != 0)
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "transport 'shmem': rank ", p, " of communicator '", name_,
                   "' published a malformed record '", rec, "'");
    if (P.proc.boot_id != me_.boot_id)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "transport 'shmem': ", peer_name(p), " of communicator '",
                   name_, "' runs on another host (boot id ", P.proc.boot_id, ", this host's is ", me_.boot_id,
                   "); shared memory joins ranks of one host only: use transport 'auto' (shared memory "
                   "within a host, the network between hosts) or 'tcp'");
    // A peer in another pid namespace (a container sharing /dev/shm) cannot
    // be looked up by pid: it is watched through its goodbye or abort
    // notice and the wait deadline only.
    P.same_pidns = peer_pidns == pidns_ && pidns_ != 0;
    P.other_process = !(P.same_pidns && P.proc.pid == me_.pid);
    const int pfd = ::shm_open(P.segment.c_str(), O_RDWR | O_CLOEXEC, 0);
    struct stat st {};
    if (pfd < 0 || ::fstat(pfd, &st) != 0 || static_cast<uint64_t>(st.st_size) < sizeof(SegHeader)) {
      const int e = errno;
      if (pfd >= 0) ::close(pfd);
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, "transport 'shmem': cannot open the shared memory of ", peer_name(p),
                   " (/dev/shm", P.segment, ": ", pfd < 0 ? std::strerror(e) : "too small to be a segment",
                   "); every rank must run on this host as the same user");
    }
    const uint64_t peer_bytes = static_cast<uint64_t>(st.st_size);
    void* pm = ::mmap(nullptr, peer_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    ::close(pfd);
    if (pm == MAP_FAILED)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, "transport 'shmem': cannot map the shared memory of ", peer_name(p),
                   " (", std::strerror(errno), ")");
    P.base = static_cast<char*>(pm);
    P.map_bytes = peer_bytes;
    P.hdr = reinterpret_cast<SegHeader*>(P.base);
    const uint64_t pring = P.hdr->ring_bytes;
    if (P.hdr->magic != kMagic || P.hdr->version != kLayoutVersion || P.hdr->rank != p ||
        P.hdr->world != world_ || pring < kMinRing || pring > kMaxRing || (pring & (pring - 1)) != 0 ||
        seg_bytes(world_, pring) != peer_bytes)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "transport 'shmem': the shared memory of ", peer_name(p),
                   " of communicator '", name_, "' does not match this rank's (layout ", P.hdr->version,
                   ", world ", P.hdr->world, ", ring ", pring, " bytes, ", peer_bytes, " bytes; this rank: layout ",
                   kLayoutVersion, ", world ", world_,
                   "); every rank must run the same Strata version with the same world size");
    P.out_ring = pring;
    P.out_frag = pring / 4;
    P.out = ring_ctl(P.base, rank_);
    P.out_data = ring_data(P.base, world_, rank_, pring);
    P.in = ring_ctl(base_, p);
    P.in_data = ring_data(base_, world_, p, ring_);
  }
  // Every rank has mapped every segment: the names can go.
  sdk::rendezvous_gate(host_, name_ + "/shmem/mapped", rank_, world_, left_ms(), "transport 'shmem'");
  ::shm_unlink(segment_.c_str());
  unlinked_ = true;
  host_.debug("shmem '", name_, "' rank ", rank_, ": ", world_, " ranks, segment ", mib(bytes_), " (ring ",
              mib(ring_), " per sender)");
}

ShmemComm::~ShmemComm() {
  if (staged_why_[0] + staged_why_[1] + staged_why_[2] != 0)
    host_.debug("shmem '", name_, "' rank ", rank_, ": staged ", staged_why_[0] + staged_why_[1] + staged_why_[2],
                " message(s) that arrived before their receive (", staged_why_[0], " with another receive behind ",
                "them, ", staged_why_[1], " with their sender stuck, ", staged_why_[2], " from a sender that left)");
  if (hdr_ != nullptr) {
    uint32_t open = kOpen;
    hdr_->state.compare_exchange_strong(open, kGoodbye, std::memory_order_acq_rel);
    for (Peer& P : peers_)
      if (P.hdr != nullptr) ring_bell(P.hdr);
    ring_bell(hdr_);
  }
  for (Peer& P : peers_)
    if (P.base != nullptr) ::munmap(P.base, P.map_bytes);
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (!unlinked_ && !segment_.empty()) ::shm_unlink(segment_.c_str());
}

// ---------------------------------------------------------------- abort ---

void ShmemComm::abort(const char* reason) noexcept {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true);
  }
  if (hdr_ == nullptr) return;
  uint32_t open = kOpen;
  if (hdr_->state.load(std::memory_order_acquire) == kOpen) {
    std::strncpy(hdr_->reason, reason, sizeof hdr_->reason - 1);
    hdr_->state.compare_exchange_strong(open, kAborted, std::memory_order_acq_rel);
  }
  ring_bell(hdr_);  // this rank's waiters
  for (Peer& P : peers_)
    if (P.hdr != nullptr) ring_bell(P.hdr);
}

void ShmemComm::fail_aborted_locked(Request* r) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  finish_locked(r, STRATA_ERR_ABORTED, str_cat(describe(*r), ": communicator '", name_, "' was aborted: ", abort_reason_));
}

void ShmemComm::fail_all_aborted_locked() {
  abort_handled_ = true;
  for (auto& slot : slots_)
    if (Request* r = slot.get(); r->live) fail_aborted_locked(r);
  for (Peer& P : peers_) {
    P.sendq.clear();
    P.posted.clear();
    if (P.cur.active) P.cur.req = nullptr;
  }
  wake_local_waiters();
}

// ------------------------------------------------------ requests, state ---

void ShmemComm::check_buffer(int32_t peer, const strata_buffer& buf, const char* op) const {
  if (peer < 0 || peer >= world_ || peer == rank_)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op, ": peer ", peer, " is not another rank of communicator '", name_,
                 "' (world size ", world_, ", this is rank ", rank_, ")");
  if (buf.device.device_type != kDLCPU)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op,
                 ": the shmem transport moves host memory only; stage device buffers in host memory");
  if (buf.data == nullptr && buf.bytes != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op, ": buffer data is NULL but bytes = ", buf.bytes);
}

Request* ShmemComm::new_request_locked(bool is_send, int32_t peer, uint64_t tag, const strata_buffer& buf) {
  uint32_t idx;
  if (!free_slots_.empty()) {
    idx = free_slots_.back();
    free_slots_.pop_back();
  } else {
    idx = static_cast<uint32_t>(slots_.size());
    slots_.push_back(std::make_unique<Request>());
  }
  Request* r = slots_[idx].get();
  // Field by field: the slot's string and vector keep their storage.
  r->is_send = is_send;
  r->peer = peer;
  r->tag = tag;
  r->data = static_cast<char*>(buf.data);
  r->bytes = buf.bytes;
  r->done = 0;
  r->started = false;
  r->finished = false;
  r->status = STRATA_OK;
  r->error.clear();
  if (r->owned.capacity() != 0) std::vector<char>().swap(r->owned);  // rare, and possibly large
  r->owned_from = 0;
  r->idx = idx;
  ++r->gen;
  r->live = true;
  return r;
}

void ShmemComm::finish_locked(Request* r, strata_status_t code, std::string error) {
  if (r->finished) return;
  r->finished = true;
  r->status = code;
  r->error = std::move(error);
}

uint64_t ShmemComm::release_locked(Request* r) {
  r->live = false;
  free_slots_.push_back(r->idx);
  if (r->status != STRATA_OK) detail::throw_status(r->status, r->error);
  return r->done;
}

void ShmemComm::fail_peer_locked(int p, strata_status_t code, const std::string& reason) {
  Peer& P = peers_[p];
  if (P.failed) return;
  P.failed = true;
  P.fail_code = code;
  P.fail_reason = reason;
  for (Request* r : P.sendq) finish_locked(r, code, str_cat(describe(*r), ": ", reason));
  for (Request* r : P.posted) finish_locked(r, code, str_cat(describe(*r), ": ", reason));
  P.sendq.clear();
  P.posted.clear();
  if (P.cur.active && P.cur.req != nullptr) finish_locked(P.cur.req, code, str_cat(describe(*P.cur.req), ": ", reason));
  if (P.cur.active && P.cur.staged != nullptr) {
    // A message cut short can never be received.
    for (auto it = P.staged.begin(); it != P.staged.end(); ++it)
      if (&*it == P.cur.staged) {
        staged_bytes_ -= it->total;
        P.staged.erase(it);
        break;
      }
  }
  P.cur = Incoming{};
  wake_local_waiters();
}

// Peers that closed (goodbye or abort) and, with `liveness`, peers whose
// process is gone: what they sent before stays receivable; requests that
// still need them fail.
void ShmemComm::check_peers_locked(bool liveness) {
  for (int p = 0; p < world_; ++p) {
    Peer& P = peers_[p];
    if (p == rank_ || P.failed || P.hdr == nullptr) continue;
    const bool pending = !P.sendq.empty() || !P.posted.empty() || P.cur.active;
    if (!pending) continue;
    const uint32_t st = P.hdr->state.load(std::memory_order_acquire);
    std::string why;
    if (st == kGoodbye) why = "it closed its communicator";
    else if (st == kAborted)
      why = str_cat("it aborted its communicator: ", std::string(P.hdr->reason, strnlen(P.hdr->reason, sizeof P.hdr->reason)));
    else if (liveness && P.other_process && P.same_pidns)
      why = proc_gone(P.proc);
    if (why.empty()) continue;
    receive_locked(p);  // drain what it sent before (staging what is not posted)
    if (!P.sendq.empty() || !P.posted.empty() || P.cur.active) {
      const std::string reason = str_cat(peer_name(p), " is gone: ", why);
      host_.warn("shmem '", name_, "' rank ", rank_, ": ", reason);
      fail_peer_locked(p, STRATA_ERR_UNAVAILABLE, reason);
    }
  }
}

// ------------------------------------------------------------- progress ---

// Stream what fits of peer p's send queue into its ring.
bool ShmemComm::send_locked(int p) {
  Peer& P = peers_[p];
  const uint64_t ring = P.out_ring;
  bool moved = false;
  while (!P.sendq.empty()) {
    Request* r = P.sendq.front();
    const uint64_t remaining = r->bytes - r->done;
    uint64_t len = std::min(remaining, P.out_frag);
    uint64_t free = ring - (P.out_tail - P.out->head.load(std::memory_order_acquire));
    if (rec_bytes(len) > free) {
      const uint64_t fits = free > kRecHeader ? (free - kRecHeader) & ~uint64_t(31) : 0;
      if (fits >= std::min(len, kMinPartial)) {
        len = std::min(len, fits);
      } else {
        // Ask the receiver to ring this rank's bell when it frees room, then
        // look again (it may have freed it meanwhile).
        P.out->sender_waiting.store(1, std::memory_order_seq_cst);
        free = ring - (P.out_tail - P.out->head.load(std::memory_order_seq_cst));
        const uint64_t fits2 = free > kRecHeader ? (free - kRecHeader) & ~uint64_t(31) : 0;
        if (fits2 < std::min(len, kMinPartial)) break;
        len = std::min(len, fits2);
      }
    }
    RecHeader h{r->tag, r->bytes, static_cast<uint32_t>(len), r->started ? 0u : kFirst, 0};
    copy_in(P.out_data, ring, P.out_tail, &h, kRecHeader);
    if (len != 0) {
      const char* src = r->owned.empty() ? r->data + r->done : r->owned.data() + (r->done - r->owned_from);
      copy_in(P.out_data, ring, P.out_tail + kRecHeader, src, len);
    }
    P.out_tail += rec_bytes(len);
    P.out->tail.store(P.out_tail, std::memory_order_release);
    r->started = true;
    r->done += len;
    moved = true;
    if (r->done == r->bytes) {
      P.sendq.pop_front();
      finish_locked(r, STRATA_OK);
    }
  }
  if (moved) {
    ring_bell(P.hdr);
    wake_local_waiters();
  }
  return moved;
}

// Move what peer p's ring holds into posted receives (or staging).
bool ShmemComm::receive_locked(int p) {
  Peer& P = peers_[p];
  const uint64_t ring = ring_;
  bool moved = false;
  uint64_t tail = P.in->tail.load(std::memory_order_acquire);
  while (P.in_head != tail) {
    RecHeader h;
    copy_out(P.in_data, ring, P.in_head, &h, kRecHeader);
    if (h.len > max_frag_ || rec_bytes(h.len) > tail - P.in_head) {
      malformed_locked(p, str_cat(h.len, " bytes announced, ", tail - P.in_head, " published"));
      return moved;
    }
    if (!P.cur.active) {
      if ((h.flags & kFirst) == 0) {
        malformed_locked(p, "a message's middle without its start");
        return moved;
      }
      Request* r = nullptr;
      for (auto it = P.posted.begin(); it != P.posted.end(); ++it)
        if ((*it)->tag == h.tag) {
          r = *it;
          P.posted.erase(it);
          break;
        }
      if (r == nullptr) {
        // Leave it in the ring, where its receive will take it directly,
        // unless something waits behind it.
        // A sender waiting for room gets it only once this rank's caller
        // has seen nothing move for kStuckAfter (stuck_): usually the
        // receive is about to be posted, and staging costs an allocation
        // and a second copy.
        const bool closed = P.hdr->state.load(std::memory_order_acquire) != kOpen;
        const bool sender_stuck = stuck_ && P.in->sender_waiting.load(std::memory_order_seq_cst) != 0;
        if (P.posted.empty() && !closed && !sender_stuck) break;
        if (staged_bytes_ + h.total > opts_.max_unexpected_bytes) {
          fail_peer_locked(p, STRATA_ERR_FAILED_PRECONDITION,
                           str_cat(peer_name(p), " sent a message of ", h.total, " bytes with tag ", h.tag,
                                   " before its receive was posted, and ", staged_bytes_,
                                   " bytes are already staged; max_unexpected_bytes is ",
                                   opts_.max_unexpected_bytes, ": post receives earlier or raise the option"));
          return moved;
        }
        P.staged.push_back(Staged{h.tag, h.total, 0, std::vector<char>(h.total)});
        staged_bytes_ += h.total;
        ++staged_why_[!P.posted.empty() ? 0 : closed ? 2 : 1];
        P.cur = Incoming{true, h.total, 0, nullptr, &P.staged.back()};
      } else if (h.total > r->bytes) {
        fail_too_small_locked(r, h.total);
        P.cur = Incoming{true, h.total, 0, nullptr, nullptr};
      } else {
        r->started = true;
        P.cur = Incoming{true, h.total, 0, r, nullptr};
      }
    }
    if (P.cur.got + h.len > P.cur.total) {
      malformed_locked(p, "more bytes than its message's size");
      return moved;
    }
    char* dst = P.cur.req != nullptr      ? P.cur.req->data + P.cur.got
                : P.cur.staged != nullptr ? P.cur.staged->data.data() + P.cur.got
                                          : nullptr;
    if (dst != nullptr && h.len != 0) copy_out(P.in_data, ring, P.in_head + kRecHeader, dst, h.len);
    P.cur.got += h.len;
    if (P.cur.staged != nullptr) P.cur.staged->got = P.cur.got;
    P.in_head += rec_bytes(h.len);
    P.in->head.store(P.in_head, std::memory_order_release);
    moved = true;
    if (P.cur.got == P.cur.total) {
      if (P.cur.req != nullptr) {
        P.cur.req->done = P.cur.total;
        finish_locked(P.cur.req, STRATA_OK);
      }
      P.cur = Incoming{};
    }
    if (P.in_head == tail) tail = P.in->tail.load(std::memory_order_acquire);
  }
  if (moved) {
    // Store the head again seq_cst (no fence: ThreadSanitizer cannot see
    // fences), so the load of sender_waiting below cannot pass it: with the
    // sender's seq_cst flag store and head load, one of the two sees the
    // other.
    P.in->head.store(P.in_head, std::memory_order_seq_cst);
    if (P.in->sender_waiting.load(std::memory_order_seq_cst) != 0 && P.in->sender_waiting.exchange(0) != 0)
      ring_bell(P.hdr);
    wake_local_waiters();
  }
  return moved;
}

bool ShmemComm::progress_locked() {
  if (aborted_locked()) return false;
  bool moved = false;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || peers_[p].failed) continue;
    if (!peers_[p].sendq.empty()) moved |= send_locked(p);
    moved |= receive_locked(p);
  }
  check_peers_locked(false);
  if (moved) ++moves_;
  return moved;
}

// ------------------------------------------------------------ isend/irecv ---

strata_request_t ShmemComm::isend(int32_t peer, uint64_t tag, const strata_buffer& buf) {
  check_buffer(peer, buf, "isend");
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = new_request_locked(true, peer, tag, buf);
  Peer& P = peers_[peer];
  if (aborted_locked()) {
    fail_aborted_locked(r);
  } else if (P.failed) {
    finish_locked(r, P.fail_code, str_cat(describe(*r), ": ", P.fail_reason));
  } else if (P.hdr->state.load(std::memory_order_acquire) != kOpen) {
    P.sendq.push_back(r);
    check_peers_locked(false);
  } else {
    P.sendq.push_back(r);
    if (P.sendq.size() == 1 && send_locked(peer)) ++moves_;
  }
  return handle_of(r);
}

strata_request_t ShmemComm::irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) {
  check_buffer(peer, buf, "irecv");
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = new_request_locked(false, peer, tag, buf);
  Peer& P = peers_[peer];
  if (aborted_locked()) {
    fail_aborted_locked(r);
    return handle_of(r);
  }
  // A staged message with this tag comes first (it was sent before
  // anything still in the ring).
  for (auto it = P.staged.begin(); it != P.staged.end(); ++it) {
    if (it->tag != tag) continue;
    r->started = true;
    if (it->total > r->bytes) {
      fail_too_small_locked(r, it->total);
      if (P.cur.staged == &*it) P.cur.staged = nullptr;  // drain the rest
    } else {
      if (it->got != 0) std::memcpy(r->data, it->data.data(), it->got);
      if (it->got == it->total) {
        r->done = it->total;
        finish_locked(r, STRATA_OK);
      } else {
        P.cur.staged = nullptr;  // the rest lands in the receive's buffer
        P.cur.req = r;
      }
    }
    staged_bytes_ -= it->total;
    P.staged.erase(it);
    return handle_of(r);
  }
  if (P.failed) {
    finish_locked(r, P.fail_code, str_cat(describe(*r), ": ", P.fail_reason));
    return handle_of(r);
  }
  P.posted.push_back(r);
  stuck_ = false;
  if (receive_locked(peer)) ++moves_;
  return handle_of(r);
}

// ------------------------------------------------------ test/wait/cancel ---

bool ShmemComm::test(strata_request_t h, uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = lookup_locked(h);
  if (!r->finished) {
    const auto now = Clock::now();
    if (moves_ != moves_seen_) {
      moves_seen_ = moves_;
      last_progress_ = now;
    }
    stuck_ = now - last_progress_ > kStuckAfter;
    progress_locked();
    if (!r->finished && now >= next_liveness_) {
      check_peers_locked(true);
      next_liveness_ = now + kLivenessEvery;
    }
    if (!r->finished) return false;
  }
  *bytes = release_locked(r);
  return true;
}

std::string ShmemComm::deadline_text(const Request& r, int64_t timeout_ms) const {
  const Peer& P = peers_[r.peer];
  std::string state;
  if (r.is_send)
    state = r.started ? str_cat(r.done, " of ", r.bytes, " bytes are in its ring, which is full: the peer is not "
                                "receiving (stalled, or behind in the program)")
                      : str_cat("its ring is full: the peer is not receiving (stalled, or behind in the program)");
  else if (r.started)
    state = str_cat("the message started (", P.cur.req == &r ? P.cur.got : 0, " of ", P.cur.total,
                    " bytes arrived) but its sender is not sending the rest (stalled)");
  else
    state = "no message with this tag arrived: the peer is alive but has not sent it (stalled, or behind in the "
            "program)";
  return str_cat(describe(r), " did not complete within ", timeout_ms, " ms on communicator '", name_, "' (rank ",
                 rank_, "): ", state);
}

uint64_t ShmemComm::wait(strata_request_t h, int64_t timeout_ms) {
  {
    // One look before any clock is read: a small send is complete when
    // isend returns, and a receive has often arrived by now.
    std::lock_guard<std::mutex> lock(mu_);
    Request* r = lookup_locked(h);
    if (!r->finished) {
      stuck_ = false;
      progress_locked();
    }
    if (r->finished) return release_locked(r);
  }
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  // One clock read per round: the progress it makes is dated at the round's
  // start.
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  WaitPacer pacer(start);
  auto moved_at = start;
  for (auto now = start;; now = Clock::now()) {
    const uint32_t seen = hdr_->bell.load(std::memory_order_seq_cst);
    {
      std::lock_guard<std::mutex> lock(mu_);
      Request* r = lookup_locked(h);
      stuck_ = now - moved_at > kStuckAfter;
      if (!r->finished && progress_locked()) {
        pacer.progressed(now);
        moved_at = now;
      }
      if (!r->finished && now >= next_liveness_) {
        check_peers_locked(true);
        next_liveness_ = now + kLivenessEvery;
      }
      if (r->finished) return release_locked(r);
      if (now >= deadline) STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, deadline_text(*r, timeout_ms));
    }
    if (pacer.polling(now)) {
      // Yield between polls only when this job's own ranks outnumber the
      // cores (the peer waited for is then likely one of them, waiting for
      // a core). When other programs make the machine busy, yielding hands
      // the core to them and both ranks are rarely on a core together
      // (2 ranks beside two busy loops: 4 KiB took 1.5 ms yielding, as
      // against Open MPI's 4 us spinning), so the wait spins, as MPI does.
      if (oversubscribed_by_job_ && !pacer.busy_polling()) {
        pacer.pause(deadline);
        continue;
      }
      // Every event this rank can wait for rings its bell (a peer published
      // a record or freed room, closed or aborted), so the spin watches that
      // one word and runs the progress engine only when it moves, or every
      // kSpinChecks pauses (requests completed by this rank's other threads).
      for (int i = 0; i < kSpinChecks && hdr_->bell.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
      continue;
    }
    // Sleep until a peer rings this segment's bell, the deadline, or the
    // next liveness check (timed from this round's clock read).
    const auto until = std::min(deadline, now + kLivenessEvery);
    const int64_t ns = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(until - now).count());
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    hdr_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (hdr_->bell.load(std::memory_order_seq_cst) == seen) futex(&hdr_->bell, FUTEX_WAIT, seen, &ts);
    hdr_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmemComm::cancel(strata_request_t h) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = find_locked(h);
  if (r == nullptr) return;
  Peer& P = peers_[r->peer];
  if (r->is_send) {
    auto it = std::find(P.sendq.begin(), P.sendq.end(), r);
    if (it != P.sendq.end()) {
      if (r->started) {
        // Part of it is in the ring: the receiver expects the rest, so it
        // goes from a copy (the caller may free its buffer now).
        // (An internal request: nobody releases it; its slot stays taken.)
        const strata_buffer none{};
        Request* rest = new_request_locked(true, r->peer, r->tag, none);
        rest->bytes = r->bytes;
        rest->done = r->done;
        rest->started = true;
        rest->owned.assign(r->data + r->done, r->data + r->bytes);
        rest->owned_from = r->done;
        *it = rest;
      } else {
        P.sendq.erase(it);
      }
    }
  } else {
    auto it = std::find(P.posted.begin(), P.posted.end(), r);
    if (it != P.posted.end()) P.posted.erase(it);
    if (P.cur.req == r) P.cur.req = nullptr;  // drain the rest of its message
  }
  r->live = false;
  free_slots_.push_back(r->idx);
}

// ------------------------------------------------------------ transport ---

ShmemTransport::ShmemTransport(sdk::Host host, const char* options_json) : host_(std::move(host)) {
  const std::string comp = "transport 'shmem'";
  const auto o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o, {"ring_bytes", "timeout_s", "max_unexpected_bytes"}, comp);
  opts_.ring_bytes = sdk::get_option<uint64_t>(o, "ring_bytes", 0, comp);
  if (opts_.ring_bytes != 0 && (opts_.ring_bytes < kMinRing || opts_.ring_bytes > kMaxRing ||
                                (opts_.ring_bytes & (opts_.ring_bytes - 1)) != 0))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'ring_bytes' of ", comp,
                 " must be a power of two from 65536 (64 KiB) to 67108864 (64 MiB), got ", opts_.ring_bytes);
  opts_.max_unexpected_bytes =
      sdk::get_option<uint64_t>(o, "max_unexpected_bytes", opts_.max_unexpected_bytes, comp);
  opts_.timeout_s = sdk::collective_timeout_s(host_, o, comp);
  // shm_open lives in /dev/shm: without it (or without write access) this
  // transport cannot run here, and "auto" should hear so now, not at
  // comm_create.
  if (::access("/dev/shm", W_OK | X_OK) != 0)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, comp, " cannot run here: /dev/shm is ",
                 errno == ENOENT ? "missing" : "not writable by this user", " (", std::strerror(errno),
                 "); mount a tmpfs there or use transport 'tcp'");
}

strata_transport_caps ShmemTransport::caps() {
  strata_transport_caps c{};
  c.flags = STRATA_TRANSPORT_CAP_P2P | STRATA_TRANSPORT_CAP_MEM_HOST | STRATA_TRANSPORT_CAP_THREAD_SAFE;
  c.max_inflight = 0;
  c.max_message_bytes = 0;
  c.preferred_chunk_bytes = std::max<uint64_t>((opts_.ring_bytes != 0 ? opts_.ring_bytes : kDefaultRing) / 2, 64 << 10);
  return c;
}

std::unique_ptr<sdk::CommBase> ShmemTransport::comm_create(const char* name, int32_t rank, int32_t world_size,
                                                           int64_t timeout_ms) {
  sdk::check_comm_create_args(name, rank, world_size);
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  auto comm = std::make_unique<ShmemComm>(host_, opts_, name, rank, world_size);
  comm->setup(timeout_ms);
  return comm;
}

}  // namespace strata::transport::shmem

STRATA_PLUGIN("strata-transport-shmem", "0.1.0",
              STRATA_TRANSPORT_COMPONENT(strata::transport::shmem::ShmemTransport, "shmem", "0.1.0"));
