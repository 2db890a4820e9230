/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file resolver.h
 * @brief ClusterResolver vtable (tf.distribute.cluster_resolver): who is in
 *        the job and which task this process is.
 *
 * Results are JSON so that new fields need no ABI change. A resolver reads
 * its environment at create time; later calls never block and never read the
 * environment again. Not thread-safe per instance.
 */
#ifndef STRATA_C_RESOLVER_H_
#define STRATA_C_RESOLVER_H_

#include "strata/c/common.h"
#include "strata/c/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_resolver_s* strata_resolver_t;

typedef struct strata_resolver_vtable {
  STRATA_STRUCT_HEADER;

  /** Required. Create from options (tf.distribute constructor arguments as
   *  JSON, e.g. {"jobs": {"worker": 4}, "port_base": 8888}). Malformed
   *  environment (bad TF_CONFIG, bad hostlist) is INVALID_ARGUMENT naming
   *  the variable and the fix. */
  strata_status_t (*create)(const strata_host_api* host, const char* options_json,
                            strata_resolver_t* out, strata_error* err);
  void (*destroy)(strata_resolver_t r);

  /** Required. The resolved cluster as one JSON object:
   *  {"cluster_spec": {job: [addr...] or {index: addr}}, "task_type",
   *   "task_id", "rpc_layer", "environment", "num_accelerators": {...},
   *   "env_after": {VAR: value}} with null where a field does not apply. */
  strata_status_t (*describe)(strata_resolver_t r, strata_write_fn write, void* user,
                              strata_error* err);

  /** Required. master(task_type, task_id, rpc_layer): the address of that
   *  task, prefixed with "<rpc_layer>://" when a layer applies. NULL
   *  task_type means this process's task; NULL rpc_layer the resolver's. */
  strata_status_t (*master)(strata_resolver_t r, const char* task_type, int32_t task_id,
                            const char* rpc_layer, strata_write_fn write, void* user,
                            strata_error* err);

  /** Optional. Non-zero when the current environment looks like this
   *  resolver's (used for auto-detection). Never blocks; reads the environment. */
  int32_t (*detect)(const strata_host_api* host);
} strata_resolver_vtable;

/** Size of the vtable at ABI 1.0: a frozen number, never sizeof (which grows). */
#define STRATA_RESOLVER_VTABLE_STRUCT_SIZE_1_0 ((uint32_t)56)
#define STRATA_RESOLVER_VTABLE_STRUCT_SIZE ((uint32_t)sizeof(strata_resolver_vtable))

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_RESOLVER_H_ */
