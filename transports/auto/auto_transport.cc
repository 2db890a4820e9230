// SPDX-License-Identifier: Apache-2.0
#include "auto_transport.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/sdk/options.hpp"
#include "../common/rdma_devices.h"

namespace strata::transport::auto_select {

using ::strata::detail::str_cat;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kComp = "transport 'auto'";
// Providers that drive a real NIC, best first. "tcp;ofi_rxm", "udp;ofi_rxd"
// and "sockets" are deliberately absent: over plain IP the tcp plugin is the
// better-tested path, so they are no reason to leave it.
constexpr const char* kNicProviders[] = {"verbs", "efa", "psm3", "psm2", "opx", "cxi"};
constexpr int kLocal = 0;
constexpr int kRemote = 1;
constexpr uint64_t kRegionMagic = 0x5354524155544f52ull;  // "STRAUTOR"

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

// What makes two processes "the same host" (see the header): a reboot or
// another network namespace is another host for the same-host path.
std::string default_identity(std::string* label) {
  char hn[HOST_NAME_MAX + 1] = {};
  if (::gethostname(hn, sizeof hn - 1) != 0) std::strcpy(hn, "unknown-host");
  char ns[256] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  if (n > 0) ns[n] = '\0';
  *label = hn;
  return str_cat(hn, "|", first_line("/proc/sys/kernel/random/boot_id"), "|", n > 0 ? ns : "no-netns");
}

std::string label_of(const std::string& name, const std::string& options_json) {
  const json o = json::parse(options_json, nullptr, false);
  if (o.is_object()) {
    auto p = o.find("provider");
    if (p != o.end() && p->is_string()) return name + "/" + p->get<std::string>();
  }
  return name;
}

// The gist of an error for the one-line plan: up to its first clause (the
// full text is logged once where the fallback happens).
std::string short_reason(const std::string& what) {
  std::string s = what.substr(0, what.find_first_of(";\n"));
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

// "local"/"remote": absent (false), "name" or {"name", "options"}.
bool parse_spec(const json& o, const char* key, std::string* name, std::string* options) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return false;
  const std::string what = str_cat("option '", key, "' of ", kComp);
  if (it->is_string()) {
    *name = it->get<std::string>();
    *options = "{}";
  } else if (it->is_object()) {
    sdk::check_known_keys(*it, {"name", "options"}, what);
    *name = sdk::get_option<std::string>(*it, "name", "", what);
    *options = "{}";
    if (auto oo = it->find("options"); oo != it->end() && !oo->is_null()) {
      if (!oo->is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, ": 'options' must be a JSON object, got ", oo->dump());
      *options = oo->dump();
    }
  } else {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " must be a transport name or {\"name\": ..., \"options\": {...}}, got ",
                 it->dump());
  }
  if (name->empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " names no transport; give e.g. \"tcp\"");
  if (*name == "auto")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " is \"auto\", which cannot compose itself; name a transport "
                 "that moves bytes, such as \"tcp\" or \"libfabric\"");
  return true;
}

SubTransport make_sub(const sdk::Host& host, const std::string& name, const std::string& options, std::string why) {
  SubTransport s;
  s.name = name;
  s.options = options;
  s.label = label_of(name, options);
  s.why = std::move(why);
  s.ref = host.create_plugin<strata_transport_vtable>(name, options);
  STRATA_INIT_HEADER(&s.caps, strata_transport_caps);
  strata_error e;
  strata_error_init(&e);
  ::strata::detail::check_status(s.ref.vtable()->get_caps(s.ref.handle<strata_transport_t>(), &s.caps, &e), e,
                                 str_cat("get_caps of transport '", s.label, "'").c_str());
  return s;
}

uint64_t min_nonzero(uint64_t a, uint64_t b) {
  if (a == 0) return b;
  if (b == 0) return a;
  return std::min(a, b);
}

struct Sub {
  const SubTransport* t = nullptr;
  strata_comm_t comm = nullptr;
  std::string name;            // sub-communicator name
  std::vector<int32_t> ranks;  // global rank of each sub-rank
};

