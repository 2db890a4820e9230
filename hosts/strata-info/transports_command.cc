// SPDX-License-Identifier: Apache-2.0
#include "transports_command.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <iomanip>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/c/transport.h"
#include "strata/config.h"
#include "strata/error.hpp"
#include "../../transports/common/rdma_devices.h"

#if STRATA_HAVE_LIBFABRIC
#include <rdma/fabric.h>

#include "fabric_lib.h"
#endif

namespace {

using ojson = nlohmann::ordered_json;

ojson caps_json(const strata_transport_caps& c) {
  static const std::pair<uint64_t, const char*> kFlags[] = {
      {STRATA_TRANSPORT_CAP_P2P, "p2p"},
      {STRATA_TRANSPORT_CAP_RMA, "rma"},
      {STRATA_TRANSPORT_CAP_NATIVE_COLLECTIVES, "native_collectives"},
      {STRATA_TRANSPORT_CAP_MEM_HOST, "host_memory"},
      {STRATA_TRANSPORT_CAP_MEM_CUDA, "cuda_memory"},
      {STRATA_TRANSPORT_CAP_THREAD_SAFE, "thread_safe"},
      {STRATA_TRANSPORT_CAP_REQUIRES_MR, "requires_registration"},
  };
  ojson flags = ojson::array();
  for (const auto& [bit, name] : kFlags)
    if ((c.flags & bit) != 0) flags.push_back(name);
  return {{"flags", flags},
          {"max_inflight", c.max_inflight},
          {"max_message_bytes", c.max_message_bytes},
          {"preferred_chunk_bytes", c.preferred_chunk_bytes}};
}

// Create transport `name` with `options`, read its caps, release it.
// Returns {caps, ""} or {null, why it cannot run here}.
std::pair<ojson, std::string> probe(strata::PluginHost& host, const std::string& name, const std::string& options) {
  try {
    strata::PluginInstance inst = host.create(STRATA_KIND_TRANSPORT, name, options);
    const auto* vt = inst.vtable_as<strata_transport_vtable>();
    strata_transport_caps caps{};
    STRATA_INIT_HEADER(&caps, strata_transport_caps);
    strata_error err;
    strata_error_init(&err);
    strata::detail::check_status(vt->get_caps(static_cast<strata_transport_t>(inst.handle()), &caps, &err), err,
                                 "get_caps");
    return {caps_json(caps), ""};
  } catch (const strata::Error& e) {
    return {nullptr, std::string(e.code_name()) + ": " + e.what()};
  } catch (const std::exception& e) {
    return {nullptr, e.what()};
  }
}

ojson interfaces_json() {
  ojson out = ojson::array();
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int fam = a->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* src = fam == AF_INET ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr)
                                     : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    ::inet_ntop(fam, src, text, sizeof text);
    out.push_back({{"name", a->ifa_name},
                   {"family", fam == AF_INET ? "ipv4" : "ipv6"},
                   {"address", text},
                   {"up", (a->ifa_flags & IFF_UP) != 0},
                   {"loopback", (a->ifa_flags & IFF_LOOPBACK) != 0}});
  }
  ::freeifaddrs(list);
  return out;
}

// Where a libfabric provider moves data: a NIC, shared memory, or software
// over the kernel's network stack. Judged by the core provider (the name
// before ';', e.g. "verbs" in "verbs;ofi_rxm").
std::string provider_class(const std::string& prov) {
  const std::string core = prov.substr(0, prov.find(';'));
  static const std::set<std::string> kNic = {"verbs", "efa", "psm2", "psm3", "opx", "cxi", "usnic", "ucx", "gni"};
  if (kNic.count(core) != 0) return "nic";
  if (core == "shm" || core == "sm2") return "same-host";
  return "software";
}

#if STRATA_HAVE_LIBFABRIC
ojson bits_json(uint64_t v, std::initializer_list<std::pair<uint64_t, const char*>> names) {
  ojson out = ojson::array();
  for (const auto& [bit, name] : names)
    if ((v & bit) != 0) out.push_back(name);
  return out;
}

