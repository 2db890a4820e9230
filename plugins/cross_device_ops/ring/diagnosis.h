// SPDX-License-Identifier: Apache-2.0
// Culprit analysis for the ring: when a collective fails, every surviving
// rank names the same true cause, in the same words.
//
// Pieces:
// - FlightRecorder: the last kTraceLength collectives of this rank
//   (sequence, op, bytes, state, wall-clock times, error).
// - Watcher: a thread of this process that writes a heartbeat record to the
//   store every interval ("strata/diag/<comm>/hb/<rank>": beat counter, pid,
//   host identity, the collective it is in) and, only while the collective
//   thread has been waiting for a while, polls the incident key and the
//   other ranks' heartbeats. It never touches the communicator: it sets
//   flags that the waiting thread reads between wait slices (an incident
//   posted by another rank, a rank whose heartbeat stopped, a store that
//   stopped answering).
// - diagnose(): run by each rank whose collective failed. It publishes this
//   rank's observation ("obs/<rank>") and the incident, then gathers the
//   others' observations, heartbeats and, for ranks on this host, their
//   process state from /proc (gone, zombie, stopped), until every rank is
//   accounted for or the diagnosis deadline passes. The first rank to finish
//   claims the verdict ("verdict", first store_add wins) and every other
//   rank adopts it, so all print the same text. When the store itself is
//   gone (it lives in rank 0's process), each rank decides alone from what
//   it cached, which for that case (rank 0 dead or frozen) gives the same
//   words everywhere too.
//
// Verdicts, most specific first: ranks that called different collectives;
// ranks that died (process gone); ranks that are frozen (process stopped,
// or no heartbeat for the heartbeat deadline); ranks alive but not in the
// collective (stragglers, with the operation they are in); a rank whose own
// collective failed for a local reason; otherwise a transport fault
// between live ranks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/c/strata.h"
#include "strata/sdk/host.hpp"

namespace strata::plugins::ring {

constexpr size_t kTraceLength = 32;

/// One collective of this rank. Times are Unix epoch milliseconds.
struct OpRecord {
  uint64_t seq = 0;
  std::string op;  // describe(): "all_reduce(SUM, float32 x 1000)"
  uint64_t bytes = 0;
  std::string state;  // "started", "completed", "failed"
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  std::string error;
};

nlohmann::json to_json(const OpRecord& r);

/// Thread-safe ring of the last kTraceLength collectives.
class FlightRecorder {
 public:
  /// Reuses the oldest record's storage once kTraceLength are kept, so a
  /// warm recorder allocates nothing per collective.
  void start(uint64_t seq, const std::string& op, uint64_t bytes);
  void finish(uint64_t seq, bool ok, const std::string& error);
  std::vector<OpRecord> snapshot() const;
  /// The newest record (seq = UINT64_MAX when there is none).
  OpRecord last() const;

 private:
  mutable std::mutex mu_;
  std::deque<OpRecord> records_;
};

/// Where a rank's process lives, from its heartbeat record.
struct PeerInfo {
  bool known = false;
  int64_t pid = 0;
  std::string host;      // hostname, for messages
  std::string host_id;   // hostname + boot id + pid namespace: /proc is meaningful when equal
  uint64_t start = 0;    // process start time (clock ticks since boot), guards against pid reuse
};

enum class ProcState { kUnknown, kRunning, kStopped, kDead };

/// This process's identity (pid, host, host_id, start).
PeerInfo self_info();
/// The state of `p`'s process when it runs on this host (same host_id),
/// else kUnknown. Never blocks.
ProcState local_state(const PeerInfo& p);
const char* proc_state_name(ProcState s);

struct DiagOptions {
  std::string comm;      // communicator name
  int32_t rank = 0;
  int32_t world = 1;
  int64_t interval_ms = 1000;   // heartbeat period
  int64_t frozen_ms = 30000;    // no heartbeat for this long: frozen
  int64_t diagnose_ms = 5000;   // how long a failed rank gathers evidence
};

/// "strata/diag/<comm>/"
std::string diag_prefix(const std::string& comm);

/// The heartbeat thread (see the file comment). Starts in the constructor,
/// stops (and joins) in the destructor, which waits at most for one store
/// call in flight.
class Watcher {
 public:
  Watcher(sdk::Host host, DiagOptions opt, const FlightRecorder& recorder);
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  /// The collective thread calls these around every blocking wait; while a
  /// wait lasts, the watcher polls the incident key and the heartbeats.
  void waiting(bool on);