struct Route {
  int sub = -1;
  int32_t sub_rank = -1;
};

struct AutoRequest {
  int sub;
  strata_request_t req;
  int32_t peer;
  uintptr_t gen = 0;   // bumped at each reuse of the slot: stale handles fail lookup
  size_t index = 0;    // its slot
  bool live = false;
};

// Request handles are slot numbers and generations, not pointers, so that a
// pool of slots (no allocation per message) can still reject a handle that
// was released: the low kSlotBits hold slot + 1, the rest the generation.
constexpr unsigned kSlotBits = 24;
constexpr uintptr_t kSlotMask = (uintptr_t(1) << kSlotBits) - 1;
constexpr uintptr_t kGenMask = ~uintptr_t(0) >> kSlotBits;

struct AutoRegion {
  uint64_t magic = kRegionMagic;
  strata_mem_region_t sub[2] = {nullptr, nullptr};
};

std::string join_ranks(const std::vector<int32_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

}  // namespace

// ---------------------------------------------------------------- comm ---

class AutoComm : public sdk::CommBase {
 public:
  AutoComm(sdk::Host host, std::string name, int32_t rank, int32_t world, double timeout_s)
      : host_(std::move(host)), name_(std::move(name)), rank_(rank), world_(world), timeout_s_(timeout_s) {}
  ~AutoComm() override;

  void setup(const SubTransport& local, const SubTransport& remote, const std::string& identity,
             const std::string& host_label, int64_t timeout_ms);

  void abort(const char* reason) noexcept override {
    for (const Sub& s : subs_)
      if (s.comm != nullptr) s.t->ref.vtable()->comm_abort(s.comm, reason);
  }
  strata_mem_region_t mem_register(void* data, uint64_t bytes, DLDevice device) override;
  void mem_deregister(strata_mem_region_t mr) noexcept override;
  strata_request_t isend(int32_t peer, uint64_t tag, const strata_buffer& buf) override {
    return post(true, peer, tag, buf);
  }
  strata_request_t irecv(int32_t peer, uint64_t tag, const strata_buffer& buf) override {
    return post(false, peer, tag, buf);
  }
  bool test(strata_request_t req, uint64_t* bytes) override;
  uint64_t wait(strata_request_t req, int64_t timeout_ms) override;
  void cancel(strata_request_t req) noexcept override;

 private:
  const strata_transport_vtable* vt(int sub) const { return subs_[sub].t->ref.vtable(); }
  // "rank 3 (host b, via libfabric/shm as its local rank 1)".
  std::string peer_name(int32_t p) const {
    const Route& r = routes_[p];
    if (r.sub == kLocal)
      return str_cat("rank ", p, " (host ", host_of_[p], ", via ", subs_[kLocal].t->label, " as its local rank ",
                     r.sub_rank, ")");
    return str_cat("rank ", p, " (host ", host_of_[p], ", via ", subs_[kRemote].t->label, " across hosts)");
  }
  [[noreturn]] void fail_peer(strata_status_t code, const strata_error& e, int32_t peer) const {
    STRATA_THROW(code, peer_name(peer), ": ", e.message[0] ? e.message : strata_status_string(code));
  }
  strata_request_t post(bool send, int32_t peer, uint64_t tag, const strata_buffer& buf);
  AutoRequest* lookup(strata_request_t h) {
    const auto v = reinterpret_cast<uintptr_t>(h);
    const uintptr_t slot = v & kSlotMask;
    std::lock_guard<std::mutex> lock(mu_);
    if (slot == 0 || slot > slots_.size() || !slots_[slot - 1].live || slots_[slot - 1].gen != (v >> kSlotBits))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "request ", static_cast<void*>(h), " is not a live request of auto "
                   "communicator '", name_, "' rank ", rank_, " (already completed, failed or cancelled?)");
    return &slots_[slot - 1];
  }
  // Takes a free slot (the pool only grows while more requests are live
  // than ever before) and returns its handle.
  strata_request_t acquire(AutoRequest*& out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      if (slots_.size() >= kSlotMask)
        STRATA_THROW(STRATA_ERR_INTERNAL, "auto communicator '", name_, "' rank ", rank_, ": more than ", kSlotMask,
                     " requests live at once; wait for some before posting more");
      slots_.emplace_back();
      slots_.back().index = slots_.size() - 1;
      free_.push_back(slots_.size() - 1);
    }
    const size_t i = free_.back();
    free_.pop_back();
    AutoRequest& r = slots_[i];
    r.gen = (r.gen + 1) & kGenMask;
    r.live = true;
    out = &r;
    return reinterpret_cast<strata_request_t>((r.gen << kSlotBits) | uintptr_t(i + 1));
  }
  void release(AutoRequest* r) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    r->live = false;
    r->req = nullptr;
    free_.push_back(r->index);
  }

  sdk::Host host_;
  std::string name_;
  int32_t rank_, world_;
  double timeout_s_;
  Sub subs_[2];
  std::vector<Route> routes_;
  std::vector<std::string> host_of_;  // display label of each rank's host
  std::mutex mu_;
  std::deque<AutoRequest> slots_;  // guarded by mu_; a deque keeps addresses stable as it grows
  std::vector<size_t> free_;       // guarded by mu_; free slots
};

