// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the Slurm resolver's parsers and resolution. The input
// is "hostlist\ntasks-per-node\nprocid\noptions-json\ndistribution" (missing
// lines are unset; plane uses SLURM_DIST_PLANESIZE=2). Any input must either
// resolve consistently or be rejected with INVALID_ARGUMENT; anything else
// (a crash, another exception, a task placed outside the expanded node list,
// running out of memory) aborts so libFuzzer reports it.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "slurm.h"
#include "strata/error.hpp"

namespace {

std::vector<std::string> lines(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (out.size() < 5) {
    const std::size_t nl = text.find('\n', start);
    out.emplace_back(text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::resolvers;
  if (size > 4096) return 0;  // node lists are short; long inputs only slow the search
  const std::vector<std::string> l = lines(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const std::vector<std::string> hosts = expand_hostlist(l[0], "SLURM_STEP_NODELIST");
    if (hosts.empty() || hosts.size() > kMaxHosts) std::abort();
    if (l.size() < 2) return 0;
    const std::vector<int32_t> tasks = expand_tasks_per_node(l[1], "SLURM_STEP_TASKS_PER_NODE");
    for (int32_t t : tasks)
      if (t <= 0) std::abort();
    if (l.size() < 3 || hosts.size() > 4096) return 0;
    SlurmEnv env;
    env.nodelist = l[0];
    env.tasks_per_node = l[1];
    env.procid = l[2];
    env.cuda_visible_devices = std::string();
    if (l.size() > 4) {
      env.distribution = l[4];
      env.plane_size = "2";
    }
    nlohmann::json options = nlohmann::json::object();
    if (l.size() > 3) {
      options = nlohmann::json::parse(l[3], nullptr, false);
      if (options.is_discarded()) return 0;
    }
    const SlurmResult r = resolve_slurm(env, options, [] { return 0; });
    bool found = false;
    for (const auto& h : r.hosts) found = found || h == r.node;
    if (!found || r.local_index < 0) std::abort();
    (void)r.describe().dump();
  } catch (const strata::Error& e) {
    if (e.code() != STRATA_ERR_INVALID_ARGUMENT) std::abort();
  }
  return 0;
}
