// SPDX-License-Identifier: Apache-2.0
#include "libfabric_transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "strata/sdk/options.hpp"
#include "fabric_lib.h"
#include "wire.h"
#include "../common/proc_identity.h"
#include "../common/wait_pacer.h"

namespace strata::transport::libfabric {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 10);
// Payloads up to this ride in the control message: 8 KiB plus room for a
// caller's own header (the ring's step-0 fingerprint is 80 bytes), so that
// a 4 or 8 KiB collective travels as one message instead of a control
// message and a data message that the receiver must match first.
constexpr uint64_t kEagerBytes = 8192 + 256;
constexpr uint64_t kKeyMagic = 0x53544d52454b4559ull;
constexpr int kCtrlRecvSlots = 64;
constexpr int kSendSlotsPerSlab = 64;
constexpr size_t kMaxCacheEntries = 64;
// Data messages of one send or receive in flight at once. A message split
// into many (max_message_bytes) must not flood either side: shm has room for
// 1024 posted receives per endpoint (more fail with -FI_ENOMEM), and data the
// receiver has not matched yet waits there as unexpected. Per request, not
// per peer, so a message the receiver takes later cannot hold back one it
// takes now.
constexpr size_t kDataWindow = 16;
// Data receives posted at once per communicator (shm has 1024 receive
// entries, shared with unexpected messages and the control receives).
constexpr size_t kMaxDataRecvs = 512;

// The provider has no room for another operation now; one completes first.
bool no_room(int ret) { return ret == -FI_EAGAIN || ret == -FI_ENOMEM; }
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);
// How long a failed request waits for its cancelled operations to leave the
// caller's buffer before it is released anyway.
constexpr auto kFailGrace = std::chrono::seconds(1);
// How long a same-process peer may be closed before its goodbye or its last
// messages arrive; then it is treated as closed without them.
constexpr auto kGoneGrace = std::chrono::seconds(2);
// How long a send whose data the provider already holds may still complete
// after its peer said goodbye: shm reports a send complete only once the
// receiver has copied it, and that report can come after the receiver's
// goodbye (the receiver took the data, finished and closed). Failing such
// a send at once failed collectives that every peer had completed
// (ring_test, 4 ranks in one process, about 1 run in 10).
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
// Control messages dropped for a wrong key (or malformed) are logged at
// most this often, with the count so far.
constexpr auto kForgedWarnPeriod = std::chrono::seconds(10);

constexpr size_t kSlotBytes = sizeof(CtrlHeader) + kEagerBytes;
// An eager message whose control message would exceed the provider's
// inject_size travels as this many inject-size control messages at most
// (kMsg, then kFrag: wire.h), when the provider's inject_size allows that
// for every eager size; otherwise as one. Above inject_size a provider may
// switch to a costlier protocol: shm (inject_size 4 KiB) has the receiver
// read the sender's memory (process_vm_readv) and acknowledge it, which made
// a 4 KiB collective's 4,256-byte control message take several times as long
// as two injected ones. Providers whose inject_size is small (tcp;ofi_rxm:
// 64, below the 80-byte header) send every control message whole, as before.
constexpr uint64_t kMaxFragments = 3;

struct ExportedKey {
  uint64_t magic;
  uint64_t addr;  // remote address of the region's first byte (0 without FI_MR_VIRT_ADDR)
  uint64_t key;
  uint64_t len;
};

std::string fi_error_text(int ret) { return str_cat(fabric_lib().strerror(ret < 0 ? -ret : ret), " (", ret, ")"); }

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    s += d[b[i] >> 4];
    s += d[b[i] & 15];
  }
  return s;
}

bool unhex(const std::string& s, std::vector<uint8_t>* out) {
  if (s.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    auto v = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = v(s[i]), lo = v(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<uint8_t>(hi * 16 + lo));
  }
  return true;
}

// Provider preference for the default choice: NIC providers first, then
// tcp; -1 = only when named (no inter-node path, or a debug provider).
int provider_rank(const std::string& prov) {
  for (const char* excluded : {"udp", "sockets", "shm", "sm2", "rxd", "net", "hook", "mrail"})
    if (prov.find(excluded) != std::string::npos) return -1;
  if (prov.rfind("tcp", 0) == 0) return 10;
  return 0;
}

std::string iface_address(const std::string& iface, const std::string& comp) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, comp, ": cannot list network interfaces for option 'iface' = '", iface,
                 "' (", std::strerror(errno), ")");
  std::string found, names;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    names += str_cat(names.empty() ? "" : ", ", a->ifa_name, " (", buf, ")");
    if (found.empty() && iface == a->ifa_name) found = buf;
  }
  ::freeifaddrs(list);
  if (found.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, comp, ": option 'iface' = '", iface,
                 "' is not an interface with an IPv4 address; interfaces: ", names.empty() ? "(none)" : names);
  return found;
}

fi_info* make_hints(const Options& o, bool rma) {
  fi_info* h = fabric_lib().dupinfo(nullptr);
  if (h == nullptr) throw std::bad_alloc();
  h->caps = FI_TAGGED | (rma ? (FI_RMA | FI_WRITE | FI_REMOTE_WRITE) : 0);
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  if (!o.provider.empty()) h->fabric_attr->prov_name = ::strdup(o.provider.c_str());
  if (!o.domain.empty()) h->domain_attr->name = ::strdup(o.domain.c_str());
  return h;
}

struct InfoList {
  fi_info* head = nullptr;
  ~InfoList() {
    if (head != nullptr) fabric_lib().freeinfo(head);
  }
};

int query(const Options& o, bool rma, const std::string& node, fi_info** out) {
  fi_info* hints = make_hints(o, rma);
  const int ret = fabric_lib().getinfo(kApiVersion, node.empty() ? nullptr : node.c_str(), nullptr,
                             node.empty() ? 0 : FI_SOURCE, hints, out);
  fabric_lib().freeinfo(hints);
  return ret;
}

std::string present_providers() {
  Options any;
  InfoList l;
  if (query(any, false, "", &l.head) != 0) return "(none)";
  std::vector<std::string> names;
  for (fi_info* i = l.head; i != nullptr; i = i->next)
    if (std::find(names.begin(), names.end(), i->fabric_attr->prov_name) == names.end())
      names.emplace_back(i->fabric_attr->prov_name);
  std::string s;
  for (auto& n : names) s += str_cat(s.empty() ? "" : ", ", "\"", n, "\"");
  return s.empty() ? "(none)" : s;
}

// ------------------------------------------------------------ requests ---

struct Request;

enum class OpKind : uint8_t { kCtrlRecv, kCtrlSend, kDataSend, kDataRecv, kDrain, kWrite };

struct SendSlot {
  char* p = nullptr;
  void* desc = nullptr;
};

// One libfabric operation. The provider's per-operation scratch (FI_CONTEXT,
// FI_CONTEXT2) is its first member, so the completion's op_context is the Op.
struct Op {
  fi_context2 ctx;
  uint64_t serial = 0;  // unique per communicator (addresses are reused)
  OpKind kind = OpKind::kCtrlRecv;
  bool posted = false;
  Request* req = nullptr;  // null: orphaned (its request was released or failed)
  int peer = -1;
  char* buf = nullptr;
  uint64_t len = 0;
  void* desc = nullptr;
  uint64_t wire_tag = 0;
  uint64_t remote_addr = 0, rkey = 0;
  SendSlot slot;  // kCtrlSend
  uint64_t got = 0;  // kCtrlRecv: bytes the completion reported
  size_t* count = nullptr;  // a counter of live ops of this kind, if any
  size_t set_index = 0;     // position in LfComm::ops_
  Op() = default;
  // For reuse from the communicator's pool (ctx is the provider's scratch).
  void reset() {
    serial = 0;
    kind = OpKind::kCtrlRecv;
    posted = false;
    req = nullptr;
    peer = -1;
    buf = nullptr;
    len = 0;
    desc = nullptr;
    wire_tag = remote_addr = rkey = 0;
    slot = SendSlot{};
    got = 0;
    count = nullptr;
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op() {
    if (count != nullptr) --*count;
  }
};

struct CacheEntry {
  uintptr_t lo = 0, hi = 0;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  int refs = 0;
  uint64_t last_use = 0;
};

// Pooled: reset() puts back every field but slot and gen; a field added
// here needs its line there.
struct Request {
  enum Kind { kSend, kRecv, kWrite } kind = kSend;
  int peer = -1;
  uint64_t tag = 0;
  char* data = nullptr;
  uint64_t bytes = 0;
  void* desc = nullptr;            // the caller's region, or the cache's
  CacheEntry* cached = nullptr;    // held while the request lives
  uint64_t ctrl_seq = 0;           // sends: message number to the peer
  uint64_t moved = 0;
  uint64_t expected = 0;            // receives: the matched message's size
  uint64_t msg_ctrl_seq = 0;        // receives: the matched message's control sequence
  bool matched = false;            // receives: a message is assigned
  bool finished = false;
  strata_status_t status = STRATA_OK;
  std::string error;
  Clock::time_point failed_at{};
  std::vector<Op*> ops;            // operations still pointing here
  uint64_t chunk = 0, nchunks = 0, first_seq = 0, next_chunk = 0;  // data messages, posted kDataWindow at a time
  bool awaiting_cts = false;       // split sends: data waits for the receiver's kCts
  bool cts_sent = false;           // split receives
  // Pool bookkeeping (LfComm::requests_): the slot and generation make the
  // handle, so a handle of a released request is rejected after its slot
  // is reused.
  uint32_t slot = 0, gen = 0;
  bool live = false;
  size_t set_index = 0;  // position in LfComm::live_

  // Back to a fresh request, keeping the pool bookkeeping (slot, gen) and
  // the storage of `ops` and `error`. Field by field: assigning a fresh
  // Request freed and rebuilt both, a visible cost per small message.
  void reset() {
    kind = kSend;
    peer = -1;
    tag = 0;
    data = nullptr;
    bytes = 0;
    desc = nullptr;
    cached = nullptr;
    ctrl_seq = moved = expected = msg_ctrl_seq = 0;
    matched = finished = false;
    status = STRATA_OK;
    error.clear();
    failed_at = {};
    ops.clear();
    chunk = nchunks = first_seq = next_chunk = 0;
    awaiting_cts = cts_sent = false;
    live = false;
    set_index = 0;
  }
};

// Pointers that store their position in the pointee (member `Index`), so
// that insert and erase allocate nothing (an unordered_set allocates a node
// per insert, several per message) and take constant time. Order is not
// kept. The pointees must outlive their membership (pooled here).
template <class T, size_t T::*Index>
class IndexedSet {
 public:
  void insert(T* x) {
    x->*Index = v_.size();
    v_.push_back(x);
  }
  bool contains(const T* x) const { return x->*Index < v_.size() && v_[x->*Index] == x; }
  size_t erase(T* x) {
    if (!contains(x)) return 0;
    T* last = v_.back();
    v_[x->*Index] = last;
    last->*Index = x->*Index;
    v_.pop_back();
    return 1;
  }
  size_t size() const { return v_.size(); }
  bool empty() const { return v_.empty(); }
  void clear() { v_.clear(); }
  typename std::vector<T*>::const_iterator begin() const { return v_.begin(); }
  typename std::vector<T*>::const_iterator end() const { return v_.end(); }

 private:
  std::vector<T*> v_;
};

struct Region {
  uint64_t magic = kKeyMagic;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  uintptr_t lo = 0;
  uint64_t len = 0;
};

struct InMsg {
  uint64_t kind = kMsg;
  uint64_t tag = 0, total = 0, first_seq = 0, nchunks = 0, chunk = 0;
  uint64_t ctrl_seq = 0;
  uint64_t carried = 0;       // eager payload bytes in this control message (< total: fragments follow)
  std::vector<char> payload;  // eager payload, once kept past its delivery
  // The eager payload still in the control receive slot: valid only while
  // the message is delivered from its completion (a receive already posted
  // gets it with one copy); keep() moves it into `payload` otherwise.
  const char* inline_data = nullptr;

