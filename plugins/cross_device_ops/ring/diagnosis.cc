// SPDX-License-Identifier: Apache-2.0
#include "diagnosis.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string_view>
#include <sstream>

#include "strata/error.hpp"

namespace strata::plugins::ring {
namespace {

using nlohmann::json;
using ::strata::detail::str_cat;

int64_t mono_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// CLOCK_MONOTONIC_COARSE: the same clock as mono_ms() read at the last
// timer tick (a few ms behind), for 5 ns instead of 30 in a VM. For the
// stamp every collective's wait takes, which the watcher compares at its
// 100 ms ticks.
int64_t coarse_mono_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}
int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// Fields of /proc/<pid>/stat after the command name (which may hold spaces
// and parentheses, hence the last ')'): [0] is the state, [19] the start time.
// Read with plain read(2): a process that exits while its file is read
// makes read fail with ESRCH, which libstdc++'s filebuf throws from
// underflow() as an uncaught ios_base::failure (seen in the fault matrix:
// "basic_filebuf::underflow error reading the file: No such process").
std::string read_proc_file(const std::string& path) {
  std::string s;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      s.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  ::close(fd);
  return s;
}

// /proc/PID/stat: the state letter, the start time and whether the process
// is on its way out: its main thread is exiting (PF_EXITING in `flags`) or
// has SIGKILL pending (`signal`, that thread's pending set; a SIGKILL to the
// process puts it in every thread's). A killed process with much memory
// can take a second or more under load to tear down before /proc calls it
// a zombie, while its sockets are already closed.
bool read_stat(int64_t pid, char* state, uint64_t* start, bool* exiting = nullptr) {
  const std::string s = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream in(s.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string t; in >> t && fields.size() < 29;) fields.push_back(t);
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  *start = std::strtoull(fields[19].c_str(), nullptr, 10);
  if (exiting != nullptr) {
    constexpr uint64_t kPfExiting = 0x4;
    constexpr uint64_t kSigKillBit = uint64_t(1) << (9 - 1);
    const uint64_t flags = std::strtoull(fields[6].c_str(), nullptr, 10);
    const uint64_t pending = fields.size() >= 29 ? std::strtoull(fields[28].c_str(), nullptr, 10) : 0;
    *exiting = (flags & kPfExiting) != 0 || (pending & kSigKillBit) != 0;
  }
  return true;
}

void append_to(void* user, const char* data, uint64_t len) { static_cast<std::string*>(user)->append(data, len); }

// Store calls that never throw: the diagnosis must go on when the store is
// gone (it lives in rank 0's process) and must not wait on it for long.
enum class Got { kOk, kMissing, kDown };

Got store_get(const sdk::Host& host, const std::string& key, int64_t timeout_ms, std::string* out) {
  out->clear();
  const strata_host_api* api = host.api();
  if (api == nullptr || api->store_get == nullptr) return Got::kDown;
  strata_error err;
  strata_error_init(&err);
  const int64_t t0 = mono_ms();
  const strata_status_t s = api->store_get(api, key.c_str(), &append_to, out, timeout_ms, &err);
  if (s == STRATA_OK) return Got::kOk;
  // An absent key answers at its own deadline; a silent store only after
  // the client's grace period.
  if (s == STRATA_ERR_DEADLINE_EXCEEDED && mono_ms() - t0 < timeout_ms + 2000) return Got::kMissing;
  return Got::kDown;
}

bool store_set(const sdk::Host& host, const std::string& key, const std::string& value, int64_t timeout_ms) {
  const strata_host_api* api = host.api();
  if (api == nullptr || api->store_set == nullptr) return false;
  strata_error err;
  strata_error_init(&err);
  return api->store_set(api, key.c_str(), value.data(), value.size(), timeout_ms, &err) == STRATA_OK;
}

bool store_add(const sdk::Host& host, const std::string& key, int64_t delta, int64_t timeout_ms, int64_t* result) {
  const strata_host_api* api = host.api();
  if (api == nullptr || api->store_add == nullptr) return false;
  strata_error err;
  strata_error_init(&err);
  return api->store_add(api, key.c_str(), delta, result, timeout_ms, &err) == STRATA_OK;
}

json info_json(const PeerInfo& p) {
  return {{"pid", p.pid}, {"host", p.host}, {"host_id", p.host_id}, {"start", p.start}};
}

PeerInfo info_of(const json& j) {
  PeerInfo p;
  if (!j.is_object()) return p;
  p.pid = j.value("pid", int64_t(0));
  p.host = j.value("host", std::string());
  p.host_id = j.value("host_id", std::string());
  p.start = j.value("start", uint64_t(0));
  p.known = p.pid > 0 && !p.host_id.empty();
  return p;
}

json parse_or_null(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  return j.is_discarded() ? json() : j;
}

// An error text without the " [file.cc:123]" suffix STRATA_THROW appends.
std::string bare(std::string m) {
  const size_t at = m.rfind(" [");
  if (at != std::string::npos && m.back() == ']' && m.find(".cc:", at) != std::string::npos) m.resize(at);
  return m;
}

std::string rank_list(const std::vector<int32_t>& ranks, int32_t world) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return s + " of " + std::to_string(world);
}

