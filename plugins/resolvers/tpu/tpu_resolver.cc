// SPDX-License-Identifier: Apache-2.0
// ClusterResolver "tpu": tf.distribute.cluster_resolver.TPUClusterResolver.
//
// The TPU is named by option "tpu", else KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS,
// else TPU_NAME, else TPU_CONFIG ({"tpu_node_name", "project", "zone"}).
// A name is one of:
//   - "grpc://10.0.0.2:8470,grpc://10.0.0.3" (KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS
//     may omit the grpc://): the endpoints, port 8470 when none is given;
//     they become the tasks of job "job_name" (default "worker");
//   - "local" or "": the TPU is attached to this machine, a single task;
//   - anything else: a Cloud TPU node name, looked up once at create time
//     with GET /v1/projects/P/locations/Z/nodes/NAME at option
//     "api_endpoint" (else TPU_API_ENDPOINT, else tpu.googleapis.com:80),
//     bounded by "lookup_timeout_s" (default 10). The node must be READY;
//     its networkEndpoints become the tasks.
// This process is task (job_name, 0), as in TF. "coordinator_name" adds a
// job of that name at "coordinator_address" (required with it). master()
// is the first endpoint as "grpc://host:port"; for a local TPU it is "",
// whatever the arguments, as in TF.
//
// The lookup speaks plain HTTP/1.1 without credentials: the real Cloud TPU
// API needs HTTPS and OAuth, so point api_endpoint at a local proxy or
// emulator that adds them, or pass grpc:// endpoints and skip the lookup.
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cluster_spec.h"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"

namespace {

namespace asio = boost::asio;
using nlohmann::json;

constexpr const char* kComponent = "cluster resolver 'tpu'";
constexpr const char* kDefaultPort = "8470";
constexpr const char* kDefaultApi = "tpu.googleapis.com:80";
constexpr std::size_t kMaxResponse = 4u << 20;
constexpr const char* kAvoidLookup =
    "to skip the lookup, pass the TPU's endpoints instead, e.g. --option "
    "'tpu=\"grpc://10.0.0.2:8470\"' or "
    "TPU_NAME=grpc://10.0.0.2:8470";

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  return std::string(v);
}

bool valid_port(const std::string& p) {
  if (p.empty() || p.size() > 5) return false;
  for (char c : p)
    if (c < '0' || c > '9') return false;
  const int v = std::stoi(p);
  return v >= 1 && v <= 65535;
}

// "grpc://h:p,grpc://h2" -> {"h:p", "h2:8470"}; "[::1]:p" keeps its brackets.
std::vector<std::string> parse_endpoints(const std::string& text, const std::string& origin) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string e = text.substr(start, comma - start);
    if (e.rfind("grpc://", 0) == 0) e = e.substr(7);
    std::string host = e, port = kDefaultPort;
    if (!e.empty() && e[0] == '[') {
      const auto close = e.find(']');
      if (close == std::string::npos || (close + 1 < e.size() && e[close + 1] != ':'))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": endpoint '", e,
                     "' is not [ipv6]:port; write e.g. grpc://[fd00::2]:8470");
      host = e.substr(0, close + 1);
      if (close + 1 < e.size()) port = e.substr(close + 2);
    } else if (const auto colon = e.find(':'); colon != std::string::npos) {
      host = e.substr(0, colon);
      port = e.substr(colon + 1);
    }
    if (host.empty() || host == "[]" || !valid_port(port) || host.find_first_of("/ ") != std::string::npos)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": endpoint '", text.substr(start, comma - start),
                   "' is not host[:port]; write a comma-separated list such as "
                   "grpc://10.0.0.2:8470,grpc://10.0.0.3:8470 (the port "
                   "defaults to 8470)");
    out.push_back(host + ":" + port);
    start = comma + 1;
  }
  return out;
}

struct HttpResponse {
  int status = 0;
  std::string body;
};