  void keep() {
    if (inline_data == nullptr) return;
    payload.assign(inline_data, inline_data + carried);
    inline_data = nullptr;
  }
  const char* bytes() const { return inline_data != nullptr ? inline_data : payload.data(); }
};

// Per-tag queues that became empty stay in their map (and keep their
// storage) while the map is this small, so that a tag used again and again
// (the ring's step 0, a pingpong) allocates nothing per message.
constexpr size_t kKeptEmptyQueues = 16;
template <class Map, class It>
void erase_if_empty(Map& map, It it) {
  if (it->second.empty() && map.size() > kKeptEmptyQueues) map.erase(it);
}

struct Peer {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  std::string address;  // fi_av_straddr
  ProcId proc;
  bool local = false;   // same host, another process: liveness is checked
  bool same_process = false;
  std::string ep_key;   // its fi_getname, hex
  std::chrono::steady_clock::time_point gone_since{};  // same process: first seen closed without a goodbye
  uint64_t send_ctrl_seq = 0, send_data_seq = 0;
  uint64_t recv_ctrl_next = 0;
  std::map<uint64_t, InMsg> early;  // control messages ahead of recv_ctrl_next
  // A fragmented eager message being put together (kMsg then kFrag): its
  // head, and its payload so far in frag_buf (kept for the next one).
  bool assembling = false;
  InMsg frag_head;
  std::vector<char> frag_buf;
  uint64_t frag_have = 0;
  std::unordered_map<uint64_t, std::deque<Request*>> posted;
  std::unordered_map<uint64_t, std::deque<InMsg>> unexpected;
  bool failed = false;
  strata_status_t fail_code = STRATA_OK;
  std::string fail_reason;
  bool closed = false;  // said goodbye: what it sent before stays receivable
  std::string closed_reason;
  // Said goodbye while sends to it were with the provider (kCloseGrace).
  std::chrono::steady_clock::time_point closed_at{};
};

// Endpoints of this process that are open, by address. shm hands a peer
// endpoint of the same process its memory directly, and closing that
// endpoint unmaps it: a send to it after the close would crash. Sends to
// same-process peers therefore check here, under the same lock that the
// closing endpoint takes to leave before fi_close.
std::mutex& local_eps_mu() {
  static std::mutex mu;
  return mu;
}
std::unordered_set<std::string>& local_eps() {
  static std::unordered_set<std::string> eps;
  return eps;
}

// shm names each endpoint's region /dev/shm/<pid>:<domain>:<endpoint> and
// removes it only on a clean close. A killed process leaves its regions
// behind, and once pids wrap (pid_max is 32768 here) a new process with the
// same pid fails fi_enable with EBUSY on the stale name. Before creating an
// shm endpoint, remove regions whose creator is gone: another pid that no
// longer runs, or this pid but not created by this process (the names this
// process created are recorded, under this lock, as they are made). This
// assumes /dev/shm is not shared across PID namespaces (Docker gives each
// container its own unless run with --ipc=host).
std::mutex& shm_regions_mu() {
  static std::mutex mu;
  return mu;
}
std::set<std::string>& shm_regions_made() {
  static std::set<std::string> names;
  return names;
}

// Returns how many stale regions were removed. Caller holds shm_regions_mu().
int sweep_stale_shm_regions() {
  int removed = 0;
  const pid_t me = ::getpid();
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) {
    const char* n = e->d_name;
    char* end = nullptr;
    const long pid = std::strtol(n, &end, 10);
    if (end == n || *end != ':' || pid <= 0) continue;
    unsigned a = 0, b = 0;
    char extra = 0;
    if (std::sscanf(end, ":%u:%u%c", &a, &b, &extra) != 2) continue;
    bool stale = false;
    if (pid == me) {
      stale = shm_regions_made().count(n) == 0;
    } else {
      stale = ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    }
    if (stale && ::unlinkat(::dirfd(d), n, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

// Libfabric objects of a destroyed communicator, closed in order, and the
// memory registered with them.
struct Op;
struct Parked {
  std::vector<fid_t> fids;
  std::vector<std::unique_ptr<char[]>> memory;
  std::vector<Op*> ops;  // contexts the provider may still hold: freed after the close
};
struct ParkedGroup {
  int remaining = 0;  // members of the group in this process not yet destroyed
  std::vector<Parked> parked;
};
std::mutex& parked_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, ParkedGroup>& parked_groups() {
  static std::map<std::string, ParkedGroup> groups;
  return groups;
}

struct Slab {
  std::unique_ptr<char[]> mem;
  fid_mr* mr = nullptr;
};

}  // namespace

// ---------------------------------------------------------------- comm ---

class LfComm : public sdk::CommBase {
 public:
  LfComm(sdk::Host host, const Options& opts, const fi_info* info, bool rma, bool mr_local, std::string name,
         int32_t rank, int32_t world)
      : host_(std::move(host)), opts_(opts), info_(fabric_lib().dupinfo(info)), rma_(rma), mr_local_(mr_local),
        name_(std::move(name)), rank_(rank), world_(world), peers_(static_cast<size_t>(world)) {
    if (info_ == nullptr) throw std::bad_alloc();
    prov_ = info_->fabric_attr->prov_name;
  }
  ~LfComm() override;

  void setup(int64_t timeout_ms);

  void abort(const char* reason) noexcept override {
    try {
      {
        std::lock_guard<std::mutex> lock(abort_mu_);
        if (aborted_.load()) return;
        abort_reason_ = reason;
        aborted_.store(true);
      }
      // Tell the peers now when no other thread is inside the communicator;
      // otherwise that thread does it at its next progress (never block here).
      std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
      if (lock.owns_lock() && ep_ != nullptr) apply_abort_locked();
    } catch (...) {
    }
  }
  strata_mem_region_t mem_register(void* data, uint64_t bytes, DLDevice device) override;
  void mem_deregister(strata_mem_region_t mr) noexcept override;
  strata_request_t isend(int32_t peer, uint64_t tag, const strata_buffer& buf) override;
  strata_request_t irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) override;
  bool test(strata_request_t req, uint64_t* bytes) override;
  uint64_t wait(strata_request_t req, int64_t timeout_ms) override;
  void cancel(strata_request_t req) noexcept override;
  std::string mem_export(strata_mem_region_t mr);
  strata_request_t iwrite(int32_t peer, const strata_buffer& buf, const void* key, uint64_t key_len,
                          uint64_t remote_offset);

 private:
  std::string who() const { return str_cat("libfabric (", prov_, ") communicator '", name_, "' rank ", rank_); }
  std::string peer_name(int p) const {
    return peers_[p].address.empty() ? str_cat("rank ", p) : str_cat("rank ", p, " (", peers_[p].address, ")");
  }
  std::string describe(const Request& r) const {
    switch (r.kind) {
      case Request::kSend:
        return str_cat("isend #", r.ctrl_seq, " to ", peer_name(r.peer), " (tag ", r.tag, ", ", r.bytes, " bytes)");
      case Request::kRecv:
        return str_cat("irecv from ", peer_name(r.peer), " (tag ", r.tag, ", up to ", r.bytes, " bytes)");
      default:
        return str_cat("iwrite to ", peer_name(r.peer), " (", r.bytes, " bytes)");
    }
  }
  uint64_t ctrl_tag() const { return ctrl_wire_tag(tag_bits_); }
  uint64_t data_tag(int src, uint64_t seq) const { return data_wire_tag(src, seq, tag_bits_, seq_bits_, tag_mask_); }
  void sign(CtrlHeader* h, int dst) const { std::memcpy(h->auth, send_keys_[dst].data(), kAuthBytes); }
  void drop_ctrl_locked(const std::string& what);
  void check_peer(int32_t peer, const char* op) const;
  void check_host(const strata_buffer& buf, const char* op) const;
  Request* lookup_locked(strata_request_t h) const;
  Request* new_request_locked(Request::Kind kind, int peer, uint64_t tag, const strata_buffer& buf);
  void* region_desc_locked(const strata_buffer& buf, const char* op);
  bool ensure_desc_locked(Request* r);
  fid_mr* register_locked(void* p, uint64_t len, const char* what);
  CacheEntry* cache_get_locked(void* p, uint64_t len);
  void finish_locked(Request* r, strata_status_t code, const std::string& error);
  void orphan_ops_locked(Request* r);
  void cancel_ops_locked(Request* r);
  // Finished, and no operation uses the caller's buffer any more (or the
  // grace for cancelled ones is over).
  static bool visible(const Request& r) {
    return r.finished && (r.ops.empty() || Clock::now() >= r.failed_at + kFailGrace);
  }
  void unpost_locked(Request* r);
  uint64_t release_locked(Request* r);
  void fail_peer_locked(int p, strata_status_t code, const std::string& reason);
  void apply_abort_locked();
  // Completions and the backlog, then the liveness check when it is due
  // (at `now`, a time the caller has just read: a clock read costs about
  // 30 ns in a VM, as much as a poll of the shm provider's queue).
  void progress_locked() { progress_locked(Clock::now()); }
  void progress_locked(Clock::time_point now);
  // Completions and the backlog only (no clock read).
  void poll_locked();
  void check_liveness_locked(Clock::time_point now);
  void submit_locked(Op* op);
  void post_data_ops_locked(Request* r);
  int post_raw(Op* op);
  void post_failed_locked(Op* op, int ret);
  void on_completion_locked(Op* op, int err, const std::string& errtext);
  void on_ctrl_locked(Op* op);
  void derive_keys(const std::string& secret);
  void deliver_locked(int p, InMsg&& m);
  void match_locked(Request* r, InMsg&& m);
  void drain_locked(int p, const InMsg& m);
  CtrlHeader carrying_header(int p, uint64_t kind, uint64_t tag, uint64_t len);
  void send_notice_locked(int p, uint64_t kind, const std::string& reason, uint64_t ref = 0);
  void on_cts_locked(int p, uint64_t ctrl_seq);
  void post_starved_locked();
  void peer_closed_locked(int p, const InMsg& m);
  bool fail_closed_locked(int p, bool spare_held_sends);
  void post_ctrl_recv_locked(char* slot);
  void repost_ctrl_recvs_locked();
  void send_ctrl_locked(Request* r, int p, const CtrlHeader& h, const char* payload, uint64_t n);
  bool inject_locked(int p, const char* msg, size_t len);
  SendSlot take_send_slot_locked();

  sdk::Host host_;
  Options opts_;
  fi_info* info_;
  bool rma_, mr_local_;
  std::string prov_;
  std::string name_;
  int32_t rank_, world_;
  std::vector<Peer> peers_;
  ProcId me_;
  // More ranks of this communicator on this machine (this one, peers in
  // this process and local ones) than this process may use cores: waits
  // yield between polls (wait_pacer.h, yield_only_for_job).
  bool oversubscribed_by_job_ = false;
  std::string ep_key_;  // our fi_getname, hex (local_eps)

  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  int tag_bits_ = 64, seq_bits_ = 32;
  // Authentication (wire.h): the key of each pair (this rank -> p) that our
  // control messages carry, of (p -> this rank) that theirs must carry, and
  // the random bits mixed into data wire tags. Fixed after setup.
  std::vector<AuthKey> send_keys_, recv_keys_;
  uint64_t tag_mask_ = 0;
  uint64_t dropped_ = 0;  // control messages dropped as forged or malformed
  Clock::time_point next_drop_warn_{};
  uint64_t max_chunk_ = 1ull << 30;
  // Control messages up to inject_bytes_ (the provider's inject_size) are
  // injected (fi_tinject: no completion, nothing to track); eager payloads
  // above frag_payload_ travel in fragments of that size (0: whole).
  size_t inject_bytes_ = 0;
  uint64_t frag_payload_ = 0;
  std::unique_ptr<char[]> inject_buf_;  // header + payload of the message being injected
  uint64_t next_key_ = 1;
  bool virt_addr_ = false, prov_key_ = false, mr_endpoint_ = false;

  Slab recv_slab_;
  std::vector<Slab> send_slabs_;
  std::vector<SendSlot> free_send_;
  // Control receive slots whose message was handled, posted again at the
  // start of the next poll (or within it, once half the slots wait).
  std::vector<char*> repost_;
  // Drain targets for messages whose receive was too small: every drain
  // shares the newest (largest) one; older ones live until destruction.
  std::vector<Slab> drain_slabs_;
  uint64_t drain_bytes_ = 0;

  std::mutex mu_;
  // Requests and operations are pooled (a warm communicator allocates
  // nothing per message): requests_ holds every request (a deque, so their
  // addresses stay put), free_requests_ the free slots, op_pool_ free ops.
  std::deque<Request> requests_;
  std::vector<uint32_t> free_requests_;
  IndexedSet<Request, &Request::set_index> live_;
  IndexedSet<Op, &Op::set_index> ops_;
  std::vector<Op*> op_pool_;
  Op* new_op_locked() {
    if (op_pool_.empty()) return new Op();
    Op* op = op_pool_.back();
    op_pool_.pop_back();
    op->reset();
    return op;
  }
  void free_op_locked(Op* op) {
    if (op->count != nullptr) --*op->count;
    op->count = nullptr;
    op_pool_.push_back(op);
  }
  static strata_request_t handle_of(const Request* r) {
    return reinterpret_cast<strata_request_t>((static_cast<uintptr_t>(r->gen) << 32) | (uintptr_t(r->slot) + 1));
  }
  // Ops the provider had no room for (-FI_EAGAIN, or shm's -FI_ENOMEM for a
  // full receive queue), receives and sends apart so a full receive queue
  // never holds back a send the peer needs before it can free it.
  std::deque<Op*> backlog_[2];
  static int backlog_of(const Op* op) {
    return op->kind == OpKind::kCtrlRecv || op->kind == OpKind::kDataRecv || op->kind == OpKind::kDrain ? 0 : 1;
  }
  void unbacklog_locked(Op* op) {
    auto& q = backlog_[backlog_of(op)];
    q.erase(std::remove(q.begin(), q.end(), op), q.end());
  }
  uint64_t op_serial_ = 0;
  std::vector<std::unique_ptr<CacheEntry>> cache_;
  uint64_t cache_clock_ = 0;
  bool warned_unregistered_ = false;
  std::unordered_set<Region*> regions_;
  Region* checked_region_ = nullptr;  // the last region found in regions_ (cleared when it is deregistered)
  Clock::time_point next_liveness_{};
  bool closing_ = false;
  bool destroying_ = false;  // the destructor runs: post no new receives
  bool setup_done_ = false;  // setup() returned: peers know this endpoint
  size_t data_recvs_ = 0;  // kDataRecv ops alive (posted or backlogged)
  bool starved_ = false;   // a matched receive waits for room under kMaxDataRecvs
  uint64_t completions_ = 0;  // provider completions read so far (wait's pacer: progress is being made)

  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  bool abort_applied_ = false;
  std::string abort_reason_;
};

// ----------------------------------------------------- memory registration ---

fid_mr* LfComm::register_locked(void* p, uint64_t len, const char* what) {
  uint64_t access = FI_SEND | FI_RECV;
  if (rma_) access |= FI_WRITE | FI_REMOTE_WRITE;
  fid_mr* mr = nullptr;
  int ret = fi_mr_reg(domain_, p, len, access, 0, prov_key_ ? 0 : next_key_++, 0, &mr, nullptr);
  if (ret == 0 && mr_endpoint_) {
    ret = fi_mr_bind(mr, &ep_->fid, 0);
    if (ret == 0) ret = fi_mr_enable(mr);
    if (ret != 0) fi_close(&mr->fid);
  }
  if (ret != 0)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who(), ": cannot register ", len, " bytes at ", p, " (", what,
                 ") with provider ", prov_, ": ", fi_error_text(ret),
                 "; raise the locked-memory limit (ulimit -l) or register fewer/smaller buffers");
  return mr;
}

strata_mem_region_t LfComm::mem_register(void* data, uint64_t bytes, DLDevice device) {
  if (device.device_type != kDLCPU)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": mem_register got device type ",
                 static_cast<int>(device.device_type), "; this transport moves host memory only");
  if (data == nullptr || bytes == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": mem_register needs a non-empty buffer (got ", data, ", ",
                 bytes, " bytes)");
  std::lock_guard<std::mutex> lock(mu_);
  auto g = std::make_unique<Region>();
  g->mr = register_locked(data, bytes, "mem_register");
  g->desc = fi_mr_desc(g->mr);
  g->lo = reinterpret_cast<uintptr_t>(data);
  g->len = bytes;
  regions_.insert(g.get());
  return reinterpret_cast<strata_mem_region_t>(g.release());
}

