// SPDX-License-Identifier: Apache-2.0
// strata-server: serve one worker or ps task of a parameter-server job
// (tf.distribute.Server). The task comes from the cluster resolver
// (TF_CONFIG, Slurm, ...) unless --job/--index name it; the cluster (and so
// the chief, whose rendezvous store every task joins) always comes from the
// resolver. Runs until the coordinator says stop (exit 0), SIGTERM/SIGINT
// (exit 0), or the coordinator has not been heard from for
// --coordinator-timeout seconds (exit 3, so no server outlives its job).
// A worker runs the functions registered in this binary, the libraries it
// links and the shared libraries named by --load (dlopen'ed before it
// serves, so their STRATA_REGISTER_FUNCTION registrations run); or call
// strata::Server::from_env().join() from your own program instead.
#include <dlfcn.h>
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "strata/config.hpp"
#include "strata/coordinator.hpp"
#include "strata/plugin_host.hpp"

int main(int argc, char** argv) {
  CLI::App app{"strata-server: a worker or ps task of parameter-server training"};
  strata::ServerOptions opts;
  std::string config_path;
  app.add_option("--job", opts.job, "task type: worker or ps (default: from the cluster resolver)")
      ->check(CLI::IsMember({"worker", "ps"}));
  app.add_option("--index", opts.index, "task index (default: from the cluster resolver)")->check(CLI::NonNegativeNumber);
  app.add_option("--coordinator-timeout", opts.coordinator_timeout_s,
                 "exit when the coordinator has been silent this many seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--config", config_path, "job config JSON (default: STRATA_CONFIG)");
  std::vector<std::string> libraries;
  app.add_option("--load", libraries,
                 "shared library with your STRATA_REGISTER_FUNCTION steps, loaded before serving (repeatable); "
                 "build it with add_library(NAME SHARED ...) linking strata::core");
  app.footer(
      "A worker task runs the functions the coordinator schedules by name: those registered in the program that "
      "serves (your own binary calling strata::Server::from_env().join()), or in a library given to --load:\n"
      "  strata-server --job worker --index 0 --load ./libmy_steps.so");
  CLI11_PARSE(app, argc, argv);
  if ((opts.job.empty()) != (opts.index < 0)) {
    std::cerr << "strata-server: pass --job and --index together (or neither, to take the task from TF_CONFIG)\n";
    return 2;
  }
  // Signals go to one watcher thread (blocked here before any thread starts).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  for (const std::string& lib : libraries) {
    const std::size_t before = strata::registered_functions().size();
    // RTLD_LOCAL: the library links strata::core itself, so nothing needs
    // its symbols; it stays loaded (the registry holds its functions).
    if (::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      const char* why = ::dlerror();
      std::fprintf(stderr,
                   "strata-server: cannot load --load %s: %s; give the path of a shared library built with "
                   "add_library(NAME SHARED ...) that links strata::core (a path without '/' is searched on "
                   "LD_LIBRARY_PATH)\n",
                   lib.c_str(), why != nullptr ? why : "unknown error");
      return 2;
    }
    const std::vector<std::string> names = strata::registered_functions();
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    if (names.size() == before)
      std::fprintf(stderr, "strata-server: warning: %s registered no function (registered: %s)\n", lib.c_str(),
                   list.empty() ? "none" : list.c_str());
    else
      std::fprintf(stderr, "strata-server: loaded %s (registered: %s)\n", lib.c_str(), list.c_str());
  }
  try {
    if (config_path.empty())
      if (const char* p = std::getenv("STRATA_CONFIG"); p != nullptr && p[0] != '\0') config_path = p;
    strata::Config cfg = config_path.empty() ? strata::Config() : strata::Config::from_file(config_path);
    cfg.apply_env();
    strata::PluginHost::global().set_config(cfg.json());
    strata::Server server = strata::Server::from_env(opts);
    std::fprintf(stderr, "strata-server: serving %s task %d\n", server.job().c_str(), server.index());
    std::thread watcher([&server, set] {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) {
        std::fprintf(stderr, "strata-server: signal %d, stopping\n", sig);
        server.stop();
      }
    });
    watcher.detach();  // stays in sigwait when the coordinator stops us
    server.join();
    std::fprintf(stderr, "strata-server: %s task %d stopped\n", server.job().c_str(), server.index());
    return 0;
  } catch (const strata::UnavailableError& e) {
    std::fprintf(stderr, "strata-server: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-server: %s\n", e.what());
    return 1;
  }
}
