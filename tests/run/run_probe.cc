// SPDX-License-Identifier: Apache-2.0
// Test program for strata-run: reports what the launcher gave it and exits
// as told.
//
//   run_probe --dir D [--sleep S] [--fail-rank R [--fail-code C | --fail-signal N] [--fail-after S]]
//             [--ignore-term] [--trace-rank R]... [--verdict TEXT] [--stop-rank R]
//             [--healthy-from-restart K]
//
// Writes D/pid.<rank> (its pid) and D/run.<restart>.<rank> ("<pid>
// <STRATA_RESTART_COUNT> <STRATA_MAX_RESTARTS>", one file per attempt of
// strata-run --max-restarts) at start, and D/term.<rank> when it gets
// SIGTERM (then exits 0, or keeps running with --ignore-term). Prints
// "rank=", "tf_config=", "token=", "config=", "trace_dir=" and
// "trace_dir_exists=" lines to stdout, one line to stderr, and one line
// written in three pieces (to check whole-line output). A --trace-rank
// writes $STRATA_TRACE_DIR/rank-<rank>.json at start, as the ring does when
// a collective fails, with the --verdict text; the --stop-rank stops itself
// (SIGSTOP) after its output, as a frozen rank would, and the --fail-rank
// then waits (up to 30 s) until it is stopped before failing, so the order
// of the two is certain however slow the machine. From STRATA_RESTART_COUNT
// K on (--healthy-from-restart K) the probe does none of that: it prints and
// exits 0, as a program that resumed from its checkpoint and finished.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

namespace {

char g_term_path[4096];
volatile sig_atomic_t g_ignore_term = 0;

void on_term(int) {
  int fd = ::open(g_term_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::write(fd, "term\n", 5);
    ::close(fd);
  }
  if (!g_ignore_term) ::_exit(0);
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) std::exit(90);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

/// True once the process whose pid is in `pid_path` is stopped (state 'T').
bool wait_stopped(const std::string& pid_path, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream pid_in(pid_path);
    long pid = 0;
    if (pid_in >> pid) {
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string line;
      if (std::getline(stat, line)) {
        const auto close = line.rfind(')');
        if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'T') return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void sleep_s(double s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
  while (std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double sleep = 0, fail_after = 0;
  int fail_rank = -1, fail_code = 1, fail_signal = 0, stop_rank = -1, healthy_from = -1;
  std::set<int> trace_ranks;
  std::string verdict;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(91);
      return argv[++i];
    };
    if (a == "--dir") dir = next();
    else if (a == "--sleep") sleep = std::stod(next());
    else if (a == "--fail-rank") fail_rank = std::stoi(next());
    else if (a == "--fail-code") fail_code = std::stoi(next());
    else if (a == "--fail-signal") fail_signal = std::stoi(next());
    else if (a == "--fail-after") fail_after = std::stod(next());
    else if (a == "--ignore-term") g_ignore_term = 1;
    else if (a == "--trace-rank") trace_ranks.insert(std::stoi(next()));
    else if (a == "--verdict") verdict = next();
    else if (a == "--stop-rank") stop_rank = std::stoi(next());
    else if (a == "--healthy-from-restart") healthy_from = std::stoi(next());
    else return 92;
  }
  const char* rank_env = std::getenv("STRATA_RANK");
  const int rank = rank_env != nullptr ? std::atoi(rank_env) : -1;
  std::snprintf(g_term_path, sizeof g_term_path, "%s/term.%d", dir.c_str(), rank);
  struct sigaction sa{};
  sa.sa_handler = &on_term;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "-");
  };
  const std::string restart = env("STRATA_RESTART_COUNT"), max_restarts = env("STRATA_MAX_RESTARTS");
  if (!dir.empty()) {
    // pid.<rank> last: tests wait for it as "the rank started", then read
    // run.* (a SIGTERM between the two used to leave run.* unwritten).
    write_file(dir + "/run." + restart + "." + std::to_string(rank),
               std::to_string(::getpid()) + " " + restart + " " + max_restarts + "\n");
    write_file(dir + "/pid." + std::to_string(rank), std::to_string(::getpid()));
  }
  if (healthy_from >= 0 && restart != "-" && std::atoi(restart.c_str()) >= healthy_from) {
    sleep = 0;
    fail_rank = stop_rank = -1;
    trace_ranks.clear();
  }
  std::printf("rank=%d\n", rank);
  std::printf("restart=%s\n", restart.c_str());
  std::printf("max_restarts=%s\n", max_restarts.c_str());
  std::printf("tf_config=%s\n", env("TF_CONFIG").c_str());
  std::printf("token=%s\n", env("STRATA_AUTH_TOKEN").c_str());
  std::printf("config=%s\n", env("STRATA_CONFIG").c_str());
  std::printf("cuda_visible=%s\n", env("CUDA_VISIBLE_DEVICES").c_str());
  std::printf("gpus_shared=%s\n", env("STRATA_GPUS_SHARED").c_str());
  const std::string trace_dir = env("STRATA_TRACE_DIR");
  struct stat st{};
  std::printf("trace_dir=%s\n", trace_dir.c_str());
  std::printf("trace_dir_exists=%d\n", ::stat(trace_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? 1 : 0);
  std::fflush(stdout);
  if (trace_ranks.count(rank) != 0) {
    // The fields the ring writes; the verdict is plain ASCII in the tests.
    char head[256];
    std::snprintf(head, sizeof head, "{\"rank\": %d, \"world_size\": 0, \"communicator\": \"probe\", \"pid\": %d, ", rank,
                  static_cast<int>(::getpid()));
    write_file(trace_dir + "/rank-" + std::to_string(rank) + ".json",
               std::string(head) + "\"verdict\": \"" + verdict + "\", \"error\": \"probe failure\", \"collectives\": []}\n");
  }
  for (const char* piece : {"chunked-a", "-b", "-c\n"}) {
    std::fputs(piece, stdout);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  std::fprintf(stderr, "probe stderr rank=%d\n", rank);
  std::fflush(stderr);
  if (rank == stop_rank) ::raise(SIGSTOP);

  if (rank == fail_rank) {
    if (stop_rank >= 0 && !wait_stopped(dir + "/pid." + std::to_string(stop_rank), 30)) return 93;
    sleep_s(fail_after);
    if (fail_signal != 0) {
      ::signal(fail_signal, SIG_DFL);
      ::raise(fail_signal);
    }
    return fail_code;
  }
  sleep_s(sleep);
  return 0;
}
