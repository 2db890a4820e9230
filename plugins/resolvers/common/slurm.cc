// SPDX-License-Identifier: Apache-2.0
#include "slurm.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "strata/error.hpp"

extern char** environ;

namespace strata::resolvers {
namespace {

constexpr const char* kHostlistExample = "t02n13,t02n41,t03n[01-03]";

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  return std::string(v);
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Decimal digits only (no sign, no spaces), at most 18 of them so the value
// fits.
std::optional<uint64_t> parse_decimal(std::string_view s) {
  if (!all_digits(s) || s.size() > 18) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<uint64_t>(c - '0');
  return v;
}

std::string pad(uint64_t v, std::size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// One bracket group "1-3,07" -> {"1","2","3","07"}.
std::vector<std::string> expand_group(std::string_view group, std::string_view item, const std::string& origin) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= group.size()) {
    std::size_t comma = group.find(',', start);
    if (comma == std::string_view::npos) comma = group.size();
    const std::string_view part = group.substr(start, comma - start);
    const std::size_t dash = part.find('-');
    const std::string_view lo_text = part.substr(0, dash);
    const std::string_view hi_text = dash == std::string_view::npos ? lo_text : part.substr(dash + 1);
    const auto lo = parse_decimal(lo_text);
    const auto hi = parse_decimal(hi_text);
    if (!lo || !hi)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": bracket group [", group, "] in '", item, "' has the entry '",
                   part,
                   "'; entries are numbers or ranges such as 01-03 "
                   "(e.g. ",
                   kHostlistExample, ")");
    if (*hi < *lo)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": range ", part, " in '", item,
                   "' runs backwards; write the lower bound first (e.g. [01-03])");
    if (*hi - *lo >= kMaxHosts || out.size() + (*hi - *lo) >= kMaxHosts)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": range ", part, " in '", item, "' has more than ", kMaxHosts,
                   " hosts, which no real node list has; pass the step's nodes, e.g. ", kHostlistExample);
    for (uint64_t v = *lo; v <= *hi; ++v) out.push_back(pad(v, lo_text.size()));
    start = comma + 1;
  }
  return out;
}

// One hostlist item (no top-level commas): literal text and bracket groups.
void expand_item(std::string_view item, const std::string& origin, std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  std::size_t i = 0;
  while (i < item.size()) {
    if (item[i] == '[') {
      const std::size_t close = item.find(']', i);  // nesting was rejected by the caller
      const std::vector<std::string> alts = expand_group(item.substr(i + 1, close - i - 1), item, origin);
      if (partial.size() * alts.size() + out.size() > kMaxHosts)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, ": '", item, "' expands to more than ", kMaxHosts,
                     " hosts, which no real node list has; pass the step's nodes, e.g. ", kHostlistExample);
      std::vector<std::string> next;
      next.reserve(partial.size() * alts.size());
      for (const auto& p : partial)
        for (const auto& a : alts) next.push_back(p + a);
      partial.swap(next);
      i = close + 1;
    } else {
      const std::size_t stop = std::min(item.find('[', i), item.size());
      for (auto& p : partial) p.append(item.substr(i, stop - i));
      i = stop;
    }
  }
  for (auto& p : partial) out.push_back(std::move(p));
}

int32_t option_int(const nlohmann::json& opts, const char* key, int32_t fallback, int32_t min, int32_t max) {
  auto it = opts.find(key);
  if (it == opts.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option '", key, "' of the slurm resolver must be an integer from ", min,
                 " to ", max, ", got ", it->dump());
  return static_cast<int32_t>(it->get<int64_t>());
}

