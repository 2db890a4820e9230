// SPDX-License-Identifier: Apache-2.0
// The slurm, tpu and union cluster resolvers and the auto-detection order,
// through the plugin host (environment set in this process) and through
// `strata-info cluster` (environment set for the child): every case runs
// both ways and must give the same answer. The TPU name lookup runs against
// a small HTTP server on loopback (a thread of this test) that answers as
// the Cloud TPU API does, or answers an error, or never answers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strata/plugin_host.hpp"
#include "subprocess.h"

namespace strata {
namespace {

using nlohmann::json;
using test::EnvEdits;

void append(void* user, const char* data, uint64_t len) { static_cast<std::string*>(user)->append(data, len); }

/// Every variable a resolver or the detection reads: a case starts from none
/// of them, so the machine running the tests (a Slurm node, a TPU VM) does
/// not leak into the answers.
const std::vector<std::string>& cluster_vars() {
  static const std::vector<std::string> vars = {"TF_CONFIG",
                                                "SLURM_PROCID",
                                                "SLURM_STEP_NUM_TASKS",
                                                "SLURM_NTASKS",
                                                "SLURM_STEP_NODELIST",
                                                "SLURM_JOB_NODELIST",
                                                "SLURM_STEP_TASKS_PER_NODE",
                                                "SLURM_TASKS_PER_NODE",
                                                "CUDA_VISIBLE_DEVICES",
                                                "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
                                                "TPU_NAME",
                                                "TPU_CONFIG",
                                                "TPU_API_ENDPOINT",
                                                "STRATA_CLUSTER_RESOLVER"};
  return vars;
}

EnvEdits full_env(const EnvEdits& set) {
  EnvEdits env;
  for (const auto& v : cluster_vars()) env[v] = std::nullopt;
  for (const auto& [k, v] : set) env[k] = v;
  return env;
}

/// Applies `edits` to this process's environment for one scope.
class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvEdits& edits) {
    for (const auto& [k, v] : edits) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

struct Outcome {
  strata_status_t code = STRATA_OK;
  std::string message;
  json describe;
  json master;  // string, or null when master() is ""
};

Outcome via_plugin(const std::string& resolver, const EnvEdits& env, const json& options) {
  ScopedEnv scoped(full_env(env));
  Outcome o;
  try {
    PluginInstance inst = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, resolver, options.dump());
    const auto* vt = inst.vtable_as<strata_resolver_vtable>();
    auto r = static_cast<strata_resolver_t>(inst.handle());
    std::string text, master;
    strata_error err;
    strata_error_init(&err);
    detail::check_status(vt->describe(r, &append, &text, &err), err, "describe");
    o.describe = json::parse(text);
    strata_error_init(&err);
    detail::check_status(vt->master(r, nullptr, -1, nullptr, &append, &master, &err), err, "master");
    o.master = master.empty() ? json() : json(master);
  } catch (const Error& e) {
    o.code = e.code();
    o.message = e.what();
  }
  return o;
}

test::ProcResult run_info(const std::vector<std::string>& args, const EnvEdits& env) {
  std::vector<std::string> argv = {STRATA_INFO_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  EnvEdits e = full_env(env);
  e.emplace("STRATA_LOG_LEVEL", "off");
  e.emplace("STRATA_PLUGIN_PATH", std::nullopt);
  return test::run_program(argv, e);
}

std::vector<std::string> cluster_args(const std::string& resolver, const json& options) {
  std::vector<std::string> out = {"cluster", "--resolver", resolver};
  for (auto it = options.begin(); it != options.end(); ++it) {
    out.push_back("--option");
    out.push_back(it.key() + "=" + it.value().dump());
  }
  return out;
}

// ---- a stand-in for the Cloud TPU API ---------------------------------------

/// Serves GET requests on 127.0.0.1 from one thread: answers `status` with
/// `body`, or (silent) reads the request and never answers. Records the
/// request paths. Stops and joins in the destructor.
class TinyHttpServer {
 public:
  TinyHttpServer(int status, std::string body, bool silent = false)
      : status_(status), body_(std::move(body)), silent_(silent) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0)
      throw std::runtime_error("TinyHttpServer: bind/listen failed");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyHttpServer() {
    stop_ = true;
    thread_.join();
    for (int c : held_) ::close(c);
    ::close(fd_);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> paths() {
    std::lock_guard<std::mutex> l(mu_);
    return paths_;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string req;
      char buf[2048];
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (req.find("\r\n\r\n") == std::string::npos && std::chrono::steady_clock::now() < until && !stop_) {
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 50) <= 0) continue;
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        const auto sp = req.find(' ');
        paths_.push_back(sp == std::string::npos ? req : req.substr(sp + 1, req.find(' ', sp + 1) - sp - 1));
      }
      if (silent_) {
        held_.push_back(c);  // accepted, never answered: the client's deadline must fire
        continue;
      }
      const std::string resp = "HTTP/1.1 " + std::to_string(status_) +
                               " X\r\nContent-Type: application/json\r\n"
                               "Content-Length: " +
                               std::to_string(body_.size()) + "\r\nConnection: close\r\n\r\n" + body_;
      (void)!::write(c, resp.data(), resp.size());
      ::close(c);
    }
  }

  int status_;
  std::string body_;
  bool silent_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<int> held_;
  std::mutex mu_;
  std::vector<std::string> paths_;
};

