// SPDX-License-Identifier: Apache-2.0
// strata-bench input (see input.h).
#include "input.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "strata/c/input.h"
#include "strata/error.hpp"
#include "strata/plugin_host.hpp"
#include "strata/records.hpp"
#include "strata/sdk/records.hpp"

extern char** environ;

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Removes the temporary directory on every path out of the benchmark.
std::uint64_t write_file(const std::string& path, std::uint64_t records, std::size_t record_bytes) {
  // Varied payloads (a sliding window over random bytes) so nothing is
  // trivially compressible or constant.
  std::vector<std::uint8_t> pool(record_bytes + 4096);
  std::mt19937_64 rng(12345);
  for (auto& b : pool) b = static_cast<std::uint8_t>(rng());
  RecordWriter w(path);
  for (std::uint64_t i = 0; i < records; ++i) w.write(pool.data() + (i * 7919) % 4096, record_bytes);
  w.close();
  return w.records();
}

// read() in 1 MiB blocks into one buffer: `cat FILE > /dev/null` without
// the process start. Returns the bytes read.
std::uint64_t sequential_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "cannot open '", path, "' for the sequential read: ", std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(1 << 20);
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      STRATA_THROW(STRATA_ERR_DATA_LOSS, "reading '", path, "' failed: ", std::strerror(e));
    }
    if (n == 0) break;
    total += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return total;
}

// `cat FILE > /dev/null` as a child; seconds it took. A deadline guards
// against a stuck child (it is killed and the run fails).
double run_cat(const std::string& path, double deadline_s) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  std::string file = path;
  char cat[] = "cat";
  char* argv[] = {cat, file.data(), nullptr};
  pid_t pid = -1;
  const auto t0 = Clock::now();
  const int rc = ::posix_spawnp(&pid, "cat", &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) STRATA_THROW(STRATA_ERR_UNAVAILABLE, "cannot start 'cat': ", std::strerror(rc), "; is coreutils installed?");
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) STRATA_THROW(STRATA_ERR_INTERNAL, "waitpid(cat): ", std::strerror(errno));
    if (seconds_since(t0) > deadline_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "'cat ", path, " > /dev/null' took more than ", deadline_s,
                   " s; the storage is too slow for this size, pass a smaller --size-mb");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double secs = seconds_since(t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    STRATA_THROW(STRATA_ERR_INTERNAL, "'cat ", path, " > /dev/null' failed (status ", status, ")");
  return secs;
}

struct PipelineCount {
  std::uint64_t records = 0;
  std::uint64_t payload_bytes = 0;
};

// Every element of the "records" pipeline through its C vtable, as the
// Dataset layer consumes it.
PipelineCount read_pipeline(const std::string& options) {
  strata_input_context ctx{};
  STRATA_INIT_HEADER(&ctx, strata_input_context);
  ctx.num_input_pipelines = 1;
  ctx.input_pipeline_id = 0;
  ctx.num_replicas_in_sync = 1;
  PluginInstance inst = PluginHost::global().create_input_pipeline("records", options, ctx);
  const auto* vt = inst.vtable_as<strata_input_vtable>();
  auto* handle = static_cast<strata_input_t>(inst.handle());
  PipelineCount c;
  for (;;) {
    strata_element el{};
    STRATA_INIT_HEADER(&el, strata_element);
    strata_error err;
    strata_error_init(&err);
    const strata_status_t s = vt->next(handle, 60000, &el, &err);
    if (s == STRATA_ERR_OUT_OF_RANGE) break;
    detail::check_status(s, err, "records pipeline next()");
    for (std::uint32_t i = 0; i < el.num_components; ++i) {
      DLManagedTensor* t = el.tensors[i];
      c.payload_bytes += static_cast<std::uint64_t>(t->dl_tensor.shape[0]);
      t->deleter(t);
    }
    ++c.records;
  }
  return c;
}

}  // namespace

