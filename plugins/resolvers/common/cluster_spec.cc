// SPDX-License-Identifier: Apache-2.0
#include "cluster_spec.h"

#include <climits>
#include <iterator>

#include "strata/error.hpp"

namespace strata::resolvers {
namespace {

constexpr const char* kSpecExample = R"({"worker": ["host1:2222", "host2:2222"]})";

std::string job_list(const ClusterSpec& spec) {
  std::string out;
  for (const auto& [job, tasks] : spec.jobs) out += (out.empty() ? "" : ", ") + job;
  return out.empty() ? std::string("(none)") : out;
}

std::string index_list(const std::map<int32_t, std::string>& tasks) {
  std::string out;
  for (const auto& [index, addr] : tasks) out += (out.empty() ? "" : ", ") + std::to_string(index);
  return out.empty() ? std::string("(none)") : out;
}

// Sparse-job keys and string task indices: decimal digits only, so "-1",
// "+1", "1.0" and " 1" are rejected rather than silently reinterpreted.
std::optional<int64_t> parse_index(const std::string& s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > INT32_MAX) return std::nullopt;
  return v;
}

std::string check_address(const nlohmann::json& addr, const std::string& origin, const std::string& job,
                          const std::string& which) {
  if (!addr.is_string() || addr.get_ref<const std::string&>().empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": address of task ", which, " of job '", job,
                 "' must be a non-empty \"host:port\" string, got ", addr.dump(), "; e.g. ", kSpecExample);
  return addr.get<std::string>();
}

std::optional<std::string> optional_string(const nlohmann::json& doc, const char* key, const std::string& origin) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_string())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": \"", key, "\" must be a string, got ", it->dump(),
                 "; e.g. \"", key, "\": \"grpc\"");
  return it->get<std::string>();
}

}  // namespace

std::size_t ClusterSpec::num_tasks(const std::string& job) const {
  auto it = jobs.find(job);
  return it == jobs.end() ? 0 : it->second.size();
}

const std::string* ClusterSpec::task_address(const std::string& job, int32_t index) const {
  auto it = jobs.find(job);
  if (it == jobs.end()) return nullptr;
  auto t = it->second.find(index);
  return t == it->second.end() ? nullptr : &t->second;
}

ClusterSpec parse_cluster_spec(const nlohmann::json& spec, const std::string& origin) {
  ClusterSpec out;
  if (spec.is_null()) return out;
  if (!spec.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " must be a JSON object mapping job names to addresses, got ",
                 spec.type_name(), "; set it like ", kSpecExample);
  for (auto it = spec.begin(); it != spec.end(); ++it) {
    const std::string& job = it.key();
    if (job.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " has a job with an empty name; name jobs \"chief\", "
                   "\"worker\", \"evaluator\", \"ps\" or similar");
    auto& tasks = out.jobs[job];
    const nlohmann::json& v = it.value();
    if (v.is_array()) {
      for (std::size_t i = 0; i < v.size(); ++i)
        tasks.emplace(static_cast<int32_t>(i), check_address(v[i], origin, job, std::to_string(i)));
    } else if (v.is_object()) {
      for (auto t = v.begin(); t != v.end(); ++t) {
        const auto index = parse_index(t.key());
        if (!index)
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": job '", job, "' has task index \"", t.key(),
                       "\"; a sparse job maps non-negative decimal task indices to addresses, e.g. "
                       "{\"worker\": {\"1\": \"host1:2222\", \"3\": \"host3:2222\"}}");
        tasks.emplace(static_cast<int32_t>(*index), check_address(t.value(), origin, job, t.key()));
      }
    } else {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": job '", job,
                   "' must be a list of addresses or an object {\"<index>\": address}, got ", v.type_name(),
                   " ", v.dump(), "; e.g. ", kSpecExample);
    }
  }
  out.json = spec;
  return out;
}

