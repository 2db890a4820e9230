/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file host.h
 * @brief Host services table: everything a plugin may ask of the host.
 *
 * A plugin never links the core library. The host passes a pointer to one
 * strata_host_api to the plugin's entry point and to every create/open call;
 * the table and everything it points to outlive every plugin object. All
 * functions are thread-safe and may be called from any thread, including the
 * plugin's own threads. Functions that block take a timeout in milliseconds
 * and fail with STRATA_ERR_DEADLINE_EXCEEDED when it passes.
 */
#ifndef STRATA_C_HOST_H_
#define STRATA_C_HOST_H_

#include <dlpack/dlpack.h>

#include "strata/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct strata_host_api;

/**
 * @brief A plugin instance created through strata_host_api.create_plugin:
 * another plugin's component, e.g. the CrossDeviceOps a Strategy composes or
 * the Transport a CrossDeviceOps uses. Filled by the host; give it back with
 * release_plugin, which destroys the instance and lets the host unload the
 * providing library at shutdown.
 */
typedef struct strata_plugin_instance {
  STRATA_STRUCT_HEADER;
  uint32_t kind;       /**< strata_plugin_kind */
  const void* vtable;  /**< the kind's vtable, e.g. const strata_transport_vtable* */
  void* handle;        /**< the instance, e.g. strata_transport_t */
  void* host_token;    /**< host bookkeeping; do not touch */
} strata_plugin_instance;

#define STRATA_PLUGIN_INSTANCE_STRUCT_SIZE ((uint32_t)sizeof(strata_plugin_instance))

/** Collective operations named in a fingerprint. */
typedef enum strata_collective_op {
  STRATA_COLL_ALL_REDUCE = 1,
  STRATA_COLL_BROADCAST = 2,
  STRATA_COLL_ALL_GATHER = 3,
  STRATA_COLL_REDUCE_SCATTER = 4,
  STRATA_COLL_REDUCE = 5,
  STRATA_COLL_BARRIER = 6,
  STRATA_COLL_SEND = 7,
  STRATA_COLL_RECV = 8
} strata_collective_op;

/**
 * @brief One collective as seen by one rank, recorded before it starts so
 * that a hang or a mismatch can be reported with what each rank was doing.
 */
typedef struct strata_collective_fingerprint {
  STRATA_STRUCT_HEADER;
  const char* communicator; /**< communicator or group name; borrowed */
  uint32_t op;              /**< strata_collective_op */
  uint32_t reduce_op;       /**< strata_reduce_op, where it applies */
  uint64_t sequence;        /**< per-communicator sequence number, from 0 */
  DLDataType dtype;
  uint64_t count;           /**< elements */
  int32_t rank;             /**< this rank */
  int32_t peer;             /**< root or peer, -1 when all ranks take part */
} strata_collective_fingerprint;

#define STRATA_COLLECTIVE_FINGERPRINT_STRUCT_SIZE ((uint32_t)sizeof(strata_collective_fingerprint))

/**
 * @brief Services the host offers to plugins. Required entries are never NULL
 * in a table the host hands out; entries marked "since 1.1" must be checked
 * with STRATA_HAS_FIELD before use.
 */