std::string where(const PeerInfo& p) {
  if (!p.known) return "";
  return str_cat(" (pid ", p.pid, " on ", p.host, ")");
}

// "it was in all_reduce #12 (...)" from a heartbeat record.
std::string doing(const json& hb) {
  if (!hb.is_object() || !hb.contains("seq") || hb["seq"].is_null()) return "";
  const std::string op = hb.value("op", std::string("a collective"));
  const std::string state = hb.value("state", std::string());
  const std::string seq = "#" + std::to_string(hb.value("seq", uint64_t(0)));
  // A heartbeat is up to one interval old: say what it showed, not where the
  // rank is now (a fast loop may have moved on several collectives since).
  if (state == "started") return str_cat("its last heartbeat showed it in ", seq, " ", op);
  return str_cat("its last heartbeat showed ", seq, " ", op, " ", state);
}

}  // namespace

json to_json(const OpRecord& r) {
  return {{"seq", r.seq},     {"op", r.op},           {"bytes", r.bytes}, {"state", r.state},
          {"start_ms", r.start_ms}, {"end_ms", r.end_ms}, {"error", r.error}};
}

// ------------------------------------------------------- FlightRecorder ---

// The states as views: assigned and compared for every collective, with no
// strlen.
constexpr std::string_view kStarted = "started", kCompleted = "completed", kFailed = "failed";

void FlightRecorder::start(uint64_t seq, const std::string& op, uint64_t bytes) {
  const int64_t now = epoch_ms();
  std::lock_guard<std::mutex> lock(mu_);
  OpRecord r;
  if (records_.size() >= kTraceLength) {
    r = std::move(records_.front());  // its strings keep their capacity
    records_.pop_front();
  }
  r.seq = seq;
  r.op.assign(op);
  r.bytes = bytes;
  r.state.assign(kStarted);
  r.start_ms = now;
  r.end_ms = 0;
  r.error.clear();
  records_.push_back(std::move(r));
}

void FlightRecorder::finish(uint64_t seq, bool ok, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->seq == seq && it->state == kStarted) {
      it->state.assign(ok ? kCompleted : kFailed);
      it->end_ms = epoch_ms();
      it->error = error;
      return;
    }
}

std::vector<OpRecord> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {records_.begin(), records_.end()};
}

OpRecord FlightRecorder::last() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (records_.empty()) {
    OpRecord r;
    r.seq = UINT64_MAX;
    return r;
  }
  return records_.back();
}

// ------------------------------------------------------------- /proc ---

