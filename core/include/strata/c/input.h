/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file input.h
 * @brief InputPipeline vtable: a source of elements (tuples of named DLPack
 *        tensors) for one input pipeline of a distributed job.
 *
 * The host opens one pipeline per input context (tf.distribute.InputContext),
 * may shard it, and then pulls elements with next(). Dataset transformations
 * (shuffle, batch, repeat, map, prefetch) run in the host on top of this
 * element stream. A pipeline instance is used by one thread at a time; next()
 * may block on I/O up to its timeout.
 */
#ifndef STRATA_C_INPUT_H_
#define STRATA_C_INPUT_H_

#include <dlpack/dlpack.h>

#include "strata/c/common.h"
#include "strata/c/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_input_s* strata_input_t;

/** tf.distribute.InputContext. */
typedef struct strata_input_context {
  STRATA_STRUCT_HEADER;
  int32_t num_input_pipelines;
  int32_t input_pipeline_id;
  int32_t num_replicas_in_sync;
} strata_input_context;

#define STRATA_INPUT_CONTEXT_STRUCT_SIZE ((uint32_t)sizeof(strata_input_context))

/** Shard info flags. */
#define STRATA_INPUT_CAN_SHARD_BY_FILE (1u << 0)
#define STRATA_INPUT_CAN_SHARD_BY_DATA (1u << 1)

/** Sharding policies (tf.data.experimental.AutoShardPolicy, as applied). */
typedef enum strata_shard_policy {
  STRATA_SHARD_OFF = 0,
  STRATA_SHARD_FILE = 1,
  STRATA_SHARD_DATA = 2
} strata_shard_policy;

/** One element. Filled by next(); the tensors are owned by the caller (call
 *  each deleter); `names` point into storage that stays valid until the
 *  next call to next() or close(). */
#define STRATA_ELEMENT_MAX_COMPONENTS 16
typedef struct strata_element {
  STRATA_STRUCT_HEADER;
  uint32_t num_components;
  const char* names[STRATA_ELEMENT_MAX_COMPONENTS];
  DLManagedTensor* tensors[STRATA_ELEMENT_MAX_COMPONENTS];
} strata_element;

#define STRATA_ELEMENT_STRUCT_SIZE ((uint32_t)sizeof(strata_element))

typedef struct strata_input_vtable {
  STRATA_STRUCT_HEADER;

  /** Required. Open from options (e.g. {"files": [...]}, {"npy": {...}})
   *  for `ctx`. A missing or unreadable file is NOT_FOUND naming it. */
  strata_status_t (*open)(const strata_host_api* host, const char* options_json,
                          const strata_input_context* ctx, strata_input_t* out,
                          strata_error* err);
  void (*close)(strata_input_t in);

  /** Required. STRATA_INPUT_CAN_SHARD_* flags in *flags and, for file-based
   *  sources, the file list as a JSON array through `write`. Never blocks. */
  strata_status_t (*shard_info)(strata_input_t in, uint32_t* flags, strata_write_fn write,
                                void* user, strata_error* err);
  /** Required. Keep only shard `index` of `num_shards` under `policy`:
   *  FILE keeps files index, index+n, ...; DATA keeps elements index,
   *  index+n, .... FILE with fewer files than shards is INVALID_ARGUMENT.
   *  Call before the first next(). */
  strata_status_t (*shard)(strata_input_t in, uint32_t policy, int32_t num_shards, int32_t index,
                           strata_error* err);
  /** Required. Next element, waiting up to timeout_ms. OUT_OF_RANGE at the
   *  end of data; DATA_LOSS for a corrupt record (message names the file and
   *  byte offset). */
  strata_status_t (*next)(strata_input_t in, int64_t timeout_ms, strata_element* out,
                          strata_error* err);
  /** Optional. Number of elements after sharding; -1 unknown, -2 infinite. */
  int64_t (*cardinality)(strata_input_t in);
  /** Optional. Serialise the position so a resumed job neither repeats nor
   *  skips data. */
  strata_status_t (*save_state)(strata_input_t in, strata_write_fn write, void* user,
                                strata_error* err);
  /** Optional. Restore a position saved by save_state (same options). */
  strata_status_t (*restore_state)(strata_input_t in, const void* data, uint64_t len,
                                   strata_error* err);
} strata_input_vtable;

/** Size of the vtable at ABI 1.0: a frozen number, never sizeof (which grows). */
#define STRATA_INPUT_VTABLE_STRUCT_SIZE_1_0 ((uint32_t)80)
#define STRATA_INPUT_VTABLE_STRUCT_SIZE ((uint32_t)sizeof(strata_input_vtable))

/* ------------------------------------------------------------------------
 * Sources handed over in memory (ABI 1.1; new types, the vtable is
 * unchanged). The in-tree "memory" and "generator" pipelines take the
 * address of one of these structs in their options as a hex string, e.g.
 * {"arrays": "0x7f12..."}; the struct and everything it points to must
 * outlive every pipeline opened from it (the C++ Dataset API keeps them
 * alive for the user).
 * ---------------------------------------------------------------------- */

/** Arrays sliced along their first dimension ("memory" pipeline): element
 *  i holds row i of every component. Tensors are borrowed, host memory,
 *  contiguous, and agree on their first dimension. */
typedef struct strata_input_arrays {
  STRATA_STRUCT_HEADER;
  uint32_t num_components;
  const char* names[STRATA_ELEMENT_MAX_COMPONENTS];
  const DLTensor* tensors[STRATA_ELEMENT_MAX_COMPONENTS];
} strata_input_arrays;

#define STRATA_INPUT_ARRAYS_STRUCT_SIZE ((uint32_t)sizeof(strata_input_arrays))

/** A user generator ("generator" pipeline). Every open() of a pipeline
 *  calls start() for a fresh pass (so repeat() and every epoch restart it);
 *  next() fills one element (the caller owns its tensors) and returns
 *  STRATA_OK, or STRATA_ERR_OUT_OF_RANGE at the end of the pass, or an
 *  error with `err` set; finish() ends the pass (close()). next() runs on
 *  the pipeline's thread, one call at a time per pass. */
typedef struct strata_input_generator {
  STRATA_STRUCT_HEADER;
  void* user;
  strata_status_t (*start)(void* user, const strata_input_context* ctx, void** pass, strata_error* err);
  strata_status_t (*next)(void* pass, strata_element* out, strata_error* err);
  void (*finish)(void* pass);
} strata_input_generator;

#define STRATA_INPUT_GENERATOR_STRUCT_SIZE ((uint32_t)sizeof(strata_input_generator))

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_INPUT_H_ */