// libfabric through dlopen (fabric_lib.h): the command must run where it is
// not installed.
ojson libfabric_json(strata::PluginHost& host, bool have_plugin) {
  ojson out{{"library", nullptr}, {"error", nullptr}, {"providers", ojson::array()}};
  const strata::transport::libfabric::FabricLib& lf = strata::transport::libfabric::fabric_lib();
  if (!lf.ok()) {
    out["error"] = lf.error;
    return out;
  }
  const uint32_t v = lf.version();
  out["library"] = lf.library + " " + std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
  // Reliable datagram endpoints with tagged messages: the hints the libfabric
  // transport uses (transports/libfabric/libfabric_transport.h), so this
  // lists the providers it would accept.
  fi_info* hints = lf.dupinfo(nullptr);
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  fi_info* found = nullptr;
  const int rc = lf.getinfo(FI_VERSION(1, 10), nullptr, nullptr, 0, hints, &found);
  // Providers report the capabilities asked for: ask again with FI_RMA to
  // learn which of them also offer one-sided writes (the transport's iwrite).
  std::set<std::pair<std::string, std::string>> with_rma;
  hints->caps |= FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
  fi_info* rma = nullptr;
  if (lf.getinfo(FI_VERSION(1, 10), nullptr, nullptr, 0, hints, &rma) == 0) {
    for (const fi_info* i = rma; i != nullptr; i = i->next)
      with_rma.insert({i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "",
                       i->domain_attr->name ? i->domain_attr->name : ""});
    lf.freeinfo(rma);
  }
  lf.freeinfo(hints);
  if (rc != 0) {
    out["error"] =
        std::string("fi_getinfo found no reliable-datagram provider with tagged messages: ") + lf.strerror(-rc);
    return out;
  }
  std::set<std::pair<std::string, std::string>> seen;
  std::set<std::string> probed_names;
  for (const fi_info* i = found; i != nullptr; i = i->next) {
    const std::string prov = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
    const std::string domain = i->domain_attr->name ? i->domain_attr->name : "";
    if (!seen.insert({prov, domain}).second) continue;
    const uint64_t caps = i->caps | (with_rma.count({prov, domain}) != 0 ? FI_RMA : 0);
    ojson p{{"name", prov},
            {"fabric", i->fabric_attr->name ? i->fabric_attr->name : ""},
            {"domain", domain},
            {"class", provider_class(prov)},
            {"caps", bits_json(caps, {{FI_MSG, "msg"}, {FI_TAGGED, "tagged"}, {FI_RMA, "rma"},
                                         {FI_ATOMIC, "atomic"}, {FI_HMEM, "hmem"}, {FI_LOCAL_COMM, "local_comm"},
                                         {FI_REMOTE_COMM, "remote_comm"}})},
            {"mode", bits_json(i->mode, {{FI_CONTEXT, "FI_CONTEXT"}, {FI_CONTEXT2, "FI_CONTEXT2"},
                                         {FI_MSG_PREFIX, "FI_MSG_PREFIX"}})},
            {"mr_mode", bits_json(uint64_t(i->domain_attr->mr_mode),
                                  {{FI_MR_LOCAL, "FI_MR_LOCAL"}, {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
                                   {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"}, {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},
                                   {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"}, {FI_MR_HMEM, "FI_MR_HMEM"}})},
            {"max_msg_size", i->ep_attr->max_msg_size >= (uint64_t(1) << 62) ? ojson("unlimited")
                                                                              : ojson(uint64_t(i->ep_attr->max_msg_size))},
            {"plugin", nullptr}};
    out["providers"].push_back(std::move(p));
    probed_names.insert(prov);
  }
  lf.freeinfo(found);
  // Would the libfabric transport plugin itself run on each provider?
  for (auto& p : out["providers"]) {
    if (!have_plugin) {
      p["plugin"] = "the libfabric transport plugin is not installed";
      continue;
    }
    const auto [caps, why] = probe(host, "libfabric", ojson{{"provider", p["name"]}}.dump());
    p["plugin"] = why.empty() ? std::string("usable") : why;
  }
  return out;
}
#else
ojson libfabric_json(strata::PluginHost&, bool) {
  return {{"library", nullptr},
          {"error", "this build of Strata has no libfabric support (configure with libfabric-dev installed)"},
          {"providers", ojson::array()}};
}
#endif

// The choice "auto" makes by default (transports/auto): the same-host path
// is Strata's own "shmem" when that plugin runs here, else libfabric's shm
// provider when the libfabric transport runs on it, else tcp; the network
// path is libfabric on a NIC provider when there is one the transport
// accepts, else tcp.
ojson auto_json(const ojson& transports, const ojson& libfabric, bool have_libfabric_plugin) {
  ojson same{{"transport", "tcp"}, {"options", ojson::object()}, {"reason", ""}};
  ojson net{{"transport", "tcp"}, {"options", ojson::object()}, {"reason", ""}};
  std::string shm_why = have_libfabric_plugin ? "libfabric has no shm provider here" : "the libfabric transport plugin is not installed";
  for (const auto& p : libfabric["providers"]) {
    if (p["name"] == "shm") shm_why = p["plugin"] == "usable" ? "" : p["plugin"].get<std::string>();
    if (p["class"] == "nic" && p["plugin"] == "usable" && net["reason"] == "" && strata::transport::has_rdma_device()) {
      net = {{"transport", "libfabric"}, {"options", {{"provider", p["name"]}}},
             {"reason", "an RDMA provider (" + p["name"].get<std::string>() + ") is present"}};
    }
  }
  std::string shmem_why = "the shmem transport plugin is not installed";
  for (const auto& t : transports)
    if (t["name"] == "shmem") shmem_why = t["status"] == "usable" ? "" : t["error"].get<std::string>();
  if (shmem_why.empty()) {
    same = {{"transport", "shmem"}, {"options", ojson::object()},
            {"reason", "Strata's own shared memory runs here (/dev/shm, futex wake-ups, no sockets)"}};
  } else if (shm_why.empty()) {
    same = {{"transport", "libfabric"}, {"options", {{"provider", "shm"}}},
            {"reason", "libfabric's shm provider runs here (shared memory, no sockets); shmem cannot: " + shmem_why}};
  } else {
    same["reason"] = "loopback TCP, because no shared-memory path can run: shmem: " + shmem_why + "; libfabric/shm: " + shm_why;
  }
  if (net["reason"] == "")
    net["reason"] = strata::transport::has_rdma_device()
                        ? "no RDMA NIC provider (verbs, efa, psm2/psm3, opx, cxi, ...) is usable here"
                        : strata::transport::kNoRdmaDeviceReason;
  return {{"same_host", same}, {"network", net}};
}

std::string join(const ojson& arr, const char* sep = ", ") {
  std::string s;
  for (const auto& v : arr) s += (s.empty() ? "" : sep) + v.get<std::string>();
  return s.empty() ? "-" : s;
}

}  // namespace

CLI::App* add_transports_command(CLI::App& app, TransportsArgs& args) {
  CLI::App* sub = app.add_subcommand(
      "transports",
      "what each transport plugin can use on this machine: its capabilities or why it cannot run,\n"
      "the network interfaces, the libfabric providers (class, caps, registration modes) and whether\n"
      "the libfabric transport accepts each, and what \"transport\": \"auto\" chooses for peers on this\n"
      "host and for peers on other hosts. Creates each transport with default options; connects nowhere.\n"
      "Example: strata-info transports --json");
  sub->add_flag("--json", args.json, "print one JSON document instead of text");
  return sub;
}

ojson describe_transports(strata::PluginHost& host) {
  ojson doc;
  ojson list = ojson::array();
  bool have_libfabric_plugin = false;
  for (const strata::PluginInfo& i : host.discover()) {
    if (i.kind != "transport" && !(i.kind.empty() && i.path.find("libstrata-transport-") != std::string::npos))
      continue;
    ojson t{{"name", i.name}, {"path", i.path}, {"status", "rejected"}, {"caps", nullptr}, {"error", nullptr}};
    if (!i.ok) {
      t["error"] = i.error;
    } else {
      const auto [caps, why] = probe(host, i.name, "{}");
      t["status"] = why.empty() ? "usable" : "unusable";
      t["caps"] = caps;
      if (!why.empty()) t["error"] = why;
      if (i.name == "libfabric") have_libfabric_plugin = true;
    }
    list.push_back(std::move(t));
  }
  doc["transports"] = std::move(list);
  doc["interfaces"] = interfaces_json();
  doc["libfabric"] = libfabric_json(host, have_libfabric_plugin);
  doc["auto"] = auto_json(doc["transports"], doc["libfabric"], have_libfabric_plugin);
  return doc;
}

void print_transports(const ojson& doc, std::ostream& out) {
  out << "Transport plugins:\n";
  if (doc["transports"].empty()) out << "  (none found: check STRATA_PLUGIN_PATH or --plugin-path)\n";
  for (const auto& t : doc["transports"]) {
    out << "  " << std::left << std::setw(12) << (t["name"].get<std::string>().empty() ? "?" : t["name"].get<std::string>())
        << std::setw(10) << t["status"].get<std::string>() << t["path"].get<std::string>() << "\n";
    if (!t["caps"].is_null()) {
      const auto& c = t["caps"];
      out << "              caps: " << join(c["flags"]) << "; preferred chunk " << c["preferred_chunk_bytes"]
          << " B; max message "
          << (c["max_message_bytes"] == 0 ? std::string("unlimited") : c["max_message_bytes"].dump() + " B") << "\n";
    }
    if (!t["error"].is_null()) out << "              why: " << t["error"].get<std::string>() << "\n";
  }
  out << "\nNetwork interfaces:\n";
  for (const auto& i : doc["interfaces"])
    out << "  " << std::left << std::setw(12) << i["name"].get<std::string>() << std::setw(6)
        << i["family"].get<std::string>() << std::setw(28) << i["address"].get<std::string>()
        << (i["up"].get<bool>() ? "up" : "down") << (i["loopback"].get<bool>() ? ", loopback" : "") << "\n";
  const auto& lf = doc["libfabric"];
  out << "\nlibfabric: " << (lf["library"].is_null() ? std::string("-") : lf["library"].get<std::string>()) << "\n";
  if (!lf["error"].is_null()) out << "  " << lf["error"].get<std::string>() << "\n";
  for (const auto& p : lf["providers"]) {
    out << "  " << std::left << std::setw(14) << p["name"].get<std::string>() << std::setw(11)
        << p["class"].get<std::string>() << "fabric " << p["fabric"].get<std::string>() << ", domain "
        << p["domain"].get<std::string>() << "\n"
        << "                caps: " << join(p["caps"]) << "; mode: " << join(p["mode"]) << "; mr_mode: "
        << join(p["mr_mode"]) << "; max message "
        << (p["max_msg_size"].is_string() ? p["max_msg_size"].get<std::string>() : p["max_msg_size"].dump() + " B") << "\n"
        << "                libfabric transport: " << p["plugin"].get<std::string>() << "\n";
  }
  const auto& a = doc["auto"];
  auto path = [&](const char* what, const ojson& p) {
    out << "  " << what << p["transport"].get<std::string>()
        << (p["options"].empty() ? std::string() : " " + p["options"].dump()) << ": " << p["reason"].get<std::string>()
        << "\n";
  };
  out << "\n\"auto\" chooses per peer:\n";
  path("peers on this host:   ", a["same_host"]);
  path("peers on other hosts: ", a["network"]);
}