// CUDA_VISIBLE_DEVICES entries: CUDA stops at the first invalid entry, and
// Slurm writes "NoDevFiles" when the step has no GPU.
std::vector<std::string> visible_list(const std::string& value) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    std::string entry = value.substr(start, comma - start);
    entry.erase(0, entry.find_first_not_of(' '));
    entry.erase(entry.find_last_not_of(' ') + 1);
    if (entry.empty() || entry[0] == '-' || entry == "NoDevFiles") break;
    out.push_back(entry);
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list, const std::string& origin) {
  if (list.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " is empty; it must list the job's nodes, e.g. ",
                 kHostlistExample);
  std::vector<std::string> out;
  std::size_t item_start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (i < list.size() && (c == ' ' || c == '\t' || c == '\n' || c == '\r'))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", list, "' contains whitespace at position ", i,
                   "; a hostlist is comma-separated without spaces, e.g. ", kHostlistExample);
    // Node names become cluster addresses (and JSON strings): only what a
    // host name may hold. The list is not echoed, as it may not be text.
    const auto u = static_cast<unsigned char>(c);
    if (i < list.size() && !std::isalnum(u) && c != '-' && c != '_' && c != '.' && c != '[' && c != ']' && c != ',') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", u);
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " has the character ", hex, " at position ", i,
                   "; node names hold letters, digits, '-', '_' and '.', e.g. ", kHostlistExample);
    }
    if (c == '[') {
      if (depth != 0)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", list, "' has a '[' inside brackets at position ", i,
                     "; bracket groups do not nest (e.g. ", kHostlistExample, ")");
      depth = 1;
    } else if (c == ']') {
      if (depth == 0)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", list, "' has an unmatched ']' at position ", i,
                     "; open each group with '[' (e.g. ", kHostlistExample, ")");
      depth = 0;
    } else if (c == ',' && depth == 0) {
      const std::string_view item = list.substr(item_start, i - item_start);
      if (item.empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", list, "' has an empty host name at position ",
                     item_start, "; remove the extra comma (e.g. ", kHostlistExample, ")");
      expand_item(item, origin, out);
      item_start = i + 1;
    }
    if (i == list.size() && depth != 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", list,
                   "' has a '[' that is never closed; close "
                   "each group with ']' (e.g. ",
                   kHostlistExample, ")");
  }
  return out;
}

std::vector<int32_t> expand_tasks_per_node(std::string_view text, const std::string& origin) {
  constexpr const char* kExample = "2(x3),1 (three nodes with 2 tasks, then one with 1)";
  if (text.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " is empty; it must give the tasks of each node, e.g. ",
                 kExample);
  std::vector<int32_t> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(start, comma - start);
    std::string_view count_text = item, times_text = "1";
    if (const std::size_t paren = item.find('('); paren != std::string_view::npos) {
      count_text = item.substr(0, paren);
      const std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')')
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", text, "' has the entry '", item,
                     "'; a repeated count is written N(xM), e.g. ", kExample);
      times_text = rest.substr(2, rest.size() - 3);
    }
    const auto count = parse_decimal(count_text);
    const auto times = parse_decimal(times_text);
    if (!count || !times || *count == 0 || *times == 0 || *count > INT32_MAX)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", text, "' has the entry '", item,
                   "'; each entry is a positive task count N or N(xM), e.g. ", kExample);
    if (*times > kMaxHosts || out.size() + *times > kMaxHosts)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, origin, " '", text, "' describes more than ", kMaxHosts,
                   " nodes; this is not a real tasks-per-node list");
    out.insert(out.end(), static_cast<std::size_t>(*times), static_cast<int32_t>(*count));
    start = comma + 1;
  }
  return out;
}

std::vector<TaskPlace> lay_out_tasks(const std::vector<int32_t>& tasks_per_node, const std::string& distribution,
                                     int64_t plane_size) {
  std::vector<TaskPlace> out;
  std::vector<int32_t> used(tasks_per_node.size(), 0);
  int64_t total = 0;
  for (int32_t n : tasks_per_node) total += n;
  out.reserve(static_cast<std::size_t>(total));
  if (distribution == "block") {
    for (std::size_t i = 0; i < tasks_per_node.size(); ++i)
      for (int32_t k = 0; k < tasks_per_node[i]; ++k) out.push_back({static_cast<int32_t>(i), k});
    return out;
  }
  // cyclic is plane with blocks of 1: round-robin over the nodes with room.
  const int64_t block = distribution == "cyclic" ? 1 : plane_size;
  std::size_t node = 0;
  while (static_cast<int64_t>(out.size()) < total) {
    while (used[node] >= tasks_per_node[node]) node = (node + 1) % tasks_per_node.size();
    for (int64_t k = 0; k < block && used[node] < tasks_per_node[node]; ++k)
      out.push_back({static_cast<int32_t>(node), used[node]++});
    node = (node + 1) % tasks_per_node.size();
  }
  return out;
}