std::string decode_chunked(const std::string& body, const std::string& what) {
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const auto eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    std::size_t size = 0;
    try {
      size = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    } catch (const std::exception&) {
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, " answered a malformed chunked body");
    }
    if (size == 0) return out;
    if (eol + 2 + size > body.size()) break;
    out.append(body, eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, " closed the connection in the middle of a chunked body");
}

// getaddrinfo cannot be cancelled, and asio's resolver joins its worker
// thread on destruction, so a hung DNS server would outlast any deadline.
// The lookup runs on a detached thread that owns its state; the caller
// waits until the deadline and then leaves it behind (it ends when
// getaddrinfo returns; the plugin library is never unloaded before exit).
asio::ip::tcp::resolver::results_type resolve_bounded(const std::string& host, const std::string& port,
                                                      std::chrono::milliseconds timeout, const std::string& what) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    boost::system::error_code ec;
    asio::ip::tcp::resolver::results_type results;
  };
  auto state = std::make_shared<State>();
  std::thread([state, host, port] {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    boost::system::error_code ec;
    auto results = resolver.resolve(host, port, ec);
    std::lock_guard<std::mutex> l(state->mu);
    state->ec = ec;
    state->results = std::move(results);
    state->done = true;
    state->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(state->mu);
  if (!state->cv.wait_for(l, timeout, [&] { return state->done; }))
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, what, ": resolving ", host, " took longer than ",
                 timeout.count() / 1000.0,
                 " s (option lookup_timeout_s); check DNS or use an IP address in "
                 "api_endpoint, or ",
                 kAvoidLookup);
  if (state->ec)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": failed resolving ", host, ":", port, " (", state->ec.message(),
                 "); check option api_endpoint / TPU_API_ENDPOINT, or ", kAvoidLookup);
  return state->results;
}

// One bounded GET over plain HTTP/1.1 ("Connection: close", body read to
// EOF). Every step (resolve, connect, write, read) shares one deadline: the
// io_context runs for what is left of `timeout` after resolving, then every
// pending operation is cancelled by destroying it.
HttpResponse http_get(const std::string& host, const std::string& port, const std::string& target,
                      std::chrono::milliseconds timeout, const std::string& what) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  const std::string request = "GET " + target + " HTTP/1.1\r\nHost: " + host + ":" + port +
                              "\r\nAccept: application/json\r\nUser-Agent: strata-tpu-resolver\r\n"
                              "Connection: close\r\n\r\n";
  std::string raw;
  std::array<char, 8192> buf{};
  boost::system::error_code failure;
  std::string failed_step;
  bool done = false;
  auto fail = [&](const char* step, const boost::system::error_code& ec) {
    failure = ec;
    failed_step = step;
    done = true;
  };
  std::function<void()> read_some = [&] {
    socket.async_read_some(asio::buffer(buf), [&](const boost::system::error_code& ec, std::size_t n) {
      raw.append(buf.data(), n);
      if (ec == asio::error::eof) {
        done = true;
      } else if (ec) {
        fail("reading the answer from", ec);
      } else if (raw.size() > kMaxResponse) {
        fail("reading the answer from", asio::error::message_size);
      } else {
        read_some();
      }
    });
  };
  // Name resolution first, bounded by the same deadline (see resolve_bounded).
  const auto start = std::chrono::steady_clock::now();
  const asio::ip::tcp::resolver::results_type results = resolve_bounded(host, port, timeout, what);
  const auto left =
      timeout - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  asio::async_connect(socket, results, [&](const boost::system::error_code& ec2, const asio::ip::tcp::endpoint&) {
    if (ec2) return fail("connecting to", ec2);
    asio::async_write(socket, asio::buffer(request), [&](const boost::system::error_code& ec3, std::size_t) {
      if (ec3) return fail("sending the request to", ec3);
      read_some();
    });
  });
  if (left.count() > 0) io.run_for(left);
  if (!done)
    STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, what, ": no complete answer within ", timeout.count() / 1000.0,
                 " s (option lookup_timeout_s); check that the API endpoint "
                 "answers, raise lookup_timeout_s, or ",
                 kAvoidLookup);
  if (failure)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": failed ", failed_step, " ", host, ":", port, " (", failure.message(),
                 "); check option api_endpoint / TPU_API_ENDPOINT, or ", kAvoidLookup);

  HttpResponse r;
  const auto header_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || header_end == std::string::npos || raw.size() < 12)
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": the answer from ", host, ":", port,
                 " is not an HTTP response (does api_endpoint name an HTTP server?); ", kAvoidLookup);
  try {
    r.status = std::stoi(raw.substr(9, 3));
  } catch (const std::exception&) {
    STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": the answer from ", host, ":", port, " has no HTTP status");
  }
  std::string headers = raw.substr(0, header_end);
  for (auto& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.body = raw.substr(header_end + 4);
  if (headers.find("transfer-encoding: chunked") != std::string::npos) r.body = decode_chunked(r.body, what);
  return r;
}

