// SPDX-License-Identifier: Apache-2.0
// Reading the failure traces the ring cross-device ops write (header-only;
// shared by strata-info's `trace` command and strata-run's failure summary).
//
// When STRATA_TRACE_DIR is set, each rank whose collective failed writes
// $STRATA_TRACE_DIR/rank-<rank>.json (atomically, tmp + rename):
//
//   {"rank", "world_size", "communicator", "host", "pid",
//    "verdict": text ("" when the rank reached none), "culprits": [rank...],
//    "error": text,
//    "collectives": [{"seq", "op", "bytes", "state": "started"|"completed"|"failed",
//                     "start_ms", "end_ms" (0 while started), "error"}...]}   (oldest first)
//
// Readers are tolerant: unknown fields are ignored, a missing or mistyped
// optional field reads as empty/0, and a file that is not JSON or has no
// integer "rank" is skipped with a one-line warning instead of failing the
// whole read (a rank may have been killed while another tool looked).
//
// Nothing here blocks beyond reading local files; no state is shared, so any
// thread may call any function.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::trace {

struct Collective {
  int64_t seq = 0;
  std::string op;
  uint64_t bytes = 0;
  std::string state;  ///< "started", "completed", "failed" (others are shown as given)
  int64_t start_ms = 0;
  int64_t end_ms = 0;  ///< 0 while "started"
  std::string error;
};

struct RankTrace {
  std::string path;  ///< the file it was read from
  int rank = -1;
  int world_size = 0;
  std::string communicator;
  std::string host;
  int64_t pid = 0;
  std::string verdict;
  std::vector<int> culprits;
  std::string error;
  std::vector<Collective> collectives;
};

/// What read_trace_files() found: the readable traces sorted by rank, and one
/// warning line per file that was skipped (naming the file and why).
struct TraceSet {
  std::vector<RankTrace> ranks;
  std::vector<std::string> warnings;
};

/// True for "rank-<digits>.json" (not the writers' temporary files).
inline bool is_trace_file_name(const std::string& name) {
  constexpr const char* kPrefix = "rank-";
  constexpr const char* kSuffix = ".json";
  if (name.size() <= 5 + 5 || name.compare(0, 5, kPrefix) != 0 || name.compare(name.size() - 5, 5, kSuffix) != 0)
    return false;
  return std::all_of(name.begin() + 5, name.end() - 5, [](char c) { return c >= '0' && c <= '9'; });
}

/// The rank-*.json files in `dir`, sorted by name; empty when `dir` cannot be
/// listed (callers check the directory themselves when that is an error).
inline std::vector<std::filesystem::path> list_trace_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_trace_file_name(it->path().filename().string())) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace detail {

template <typename T>
T get_or(const nlohmann::json& obj, const char* key, T fallback) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->template get<std::string>() : fallback;
  } else {
    return it->is_number_integer() || it->is_number_unsigned() ? it->template get<T>() : fallback;
  }
}

}  // namespace detail

/// Parse one trace document. Throws std::runtime_error (text without the
/// file name) when it is not JSON, not an object, or has no integer "rank".
inline RankTrace parse_trace(const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!doc.is_object()) throw std::runtime_error("not a JSON object");
  auto rank_it = doc.find("rank");
  if (rank_it == doc.end() || !rank_it->is_number_integer() || rank_it->get<int64_t>() < 0 ||
      rank_it->get<int64_t>() > (int64_t{1} << 30))
    throw std::runtime_error("no non-negative integer \"rank\"");
  using detail::get_or;
  RankTrace t;
  t.rank = rank_it->get<int>();
  t.world_size = get_or<int>(doc, "world_size", 0);
  t.communicator = get_or<std::string>(doc, "communicator", "");
  t.host = get_or<std::string>(doc, "host", "");
  t.pid = get_or<int64_t>(doc, "pid", 0);
  t.verdict = get_or<std::string>(doc, "verdict", "");
  t.error = get_or<std::string>(doc, "error", "");
  if (auto it = doc.find("culprits"); it != doc.end() && it->is_array())
    for (const auto& c : *it)
      if (c.is_number_integer()) t.culprits.push_back(c.get<int>());
  if (auto it = doc.find("collectives"); it != doc.end() && it->is_array()) {
    for (const auto& c : *it) {
      if (!c.is_object() || !(c.contains("seq") && c["seq"].is_number_integer())) continue;
      Collective col;
      col.seq = c["seq"].get<int64_t>();
      col.op = get_or<std::string>(c, "op", "");
      col.bytes = get_or<uint64_t>(c, "bytes", 0);
      col.state = get_or<std::string>(c, "state", "");
      col.start_ms = get_or<int64_t>(c, "start_ms", 0);
      col.end_ms = get_or<int64_t>(c, "end_ms", 0);
      col.error = get_or<std::string>(c, "error", "");
      t.collectives.push_back(std::move(col));
    }
  }
  return t;
}

/// Read the given files; unreadable or unparsable ones become warnings.
inline TraceSet read_trace_files(const std::vector<std::filesystem::path>& files) {
  TraceSet set;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      set.warnings.push_back("skipping trace file " + f.string() + ": cannot open it (" +
                             std::error_code(errno, std::generic_category()).message() + ")");
      continue;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      RankTrace t = parse_trace(ss.str());
      t.path = f.string();
      set.ranks.push_back(std::move(t));
    } catch (const std::exception& e) {
      set.warnings.push_back("skipping trace file " + f.string() + ": " + e.what() +
                             "; it was not written by a Strata rank, or was cut short");
    }
  }
  std::stable_sort(set.ranks.begin(), set.ranks.end(),
                   [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  return set;
}

/// "rank 2" or "ranks 0, 1, 3".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return s;
}

/// Identical non-empty verdicts grouped with the ranks that reached them,
/// the most widely agreed first (ties: lowest rank first).
inline std::vector<std::pair<std::string, std::vector<int>>> group_verdicts(const std::vector<RankTrace>& ranks) {
  std::map<std::string, std::vector<int>> by_text;
  for (const auto& r : ranks)
    if (!r.verdict.empty()) by_text[r.verdict].push_back(r.rank);
  std::vector<std::pair<std::string, std::vector<int>>> out(by_text.begin(), by_text.end());
  for (auto& g : out) std::sort(g.second.begin(), g.second.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.second.front() < b.second.front();
  });
  return out;
}

/// "verdict (ranks 0, 1, 3 agree): TEXT", or "verdict (rank 0): TEXT".
inline std::string verdict_line(const std::string& text, const std::vector<int>& ranks) {
  return "verdict (" + rank_list(ranks) + (ranks.size() > 1 ? " agree" : "") + "): " + text;
}

/// The verdict lines strata-run prints (without its prefix): one
/// verdict_line() per group, then "no verdict from ranks 2, 4 (...)" for
/// ranks that reached none.
inline std::vector<std::string> verdict_lines(const std::vector<RankTrace>& ranks) {
  std::vector<std::string> out;
  for (const auto& [text, who] : group_verdicts(ranks)) out.push_back(verdict_line(text, who));
  std::vector<int> none;
  for (const auto& r : ranks)
    if (r.verdict.empty()) none.push_back(r.rank);
  if (!none.empty())
    out.push_back("no verdict from " + rank_list(none) +
                  " (no agreement was reached in time; each trace file still holds that rank's own error)");
  return out;
}

}  // namespace strata::trace