AutoComm::~AutoComm() {
  // Sub-communicators cancel what is pending when destroyed; only then are
  // the wrappers of requests the caller abandoned safe to free.
  for (Sub& s : subs_)
    if (s.comm != nullptr) s.t->ref.vtable()->comm_destroy(s.comm);
}

void AutoComm::setup(const SubTransport& local, const SubTransport& remote, const std::string& identity,
                     const std::string& host_label, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  };
  const std::string who = str_cat("auto comm_create('", name_, "') rank ", rank_, " of ", world_);
  auto host_key = [&](int r) { return str_cat(name_, "/auto/host/", r); };

  // 1. Publish this rank's host record and read everyone's.
  const json mine = {{"id", identity}, {"host", host_label}, {"local", local.label}, {"remote", remote.label}};
  try {
    host_.store_set(host_key(rank_), mine.dump(), left_ms());
  } catch (const Error& e) {
    STRATA_THROW(e.code(), who, ": publishing its host record at '", host_key(rank_), "' failed: ", e.what(),
                 "; check the rendezvous store");
  }
  std::vector<std::string> keys;
  for (int r = 0; r < world_; ++r) keys.push_back(host_key(r));
  try {
    host_.store_wait(keys, left_ms());
  } catch (const DeadlineExceededError&) {
    // Say which ranks are missing; a short probe per key is enough because
    // this path runs once, after the deadline.
    std::vector<int32_t> missing;
    for (int r = 0; r < world_; ++r) {
      try {
        host_.store_get(keys[r], 20);
      } catch (const Error&) {
        missing.push_back(r);
      }
    }
    // "rank 1, rank 2": each culprit reads (and greps) as "rank N".
    std::string list;
    for (int32_t r : missing) list += str_cat(list.empty() ? "" : ", ", "rank ", r);
    if (missing.empty()) list = "(none missing any more: the last arrived right at the deadline)";
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": ", list, " never published a host record ('", name_,
                 "/auto/host/<rank>') within ", timeout_ms,
                 " ms; start every rank with the same communicator name and world size ", world_,
                 ", or raise timeout_s");
  }
  std::vector<json> recs(world_);
  for (int r = 0; r < world_; ++r) {
    const std::string text = host_.store_get(keys[r], left_ms());
    recs[r] = json::parse(text, nullptr, false);
    if (!recs[r].is_object() || !recs[r].contains("id") || !recs[r]["id"].is_string() ||
        !recs[r].contains("host") || !recs[r].contains("local") || !recs[r].contains("remote"))
      STRATA_THROW(STRATA_ERR_DATA_LOSS, who, ": the host record of rank ", r, " at '", keys[r],
                   "' is malformed (", short_reason(text), "); another program may use this communicator name, "
                   "pick a unique one");
  }

  // 2. Group ranks by host, groups numbered by their lowest rank.
  std::map<std::string, int> group_id;
  std::vector<int> group_of(world_);
  std::vector<std::vector<int32_t>> groups;
  std::vector<std::string> group_label;
  for (int r = 0; r < world_; ++r) {
    const std::string id = recs[r]["id"].get<std::string>();
    auto [it, fresh] = group_id.emplace(id, static_cast<int>(groups.size()));
    if (fresh) {
      groups.emplace_back();
      std::string label = recs[r]["host"].is_string() ? recs[r]["host"].get<std::string>() : id;
      // Two hosts may share a hostname (network namespaces, clones): keep
      // them apart in messages.
      if (std::find(group_label.begin(), group_label.end(), label) != group_label.end())
        label += str_cat("#", it->second);
      group_label.push_back(label);
    }
    group_of[r] = it->second;
    groups[it->second].push_back(r);
  }
  host_of_.resize(world_);
  for (int r = 0; r < world_; ++r) host_of_[r] = group_label[group_of[r]];

  // 3. Agreement: every rank checks every group, so a mismatch fails all
  // ranks with the same message instead of leaving some in a rendezvous.
  for (const auto& g : groups) {
    if (g.size() < 2) continue;
    for (int32_t r : g)
      if (recs[r]["local"] != recs[g[0]]["local"])
        STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who, ": ranks on host ", host_of_[g[0]],
                     " disagree on the local transport: rank ", g[0], " uses ", recs[g[0]]["local"].dump(), ", rank ",
                     r, " uses ", recs[r]["local"].dump(), "; give every rank the same 'local' option (with the "
                     "default, the same plugins must be installed on every rank)");
  }
  if (groups.size() > 1)
    for (int r = 1; r < world_; ++r)
      if (recs[r]["remote"] != recs[0]["remote"])
        STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who, ": ranks disagree on the remote transport: rank 0 uses ",
                     recs[0]["remote"].dump(), ", rank ", r, " uses ", recs[r]["remote"].dump(),
                     "; give every rank the same 'remote' option (with the default, the same plugins and NICs "
                     "must be usable on every rank)");

  // 4. Sub-communicators: local first, then remote, on every rank in that
  // order; a local one involves only ranks of one host, which all reach the
  // remote one right after, so neither can wait on the other.
  const int my_group = group_of[rank_];
  const auto& mine_g = groups[my_group];
  auto create = [&](int which, const SubTransport& t, std::string name, std::vector<int32_t> ranks) {
    Sub& s = subs_[which];
    s.t = &t;
    s.name = std::move(name);
    s.ranks = std::move(ranks);
    const int32_t sub_rank =
        static_cast<int32_t>(std::find(s.ranks.begin(), s.ranks.end(), rank_) - s.ranks.begin());
    strata_error e;
    strata_error_init(&e);
    const strata_status_t st = t.ref.vtable()->comm_create(t.ref.handle<strata_transport_t>(), s.name.c_str(),
                                                           sub_rank, static_cast<int32_t>(s.ranks.size()),
                                                           left_ms(), &s.comm, &e);
    if (st != STRATA_OK) {
      s.comm = nullptr;
      STRATA_THROW(st, who, ": creating the ", which == kLocal ? "local" : "remote", " sub-communicator '", s.name,
                   "' over ", t.label, " failed",
                   which == kLocal ? str_cat(" (its local ranks 0..", s.ranks.size() - 1, " are global ranks ",
                                             join_ranks(s.ranks), " on host ", host_of_[rank_], ")")
                                   : std::string(" (its ranks are the global ranks)"),
                   ": ", e.message[0] ? e.message : strata_status_string(st));
    }
  };
  if (mine_g.size() > 1) create(kLocal, local, str_cat(name_, "/auto/local/", my_group), mine_g);
  if (groups.size() > 1) {
    std::vector<int32_t> all(world_);
    for (int r = 0; r < world_; ++r) all[r] = r;
    create(kRemote, remote, name_ + "/auto/remote", all);
  }

  // 5. Routes.
  routes_.assign(world_, Route{});
  json routes = json::array();
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    if (group_of[p] == my_group) {
      routes_[p] = {kLocal, static_cast<int32_t>(std::find(mine_g.begin(), mine_g.end(), p) - mine_g.begin())};
    } else {
      routes_[p] = {kRemote, p};
    }
    routes.push_back({{"peer", p},
                      {"scope", routes_[p].sub == kLocal ? "local" : "remote"},
                      {"transport", subs_[routes_[p].sub].t->label},
                      {"sub_rank", routes_[p].sub_rank}});
  }
  try {
    host_.store_set(str_cat(name_, "/auto/route/", rank_),
                    json{{"rank", rank_}, {"host", host_of_[rank_]}, {"routes", routes}}.dump(), left_ms());
  } catch (const Error& e) {
    STRATA_THROW(e.code(), who, ": publishing its routes failed: ", e.what(), "; check the rendezvous store");
  }

  if (rank_ == 0) {
    std::string plan = str_cat("auto '", name_, "': ");
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) plan += "; ";
      if (groups[g].size() > 1) {
        plan += str_cat("ranks ", join_ranks(groups[g]), " on host ", group_label[g], " via ",
                        recs[groups[g][0]]["local"].get<std::string>());
        if (g == static_cast<size_t>(my_group) && !local.why.empty()) plan += " (" + local.why + ")";
      } else {
        plan += str_cat("rank ", groups[g][0], " alone on host ", group_label[g]);
      }
    }
    if (groups.size() > 1) {
      plan += "; across hosts via " + remote.label;
      if (!remote.why.empty()) plan += " (" + remote.why + ")";
    }
    host_.info(plan);
  }
}