SlurmEnv SlurmEnv::from_environment() {
  SlurmEnv e;
  e.distribution = env_value("SLURM_DISTRIBUTION");
  e.plane_size = env_value("SLURM_DIST_PLANESIZE");
  e.procid = env_value("SLURM_PROCID");
  e.num_tasks = env_value("SLURM_STEP_NUM_TASKS");
  if (!e.num_tasks) {
    e.num_tasks = env_value("SLURM_NTASKS");
    if (e.num_tasks) e.num_tasks_var = "SLURM_NTASKS";
  }
  e.nodelist = env_value("SLURM_STEP_NODELIST");
  if (!e.nodelist) {
    e.nodelist = env_value("SLURM_JOB_NODELIST");
    if (e.nodelist) e.nodelist_var = "SLURM_JOB_NODELIST";
  }
  e.tasks_per_node = env_value("SLURM_STEP_TASKS_PER_NODE");
  if (!e.tasks_per_node) {
    e.tasks_per_node = env_value("SLURM_TASKS_PER_NODE");
    if (e.tasks_per_node) e.tasks_per_node_var = "SLURM_TASKS_PER_NODE";
  }
  // Set-but-empty CUDA_VISIBLE_DEVICES means "no GPU", unlike unset.
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) e.cuda_visible_devices = std::string(v);
  return e;
}

int32_t count_driver_gpus(double timeout_s) {
  // The kernel driver lists one directory per GPU; no process needed.
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    int32_t n = 0;
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    if (n > 0) return n;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char arg0[] = "nvidia-smi";
  char arg1[] = "-L";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "nvidia-smi", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return 0;
  }
  // Read until EOF or the deadline; a wedged driver must not hang startup.
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool finished = false;
  while (!finished) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    const int pr = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, INT_MAX)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) break;
    char buf[4096];
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      finished = true;
    else
      out.append(buf, static_cast<std::size_t>(got));
  }
  ::close(fds[0]);
  if (!finished) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!finished || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 0;
  int32_t n = 0;
  std::size_t pos = 0;
  while (pos < out.size()) {
    if (out.compare(pos, 4, "GPU ") == 0) ++n;
    pos = out.find('\n', pos);
    if (pos == std::string::npos) break;
    ++pos;
  }
  return n;
}

nlohmann::json SlurmResult::describe() const {
  nlohmann::json j = resolution.describe();
  j["env_after"] = env_after;
  j["slurm"] = {{"node", node},
                {"local_index", local_index},
                {"gpus_per_node", gpus_per_node},
                {"gpus_per_task", gpus_per_task},
                {"visible_devices", visible_devices}};
  return j;
}

