// SPDX-License-Identifier: Apache-2.0
// ClusterResolver "union": tf.distribute.cluster_resolver.
// UnionClusterResolver. Combines other resolvers, created through the host:
//
//   {"resolvers": [{"name": "slurm", "options": {"jobs": {"worker": 4}}},
//                  {"name": "simple", "options": {"cluster_spec": {"ps":
//                  ["p0:2222"]}}}]}
//
// The cluster spec is the union of theirs. A job that two resolvers both
// list must have the same tasks in both, except that sparse jobs
// ({"<index>": address}) with disjoint indices are merged, as TF does;
// anything else is an error naming both resolvers. task_type/task_id come
// from the first resolver that has a task; rpc_layer, environment and
// num_accelerators from the first that has them; env_after is merged with
// the earlier resolver winning. master() with no task is the master() of the
// resolver that gave the task (the first resolver when none did); a named
// task is looked up in the union. The instance keeps its children alive and
// is immutable after create.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster_spec.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace {

using nlohmann::json;
constexpr const char* kComponent = "cluster resolver 'union'";
constexpr const char* kExample =
    R"({"resolvers": [{"name": "tf_config"}, {"name": "simple", "options": {"cluster_spec": {"ps": ["p0:2222"]}}}]})";

void append(void* user, const char* data, uint64_t len) { static_cast<std::string*>(user)->append(data, len); }

struct Child {
  std::string label;  // "resolver #0 'slurm'"
  strata::sdk::PluginRef<strata_resolver_vtable> ref;
  json describe;
};

class UnionResolver final : public strata::sdk::ResolverBase {
 public:
  static constexpr const char* kSubsystem = "resolver.union";