TfConfig parse_tf_config(std::string_view text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG is not valid JSON (error at byte ", e.byte, ": ", e.what(),
                 "); set it to a JSON object such as {\"cluster\": ", kSpecExample,
                 ", \"task\": {\"type\": \"worker\", \"index\": 0}}");
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG is not valid JSON (", e.what(),
                 "); set it to a JSON object such as {\"cluster\": ", kSpecExample,
                 ", \"task\": {\"type\": \"worker\", \"index\": 0}}");
  }
  if (!doc.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG must be a JSON object, got ", doc.type_name(),
                 "; set it like {\"cluster\": ", kSpecExample, ", \"task\": {\"type\": \"worker\", \"index\": 0}}");
  TfConfig out;
  if (auto it = doc.find("cluster"); it != doc.end())
    out.cluster = parse_cluster_spec(*it, "TF_CONFIG \"cluster\"");
  if (auto it = doc.find("task"); it != doc.end() && !it->is_null()) {
    if (!it->is_object())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG \"task\" must be an object, got ", it->dump(),
                   "; set it like {\"type\": \"worker\", \"index\": 0}");
    // TensorFlow applies str() to the type, so a numeric job name such as
    // 123456 is accepted; other JSON types are refused rather than turned
    // into Python spellings ("True", "[1]") no cluster would use.
    if (auto type = it->find("type"); type != it->end() && type->is_number_integer())
      out.task_type = type->dump();
    else if (type != it->end() && !type->is_null() && !type->is_string())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task type must be a job name (a string, or an integer "
                   "for a numeric job name), got ", type->dump(), "; set \"task\": {\"type\": \"worker\", "
                   "\"index\": 0}");
    else
      out.task_type = optional_string(*it, "type", "TF_CONFIG \"task\"");
    if (out.task_type && out.task_type->empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task type is empty; set \"task\": {\"type\": "
                   "\"worker\", \"index\": 0} with a job name of the cluster");
    if (auto idx = it->find("index"); idx != it->end() && !idx->is_null()) {
      // TensorFlow applies int() to the index, so "1" is accepted as well as 1.
      std::optional<int64_t> v;
      if (idx->is_number_integer()) {
        v = idx->get<int64_t>();
      } else if (idx->is_string()) {
        const auto& s = idx->get_ref<const std::string&>();
        if (!s.empty() && s[0] == '-' && parse_index(s.substr(1))) v = -*parse_index(s.substr(1));
        else v = parse_index(s);
      }
      if (!v)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task index must be a whole number, got ",
                     idx->dump(), "; set \"task\": {\"type\": \"worker\", \"index\": 0}");
      if (*v < 0)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task index ", *v,
                     " is negative; task indices count from 0");
      if (*v > INT32_MAX)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TF_CONFIG task index ", *v, " is too large");
      out.task_id = static_cast<int32_t>(*v);
    }
  }
  out.rpc_layer = optional_string(doc, "rpc_layer", "TF_CONFIG");
  out.session_master = optional_string(doc, "session_master", "TF_CONFIG");
  // Only reported: the tf_config resolver takes its environment from its
  // option, as TFConfigClusterResolver does, so a value of another type is
  // not an error here.
  if (auto it = doc.find("environment"); it != doc.end() && it->is_string()) out.environment = it->get<std::string>();
  return out;
}

void Resolution::validate(const std::string& origin) const {
  for (const char* single : {"chief", "evaluator"}) {
    if (cluster.num_tasks(single) > 1)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": the cluster has ", cluster.num_tasks(single), " '",
                   single, "' tasks; there must be at most one ", single, " (make the others \"worker\" tasks)");
  }
  if (task_id && *task_id < 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": task id ", *task_id,
                 " is negative; task ids count from 0");
  if (!task_type) {
    if (task_id)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": a task id (", *task_id,
                   ") is set without a task type; set the task type as well (e.g. \"worker\")");
    return;
  }
  if (task_type->empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": the task type is empty; use a job of the cluster (",
                 job_list(cluster), ")");
  auto job = cluster.jobs.find(*task_type);
  if (job == cluster.jobs.end()) {
    // An evaluator usually runs beside the training cluster, not in it.
    if (*task_type == "evaluator") return;
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": task type '", *task_type,
                 "' is not a job of the cluster (jobs: ", job_list(cluster),
                 "); set the task type to one of them or add the job to the cluster");
  }
  if (!task_id)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": task type '", *task_type,
                 "' has no task index; set the index as well (e.g. \"task\": {\"type\": \"", *task_type,
                 "\", \"index\": 0})");
  if (job->second.count(*task_id) == 0) {
    const bool dense = cluster.json.is_object() && cluster.json.contains(*task_type) &&
                       cluster.json.at(*task_type).is_array();
    if (dense)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": task index ", *task_id, " is out of range for job '",
                   *task_type, "', which has ", job->second.size(), " task(s)",
                   job->second.empty() ? std::string()
                                       : " (indices 0.." + std::to_string(job->second.size() - 1) + ")",
                   "; fix the task index or add the task's address to the job");
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": job '", *task_type, "' has no task with index ",
                 *task_id, " (its indices: ", index_list(job->second),
                 "); fix the task index or add {\"", *task_id, "\": \"host:port\"} to the job");
  }
}

