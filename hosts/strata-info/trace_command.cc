// SPDX-License-Identifier: Apache-2.0
#include "trace_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "strata/c/strata.h"
#include "strata/error.hpp"
#include "trace_file.h"

namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kWhereFilesComeFrom =
    "; trace files (rank-<rank>.json) are written only when a collective fails while STRATA_TRACE_DIR is set "
    "(strata-run sets it and prints the directory in its failure summary)";

std::string duration_text(int64_t ms) {
  char buf[32];
  if (ms < 1000) std::snprintf(buf, sizeof buf, "%lld ms", static_cast<long long>(ms < 0 ? 0 : ms));
  else if (ms < 100000) std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  else std::snprintf(buf, sizeof buf, "%.0f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

// Short enough that 8 rank columns and the op fit in about 160 columns.
std::string state_cell(const ojson& rec) {
  const std::string state = rec["state"].get<std::string>();
  const int64_t start = rec["start_ms"].get<int64_t>(), end = rec["end_ms"].get<int64_t>();
  const bool timed = start > 0 && end >= start;
  if (state == "completed") return timed ? "done " + duration_text(end - start) : "done";
  if (state == "failed") return timed ? "FAILED " + duration_text(end - start) : "FAILED";
  return state.empty() ? "?" : state;
}

}  // namespace

CLI::App* add_trace_command(CLI::App& app, TraceArgs& args) {
  CLI::App* sub = app.add_subcommand(
      "trace",
      "show the failure traces of a job side by side: the verdict the ranks agreed on, each rank's\n"
      "host, pid and error, and the last collectives of every rank (one row per sequence number,\n"
      "one column per rank; a row where ranks called different ops is marked \"<-- differs\").\n"
      "Each rank whose collective fails writes DIR/rank-<rank>.json when STRATA_TRACE_DIR=DIR is set;\n"
      "strata-run sets it and prints the directory when a job fails.\n"
      "Example: strata-info trace /tmp/strata-run-4242");
  sub->add_option("dir", args.dir, "the trace directory (STRATA_TRACE_DIR of the job)")->required();
  sub->add_flag("--json", args.json, "print the merged traces as one JSON document instead of text");
  return sub;
}

ojson read_trace(const std::string& dir, std::ostream& warn) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "trace directory '", dir, "' does not exist or is not a directory",
                 kWhereFilesComeFrom);
  const auto files = strata::trace::list_trace_files(dir);
  if (files.empty())
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "trace directory '", dir, "' holds no rank-*.json file", kWhereFilesComeFrom);
  const strata::trace::TraceSet set = strata::trace::read_trace_files(files);
  for (const auto& w : set.warnings) warn << "strata-info: " << w << "\n";
  if (set.ranks.empty())
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "none of the ", files.size(), " rank-*.json file(s) in trace directory '", dir,
                 "' could be read (see the warnings above); they are not Strata trace files");

  ojson doc;
  doc["dir"] = std::filesystem::absolute(dir, ec).lexically_normal().string();
  std::set<std::string> comms;
  int world = 0;
  for (const auto& r : set.ranks) {
    if (!r.communicator.empty()) comms.insert(r.communicator);
    world = std::max(world, r.world_size);
  }
  doc["communicators"] = ojson(std::vector<std::string>(comms.begin(), comms.end()));
  doc["world_size"] = world;
  ojson verdicts = ojson::array();
  for (const auto& [text, who] : strata::trace::group_verdicts(set.ranks))
    verdicts.push_back({{"verdict", text}, {"ranks", who}});
  doc["verdicts"] = verdicts;
  doc["skipped"] = set.warnings;

  ojson ranks = ojson::array();
  std::set<int> have;
  for (const auto& r : set.ranks) {
    have.insert(r.rank);
    ranks.push_back({{"rank", r.rank},
                     {"file", r.path},
                     {"host", r.host},
                     {"pid", r.pid},
                     {"communicator", r.communicator},
                     {"verdict", r.verdict},
                     {"culprits", r.culprits},
                     {"error", r.error}});
  }
  doc["ranks"] = ranks;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (have.count(r) == 0) missing.push_back(r);
  doc["missing_ranks"] = missing;

  // seq -> the records of the ranks that have one, in rank order.
  std::map<int64_t, ojson> rows;
  for (const auto& r : set.ranks)
    for (const auto& c : r.collectives) {
      ojson& row = rows[c.seq];
      if (row.is_null()) row = ojson::array();
      row.push_back({{"rank", r.rank},
                     {"op", c.op},
                     {"bytes", c.bytes},
                     {"state", c.state},
                     {"start_ms", c.start_ms},
                     {"end_ms", c.end_ms},
                     {"error", c.error}});
    }
  ojson collectives = ojson::array();
  for (auto& [seq, recs] : rows) {
    std::set<std::string> ops;
    for (const auto& rec : recs) ops.insert(rec["op"].get<std::string>());
    const bool differs = ops.size() > 1;
    collectives.push_back({{"seq", seq},
                           {"op", differs ? ojson() : ojson(*ops.begin())},
                           {"differs", differs},
                           {"ranks", std::move(recs)}});
  }
  doc["collectives"] = collectives;
  return doc;
}