void LfComm::mem_deregister(strata_mem_region_t h) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto* g = reinterpret_cast<Region*>(h);
  if (regions_.erase(g) == 0) return;
  if (g == checked_region_) checked_region_ = nullptr;
  fi_close(&g->mr->fid);
  delete g;
}

void* LfComm::region_desc_locked(const strata_buffer& buf, const char* op) {
  if (buf.mr == nullptr) return nullptr;
  auto* g = reinterpret_cast<Region*>(buf.mr);
  if (g != checked_region_) {
    if (regions_.count(g) == 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": ", op, ": buffer.mr ", static_cast<void*>(buf.mr),
                   " is not a live region of this communicator; pass a region from its mem_register, or NULL");
    checked_region_ = g;
  }
  const auto a = reinterpret_cast<uintptr_t>(buf.data);
  if (buf.bytes != 0 && (a < g->lo || a + buf.bytes > g->lo + g->len))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": ", op, ": buffer [", buf.data, ", +", buf.bytes,
                 ") is not inside its region [", reinterpret_cast<void*>(g->lo), ", +", g->len,
                 "); pass the region that covers it, or NULL");
  return g->desc;
}

CacheEntry* LfComm::cache_get_locked(void* p, uint64_t len) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (auto& e : cache_)
    if (e->lo <= a && a + len <= e->hi) {
      e->refs++;
      e->last_use = ++cache_clock_;
      return e.get();
    }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto e = std::make_unique<CacheEntry>();
  e->lo = a & ~(page - 1);
  e->hi = (a + len + page - 1) & ~(page - 1);
  if (cache_.size() >= kMaxCacheEntries) {
    auto victim = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it)
      if ((*it)->refs == 0 && (victim == cache_.end() || (*it)->last_use < (*victim)->last_use)) victim = it;
    if (victim != cache_.end()) {
      fi_close(&(*victim)->mr->fid);
      cache_.erase(victim);
    }
  }
  e->mr = register_locked(reinterpret_cast<void*>(e->lo), e->hi - e->lo, "registration cache");
  e->desc = fi_mr_desc(e->mr);
  e->refs = 1;
  e->last_use = ++cache_clock_;
  cache_.push_back(std::move(e));
  return cache_.back().get();
}

// A descriptor for a request's user buffer when the caller passed no
// region: from the cache even when the provider does not need one, so that
// the registered path (the one verbs and efa take) is what runs everywhere.
// A failed registration fails the request only when the provider needs it
// (FI_MR_LOCAL); otherwise the buffer goes unregistered.
bool LfComm::ensure_desc_locked(Request* r) {
  if (r->desc != nullptr || r->bytes == 0) return true;
  try {
    r->cached = cache_get_locked(r->data, r->bytes);
    r->desc = r->cached->desc;
    return true;
  } catch (const Error& e) {
    if (!mr_local_) {
      if (!warned_unregistered_) host_.warn(who(), ": ", e.what(), "; sending unregistered buffers instead");
      warned_unregistered_ = true;
      return true;
    }
    finish_locked(r, e.code(), str_cat(describe(*r), ": ", e.what()));
    return false;
  }
}

// ---------------------------------------------------------- request life ---

void LfComm::check_peer(int32_t peer, const char* op) const {
  if (peer < 0 || peer >= world_ || peer == rank_)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op, ": peer ", peer, " is not another rank of communicator '", name_,
                 "' (world size ", world_, ", this is rank ", rank_, ")");
}

void LfComm::check_host(const strata_buffer& buf, const char* op) const {
  if (buf.device.device_type != kDLCPU)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op,
                 ": the libfabric transport moves host memory only; stage device buffers in host memory");
  if (buf.data == nullptr && buf.bytes != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, op, ": buffer data is NULL but bytes = ", buf.bytes);
}

Request* LfComm::lookup_locked(strata_request_t h) const {
  const auto v = reinterpret_cast<uintptr_t>(h);
  const uintptr_t slot = v & 0xffffffffu;
  const Request* r = slot == 0 || slot > requests_.size() ? nullptr : &requests_[slot - 1];
  if (r == nullptr || !r->live || r->gen != (v >> 32))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "request ", static_cast<void*>(h),
                 " is not a live request of communicator '", name_, "' (already released?)");
  return const_cast<Request*>(r);
}

Request* LfComm::new_request_locked(Request::Kind kind, int peer, uint64_t tag, const strata_buffer& buf) {
  void* desc = region_desc_locked(buf, kind == Request::kSend ? "isend" : kind == Request::kRecv ? "irecv" : "iwrite");
  if (free_requests_.empty()) {
    requests_.emplace_back();
    requests_.back().slot = static_cast<uint32_t>(requests_.size() - 1);
    free_requests_.push_back(requests_.back().slot);
  }
  Request* r = &requests_[free_requests_.back()];
  free_requests_.pop_back();
  r->reset();
  r->gen++;
  r->live = true;
  r->kind = kind;
  r->peer = peer;
  r->tag = tag;
  r->data = static_cast<char*>(buf.data);
  r->bytes = buf.bytes;
  r->desc = desc;
  live_.insert(r);
  return r;
}

void LfComm::finish_locked(Request* r, strata_status_t code, const std::string& error) {
  if (r->finished) return;
  r->finished = true;
  r->status = code;
  r->error = error;
  if (code != STRATA_OK) {
    r->failed_at = Clock::now();
    unpost_locked(r);
    cancel_ops_locked(r);
  }
}

// A failed request's posted operations are cancelled but stay attached, so
// that test/wait report the failure only once the provider has let go of
// the caller's buffer (bounded by kFailGrace); unposted ones just go.
void LfComm::cancel_ops_locked(Request* r) {
  for (auto it = r->ops.begin(); it != r->ops.end();) {
    Op* op = *it;
    if (op->posted) {
      fi_cancel(&ep_->fid, &op->ctx);
      ++it;
      continue;
    }
    unbacklog_locked(op);
    if (op->kind == OpKind::kCtrlSend) free_send_.push_back(op->slot);
    ops_.erase(op);
    free_op_locked(op);
    it = r->ops.erase(it);
  }
}

// Operations of a failed or released request may still be posted: cancel
// them and let their completions find no request (their memory stays ours
// until the provider hands the context back).
void LfComm::orphan_ops_locked(Request* r) {
  for (Op* op : r->ops) {
    op->req = nullptr;
    if (op->posted) {
      fi_cancel(&ep_->fid, &op->ctx);
    } else {
      unbacklog_locked(op);
      if (op->kind == OpKind::kCtrlSend) free_send_.push_back(op->slot);
      ops_.erase(op);
      free_op_locked(op);
    }
  }
  r->ops.clear();
}

void LfComm::unpost_locked(Request* r) {
  if (r->kind != Request::kRecv || r->matched) return;
  Peer& peer = peers_[r->peer];
  auto pq = peer.posted.find(r->tag);
  if (pq == peer.posted.end()) return;
  pq->second.erase(std::remove(pq->second.begin(), pq->second.end(), r), pq->second.end());
  erase_if_empty(peer.posted, pq);
}

