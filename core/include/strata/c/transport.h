/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file transport.h
 * @brief Transport vtable: moving bytes between processes (TCP on Boost.Asio,
 *        RDMA on libfabric, NCCL on CUDA).
 *
 * Model. A transport instance is one process's endpoint factory. A
 * communicator joins `world_size` ranks that rendezvous through the host's
 * key-value store under the communicator's name. Point-to-point operations
 * are non-blocking: isend/irecv return a request at once; test polls it and
 * never blocks; wait blocks up to a deadline. Messages between one pair of
 * ranks with the same tag are matched in the order they were posted. A
 * receive must be posted with a buffer at least as large as the message
 * (a larger message fails the request with INVALID_ARGUMENT). Transports that
 * need registered memory (libfabric with FI_MR_LOCAL, RDMA) report
 * STRATA_TRANSPORT_CAP_REQUIRES_MR; callers then pass a region from
 * mem_register covering the buffer, and may always pass one (others ignore it).
 *
 * Failure. A dead or stalled peer fails that peer's requests with UNAVAILABLE
 * or DEADLINE_EXCEEDED, naming the peer rank and address. abort() may be
 * called from any thread at any time: every pending and future operation of
 * the communicator fails with ABORTED, so one rank's failure can unblock all
 * (the ncclCommAbort model). After an error the communicator is unusable;
 * destroy it and create a new one (recoverable), or exit.
 *
 * Threads. Unless caps report STRATA_TRANSPORT_CAP_THREAD_SAFE, calls on one
 * communicator must be serialised by the caller; abort is always safe.
 */
#ifndef STRATA_C_TRANSPORT_H_
#define STRATA_C_TRANSPORT_H_

#include <dlpack/dlpack.h>

#include "strata/c/common.h"
#include "strata/c/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_transport_s* strata_transport_t;
typedef struct strata_comm_s* strata_comm_t;
typedef struct strata_request_s* strata_request_t;
typedef struct strata_mem_region_s* strata_mem_region_t;

/** Capability flags (strata_transport_caps.flags). */
#define STRATA_TRANSPORT_CAP_P2P (1ull << 0)                /**< isend/irecv */
#define STRATA_TRANSPORT_CAP_RMA (1ull << 1)                /**< iwrite to registered remote memory */
#define STRATA_TRANSPORT_CAP_NATIVE_COLLECTIVES (1ull << 2) /**< all_reduce etc. non-NULL */
#define STRATA_TRANSPORT_CAP_MEM_HOST (1ull << 3)           /**< host buffers */
#define STRATA_TRANSPORT_CAP_MEM_CUDA (1ull << 4)           /**< CUDA device buffers */
#define STRATA_TRANSPORT_CAP_THREAD_SAFE (1ull << 5)        /**< concurrent calls on one comm */
#define STRATA_TRANSPORT_CAP_REQUIRES_MR (1ull << 6)        /**< buffers must be registered */

typedef struct strata_transport_caps {
  STRATA_STRUCT_HEADER;
  uint64_t flags;                 /**< STRATA_TRANSPORT_CAP_* */
  uint32_t max_inflight;          /**< requests per peer before isend/irecv may return UNAVAILABLE; 0 = no limit */
  uint32_t reserved;
  uint64_t max_message_bytes;     /**< largest single message; 0 = no limit */
  uint64_t preferred_chunk_bytes; /**< chunk size pipelined collectives should use */
} strata_transport_caps;

#define STRATA_TRANSPORT_CAPS_STRUCT_SIZE ((uint32_t)sizeof(strata_transport_caps))

/** Where and how a buffer lives, for p2p calls. */
typedef struct strata_buffer {
  STRATA_STRUCT_HEADER;
  void* data;                /**< start of the bytes */
  uint64_t bytes;            /**< length */
  DLDevice device;           /**< kDLCPU or kDLCUDA */
  strata_mem_region_t mr;    /**< region covering the buffer, or NULL */
  void* stream;              /**< cudaStream_t for device buffers (NCCL), or NULL */
} strata_buffer;

#define STRATA_BUFFER_STRUCT_SIZE ((uint32_t)sizeof(strata_buffer))

