// SPDX-License-Identifier: Apache-2.0
// Small helpers every strata-bench benchmark uses.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <vector>

namespace strata::bench {

/// The median: the middle value, or the mean of the two middle values of an
/// even count; 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Seconds on the steady clock since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Removes a benchmark's scratch directory (if set) on every path out.
struct TempDirGuard {
  std::filesystem::path path;
  TempDirGuard() = default;
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;
  ~TempDirGuard() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

}  // namespace strata::bench