uint64_t LfComm::release_locked(Request* r) {
  unpost_locked(r);
  orphan_ops_locked(r);
  if (r->cached != nullptr) r->cached->refs--;
  live_.erase(r);
  r->live = false;
  free_requests_.push_back(r->slot);  // reused only after this returns
  if (r->status != STRATA_OK) detail::throw_status(r->status, r->error);
  return r->moved;
}

void LfComm::fail_peer_locked(int p, strata_status_t code, const std::string& reason) {
  Peer& peer = peers_[p];
  if (peer.failed) return;
  peer.failed = true;
  peer.fail_code = code;
  peer.fail_reason = reason;
  if (code != STRATA_ERR_ABORTED) host_.warn(who(), ": ", reason);
  std::vector<Request*> victims;
  for (Request* r : live_)
    if (r->peer == p && !r->finished) victims.push_back(r);
  for (Request* r : victims) finish_locked(r, code, str_cat(describe(*r), ": ", reason));
  peer.posted.clear();
  // Fully arrived (eager) messages stay receivable; the others cannot arrive.
  for (auto it = peer.unexpected.begin(); it != peer.unexpected.end();) {
    auto& q = it->second;
    q.erase(std::remove_if(q.begin(), q.end(), [](const InMsg& m) { return m.nchunks != 0; }), q.end());
    it = q.empty() ? peer.unexpected.erase(it) : std::next(it);
  }
}

void LfComm::apply_abort_locked() {
  if (abort_applied_ || !aborted_.load()) return;
  abort_applied_ = true;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    reason = abort_reason_;
  }
  const std::string why = str_cat("communicator '", name_, "' aborted: ", reason);
  for (int p = 0; p < world_; ++p)
    if (p != rank_ && !peers_[p].failed && !peers_[p].closed && peers_[p].addr != FI_ADDR_UNSPEC)
      send_notice_locked(p, kAbort, reason);
  for (int p = 0; p < world_; ++p)
    if (p != rank_) fail_peer_locked(p, STRATA_ERR_ABORTED, why);
}

// The header of a control message to peer p that carries `len` bytes of
// its own (a notice's reason, a fragment's payload), with p's next control
// sequence number.
CtrlHeader LfComm::carrying_header(int p, uint64_t kind, uint64_t tag, uint64_t len) {
  CtrlHeader h{};
  h.magic = kCtrlMagic;
  h.src = static_cast<uint32_t>(rank_);
  h.ctrl_seq = peers_[p].send_ctrl_seq++;
  h.tag = tag;
  h.kind = kind;
  h.total = len;
  h.chunk = len;
  return h;
}

// A control message with no request behind it.
void LfComm::send_notice_locked(int p, uint64_t kind, const std::string& reason, uint64_t ref) {
  CtrlHeader h = carrying_header(p, kind, ref, std::min<uint64_t>(reason.size(), kEagerBytes));
  sign(&h, p);
  send_ctrl_locked(nullptr, p, h, reason.data(), h.total);
}

// Injects the control message when it fits the provider's inject_size and
// nothing waits in the send backlog (which would then be overtaken: harmless
// for ordering, which the control sequence restores, but unfair). False:
// not sent; the caller posts it as an operation instead, which also reports
// any error the inject met.
bool LfComm::inject_locked(int p, const char* msg, size_t len) {
  if (len > inject_bytes_ || !backlog_[1].empty()) return false;
  const Peer& peer = peers_[p];
  std::unique_lock<std::mutex> local;
  if (peer.same_process) {
    local = std::unique_lock<std::mutex>(local_eps_mu());
    if (local_eps().count(peer.ep_key) == 0) return false;  // closed: see local_eps
  }
  return fi_tinject(ep_, msg, len, peer.addr, ctrl_tag()) == 0;
}

// Sends one control message (header `h`, then `n` payload bytes), injected
// when it fits, else from a send slot as an operation of `r` (null: of no
// request).
void LfComm::send_ctrl_locked(Request* r, int p, const CtrlHeader& h, const char* payload, uint64_t n) {
  if (sizeof h + n <= inject_bytes_) {
    std::memcpy(inject_buf_.get(), &h, sizeof h);
    if (n > 0) std::memcpy(inject_buf_.get() + sizeof h, payload, n);
    if (inject_locked(p, inject_buf_.get(), sizeof h + n)) return;
  }
  auto* op = new_op_locked();
  op->kind = OpKind::kCtrlSend;
  op->req = r;
  op->peer = p;
  op->slot = take_send_slot_locked();
  std::memcpy(op->slot.p, &h, sizeof h);
  if (n > 0) std::memcpy(op->slot.p + sizeof h, payload, n);
  op->buf = op->slot.p;
  op->len = sizeof h + n;
  op->desc = op->slot.desc;
  op->wire_tag = ctrl_tag();
  submit_locked(op);  // may free op
}

void LfComm::peer_closed_locked(int p, const InMsg& m) {
  Peer& peer = peers_[p];
  if (peer.failed || peer.closed) return;
  const std::string reason(m.payload.begin(), m.payload.end());
  // Like a TCP close: what the peer sent before stays receivable (its data
  // is with the provider); anything else waiting on it cannot finish.
  peer.closed = true;
  peer.closed_reason =
      m.kind == kAbort
          ? str_cat(peer_name(p), " aborted its communicator (", reason, "); see its log for the first failure")
          : str_cat(peer_name(p), " closed its communicator (destroyed, or its process is exiting)");
  if (!fail_closed_locked(p, m.kind != kAbort) && m.kind == kAbort) host_.warn(who(), ": ", peer.closed_reason);
  peer.posted.clear();
}

// What waits on closed peer p fails, except matched receives (their data
// is with the provider) and, with spare_held_sends, sends whose every
// operation the provider holds: they may have arrived, and get kCloseGrace
// to complete (check_liveness_locked calls again without). Returns whether
// anything failed (then logged once).
bool LfComm::fail_closed_locked(int p, bool spare_held_sends) {
  Peer& peer = peers_[p];
  std::vector<Request*> victims;
  for (Request* r : live_) {
    if (r->peer != p || r->finished || (r->kind == Request::kRecv && r->matched)) continue;
    const bool held = r->kind == Request::kSend && !r->awaiting_cts && r->next_chunk >= r->nchunks &&
                      !r->ops.empty() &&
                      std::all_of(r->ops.begin(), r->ops.end(), [](const Op* op) { return op->posted; });
    if (spare_held_sends && held)
      peer.closed_at = Clock::now();
    else
      victims.push_back(r);
  }
  if (victims.empty()) return false;
  host_.warn(who(), ": ", peer.closed_reason);
  for (Request* r : victims) finish_locked(r, STRATA_ERR_UNAVAILABLE, str_cat(describe(*r), ": ", peer.closed_reason));
  return true;
}

// ------------------------------------------------------------- posting ---

int LfComm::post_raw(Op* op) {
  switch (op->kind) {
    case OpKind::kCtrlRecv:
      return static_cast<int>(
          fi_trecv(ep_, op->buf, op->len, op->desc, FI_ADDR_UNSPEC, ctrl_tag(), 0, &op->ctx));
    case OpKind::kDataRecv:
    case OpKind::kDrain:
      return static_cast<int>(
          fi_trecv(ep_, op->buf, op->len, op->desc, FI_ADDR_UNSPEC, op->wire_tag, 0, &op->ctx));
    default:
      break;
  }
  const Peer& peer = peers_[op->peer];
  std::unique_lock<std::mutex> local;
  if (peer.same_process) {
    local = std::unique_lock<std::mutex>(local_eps_mu());
    if (local_eps().count(peer.ep_key) == 0) return -FI_ENOTCONN;  // closed: see local_eps
  }
  if (op->kind == OpKind::kWrite)
    return static_cast<int>(fi_write(ep_, op->buf, op->len, op->desc, peer.addr, op->remote_addr, op->rkey, &op->ctx));
  return static_cast<int>(fi_tsend(ep_, op->buf, op->len, op->desc, peer.addr, op->wire_tag, &op->ctx));
}

void LfComm::submit_locked(Op* op) {
  op->serial = ++op_serial_;
  ops_.insert(op);
  if (op->req != nullptr) op->req->ops.push_back(op);
  auto& backlog = backlog_[backlog_of(op)];
  if (backlog.empty()) {
    const int ret = post_raw(op);
    if (ret == 0) {
      op->posted = true;
      return;
    }
    if (!no_room(ret)) return post_failed_locked(op, ret);
  }
  backlog.push_back(op);
}

void LfComm::post_failed_locked(Op* op, int ret) {
  if (op->kind == OpKind::kCtrlRecv) {
    // Reposting would fail the same way; run with one control slot fewer.
    host_.warn(who(), ": posting a control receive failed (", fi_error_text(ret), ")");
    ops_.erase(op);
    free_op_locked(op);
    return;
  }
  if (ret == -FI_ENOTCONN && peers_[op->peer].same_process) {
    const int p = op->peer;
    Request* r = op->req;
    const std::string why = str_cat(peer_name(p), " closed its communicator (destroyed, or its process is exiting)");
    if (r != nullptr && !peers_[p].failed) return fail_peer_locked(p, STRATA_ERR_UNAVAILABLE, why);  // frees op
    if (r != nullptr) r->ops.erase(std::remove(r->ops.begin(), r->ops.end(), op), r->ops.end());
    if (op->kind == OpKind::kCtrlSend) free_send_.push_back(op->slot);
    ops_.erase(op);
    free_op_locked(op);
    if (r != nullptr) finish_locked(r, STRATA_ERR_UNAVAILABLE, str_cat(describe(*r), ": ", why));
    return;
  }
  const std::string text = str_cat("posting a ", op->kind == OpKind::kWrite ? "write" : "message",
                                   " failed: ", fi_error_text(ret));
  on_completion_locked(op, ret < 0 ? -ret : ret, text);
}

void LfComm::repost_ctrl_recvs_locked() {
  if (repost_.empty()) return;
  if (!closing_ && !destroying_)
    for (char* slot : repost_) post_ctrl_recv_locked(slot);
  repost_.clear();
}

void LfComm::post_ctrl_recv_locked(char* slot) {
  auto* op = new_op_locked();
  op->kind = OpKind::kCtrlRecv;
  op->buf = slot;
  op->len = kSlotBytes;
  op->desc = fi_mr_desc(recv_slab_.mr);
  submit_locked(op);
}

SendSlot LfComm::take_send_slot_locked() {
  if (free_send_.empty()) {
    Slab s;
    s.mem.reset(new char[kSendSlotsPerSlab * kSlotBytes]);
    s.mr = register_locked(s.mem.get(), kSendSlotsPerSlab * kSlotBytes, "control send slots");
    void* desc = fi_mr_desc(s.mr);
    for (int i = 0; i < kSendSlotsPerSlab; ++i) free_send_.push_back({s.mem.get() + i * kSlotBytes, desc});
    send_slabs_.push_back(std::move(s));
  }
  SendSlot s = free_send_.back();
  free_send_.pop_back();
  return s;
}

// ------------------------------------------------------------ progress ---

void LfComm::progress_locked(Clock::time_point now) {
  poll_locked();
  check_liveness_locked(now);
}