strata_request_t AutoComm::post(bool send, int32_t peer, uint64_t tag, const strata_buffer& buf) {
  const char* op = send ? "isend" : "irecv";
  if (peer < 0 || peer >= world_ || peer == rank_)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "auto communicator '", name_, "' rank ", rank_, ": ", op, " peer ", peer,
                 peer == rank_ ? " is this rank itself" : " is not a rank", " (world size ", world_,
                 "); pass another rank in 0..", world_ - 1);
  const Route& rt = routes_[peer];
  strata_buffer b = buf;
  if (buf.mr != nullptr) {
    auto* reg = reinterpret_cast<AutoRegion*>(buf.mr);
    if (reg->magic != kRegionMagic)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "auto communicator '", name_, "' rank ", rank_, ": ", op, " to/from ",
                   peer_name(peer), " got a memory region that this communicator's mem_register did not return; "
                   "register the buffer with the same communicator");
    b.mr = reg->sub[rt.sub];
  }
  AutoRequest* req = nullptr;
  const strata_request_t handle = acquire(req);
  req->sub = rt.sub;
  req->peer = peer;
  strata_error e;
  strata_error_init(&e);
  const Sub& s = subs_[rt.sub];
  strata_request_t sub_req = nullptr;
  const strata_status_t st = send ? vt(rt.sub)->isend(s.comm, rt.sub_rank, tag, &b, &sub_req, &e)
                                  : vt(rt.sub)->irecv(s.comm, rt.sub_rank, tag, &b, &sub_req, &e);
  if (st != STRATA_OK) {
    release(req);
    fail_peer(st, e, peer);
  }
  req->req = sub_req;
  return handle;
}