void print_trace(const ojson& doc, std::ostream& out) {
  std::string comm;
  for (const auto& c : doc["communicators"]) comm += (comm.empty() ? "" : ", ") + ("'" + c.get<std::string>() + "'");
  std::vector<int> ranks;
  for (const auto& r : doc["ranks"]) ranks.push_back(r["rank"].get<int>());
  out << "Traces in " << doc["dir"].get<std::string>() << ": " << strata::trace::rank_list(ranks);
  if (doc["world_size"].get<int>() > 0) out << " of " << doc["world_size"].get<int>();
  if (!comm.empty()) out << ", communicator " << comm;
  out << "\n";
  if (!doc["missing_ranks"].empty())
    out << "No trace from " << strata::trace::rank_list(doc["missing_ranks"].get<std::vector<int>>())
        << " (a rank that was killed or frozen writes none)\n";

  out << "\n";
  if (doc["verdicts"].empty()) out << "No verdict: no rank reached one in time.\n";
  for (const auto& v : doc["verdicts"]) {
    std::string line = strata::trace::verdict_line(v["verdict"].get<std::string>(), v["ranks"].get<std::vector<int>>());
    line[0] = 'V';
    out << line << "\n";
  }

  out << "\nRanks:\n";
  for (const auto& r : doc["ranks"]) {
    out << "  rank " << std::left << std::setw(3) << r["rank"].get<int>() << " "
        << (r["host"].get<std::string>().empty() ? "?" : r["host"].get<std::string>()) << ", pid "
        << r["pid"].get<int64_t>();
    if (doc["communicators"].size() > 1) out << ", communicator '" << r["communicator"].get<std::string>() << "'";
    if (r["verdict"].get<std::string>().empty()) out << ", no verdict";
    out << ": " << (r["error"].get<std::string>().empty() ? "(no error recorded)" : r["error"].get<std::string>())
        << "\n";
  }

  out << "\nCollectives (oldest first; done/FAILED with the time taken, started = still running when the trace\n"
         "was written, - = no record):\n";
  if (doc["collectives"].empty()) {
    out << "  (no rank recorded any)\n";
    return;
  }
  // Cells first, so each column is as wide as its widest cell.
  std::vector<std::vector<std::string>> cells;
  std::vector<std::size_t> width(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) width[i] = ("rank " + std::to_string(ranks[i])).size();
  std::size_t seq_width = 3;
  for (const auto& row : doc["collectives"]) {
    std::vector<std::string> line(ranks.size(), "-");
    for (const auto& rec : row["ranks"]) {
      const auto pos = std::find(ranks.begin(), ranks.end(), rec["rank"].get<int>()) - ranks.begin();
      line[static_cast<std::size_t>(pos)] = state_cell(rec);
    }
    for (std::size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
    seq_width = std::max(seq_width, std::to_string(row["seq"].get<int64_t>()).size());
    cells.push_back(std::move(line));
  }
  out << "  " << std::right << std::setw(static_cast<int>(seq_width)) << "seq";
  for (std::size_t i = 0; i < ranks.size(); ++i)
    out << "  " << std::left << std::setw(static_cast<int>(width[i])) << "rank " + std::to_string(ranks[i]);
  out << "  op\n";
  std::size_t k = 0;
  for (const auto& row : doc["collectives"]) {
    out << "  " << std::right << std::setw(static_cast<int>(seq_width)) << row["seq"].get<int64_t>();
    for (std::size_t i = 0; i < ranks.size(); ++i)
      out << "  " << std::left << std::setw(static_cast<int>(width[i])) << cells[k][i];
    if (!row["differs"].get<bool>()) {
      out << "  " << row["op"].get<std::string>() << "\n";
    } else {
      // Ranks grouped by the op they called, so the disagreement reads at once.
      std::map<std::string, std::vector<int>> by_op;
      for (const auto& rec : row["ranks"]) by_op[rec["op"].get<std::string>()].push_back(rec["rank"].get<int>());
      std::string text;
      for (const auto& [op, who] : by_op)
        text += (text.empty() ? "" : "; ") + strata::trace::rank_list(who) + ": " + (op.empty() ? "?" : op);
      out << "  " << text << "  <-- differs\n";
    }
    ++k;
  }
}