PeerInfo self_info() {
  PeerInfo p;
  p.pid = ::getpid();
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0) p.host = name;
  char ns[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  // /proc of another process means something only on the same machine
  // (boot id) and in the same pid namespace.
  p.host_id = p.host + "/" + read_line("/proc/sys/kernel/random/boot_id") + "/" + (n > 0 ? std::string(ns, size_t(n)) : "");
  char state = 0;
  read_stat(p.pid, &state, &p.start);
  p.known = true;
  return p;
}

ProcState local_state(const PeerInfo& p) {
  static const PeerInfo me = self_info();
  if (!p.known || p.host_id != me.host_id) return ProcState::kUnknown;
  char state = 0;
  uint64_t start = 0;
  bool exiting = false;
  if (!read_stat(p.pid, &state, &start, &exiting)) return ProcState::kDead;
  if (p.start != 0 && start != p.start) return ProcState::kDead;  // the pid now belongs to another process
  if (state == 'Z' || state == 'X' || state == 'x' || exiting) return ProcState::kDead;
  if (state == 'T' || state == 't') return ProcState::kStopped;
  return ProcState::kRunning;
}

const char* proc_state_name(ProcState s) {
  switch (s) {
    case ProcState::kRunning: return "running";
    case ProcState::kStopped: return "stopped";
    case ProcState::kDead: return "dead";
    default: return "unknown";
  }
}

std::string diag_prefix(const std::string& comm) { return "strata/diag/" + comm + "/"; }

// ------------------------------------------------------------- Watcher ---

namespace {
constexpr int64_t kTickMs = 100;
constexpr int64_t kPollAfterMs = 200;  // a wait this long starts the incident polls
}  // namespace

Watcher::Watcher(sdk::Host host, DiagOptions opt, const FlightRecorder& recorder)
    : host_(std::move(host)), opt_(std::move(opt)), rec_(recorder), self_(self_info()),
      prefix_(diag_prefix(opt_.comm)) {
  // The first beat before any collective: a rank that dies in its first
  // collective is still found in /proc by the others.
  beat();
}

void Watcher::start() {
  learn_chief();
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

Watcher::~Watcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watcher::waiting(bool on) { waiting_since_ms_.store(on ? coarse_mono_ms() : 0); }

std::string Watcher::incident() const {
  std::lock_guard<std::mutex> lock(mu_);
  return incident_;
}

int32_t Watcher::frozen_rank(int64_t* silent_ms) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (silent_ms != nullptr) *silent_ms = frozen_for_ms_;
  return frozen_rank_;
}

int64_t Watcher::store_silent_ms() const {
  const int64_t first = first_unanswered_ms_.load();
  return first == 0 ? 0 : mono_ms() - first;
}

PeerInfo Watcher::peer(int32_t rank) const {
  if (rank == opt_.rank) return self_;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(rank);
  return it == peers_.end() ? PeerInfo{} : it->second;
}

void Watcher::remember(int32_t rank, const PeerInfo& p) {
  if (!p.known) return;
  std::lock_guard<std::mutex> lock(mu_);
  peers_[rank] = p;
}

void Watcher::run() {
  int64_t next_beat = mono_ms() + opt_.interval_ms, next_scan = 0, next_info = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(kTickMs), [this] { return stop_; })) return;
    }
    const int64_t now = mono_ms();
    if (now >= next_beat) {
      beat();
      next_beat = now + opt_.interval_ms;
    }
    const int64_t since = waiting_since_ms_.load();
    if (since != 0 && now - since >= kPollAfterMs) poll_incident();
    if (since != 0 && now - since >= opt_.interval_ms && now >= next_scan) {
      scan();
      next_scan = mono_ms() + opt_.interval_ms;
    }
    // Rank 0 serves the store: learn where it runs while the store still
    // answers, so that its death can be told from its freezing later.
    if (now >= next_info) {
      learn_chief();
      next_info = now + opt_.interval_ms;
    }
  }
}