void LfComm::poll_locked() {
  apply_abort_locked();
  repost_ctrl_recvs_locked();
  fi_cq_tagged_entry entries[32];
  for (int round = 0; round < 64; ++round) {
    if (repost_.size() >= kCtrlRecvSlots / 2) repost_ctrl_recvs_locked();
    const ssize_t n = fi_cq_read(cq_, entries, 32);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        Op* op = static_cast<Op*>(entries[i].op_context);
        if (op == nullptr) continue;
        op->got = entries[i].len;
        ++completions_;
        on_completion_locked(op, 0, "");
      }
      // A short read emptied the queue: the next poll takes what comes
      // meanwhile (one provider call less before the caller sees this).
      if (n < 32) break;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry e{};
      if (fi_cq_readerr(cq_, &e, 0) > 0) {
        char buf[256] = {0};
        const char* prov_text = fi_cq_strerror(cq_, e.prov_errno, e.err_data, buf, sizeof buf);
        Op* op = static_cast<Op*>(e.op_context);
        if (op != nullptr)
          on_completion_locked(op, e.err,
                               str_cat(fabric_lib().strerror(e.err), " (provider: ", prov_text ? prov_text : "", ")"));
      }
      continue;
    }
    break;  // -FI_EAGAIN or another error: nothing more now
  }
  for (auto& backlog : backlog_) {
    while (!backlog.empty()) {
      Op* op = backlog.front();
      const int ret = post_raw(op);
      if (no_room(ret)) break;
      backlog.pop_front();
      if (ret == 0) {
        op->posted = true;
      } else {
        post_failed_locked(op, ret);
      }
    }
  }
}

void LfComm::check_liveness_locked(Clock::time_point now) {
  if (now < next_liveness_) return;
  next_liveness_ = now + kLivenessPeriod;
  for (int p = 0; p < world_; ++p) {
    Peer& peer = peers_[p];
    if (peer.closed_at == Clock::time_point{} || now - peer.closed_at < kCloseGrace) continue;
    peer.closed_at = Clock::time_point{};
    fail_closed_locked(p, false);
  }
  std::vector<bool> waiting(static_cast<size_t>(world_), false);
  for (Request* r : live_)
    if (!r->finished) waiting[r->peer] = true;
  for (int p = 0; p < world_; ++p) {
    if (!waiting[p] || peers_[p].failed) continue;
    if (peers_[p].same_process && !peers_[p].closed) {
      // A peer in this process that closed without its goodbye arriving
      // (tcp;ofi_rxm connects lazily: a goodbye to a peer never spoken to
      // can be dropped at close) is known closed from the registry.
      bool open = false;
      {
        std::lock_guard<std::mutex> lock(local_eps_mu());
        open = local_eps().count(peers_[p].ep_key) != 0;
      }
      // Gone from the registry, but what it sent before may still be on its
      // way: only after a grace with no goodbye is it treated as closed.
      if (open) {
        peers_[p].gone_since = Clock::time_point{};
      } else if (peers_[p].gone_since == Clock::time_point{}) {
        peers_[p].gone_since = now;
      } else if (now - peers_[p].gone_since >= kGoneGrace) {
        InMsg bye;
        bye.kind = kBye;
        peer_closed_locked(p, bye);
      }
      continue;
    }
    if (!peers_[p].local) continue;
    const std::string gone = proc_gone(peers_[p].proc);
    if (!gone.empty())
      fail_peer_locked(p, STRATA_ERR_UNAVAILABLE,
                       str_cat(peer_name(p), " is unavailable: ", gone,
                               "; see its log for why, then restart the job"));
  }
}

void LfComm::on_completion_locked(Op* op, int err, const std::string& errtext) {
  op->posted = false;
  ops_.erase(op);
  // Back to the pool on every return below (after its last use).
  struct Recycle {
    LfComm* comm;
    Op* op;
    ~Recycle() { comm->free_op_locked(op); }
  } recycle{this, op};
  Request* r = op->req;
  if (r != nullptr) r->ops.erase(std::remove(r->ops.begin(), r->ops.end(), op), r->ops.end());
  switch (op->kind) {
    case OpKind::kCtrlRecv:
      if (err == 0) {
        on_ctrl_locked(op);
      } else if (err == FI_ETRUNC && !closing_) {
        drop_ctrl_locked(str_cat("a control message longer than ", kSlotBytes, " bytes (truncated)"));
      } else if (err != FI_ECANCELED && !closing_) {
        host_.warn(who(), ": a control receive failed (", errtext, "); posting it again");
      }
      // Posted again at the next poll, not now: a reply the caller sends
      // next then does not wait behind a provider call.
      if (!closing_ && err != FI_ECANCELED) repost_.push_back(op->buf);
      return;
    case OpKind::kCtrlSend:
      free_send_.push_back(op->slot);
      break;
    case OpKind::kDrain:
      return;
    default:
      break;
  }
  if (r == nullptr || r->finished) return;  // orphaned, or failed already
  if (err != 0) {
    if (op->kind == OpKind::kDataRecv && err == FI_ETRUNC) {
      const std::string why = str_cat(peer_name(r->peer), " sent more data than its control message announced (",
                                      errtext, ")");
      finish_locked(r, STRATA_ERR_DATA_LOSS, str_cat(describe(*r), ": ", why));
      fail_peer_locked(r->peer, STRATA_ERR_DATA_LOSS, why);
      return;
    }
    fail_peer_locked(r->peer, STRATA_ERR_UNAVAILABLE,
                     str_cat("lost ", peer_name(r->peer), ": ", errtext,
                             "; the peer's process may have exited (see its log)"));
    return;
  }
  if (op->kind == OpKind::kDataRecv || op->kind == OpKind::kDataSend || op->kind == OpKind::kWrite)
    r->moved += op->len;
  if (op->kind == OpKind::kDataSend || op->kind == OpKind::kDataRecv) post_data_ops_locked(r);
  if (op->kind == OpKind::kDataRecv) post_starved_locked();
  if (r->ops.empty() && r->next_chunk >= r->nchunks && !r->finished) {
    if (r->kind != Request::kRecv) r->moved = r->bytes;
    finish_locked(r, STRATA_OK, "");
  }
}

// Anyone who learns this endpoint's address can post to the control tag:
// nothing in a control message is acted on (matched, or taken as a notice)
// before its length, its fields and its key check out. A message that fails
// is dropped without touching the rank it names, so a forged goodbye or
// abort cannot close a real peer.
void LfComm::on_ctrl_locked(Op* op) {
  CtrlHeader h;
  if (op->got < sizeof h) {
    // The slot still holds an earlier message's bytes past op->got.
    return drop_ctrl_locked(str_cat("a control message of ", op->got, " bytes (shorter than its ", sizeof h,
                                    "-byte header)"));
  }
  std::memcpy(&h, op->buf, sizeof h);
  const uint64_t carried = op->got - sizeof h;
  // Eager messages (kMsg without data messages) may carry part of their
  // payload (`chunk` bytes), kFrag the next `total` bytes; everything else
  // carries all of it (notices) or none (split messages).
  const bool sizes_ok = h.kind == kFrag ? h.nchunks == 0 && carried == h.total && carried > 0 && carried <= kEagerBytes
                        : h.kind == kMsg && h.nchunks == 0 ? h.total <= kEagerBytes && h.chunk == carried && carried <= h.total
                        : h.nchunks == 0 ? h.total <= kEagerBytes && carried == h.total
                                         : carried == 0;
  if (h.magic != kCtrlMagic || h.src >= static_cast<uint32_t>(world_) || static_cast<int>(h.src) == rank_ || !sizes_ok)
    return drop_ctrl_locked(str_cat("a malformed control message (magic ", h.magic, ", source ", h.src, ", ",
                                    op->got, " bytes)"));
  const int p = static_cast<int>(h.src);
  if (recv_keys_.size() != peers_.size() || !same_key(h.auth, recv_keys_[p].data()))
    return drop_ctrl_locked(str_cat("a control message that claims to be from ", peer_name(p),
                                    " but is not signed with this communicator's key"));
  Peer& peer = peers_[p];
  if (peer.failed && peer.fail_code != STRATA_ERR_ABORTED) return;
  InMsg m;
  m.tag = h.tag;
  m.total = h.total;
  m.first_seq = h.first_seq;
  m.nchunks = h.nchunks;
  m.chunk = h.chunk;
  m.kind = h.kind;
  m.ctrl_seq = h.ctrl_seq;
  m.carried = carried;
  if (carried > 0) m.inline_data = op->buf + sizeof h;
  // Deliver in the sender's order, whatever order the provider used.
  if (h.ctrl_seq != peer.recv_ctrl_next) {
    m.keep();  // the slot is reposted when this returns
    peer.early.emplace(h.ctrl_seq, std::move(m));
    return;
  }
  deliver_locked(p, std::move(m));
  peer.recv_ctrl_next++;
  for (auto it = peer.early.find(peer.recv_ctrl_next); it != peer.early.end();
       it = peer.early.find(peer.recv_ctrl_next)) {
    InMsg next = std::move(it->second);
    peer.early.erase(it);
    deliver_locked(p, std::move(next));
    peer.recv_ctrl_next++;
  }
}

void LfComm::drop_ctrl_locked(const std::string& what) {
  ++dropped_;
  const auto now = Clock::now();
  if (now < next_drop_warn_) return;
  next_drop_warn_ = now + kForgedWarnPeriod;
  host_.warn(who(), ": dropped ", what, " (", dropped_,
             " dropped so far; a stranger, or a process of another job or an earlier run that knows this endpoint's "
             "address); the claimed peer is not affected. Further drops are logged at most every ",
             std::chrono::duration_cast<std::chrono::seconds>(kForgedWarnPeriod).count(), " s");
}

void LfComm::deliver_locked(int p, InMsg&& m) {
  Peer& peer = peers_[p];
  // Fragments follow their head with nothing between (wire.h, kFrag): put
  // the message together, then deliver it as if it had come whole.
  if (peer.assembling || m.kind == kFrag) {
    const bool fits = peer.assembling && m.kind == kFrag && m.carried <= peer.frag_head.total - peer.frag_have;
    if (!fits) {
      peer.assembling = false;
      return fail_peer_locked(p, STRATA_ERR_DATA_LOSS,
                              str_cat(peer_name(p), " sent a malformed message (control message #", m.ctrl_seq,
                                      m.kind == kFrag ? ": a fragment that belongs to no message"
                                                      : ": a fragmented message's next fragment is missing",
                                      "); every process must run the same version of the libfabric transport"));
    }
    std::memcpy(peer.frag_buf.data() + peer.frag_have, m.inline_data, m.carried);
    peer.frag_have += m.carried;
    if (peer.frag_have < peer.frag_head.total) return;
    peer.assembling = false;
    InMsg whole = std::move(peer.frag_head);
    whole.carried = whole.total;
    whole.inline_data = peer.frag_buf.data();
    return deliver_locked(p, std::move(whole));
  }
  if (m.kind == kMsg && m.nchunks == 0 && m.carried < m.total) {
    if (peer.frag_buf.size() < kEagerBytes) peer.frag_buf.resize(kEagerBytes);
    if (m.carried > 0) std::memcpy(peer.frag_buf.data(), m.inline_data, m.carried);
    peer.frag_have = m.carried;
    m.inline_data = nullptr;
    peer.frag_head = std::move(m);
    peer.assembling = true;
    return;
  }
  if (m.kind == kCts) return on_cts_locked(p, m.tag);
  if (m.kind != kMsg) {
    m.keep();
    return peer_closed_locked(p, m);
  }
  if (peer.failed) {
    if (m.nchunks != 0) drain_locked(p, m);
    else {
      m.keep();
      peer.unexpected[m.tag].push_back(std::move(m));
    }
    return;
  }
  auto pq = peer.posted.find(m.tag);
  if (pq == peer.posted.end() || pq->second.empty()) {
    m.keep();
    peer.unexpected[m.tag].push_back(std::move(m));
    return;
  }
  Request* r = pq->second.front();
  pq->second.pop_front();
  erase_if_empty(peer.posted, pq);
  match_locked(r, std::move(m));
}