bool AutoComm::test(strata_request_t h, uint64_t* bytes) {
  AutoRequest* r = lookup(h);
  const int32_t peer = r->peer;
  int32_t done = 0;
  uint64_t n = 0;
  strata_error e;
  strata_error_init(&e);
  const strata_status_t st = vt(r->sub)->test(subs_[r->sub].comm, r->req, &done, &n, &e);
  if (st != STRATA_OK) {
    release(r);  // a failed request is released by the sub-communicator too
    fail_peer(st, e, peer);
  }
  if (done == 0) return false;
  release(r);
  *bytes = n;
  return true;
}

uint64_t AutoComm::wait(strata_request_t h, int64_t timeout_ms) {
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(timeout_s_ * 1000.0);
  AutoRequest* r = lookup(h);
  const int32_t peer = r->peer;
  uint64_t n = 0;
  strata_error e;
  strata_error_init(&e);
  const strata_status_t st = vt(r->sub)->wait(subs_[r->sub].comm, r->req, timeout_ms, &n, &e);
  // DEADLINE_EXCEEDED leaves the request pending (transport.h), so the
  // wrapper must stay too.
  if (st != STRATA_ERR_DEADLINE_EXCEEDED) release(r);
  if (st != STRATA_OK) fail_peer(st, e, peer);
  return n;
}

