/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file strategy.h
 * @brief Strategy vtable (tf.distribute.Strategy): replica execution and
 *        variable placement.
 *
 * Contexts. A strategy instance is in *cross-replica context* on the thread
 * that calls into it outside `run`. `run` calls the replica function once per
 * local replica, each on the replica's own thread (or the caller's thread for
 * a single replica), with a strata_replica_t that is valid only during that
 * call: that is *replica context*. Replica-context collectives
 * (replica_all_reduce, replica_all_gather, replica_merge_call and variable
 * updates in replica context) must be called by every local replica in the
 * same order; they block until all replicas arrived, bounded by the
 * strategy's collective timeout (DEADLINE_EXCEEDED names the missing
 * replicas). When one replica function fails, `run` cancels the others'
 * pending collectives (ABORTED) and returns the first failure.
 *
 * Cross-replica calls are not thread-safe with each other or with `run`;
 * the host serialises them.
 */
#ifndef STRATA_C_STRATEGY_H_
#define STRATA_C_STRATEGY_H_

#include <dlpack/dlpack.h>

#include "strata/c/common.h"
#include "strata/c/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_strategy_s* strata_strategy_t;
/** A replica's context; valid only inside the replica function it was given to. */
typedef struct strata_replica_s* strata_replica_t;
/** A variable created by a strategy under its placement policy. */
typedef struct strata_variable_s* strata_variable_t;

/** Variable synchronization (tf.VariableSynchronization). */
typedef enum strata_var_sync {
  STRATA_VAR_SYNC_AUTO = 0,     /**< ON_WRITE */
  STRATA_VAR_SYNC_ON_WRITE = 1, /**< mirrored: copies kept equal at every write */
  STRATA_VAR_SYNC_ON_READ = 2,  /**< each replica writes its own copy; aggregated on cross-replica read */
  STRATA_VAR_SYNC_NONE = 3      /**< rejected by the in-tree strategies, as in TF */
} strata_var_sync;

/** Variable aggregation (tf.VariableAggregation). */
typedef enum strata_var_aggregation {
  STRATA_VAR_AGG_NONE = 0,
  STRATA_VAR_AGG_SUM = 1,
  STRATA_VAR_AGG_MEAN = 2,
  STRATA_VAR_AGG_ONLY_FIRST_REPLICA = 3
} strata_var_aggregation;

/** Variable update operations. */
typedef enum strata_var_update_op {
  STRATA_VAR_ASSIGN = 0,
  STRATA_VAR_ASSIGN_ADD = 1,
  STRATA_VAR_ASSIGN_SUB = 2
} strata_var_update_op;

/** How a variable is to be created. */
typedef struct strata_variable_desc {
  STRATA_STRUCT_HEADER;
  const char* name;        /**< for messages and checkpoints; borrowed */
  uint32_t synchronization; /**< strata_var_sync */
  uint32_t aggregation;     /**< strata_var_aggregation */
  int32_t trainable;        /**< non-zero when trainable */
  /* ---- since 1.3 ---- */
  /** Non-NULL: do not create a variable but attach to the existing one this
   *  reference names (what variable_ref wrote in another process of the
   *  job, e.g. a parameter_server variable created on the chief and passed
   *  to a worker's scheduled function); `initial` is then NULL and
   *  synchronization/aggregation/trainable come from the reference. A
   *  strategy that cannot attach returns INVALID_ARGUMENT. Borrowed. */
  const void* attach_ref;
  uint64_t attach_ref_len; /**< bytes at attach_ref */
} strata_variable_desc;

#define STRATA_VARIABLE_DESC_STRUCT_SIZE ((uint32_t)sizeof(strata_variable_desc))

/** The replica function given to run. `replica_id` is the replica's index
 *  among this process's replicas. Return STRATA_OK or an error (with `err`). */
typedef strata_status_t (*strata_replica_fn)(void* user, strata_replica_t replica,
                                             uint32_t local_replica_id, strata_error* err);

/** A merge function: called exactly once, in cross-replica context, on one of
 *  the replicas' threads, with every local replica's argument in replica
 *  order. The other replicas wait until it returns. */
typedef strata_status_t (*strata_merge_fn)(void* merge_user, void* const* replica_args,
                                           uint32_t num_replicas, strata_error* err);