std::string Resolution::master(const char* req_type, int32_t req_id, const char* req_layer,
                               const std::string& origin, bool use_session_master, bool own_layer) const {
  const std::string layer = (req_layer != nullptr && req_layer[0] != '\0') ? std::string(req_layer)
                            : own_layer                                   ? rpc_layer.value_or("")
                                                                          : std::string();
  if (use_session_master && req_type == nullptr && session_master) return *session_master;
  std::optional<std::string> type = req_type != nullptr ? std::optional<std::string>(req_type) : task_type;
  if (!type) return "";  // this process has no task: TensorFlow returns ''
  std::optional<int32_t> id = req_id >= 0 ? std::optional<int32_t>(req_id) : task_id;
  if (!id)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "master(): no task id for task type '", *type,
                 "'; pass a task id (this process's own index is unknown)");
  const std::string* addr = cluster.task_address(*type, *id);
  if (addr == nullptr)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "master(): the cluster of ", origin, " has no task ", *type, " ", *id,
                 " (jobs: ", job_list(cluster), "); an evaluator that runs outside the cluster has no address");
  return layer.empty() ? *addr : layer + "://" + *addr;
}

std::string Resolution::tf_config_master(const char* req_type, int32_t req_id, const char* req_layer) const {
  if (session_master) return *session_master;
  // A cluster of one task (or none) runs in-process: no session target.
  if (cluster.jobs.empty() || (cluster.jobs.size() == 1 && cluster.jobs.begin()->second.size() <= 1)) return "";
  if (req_type == nullptr && !task_type)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "master(): this process has no task (TF_CONFIG has no \"task\" and no "
                 "task_type option was given), so it has no address in the cluster (jobs: ", job_list(cluster),
                 "); pass a task type and id, e.g. master(\"worker\", 0)");
  // An explicit "" means no layer, as TF's format_master_url treats ''.
  const char* layer = req_layer != nullptr ? req_layer : (rpc_layer ? rpc_layer->c_str() : "");
  return master(req_type, req_id, layer[0] == '\0' ? nullptr : layer, "TF_CONFIG", /*use_session_master=*/false,
                /*own_layer=*/false);
}

nlohmann::json Resolution::describe() const {
  auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(nullptr); };
  return {{"cluster_spec", cluster.json},
          {"task_type", opt(task_type)},
          {"task_id", opt(task_id)},
          {"rpc_layer", opt(rpc_layer)},
          {"environment", opt(environment)},
          {"num_accelerators", num_accelerators},
          {"env_after", nlohmann::json::object()}};
}

nlohmann::json parse_num_accelerators(const nlohmann::json& value, const std::string& origin) {
  if (value.is_null()) return nlohmann::json::object();
  bool ok = value.is_object();
  if (ok)
    for (const auto& n : value) ok = ok && n.is_number_integer() && n.get<int64_t>() >= 0;
  if (!ok)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin,
                 " must be an object of non-negative accelerator counts per device type, got ", value.dump(),
                 "; e.g. {\"GPU\": 2}");
  return value;
}

namespace {

constexpr const char* kMultiWorkerJobs = "\"chief\", \"worker\", \"evaluator\" and \"ps\"";

bool multi_worker_job(const std::string& job) {
  return job == "chief" || job == "worker" || job == "evaluator" || job == "ps";
}

// The answer of one multi_worker_util rule, or null where the rule refuses
// the task (InvalidArgumentError); other errors propagate.
template <class F>
auto ask(F&& f) -> std::optional<decltype(f())> {
  try {
    return f();
  } catch (const Error& e) {
    if (e.code() != STRATA_ERR_INVALID_ARGUMENT) throw;
    return std::nullopt;
  }
}

}  // namespace

