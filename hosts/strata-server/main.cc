// SPDX-License-Identifier: Apache-2.0
// strata-server: serve one worker or ps task of a parameter-server job
// (tf.distribute.Server). The task comes from the cluster resolver
// (TF_CONFIG, Slurm, ...) unless --job/--index name it; the cluster (and so
// the chief, whose rendezvous store every task joins) always comes from the
// resolver. Runs until the coordinator says stop (exit 0), SIGTERM/SIGINT
// (exit 0), or the coordinator has not been heard from for
// --coordinator-timeout seconds (exit 3, so no server outlives its job).
// A worker started this way runs only the functions registered in this
// binary and the libraries it links; to run your own functions, call
// strata::Server::from_env().join() from your program instead.
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

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