int run_input_bench(const InputBenchOptions& o) {
  if (o.size_mb < 1)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--size-mb must be at least 1, got ", o.size_mb);
  if (o.record_bytes < 0 || o.record_bytes > (std::int64_t{256} << 20))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--record-bytes must be between 0 and 268435456, got ", o.record_bytes);
  const std::uint64_t per_record = static_cast<std::uint64_t>(o.record_bytes) + 16;
  const std::uint64_t target = static_cast<std::uint64_t>(o.size_mb) << 20;
  std::uint64_t records = std::max<std::uint64_t>(1, target / per_record);

  TempDirGuard tmp;
  std::string path = o.file;
  bool wrote = false;
  double write_s = 0;
  if (path.empty()) {
    std::string templ = (std::filesystem::temp_directory_path() / "strata-bench-input-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr)
      STRATA_THROW(STRATA_ERR_INTERNAL, "cannot create a temporary directory (", std::strerror(errno),
                   "); set TMPDIR to a writable directory or pass --file");
    tmp.path = templ;
    path = (tmp.path / "bench.rec").string();
  }
  if (!std::filesystem::exists(path)) {
    const auto t0 = Clock::now();
    write_file(path, records, static_cast<std::size_t>(o.record_bytes));
    write_s = seconds_since(t0);
    wrote = true;
  }
  const std::uint64_t file_bytes = std::filesystem::file_size(path);
  if (!wrote) {
    if (file_bytes % per_record != 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--file '", path, "' (", file_bytes,
                   " bytes) was not written with --record-bytes ", o.record_bytes,
                   "; pass the same --record-bytes, or a path that does not exist yet");
    records = file_bytes / per_record;
  }

  const std::string options =
      nlohmann::json{{"files", nlohmann::json::array({path})}, {"buffer_bytes", o.buffer_bytes}}.dump();
  // Warm the page cache and check the count once before timing.
  sequential_read(path);
  const PipelineCount first = read_pipeline(options);
  std::uint64_t wrong = (first.records != records) + (first.payload_bytes != records * o.record_bytes);

  std::vector<double> seq_s, cat_s, pipe_s;
  for (int r = 0; r < o.repeats; ++r) {
    auto t0 = Clock::now();
    const std::uint64_t got = sequential_read(path);
    seq_s.push_back(seconds_since(t0));
    if (got != file_bytes) ++wrong;
    cat_s.push_back(run_cat(path, 600));
    t0 = Clock::now();
    const PipelineCount c = read_pipeline(options);
    pipe_s.push_back(seconds_since(t0));
    if (c.records != records || c.payload_bytes != records * o.record_bytes) ++wrong;
  }
  const double seq = median(seq_s), cat = median(cat_s), pipe = median(pipe_s);
  const double fb = static_cast<double>(file_bytes);
  const double records_per_s = static_cast<double>(records) / pipe;
  const double bytes_per_s = fb / pipe;
  const double seq_bps = fb / seq;
  const double cat_bps = fb / cat;
  if (o.json) {
    nlohmann::json j{{"records_per_s", records_per_s},
                     {"bytes_per_s", bytes_per_s},
                     {"sequential_read_bytes_per_s", seq_bps},
                     {"cat_bytes_per_s", cat_bps},
                     {"ratio_vs_sequential_read", bytes_per_s / seq_bps},
                     {"ratio_vs_cat", bytes_per_s / cat_bps},
                     {"record_bytes", o.record_bytes},
                     {"file_bytes", file_bytes},
                     {"records", records},
                     {"records_read", first.records},
                     {"repeats", o.repeats},
                     {"buffer_bytes", o.buffer_bytes},
                     {"written_s", write_s},
                     {"crc32c", strata::sdk::crc32c_implementation()},
                     {"wrong", wrong}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("file %s: %llu records of %lld bytes, %.1f MiB%s\n", path.c_str(),
                static_cast<unsigned long long>(records), static_cast<long long>(o.record_bytes), fb / (1 << 20),
                wrote ? " (written for this run)" : " (reused)");
    std::printf("%-34s %12s %12s\n", ("medians of " + std::to_string(o.repeats) + " runs").c_str(), "GB/s", "records/s");
    std::printf("%-34s %12.3f %12s\n", "sequential read (1 MiB read())", seq_bps / 1e9, "-");
    std::printf("%-34s %12.3f %12s\n", "cat FILE > /dev/null", cat_bps / 1e9, "-");
    std::printf("%-34s %12.3f %12.0f\n", "records pipeline next()", bytes_per_s / 1e9, records_per_s);
    std::printf("ratio vs sequential read: %.2f   vs cat: %.2f   wrong: %llu   crc32c: %s\n", bytes_per_s / seq_bps,
                bytes_per_s / cat_bps, static_cast<unsigned long long>(wrong), strata::sdk::crc32c_implementation());
  }
  if (wrong != 0) {
    std::fprintf(stderr,
                 "strata-bench input: the pipeline returned %llu records / %llu payload bytes, expected %llu / %llu\n",
                 static_cast<unsigned long long>(first.records), static_cast<unsigned long long>(first.payload_bytes),
                 static_cast<unsigned long long>(records),
                 static_cast<unsigned long long>(records * static_cast<std::uint64_t>(o.record_bytes)));
    return 1;
  }
  return 0;
}

}  // namespace strata::bench
