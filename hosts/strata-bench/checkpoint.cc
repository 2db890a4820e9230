// SPDX-License-Identifier: Apache-2.0
// strata-bench checkpoint (see checkpoint.h).
#include "checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "strata/checkpoint.hpp"
#include "strata/error.hpp"
#include "strata/sdk/records.hpp"
#include "strata/tensor.hpp"
#include "strata/variable.hpp"

namespace strata::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The plain side's write(2)/read(2) size: large enough that the syscall
// count does not matter, small enough to stay in the L3 cache.
constexpr std::size_t kPlainBlock = 8u << 20;

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  STRATA_THROW(STRATA_ERR_UNAVAILABLE, "strata-bench checkpoint: ", what, " ", path, ": ", std::strerror(errno));
}

// Removes the benchmark's directory on every path out.
// "0.52, 0.61, 0.70": the 1, 5 and 15 minute load averages, as uptime(1)
// prints them (it reads the same file).
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "unknown";
  return a + ", " + b + ", " + c;
}

// A /proc/self/status figure ("VmRSS:", "VmHWM:") in MiB; -1 when absent.
double status_mib(const char* field) {
  std::ifstream f("/proc/self/status");
  const std::size_t n = std::strlen(field);
  for (std::string line; std::getline(f, line);)
    if (line.compare(0, n, field) == 0) return std::strtod(line.c_str() + n, nullptr) / 1024.0;
  return -1;
}

// Peak resident set size since the last reset_peak_rss(), in MiB.
double peak_rss_mib() { return status_mib("VmHWM:"); }

// Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

// write(2) `bytes` in kPlainBlock calls from `block`, then fsync: what a
// program that only dumps the bytes pays.
void plain_write(const std::string& path, std::uint64_t bytes, const std::vector<char>& block) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("cannot create", path);
  std::uint64_t left = bytes;
  while (left > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, block.size()));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      fail_errno("cannot write", path);
    }
    left -= static_cast<std::uint64_t>(w);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail_errno("fsync failed on", path);
  }
  if (::close(fd) != 0) fail_errno("close failed on", path);
}

// read(2) the whole file in kPlainBlock calls into `block`. Returns the
// bytes read.
std::uint64_t plain_read(const std::string& path, std::vector<char>& block) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // as input's sequential read (and restore) do
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail_errno("cannot read", path);
    }
    if (n == 0) break;
    total += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return total;
}

// read(2) the whole file in kPlainBlock calls into one new buffer of its
// size, freed at the end: the least any reader that keeps the bytes does
// (restore must keep them until they are checked). Returns the bytes read.
std::uint64_t plain_read_fresh(const std::string& path, std::uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<char[]> buf(new char[size]);  // uninitialised: the kernel writes every byte
  std::uint64_t total = 0;
  while (total < size) {
    const ssize_t n = ::read(fd, buf.get() + total, static_cast<std::size_t>(std::min<std::uint64_t>(size - total, kPlainBlock)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail_errno("cannot read", path);
    }
    if (n == 0) break;
    total += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return total;
}

// Evict `path` from the page cache: fsync (dirty pages cannot be dropped),
// then POSIX_FADV_DONTNEED.
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  ::fsync(fd);
  const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) {
    errno = rc;
    fail_errno("posix_fadvise(DONTNEED) failed on", path);
  }
}

// Share of `path`'s pages in the page cache (mincore(2)); -1 if unknown.
double resident_fraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return -1;
  }
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  double out = -1;
  if (::mincore(p, size, vec.data()) == 0) {
    std::size_t in = 0;
    for (unsigned char v : vec) in += v & 1u;
    out = static_cast<double>(in) / static_cast<double>(vec.size());
  }
  ::munmap(p, size);
  return out;
}

// CRC32C of a variable's bytes, without copying it where the strategy lets us.
std::uint32_t variable_crc(const Variable& v) {
  if (std::optional<TensorView> view = v.read_view()) return sdk::crc32c(view->raw_data(), view->nbytes());
  const Tensor t = v.value();
  return sdk::crc32c(t.raw_data(), t.nbytes());
}

// Run `a` and `b`, `b` first when `b_first`; returns their seconds.
std::pair<double, double> timed_pair(bool b_first, const std::function<void()>& a, const std::function<void()>& b) {
  double ta = 0, tb = 0;
  auto run = [](const std::function<void()>& f) {
    const auto t0 = Clock::now();
    f();
    return seconds_since(t0);
  };
  if (b_first) {
    tb = run(b);
    ta = run(a);
  } else {
    ta = run(a);
    tb = run(b);
  }
  return {ta, tb};
}

}  // namespace