// ---- table of cases
// ------------------------------------------------------------

struct Case {
  std::string name;
  std::string resolver;
  EnvEdits env;
  json options;
  json expect;  // subset of describe() (and of strata-info's output)
  json master;  // null = "" / none
  strata_status_t code = STRATA_OK;
  std::vector<std::string> error;  // substrings of the message
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Case ok_case(std::string name, std::string resolver, EnvEdits env, json options, json expect, json master) {
  Case c;
  c.name = std::move(name);
  c.resolver = std::move(resolver);
  c.env = std::move(env);
  c.options = std::move(options);
  c.expect = std::move(expect);
  c.master = std::move(master);
  return c;
}

const EnvEdits kStep4 = {{"SLURM_PROCID", "3"},
                         {"SLURM_STEP_NUM_TASKS", "4"},
                         {"SLURM_STEP_NODELIST", "t02n13,t03n[01-02]"},
                         {"SLURM_STEP_TASKS_PER_NODE", "2,1(x2)"},
                         {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}};

EnvEdits edit(EnvEdits base, const EnvEdits& changes) {
  for (const auto& [k, v] : changes) base[k] = v;
  return base;
}

std::vector<Case> cases() {
  const json spec4 = json::parse(R"({"worker": ["t02n13:8888", "t02n13:8889", "t03n01:8888", "t03n02:8888"]})");
  std::vector<Case> c;
  // ---- slurm
  c.push_back(ok_case("slurm_default", "slurm", kStep4, json::object(),
                      {{"cluster_spec", spec4},
                       {"task_type", "worker"},
                       {"task_id", 3},
                       {"rpc_layer", "grpc"},
                       {"num_accelerators", {{"GPU", 4}}},
                       {"env_after", {{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}}},
                      "grpc://t03n02:8888"));
  c.push_back(
      ok_case("slurm_local_index_gpus", "slurm", edit(kStep4, {{"SLURM_PROCID", "1"}}), json::object(),
              {{"task_id", 1}, {"num_accelerators", {{"GPU", 2}}}, {"env_after", {{"CUDA_VISIBLE_DEVICES", "2,3"}}}},
              "grpc://t02n13:8889"));
  c.push_back(
      ok_case("slurm_jobs_ports", "slurm", edit(kStep4, {{"SLURM_PROCID", "1"}}),
              {{"jobs", {{"worker", 3}, {"ps", 1}}}, {"port_base", 2222}, {"rpc_layer", ""}},
              {{"cluster_spec", {{"ps", {"t02n13:2222"}}, {"worker", {"t02n13:2223", "t03n01:2222", "t03n02:2222"}}}},
               {"task_type", "worker"},
               {"task_id", 0},
               {"rpc_layer", nullptr}},
              "t02n13:2223"));
  c.push_back(ok_case(
      "slurm_gpus_options", "slurm", edit(kStep4, {{"SLURM_PROCID", "1"}, {"CUDA_VISIBLE_DEVICES", std::nullopt}}),
      {{"gpus_per_node", 8}, {"gpus_per_task", 3}},
      {{"num_accelerators", {{"GPU", 3}}}, {"env_after", {{"CUDA_VISIBLE_DEVICES", "3,4,5"}}}}, "grpc://t02n13:8889"));
  c.push_back(ok_case("slurm_no_auto_set_gpu", "slurm", kStep4, {{"auto_set_gpu", false}},
                      {{"num_accelerators", {{"GPU", 4}}}, {"env_after", json::object()}}, "grpc://t03n02:8888"));
  c.push_back(ok_case("slurm_tasks_per_node_option", "slurm",
                      edit(kStep4, {{"SLURM_STEP_TASKS_PER_NODE", std::nullopt}, {"SLURM_PROCID", "2"}}),
                      {{"tasks_per_node", {{"t02n13", 1}, {"t03n01", 2}, {"t03n02", 1}}}, {"gpus_per_node", 0}},
                      {{"cluster_spec", {{"worker", {"t02n13:8888", "t03n01:8888", "t03n01:8889", "t03n02:8888"}}}},
                       {"task_id", 2},
                       {"env_after", json::object()}},
                      "grpc://t03n01:8889"));
  // slurm_cluster_resolver_test.py testSimpleSuccessfulRetrieval: an
  // integer tasks_per_node, no SLURM_STEP_TASKS_PER_NODE.
  c.push_back(ok_case("slurm_tasks_per_node_integer", "slurm",
                      {{"SLURM_PROCID", "0"},
                       {"SLURM_STEP_NUM_TASKS", "3"},
                       {"SLURM_STEP_NODELIST", "t02n13,t02n41,t02n43"}},
                      {{"jobs", {{"ps", 1}, {"worker", 2}}},
                       {"port_base", 8888},
                       {"tasks_per_node", 1},
                       {"gpus_per_node", 1},
                       {"gpus_per_task", 1},
                       {"auto_set_gpu", false}},
                      {{"cluster_spec", {{"ps", {"t02n13:8888"}}, {"worker", {"t02n41:8888", "t02n43:8888"}}}},
                       {"task_type", "ps"},
                       {"task_id", 0}},
                      "grpc://t02n13:8888"));
  // SlurmClusterResolver with tasks_per_node as a dict: only SLURM_PROCID
  // is read; nodes in name order.
  c.push_back(ok_case("slurm_tasks_per_node_map_alone", "slurm", {{"SLURM_PROCID", "2"}},
                      {{"tasks_per_node", {{"nb", 1}, {"na", 2}}}, {"gpus_per_node", 0}},
                      {{"cluster_spec", {{"worker", {"na:8888", "na:8889", "nb:8888"}}}}, {"task_id", 2}},
                      "grpc://nb:8888"));
  c.push_back(ok_case("slurm_job_fallbacks", "slurm",
                      edit(kStep4, {{"SLURM_STEP_NUM_TASKS", std::nullopt},
                                    {"SLURM_NTASKS", "4"},
                                    {"SLURM_STEP_NODELIST", std::nullopt},
                                    {"SLURM_JOB_NODELIST", "t02n13,t03n[01-02]"},
                                    {"SLURM_STEP_TASKS_PER_NODE", std::nullopt},
                                    {"SLURM_TASKS_PER_NODE", "2,1(x2)"}}),
                      json::object(), {{"cluster_spec", spec4}, {"task_id", 3}}, "grpc://t03n02:8888"));
  auto slurm_error = [&](std::string name, EnvEdits env, json options, std::vector<std::string> words) {
    Case e = ok_case(std::move(name), "slurm", std::move(env), std::move(options), json(), json());
    e.code = STRATA_ERR_INVALID_ARGUMENT;
    e.error = std::move(words);
    c.push_back(std::move(e));
  };
  slurm_error("slurm_err_gpus", kStep4, {{"gpus_per_task", 3}},
              {"requested more GPUs per node than available", "CUDA_VISIBLE_DEVICES"});
  slurm_error("slurm_err_jobs", kStep4, {{"jobs", {{"worker", 3}}}}, {"asks for 3", "has 4"});
  slurm_error("slurm_err_hostlist", edit(kStep4, {{"SLURM_STEP_NODELIST", "t03n[01-"}}), json::object(),
              {"SLURM_STEP_NODELIST", "never closed"});
  slurm_error("slurm_err_tasks_per_node", edit(kStep4, {{"SLURM_STEP_TASKS_PER_NODE", "2(x)"}}), json::object(),
              {"SLURM_STEP_TASKS_PER_NODE", "N(xM)"});
  slurm_error("slurm_err_rank", edit(kStep4, {{"SLURM_PROCID", "4"}}), json::object(),
              {"SLURM_PROCID=4", "out of range"});
  slurm_error("slurm_err_counts", edit(kStep4, {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}), json::object(),
              {"gives 2 node(s)", "lists 3"});
  slurm_error("slurm_err_no_procid", edit(kStep4, {{"SLURM_PROCID", std::nullopt}}), json::object(),
              {"SLURM_PROCID is not set", "srun"});
  slurm_error("slurm_err_option", kStep4, {{"gpus", 1}}, {"unknown option 'gpus'"});

  // ---- tpu
  const json two = {{"worker", {"10.0.0.2:8470", "10.0.0.3:8470"}}};
  c.push_back(ok_case("tpu_option_endpoints", "tpu", {}, {{"tpu", "grpc://10.0.0.2:8470,grpc://10.0.0.3"}},
                      {{"cluster_spec", two},
                       {"task_type", "worker"},
                       {"task_id", 0},
                       {"rpc_layer", "grpc"},
                       {"tpu", {{"source", "option 'tpu'"}}}},
                      "grpc://10.0.0.2:8470"));
  c.push_back(ok_case("tpu_kube_env", "tpu", {{"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "10.0.0.2,grpc://10.0.0.3:8470"}},
                      json::object(), {{"cluster_spec", two}, {"tpu", {{"source", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"}}}},
                      "grpc://10.0.0.2:8470"));
  c.push_back(ok_case("tpu_name_env", "tpu", {{"TPU_NAME", "grpc://10.0.0.2:8470,grpc://10.0.0.3:8470"}},
                      json::object(), {{"cluster_spec", two}, {"tpu", {{"source", "TPU_NAME"}}}},
                      "grpc://10.0.0.2:8470"));
  c.push_back(ok_case("tpu_precedence_option", "tpu",
                      {{"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "10.9.9.9"},
                       {"TPU_NAME", "grpc://10.8.8.8"},
                       {"TPU_CONFIG", R"({"tpu_node_name": "x"})"}},
                      {{"tpu", "grpc://10.0.0.2:8470,grpc://10.0.0.3"}}, {{"cluster_spec", two}},
                      "grpc://10.0.0.2:8470"));
  c.push_back(ok_case("tpu_precedence_kube", "tpu",
                      {{"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "10.0.0.2,10.0.0.3"}, {"TPU_NAME", "grpc://10.8.8.8"}},
                      json::object(), {{"cluster_spec", two}}, "grpc://10.0.0.2:8470"));
  c.push_back(ok_case("tpu_precedence_name", "tpu",
                      {{"TPU_NAME", "grpc://10.0.0.2,grpc://10.0.0.3"}, {"TPU_CONFIG", R"({"tpu_node_name": "x"})"}},
                      json::object(), {{"cluster_spec", two}}, "grpc://10.0.0.2:8470"));
  c.push_back(ok_case("tpu_local", "tpu", {}, {{"tpu", "local"}},
                      {{"cluster_spec", {{"worker", {"localhost:8470"}}}},
                       {"task_type", "worker"},
                       {"task_id", 0},
                       {"tpu", {{"local", true}}}},
                      nullptr));
  c.push_back(ok_case("tpu_empty_is_local", "tpu", {}, {{"tpu", ""}}, {{"tpu", {{"local", true}}}}, nullptr));
  c.push_back(ok_case(
      "tpu_job_and_coordinator", "tpu", {{"TPU_NAME", "grpc://[fd00::2]:9000"}},
      {{"job_name", "tpu_worker"}, {"coordinator_name", "coordinator"}, {"coordinator_address", "10.1.1.1:5000"}},
      {{"cluster_spec", {{"tpu_worker", {"[fd00::2]:9000"}}, {"coordinator", {"10.1.1.1:5000"}}}},
       {"task_type", "tpu_worker"}},
      "grpc://[fd00::2]:9000"));
  auto tpu_error = [&](std::string name, EnvEdits env, json options, strata_status_t code,
                       std::vector<std::string> words) {
    Case e = ok_case(std::move(name), "tpu", std::move(env), std::move(options), json(), json());
    e.code = code;
    e.error = std::move(words);
    c.push_back(std::move(e));
  };
  tpu_error("tpu_err_nothing", {}, json::object(), STRATA_ERR_INVALID_ARGUMENT,
            {"no TPU named", "TPU_NAME", "TPU_CONFIG", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"});
  tpu_error("tpu_err_coordinator", {}, {{"tpu", "grpc://h:1"}, {"coordinator_name", "coordinator"}},
            STRATA_ERR_INVALID_ARGUMENT, {"needs option 'coordinator_address'"});
  tpu_error("tpu_err_endpoint", {{"TPU_NAME", "grpc://h:notaport"}}, json::object(), STRATA_ERR_INVALID_ARGUMENT,
            {"TPU_NAME", "grpc://h:notaport", "8470"});
  tpu_error("tpu_err_config_json", {{"TPU_CONFIG", "{nope"}}, json::object(), STRATA_ERR_INVALID_ARGUMENT,
            {"TPU_CONFIG is not valid JSON", "tpu_node_name"});
  tpu_error("tpu_err_config_name", {{"TPU_CONFIG", R"({"project": "p"})"}}, json::object(), STRATA_ERR_INVALID_ARGUMENT,
            {"TPU_CONFIG has no \"tpu_node_name\""});
  tpu_error("tpu_err_lookup_needs_zone", {{"TPU_NAME", "my-tpu"}}, {{"project", "p"}}, STRATA_ERR_INVALID_ARGUMENT,
            {"TPU 'my-tpu'", "project and a zone", "grpc://"});
  tpu_error("tpu_err_https", {{"TPU_NAME", "my-tpu"}},
            {{"project", "p"}, {"zone", "z"}, {"api_endpoint", "https://tpu.googleapis.com"}},
            STRATA_ERR_INVALID_ARGUMENT, {"plain HTTP only", "grpc://"});
  tpu_error("tpu_err_bad_name", {{"TPU_NAME", "my tpu/../x"}}, {{"project", "p"}, {"zone", "z"}},
            STRATA_ERR_INVALID_ARGUMENT, {"neither grpc:// endpoints"});

  // ---- union
  const json simple_a = {{"name", "simple"},
                         {"options",
                          {{"cluster_spec", {{"worker", {"a:1", "b:1"}}}},
                           {"task_type", "worker"},
                           {"task_id", 1},
                           {"rpc_layer", "grpc"}}}};
  const json simple_ps = {{"name", "simple"},
                          {"options", {{"cluster_spec", {{"ps", {"p:1"}}}}, {"environment", "cloud"}}}};
  c.push_back(ok_case("union_merge", "union", {}, {{"resolvers", {simple_ps, simple_a}}},
                      {{"cluster_spec", {{"ps", {"p:1"}}, {"worker", {"a:1", "b:1"}}}},
                       {"task_type", "worker"},
                       {"task_id", 1},
                       {"rpc_layer", "grpc"},
                       {"environment", "cloud"},
                       {"union_of", {"resolver #0 'simple'", "resolver #1 'simple'"}}},
                      "grpc://b:1"));
  c.push_back(ok_case("union_same_job_same_tasks", "union", {}, {{"resolvers", {simple_a, simple_a}}},
                      {{"cluster_spec", {{"worker", {"a:1", "b:1"}}}}}, "grpc://b:1"));
  c.push_back(ok_case(
      "union_sparse_merge", "union", {},
      {{"resolvers",
        {{{"name", "simple"}, {"options", {{"cluster_spec", {{"worker", {{"0", "a:1"}}}}}}}},
         {{"name", "simple"},
          {"options", {{"cluster_spec", {{"worker", {{"1", "b:1"}}}}}, {"task_type", "worker"}, {"task_id", 1}}}}}}},
      {{"cluster_spec", {{"worker", {{"0", "a:1"}, {"1", "b:1"}}}}}, {"task_id", 1}}, "b:1"));
  c.push_back(ok_case("union_with_slurm", "union", kStep4,
                      {{"resolvers", {{{"name", "slurm"}, {"options", {{"jobs", {{"worker", 4}}}}}}, simple_ps}}},
                      {{"cluster_spec", {{"ps", {"p:1"}}, {"worker", spec4["worker"]}}},
                       {"task_type", "worker"},
                       {"task_id", 3},
                       {"environment", "cloud"},
                       {"env_after", {{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}}},
                      "grpc://t03n02:8888"));
  Case conflict =
      ok_case("union_err_conflict", "union", {},
              {{"resolvers", {simple_a, {{"name", "simple"}, {"options", {{"cluster_spec", {{"worker", {"c:1"}}}}}}}}}},
              json(), json());
  conflict.code = STRATA_ERR_INVALID_ARGUMENT;
  conflict.error = {"job 'worker'", "resolver #0 'simple'", "resolver #1 'simple'", "different tasks"};
  c.push_back(conflict);
  Case empty = ok_case("union_err_empty", "union", {}, {{"resolvers", json::array()}}, json(), json());
  empty.code = STRATA_ERR_INVALID_ARGUMENT;
  empty.error = {"non-empty list"};
  c.push_back(empty);
  Case child =
      ok_case("union_err_child", "union", {}, {{"resolvers", {simple_a, {{"name", "slurm"}}}}}, json(), json());
  child.code = STRATA_ERR_INVALID_ARGUMENT;
  child.error = {"resolver #1 'slurm'", "SLURM_PROCID is not set"};
  c.push_back(child);
  return c;
}

class ClusterResolversTest : public ::testing::TestWithParam<Case> {};

void expect_subset(const json& got, const json& want, const std::string& where) {
  for (auto it = want.begin(); it != want.end(); ++it) {
    ASSERT_TRUE(got.contains(it.key())) << it.key() << " missing in " << where << ": " << got.dump();
    if (it.value().is_object() && !it.value().empty() && it.key() != "cluster_spec" && it.key() != "num_accelerators" &&
        it.key() != "env_after")
      expect_subset(got[it.key()], it.value(), where);
    else
      EXPECT_EQ(got[it.key()], it.value()) << it.key() << " in " << where << ": " << got.dump();
  }
}

TEST_P(ClusterResolversTest, ThroughPluginHost) {
  const Case& c = GetParam();
  const Outcome o = via_plugin(c.resolver, c.env, c.options);
  if (c.code != STRATA_OK) {
    EXPECT_EQ(o.code, c.code) << o.message;
    for (const auto& w : c.error) EXPECT_NE(o.message.find(w), std::string::npos) << w << " not in: " << o.message;
    return;
  }
  ASSERT_EQ(o.code, STRATA_OK) << o.message;
  expect_subset(o.describe, c.expect, "describe()");
  EXPECT_EQ(o.master, c.master);
}

TEST_P(ClusterResolversTest, ThroughStrataInfoCluster) {
  const Case& c = GetParam();
  const test::ProcResult r = run_info(cluster_args(c.resolver, c.options), c.env);
  ASSERT_FALSE(r.timed_out);
  if (c.code != STRATA_OK) {
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.err.find(strata_status_string(c.code)), std::string::npos) << r.err;
    for (const auto& w : c.error) EXPECT_NE(r.err.find(w), std::string::npos) << w << " not in: " << r.err;
    return;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["resolver"], c.resolver);
  expect_subset(out, c.expect, "strata-info");
  EXPECT_EQ(out["master"], c.master);
  EXPECT_FALSE(out.contains("detection"));  // --resolver given: nothing was detected
}

INSTANTIATE_TEST_SUITE_P(Cases, ClusterResolversTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// ---- TPU name lookup through the (stand-in) Cloud TPU API -------------------

json lookup_options(const std::string& endpoint, double timeout_s = 5) {
  return {{"project", "proj"}, {"zone", "us-central1-b"}, {"api_endpoint", endpoint}, {"lookup_timeout_s", timeout_s}};
}

TEST(TpuLookupTest, ReadyNodeGivesItsEndpoints) {
  TinyHttpServer api(200,
                     R"({"name": "projects/proj/locations/us-central1-b/nodes/my-tpu", "state": "READY",
      "networkEndpoints": [{"ipAddress": "10.2.0.2", "port": 8470}, {"ipAddress": "10.2.0.3", "port": 8470}]})");
  const json want = {{"worker", {"10.2.0.2:8470", "10.2.0.3:8470"}}};
  const Outcome o = via_plugin("tpu", {{"TPU_NAME", "my-tpu"}}, lookup_options(api.endpoint()));
  ASSERT_EQ(o.code, STRATA_OK) << o.message;
  EXPECT_EQ(o.describe["cluster_spec"], want);
  EXPECT_EQ(o.master, "grpc://10.2.0.2:8470");
  EXPECT_EQ(o.describe["tpu"]["lookup"],
            "http://" + api.endpoint() + "/v1/projects/proj/locations/us-central1-b/nodes/my-tpu");
  ASSERT_FALSE(api.paths().empty());
  EXPECT_EQ(api.paths()[0], "/v1/projects/proj/locations/us-central1-b/nodes/my-tpu");
  // TPU_CONFIG names the node and its project and zone; TPU_API_ENDPOINT the
  // API.
  const auto r = run_info({"cluster", "--resolver", "tpu", "--option", "lookup_timeout_s=5"},
                          {{"TPU_CONFIG", R"({"tpu_node_name": "my-tpu", "project": "proj", "zone": "us-central1-b"})"},
                           {"TPU_API_ENDPOINT", "http://" + api.endpoint()}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["cluster_spec"], want);
  EXPECT_EQ(out["master"], "grpc://10.2.0.2:8470");
  EXPECT_EQ(out["tpu"]["source"], "TPU_CONFIG");
}

TEST(TpuLookupTest, NodeNotReadyIsAFailedPrecondition) {
  TinyHttpServer api(200, R"({"state": "CREATING", "networkEndpoints": []})");
  const Outcome o = via_plugin("tpu", {}, [&] {
    json j = lookup_options(api.endpoint());
    j["tpu"] = "my-tpu";
    return j;
  }());
  EXPECT_EQ(o.code, STRATA_ERR_FAILED_PRECONDITION) << o.message;
  EXPECT_NE(o.message.find("not ready (state CREATING"), std::string::npos) << o.message;
}

TEST(TpuLookupTest, UnknownNodeIsNotFound) {
  TinyHttpServer api(404, R"({"error": {"code": 404, "message": "not found"}})");
  const auto r = run_info({"cluster", "--resolver", "tpu", "--option", "project=\"proj\"", "--option", "zone=\"z\"",
                           "--option", "api_endpoint=\"" + api.endpoint() + "\""},
                          {{"TPU_NAME", "nope"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HTTP 404"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("grpc://"), std::string::npos) << r.err;  // says how to avoid the lookup
}

TEST(TpuLookupTest, ServerErrorIsUnavailable) {
  TinyHttpServer api(503, "overloaded");
  const Outcome o = via_plugin("tpu", {{"TPU_NAME", "my-tpu"}}, lookup_options(api.endpoint()));
  EXPECT_EQ(o.code, STRATA_ERR_UNAVAILABLE) << o.message;
  EXPECT_NE(o.message.find("HTTP 503"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("overloaded"), std::string::npos) << o.message;
}

TEST(TpuLookupTest, SilentServerFailsWithinTheDeadline) {
  TinyHttpServer api(200, "", /*silent=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome o = via_plugin("tpu", {{"TPU_NAME", "my-tpu"}}, lookup_options(api.endpoint(), 0.5));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.code, STRATA_ERR_DEADLINE_EXCEEDED) << o.message;
  EXPECT_NE(o.message.find("lookup_timeout_s"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("GET http://" + api.endpoint()), std::string::npos) << o.message;
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 5.0);
  EXPECT_EQ(api.paths().size(), 1u);  // it did reach the server
}

TEST(TpuLookupTest, RefusedPortIsUnavailable) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(test::unused_port());
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_info({"cluster", "--resolver", "tpu", "--option", "api_endpoint=\"" + endpoint + "\"", "--option",
                           "lookup_timeout_s=5"},
                          {{"TPU_CONFIG", R"({"tpu_node_name": "my-tpu", "project": "p", "zone": "z"})"}});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("UNAVAILABLE"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("connecting to 127.0.0.1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("TPU_NAME=grpc://"), std::string::npos) << r.err;
}

// ---- detection and the auto-detection order
// ----------------------------------

// ---- TPU master() -------------------------------------------------------------

/// master(type, id, layer) of a tpu resolver made from `options`.
std::string tpu_master(const json& options, const char* type, int32_t id, const char* layer) {
  ScopedEnv scoped(full_env({}));
  PluginInstance inst = PluginHost::global().create(STRATA_KIND_CLUSTER_RESOLVER, "tpu", options.dump());
  const auto* vt = inst.vtable_as<strata_resolver_vtable>();
  std::string out;
  strata_error err;
  strata_error_init(&err);
  detail::check_status(vt->master(static_cast<strata_resolver_t>(inst.handle()), type, id, layer, &append, &out, &err),
                       err, "master");
  return out;
}

// tpu_cluster_resolver_test.py testLocalTpuResolver, and
// TPUClusterResolver.master(): a local TPU's master is '' whatever task or
// layer is asked for; other TPUs give the task's address.
TEST(TpuMasterTest, LocalTpuHasNoMasterWhateverTheArguments) {
  for (const char* name : {"local", ""}) {
    EXPECT_EQ(tpu_master({{"tpu", name}}, nullptr, -1, nullptr), "") << name;
    EXPECT_EQ(tpu_master({{"tpu", name}}, "worker", 0, nullptr), "") << name;
    EXPECT_EQ(tpu_master({{"tpu", name}}, "worker", 0, "grpc"), "") << name;
  }
  EXPECT_EQ(tpu_master({{"tpu", "grpc://10.0.0.2:8470,grpc://10.0.0.3"}}, "worker", 1, nullptr),
            "grpc://10.0.0.3:8470");
}

TEST(ClusterDetectTest, EachResolverDetectsItsOwnEnvironment) {
  PluginHost& host = PluginHost::global();
  {
    ScopedEnv env(full_env({}));
    EXPECT_FALSE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "slurm"));
    EXPECT_FALSE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "tpu"));
    EXPECT_FALSE(host.detect(STRATA_KIND_CLUSTER_RESOLVER,
                             "union"));                                  // no detect(): never auto-chosen
    EXPECT_FALSE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "no_such"));  // not installed
    EXPECT_EQ(choose_cluster_resolver(host, "").name, "");
  }
  {
    ScopedEnv env(full_env({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NODELIST", "n1"}}));
    EXPECT_TRUE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "slurm"));
  }
  {
    ScopedEnv env(full_env({{"SLURM_PROCID", "0"}}));  // a batch script: not a job step
    EXPECT_FALSE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "slurm"));
  }
  for (const char* var : {"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_NAME", "TPU_CONFIG"}) {
    ScopedEnv env(full_env({{var, "x"}}));
    EXPECT_TRUE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "tpu")) << var;
    EXPECT_EQ(choose_cluster_resolver(host, "").name, "tpu") << var;
  }
  {
    ScopedEnv env(full_env({{"TPU_NAME", ""}}));  // empty counts as unset
    EXPECT_FALSE(host.detect(STRATA_KIND_CLUSTER_RESOLVER, "tpu"));
  }
  EXPECT_THROW(host.detect(STRATA_KIND_STRATEGY, "mirrored"), Error);
  EXPECT_EQ(cluster_resolver_detect_order(), (std::vector<std::string>{"slurm", "tf_config", "tpu"}));
}

const char* kTfConfig = R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})";

TEST(ClusterDetectTest, SlurmBeatsTfConfigWhichBeatsTpu) {
  struct Step {
    EnvEdits env;
    const char* chosen;
  };
  const std::vector<Step> steps = {
      {edit(kStep4, {{"TF_CONFIG", kTfConfig}, {"TPU_NAME", "grpc://t:1"}}), "slurm"},
      {{{"TF_CONFIG", kTfConfig}, {"TPU_NAME", "grpc://t:1"}}, "tf_config"},
      {{{"TPU_NAME", "grpc://t:1"}}, "tpu"},
      {{}, "local"},
      // A batch script (SLURM_PROCID=0, job variables, no job step) stays a
      // single process instead of waiting for peers srun never started.
      {{{"SLURM_PROCID", "0"}, {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
        {"SLURM_NTASKS", "4"}},
       "local"},
  };
  for (const auto& s : steps) {
    const auto r = run_info({"cluster"}, s.env);
    ASSERT_EQ(r.exit_code, 0) << s.chosen << ": " << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["resolver"], s.chosen);
    EXPECT_EQ(out["detection"]["chosen"], s.chosen);
    ASSERT_EQ(out["detection"]["order"].size(), 3u);
    EXPECT_EQ(out["detection"]["order"][0]["resolver"], "slurm");
    EXPECT_EQ(out["detection"]["order"][1]["resolver"], "tf_config");
    EXPECT_EQ(out["detection"]["order"][2]["resolver"], "tpu");
    EXPECT_FALSE(out["detection"]["reason"].get<std::string>().empty());
    if (s.env.count("SLURM_JOB_NODELIST")) {
      EXPECT_NE(out["detection"]["order"][0]["found"].get<std::string>().find("start the program with srun"),
                std::string::npos)
          << out.dump();
    }
    {
      ScopedEnv env(full_env(s.env));
      const ResolverChoice c = choose_cluster_resolver(PluginHost::global(), "");
      EXPECT_EQ(c.name.empty() ? std::string("local") : c.name,
                s.chosen);  // core decides the same
    }
  }
  const json slurm = json::parse(run_info({"cluster"}, edit(kStep4, {{"TF_CONFIG", kTfConfig}})).out);
  EXPECT_EQ(slurm["detection"]["reason"], "auto-detected: SLURM_PROCID and SLURM_STEP_NODELIST are set (a task of a job step)");
  EXPECT_EQ(slurm["task_id"], 3);
}

TEST(ClusterDetectTest, ExplicitConfigBeatsEveryDetection) {
  test::TempDir dir;
  const std::string cfg = dir.str() + "/job.json";
  std::ofstream(cfg) << R"({"cluster_resolver": {"name": "simple", "options": {
      "cluster_spec": {"worker": ["s:1"]}, "task_type": "worker", "task_id": 0}}})";
  const EnvEdits all = edit(kStep4, {{"TF_CONFIG", kTfConfig}, {"TPU_NAME", "grpc://t:1"}});
  auto r = run_info({"--config", cfg, "cluster"}, all);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["resolver"], "simple");
  EXPECT_EQ(out["master"], "s:1");
  EXPECT_TRUE(out["detection"]["order"].empty());
  EXPECT_NE(out["detection"]["reason"].get<std::string>().find("job config"), std::string::npos);
  // STRATA_CLUSTER_RESOLVER is an explicit choice too.
  r = run_info({"cluster"}, edit(all, {{"STRATA_CLUSTER_RESOLVER", "tf_config"}}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  out = json::parse(r.out);
  EXPECT_EQ(out["resolver"], "tf_config");
  EXPECT_EQ(out["master"], "b:1");
}

// strata-run inside a Slurm allocation: its children must resolve through
// the TF_CONFIG it gives them, not as Slurm tasks.
TEST(ClusterDetectTest, StrataRunChildrenUseTfConfigInsideSlurm) {
  EnvEdits env = full_env(kStep4);
  env["STRATA_LOG_LEVEL"] = "off";
  env["STRATA_PLUGIN_PATH"] = std::nullopt;
  const auto r =
      test::run_program({STRATA_RUN_BIN, "-n", "2", "--timeout", "60", "--", STRATA_INFO_BIN, "cluster"}, env, 90);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[" + std::to_string(rank) + "] ";
    std::string doc;
    std::size_t pos = 0;
    while (pos < r.out.size()) {
      std::size_t eol = r.out.find('\n', pos);
      if (eol == std::string::npos) eol = r.out.size();
      const std::string line = r.out.substr(pos, eol - pos);
      if (line.rfind(prefix, 0) == 0) doc += line.substr(prefix.size()) + "\n";
      pos = eol + 1;
    }
    const json out = json::parse(doc);
    EXPECT_EQ(out["resolver"], "tf_config") << doc;
    EXPECT_EQ(out["task_id"], rank);
    EXPECT_EQ(out["detection"]["order"][0]["found"], "SLURM_PROCID is not set");
  }
}

}  // namespace
}  // namespace strata