  /// What the watcher found; read by the collective thread between wait
  /// slices. Empty / -1 when nothing.
  std::string incident() const;
  int32_t frozen_rank(int64_t* silent_ms) const;
  /// Milliseconds since the store last answered one of the watcher's calls
  /// while calls were being made (0 while it answers).
  int64_t store_silent_ms() const;
  /// The cached heartbeat info of `rank` (known = false when never read).
  PeerInfo peer(int32_t rank) const;
  /// Record what diagnose() read so later lookups (when the store is gone)
  /// still find it.
  void remember(int32_t rank, const PeerInfo& p);
  /// Reads rank 0's first heartbeat (where the store's process runs) unless
  /// it is known, then starts the watcher thread. The constructor writes
  /// this rank's first beat; the ring builds the watcher before its setup
  /// gate and starts it once every rank has passed the gate, so every first
  /// beat is in the store by then: a chief that dies or stops in the first
  /// collective is told dead or stopped, not only "silent".
  void start();

 private:
  void run();
  void learn_chief();
  void beat();
  void scan();
  bool poll_incident();
  template <class F>
  bool timed(F&& call);

  sdk::Host host_;
  DiagOptions opt_;
  const FlightRecorder& rec_;
  PeerInfo self_;
  std::string prefix_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int64_t> waiting_since_ms_{0};  // steady clock; 0 = not waiting
  std::string incident_;
  int32_t frozen_rank_ = -1;
  int64_t frozen_for_ms_ = 0;
  std::atomic<int64_t> last_answer_ms_{0};
  std::atomic<int64_t> first_unanswered_ms_{0};
  std::map<int32_t, PeerInfo> peers_;
  struct Beat {
    int64_t value = -1;
    int64_t changed_ms = 0;
  };
  std::map<int32_t, Beat> beats_;
  uint64_t counter_ = 0;
  int64_t last_scan_ms_ = 0;  // watcher thread only
  std::thread thread_;
};

/// What this rank saw when its collective failed.
struct Failure {
  uint64_t seq = 0;
  std::string op;          // describe() of the collective
  std::string kind;        // "lost", "deadline", "mismatch", "frozen", "store", "incident", "error"
  int32_t peer = -1;       // the rank involved, when known
  strata_status_t code = STRATA_ERR_INTERNAL;
  std::string message;     // this rank's own error text
};

struct Verdict {
  std::string text;                 // the same on every rank
  strata_status_t code = STRATA_ERR_INTERNAL;
  std::vector<int32_t> culprits;
};

/// Gather the evidence and agree on a verdict (see the file comment), and
/// write the trace file as soon as it is known (before rank 0 waits for the
/// others to read it: a launcher may stop the job any moment now). Blocks
/// for at most about opt.diagnose_ms plus one store call.
Verdict diagnose(const sdk::Host& host, const DiagOptions& opt, Watcher* watcher, const Failure& f,
                 const FlightRecorder& recorder);

/// Write the trace file `$STRATA_TRACE_DIR/rank-<rank>.json` (atomically)
/// when the variable is set; failures are logged, never thrown.
void write_trace_file(const sdk::Host& host, const DiagOptions& opt, const Failure& f, const Verdict& v,
                      const FlightRecorder& recorder);

}  // namespace strata::plugins::ring