int run_checkpoint_bench(const CheckpointBenchOptions& o) {
  if (o.size_mb < 1) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--size-mb must be at least 1, got ", o.size_mb);
  if (o.repeats < 1) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--repeats must be at least 1, got ", o.repeats);
  const std::uint64_t total_bytes = static_cast<std::uint64_t>(o.size_mb) << 20;
  const std::uint64_t total_elems = total_bytes / sizeof(float);
  if (o.variables < 1 || static_cast<std::uint64_t>(o.variables) > total_elems)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "--variables must be between 1 and ", total_elems, " for --size-mb ",
                 o.size_mb, ", got ", o.variables);

  const fs::path base = o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir);
  std::error_code ec;
  fs::create_directories(base, ec);
  std::string templ = (base / "strata-bench-checkpoint-XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr)
    STRATA_THROW(STRATA_ERR_INTERNAL, "cannot create a directory in ", base.string(), " (", std::strerror(errno),
                 "); pass --dir with a writable directory");
  TempDirGuard work{templ};
  const std::string load_before = load_average();

  // K variables of varied bytes (xorshift), so nothing is constant or
  // trivially compressible, under the Default strategy.
  std::vector<std::unique_ptr<Variable>> vars;
  std::vector<std::uint32_t> want_crc;
  Checkpoint ckpt;
  {
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < o.variables; ++i) {
      const std::uint64_t per = total_elems / static_cast<std::uint64_t>(o.variables);
      const std::uint64_t n = i + 1 == o.variables ? total_elems - per * static_cast<std::uint64_t>(i) : per;
      Tensor t = Tensor::zeros({static_cast<std::int64_t>(n)}, DType::kFloat32);
      auto* p = static_cast<unsigned char*>(t.raw_data());
      for (std::size_t k = 0; k + 8 <= t.nbytes(); k += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::memcpy(p + k, &x, 8);
      }
      char name[32];
      std::snprintf(name, sizeof name, "var-%04d", i);
      vars.push_back(std::make_unique<Variable>(t, VariableOptions{name}));
      want_crc.push_back(sdk::crc32c(t.raw_data(), t.nbytes()));
    }
    for (auto& v : vars) ckpt.track(v->name(), *v);
  }
  const double vars_mib = status_mib("VmRSS:");  // the variables (and the program), before any save
  std::vector<char> block(kPlainBlock);
  for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 2654435761u >> 13);

  std::uint64_t wrong = 0;
  auto check_values = [&] {
    for (std::size_t i = 0; i < vars.size(); ++i) wrong += variable_crc(*vars[i]) != want_crc[i];
  };
  std::vector<double> save_s, write_s, restore_warm_s, read_warm_s, read_fresh_s, restore_cold_s, read_cold_s, resident;
  double save_peak = -1, restore_peak = -1;
  std::uint64_t file_bytes = 0;
  for (int r = 0; r < o.repeats; ++r) {
    const bool plain_first = r % 2 == 1;
    const std::string ck = (work.path / ("ckpt-" + std::to_string(r))).string();
    const std::string tensors = ck + "/" + Checkpoint::kTensorFile;
    const std::string plain = (work.path / ("plain-" + std::to_string(r))).string();
    const bool peaks = reset_peak_rss();
    // The plain write needs the byte count of the tensor file: known after
    // the first save (it does not change between repeats).
    if (file_bytes == 0) {
      const auto t0 = Clock::now();
      ckpt.save(ck);
      save_s.push_back(seconds_since(t0));
      file_bytes = fs::file_size(tensors);
      const auto t1 = Clock::now();
      plain_write(plain, file_bytes, block);
      write_s.push_back(seconds_since(t1));
    } else {
      auto [ts, tw] = timed_pair(plain_first, [&] { ckpt.save(ck); }, [&] { plain_write(plain, file_bytes, block); });
      save_s.push_back(ts);
      write_s.push_back(tw);
    }
    if (peaks) save_peak = std::max(save_peak, peak_rss_mib());
    if (fs::file_size(tensors) != file_bytes)
      STRATA_THROW(STRATA_ERR_INTERNAL, "the tensor file changed size between saves");

    // Warm: both read what the save just left in the page cache.
    if (peaks) reset_peak_rss();
    auto [trw, tpw] = timed_pair(plain_first, [&] { ckpt.restore(ck); }, [&] {
      if (plain_read(tensors, block) != file_bytes) ++wrong;
    });
    if (peaks) restore_peak = std::max(restore_peak, peak_rss_mib());
    check_values();
    restore_warm_s.push_back(trw);
    read_warm_s.push_back(tpw);
    {
      const auto t0 = Clock::now();
      if (plain_read_fresh(tensors, file_bytes) != file_bytes) ++wrong;
      read_fresh_s.push_back(seconds_since(t0));
    }

    // Cold: each side reads after the checkpoint's files left the cache.
    auto evict = [&] {
      drop_cache(tensors);
      drop_cache(ck + "/" + Checkpoint::kManifestFile);
      resident.push_back(resident_fraction(tensors));
    };
    auto [trc, tpc] = timed_pair(
        plain_first,
        [&] {
          evict();
          const auto t0 = Clock::now();
          ckpt.restore(ck);
          restore_cold_s.push_back(seconds_since(t0));
        },
        [&] {
          evict();
          const auto t0 = Clock::now();
          if (plain_read(tensors, block) != file_bytes) ++wrong;
          read_cold_s.push_back(seconds_since(t0));
        });
    (void)trc;
    (void)tpc;
    check_values();
    fs::remove_all(ck, ec);
    fs::remove(plain, ec);
  }
  const std::string load_after = load_average();

  const double fb = static_cast<double>(file_bytes);
  auto mbps = [&](const std::vector<double>& s) { return fb / median(s) / 1e6; };
  const double save = mbps(save_s), write = mbps(write_s);
  const double restore_warm = mbps(restore_warm_s), read_warm = mbps(read_warm_s), read_fresh = mbps(read_fresh_s);
  const double restore_cold = mbps(restore_cold_s), read_cold = mbps(read_cold_s);
  const double max_resident = *std::max_element(resident.begin(), resident.end());
  if (o.json) {
    nlohmann::json j{{"save_mbps", save},
                     {"write_mbps", write},
                     {"save_ratio", save / write},
                     {"restore_warm_mbps", restore_warm},
                     {"read_warm_mbps", read_warm},
                     {"restore_warm_ratio", restore_warm / read_warm},
                     {"read_warm_new_buffer_mbps", read_fresh},
                     {"restore_warm_ratio_new_buffer", restore_warm / read_fresh},
                     {"restore_cold_mbps", restore_cold},
                     {"read_cold_mbps", read_cold},
                     {"restore_cold_ratio", restore_cold / read_cold},
                     {"cold_resident_max", max_resident},
                     {"file_bytes", file_bytes},
                     {"variables", o.variables},
                     {"size_mb", o.size_mb},
                     {"repeats", o.repeats},
                     {"peak_rss_variables_mib", vars_mib},
                     {"peak_rss_save_mib", save_peak},
                     {"peak_rss_restore_mib", restore_peak},
                     {"load_before", load_before},
                     {"load_after", load_after},
                     {"crc32c", sdk::crc32c_implementation()},
                     {"wrong", wrong},
                     // Every sample, in run order (odd runs timed the plain side first).
                     {"samples_s",
                      {{"save", save_s},
                       {"write", write_s},
                       {"restore_warm", restore_warm_s},
                       {"read_warm", read_warm_s},
                       {"read_warm_new_buffer", read_fresh_s},
                       {"restore_cold", restore_cold_s},
                       {"read_cold", read_cold_s}}}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("checkpoint: %d float32 variables, %lld MiB, tensor file %llu bytes, in %s (removed afterwards)\n",
                o.variables, static_cast<long long>(o.size_mb), static_cast<unsigned long long>(file_bytes),
                work.path.c_str());
    std::printf("load average (uptime) before: %s\n", load_before.c_str());
    std::printf("%-48s %10s %8s\n", ("medians of " + std::to_string(o.repeats) + " runs").c_str(), "MB/s", "ratio");
    std::printf("%-48s %10.1f %8.2f\n", "save         Checkpoint::save (fsyncs, rename)", save, save / write);
    std::printf("%-48s %10.1f\n", "write        plain write(2) + fsync", write);
    std::printf("%-48s %10.1f %8.2f\n", "restore warm Checkpoint::restore", restore_warm, restore_warm / read_warm);
    std::printf("%-48s %10.1f\n", "read warm    plain read(2)", read_warm);
    std::printf("%-48s %10.1f\n", "read warm    plain read(2), new buffer", read_fresh);
    std::printf("%-48s %10.1f %8.2f\n", "restore cold Checkpoint::restore", restore_cold, restore_cold / read_cold);
    std::printf("%-48s %10.1f\n", "read cold    plain read(2)", read_cold);
    std::printf("ratio: checkpoint / plain; restore warm / read(2) into a new buffer of the file's size: %.2f\n",
                restore_warm / read_fresh);
    std::printf("cold reads: at most %.1f%% of the tensor file resident after POSIX_FADV_DONTNEED (mincore)\n",
                100.0 * max_resident);
    std::printf("RSS: before the first save %.0f MiB, peak during save %.0f MiB, during restore %.0f MiB\n", vars_mib, save_peak,
                restore_peak);
    std::printf("load average (uptime) after: %s\n", load_after.c_str());
    std::printf("wrong: %llu   crc32c: %s\n", static_cast<unsigned long long>(wrong), sdk::crc32c_implementation());
  }
  if (wrong != 0) {
    std::fprintf(stderr, "strata-bench checkpoint: %llu restores or reads returned other bytes than were saved\n",
                 static_cast<unsigned long long>(wrong));
    return 1;
  }
  return 0;
}

}  // namespace strata::bench
