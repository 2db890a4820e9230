// SPDX-License-Identifier: Apache-2.0
// strata-info: list every plugin the host finds, with its status or the
// reason it was rejected. Exit status: 0 when the listing could be made
// (rejected auto-discovered plugins are part of the listing), 1 when the
// config is invalid or names a plugin path that cannot be used, 2 on bad
// command-line usage.
//
// `strata-info cluster` prints the cluster this process would join as one
// JSON object (see cluster_command.h); it exits 1 when the resolver fails.
// `strata-info transports` reports what each transport can use on this
// machine and what "auto" chooses (see transports_command.h).
// `strata-info trace DIR` shows a failed job's traces side by side (see
// trace_command.h); it loads no plugin and exits 1 when DIR holds no trace.
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cluster_command.h"
#include "trace_command.h"
#include "transports_command.h"
#include "strata/config.hpp"
#include "strata/plugin_host.hpp"

namespace {

void print_table(const std::vector<strata::PluginInfo>& infos, const std::vector<std::string>& dirs) {
  std::cout << "Search directories (in order):\n";
  if (dirs.empty()) std::cout << "  (none)\n";
  for (const auto& d : dirs) std::cout << "  " << d << "\n";
  std::cout << "\n";
  std::size_t wk = 4, wn = 4, wv = 7;
  for (const auto& i : infos) {
    wk = std::max(wk, i.kind.size());
    wn = std::max(wn, i.name.size());
    wv = std::max(wv, i.version.size());
  }
  auto row = [&](const std::string& st, const std::string& k, const std::string& n, const std::string& v,
                 const std::string& abi, const std::string& path) {
    std::cout << std::left << std::setw(9) << st << std::setw(static_cast<int>(wk) + 2) << k
              << std::setw(static_cast<int>(wn) + 2) << n << std::setw(static_cast<int>(wv) + 2) << v
              << std::setw(6) << abi << path << "\n";
  };
  row("STATUS", "KIND", "NAME", "VERSION", "ABI", "PATH");
  std::size_t rejected = 0;
  for (const auto& i : infos) {
    row(i.ok ? "ok" : "rejected", i.kind.empty() ? "-" : i.kind, i.name.empty() ? "-" : i.name,
        i.version.empty() ? "-" : i.version, i.abi.empty() ? "-" : i.abi, i.path);
    if (!i.ok) {
      ++rejected;
      std::cout << "         reason: " << i.error << "\n";
    }
  }
  std::cout << "\n" << infos.size() - rejected << " component(s) available, " << rejected << " rejected\n";
}

nlohmann::json to_json(const std::vector<strata::PluginInfo>& infos) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& i : infos) {
    arr.push_back({{"path", i.path},
                   {"kind", i.kind},
                   {"name", i.name},
                   {"version", i.version},
                   {"abi", i.abi},
                   {"status", i.ok ? "ok" : "rejected"},
                   {"error", i.ok ? nlohmann::json(nullptr) : nlohmann::json(i.error)}});
  }
  return {{"plugins", arr}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "strata-info: list the Strata plugins this installation finds (path, kind, name, version,\n"
      "ABI and status, or why a library was rejected) and the directories searched.\n\n"
      "Search order: \"path\" entries of the config, STRATA_PLUGIN_PATH (and --plugin-path),\n"
      "/plugins/search_path of the config, then lib/strata/plugins next to libstrata_core.\n\n"
      "Example:\n"
      "  strata-info --plugin-path ./build/lib/strata/plugins --json\n"
      "  strata-info --config job.json\n"
      "  TF_CONFIG='{\"cluster\": {\"worker\": [\"h1:2222\", \"h2:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 1}}' \\\n"
      "    strata-info cluster\n"
      "  strata-info transports --json\n"
      "  strata-info trace /tmp/strata-run-4242"};
  bool as_json = false;
  std::string config_file;
  std::vector<std::string> plugin_paths;
  app.add_flag("--json", as_json, "print one JSON document {\"plugins\": [...]} instead of a table");
  app.add_option("--config", config_file, "job config (JSON) whose plugin \"path\"s and search_path to use")
      ->check(CLI::ExistingFile);
  app.add_option("--plugin-path", plugin_paths, "extra plugin directory, searched first (repeatable)");
  ClusterArgs cluster_args;
  CLI::App* cluster = add_cluster_command(app, cluster_args);
  TransportsArgs transports_args;
  CLI::App* transports = add_transports_command(app, transports_args);
  TraceArgs trace_args;
  CLI::App* trace = add_trace_command(app, trace_args);
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);

  try {
    if (trace->parsed()) {
      const auto doc = read_trace(trace_args.dir, std::cerr);
      if (trace_args.json)
        std::cout << doc.dump(2) << std::endl;
      else
        print_trace(doc, std::cout);
      return 0;
    }
    strata::Config cfg = config_file.empty() ? strata::Config() : strata::Config::from_file(config_file);
    cluster_args.config_file_resolver = cfg.name("cluster_resolver");
    cfg.apply_env();
    if (!plugin_paths.empty()) {
      std::string joined;
      for (const auto& p : plugin_paths) joined += (joined.empty() ? "" : ":") + p;
      if (const char* old = std::getenv("STRATA_PLUGIN_PATH"); old && *old) joined += std::string(":") + old;
      ::setenv("STRATA_PLUGIN_PATH", joined.c_str(), 1);
    }
    strata::PluginHost& host = strata::PluginHost::global();
    host.set_config(cfg.json());
    if (cluster->parsed()) {
      std::cout << run_cluster_command(host, cfg, cluster_args).dump(2) << std::endl;
      return 0;
    }
    if (transports->parsed()) {
      const auto doc = describe_transports(host);
      if (transports_args.json)
        std::cout << doc.dump(2) << std::endl;
      else
        print_transports(doc, std::cout);
      return 0;
    }
    const auto infos = host.discover();
    if (as_json)
      std::cout << to_json(infos).dump(2) << std::endl;
    else
      print_table(infos, host.search_dirs());
  } catch (const strata::Error& e) {
    std::cerr << "strata-info: " << e.code_name() << ": " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "strata-info: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
