// SPDX-License-Identifier: Apache-2.0
// strata::Error and the STRATA_THROW / STRATA_ENFORCE macros. Header-only so
// that the SDK (and so plugins, which never link core) can use them too; the
// SDK's trampolines turn an Error into its status code at the C ABI.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "strata/c/common.h"

namespace strata {

/// Every error Strata throws. code() is a strata_status_code; what() is the
/// message (what failed and what to do), ending with "[file:line]" when
/// thrown through STRATA_THROW.
class Error : public std::runtime_error {
 public:
  Error(strata_status_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  strata_status_t code() const noexcept { return code_; }
  const char* code_name() const noexcept { return strata_status_string(code_); }

 private:
  strata_status_t code_;
};

#define STRATA_DEFINE_ERROR_(Name, Code)                                              \
  class Name : public Error {                                                        \
   public:                                                                           \
    explicit Name(const std::string& message) : Error(Code, message) {}             \
  };
STRATA_DEFINE_ERROR_(InvalidArgumentError, STRATA_ERR_INVALID_ARGUMENT)
STRATA_DEFINE_ERROR_(NotFoundError, STRATA_ERR_NOT_FOUND)
STRATA_DEFINE_ERROR_(AlreadyExistsError, STRATA_ERR_ALREADY_EXISTS)
STRATA_DEFINE_ERROR_(PermissionDeniedError, STRATA_ERR_PERMISSION_DENIED)
STRATA_DEFINE_ERROR_(FailedPreconditionError, STRATA_ERR_FAILED_PRECONDITION)
STRATA_DEFINE_ERROR_(OutOfRangeError, STRATA_ERR_OUT_OF_RANGE)
STRATA_DEFINE_ERROR_(UnimplementedError, STRATA_ERR_UNIMPLEMENTED)
STRATA_DEFINE_ERROR_(UnavailableError, STRATA_ERR_UNAVAILABLE)
STRATA_DEFINE_ERROR_(DeadlineExceededError, STRATA_ERR_DEADLINE_EXCEEDED)
STRATA_DEFINE_ERROR_(AbortedError, STRATA_ERR_ABORTED)
STRATA_DEFINE_ERROR_(CancelledError, STRATA_ERR_CANCELLED)
STRATA_DEFINE_ERROR_(DataLossError, STRATA_ERR_DATA_LOSS)
STRATA_DEFINE_ERROR_(InternalError, STRATA_ERR_INTERNAL)
STRATA_DEFINE_ERROR_(AbiMismatchError, STRATA_ERR_ABI_MISMATCH)
#undef STRATA_DEFINE_ERROR_

namespace detail {

template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// Throw the Error subclass that matches `code` (so callers can catch by type).
[[noreturn]] inline void throw_status(strata_status_t code, const std::string& message) {
  switch (code) {
    case STRATA_ERR_INVALID_ARGUMENT: throw InvalidArgumentError(message);
    case STRATA_ERR_NOT_FOUND: throw NotFoundError(message);
    case STRATA_ERR_ALREADY_EXISTS: throw AlreadyExistsError(message);
    case STRATA_ERR_PERMISSION_DENIED: throw PermissionDeniedError(message);
    case STRATA_ERR_FAILED_PRECONDITION: throw FailedPreconditionError(message);
    case STRATA_ERR_OUT_OF_RANGE: throw OutOfRangeError(message);
    case STRATA_ERR_UNIMPLEMENTED: throw UnimplementedError(message);
    case STRATA_ERR_UNAVAILABLE: throw UnavailableError(message);
    case STRATA_ERR_DEADLINE_EXCEEDED: throw DeadlineExceededError(message);
    case STRATA_ERR_ABORTED: throw AbortedError(message);
    case STRATA_ERR_CANCELLED: throw CancelledError(message);
    case STRATA_ERR_DATA_LOSS: throw DataLossError(message);
    case STRATA_ERR_ABI_MISMATCH: throw AbiMismatchError(message);
    default: throw InternalError(message);
  }
}

[[noreturn]] inline void throw_at(const char* file, int line, strata_status_t code,
                                  const std::string& message) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  throw_status(code, str_cat(message, " [", base, ":", line, "]"));
}

/// Throw the error a C call reported (code and message from `err`).
inline void check_status(strata_status_t status, const strata_error& err, const char* what) {
  if (status == STRATA_OK) return;
  std::string msg = err.message[0] ? std::string(err.message) : std::string(strata_status_string(status));
  throw_status(status, str_cat(what, ": ", msg));
}

}  // namespace detail
}  // namespace strata

/// STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "devices must not be empty; pass ...")
#define STRATA_THROW(code, ...) \
  ::strata::detail::throw_at(__FILE__, __LINE__, (code), ::strata::detail::str_cat(__VA_ARGS__))

/// STRATA_ENFORCE(cond, code, message parts...): throw when cond is false.
#define STRATA_ENFORCE(cond, code, ...)    \
  do {                                     \
    if (!(cond)) STRATA_THROW(code, __VA_ARGS__); \
  } while (0)