typedef struct strata_host_api {
  STRATA_STRUCT_HEADER;

  /** Log one message. `subsystem` names the plugin part ("transport.tcp");
   *  `level` is a strata_log_level. Never blocks on I/O for long; plugins
   *  must not print to stdout/stderr themselves. */
  void (*log)(const struct strata_host_api* host, int32_t level, const char* subsystem,
              const char* message);

  /** Read the job configuration value at `json_pointer` (RFC 6901, e.g.
   *  "/timeouts/collective_s"; "" for the whole document) as JSON text
   *  through `write`. Returns STRATA_ERR_NOT_FOUND when absent. */
  strata_status_t (*get_config)(const struct strata_host_api* host, const char* json_pointer,
                                strata_write_fn write, void* user, strata_error* err);

  /** Create an instance of another plugin's component of `kind` named `name`
   *  with `options_json` (NULL or "" means {}). Loads the providing library
   *  if needed. Fills `*out`; release it with release_plugin. May block while
   *  the instance's create runs. */
  strata_status_t (*create_plugin)(const struct strata_host_api* host, uint32_t kind,
                                   const char* name, const char* options_json,
                                   strata_plugin_instance* out, strata_error* err);

  /** Destroy an instance obtained from create_plugin. `inst` may be zeroed
   *  already (then this does nothing). Not thread-safe for the same instance. */
  void (*release_plugin)(const struct strata_host_api* host, strata_plugin_instance* inst);

  /** Allocate `bytes` on `device` aligned to `alignment` (a power of two, 0 =
   *  64). Returns NULL on failure (or when the device kind is unsupported).
   *  Free with free_memory, same device. Never blocks for long.
   *  Since 1.4, in a host built with CUDA: kDLCUDA (device memory of GPU
   *  device_id from a stream-ordered pool, usable by any stream once
   *  allocate returns; alignment up to 256) and kDLCUDAHost (pinned host
   *  memory). A host without CUDA returns NULL for both. */
  void* (*allocate)(const struct strata_host_api* host, DLDevice device, uint64_t bytes,
                    uint64_t alignment);
  void (*free_memory)(const struct strata_host_api* host, DLDevice device, void* ptr);

  /** Rendezvous key-value store shared by every process of the job. Keys
   *  are NUL-terminated; values are bytes. set overwrites. */
  strata_status_t (*store_set)(const struct strata_host_api* host, const char* key,
                               const void* value, uint64_t len, int64_t timeout_ms,
                               strata_error* err);
  /** Wait until `key` exists (or the deadline passes), then deliver its value
   *  through `write`. */
  strata_status_t (*store_get)(const struct strata_host_api* host, const char* key,
                               strata_write_fn write, void* user, int64_t timeout_ms,
                               strata_error* err);
  /** Atomically add `delta` to the integer stored at `key` (absent = 0) and
   *  return the new value in `*result`. */
  strata_status_t (*store_add)(const struct strata_host_api* host, const char* key,
                               int64_t delta, int64_t* result, int64_t timeout_ms,
                               strata_error* err);
  /** Wait until every key in `keys[0..num_keys)` exists. */
  strata_status_t (*store_wait)(const struct strata_host_api* host, const char* const* keys,
                                uint64_t num_keys, int64_t timeout_ms, strata_error* err);

  /** Monotonic clock in nanoseconds. Never blocks. */
  uint64_t (*now_ns)(const struct strata_host_api* host);

  /** Non-zero once the job has been asked to stop (signal, another rank's
   *  failure). Long-running plugin loops poll it and fail with
   *  STRATA_ERR_ABORTED. Never blocks. */
  int32_t (*abort_requested)(const struct strata_host_api* host);

  /** Record the fingerprint of a collective before it starts (for hang and
   *  mismatch reports). Cheap; never blocks. */
  void (*record_collective)(const struct strata_host_api* host,
                            const strata_collective_fingerprint* fingerprint);

  /* ---- since 1.1 ---- */

  /** Ask every component of this job to stop: sets the flag read by
   *  abort_requested and logs `reason`. Never blocks. */
  void (*request_abort)(const struct strata_host_api* host, const char* reason);

  /* ---- since 1.3: variables on parameter-server tasks ----
   * For the parameter_server strategy: the host owns the connections to the
   * ps tasks (the ClusterCoordinator's on the chief, the strata::Server's on
   * a worker), so a strategy plugin reaches them through these entries.
   * A variable is named by an opaque reference (bytes the host writes at
   * creation; the plugin keeps them and passes them back). Every call blocks
   * up to the host's parameter-server operation deadline and fails with
   * UNAVAILABLE naming the ps task when it is gone, FAILED_PRECONDITION when
   * this process runs neither a ClusterCoordinator nor a Server. */

  /** Create a variable on the ps tasks with a copy of `initial` (host
   *  memory, compact), placed round robin in creation order; with
   *  `options_json` {"partitioner": {"name": "fixed_shards"|"min_size"|
   *  "max_size", ...}, "synchronization": s, "aggregation": a,
   *  "trainable": t} (NULL = {}) sharded along axis 0. Only on the chief.
   *  Writes the reference through `write`. */
  strata_status_t (*ps_variable_create)(const struct strata_host_api* host, const char* name,
                                        const DLTensor* initial, const char* options_json,
                                        strata_write_fn write, void* user, strata_error* err);
  /** Read the value of the variable `ref` names (all shards concatenated);
   *  the result is owned by the caller (call its deleter). */
  strata_status_t (*ps_variable_read)(const struct strata_host_api* host, const void* ref,
                                      uint64_t ref_len, DLManagedTensor** out, strata_error* err);
  /** Apply strata_var_update_op `op` with `value` (same dtype and shape,
   *  host memory) to the variable `ref` names; atomic per shard. */
  strata_status_t (*ps_variable_update)(const struct strata_host_api* host, const void* ref,
                                        uint64_t ref_len, uint32_t op, const DLTensor* value,
                                        strata_error* err);

  /* ---- since 1.4: CUDA devices ----
   * A host built without CUDA fills these entries with functions that fail
   * with STRATA_ERR_UNIMPLEMENTED ("needs a build with CUDA") and report a
   * count of 0, so a plugin never needs its own CUDA link to learn whether
   * GPUs exist. Streams are opaque (cudaStream_t) and belong to the device
   * they were created on. All are thread-safe. */

  /** Number of devices of `device_type` (kDLCUDA; kDLCPU reports 1) visible
   *  to this process through `*count`. With no usable GPU (no driver, no
   *  device, CUDA_VISIBLE_DEVICES empty) `*count` is 0 and the call returns
   *  STRATA_ERR_FAILED_PRECONDITION whose message gives the CUDA error and
   *  what to check; UNIMPLEMENTED when the host has no CUDA. Never blocks
   *  for long (the first call initialises the driver). */
  strata_status_t (*device_count)(const struct strata_host_api* host, int32_t device_type,
                                  int32_t* count, strata_error* err);
  /** Make `device` (kDLCUDA) current for the calling thread (cudaSetDevice).
   *  kDLCPU: does nothing. INVALID_ARGUMENT naming the ordinal and the
   *  visible count when it is out of range. */
  strata_status_t (*set_device)(const struct strata_host_api* host, DLDevice device, strata_error* err);
  /** Create a non-blocking stream on `device` (kDLCUDA) and write it to
   *  `*stream`; destroy it with stream_destroy. */
  strata_status_t (*stream_create)(const struct strata_host_api* host, DLDevice device, void** stream,
                                   strata_error* err);
  /** Destroy a stream from stream_create. Does not wait: work already
   *  enqueued still completes, then CUDA releases the stream. NULL does
   *  nothing. */
  void (*stream_destroy)(const struct strata_host_api* host, void* stream);
  /** Wait until every operation enqueued on `stream` (NULL: the calling
   *  thread's current device's legacy default stream) has finished, polling
   *  at most `timeout_ms` (< 0: the host's collective timeout). Fails with
   *  DEADLINE_EXCEEDED when it passes, ABORTED when the job is asked to stop,
   *  INTERNAL with the CUDA error when an operation failed. */
  strata_status_t (*stream_synchronize)(const struct strata_host_api* host, void* stream,
                                        int64_t timeout_ms, strata_error* err);
  /** Copy `bytes` from `src` on `src_device` to `dst` on `dst_device`
   *  (kDLCPU pageable, kDLCUDAHost pinned, kDLCUDA device; any pair,
   *  including between two GPUs), ordered on `stream`. Returns once
   *  enqueued: synchronise the stream before reading `dst` or reusing
   *  `src`. `stream` NULL: the copy is synchronous (done when this returns;
   *  it does not wait for work on other streams). */
  strata_status_t (*memcpy_async)(const struct strata_host_api* host, void* dst, DLDevice dst_device,
                                  const void* src, DLDevice src_device, uint64_t bytes, void* stream,
                                  strata_error* err);

  /* ---- since 1.5: arithmetic on GPU memory ---- */

  /** Update `count` elements of `dtype` at `dst` with those at `src`, both
   *  memory of `device` (kDLCUDA), as a variable update does: `op` is a
   *  strata_var_update_op (ASSIGN: dst = src, ASSIGN_ADD: dst += src,
   *  ASSIGN_SUB: dst -= src). The arithmetic is the host's, so the bits
   *  equal what the same update gives in host memory: float32/float64
   *  IEEE round to nearest; float16/bfloat16 computed in float32 and
   *  rounded to nearest even; int32/int64 wrap. Ordered on `stream` (NULL:
   *  synchronous, done on return, waiting at most the host's collective
   *  timeout: DEADLINE_EXCEEDED past it, ABORTED when the job is asked to
   *  stop; it does not wait for work on other streams). dst == src is allowed; any other overlap, memory that is not
   *  `device`'s, or an unsupported dtype or op is INVALID_ARGUMENT, checked
   *  before anything runs. FAILED_PRECONDITION without a visible GPU,
   *  UNIMPLEMENTED when the host has no CUDA. */
  strata_status_t (*device_update)(const struct strata_host_api* host, uint32_t op, DLDataType dtype, void* dst,
                                   const void* src, uint64_t count, DLDevice device, void* stream,
                                   strata_error* err);
} strata_host_api;

/** Size of the host table at ABI 1.0 (the last 1.0 field is record_collective). */
#define STRATA_HOST_API_STRUCT_SIZE_1_0 \
  ((uint32_t)(offsetof(strata_host_api, record_collective) + sizeof(void*)))
/** Size of the host table at ABI 1.2 (the last field then was request_abort). */
#define STRATA_HOST_API_STRUCT_SIZE_1_2 \
  ((uint32_t)(offsetof(strata_host_api, request_abort) + sizeof(void*)))
/** Size of the host table at ABI 1.3 (the last field then was ps_variable_update). */
#define STRATA_HOST_API_STRUCT_SIZE_1_3 \
  ((uint32_t)(offsetof(strata_host_api, ps_variable_update) + sizeof(void*)))
/** Size of the host table at ABI 1.4 (the last field then was memcpy_async). */
#define STRATA_HOST_API_STRUCT_SIZE_1_4 \
  ((uint32_t)(offsetof(strata_host_api, memcpy_async) + sizeof(void*)))
#define STRATA_HOST_API_STRUCT_SIZE ((uint32_t)sizeof(strata_host_api))

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_HOST_H_ */