void AutoComm::cancel(strata_request_t h) noexcept {
  try {
    AutoRequest* r = lookup(h);
    vt(r->sub)->cancel(subs_[r->sub].comm, r->req);
    release(r);
  } catch (...) {
  }
}

strata_mem_region_t AutoComm::mem_register(void* data, uint64_t bytes, DLDevice device) {
  auto reg = std::make_unique<AutoRegion>();
  for (int i = 0; i < 2; ++i) {
    if (subs_[i].comm == nullptr) continue;
    strata_error e;
    strata_error_init(&e);
    const strata_status_t st = vt(i)->mem_register(subs_[i].comm, data, bytes, device, &reg->sub[i], &e);
    if (st != STRATA_OK) {
      reg->sub[i] = nullptr;
      for (int j = 0; j < i; ++j)
        if (reg->sub[j] != nullptr) vt(j)->mem_deregister(subs_[j].comm, reg->sub[j]);
      STRATA_THROW(st, "auto communicator '", name_, "' rank ", rank_, ": registering ", bytes, " bytes at ", data,
                   " with the ", i == kLocal ? "local" : "remote", " sub-communicator over ", subs_[i].t->label,
                   " failed: ", e.message[0] ? e.message : strata_status_string(st));
    }
  }
  return reinterpret_cast<strata_mem_region_t>(reg.release());
}

void AutoComm::mem_deregister(strata_mem_region_t mr) noexcept {
  auto* reg = reinterpret_cast<AutoRegion*>(mr);
  if (reg == nullptr || reg->magic != kRegionMagic) return;
  for (int i = 0; i < 2; ++i)
    if (reg->sub[i] != nullptr && subs_[i].comm != nullptr) vt(i)->mem_deregister(subs_[i].comm, reg->sub[i]);
  reg->magic = 0;
  delete reg;
}

// ----------------------------------------------------------- transport ---