void validate_multi_worker(const ClusterSpec& spec, const std::optional<std::string>& task_type,
                           std::optional<int32_t> task_id) {
  for (const auto& [job, tasks] : spec.jobs)
    if (!multi_worker_job(job))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the cluster has job '", job,
                   "', but multi-worker training knows only the jobs ", kMultiWorkerJobs, " (jobs: ",
                   job_list(spec), "); rename the job to one of them");
  if (task_type && !multi_worker_job(*task_type))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "task type '", *task_type,
                 "' is not a multi-worker task type; use one of ", kMultiWorkerJobs);
  // An evaluator usually runs beside the training cluster, not in it.
  if (task_type && *task_type != "evaluator" && !spec.has_job(*task_type))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "task type '", *task_type, "' is not a job of the cluster (jobs: ",
                 job_list(spec), "); add the job to the cluster or use one of its jobs");
  for (const char* single : {"chief", "evaluator"})
    if (spec.num_tasks(single) > 1)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the cluster has ", spec.num_tasks(single), " '", single,
                   "' tasks; there must be at most one ", single, " (make the others \"worker\" tasks)");
  if (task_type && task_id && spec.has_job(*task_type) && !spec.task_address(*task_type, *task_id))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "job '", *task_type, "' has no task with index ", *task_id,
                 " (its indices: ", index_list(spec.jobs.at(*task_type)), "); fix the task index");
}

bool is_chief(const ClusterSpec& spec, const std::string& task_type, int32_t task_id) {
  validate_multi_worker(spec, task_type, task_id);
  if (task_type == "chief" || task_type == "evaluator") return true;  // the evaluator is its own cluster's chief
  return task_type == "worker" && !spec.has_job("chief") && spec.jobs.at("worker").begin()->first == task_id;
}

int32_t worker_count(const ClusterSpec& spec, const std::string& task_type) {
  validate_multi_worker(spec, task_type, std::nullopt);
  if (task_type == "evaluator")  // its own cluster, inside the spec or beside it
    return spec.has_job("evaluator") ? static_cast<int32_t>(spec.num_tasks("evaluator")) : 1;
  if (task_type != "chief" && task_type != "worker")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "worker_count() does not count for task type '", task_type,
                 "': only chief, worker and evaluator tasks are workers (a ps task holds variables); ask for "
                 "the count of a \"worker\" task instead");
  return static_cast<int32_t>(spec.num_tasks("chief") + spec.num_tasks("worker"));
}

int32_t id_in_cluster(const ClusterSpec& spec, const std::string& task_type, int32_t task_id) {
  validate_multi_worker(spec, task_type, task_id);
  if (task_type == "chief") return 0;
  if (task_type == "evaluator") return task_id;
  if (task_type != "worker")
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "id_in_cluster() has no id for task type '", task_type,
                 "': only chief, worker and evaluator tasks have one (a ps task holds variables and is no "
                 "worker)");
  const auto& workers = spec.jobs.at("worker");
  return static_cast<int32_t>(spec.num_tasks("chief") +
                              static_cast<std::size_t>(std::distance(workers.begin(), workers.find(task_id))));
}

ClusterRole cluster_role(const nlohmann::json& describe) {
  if (!describe.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "a resolver's describe() must be a JSON object, got ",
                 describe.type_name());
  const ClusterSpec spec =
      parse_cluster_spec(describe.value("cluster_spec", nlohmann::json::object()), "describe() \"cluster_spec\"");
  const nlohmann::json type = describe.value("task_type", nlohmann::json());
  const nlohmann::json id = describe.value("task_id", nlohmann::json());
  if (!type.is_null() && !type.is_string())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "describe() \"task_type\" must be a string or null, got ", type.dump());
  if (!id.is_null() && !id.is_number_integer())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "describe() \"task_id\" must be an integer or null, got ", id.dump());

  ClusterRole role;
  if (spec.jobs.empty() && type.is_null()) {
    role.is_chief = true;  // a single-process job is its own chief
    role.id_in_cluster = 0;
    role.worker_count = 1;
    return role;
  }
  if (type.is_null()) return role;  // this process has no task: nothing to place
  const std::string& t = type.get_ref<const std::string&>();
  // Each rule is asked on its own, as TF's functions are: a ps task has an
  // is_chief (false) but no worker_count or id_in_cluster.
  role.worker_count = ask([&] { return worker_count(spec, t); });
  if (id.is_null()) return role;
  const int32_t i = id.get<int32_t>();
  role.is_chief = ask([&] { return is_chief(spec, t, i); });
  role.id_in_cluster = ask([&] { return id_in_cluster(spec, t, i); });
  return role;
}

}  // namespace strata::resolvers