void Watcher::learn_chief() {
  if (opt_.rank == 0 || peer(0).known) return;
  std::string v;
  Got g = Got::kDown;
  timed([&] {
    g = store_get(host_, prefix_ + "hb/0", 0, &v);
    return g != Got::kDown;
  });
  if (g == Got::kOk) remember(0, info_of(parse_or_null(v)));
}

void Watcher::beat() {
  const OpRecord last = rec_.last();
  json hb = info_json(self_);
  hb["beat"] = ++counter_;
  if (last.seq != UINT64_MAX) {
    hb["seq"] = last.seq;
    hb["op"] = last.op;
    hb["state"] = last.state;
  }
  timed([&] { return store_set(host_, prefix_ + "hb/" + std::to_string(opt_.rank), hb.dump(), opt_.interval_ms); });
}

template <class F>
bool Watcher::timed(F&& call) {
  // The store's silence counts from the first call it left unanswered,
  // whichever call that was.
  if (first_unanswered_ms_.load() == 0) first_unanswered_ms_.store(mono_ms());
  const bool answered = call();
  if (answered) {
    last_answer_ms_.store(mono_ms());
    first_unanswered_ms_.store(0);
  }
  return answered;
}

bool Watcher::poll_incident() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!incident_.empty()) return true;
  }
  std::string v;
  Got g = Got::kDown;
  timed([&] {
    g = store_get(host_, prefix_ + "incident", 0, &v);
    return g != Got::kDown;
  });
  if (g != Got::kOk) return false;
  std::lock_guard<std::mutex> lock(mu_);
  incident_ = v.empty() ? "(no reason given)" : v;
  return true;
}

void Watcher::scan() {
  const int64_t now = mono_ms();
  const bool stale_window = last_scan_ms_ == 0 || now - last_scan_ms_ > 3 * opt_.interval_ms;
  last_scan_ms_ = now;
  for (int32_t k = 0; k < opt_.world; ++k) {
    if (k == opt_.rank) continue;
    std::string v;
    Got g = Got::kDown;
    timed([&] {
      g = store_get(host_, prefix_ + "hb/" + std::to_string(k), 0, &v);
      return g != Got::kDown;
    });
    if (g == Got::kDown) return;
    int64_t value = -1;
    if (g == Got::kOk) {
      const json j = parse_or_null(v);
      remember(k, info_of(j));
      if (j.is_object()) value = j.value("beat", int64_t(-1));
    }
    std::lock_guard<std::mutex> lock(mu_);
    Beat& b = beats_[k];
    // After a gap in the scans (the collective thread was not waiting) the
    // window starts afresh: not having looked is not silence.
    if (b.changed_ms == 0 || b.value != value || stale_window) {
      b.value = value;
      b.changed_ms = now;
    } else if (now - b.changed_ms >= opt_.frozen_ms && frozen_rank_ < 0) {
      frozen_rank_ = k;
      frozen_for_ms_ = now - b.changed_ms;
    }
  }
}

// ------------------------------------------------------------ diagnose ---

