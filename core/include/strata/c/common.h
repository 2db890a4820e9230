/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file common.h
 * @brief Strata C ABI v1: versioning, status codes, the error object and the
 *        conventions every other header in this directory follows.
 *
 * Conventions (see DESIGN.md, "The C ABI"):
 * - Every boundary struct and vtable begins with STRATA_STRUCT_HEADER
 *   (`struct_size`, `abi_minor`, `ext`). Fields are only ever appended. A
 *   reader touches a field only when `struct_size` covers it
 *   (STRATA_HAS_FIELD); a missing optional function reads as NULL.
 * - Every fallible call returns strata_status_t (0 = ok, < 0 = error) and fills
 *   the strata_error the caller passes (which may be NULL). The message names
 *   what went wrong and what to do about it.
 * - Handles are opaque; whoever creates an object destroys it with the
 *   matching destroy call from the same vtable.
 * - No C++ type, exception or STL object crosses this boundary.
 * - Strings returned by a callee are delivered through a strata_write_fn
 *   callback: the callee calls it (possibly several times, in order) and the
 *   caller copies the bytes, so nobody frees memory the other side allocated.
 */
#ifndef STRATA_C_COMMON_H_
#define STRATA_C_COMMON_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** ABI major: a breaking change makes a new major with new symbol names. */
#define STRATA_ABI_MAJOR 1
/** ABI minor: raised whenever a field is appended to any struct or vtable.
 *  1.0: initial layout. 1.1: appended the fields marked "since 1.1".
 *  1.2: appended the fields marked "since 1.2" (set_transport).
 *  1.3: appended the fields marked "since 1.3" (parameter-server variables).
 *  1.4: appended the fields marked "since 1.4" (CUDA devices: host device
 *       services, strategy replica_stream).
 *  1.5: appended the host's device_update (arithmetic on GPU memory). */
#define STRATA_ABI_MINOR 5

#if defined(_WIN32)
#define STRATA_EXPORT __declspec(dllexport)
#else
#define STRATA_EXPORT __attribute__((visibility("default")))
#endif

/** First three fields of every boundary struct and vtable. */
#define STRATA_STRUCT_HEADER \
  uint32_t struct_size; /**< sizeof the struct as the writer compiled it */ \
  uint32_t abi_minor;   /**< STRATA_ABI_MINOR the writer compiled against */ \
  void* ext             /**< reserved for extension chains; NULL today */