void LfComm::match_locked(Request* r, InMsg&& m) {
  r->matched = true;
  if (m.total > r->bytes) {
    finish_locked(r, STRATA_ERR_INVALID_ARGUMENT,
                  str_cat(describe(*r), ": the message is ", m.total, " bytes; post a buffer at least that large"));
    drain_locked(r->peer, m);
    return;
  }
  if (m.nchunks == 0) {
    if (m.total > 0) std::memcpy(r->data, m.bytes(), m.total);
    r->moved = m.total;
    finish_locked(r, STRATA_OK, "");
    return;
  }
  if (!ensure_desc_locked(r)) {
    drain_locked(r->peer, m);
    return;
  }
  r->chunk = m.chunk;
  r->nchunks = m.nchunks;
  r->first_seq = m.first_seq;
  r->expected = m.total;
  r->msg_ctrl_seq = m.ctrl_seq;
  post_data_ops_locked(r);
}

// Consume the data messages of `m` into a shared scratch buffer as large as
// one of them: providers do not all complete a truncated rendezvous
// transfer at the sender, so the receive must take the whole message.
void LfComm::drain_locked(int p, const InMsg& m) {
  // A communicator being destroyed takes no more data: its peers fail or
  // close at its goodbye or abort notice anyway, and receives posted while
  // the provider tears down connections have crashed tcp;ofi_rxm (SIGSEGV
  // inside fi_trecv, seen under ThreadSanitizer in RingTest.AbortPropagatesFast).
  if (destroying_) return;
  const uint64_t need = std::min(m.chunk, m.total);
  if (need > drain_bytes_) {
    Slab s;
    s.mem.reset(new char[need]);
    try {
      s.mr = register_locked(s.mem.get(), need, "drain buffer");
    } catch (const Error& e) {
      fail_peer_locked(p, e.code(), str_cat("cannot drain a message from ", peer_name(p), ": ", e.what()));
      return;
    }
    drain_slabs_.push_back(std::move(s));
    drain_bytes_ = need;
  }
  const Slab& d = drain_slabs_.back();
  for (uint64_t i = 0; i < m.nchunks; ++i) {
    auto* op = new_op_locked();
    op->kind = OpKind::kDrain;
    op->peer = p;
    op->buf = d.mem.get();
    op->len = std::min(m.chunk, m.total - i * m.chunk);
    op->desc = fi_mr_desc(d.mr);
    op->wire_tag = data_tag(p, m.first_seq + i);
    submit_locked(op);
  }
  const Peer& peer = peers_[p];
  if (m.nchunks > 1 && !peer.failed && !peer.closed) send_notice_locked(p, kCts, "", m.ctrl_seq);
}

// -------------------------------------------------------- p2p entry points ---

strata_request_t LfComm::isend(int32_t peer, uint64_t tag, const strata_buffer& buf) {
  check_peer(peer, "isend");
  check_host(buf, "isend");
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = new_request_locked(Request::kSend, peer, tag, buf);
  Peer& p = peers_[peer];
  r->ctrl_seq = p.send_ctrl_seq;
  if (p.failed || p.closed) {
    finish_locked(r, p.failed ? p.fail_code : STRATA_ERR_UNAVAILABLE,
                  str_cat(describe(*r), ": ", p.failed ? p.fail_reason : p.closed_reason));
    return handle_of(r);
  }
  const bool eager = buf.bytes <= kEagerBytes;
  if (!eager && !ensure_desc_locked(r)) return handle_of(r);
  p.send_ctrl_seq++;
  CtrlHeader h{};
  h.magic = kCtrlMagic;
  h.src = static_cast<uint32_t>(rank_);
  h.ctrl_seq = r->ctrl_seq;
  h.tag = tag;
  h.total = buf.bytes;
  h.chunk = max_chunk_;
  h.nchunks = eager ? 0 : (buf.bytes + max_chunk_ - 1) / max_chunk_;
  h.first_seq = p.send_data_seq;
  p.send_data_seq += h.nchunks;
  const char* data = static_cast<const char*>(buf.data);
  if (!eager) {
    sign(&h, peer);
    send_ctrl_locked(r, peer, h, nullptr, 0);
  } else {
    // The payload rides along: whole, or in inject-size fragments (kMsg
    // carrying the first, then kFrag) where the whole would not inject.
    const uint64_t per =
        frag_payload_ != 0 && sizeof h + buf.bytes > inject_bytes_ ? frag_payload_ : std::max<uint64_t>(buf.bytes, 1);
    h.chunk = std::min(per, buf.bytes);
    sign(&h, peer);
    send_ctrl_locked(r, peer, h, data, h.chunk);
    for (uint64_t off = h.chunk; off < buf.bytes && !r->finished; off += per) {
      CtrlHeader f = carrying_header(peer, kFrag, tag, std::min(per, buf.bytes - off));
      f.first_seq = p.send_data_seq;
      sign(&f, peer);
      send_ctrl_locked(r, peer, f, data + off, f.total);
    }
  }
  r->chunk = max_chunk_;
  r->nchunks = h.nchunks;
  r->first_seq = h.first_seq;
  r->awaiting_cts = h.nchunks > 1;
  post_data_ops_locked(r);
  // Everything injected: the buffer is free and nothing will complete.
  if (eager && r->ops.empty() && !r->finished) {
    r->moved = r->bytes;
    finish_locked(r, STRATA_OK, "");
  }
  // Progress after sending, not before: the message leaves first. This
  // learns of peers that left (their goodbyes) for the calls that follow.
  poll_locked();
  return handle_of(r);
}

void LfComm::post_data_ops_locked(Request* r) {
  const bool send = r->kind == Request::kSend;
  if (r->finished || (send && r->awaiting_cts)) return;
  const uint64_t total = send ? r->bytes : r->expected;
  const int src = send ? rank_ : r->peer;
  while (!r->finished && r->next_chunk < r->nchunks && r->ops.size() < kDataWindow) {
    if (!send && data_recvs_ >= kMaxDataRecvs) {
      starved_ = true;
      break;
    }
    const uint64_t i = r->next_chunk++;
    auto* op = new_op_locked();
    op->kind = send ? OpKind::kDataSend : OpKind::kDataRecv;
    if (!send) {
      op->count = &data_recvs_;
      ++data_recvs_;
    }
    op->req = r;
    op->peer = r->peer;
    op->buf = r->data + i * r->chunk;
    op->len = std::min(r->chunk, total - i * r->chunk);
    op->desc = r->desc;
    op->wire_tag = data_tag(src, r->first_seq + i);
    submit_locked(op);
  }
  if (!send && r->nchunks > 1 && !r->cts_sent && !r->finished && !r->ops.empty()) {
    r->cts_sent = true;
    Peer& p = peers_[r->peer];
    if (!p.failed && !p.closed) send_notice_locked(r->peer, kCts, "", r->msg_ctrl_seq);
  }
}

// Receives that found no room under kMaxDataRecvs get it as others finish.
void LfComm::post_starved_locked() {
  if (!starved_ || data_recvs_ >= kMaxDataRecvs) return;
  starved_ = false;
  for (Request* r : live_)
    if (r->kind == Request::kRecv && r->matched && !r->finished && r->next_chunk < r->nchunks) {
      post_data_ops_locked(r);
      if (starved_) return;
    }
}

void LfComm::on_cts_locked(int p, uint64_t ctrl_seq) {
  for (Request* r : live_)
    if (r->kind == Request::kSend && r->peer == p && r->ctrl_seq == ctrl_seq && r->awaiting_cts) {
      r->awaiting_cts = false;
      post_data_ops_locked(r);
      return;
    }
  // The send was cancelled or failed meanwhile: nothing to send.
}

strata_request_t LfComm::irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) {
  check_peer(peer, "irecv");
  check_host(buf, "irecv");
  std::lock_guard<std::mutex> lock(mu_);
  // No progress here: test() and wait() make it, and a receive posted now
  // matches what they deliver. (A caller that posts a receive and then
  // sends its reply would otherwise wait on the provider first.)
  Request* r = new_request_locked(Request::kRecv, peer, tag, buf);
  Peer& p = peers_[peer];
  auto it = p.unexpected.find(tag);
  if (it != p.unexpected.end() && !it->second.empty()) {
    InMsg m = std::move(it->second.front());
    it->second.pop_front();
    erase_if_empty(p.unexpected, it);
    match_locked(r, std::move(m));
  } else if (p.failed || p.closed) {
    finish_locked(r, p.failed ? p.fail_code : STRATA_ERR_UNAVAILABLE,
                  str_cat(describe(*r), ": ", p.failed ? p.fail_reason : p.closed_reason));
  } else {
    p.posted[tag].push_back(r);
  }
  return handle_of(r);
}

bool LfComm::test(strata_request_t h, uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = lookup_locked(h);
  progress_locked();
  if (!visible(*r)) return false;
  *bytes = release_locked(r);
  return true;
}

uint64_t LfComm::wait(strata_request_t h, int64_t timeout_ms) {
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  uint64_t seen = 0;
  {
    // One look before any clock is read (a small send is often complete,
    // and then needs no poll either).
    std::lock_guard<std::mutex> lock(mu_);
    Request* r = lookup_locked(h);
    if (visible(*r)) return release_locked(r);
    poll_locked();
    if (visible(*r)) return release_locked(r);
    seen = completions_;
  }
  // This thread drives progress itself; between polls it busy-waits, yields
  // or sleeps as the machine's load allows (wait_pacer.h). One clock read
  // per round serves the liveness check, the deadline and the pacer; while
  // busy-polling pays, a round is kSpinPolls polls with nothing between
  // them (a clock read and two pauses cost more than a poll of the shm
  // provider, and delayed noticing a message by as much).
  constexpr int kSpinPolls = 8;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  transport::WaitPacer pacer(start);
  pacer.yield_only_for_job(oversubscribed_by_job_);
  for (auto now = start;; now = Clock::now()) {
    const int polls = pacer.busy_polling(now) ? kSpinPolls : 1;
    for (int spin = 1;; ++spin) {
      std::lock_guard<std::mutex> lock(mu_);
      Request* r = lookup_locked(h);
      progress_locked(now);
      // While completions keep coming (a long message in segments, which
      // the provider moves only while both sides poll), keep polling:
      // sleeping now would stall the peer too.
      if (completions_ != seen) {
        seen = completions_;
        pacer.progressed(now);
      }
      if (visible(*r)) return release_locked(r);
      if (now >= deadline && r->finished) return release_locked(r);
      if (now >= deadline)
        STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who(), ": ", describe(*r), ": not complete after ", timeout_ms,
                     " ms; the peer may be stalled or has not posted the matching ",
                     r->kind == Request::kRecv ? "isend" : "irecv", " (the request is still pending)");
      if (spin >= polls) break;
    }
    pacer.pause(deadline, now);
  }
}

void LfComm::cancel(strata_request_t h) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    Request* r = lookup_locked(h);
    const bool sending = r->kind != Request::kRecv && !r->finished;
    const bool partial = sending && !r->ops.empty();
    std::unordered_set<uint64_t> serials;
    for (Op* op : r->ops) serials.insert(op->serial);
    if (!r->finished) finish_locked(r, STRATA_ERR_CANCELLED, describe(*r) + ": cancelled");
    // Give cancelled operations a bounded time to hand the buffer back.
    const auto until = Clock::now() + std::chrono::seconds(1);
    auto pending = [&] {
      if (serials.empty()) return false;
      for (Op* op : ops_)
        if (serials.count(op->serial) != 0) return true;
      return false;
    };
    while (pending() && Clock::now() < until) progress_locked();
    if (partial && pending())
      fail_peer_locked(r->peer, STRATA_ERR_CANCELLED,
                       str_cat(describe(*r), " was cancelled while the provider was sending it; ",
                               peer_name(r->peer), " would wait for it forever, so it is failed"));
    r->status = STRATA_OK;  // the caller asked for this: no error to report
    release_locked(r);
  } catch (...) {
  }
}

// ------------------------------------------------------------------ RMA ---