AutoTransport::AutoTransport(sdk::Host host, const char* options_json) : host_(std::move(host)) {
  const json o = sdk::parse_options(options_json, kComp);
  sdk::check_known_keys(o, {"local", "remote", "host_id", "timeout_s"}, kComp);

  timeout_s_ = sdk::collective_timeout_s(host_, o, kComp);

  if (o.contains("host_id") && !o["host_id"].is_null()) {
    const std::string id = sdk::get_option<std::string>(o, "host_id", "", kComp);
    if (id.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'host_id' of ", kComp,
                   " is empty; give a name shared by the ranks of one host, or leave it out to detect hosts");
    identity_ = "host_id:" + id;
    host_label_ = id;
  } else {
    identity_ = default_identity(&host_label_);
  }

  auto explicit_sub = [&](const char* key, const std::string& name, const std::string& options) {
    try {
      return make_sub(host_, name, options, "");
    } catch (const Error& e) {
      STRATA_THROW(e.code(), "option '", key, "' of ", kComp, " names transport '", name, "' (options ", options,
                   "), which cannot be created: ", e.what(), "; install its plugin (libstrata-transport-", name,
                   ".so on STRATA_PLUGIN_PATH), fix its options, or name another transport such as \"tcp\"");
    }
  };

  std::string name, options;
  if (parse_spec(o, "local", &name, &options)) {
    local_ = explicit_sub("local", name, options);
  } else {
    // Strata's own shared memory first (it measured faster than
    // libfabric's shm provider at every size from 4 KiB to 64 MiB: README),
    // then libfabric/shm, then tcp over loopback.
    std::string why_not;
    try {
      local_ = make_sub(host_, "shmem", "{}", "");
    } catch (const Error& e) {
      why_not = "shmem unavailable: " + short_reason(e.what());
      host_.info("auto: same-host transport 'shmem' is unavailable (", e.what(), "); trying libfabric/shm");
    }
    if (!local_.ref) {
      try {
        local_ = make_sub(host_, "libfabric", R"({"provider":"shm"})", why_not);
      } catch (const Error& e) {
        const std::string why = why_not + "; libfabric/shm unavailable: " + short_reason(e.what());
        host_.info("auto: same-host transport falls back to tcp because libfabric/shm is unavailable: ", e.what());
        local_ = make_sub(host_, "tcp", "{}", why);
      }
    }
  }

  if (parse_spec(o, "remote", &name, &options)) {
    remote_ = explicit_sub("remote", name, options);
  } else {
    std::string tried, full;  // why no NIC provider; the first refusal in full
    if (!has_rdma_device()) {
      tried = kNoRdmaDeviceReason;  // libfabric is not even loaded (rdma_devices.h)
    } else {
      for (const char* prov : kNicProviders) {
        try {
          remote_ = make_sub(host_, "libfabric", json{{"provider", prov}}.dump(), "");
          break;
        } catch (const Error& e) {
          // A refusal that does not name the provider is about the plugin
          // itself (not installed, rejected): the other providers would get
          // the same answer.
          if (std::string(e.what()).find(prov) == std::string::npos) {
            tried = "libfabric: " + short_reason(e.what());
            full = e.what();
            break;
          }
          tried += str_cat(tried.empty() ? "libfabric has none of " : ", ", prov);
          if (full.empty()) full = e.what();  // the others say the same of their provider
        }
      }
    }
    if (!remote_.ref) {
      const std::string why = "no RDMA provider: " + tried;
      host_.info("auto: cross-host transport falls back to tcp (", why, ")", full.empty() ? "" : "; first refusal: ",
                 full);
      remote_ = make_sub(host_, "tcp", "{}", why);
    }
  }
}

strata_transport_caps AutoTransport::caps() {
  strata_transport_caps c{};
  const auto& a = local_.caps;
  const auto& b = remote_.caps;
  c.flags = STRATA_TRANSPORT_CAP_P2P | STRATA_TRANSPORT_CAP_MEM_HOST;
  if ((a.flags & b.flags & STRATA_TRANSPORT_CAP_THREAD_SAFE) != 0) c.flags |= STRATA_TRANSPORT_CAP_THREAD_SAFE;
  if (((a.flags | b.flags) & STRATA_TRANSPORT_CAP_REQUIRES_MR) != 0) c.flags |= STRATA_TRANSPORT_CAP_REQUIRES_MR;
  c.max_inflight = static_cast<uint32_t>(min_nonzero(a.max_inflight, b.max_inflight));
  c.max_message_bytes = min_nonzero(a.max_message_bytes, b.max_message_bytes);
  c.preferred_chunk_bytes = min_nonzero(a.preferred_chunk_bytes, b.preferred_chunk_bytes);
  return c;
}

std::unique_ptr<sdk::CommBase> AutoTransport::comm_create(const char* name, int32_t rank, int32_t world_size,
                                                          int64_t timeout_ms) {
  sdk::check_comm_create_args(name, rank, world_size);
  if (timeout_ms < 0) timeout_ms = static_cast<int64_t>(timeout_s_ * 1000.0);
  auto comm = std::make_unique<AutoComm>(host_, name, rank, world_size, timeout_s_);
  comm->setup(local_, remote_, identity_, host_label_, timeout_ms);
  return comm;
}

}  // namespace strata::transport::auto_select

STRATA_PLUGIN("strata-transport-auto", "0.1.0",
              STRATA_TRANSPORT_COMPONENT(strata::transport::auto_select::AutoTransport, "auto", "0.1.0"));