SlurmResult resolve_slurm(const SlurmEnv& env, const nlohmann::json& options,
                          const std::function<int32_t()>& driver_gpus) {
  const nlohmann::json opts = options.is_null() ? nlohmann::json::object() : options;
  if (!opts.is_object())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the slurm resolver's options must be a JSON object, got ", opts.dump());
  static const char* const kKnown[] = {"jobs",           "port_base",    "gpus_per_node", "gpus_per_task",
                                       "tasks_per_node", "auto_set_gpu", "rpc_layer"};
  for (auto it = opts.begin(); it != opts.end(); ++it) {
    if (std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return it.key() == k; }))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown option '", it.key(),
                   "' for cluster resolver 'slurm'; allowed options: jobs, "
                   "port_base, gpus_per_node, "
                   "gpus_per_task, tasks_per_node, auto_set_gpu, rpc_layer");
  }
  SlurmResult r;

  // Who am I.
  if (!env.procid)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "SLURM_PROCID is not set: the slurm cluster resolver needs a "
                 "Slurm job step; start the program "
                 "with srun (inside sbatch or salloc), or choose another "
                 "resolver (e.g. tf_config)");
  const auto rank64 = parse_decimal(*env.procid);
  if (!rank64 || *rank64 > INT32_MAX)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "SLURM_PROCID='", *env.procid,
                 "' is not a task rank (a non-negative integer); start the "
                 "program with srun, which sets it");
  const auto rank = static_cast<int32_t>(*rank64);

  // Where are the tasks. An explicit tasks_per_node map names the nodes
  // itself, so it needs no node list (as in TF); an integer applies to every
  // node of the step's node list; without the option both come from Slurm.
  const nlohmann::json* tpn = nullptr;
  if (auto it = opts.find("tasks_per_node"); it != opts.end() && !it->is_null()) tpn = &*it;
  if (tpn != nullptr && !tpn->is_object() && !tpn->is_number_integer())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "option 'tasks_per_node' of the slurm resolver must be a task count for every node (e.g. 2) or "
                 "an object mapping node names to task counts (e.g. {\"node1\": 2, \"node2\": 1}); got ",
                 tpn->dump());
  const bool map_option = tpn != nullptr && tpn->is_object();
  if (map_option && tpn->empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'tasks_per_node' of the slurm resolver is an empty object; "
                 "map each node name to its task count, e.g. {\"node1\": 2, \"node2\": 1}");
  if (!env.nodelist && !map_option)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set: the "
                 "slurm resolver needs the step's nodes; start the program with srun "
                 "inside an allocation, or pass option tasks_per_node as a map of node names to task counts, "
                 "e.g. {\"node1\": 2, \"node2\": 1}");
  if (env.nodelist) {
    r.hosts = expand_hostlist(*env.nodelist, env.nodelist_var);
    for (std::size_t i = 0; i < r.hosts.size(); ++i)
      for (std::size_t k = 0; k < i; ++k)
        if (r.hosts[k] == r.hosts[i])
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, env.nodelist_var, "='", *env.nodelist, "' names node '",
                       r.hosts[i], "' twice; each node appears once in a node list");
  } else {
    // No node list: the map's nodes in name order, as TF sorts them.
    for (auto t = tpn->begin(); t != tpn->end(); ++t) r.hosts.push_back(t.key());
  }
  auto check_count = [](const std::string& what, const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > INT32_MAX)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'tasks_per_node' gives ", what, v.dump(),
                   " tasks; each count must be a positive integer");
    return v.get<int32_t>();
  };

  if (map_option) {
    for (auto t = tpn->begin(); t != tpn->end(); ++t) {
      if (t.key().empty())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'tasks_per_node' has an empty node name; map node "
                     "names to task counts, e.g. {\"node1\": 2}");
      if (std::find(r.hosts.begin(), r.hosts.end(), t.key()) == r.hosts.end())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'tasks_per_node' names node '", t.key(),
                     "', which is not in ", env.nodelist_var, "='", *env.nodelist,
                     "'; give counts for the step's nodes only");
      check_count("node '" + t.key() + "' ", t.value());
    }
    for (const auto& h : r.hosts) {
      if (!tpn->contains(h))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'tasks_per_node' has no count for node '", h, "' of ",
                     env.nodelist_var, "='", *env.nodelist, "'; give a count for every node");
      r.tasks_per_node.push_back(tpn->at(h).get<int32_t>());
    }
  } else if (tpn != nullptr) {
    const int32_t n = check_count("every node ", *tpn);
    r.tasks_per_node.assign(r.hosts.size(), n);
  } else {
    if (!env.tasks_per_node)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                   "neither SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE is "
                   "set: start the program with srun, or pass option tasks_per_node, "
                   "e.g. 2 or {\"node1\": 2}");
    r.tasks_per_node = expand_tasks_per_node(*env.tasks_per_node, env.tasks_per_node_var);
    if (r.tasks_per_node.size() != r.hosts.size())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, env.tasks_per_node_var, "='", *env.tasks_per_node, "' gives ",
                   r.tasks_per_node.size(), " node(s) but ", env.nodelist_var, "='", *env.nodelist, "' lists ",
                   r.hosts.size(),
                   "; the two must describe the same nodes (use the step's "
                   "variables, or set "
                   "option tasks_per_node)");
  }
  // Where the counts came from, for messages.
  const std::string counts_origin = tpn != nullptr ? std::string("option tasks_per_node")
                                    : env.tasks_per_node_var + "='" + env.tasks_per_node.value_or("") + "'";
  int64_t total = 0;
  for (int32_t n : r.tasks_per_node) total += n;
  // Every task gets a cluster address: bound the list before building it.
  if (total > static_cast<int64_t>(kMaxHosts))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the tasks per node (",
                 counts_origin, ") add up to ", total, " tasks, more than the ", kMaxHosts,
                 " any real step has; use the step's own variables (start the program with srun)");

  int64_t num_tasks = total;
  if (env.num_tasks) {
    const auto n = parse_decimal(*env.num_tasks);
    if (!n || *n == 0 || *n > INT32_MAX)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, env.num_tasks_var, "='", *env.num_tasks,
                   "' is not a positive task count; start the program with "
                   "srun, which sets it");
    num_tasks = static_cast<int64_t>(*n);
    if (num_tasks != total)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, env.num_tasks_var, "=", num_tasks, " but the tasks per node (",
                   counts_origin, ") add up to ", total, "; make them agree");
  }
  if (rank >= num_tasks)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "SLURM_PROCID=", rank, " is out of range for a step of ", num_tasks,
                 " task(s) (ranks 0..", num_tasks - 1, "); the Slurm variables come from different steps");

  // Where every rank runs, by the step's node-level distribution (srun -m).
  std::string distribution = "block";
  int64_t plane = 1;
  if (env.distribution) {
    // The node level is the part before ':' (levels within a node) or ','
    // (Pack/NoPack, already reflected in the tasks per node).
    distribution = env.distribution->substr(0, env.distribution->find_first_of(":,"));
    if (distribution.empty() || distribution == "*") distribution = "block";
    std::optional<std::string> size_text = env.plane_size;
    if (distribution.rfind("plane=", 0) == 0) {  // the size written inline, as srun -m takes it
      size_text = distribution.substr(6);
      distribution = "plane";
    }
    if (distribution == "plane") {
      const auto p = size_text ? parse_decimal(*size_text) : std::nullopt;
      if (!p || *p == 0 || *p > INT32_MAX)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "SLURM_DISTRIBUTION=plane needs a positive plane size "
                     "(SLURM_DIST_PLANESIZE or plane=N), got '", size_text.value_or(""),
                     "'; start the step with srun -m plane=N");
      plane = static_cast<int64_t>(*p);
    } else if (distribution != "block" && distribution != "cyclic") {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "SLURM_DISTRIBUTION='", *env.distribution,
                   "' lays tasks out in a way the slurm resolver cannot reproduce (it knows block, cyclic and "
                   "plane); start the step with srun -m block (the default) or -m cyclic");
    }
  }
  const std::vector<TaskPlace> places = lay_out_tasks(r.tasks_per_node, distribution, plane);
  int32_t max_tasks = 0;
  for (int32_t n : r.tasks_per_node) max_tasks = std::max(max_tasks, n);
  const TaskPlace& me = places[static_cast<std::size_t>(rank)];
  r.node = r.hosts[static_cast<std::size_t>(me.node)];
  r.local_index = me.local;

  // Ports.
  const int32_t port_base = option_int(opts, "port_base", 8888, 1, 65535);
  if (port_base + max_tasks - 1 > 65535)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'port_base' ", port_base, " with up to ", max_tasks,
                 " tasks on a node needs ports up to ", port_base + max_tasks - 1,
                 ", beyond 65535; choose a lower port_base");
  std::vector<std::string> addresses;
  addresses.reserve(static_cast<std::size_t>(total));
  for (const TaskPlace& t : places)
    addresses.push_back(r.hosts[static_cast<std::size_t>(t.node)] + ":" + std::to_string(port_base + t.local));

  // Jobs, in name order over consecutive ranks.
  std::map<std::string, int64_t> jobs;
  if (auto it = opts.find("jobs"); it != opts.end() && !it->is_null()) {
    if (!it->is_object() || it->empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                   "option 'jobs' of the slurm resolver must map job names to task "
                   "counts, e.g. {\"ps\": 1, \"worker\": 3}; got ",
                   it->dump());
    for (auto j = it->begin(); j != it->end(); ++j) {
      if (j.key().empty() || !j.value().is_number_integer() || j.value().get<int64_t>() < 0 ||
          j.value().get<int64_t>() > INT32_MAX)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'jobs' entry \"", j.key(), "\": ", j.value().dump(),
                     " is not a job name with a non-negative task count, e.g. "
                     "{\"ps\": 1, \"worker\": 3}");
      jobs[j.key()] = j.value().get<int64_t>();
    }
  } else {
    jobs["worker"] = num_tasks;
  }
  int64_t wanted = 0;
  for (const auto& [name, n] : jobs) wanted += n;
  if (wanted != num_tasks)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'jobs' ", opts.at("jobs").dump(), " asks for ", wanted,
                 " task(s) but the Slurm step has ", num_tasks, " (",
                 env.num_tasks ? env.num_tasks_var : "tasks per node", "); make the counts add up to ", num_tasks,
                 " or start the step with srun -n ", wanted);
  nlohmann::json spec = nlohmann::json::object();
  int64_t offset = 0;
  for (const auto& [name, n] : jobs) {
    nlohmann::json list = nlohmann::json::array();
    for (int64_t k = 0; k < n; ++k) list.push_back(addresses[static_cast<std::size_t>(offset + k)]);
    if (rank >= offset && rank < offset + n) {
      r.resolution.task_type = name;
      r.resolution.task_id = static_cast<int32_t>(rank - offset);
    }
    spec[name] = std::move(list);
    offset += n;
  }
  r.resolution.cluster = parse_cluster_spec(spec, "the slurm resolver's cluster");

  // GPUs.
  std::optional<std::vector<std::string>> visible;
  if (env.cuda_visible_devices) visible = visible_list(*env.cuda_visible_devices);
  if (opts.contains("gpus_per_node") && !opts["gpus_per_node"].is_null()) {
    r.gpus_per_node = option_int(opts, "gpus_per_node", 0, 0, 1 << 16);
  } else if (visible) {
    r.gpus_per_node = static_cast<int32_t>(visible->size());
  } else {
    r.gpus_per_node = std::max<int32_t>(0, driver_gpus ? driver_gpus() : 0);
  }
  const int32_t local_tasks = r.tasks_per_node[static_cast<std::size_t>(me.node)];
  if (opts.contains("gpus_per_task") && !opts["gpus_per_task"].is_null()) {
    r.gpus_per_task = option_int(opts, "gpus_per_task", 0, 0, 1 << 16);
    // Every node runs with the same gpus_per_task, so the fullest node decides.
    if (static_cast<int64_t>(r.gpus_per_task) * max_tasks > r.gpus_per_node)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                   "requested more GPUs per node than available: option "
                   "'gpus_per_task' ",
                   r.gpus_per_task, " x ", max_tasks, " task(s) on the fullest node needs ",
                   static_cast<int64_t>(r.gpus_per_task) * max_tasks, " GPUs but a node has ", r.gpus_per_node,
                   " (gpus_per_node, from ",
                   opts.contains("gpus_per_node") && !opts["gpus_per_node"].is_null()
                       ? "the option"
                       : (visible ? "CUDA_VISIBLE_DEVICES" : "the NVIDIA driver"),
                   "); lower gpus_per_task, run fewer tasks per node, or set "
                   "gpus_per_node");
  } else {
    r.gpus_per_task = r.gpus_per_node / local_tasks;
  }
  if (r.gpus_per_task > 0) {
    const int32_t lo = r.local_index * r.gpus_per_task;
    // Map through an existing CUDA_VISIBLE_DEVICES (Slurm's GRES binding
    // writes physical ids there) so that the process keeps the GPUs it was
    // given; TF numbers from 0, which is the same when the list is 0..n-1.
    const bool map = visible && static_cast<int32_t>(visible->size()) >= lo + r.gpus_per_task;
    for (int32_t g = lo; g < lo + r.gpus_per_task; ++g) {
      if (!r.visible_devices.empty()) r.visible_devices += ",";
      r.visible_devices += map ? (*visible)[static_cast<std::size_t>(g)] : std::to_string(g);
    }
  }
  bool auto_set_gpu = true;
  if (auto it = opts.find("auto_set_gpu"); it != opts.end() && !it->is_null()) {
    if (!it->is_boolean())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                   "option 'auto_set_gpu' of the slurm resolver must be true or "
                   "false, got ",
                   it->dump());
    auto_set_gpu = it->get<bool>();
  }
  if (auto_set_gpu && r.gpus_per_task > 0) r.env_after["CUDA_VISIBLE_DEVICES"] = r.visible_devices;
  r.resolution.num_accelerators = {{"GPU", r.gpus_per_task}};

  // RPC layer: "" means none.
  r.resolution.rpc_layer = std::string("grpc");
  if (auto it = opts.find("rpc_layer"); it != opts.end()) {
    if (it->is_null() || (it->is_string() && it->get_ref<const std::string&>().empty())) {
      r.resolution.rpc_layer.reset();
    } else if (it->is_string()) {
      r.resolution.rpc_layer = it->get<std::string>();
    } else {
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                   "option 'rpc_layer' of the slurm resolver must be a string such "
                   "as \"grpc\", got ",
                   it->dump());
    }
  }
  r.resolution.validate("the slurm resolver");
  return r;
}

}  // namespace strata::resolvers