std::string LfComm::mem_export(strata_mem_region_t h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* g = reinterpret_cast<Region*>(h);
  if (h == nullptr || regions_.count(g) == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": mem_export: ", static_cast<void*>(h),
                 " is not a live region of this communicator; pass one from its mem_register");
  ExportedKey k{kKeyMagic, virt_addr_ ? static_cast<uint64_t>(g->lo) : 0, fi_mr_key(g->mr), g->len};
  return std::string(reinterpret_cast<const char*>(&k), sizeof k);
}

strata_request_t LfComm::iwrite(int32_t peer, const strata_buffer& buf, const void* key, uint64_t key_len,
                                uint64_t off) {
  check_peer(peer, "iwrite");
  check_host(buf, "iwrite");
  ExportedKey k{};
  if (key == nullptr || key_len != sizeof k)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": iwrite to rank ", peer, ": the remote key is ", key_len,
                 " bytes, not the ", sizeof k, " that mem_export writes; pass the peer's mem_export output");
  std::memcpy(&k, key, sizeof k);
  if (k.magic != kKeyMagic)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who(), ": iwrite to rank ", peer,
                 ": the remote key was not made by this transport's mem_export");
  if (off > k.len || buf.bytes > k.len - off)
    STRATA_THROW(STRATA_ERR_OUT_OF_RANGE, who(), ": iwrite to rank ", peer, ": ", buf.bytes, " bytes at offset ",
                 off, " do not fit the remote region of ", k.len, " bytes");
  std::lock_guard<std::mutex> lock(mu_);
  apply_abort_locked();
  Request* r = new_request_locked(Request::kWrite, peer, 0, buf);
  Peer& p = peers_[peer];
  if (p.failed || p.closed) {
    finish_locked(r, p.failed ? p.fail_code : STRATA_ERR_UNAVAILABLE,
                  str_cat(describe(*r), ": ", p.failed ? p.fail_reason : p.closed_reason));
    return handle_of(r);
  }
  if (buf.bytes == 0) {
    finish_locked(r, STRATA_OK, "");
    return handle_of(r);
  }
  if (!ensure_desc_locked(r)) return handle_of(r);
  const uint64_t n = (buf.bytes + max_chunk_ - 1) / max_chunk_;
  for (uint64_t i = 0; i < n && !r->finished; ++i) {
    auto* op = new_op_locked();
    op->kind = OpKind::kWrite;
    op->req = r;
    op->peer = peer;
    op->buf = r->data + i * max_chunk_;
    op->len = std::min(max_chunk_, buf.bytes - i * max_chunk_);
    op->desc = r->desc;
    op->remote_addr = k.addr + off + i * max_chunk_;
    op->rkey = k.key;
    submit_locked(op);
  }
  return handle_of(r);
}

// ---------------------------------------------------------------- setup ---

void LfComm::setup(int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  };
  auto check = [&](int ret, const char* what) {
    if (ret != 0)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, who(), ": ", what, " failed: ", fi_error_text(ret),
                   "; check the provider with `fi_info -p \"", prov_, "\"`");
  };
  const uint64_t fmt = info_->ep_attr->mem_tag_format;
  tag_bits_ = fmt == 0 ? 64 : 64 - __builtin_clzll(fmt);
  int rank_bits = 1;
  while ((1ll << rank_bits) < world_) ++rank_bits;
  seq_bits_ = tag_bits_ - 1 - rank_bits;
  if (seq_bits_ < 16)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who(), ": provider ", prov_, " has only ", tag_bits_,
                 " tag bits (mem_tag_format ", fmt, "), too few for ", world_,
                 " ranks; choose another provider with option 'provider'");
  const uint64_t prov_max = info_->ep_attr->max_msg_size;
  max_chunk_ = std::min<uint64_t>(prov_max == 0 ? (1ull << 30) : prov_max, 1ull << 30);
  if (opts_.max_message_bytes != 0) max_chunk_ = std::min(max_chunk_, opts_.max_message_bytes);
  inject_bytes_ = std::min<size_t>(info_->tx_attr != nullptr ? info_->tx_attr->inject_size : 0, kSlotBytes);
  if (inject_bytes_ < sizeof(CtrlHeader)) inject_bytes_ = 0;  // no control message fits: never inject
  if (inject_bytes_ > sizeof(CtrlHeader) &&
      (kEagerBytes + (inject_bytes_ - sizeof(CtrlHeader)) - 1) / (inject_bytes_ - sizeof(CtrlHeader)) <= kMaxFragments)
    frag_payload_ = inject_bytes_ - sizeof(CtrlHeader);
  inject_buf_.reset(new char[kSlotBytes]);
  const uint64_t mr_mode = static_cast<uint64_t>(info_->domain_attr->mr_mode);
  virt_addr_ = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  prov_key_ = (mr_mode & FI_MR_PROV_KEY) != 0;
  mr_endpoint_ = (mr_mode & FI_MR_ENDPOINT) != 0;

  check(fabric_lib().fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
  check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
  fi_av_attr av_attr{};
  av_attr.type = info_->domain_attr->av_type;
  av_attr.count = static_cast<size_t>(world_);
  check(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = 0;
  check(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
  std::unique_lock<std::mutex> shm_lock;
  if (prov_ == "shm") {
    shm_lock = std::unique_lock<std::mutex>(shm_regions_mu());
    if (const int n = sweep_stale_shm_regions(); n > 0)
      host_.info(who(), ": removed ", n, " stale shared-memory region(s) of processes that are gone from /dev/shm");
  }
  check(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
  check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "binding the completion queue");
  check(fi_ep_bind(ep_, &av_->fid, 0), "binding the address vector");
  check(fi_enable(ep_), "fi_enable");
  if (shm_lock.owns_lock()) {
    char name[256];
    size_t len = sizeof name;
    if (fi_getname(&ep_->fid, name, &len) == 0) {
      std::string region(name, strnlen(name, len));
      if (region.rfind("fi_shm://", 0) == 0) region = region.substr(9);
      shm_regions_made().insert(region);
    }
    shm_lock.unlock();
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    recv_slab_.mem.reset(new char[kCtrlRecvSlots * kSlotBytes]);
    recv_slab_.mr = register_locked(recv_slab_.mem.get(), kCtrlRecvSlots * kSlotBytes, "control receive slots");
    for (int i = 0; i < kCtrlRecvSlots; ++i) post_ctrl_recv_locked(recv_slab_.mem.get() + i * kSlotBytes);
  }

  char addr[256];
  size_t addrlen = sizeof addr;
  check(fi_getname(&ep_->fid, addr, &addrlen), "fi_getname");
  me_ = self_proc();
  // The communicator's secret (wire.h), from rank 0 through the store.
  const std::string secret_key = str_cat(name_, "/lf/secret");
  std::string secret;
  if (rank_ == 0) {
    if (!random_secret(&secret))
      STRATA_THROW(STRATA_ERR_INTERNAL, who(), ": the system random generator failed (OpenSSL RAND_bytes)");
    host_.store_set(secret_key, secret, left_ms());
  }
  const std::string key = str_cat(name_, "/lf/addr/");
  const std::string pkey = str_cat(name_, "/lf/proc/");
  host_.store_set(pkey + std::to_string(rank_), str_cat(me_.boot_id, " ", me_.pid, " ", me_.start), left_ms());
  ep_key_ = hex(addr, addrlen);
  {
    std::lock_guard<std::mutex> lock(local_eps_mu());
    local_eps().insert(ep_key_);
  }
  host_.store_set(key + std::to_string(rank_), ep_key_, left_ms());
  {
    char buf[256];
    size_t len = sizeof buf;
    fi_av_straddr(av_, addr, buf, &len);
    peers_[rank_].address = buf;
  }

  std::vector<int> missing;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    std::string value, proc;
    try {
      // After the first miss, only see which others are missing too.
      const int64_t t = missing.empty() ? left_ms() : 1;
      value = host_.store_get(key + std::to_string(p), t);
      proc = host_.store_get(pkey + std::to_string(p), missing.empty() ? left_ms() : 1);
    } catch (const Error& e) {
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
      missing.push_back(p);
      continue;
    }
    std::vector<uint8_t> raw;
    if (!unhex(value, &raw) || raw.empty())
      STRATA_THROW(STRATA_ERR_DATA_LOSS, who(), ": rank ", p, " published a malformed address under '", key, p,
                   "'; was the store reused by another job?");
    Peer& peer = peers_[p];
    fi_addr_t fa = FI_ADDR_UNSPEC;
    const int n = fi_av_insert(av_, raw.data(), 1, &fa, 0, nullptr);
    if (n != 1)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, who(), ": cannot insert rank ", p, "'s address into the address vector (",
                   n < 0 ? fi_error_text(n) : std::string("0 inserted"),
                   "); do all ranks use the same provider? (this rank: ", prov_, ")");
    peer.addr = fa;
    char buf[256];
    size_t len = sizeof buf;
    fi_av_straddr(av_, raw.data(), buf, &len);
    peer.address = buf;
    std::istringstream in(proc);
    in >> peer.proc.boot_id >> peer.proc.pid >> peer.proc.start;
    peer.local = peer.proc.boot_id == me_.boot_id && peer.proc.pid != me_.pid && peer.proc.pid > 0;
    peer.same_process = peer.proc.boot_id == me_.boot_id && peer.proc.pid == me_.pid;
    peer.ep_key = value;
  }
  const auto here = 1 + std::count_if(peers_.begin(), peers_.end(),
                                      [](const Peer& q) { return q.local || q.same_process; });
  oversubscribed_by_job_ = here > transport::usable_cores();
  if (!missing.empty()) {
    std::string list;
    for (int p : missing) list += str_cat(list.empty() ? "" : ", ", "rank ", p);
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who(), " of ", world_, ": ", list,
                 missing.size() > 1 ? " never published their addresses" : " never published its address",
                 " (keys '", key, "<rank>') within ", timeout_ms,
                 " ms; check that every rank creates this communicator with the same name and world size");
  }
  if (rank_ != 0) {
    try {
      secret = host_.store_get(secret_key, left_ms());
    } catch (const Error& e) {
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who(), ": rank 0 never published the communicator's secret (key '",
                   secret_key, "') within ", timeout_ms, " ms; check that rank 0 creates this communicator");
    }
    if (secret.size() != kSecretBytes)
      STRATA_THROW(STRATA_ERR_DATA_LOSS, who(), ": the communicator's secret under '", secret_key, "' is ",
                   secret.size(), " bytes, not ", kSecretBytes, "; was the store reused by another job?");
  }
  derive_keys(secret);
  setup_done_ = true;
}

void LfComm::derive_keys(const std::string& secret) {
  std::vector<AuthKey> send(peers_.size()), recv(peers_.size());
  bool ok = data_tag_mask(secret, name_, &tag_mask_);
  for (int p = 0; p < world_ && ok; ++p) {
    if (p == rank_) continue;
    ok = pair_key(secret, name_, static_cast<uint32_t>(rank_), static_cast<uint32_t>(p), &send[p]) &&
         pair_key(secret, name_, static_cast<uint32_t>(p), static_cast<uint32_t>(rank_), &recv[p]);
  }
  if (!ok) STRATA_THROW(STRATA_ERR_INTERNAL, who(), ": deriving the communicator's keys failed (OpenSSL HMAC-SHA256)");
  std::lock_guard<std::mutex> lock(mu_);
  send_keys_ = std::move(send);
  recv_keys_ = std::move(recv);
}

