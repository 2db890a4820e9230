// SPDX-License-Identifier: Apache-2.0
// `strata-info trace DIR [--json]`: the failure traces of one job side by
// side (the files are described in trace_file.h; the ring writes them into
// STRATA_TRACE_DIR when a collective fails, and strata-run sets that).
//
// Text: the verdict(s), identical ones grouped with the ranks that agree;
// one line per rank (host, pid, its own error); then one row per collective
// sequence number (the union over ranks, ascending) with one column per rank
// holding its state ("done 2 ms", "FAILED 0.4 s", "started", "-" for no
// record) and the op text last, once when every rank agrees and per rank
// otherwise, such a row marked "<-- differs".
//
// The document (--json):
//   {"dir", "communicators": [...], "world_size" (0 when unknown),
//    "verdicts": [{"verdict", "ranks": [...]}], "skipped": [warning...],
//    "ranks": [{"rank", "file", "host", "pid", "communicator", "verdict", "culprits", "error"}],
//    "missing_ranks": [ranks below world_size without a file],
//    "collectives": [{"seq", "op" (null when ranks differ), "differs",
//                     "ranks": [{"rank", "op", "bytes", "state", "start_ms", "end_ms", "error"}]}]}
//
// Files that cannot be read are skipped with a warning on stderr. Reads
// local files only; never blocks otherwise.
#pragma once

#include <ostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

struct TraceArgs {
  std::string dir;
  bool json = false;
};

/// Register the `trace` subcommand on `app`, filling `args`.
CLI::App* add_trace_command(CLI::App& app, TraceArgs& args);

/// Read DIR and build the document above; warnings for skipped files go to
/// `warn`. Throws strata::Error (NOT_FOUND) naming DIR when it is missing,
/// holds no rank-*.json, or none of them can be read.
nlohmann::ordered_json read_trace(const std::string& dir, std::ostream& warn);

/// The document as text for people.
void print_trace(const nlohmann::ordered_json& doc, std::ostream& out);
