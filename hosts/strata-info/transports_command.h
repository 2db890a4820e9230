// SPDX-License-Identifier: Apache-2.0
// `strata-info transports [--json]`: what each transport plugin can use on
// this machine, and what "auto" would choose.
//
// The document (--json prints it; the default prints the same as text):
//   {"transports": [{"name", "path", "status": "usable"|"unusable"|"rejected",
//                    "caps": {"flags": [...], "max_inflight", "max_message_bytes",
//                             "preferred_chunk_bytes"} | null,
//                    "error": text | null}, ...],
//    "interfaces": [{"name", "family", "address", "up", "loopback"}, ...],
//    "libfabric": {"library": "libfabric.so.1 1.17" | null, "error": text | null,
//                  "providers": [{"name", "fabric", "domain", "class": "nic"|"same-host"|"software",
//                                 "caps": [...], "mode": [...], "mr_mode": [...], "max_msg_size" (bytes or "unlimited"),
//                                 "plugin": "usable" | "<why the libfabric transport refuses it>"}]},
//    "auto": {"same_host": {"transport", "options", "reason"},
//             "network": {"transport", "options", "reason"}}}
//
// Transports are created with their default options (and the libfabric
// transport once per provider found) and released at once; nothing connects
// anywhere. libfabric is opened with dlopen, so the command also works (and
// says so) on a machine without it.
#pragma once

#include <ostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"

struct TransportsArgs {
  bool json = false;
};

/// Register the `transports` subcommand on `app`, filling `args`.
CLI::App* add_transports_command(CLI::App& app, TransportsArgs& args);

/// Build the document above. Never throws for a transport that cannot run
/// here (that is part of the report); throws strata::Error for host failures.
nlohmann::ordered_json describe_transports(strata::PluginHost& host);

/// The document as text for people.
void print_transports(const nlohmann::ordered_json& doc, std::ostream& out);