  UnionResolver(strata::sdk::Host host, const char* options_json) {
    const json opts = strata::sdk::parse_options(options_json, kComponent);
    strata::sdk::check_known_keys(opts, {"resolvers"}, kComponent);
    const json list = opts.value("resolvers", json());
    if (!list.is_array() || list.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'resolvers' of ", kComponent,
                   " must be a non-empty list of {\"name\", \"options\"}, got ", list.dump(), "; e.g. ", kExample);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const json& entry = list[i];
      if (!entry.is_object() || !entry.value("name", json()).is_string() ||
          entry["name"].get_ref<const std::string&>().empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'resolvers' of ", kComponent, ": entry #", i, " (",
                     entry.dump(), ") needs a \"name\" string; e.g. ", kExample);
      for (auto it = entry.begin(); it != entry.end(); ++it)
        if (it.key() != "name" && it.key() != "options")
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'resolvers' of ", kComponent, ": entry #", i,
                       " has unknown key '", it.key(), "'; entries have \"name\" and \"options\"");
      const json child_opts = entry.value("options", json::object());
      if (!child_opts.is_object())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'resolvers' of ", kComponent, ": entry #", i,
                     " \"options\" must be an object, got ", child_opts.dump());
      Child c;
      c.label = "resolver #" + std::to_string(i) + " '" + entry["name"].get<std::string>() + "'";
      try {
        c.ref = host.create_plugin<strata_resolver_vtable>(entry["name"].get<std::string>(), child_opts.dump());
        std::string text;
        strata_error err;
        strata_error_init(&err);
        strata::detail::check_status(c.ref.vtable()->describe(c.ref.handle<strata_resolver_t>(), &append, &text, &err),
                                     err, "describe()");
        c.describe = json::parse(text);
        if (!c.describe.is_object()) STRATA_THROW(STRATA_ERR_INTERNAL, "describe() is not a JSON object");
      } catch (const strata::Error& e) {
        strata::detail::throw_status(e.code(), strata::detail::str_cat(kComponent, ": ", c.label, ": ", e.what()));
      } catch (const json::exception& e) {
        STRATA_THROW(STRATA_ERR_INTERNAL, kComponent, ": ", c.label, " returned invalid describe() JSON (", e.what(),
                     ")");
      }
      children_.push_back(std::move(c));
    }
    merge();
    host.debug("union of ", children_.size(), " resolvers: ", spec_.dump());
  }

  std::string describe() override {
    json j = r_.describe();
    j["env_after"] = env_after_;
    json parts = json::array();
    for (const auto& c : children_) parts.push_back(c.label);
    j["union_of"] = parts;
    return j.dump();
  }

  std::string master(const char* task_type, int32_t task_id, const char* rpc_layer) override {
    if (task_type != nullptr) return r_.master(task_type, task_id, rpc_layer, "the union resolver");
    const Child& c = children_[task_source_];
    std::string out;
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st =
        c.ref.vtable()->master(c.ref.handle<strata_resolver_t>(), nullptr, task_id, rpc_layer, &append, &out, &err);
    if (st != STRATA_OK)
      strata::detail::throw_status(st, strata::detail::str_cat("master() of ", c.label, ": ", err.message));
    return out;
  }

 private:
  void merge() {
    json owners = json::object();  // job -> label of the resolver that first listed it
    for (std::size_t i = 0; i < children_.size(); ++i) {
      const Child& c = children_[i];
      const json spec = c.describe.value("cluster_spec", json::object());
      if (!spec.is_object())
        STRATA_THROW(STRATA_ERR_INTERNAL, kComponent, ": ", c.label,
                     " described a cluster_spec that is not an "
                     "object: ",
                     spec.dump());
      for (auto it = spec.begin(); it != spec.end(); ++it) {
        const std::string& job = it.key();
        if (!spec_.contains(job)) {
          spec_[job] = it.value();
          owners[job] = c.label;
          continue;
        }
        json& mine = spec_[job];
        if (mine == it.value()) continue;
        bool merged = false;
        if (mine.is_object() && it.value().is_object()) {
          merged = true;
          for (auto t = it.value().begin(); t != it.value().end(); ++t)
            if (mine.contains(t.key()) && mine[t.key()] != t.value()) merged = false;
          if (merged)
            for (auto t = it.value().begin(); t != it.value().end(); ++t) mine[t.key()] = t.value();
        }
        if (!merged)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComponent, ": job '", job, "' is in both ",
                       owners[job].get<std::string>(), " (", mine.dump(), ") and ", c.label, " (", it.value().dump(),
                       ") with different tasks; remove the job from one of them or make "
                       "their tasks agree");
      }
      auto str = [&](const char* key) -> std::optional<std::string> {
        const json v = c.describe.value(key, json());
        return v.is_string() ? std::optional<std::string>(v.get<std::string>()) : std::nullopt;
      };
      if (!have_task_ && str("task_type")) {
        have_task_ = true;
        task_source_ = i;
        r_.task_type = str("task_type");
        const json id = c.describe.value("task_id", json());
        if (id.is_number_integer()) r_.task_id = id.get<int32_t>();
      }
      if (!r_.rpc_layer) r_.rpc_layer = str("rpc_layer");
      if (!r_.environment) r_.environment = str("environment");
      const json acc = c.describe.value("num_accelerators", json());
      if (r_.num_accelerators.empty() && acc.is_object() && !acc.empty()) r_.num_accelerators = acc;
      const json env = c.describe.value("env_after", json());
      if (env.is_object())
        for (auto e = env.begin(); e != env.end(); ++e)
          if (!env_after_.contains(e.key())) env_after_[e.key()] = e.value();
    }
    r_.cluster = strata::resolvers::parse_cluster_spec(spec_, "the union resolver's cluster");
    r_.validate("the union resolver");
  }

  std::vector<Child> children_;
  json spec_ = json::object();
  json env_after_ = json::object();
  strata::resolvers::Resolution r_;
  bool have_task_ = false;
  std::size_t task_source_ = 0;
};

}  // namespace

STRATA_PLUGIN("strata union cluster resolver", "1.0.0", STRATA_RESOLVER_COMPONENT(UnionResolver, "union", "1.0.0"))