typedef struct strata_transport_vtable {
  STRATA_STRUCT_HEADER;

  /** Required. Create from options (e.g. {"bind": "0.0.0.0", "ports":
   *  "29500-29600", "connections_per_peer": 2, "iface": "lo"}). */
  strata_status_t (*create)(const strata_host_api* host, const char* options_json,
                            strata_transport_t* out, strata_error* err);
  /** Required. Every communicator must be destroyed first. */
  void (*destroy)(strata_transport_t t);
  /** Required. Never blocks. */
  strata_status_t (*get_caps)(strata_transport_t t, strata_transport_caps* caps, strata_error* err);

  /** Required. Join communicator `name` as `rank` of `world_size`; rendezvous
   *  through the host store; fails with DEADLINE_EXCEEDED naming the ranks
   *  that never arrived. Blocks up to timeout_ms. */
  strata_status_t (*comm_create)(strata_transport_t t, const char* name, int32_t rank,
                                 int32_t world_size, int64_t timeout_ms, strata_comm_t* out,
                                 strata_error* err);
  /** Required. Cancels what is pending, closes connections. */
  void (*comm_destroy)(strata_comm_t c);
  /** Required. Thread-safe, never blocks: fail every pending and future
   *  operation on `c` with ABORTED and `reason`. */
  void (*comm_abort)(strata_comm_t c, const char* reason);

  /** Required (may be a no-op returning a dummy region). Register memory
   *  for p2p/RMA. The region must be deregistered before the memory is freed. */
  strata_status_t (*mem_register)(strata_comm_t c, void* data, uint64_t bytes, DLDevice device,
                                  strata_mem_region_t* out, strata_error* err);
  void (*mem_deregister)(strata_comm_t c, strata_mem_region_t mr);

  /** Required. Post a send of `buf` to `peer` with `tag`; returns at once.
   *  The buffer must not change until the request completes. */
  strata_status_t (*isend)(strata_comm_t c, int32_t peer, uint64_t tag, const strata_buffer* buf,
                           strata_request_t* out, strata_error* err);
  /** Required. Post a receive into `buf` from `peer` with `tag`; returns at
   *  once. The data lands directly in `buf` (no staging copy needed by the caller). */
  strata_status_t (*irecv)(strata_comm_t c, int32_t peer, uint64_t tag, const strata_buffer* buf,
                           strata_request_t* out, strata_error* err);
  /** Required. Never blocks. Sets *done to 1 when the request finished (then
   *  it is released and *bytes holds the bytes moved) or 0. A failed request
   *  is released and its error returned. */
  strata_status_t (*test)(strata_comm_t c, strata_request_t req, int32_t* done, uint64_t* bytes,
                          strata_error* err);
  /** Required. Block up to timeout_ms for `req`. Released unless the result
   *  is DEADLINE_EXCEEDED. */
  strata_status_t (*wait)(strata_comm_t c, strata_request_t req, int64_t timeout_ms,
                          uint64_t* bytes, strata_error* err);
  /** Required. Cancel and release a request that has not completed. */
  void (*cancel)(strata_comm_t c, strata_request_t req);

  /* Optional native collectives (NULL when the transport has none, e.g.
   * TCP). Blocking on the host unless `stream` is given, in which case they
   * are enqueued on the device stream and return at once. `count` is in
   * elements of `dtype`; in-place when send == recv. */
  strata_status_t (*all_reduce)(strata_comm_t c, const void* send, void* recv, uint64_t count,
                                DLDataType dtype, uint32_t op, void* stream, strata_error* err);
  strata_status_t (*broadcast)(strata_comm_t c, const void* send, void* recv, uint64_t count,
                               DLDataType dtype, int32_t root, void* stream, strata_error* err);
  /** recv holds world_size * count_per_rank elements, in rank order. */
  strata_status_t (*all_gather)(strata_comm_t c, const void* send, void* recv,
                                uint64_t count_per_rank, DLDataType dtype, void* stream,
                                strata_error* err);
  /** send holds world_size * count_per_rank elements; recv gets this rank's slice. */
  strata_status_t (*reduce_scatter)(strata_comm_t c, const void* send, void* recv,
                                    uint64_t count_per_rank, DLDataType dtype, uint32_t op,
                                    void* stream, strata_error* err);

  /* Optional one-sided RMA (STRATA_TRANSPORT_CAP_RMA). */
  /** Serialise the key a peer needs to write into `mr` through `write`. */
  strata_status_t (*mem_export)(strata_comm_t c, strata_mem_region_t mr, strata_write_fn write,
                                void* user, strata_error* err);
  /** Write `buf` into the peer's exported region at `remote_offset`. */
  strata_status_t (*iwrite)(strata_comm_t c, int32_t peer, const strata_buffer* buf,
                            const void* remote_key, uint64_t remote_key_len,
                            uint64_t remote_offset, strata_request_t* out, strata_error* err);
} strata_transport_vtable;

/** Size of the vtable at ABI 1.0: a frozen number, never sizeof (which grows). */
#define STRATA_TRANSPORT_VTABLE_STRUCT_SIZE_1_0 ((uint32_t)168)
#define STRATA_TRANSPORT_VTABLE_STRUCT_SIZE ((uint32_t)sizeof(strata_transport_vtable))

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_TRANSPORT_H_ */
