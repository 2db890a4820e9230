/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file cross_device_ops.h
 * @brief CrossDeviceOps vtable: reductions and copies among the replicas'
 *        tensors (tf.distribute.CrossDeviceOps).
 *
 * A CrossDeviceOps instance serves one Strategy instance. The strategy calls
 * it from one thread at a time with the tensors of all its local replicas
 * (`num_replicas` of them, replica-major within each tensor group); an
 * implementation that also spans processes gets its transport, rank and
 * world size from its options (`{"transport": "tcp", ...}`) and the host's
 * create_plugin, and then reduces the local result across processes before
 * writing the outputs. Every process must issue the same calls in the same
 * order. Inputs are borrowed for the duration of the call. Outputs are
 * caller-allocated with the right shape and dtype; an output may alias an
 * input (in place). All tensors of one group share dtype and element count.
 * Tensors are DLPack views; v1 implementations must accept kDLCPU and may
 * reject other devices with STRATA_ERR_UNIMPLEMENTED.
 * float16 and bfloat16 accumulate in float32; MEAN divides by the total
 * number of replicas in sync after summing.
 */
#ifndef STRATA_C_CROSS_DEVICE_OPS_H_
#define STRATA_C_CROSS_DEVICE_OPS_H_

#include <dlpack/dlpack.h>

#include "strata/c/common.h"
#include "strata/c/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_cross_device_ops_s* strata_cross_device_ops_t;
/** An operation started with a *_start call; completed by request_wait. */
typedef struct strata_cdo_request_s* strata_cdo_request_t;

typedef struct strata_cross_device_ops_vtable {
  STRATA_STRUCT_HEADER;

  /** Required. Create an instance from `options_json` (NULL = {}). Known
   *  options are implementation-specific (e.g. "num_packs",
   *  "bytes_per_pack"); unknown ones are an INVALID_ARGUMENT error. */
  strata_status_t (*create)(const strata_host_api* host, const char* options_json,
                            strata_cross_device_ops_t* out, strata_error* err);
  /** Required. Destroy an instance; no call may be in flight. */
  void (*destroy)(strata_cross_device_ops_t cdo);

  /** Required. Batch all-reduce: for each t < num_tensors, every
   *  outputs[t*num_replicas + r] receives op(inputs[t*num_replicas + 0..n)).
   *  Blocks until done (bounded by the instance's collective timeout). */
  strata_status_t (*all_reduce)(strata_cross_device_ops_t cdo, uint32_t op, uint32_t num_tensors,
                                uint32_t num_replicas, const DLTensor* const* inputs,
                                DLTensor* const* outputs, strata_error* err);

  /** Required. Reduce to one destination: outputs[t] receives
   *  op(inputs[t*num_replicas + 0..n)). */
  strata_status_t (*reduce)(strata_cross_device_ops_t cdo, uint32_t op, uint32_t num_tensors,
                            uint32_t num_replicas, const DLTensor* const* inputs,
                            DLTensor* const* outputs, strata_error* err);

  /** Required. Copy `src` into each of dsts[0..num_replicas). */
  strata_status_t (*broadcast)(strata_cross_device_ops_t cdo, const DLTensor* src,
                               uint32_t num_replicas, DLTensor* const* dsts, strata_error* err);

  /** Required. Concatenate inputs[0..num_replicas) along `axis` (inputs may
   *  differ only in that dimension) into every outputs[r]. */
  strata_status_t (*all_gather)(strata_cross_device_ops_t cdo, uint32_t num_replicas,
                                const DLTensor* const* inputs, int32_t axis,
                                DLTensor* const* outputs, strata_error* err);

  /** Optional. Reduce, then give replica r the r-th of num_replicas equal
   *  slices along axis 0 (which must divide evenly). */
  strata_status_t (*reduce_scatter)(strata_cross_device_ops_t cdo, uint32_t op,
                                    uint32_t num_replicas, const DLTensor* const* inputs,
                                    DLTensor* const* outputs, strata_error* err);

  /** Optional (with request_wait). Start a batch all-reduce and return at
   *  once; inputs and outputs must stay valid until request_wait returns.
   *  Started operations complete in the order they were started. */
  strata_status_t (*all_reduce_start)(strata_cross_device_ops_t cdo, uint32_t op,
                                      uint32_t num_tensors, uint32_t num_replicas,
                                      const DLTensor* const* inputs, DLTensor* const* outputs,
                                      strata_cdo_request_t* request, strata_error* err);
  /** Wait up to `timeout_ms` for a started operation and release the request
   *  (also when it fails). On DEADLINE_EXCEEDED the request is still live:
   *  wait again or destroy the instance. */
  strata_status_t (*request_wait)(strata_cross_device_ops_t cdo, strata_cdo_request_t request,
                                  int64_t timeout_ms, strata_error* err);

  /* ---- since 1.2 (optional) ---- */

  /** Move the instance's cross-process traffic to transport `name` with
   *  `options_json` (NULL or "" = {}). Collective over every process of the
   *  instance, called from the strategy's thread like the other calls. First
   *  finishes every operation started with all_reduce_start (their requests
   *  stay valid for request_wait). All or nothing: on any failure (the
   *  processes asked for different transports; the transport is unknown, its
   *  options are bad, or its communicator cannot be built on some process)
   *  every process returns the same error naming the processes and the
   *  cause, and the instance keeps its old transport, fully usable. Blocks
   *  for at most a few collective timeouts. Results of later collectives are
   *  bit-identical to what the old transport would have produced. NULL =
   *  unsupported (the caller reports UNIMPLEMENTED). */
  strata_status_t (*set_transport)(strata_cross_device_ops_t cdo, const char* name,
                                   const char* options_json, strata_error* err);
} strata_cross_device_ops_vtable;

/** Size of the vtable at ABI 1.0 (up to request_wait). */
#define STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_0 \
  ((uint32_t)(offsetof(strata_cross_device_ops_vtable, request_wait) + sizeof(void*)))
/** Size of the vtable at ABI 1.1 (1.1 appended nothing here). */
#define STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_1 STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_0
#define STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE ((uint32_t)sizeof(strata_cross_device_ops_vtable))

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_CROSS_DEVICE_OPS_H_ */
