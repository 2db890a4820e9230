// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the host tests: environment overrides, fixture paths,
// temporary directories and string collection from strata_write_fn.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>

namespace strata::test {

/// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// Directory of one fixture case (see tests/host/CMakeLists.txt).
inline std::string fixture_dir(const std::string& case_name) {
  return std::string(HOST_FIXTURE_DIR) + "/" + case_name;
}

/// A fresh directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("strata-host-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::filesystem::path path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// strata_write_fn that appends to a std::string passed as `user`.
inline void append_to_string(void* user, const char* data, uint64_t len) {
  static_cast<std::string*>(user)->append(data, len);
}

}  // namespace strata::test