namespace {

struct Evidence {
  const DiagOptions& opt;
  const Failure& f;
  std::map<int32_t, json> obs;        // published observations (alive ranks)
  std::map<int32_t, json> hb;         // last heartbeat read
  std::map<int32_t, PeerInfo> info;
  std::map<int32_t, ProcState> state;
  std::set<int32_t> beat_moved;       // heartbeat advanced during the diagnosis
  std::set<int32_t> lost;             // some rank lost its connection to them
  std::set<int32_t> frozen_reported;  // a watcher found their heartbeat stopped
  std::set<int32_t> silent;           // accounted for by nothing at the end
  bool store_down = false;
};

Verdict decide(const Evidence& e) {
  const int32_t n = e.opt.world;
  const std::string during = str_cat("#", e.f.seq, " ", e.f.op);
  Verdict v;
  auto hb_of = [&](int32_t k) { auto it = e.hb.find(k); return it == e.hb.end() ? json() : it->second; };
  auto info_of_rank = [&](int32_t k) { auto it = e.info.find(k); return it == e.info.end() ? PeerInfo{} : it->second; };
  auto state_of = [&](int32_t k) { auto it = e.state.find(k); return it == e.state.end() ? ProcState::kUnknown : it->second; };

  // 1. Different collectives: the mismatch report names both sides.
  for (const auto& [k, o] : e.obs)
    if (o.value("kind", std::string()) == "mismatch") {
      v.text = bare(o.value("message", std::string()));
      v.code = STRATA_ERR_INVALID_ARGUMENT;
      v.culprits = {k};
      if (int32_t p = o.value("peer", -1); p >= 0) v.culprits.push_back(p);
      std::sort(v.culprits.begin(), v.culprits.end());
      return v;
    }

  // 2. Dead processes.
  std::vector<int32_t> dead;
  for (int32_t k = 0; k < n; ++k) {
    if (e.obs.count(k)) continue;
    const ProcState s = state_of(k);
    if (s == ProcState::kDead || (s == ProcState::kUnknown && e.lost.count(k) && !e.beat_moved.count(k)))
      dead.push_back(k);
  }
  if (!dead.empty()) {
    std::string why;
    for (int32_t k : dead) {
      const PeerInfo p = info_of_rank(k);
      why += str_cat(why.empty() ? "" : "; ", "rank ", k,
                     state_of(k) == ProcState::kDead ? str_cat("'s process", where(p), " is gone")
                                                     : str_cat(where(p), " dropped its connections and never reported"),
                     doing(hb_of(k)).empty() ? "" : ", " + doing(hb_of(k)));
    }
    v.text = str_cat(rank_list(dead, n), dead.size() == 1 ? " died" : " died", " (", why,
                     "); the other ranks failed in ", during, " because of it");
    v.code = STRATA_ERR_UNAVAILABLE;
    v.culprits = dead;
    return v;
  }

  // 3. Frozen processes: stopped, or silent with a heartbeat that stopped.
  std::vector<int32_t> frozen;
  for (int32_t k = 0; k < n; ++k) {
    if (e.obs.count(k)) continue;
    if (state_of(k) == ProcState::kStopped || e.frozen_reported.count(k) || e.silent.count(k)) frozen.push_back(k);
  }
  if (!frozen.empty()) {
    std::string why;
    for (int32_t k : frozen) {
      const PeerInfo p = info_of_rank(k);
      std::string how = state_of(k) == ProcState::kStopped
                            ? str_cat("'s process", where(p), " is stopped (SIGSTOP, Ctrl-Z or a debugger)")
                        : e.frozen_reported.count(k)
                            ? str_cat(where(p), " stopped sending heartbeats for the heartbeat deadline of ",
                                      e.opt.frozen_ms / 1000.0, " s (/timeouts/heartbeat_s)")
                            : str_cat(where(p), " neither reported nor showed a heartbeat within ",
                                      e.opt.diagnose_ms / 1000.0, " s");
      why += str_cat(why.empty() ? "" : "; ", "rank ", k, how, doing(hb_of(k)).empty() ? "" : ", " + doing(hb_of(k)));
    }
    v.text = str_cat(rank_list(frozen, n), frozen.size() == 1 ? " is frozen" : " are frozen", " (", why,
                     "); the other ranks waited in ", during, " for it");
    v.code = STRATA_ERR_DEADLINE_EXCEEDED;
    v.culprits = frozen;
    return v;
  }

  // 4. Alive but not in the collective.
  std::vector<int32_t> late;
  for (int32_t k = 0; k < n; ++k)
    if (!e.obs.count(k)) late.push_back(k);
  if (!late.empty()) {
    std::string why;
    for (int32_t k : late)
      why += str_cat(why.empty() ? "" : "; ", "rank ", k, where(info_of_rank(k)), " is alive and ",
                     doing(hb_of(k)).empty() ? "has not reported" : doing(hb_of(k)));
    v.text = str_cat(rank_list(late, n), late.size() == 1 ? " did" : " did", " not join ", during,
                     " in time: a straggler or a process stuck outside collectives (", why, ")");
    v.code = STRATA_ERR_DEADLINE_EXCEEDED;
    v.culprits = late;
    return v;
  }

  // 5. Every rank reported: one whose failure had a local cause, else the
  // link between two live ranks.
  for (const auto& [k, o] : e.obs)
    if (o.value("kind", std::string()) == "error") {
      v.text = str_cat("rank ", k, " of ", n, " failed in ", during, ": ", bare(o.value("message", std::string())));
      v.code = static_cast<strata_status_t>(o.value("code", int(STRATA_ERR_INTERNAL)));
      v.culprits = {k};
      return v;
    }
  for (const auto& [k, o] : e.obs) {
    const std::string kind = o.value("kind", std::string());
    if (kind != "lost" && kind != "deadline") continue;
    const int32_t p = o.value("peer", -1);
    v.text = str_cat("every rank is alive and reported the failure of ", during,
                     "; the transport between rank ", k, " and rank ", p,
                     " failed (a network fault, or a deadline too short for this size): ",
                     bare(o.value("message", std::string())));
    v.code = static_cast<strata_status_t>(o.value("code", int(STRATA_ERR_UNAVAILABLE)));
    v.culprits = {std::min(k, p), std::max(k, p)};
    return v;
  }
  v.text = str_cat("every rank reported the failure of ", during, "; rank ", e.opt.rank, " saw: ", bare(e.f.message));
  v.code = e.f.code;
  return v;
}

// The store (in rank 0's process) is gone: every rank decides alone, from
// what it cached while the store answered, in words that do not depend on
// which rank decides.
Verdict decide_without_store(const DiagOptions& opt, const PeerInfo& chief) {
  ProcState s = local_state(chief);
  // A process that is exiting closes its sockets before /proc shows it gone,
  // so a store that just went away with its process still "running" is
  // watched a little longer before it is called unresponsive (seen once in
  // 220 fault-matrix runs: one survivor said "running", the others "died").
  for (int i = 0; i < 50 && s == ProcState::kRunning; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = local_state(chief);
  }
  Verdict v;
  v.culprits = {0};
  const std::string who = str_cat("rank 0 of ", opt.world, where(chief), ", which serves the rendezvous store,");
  // No sequence number or operation here: without the store the ranks cannot
  // agree on one (a ring's ranks fail one collective apart), and each rank's
  // own operation follows in its "[rank N saw: ...]" part.
  if (s == ProcState::kDead) {
    v.text = str_cat(who, " died (its process is gone); the other ranks failed because of it");
    v.code = STRATA_ERR_UNAVAILABLE;
  } else if (s == ProcState::kStopped) {
    v.text = str_cat(who, " is frozen (its process is stopped: SIGSTOP, Ctrl-Z or a debugger); the other ranks "
                     "waited for it");
    v.code = STRATA_ERR_DEADLINE_EXCEEDED;
  } else if (s == ProcState::kRunning) {
    v.text = str_cat(who, " is running but its store stopped answering (overloaded, or blocked in a call that "
                     "never returns); the other ranks failed because of it");
    v.code = STRATA_ERR_DEADLINE_EXCEEDED;
  } else {
    v.text = str_cat(who, " stopped answering: it died, froze, or its host became unreachable; the other ranks "
                     "failed because of it");
    v.code = STRATA_ERR_UNAVAILABLE;
  }
  return v;
}

// Every rank counts itself once it holds the verdict. Rank 0 serves the
// store from its process, so it stays until every rank that is not a
// culprit has read the verdict (or the diagnosis deadline passes): leaving
// earlier would take the store down under ranks still deciding.
void acknowledge(const sdk::Host& host, const DiagOptions& opt, const std::string& P, const Verdict& v,
                 int64_t deadline) {
  int64_t acks = 0;
  if (!store_add(host, P + "ack", 1, 2000, &acks) || opt.rank != 0) return;
  const int64_t expect = opt.world - int64_t(v.culprits.size());
  const int64_t until = std::max(deadline, mono_ms() + 1000);
  while (acks < expect && mono_ms() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!store_add(host, P + "ack", 0, 2000, &acks)) return;
  }
}