typedef struct strata_strategy_vtable {
  STRATA_STRUCT_HEADER;

  /** Required. Create from `options_json` (NULL = {}), e.g.
   *  {"devices": ["cpu:0", "cpu:1"], "cross_device_ops": {"name": "...",
   *  "options": {...}}, "timeout_s": 300}. Unknown options are an
   *  INVALID_ARGUMENT error. May create threads and other plugin instances. */
  strata_status_t (*create)(const strata_host_api* host, const char* options_json,
                            strata_strategy_t* out, strata_error* err);
  /** Required. Destroy; every variable of the instance must be destroyed first. */
  void (*destroy)(strata_strategy_t s);

  /** Required. Describe the instance as one JSON object through `write`:
   *  {"num_replicas_in_sync": N, "num_local_replicas": n,
   *   "worker_devices": [...], "parameter_devices": [...],
   *   "worker_index": i, "num_workers": w, "is_chief": true}. Never blocks. */
  strata_status_t (*describe)(strata_strategy_t s, strata_write_fn write, void* user,
                              strata_error* err);

  /** Required. Call `fn` once per local replica (see file comment) and wait
   *  for all. Not reentrant: calling run from inside a replica function is a
   *  FAILED_PRECONDITION error. */
  strata_status_t (*run)(strata_strategy_t s, strata_replica_fn fn, void* user, strata_error* err);

  /** Required. replica_id_in_sync_group of `r` (global across workers). */
  int32_t (*replica_id_in_sync_group)(strata_strategy_t s, strata_replica_t r);

  /** Required. Replica-context batch all-reduce: every replica passes its
   *  num_tensors inputs and outputs (outputs may alias inputs); each output
   *  receives op over all replicas in sync. Collective (see file comment). */
  strata_status_t (*replica_all_reduce)(strata_strategy_t s, strata_replica_t r, uint32_t op,
                                        uint32_t num_tensors, const DLTensor* const* inputs,
                                        DLTensor* const* outputs, strata_error* err);

  /** Required. Replica-context all-gather along `axis` (sizes along axis may
   *  differ by replica). The result is a new tensor owned by the caller
   *  (call its deleter). Collective. */
  strata_status_t (*replica_all_gather)(strata_strategy_t s, strata_replica_t r,
                                        const DLTensor* input, int32_t axis,
                                        DLManagedTensor** out, strata_error* err);

  /** Required. merge_call: every local replica calls it with its own
   *  `replica_arg`; `fn` runs once with all of them (see strata_merge_fn),
   *  given the `merge_user` of local replica 0. Collective. */
  strata_status_t (*replica_merge_call)(strata_strategy_t s, strata_replica_t r,
                                        strata_merge_fn fn, void* merge_user, void* replica_arg,
                                        strata_error* err);

  /** Required. Cross-replica reduce of per-replica values (one per local
   *  replica, values[0..num_local)) across all replicas in sync into
   *  `output` (caller-allocated, host memory). */
  strata_status_t (*reduce_to)(strata_strategy_t s, uint32_t op, uint32_t num_values,
                               const DLTensor* const* values, DLTensor* output,
                               strata_error* err);

  /** Required. Cross-replica gather: concatenate every replica's value along
   *  `axis` in replica_id_in_sync_group order. Result owned by the caller. */
  strata_status_t (*gather_to)(strata_strategy_t s, uint32_t num_values,
                               const DLTensor* const* values, int32_t axis,
                               DLManagedTensor** out, strata_error* err);

  /** Required. Cross-replica context. Create a variable with initial value
   *  `initial` (copied) under the strategy's placement policy. Errors:
   *  INVALID_ARGUMENT for combinations TF rejects (ON_READ and trainable,
   *  SYNC_NONE). */
  strata_status_t (*variable_create)(strata_strategy_t s, const strata_variable_desc* desc,
                                     const DLTensor* initial, strata_variable_t* out,
                                     strata_error* err);
  /** Required. */
  void (*variable_destroy)(strata_strategy_t s, strata_variable_t v);

  /** Required. Read a copy of the value. `r` NULL: cross-replica read (ON_READ
   *  variables are aggregated; NONE aggregation is FAILED_PRECONDITION).
   *  Otherwise replica `r`'s copy. Result owned by the caller. */
  strata_status_t (*variable_read)(strata_strategy_t s, strata_variable_t v, strata_replica_t r,
                                   DLManagedTensor** out, strata_error* err);

  /** Required. Update with strata_var_update_op `op` and `value`.
   *  `r` NULL (cross-replica): every copy is updated (ON_READ + SUM assign
   *  stores value / num_replicas; ON_READ + SUM assign_add/sub is
   *  FAILED_PRECONDITION, as in TF). In replica context: ON_READ updates the
   *  replica's copy only; ON_WRITE is a collective that aggregates the
   *  replicas' values per the variable's aggregation (NONE is
   *  FAILED_PRECONDITION) and applies the result to every copy. */
  strata_status_t (*variable_update)(strata_strategy_t s, strata_variable_t v, strata_replica_t r,
                                     uint32_t op, const DLTensor* value, strata_error* err);

  /* ---- since 1.1 (optional) ---- */

  /** Borrow a read-only view of replica `r`'s copy (r NULL: the primary
   *  copy) without copying. Valid until the next update or destroy of `v`. */
  strata_status_t (*variable_view)(strata_strategy_t s, strata_variable_t v, strata_replica_t r,
                                   DLTensor* out, strata_error* err);
  /** Serialise strategy-private state (not variables) for a checkpoint. */
  strata_status_t (*save_state)(strata_strategy_t s, strata_write_fn write, void* user,
                                strata_error* err);
  /** Restore what save_state wrote. */
  strata_status_t (*restore_state)(strata_strategy_t s, const void* data, uint64_t len,
                                   strata_error* err);

  /* ---- since 1.2 (optional) ---- */

  /** Switch the running job to transport `name` with `options_json` (NULL or
   *  "" = {}), e.g. ("tcp", "{\"connections_per_peer\": 1}"). Collective:
   *  every worker of the job calls it at the same point of its program, in
   *  cross-replica context, with no replica function running. All or
   *  nothing: when the workers ask for different transports, or the new
   *  transport cannot be created or connected on any worker, EVERY worker
   *  returns the same error (naming the workers and the cause) and the job
   *  stays on its old transport, usable as before. Blocks for at most a few
   *  collective timeouts (the agreement rounds plus the new communicator's
   *  rendezvous). Results of later collectives do not depend on the
   *  transport. NULL = unsupported: the host reports UNIMPLEMENTED naming
   *  the strategy. */
  strata_status_t (*set_transport)(strata_strategy_t s, const char* name, const char* options_json,
                                   strata_error* err);

  /* ---- since 1.3 (optional) ---- */

  /** Write, through `write`, a reference by which another process of the
   *  job can attach to variable `v` (strata_variable_desc.attach_ref) and
   *  the host can address it (parameter_server: the host's ps variable
   *  reference). NULL = the strategy's variables live in this process only.
   *  Never blocks. */
  strata_status_t (*variable_ref)(strata_strategy_t s, strata_variable_t v, strata_write_fn write,
                                  void* user, strata_error* err);

  /* ---- since 1.4 (optional) ---- */

  /** The cudaStream_t (as void*) on which replica `r`'s device work is
   *  ordered: the strategy creates one per GPU replica and orders its own
   *  copies for that replica on it, so user kernels enqueued on it see
   *  the replica's inputs and variables. NULL for a replica on a host
   *  device (or NULL `r`). Called from the replica's thread during run;
   *  never blocks. NULL entry = the strategy has host replicas only. */
  void* (*replica_stream)(strata_strategy_t s, strata_replica_t r);
} strata_strategy_vtable;

/** Size of the vtable at ABI 1.0 (up to variable_update). */
#define STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_0 \
  ((uint32_t)(offsetof(strata_strategy_vtable, variable_update) + sizeof(void*)))
/** Size of the vtable at ABI 1.1 (up to restore_state). */
#define STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_1 \
  ((uint32_t)(offsetof(strata_strategy_vtable, restore_state) + sizeof(void*)))
/** Size of the vtable at ABI 1.2 (up to set_transport). */
#define STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_2 \
  ((uint32_t)(offsetof(strata_strategy_vtable, set_transport) + sizeof(void*)))
/** Size of the vtable at ABI 1.3 (up to variable_ref). */
#define STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_3 \
  ((uint32_t)(offsetof(strata_strategy_vtable, variable_ref) + sizeof(void*)))
#define STRATA_STRATEGY_VTABLE_STRUCT_SIZE ((uint32_t)sizeof(strata_strategy_vtable))

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_STRATEGY_H_ */