/** True when a struct of size `s->struct_size` contains `field`. */
#define STRATA_HAS_FIELD(s, type, field) \
  ((s) != NULL && (s)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/** Fill the header of a struct that this side writes. */
#define STRATA_INIT_HEADER(s, type) \
  do { (s)->struct_size = (uint32_t)sizeof(type); (s)->abi_minor = STRATA_ABI_MINOR; (s)->ext = NULL; } while (0)

typedef int32_t strata_status_t;

/** Status codes: the gRPC/absl set plus ABI_MISMATCH. */
enum strata_status_code {
  STRATA_OK = 0,
  STRATA_ERR_INVALID_ARGUMENT = -1,  /**< caller passed something wrong */
  STRATA_ERR_NOT_FOUND = -2,         /**< plugin, key, file or option absent */
  STRATA_ERR_ALREADY_EXISTS = -3,
  STRATA_ERR_PERMISSION_DENIED = -4, /**< authentication failed */
  STRATA_ERR_FAILED_PRECONDITION = -5, /**< wrong state or context for the call */
  STRATA_ERR_OUT_OF_RANGE = -6,      /**< end of data */
  STRATA_ERR_UNIMPLEMENTED = -7,
  STRATA_ERR_UNAVAILABLE = -8,       /**< peer gone; recoverable by rebuilding the communicator */
  STRATA_ERR_DEADLINE_EXCEEDED = -9,
  STRATA_ERR_ABORTED = -10,          /**< aborted by this or another rank */
  STRATA_ERR_CANCELLED = -11,
  STRATA_ERR_DATA_LOSS = -12,        /**< corrupt input */
  STRATA_ERR_INTERNAL = -13,
  STRATA_ERR_ABI_MISMATCH = -14      /**< incompatible ABI major or too-small struct */
};

/** Static name of a status code ("OK", "INVALID_ARGUMENT", ...). Header-only
 *  so plugins need not link the core library. Never returns NULL. */
static inline const char* strata_status_string(strata_status_t s) {
  switch (s) {
    case STRATA_OK: return "OK";
    case STRATA_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case STRATA_ERR_NOT_FOUND: return "NOT_FOUND";
    case STRATA_ERR_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case STRATA_ERR_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case STRATA_ERR_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case STRATA_ERR_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case STRATA_ERR_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case STRATA_ERR_UNAVAILABLE: return "UNAVAILABLE";
    case STRATA_ERR_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case STRATA_ERR_ABORTED: return "ABORTED";
    case STRATA_ERR_CANCELLED: return "CANCELLED";
    case STRATA_ERR_DATA_LOSS: return "DATA_LOSS";
    case STRATA_ERR_INTERNAL: return "INTERNAL";
    case STRATA_ERR_ABI_MISMATCH: return "ABI_MISMATCH";
    default: return "UNKNOWN";
  }
}

#define STRATA_ERROR_MESSAGE_MAX 1024

/**
 * @brief Error details filled by a callee. Allocated by the caller (usually on
 * the stack), initialised with strata_error_init. A callee that fails sets
 * `code` to its return value and writes a NUL-terminated message, truncated to
 * fit. A callee never reads the message.
 */
typedef struct strata_error {
  STRATA_STRUCT_HEADER;
  strata_status_t code;                    /**< same as the call's return */
  char message[STRATA_ERROR_MESSAGE_MAX];  /**< what failed and what to do */
} strata_error;

#define STRATA_ERROR_STRUCT_SIZE ((uint32_t)sizeof(strata_error))

static inline void strata_error_init(strata_error* e) {
  if (e) { STRATA_INIT_HEADER(e, strata_error); e->code = STRATA_OK; e->message[0] = '\0'; }
}

/** Callback through which a callee hands a string (usually JSON) to its
 *  caller. The callee may call it several times; the bytes concatenate. The
 *  data is valid only during the call. Never NULL where a function takes one. */
typedef void (*strata_write_fn)(void* user, const char* data, uint64_t len);

/** Log levels for strata_host_api.log, matching spdlog's order. */
enum strata_log_level {
  STRATA_LOG_TRACE = 0,
  STRATA_LOG_DEBUG = 1,
  STRATA_LOG_INFO = 2,
  STRATA_LOG_WARN = 3,
  STRATA_LOG_ERROR = 4,
  STRATA_LOG_CRITICAL = 5
};

/** The kinds of component a plugin library can provide. */
typedef enum strata_plugin_kind {
  STRATA_KIND_STRATEGY = 1,
  STRATA_KIND_CROSS_DEVICE_OPS = 2,
  STRATA_KIND_TRANSPORT = 3,
  STRATA_KIND_CLUSTER_RESOLVER = 4,
  STRATA_KIND_INPUT_PIPELINE = 5
} strata_plugin_kind;

/** Reduction operators. tf.distribute's ReduceOp is SUM and MEAN; transports
 *  and collectives also accept MIN, MAX and PROD. */
typedef enum strata_reduce_op {
  STRATA_REDUCE_SUM = 0,
  STRATA_REDUCE_MEAN = 1,
  STRATA_REDUCE_MIN = 2,
  STRATA_REDUCE_MAX = 3,
  STRATA_REDUCE_PROD = 4
} strata_reduce_op;

/** Deadline argument meaning "no deadline" (only where a contract allows). */
#define STRATA_NO_TIMEOUT ((int64_t)-1)

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_COMMON_H_ */
