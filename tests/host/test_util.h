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

#include "test_support.h"  // TempDir

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


/// strata_write_fn that appends to a std::string passed as `user`.
inline void append_to_string(void* user, const char* data, uint64_t len) {
  static_cast<std::string*>(user)->append(data, len);
}

}  // namespace strata::test