json verdict_json(const Verdict& v) { return {{"text", v.text}, {"code", int(v.code)}, {"culprits", v.culprits}}; }

bool verdict_from(const std::string& s, Verdict* v) {
  const json j = parse_or_null(s);
  if (!j.is_object() || !j.contains("text")) return false;
  v->text = j.value("text", std::string());
  v->code = static_cast<strata_status_t>(j.value("code", int(STRATA_ERR_INTERNAL)));
  v->culprits = j.value("culprits", std::vector<int32_t>{});
  return true;
}

}  // namespace

Verdict diagnose(const sdk::Host& host, const DiagOptions& opt, Watcher* watcher, const Failure& f,
                 const FlightRecorder& recorder) {
  const std::string P = diag_prefix(opt.comm);
  const int64_t start = mono_ms();
  const int64_t deadline = start + opt.diagnose_ms;
  // A rank that merely runs behind gets this long to report before it counts as a straggler.
  const int64_t settle_ms = std::min<int64_t>(opt.diagnose_ms, std::max<int64_t>(1500, opt.interval_ms + 500));
  Evidence e{opt, f, {}, {}, {}, {}, {}, {}, {}, {}, false};
  const PeerInfo me = self_info();
  json mine = {{"rank", opt.rank}, {"seq", f.seq},   {"op", f.op},           {"kind", f.kind},
               {"peer", f.peer},   {"code", int(f.code)}, {"message", f.message}, {"info", info_json(me)}};
  e.obs[opt.rank] = mine;
  if (f.kind == "lost" && f.peer >= 0) e.lost.insert(f.peer);
  if (f.kind == "frozen" && f.peer >= 0) e.frozen_reported.insert(f.peer);

  e.store_down = f.kind == "store" || (watcher != nullptr && watcher->store_silent_ms() > 2000);
  // The store lives in rank 0's process: when that process is known gone or
  // stopped on this host, asking the store would only wait for its client's
  // reconnect or answer deadline (seconds) to learn the same.
  if (!e.store_down && opt.rank != 0 && watcher != nullptr) {
    const ProcState chief = local_state(watcher->peer(0));
    e.store_down = chief == ProcState::kDead || chief == ProcState::kStopped;
  }
  if (!e.store_down) {
    e.store_down = !store_set(host, P + "obs/" + std::to_string(opt.rank), mine.dump(), 2000);
    std::string x;
    if (!e.store_down && store_get(host, P + "incident", 0, &x) == Got::kMissing)
      store_set(host, P + "incident", str_cat("rank ", opt.rank, " failed in #", f.seq, " ", f.op, ": ", bare(f.message)),
                2000);
  }
  std::map<int32_t, int64_t> first_beat;
  std::set<int32_t> unresolved;
  for (;;) {
    if (!e.store_down) {
      std::string vs;
      const Got g = store_get(host, P + "verdict", 0, &vs);
      Verdict adopted;
      if (g == Got::kOk && verdict_from(vs, &adopted)) {
        write_trace_file(host, opt, f, adopted, recorder);
        acknowledge(host, opt, P, adopted, deadline);
        return adopted;
      }
      e.store_down = g == Got::kDown;
    }
    const int64_t elapsed = mono_ms() - start;
    unresolved.clear();
    for (int32_t k = 0; k < opt.world; ++k) {
      if (e.obs.count(k)) continue;
      if (!e.store_down) {
        std::string o;
        const Got g = store_get(host, P + "obs/" + std::to_string(k), 0, &o);
        if (g == Got::kOk) {
          const json j = parse_or_null(o);
          if (j.is_object()) {
            e.obs[k] = j;
            const std::string kind = j.value("kind", std::string());
            const int32_t p = j.value("peer", -1);
            if (kind == "lost" && p >= 0) e.lost.insert(p);
            if (kind == "frozen" && p >= 0) e.frozen_reported.insert(p);
            continue;
          }
        }
        e.store_down = g == Got::kDown;
      }
      PeerInfo pi = watcher != nullptr ? watcher->peer(k) : PeerInfo{};
      if (!e.store_down) {
        std::string h;
        if (store_get(host, P + "hb/" + std::to_string(k), 0, &h) == Got::kOk) {
          const json j = parse_or_null(h);
          if (j.is_object()) {
            e.hb[k] = j;
            if (info_of(j).known) pi = info_of(j);
            const int64_t beat = j.value("beat", int64_t(-1));
            auto [it, fresh] = first_beat.emplace(k, beat);
            if (!fresh && it->second != beat) e.beat_moved.insert(k);
          }
        }
      }
      if (pi.known) {
        e.info[k] = pi;
        if (watcher != nullptr) watcher->remember(k, pi);
      }
      const ProcState s = local_state(pi);
      e.state[k] = s;
      if (s == ProcState::kDead || s == ProcState::kStopped) continue;
      if ((s == ProcState::kRunning || e.beat_moved.count(k)) && elapsed >= settle_ms) continue;
      unresolved.insert(k);
    }
    if (e.store_down || unresolved.empty()) break;
    if (elapsed >= settle_ms &&
        std::all_of(unresolved.begin(), unresolved.end(), [&](int32_t k) { return e.lost.count(k) > 0; }))
      break;
    if (mono_ms() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Rank 0 reported before the store went away: it finished its own
  // diagnosis and exited, so the evidence gathered so far decides.
  if (e.store_down && !e.obs.count(0)) {
    PeerInfo chief = watcher != nullptr ? watcher->peer(0) : PeerInfo{};
    if (opt.rank == 0) chief = me;
    const Verdict alone = decide_without_store(opt, chief);
    write_trace_file(host, opt, f, alone, recorder);
    return alone;
  }
  for (int32_t k : unresolved)
    if (!e.lost.count(k)) e.silent.insert(k);
  Verdict v = decide(e);
  if (e.store_down) {
    write_trace_file(host, opt, f, v, recorder);
    return v;
  }
  int64_t claim = 0;
  if (store_add(host, P + "claim", 1, 2000, &claim)) {
    if (claim == 1) {
      store_set(host, P + "verdict", verdict_json(v).dump(), 2000);
    } else {
      std::string vs;
      Verdict adopted;
      if (store_get(host, P + "verdict", 5000, &vs) == Got::kOk && verdict_from(vs, &adopted)) v = adopted;
    }
  }
  write_trace_file(host, opt, f, v, recorder);
  acknowledge(host, opt, P, v, deadline);
  return v;
}

void write_trace_file(const sdk::Host& host, const DiagOptions& opt, const Failure& f, const Verdict& v,
                      const FlightRecorder& recorder) {
  const char* dir = std::getenv("STRATA_TRACE_DIR");
  if (dir == nullptr || *dir == '\0') return;
  const PeerInfo me = self_info();
  json j = {{"rank", opt.rank},     {"world_size", opt.world}, {"communicator", opt.comm},
            {"host", me.host},      {"pid", me.pid},           {"verdict", v.text},
            {"culprits", v.culprits}, {"error", bare(f.message)}};
  j["collectives"] = json::array();
  for (const OpRecord& r : recorder.snapshot()) j["collectives"].push_back(to_json(r));
  const std::string path = str_cat(dir, "/rank-", opt.rank, ".json");
  const std::string tmp = str_cat(path, ".tmp.", me.pid);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out) {
      host.warn("ring: cannot write the trace file ", tmp, " (STRATA_TRACE_DIR): check that the directory exists "
                "and is writable");
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    host.warn("ring: cannot move the trace file into place at ", path);
    std::remove(tmp.c_str());
  }
}

}  // namespace strata::plugins::ring