class TpuResolver final : public strata::sdk::ResolverBase {
 public:
  static constexpr const char* kSubsystem = "resolver.tpu";

  TpuResolver(strata::sdk::Host host, const char* options_json) {
    const json opts = strata::sdk::parse_options(options_json, kComponent);
    strata::sdk::check_known_keys(opts,
                                  {"tpu", "zone", "project", "job_name", "coordinator_name", "coordinator_address",
                                   "rpc_layer", "api_endpoint", "lookup_timeout_s"},
                                  kComponent);
    auto text = [&](const char* key) -> std::optional<std::string> {
      if (!opts.contains(key) || opts[key].is_null()) return std::nullopt;
      return strata::sdk::get_option<std::string>(opts, key, "", kComponent);
    };
    const std::string job = text("job_name").value_or("worker");
    if (job.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'job_name' of ", kComponent,
                   " is empty; name the TPU workers' job, e.g. \"worker\"");
    std::optional<std::string> project = text("project"), zone = text("zone");

    // Which TPU, and where the name came from (for messages).
    std::optional<std::string> name = text("tpu");
    source_ = "option 'tpu'";
    bool endpoint_list = false;
    if (!name) {
      if ((name = env_value("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"))) {
        source_ = "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS";
        endpoint_list = true;  // GKE lists endpoints, with or without grpc://
      } else if ((name = env_value("TPU_NAME"))) {
        source_ = "TPU_NAME";
      } else if (auto cfg = env_value("TPU_CONFIG")) {
        source_ = "TPU_CONFIG";
        json doc;
        try {
          doc = json::parse(*cfg);
        } catch (const json::exception& e) {
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TPU_CONFIG is not valid JSON (", e.what(),
                       "); set it like {\"tpu_node_name\": \"my-tpu\", "
                       "\"project\": \"p\", \"zone\": "
                       "\"us-central1-b\"}");
        }
        auto field = [&](const char* key) -> std::optional<std::string> {
          if (!doc.is_object() || !doc.contains(key) || doc[key].is_null()) return std::nullopt;
          if (!doc[key].is_string())
            STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TPU_CONFIG \"", key, "\" must be a string, got ",
                         doc[key].dump());
          return doc[key].get<std::string>();
        };
        if (!doc.is_object() || !field("tpu_node_name"))
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                       "TPU_CONFIG has no \"tpu_node_name\"; set it like "
                       "{\"tpu_node_name\": \"my-tpu\", \"project\": \"p\", "
                       "\"zone\": \"us-central1-b\"}");
        name = field("tpu_node_name");
        if (!project) project = field("project");
        if (!zone) zone = field("zone");
      } else {
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                     "no TPU named: the tpu cluster resolver takes the TPU "
                     "from option 'tpu', "
                     "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_NAME or TPU_CONFIG "
                     "and none is set; pass e.g. "
                     "--option 'tpu=\"grpc://10.0.0.2:8470\"', or \"local\" "
                     "for a TPU on this machine");
      }
    }
    name_ = *name;

    std::vector<std::string> endpoints;
    if (!endpoint_list && (name_.empty() || name_ == "local")) {
      local_ = true;
      endpoints.push_back(std::string("localhost:") + kDefaultPort);
    } else if (endpoint_list || name_.rfind("grpc://", 0) == 0) {
      endpoints = parse_endpoints(name_, source_);
    } else {
      endpoints = lookup(host, opts, project, zone);
    }

    json spec = json::object();
    spec[job] = endpoints;
    const auto coordinator = text("coordinator_name");
    const auto coordinator_address = text("coordinator_address");
    if (coordinator) {
      if (coordinator->empty() || *coordinator == job)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'coordinator_name' of ", kComponent,
                     " must be a job "
                     "name other than the TPU job '",
                     job, "', e.g. \"coordinator\"");
      if (!coordinator_address || coordinator_address->empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'coordinator_name' (\"", *coordinator,
                     "\") needs option 'coordinator_address' (\"host:port\" of "
                     "the coordinator)");
      spec[*coordinator] = json::array({*coordinator_address});
    } else if (coordinator_address) {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'coordinator_address' of ", kComponent,
                   " needs option 'coordinator_name' as well, e.g. \"coordinator\"");
    }
    r_.cluster = strata::resolvers::parse_cluster_spec(spec, "the tpu resolver's cluster");
    r_.task_type = job;
    r_.task_id = 0;
    r_.rpc_layer = std::string("grpc");
    if (opts.contains("rpc_layer")) {
      if (opts["rpc_layer"].is_null() || opts["rpc_layer"] == "")
        r_.rpc_layer.reset();
      else
        r_.rpc_layer = text("rpc_layer");
    }
    r_.validate("the tpu resolver");
    host.debug("TPU '", name_, "' from ", source_, ": ", spec.dump());
  }

  std::string describe() override {
    json j = r_.describe();
    j["tpu"] = {{"name", name_},
                {"source", source_},
                {"local", local_},
                {"lookup", lookup_url_.empty() ? json() : json(lookup_url_)}};
    return j.dump();
  }

  std::string master(const char* task_type, int32_t task_id, const char* rpc_layer) override {
    // TF's master() of a local TPU is '' (the in-process session), whatever
    // task or layer is asked for.
    if (local_) return "";
    return r_.master(task_type, task_id, rpc_layer, "the tpu resolver");
  }

  /// A TPU environment: one of the variables that can name the TPU.
  static bool detect(const strata::sdk::Host&) {
    return env_value("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS") || env_value("TPU_NAME") || env_value("TPU_CONFIG");
  }

 private:
  std::vector<std::string> lookup(const strata::sdk::Host& host, const json& opts,
                                  const std::optional<std::string>& project, const std::optional<std::string>& zone) {
    for (char c : name_)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, source_, " '", name_,
                     "' is neither grpc:// endpoints, \"local\" "
                     "nor a TPU node name (letters, digits, '-', '_', '.'); ",
                     kAvoidLookup);
    if (!project || !zone || project->empty() || zone->empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "TPU '", name_, "' (from ", source_,
                   ") must be looked up "
                   "through the Cloud TPU API, which needs a project and a "
                   "zone: pass options project and zone "
                   "(or set them in TPU_CONFIG); Strata does not ask the GCE "
                   "metadata server. Or ",
                   kAvoidLookup);
    const double timeout_s = strata::sdk::get_option<double>(opts, "lookup_timeout_s", 10.0, kComponent);
    if (!(timeout_s > 0 && timeout_s <= 3600))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'lookup_timeout_s' of ", kComponent,
                   " must be in (0, 3600] seconds, got ", timeout_s);
    std::string api = kDefaultApi;
    std::string api_source = "the default";
    if (opts.contains("api_endpoint") && !opts["api_endpoint"].is_null()) {
      api = strata::sdk::get_option<std::string>(opts, "api_endpoint", "", kComponent);
      api_source = "option 'api_endpoint'";
    } else if (auto e = env_value("TPU_API_ENDPOINT")) {
      api = *e;
      api_source = "TPU_API_ENDPOINT";
    }
    if (api.rfind("https://", 0) == 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, api_source, " '", api,
                   "' is HTTPS; this resolver's lookup speaks "
                   "plain HTTP only: point it at an HTTP proxy or emulator "
                   "(http://host:port), or ",
                   kAvoidLookup);
    if (api.rfind("http://", 0) == 0) api = api.substr(7);
    if (!api.empty() && api.back() == '/') api.pop_back();
    std::string api_host = api, api_port = "80";
    if (const auto colon = api.rfind(':'); colon != std::string::npos && api.find(']', colon) == std::string::npos) {
      api_host = api.substr(0, colon);
      api_port = api.substr(colon + 1);
    }
    if (!api_host.empty() && api_host.front() == '[' && api_host.back() == ']')
      api_host = api_host.substr(1, api_host.size() - 2);
    if (api_host.empty() || !valid_port(api_port) || api_host.find('/') != std::string::npos)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, api_source, " '", api,
                   "' is not host:port (e.g. "
                   "127.0.0.1:8080 or tpu.googleapis.com:80)");
    const std::string target = "/v1/projects/" + *project + "/locations/" + *zone + "/nodes/" + name_;
    lookup_url_ = "http://" + api + target;
    const std::string what = "looking up TPU '" + name_ + "' (from " + source_ + ") with GET " + lookup_url_;
    host.info(what);
    const HttpResponse resp =
        http_get(api_host, api_port, target, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), what);
    if (resp.status == 404)
      STRATA_THROW(STRATA_ERR_NOT_FOUND, what, ": HTTP 404, no TPU of that name in project '", *project, "' zone '",
                   *zone, "'; check the name, project and zone, or ", kAvoidLookup);
    if (resp.status != 200)
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": HTTP ", resp.status, " (", resp.body.substr(0, 200),
                   "); fix the cause the API names, or ", kAvoidLookup);
    json node;
    try {
      node = json::parse(resp.body);
    } catch (const json::exception& e) {
      STRATA_THROW(STRATA_ERR_UNAVAILABLE, what, ": the answer is not JSON (", e.what(), "); ", kAvoidLookup);
    }
    const std::string state = node.is_object() && node.value("state", json()).is_string()
                                  ? node["state"].get<std::string>()
                                  : std::string("(none)");
    if (state != "READY")
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "TPU '", name_, "' is not ready (state ", state, ", from GET ",
                   lookup_url_, "); wait until it is READY and start again");
    std::vector<std::string> out;
    const json eps = node.value("networkEndpoints", json::array());
    if (eps.is_array()) {
      for (const json& e : eps) {
        if (!e.is_object() || !e.value("ipAddress", json()).is_string()) continue;
        std::string port = kDefaultPort;
        if (e.contains("port") && e["port"].is_number_integer())
          port = std::to_string(e["port"].get<int64_t>());
        else if (e.contains("port") && e["port"].is_string())
          port = e["port"].get<std::string>();
        const std::string ip = e["ipAddress"].get<std::string>();
        out.push_back((ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":" + port);
      }
    }
    if (out.empty())
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "TPU '", name_,
                   "' is READY but lists no networkEndpoints "
                   "with an ipAddress (GET ",
                   lookup_url_, "); ", kAvoidLookup);
    return out;
  }

  strata::resolvers::Resolution r_;
  std::string name_;
  std::string source_;
  std::string lookup_url_;
  bool local_ = false;
};

}  // namespace

STRATA_PLUGIN("strata tpu cluster resolver", "1.0.0", STRATA_RESOLVER_COMPONENT(TpuResolver, "tpu", "1.0.0"))
