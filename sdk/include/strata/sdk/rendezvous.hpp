// SPDX-License-Identifier: Apache-2.0
// The rendezvous gate a component passes before it builds a communicator:
// every rank checks in through the host store, and all wait until every rank
// has, within the job's rendezvous deadline (/timeouts/rendezvous_s). While
// waiting, rank 0 logs which ranks are missing every few seconds; at the
// deadline every waiting rank fails naming them, and naming any process the
// rendezvous store refused (a wrong STRATA_AUTH_TOKEN), since that is the
// usual reason a started worker never checks in.
// Header-only; a plugin using it links nlohmann_json::nlohmann_json.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "strata/error.hpp"
#include "strata/sdk/host.hpp"
#include "strata/sdk/options.hpp"

namespace strata::sdk {

/// The store key under which the rendezvous store lists the connections it
/// refused ("address: reason" lines, newest last, at most a few dozen). The
/// store sets it (empty) when it starts, so reading it never waits.
inline const char* refused_connections_key() { return "strata/store/refused"; }

/// The deadline for building a communicator, in seconds: the option
/// `option` when given (> 0), else the job config's /timeouts/rendezvous_s
/// when positive, else 120. Not the collective deadline: workers may start
/// minutes apart, while a started collective should finish quickly.
inline double rendezvous_timeout_s(const Host& host, const nlohmann::json& options, const std::string& component,
                                   const char* option = "setup_timeout_s") {
  double fallback = 120;
  if (host && host.api()->get_config != nullptr) {
    if (auto t = host.get_config("/timeouts/rendezvous_s")) {
      const nlohmann::json j = nlohmann::json::parse(*t, nullptr, false);
      if (j.is_number() && j.get<double>() > 0) fallback = j.get<double>();
    }
  }
  const double v = get_option<double>(options, option, fallback, component);
  if (!(v > 0)) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", option, "' of ", component, " must be > 0, got ", v);
  return v;
}

/// What the rendezvous store refused so far, as "; the rendezvous store
/// refused ..." text to append to an error, or "" when nothing was refused
/// (or the store cannot say: it never blocks for long).
inline std::string refused_connections_text(const Host& host) {
  try {
    const std::string lines = host.store_get(refused_connections_key(), 0);
    if (lines.empty()) return "";
    std::string list;
    size_t n = 0, pos = 0;
    while (pos < lines.size()) {
      size_t end = lines.find('\n', pos);
      if (end == std::string::npos) end = lines.size();
      if (end > pos) list += (n++ == 0 ? "" : "; ") + lines.substr(pos, end - pos);
      pos = end + 1;
    }
    return ::strata::detail::str_cat("; meanwhile the rendezvous store refused ", n, " connection(s): ", list,
                                     " (a worker started with another STRATA_AUTH_TOKEN, or a stranger)");
  } catch (const Error&) {
    return "";
  }
}

/// The ranks other than `self` whose key `key_of(r)` is not in the store
/// yet, as "rank 3" or "ranks 2, 3" ("" when none). Looks without waiting
/// (one store_get per rank): for error messages, not for hot paths.
template <class KeyOf>
std::string missing_ranks(const Host& host, int world, int self, KeyOf key_of) {
  std::string m;
  int n = 0;
  for (int r = 0; r < world; ++r) {
    if (r == self) continue;
    try {
      host.store_get(key_of(r), 0);
    } catch (const Error& e) {
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
      m += (n++ == 0 ? "" : ", ") + std::to_string(r);
    }
  }
  return m.empty() ? m : (n == 1 ? "rank " : "ranks ") + m;
}

/// Check in as `rank` of `world` under `name` and wait for every other rank
/// to do the same, for at most `timeout_ms`. Rank 0 logs the missing ranks
/// every `report_every_ms`. Throws DEADLINE_EXCEEDED naming the missing
/// ranks (and refused connections); store errors propagate. Blocks the
/// calling thread; uses only the store.
inline void rendezvous_gate(const Host& host, const std::string& name, int rank, int world, int64_t timeout_ms,
                            const std::string& who, int64_t report_every_ms = 5000) {
  if (world <= 1) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // Rank 0 usually serves the store: it gives up a moment after the others,
  // so they read the same verdict from the store instead of losing it.
  const auto deadline = start + std::chrono::milliseconds(timeout_ms + (rank == 0 ? 1000 : 0));
  auto key = [&](int r) { return ::strata::detail::str_cat(name, "/joined/", r); };
  // Each rank leaves its own key (to name the missing ones) and counts
  // itself in; the rank that completes the count opens the gate, so every
  // rank waits on one key and the store does O(world) work per gate, not
  // world x world key checks.
  host.store_set(key(rank), "1", timeout_ms);
  const std::string open_key = ::strata::detail::str_cat(name, "/joined/all");
  if (host.store_add(::strata::detail::str_cat(name, "/joined/count"), 1, timeout_ms) == world)
    host.store_set(open_key, "1", timeout_ms);
  const std::vector<std::string> keys{open_key};
  // Who is missing costs one store request per rank. Only rank 0 looks
  // (every report_every_ms, for its log) and leaves the answer under
  // "<name>/joined/missing" ("-" for nobody); the others read that one key
  // and, at their deadline, check just the ranks it names (ranks never
  // leave, so that is exact). If every waiting rank listed them itself, a
  // gate whose last rank starts late would send world x world requests to
  // the store every few seconds (1,024 ranks: a million each 5 s).
  const std::string missing_key = ::strata::detail::str_cat(name, "/joined/missing");
  auto rank0_list = [&]() -> std::string {
    try {
      return host.store_get(missing_key, 0);
    } catch (const Error& e) {
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
      return "";  // not written yet
    }
  };
  auto missing = [&] {
    if (rank == 0) {
      std::string m = missing_ranks(host, world, rank, key);
      host.store_set(missing_key, m.empty() ? std::string("-") : m, timeout_ms);
      return m;
    }
    const std::string listed = rank0_list();
    if (listed.empty()) return missing_ranks(host, world, rank, key);  // rank 0 has not looked (yet)
    std::string m;
    int n = 0;
    for (size_t i = 0; i < listed.size();) {
      if (listed[i] < '0' || listed[i] > '9') {
        ++i;
        continue;
      }
      const int r = std::atoi(listed.c_str() + i);
      while (i < listed.size() && listed[i] >= '0' && listed[i] <= '9') ++i;
      if (r == rank) continue;
      try {
        host.store_get(key(r), 0);
      } catch (const Error& e) {
        if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
        m += (n++ == 0 ? "" : ", ") + std::to_string(r);
      }
    }
    return m.empty() ? m : (n == 1 ? "rank " : "ranks ") + m;
  };
  std::string last_missing;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    try {
      host.store_wait(keys, std::max<int64_t>(0, std::min<int64_t>(left, report_every_ms)));
      return;
    } catch (const Error& e) {
      if (e.code() == STRATA_ERR_UNAVAILABLE && !last_missing.empty())
        STRATA_THROW(STRATA_ERR_UNAVAILABLE, who, ": ", last_missing, " of ", world,
                     " had not joined communicator '", name,
                     "' when the rendezvous store went away (the chief, which serves it, gives up at its "
                     "rendezvous deadline); start every worker the cluster spec lists (check their logs): ",
                     e.what());
      if (e.code() != STRATA_ERR_DEADLINE_EXCEEDED) throw;
    }
    if (rank != 0 && Clock::now() < deadline) {
      // One request: rank 0's latest list, for the message should the store go away.
      const std::string listed = rank0_list();
      if (!listed.empty() && listed != "-") last_missing = listed;
      continue;
    }
    const std::string m = missing();
    last_missing = m;
    if (m.empty()) return;  // everyone arrived just as the slice ended
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (Clock::now() >= deadline)
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, who, ": ", m, " of ", world, " never joined communicator '",
                   name, "' within the rendezvous deadline of ", timeout_ms / 1000.0,
                   " s (/timeouts/rendezvous_s)", refused_connections_text(host),
                   "; start every worker the cluster spec lists (check their logs), or raise "
                   "/timeouts/rendezvous_s if they start late");
    if (rank == 0)
      host.warn(who, ": waiting for ", m, " of ", world, " to join communicator '", name, "' (",
                static_cast<int64_t>(waited), " s of ", timeout_ms / 1000.0, " s)", refused_connections_text(host));
  }
}

}  // namespace strata::sdk