LfComm::~LfComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    destroying_ = true;
    // After a failed setup, nothing was exchanged worth finishing: close
    // without driving the provider (its state may be what failed).
    // A failed or cancelled request whose data operation the provider never
    // handed back has been reported to its caller, who may have freed the
    // buffer since (the ring does, when a collective fails): driving the
    // provider now could make it read or write that freed memory. Then the
    // endpoint is closed without progress: no goodbyes (peers of a failed
    // communicator were sent its abort notices already), nothing drained.
    const bool stale = std::any_of(ops_.begin(), ops_.end(), [](const Op* op) {
      return op->posted && op->req == nullptr &&
             (op->kind == OpKind::kDataSend || op->kind == OpKind::kDataRecv || op->kind == OpKind::kWrite);
    });
    if (ep_ != nullptr && setup_done_) {
      if (!stale) {
        apply_abort_locked();
        // Let our sends reach their peers first (bounded), then cancel the rest.
        const auto until = Clock::now() + std::chrono::milliseconds(500);
        auto sending = [&] {
          for (Op* op : ops_)
            if ((op->kind == OpKind::kCtrlSend || op->kind == OpKind::kDataSend || op->kind == OpKind::kWrite) &&
                op->req != nullptr)
              return true;
          return false;
        };
        progress_locked();  // peers' goodbyes that already arrived: no reply to them
        while (sending() && Clock::now() < until) progress_locked();
        // Say goodbye so that peers waiting on this rank fail at once instead
        // of at their deadline (threads of one process have no liveness check).
        // (An aborted communicator has sent its abort notices instead.)
        for (int p = 0; p < world_; ++p)
          if (p != rank_ && !peers_[p].failed && !peers_[p].closed && peers_[p].addr != FI_ADDR_UNSPEC)
            send_notice_locked(p, kBye, "destroyed");
        auto saying = [&] {
          for (Op* op : ops_)
            if (op->kind == OpKind::kCtrlSend && op->req == nullptr) return true;
          return false;
        };
        const auto bye_until = Clock::now() + std::chrono::milliseconds(200);
        while (saying() && Clock::now() < bye_until) progress_locked();
      }
      closing_ = true;
      for (auto& backlog : backlog_) {
        for (Op* op : backlog) {
          ops_.erase(op);
          delete op;
        }
        backlog.clear();
      }
      for (Op* op : ops_)
        if (op->posted) fi_cancel(&ep_->fid, &op->ctx);
      const auto drain_until = Clock::now() + std::chrono::milliseconds(stale ? 0 : 200);
      while (!ops_.empty() && Clock::now() < drain_until) {
        const size_t before = ops_.size();
        progress_locked();
        if (ops_.size() == before) std::this_thread::yield();
      }
    }
    live_.clear();  // requests_ goes with this object
    if (!ep_key_.empty()) {
      std::lock_guard<std::mutex> lock(local_eps_mu());
      local_eps().erase(ep_key_);
    }
  }
  Parked res;
  res.ops.assign(ops_.begin(), ops_.end());
  // Parked ops may be freed after this object: their counters go with it.
  for (Op* op : res.ops) op->count = nullptr;
  ops_.clear();
  for (Op* op : op_pool_) delete op;
  op_pool_.clear();
  if (ep_ != nullptr) res.fids.push_back(&ep_->fid);
  for (Region* g : regions_) {
    res.fids.push_back(&g->mr->fid);
    delete g;
  }
  for (auto& e : cache_) res.fids.push_back(&e->mr->fid);
  for (Slab* s : {&recv_slab_}) {
    if (s->mr != nullptr) res.fids.push_back(&s->mr->fid);
    res.memory.push_back(std::move(s->mem));
  }
  for (auto* v : {&send_slabs_, &drain_slabs_})
    for (Slab& s : *v) {
      res.fids.push_back(&s.mr->fid);
      res.memory.push_back(std::move(s.mem));
    }
  for (fid_t f : {av_ ? &av_->fid : nullptr, cq_ ? &cq_->fid : nullptr, domain_ ? &domain_->fid : nullptr,
                  fabric_ ? &fabric_->fid : nullptr})
    if (f != nullptr) res.fids.push_back(f);
  // shm gives endpoints of one process each other's memory directly (see
  // local_eps): an endpoint closed while a same-process peer may still
  // progress messages from it would leave that peer reading unmapped
  // memory. The members of a communicator in this process therefore close
  // together, when the last of them is destroyed.
  std::string group;
  int members = 1;
  if (prov_.find("shm") != std::string::npos && !ep_key_.empty()) {
    std::string lowest = ep_key_;
    for (const Peer& p : peers_)
      if (p.same_process && !p.ep_key.empty()) {
        ++members;
        lowest = std::min(lowest, p.ep_key);
      }
    group = name_ + "#" + lowest;
  }
  std::vector<Parked> to_close;
  if (members > 1) {
    std::lock_guard<std::mutex> lock(parked_mu());
    ParkedGroup& g = parked_groups()[group];
    if (g.remaining == 0) g.remaining = members;
    g.parked.push_back(std::move(res));
    if (--g.remaining == 0) {
      to_close = std::move(g.parked);
      parked_groups().erase(group);
    }
  } else {
    to_close.push_back(std::move(res));
  }
  for (Parked& p : to_close) {
    for (fid_t f : p.fids) fi_close(f);
    for (Op* op : p.ops) delete op;
  }
  fabric_lib().freeinfo(info_);
}

// ------------------------------------------------------------ transport ---

LibfabricTransport::LibfabricTransport(sdk::Host host, const char* options_json) : host_(std::move(host)) {
  const std::string comp = "transport 'libfabric'";
  const auto o = sdk::parse_options(options_json, comp);
  sdk::check_known_keys(o, {"provider", "domain", "iface", "timeout_s", "max_message_bytes"}, comp);
  opts_.provider = sdk::get_option<std::string>(o, "provider", "", comp);
  opts_.domain = sdk::get_option<std::string>(o, "domain", "", comp);
  opts_.iface = sdk::get_option<std::string>(o, "iface", "", comp);
  opts_.max_message_bytes = sdk::get_option<uint64_t>(o, "max_message_bytes", 0, comp);
  opts_.timeout_s = sdk::collective_timeout_s(host_, o, comp);
  if (o.contains("max_message_bytes") && opts_.max_message_bytes < 4096)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'max_message_bytes' of ", comp, " must be >= 4096, got ",
                 opts_.max_message_bytes);

  // libfabric itself is opened here, not when the plugin is loaded (fabric_lib.h).
  if (const FabricLib& lib = fabric_lib(); !lib.ok()) STRATA_THROW(STRATA_ERR_UNAVAILABLE, comp, ": ", lib.error);
  const bool shm_named = opts_.provider.find("shm") != std::string::npos;
  const std::string node = opts_.iface.empty() || shm_named ? "" : iface_address(opts_.iface, comp);
  Options pick = opts_;
  if (pick.provider.empty()) {
    // Choose by name first (from every provider, RMA or not), then ask for
    // that provider with RMA and fall back to plain tagged messages.
    InfoList l;
    const int ret = query(opts_, false, node, &l.head);
    if (ret != 0)
      STRATA_THROW(STRATA_ERR_NOT_FOUND, comp, ": no libfabric provider offers FI_EP_RDM tagged messages",
                   node.empty() ? "" : str_cat(" on interface ", opts_.iface, " (", node, ")"), " (fi_getinfo: ",
                   fi_error_text(ret), "); providers present: ", present_providers(),
                   "; install a provider or use the tcp transport");
    int best = -1;
    for (fi_info* i = l.head; i != nullptr; i = i->next) {
      const int r = provider_rank(i->fabric_attr->prov_name);
      if (r >= 0 && (best < 0 || r < best)) {
        best = r;
        pick.provider = i->fabric_attr->prov_name;
      }
    }
    if (best < 0)
      STRATA_THROW(STRATA_ERR_NOT_FOUND, comp, ": no network provider for FI_EP_RDM among those present (",
                   present_providers(), "); udp, sockets and shm are used only when named: set option 'provider'");
  }
  InfoList l;
  int ret = query(pick, true, node, &l.head);
  rma_ = ret == 0;
  if (ret != 0) ret = query(pick, false, node, &l.head);
  if (ret != 0)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, comp, ": provider \"", pick.provider, "\"",
                 opts_.domain.empty() ? "" : str_cat(" with domain \"", opts_.domain, "\""),
                 node.empty() ? "" : str_cat(" on interface ", opts_.iface, " (", node, ")"),
                 " is not present or offers no FI_EP_RDM tagged messages (fi_getinfo: ", fi_error_text(ret),
                 "); providers present: ", present_providers(), "; set option 'provider' to one of them");
  info_ = fabric_lib().dupinfo(l.head);
  if (info_ == nullptr) throw std::bad_alloc();
  mr_local_ = (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
  host_.debug(comp, ": using provider ", info_->fabric_attr->prov_name, " domain ", info_->domain_attr->name,
              rma_ ? " with RMA" : " without RMA", mr_local_ ? ", FI_MR_LOCAL" : "");
}

LibfabricTransport::~LibfabricTransport() {
  if (info_ != nullptr) fabric_lib().freeinfo(info_);
}

strata_transport_caps LibfabricTransport::caps() {
  strata_transport_caps c{};
  c.flags = STRATA_TRANSPORT_CAP_P2P | STRATA_TRANSPORT_CAP_MEM_HOST | STRATA_TRANSPORT_CAP_THREAD_SAFE;
  if (rma_) c.flags |= STRATA_TRANSPORT_CAP_RMA;
  if (mr_local_) c.flags |= STRATA_TRANSPORT_CAP_REQUIRES_MR;
  c.max_inflight = 0;
  c.max_message_bytes = 0;  // longer messages are split
  const std::string prov = info_->fabric_attr->prov_name;
  // Sockets and shared memory gain little past 1 MiB chunks; NICs want
  // larger ones to amortise per-message cost at full bandwidth.
  const bool host_path = prov.rfind("tcp", 0) == 0 || prov.find("shm") != std::string::npos ||
                         prov.rfind("udp", 0) == 0 || prov.rfind("sockets", 0) == 0;
  c.preferred_chunk_bytes = host_path ? (1ull << 20) : (4ull << 20);
  return c;
}

std::unique_ptr<sdk::CommBase> LibfabricTransport::comm_create(const char* name, int32_t rank, int32_t world_size,
                                                               int64_t timeout_ms) {
  sdk::check_comm_create_args(name, rank, world_size);
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(opts_.timeout_s * 1000.0);
  auto comm = std::make_unique<LfComm>(host_, opts_, info_, rma_, mr_local_, name, rank, world_size);
  comm->setup(timeout_ms);
  return comm;
}

}  // namespace strata::transport::libfabric

namespace strata::transport::libfabric {
namespace {

// libfabric and the libraries it links for its providers (verbs, psm2, efa,
// ...) allocate in their constructors and keep threads and handlers around;
// they are not made to be unloaded. The host dlcloses plugins at shutdown,
// which would unload them too (and LeakSanitizer then reports those
// allocations as leaked from an unknown module). Keep libfabric loaded for
// the life of the process once this plugin was loaded.
[[maybe_unused]] const bool g_libfabric_pinned =
    ::dlopen("libfabric.so.1", RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE) != nullptr;

std::string shm_options(const char* options_json) {
  auto o = sdk::parse_options(options_json, "transport 'shm'");
  if (o.contains("provider") && o["provider"] != "shm")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "transport 'shm' is libfabric's shm provider, so its option 'provider' "
                 "can only be \"shm\", got ", o["provider"].dump(), "; use transport 'libfabric' for other providers");
  o["provider"] = "shm";
  return o.dump();
}

}  // namespace

ShmTransport::ShmTransport(sdk::Host host, const char* options_json)
    : LibfabricTransport(std::move(host), shm_options(options_json).c_str()) {}

}  // namespace strata::transport::libfabric

STRATA_PLUGIN("strata-transport-libfabric", "0.1.0",
              STRATA_TRANSPORT_COMPONENT(strata::transport::libfabric::LibfabricTransport, "libfabric", "0.1.0"),
              STRATA_TRANSPORT_COMPONENT(strata::transport::libfabric::ShmTransport, "shm", "0.1.0"));
