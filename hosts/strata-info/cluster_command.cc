// SPDX-License-Identifier: Apache-2.0
#include "cluster_command.h"

#include "key_json.h"

#include "cluster_spec.h"
#include "strata/c/strata.h"
#include "strata/error.hpp"

namespace {

void append(void* user, const char* data, uint64_t len) { static_cast<std::string*>(user)->append(data, len); }

nlohmann::json or_null(const nlohmann::json& doc, const char* key) {
  auto it = doc.find(key);
  return it == doc.end() ? nlohmann::json() : *it;
}

}  // namespace

CLI::App* add_cluster_command(CLI::App& app, ClusterArgs& args) {
  CLI::App* sub = app.add_subcommand(
      "cluster",
      "print the resolved cluster as JSON: resolver, cluster_spec, task_type, task_id, rpc_layer, master,\n"
      "num_accelerators, environment, is_chief, id_in_cluster, worker_count, env_after.\n"
      "Without --resolver: the config's cluster_resolver (or STRATA_CLUSTER_RESOLVER), else the first\n"
      "resolver that detects its environment: slurm (a job step: SLURM_PROCID and SLURM_STEP_NODELIST\n"
      "set), tf_config (TF_CONFIG set), tpu (KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_NAME or TPU_CONFIG set);\n"
      "else \"local\" (a single-process job).\n"
      "Then \"detection\" shows each step and why the resolver was chosen.\n"
      "Example:\n"
      "  strata-info cluster --resolver simple --option 'cluster_spec={\"worker\": [\"h1:2222\"]}' \\\n"
      "    --option 'task_type=\"worker\"' --option task_id=0");
  sub->add_option("--resolver", args.resolver,
                  "cluster resolver to use (slurm, tf_config, tpu, union, simple, ... or local)");
  sub->add_option("--option", args.options,
                  "resolver option KEY=JSON (repeatable), e.g. task_id=1 or 'task_type=\"worker\"'");
  sub->fallthrough();
  return sub;
}

nlohmann::json parse_cluster_options(const std::vector<std::string>& options, nlohmann::json base) {
  return strata::cli::apply_key_json(options, std::move(base), "--option", "task_id=1");
}

nlohmann::ordered_json run_cluster_command(strata::PluginHost& host, const strata::Config& cfg,
                                           const ClusterArgs& args) {
  std::string name = args.resolver;
  nlohmann::ordered_json detection;  // only when the resolver was not named on the command line
  if (name.empty()) {
    const strata::ResolverChoice choice = strata::choose_cluster_resolver(host, cfg.name("cluster_resolver"));
    name = choice.name;
    nlohmann::ordered_json order = nlohmann::ordered_json::array();
    for (const auto& [resolver, found] : choice.probes) order.push_back({{"resolver", resolver}, {"found", found}});
    detection["order"] = order;
    detection["chosen"] = name.empty() ? std::string("local") : name;
    detection["reason"] = choice.reason;
  }
  nlohmann::json base = nlohmann::json::object();
  if (cfg.has("cluster_resolver") && (args.config_file_resolver.empty() || args.config_file_resolver == name))
    base = nlohmann::json::parse(cfg.options_json("cluster_resolver"));
  const nlohmann::json options = parse_cluster_options(args.options, base);

  nlohmann::ordered_json out;
  if (name.empty() || name == "local") {
    if (!options.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "resolver options were given (", options.dump(),
                   ") but no cluster resolver was chosen or detected (no Slurm, TF_CONFIG or TPU environment); pass "
                   "--resolver "
                   "NAME, e.g. --resolver simple");
    out["resolver"] = "local";
    out["cluster_spec"] = nlohmann::json::object();
    out["task_type"] = nullptr;
    out["task_id"] = nullptr;
    out["rpc_layer"] = nullptr;
    out["master"] = nullptr;
    out["num_accelerators"] = nlohmann::json::object();
    out["environment"] = nullptr;
    out["is_chief"] = true;
    out["id_in_cluster"] = 0;
    out["worker_count"] = 1;
    out["env_after"] = nlohmann::json::object();
    if (!detection.is_null()) out["detection"] = detection;
    return out;
  }

  strata::PluginInstance inst = host.create(STRATA_KIND_CLUSTER_RESOLVER, name, options.dump());
  const auto* vt = inst.vtable_as<strata_resolver_vtable>();
  auto r = static_cast<strata_resolver_t>(inst.handle());
  std::string text;
  strata_error err;
  strata_error_init(&err);
  strata::detail::check_status(vt->describe(r, &append, &text, &err), err,
                               ("describe() of cluster resolver '" + name + "'").c_str());
  nlohmann::json desc;
  try {
    desc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(STRATA_ERR_INTERNAL, "cluster resolver '", name, "' returned invalid JSON from describe() (",
                 e.what(), "); fix the plugin");
  }
  const strata::resolvers::ClusterRole role = strata::resolvers::cluster_role(desc);

  std::string master;
  strata_error_init(&err);
  const strata_status_t st = vt->master(r, nullptr, -1, nullptr, &append, &master, &err);
  if (st != STRATA_ERR_NOT_FOUND)
    strata::detail::check_status(st, err, ("master() of cluster resolver '" + name + "'").c_str());

  out["resolver"] = name;
  out["cluster_spec"] = or_null(desc, "cluster_spec");
  out["task_type"] = or_null(desc, "task_type");
  out["task_id"] = or_null(desc, "task_id");
  out["rpc_layer"] = or_null(desc, "rpc_layer");
  out["master"] = (st == STRATA_OK && !master.empty()) ? nlohmann::json(master) : nlohmann::json();
  out["num_accelerators"] = desc.contains("num_accelerators") ? desc["num_accelerators"] : nlohmann::json::object();
  out["environment"] = or_null(desc, "environment");
  out["is_chief"] = role.is_chief ? nlohmann::json(*role.is_chief) : nlohmann::json();
  out["id_in_cluster"] = role.id_in_cluster ? nlohmann::json(*role.id_in_cluster) : nlohmann::json();
  out["worker_count"] = role.worker_count ? nlohmann::json(*role.worker_count) : nlohmann::json();
  out["env_after"] = desc.contains("env_after") ? desc["env_after"] : nlohmann::json::object();
  // Resolver-specific details ("slurm", "tpu", "union_of") follow the common fields.
  for (auto it = desc.begin(); it != desc.end(); ++it)
    if (!out.contains(it.key()) && it.key() != "session_master") out[it.key()] = it.value();
  if (!detection.is_null()) out["detection"] = detection;
  return out;
}
