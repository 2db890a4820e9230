/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file plugin.h
 * @brief The one symbol a plugin library exports and the descriptor it returns.
 *
 * A plugin is a shared library named `libstrata-<kind>-<name>.so` that exports
 * exactly one C symbol per ABI major it supports, for major 1:
 *
 *     STRATA_EXPORT strata_status_t strata_plugin_entry_v1(
 *         const strata_host_api* host, uint32_t host_abi_minor,
 *         const strata_plugin_desc** out);
 *
 * The host probes the newest major it knows first. The entry must be cheap,
 * must not start threads, and returns a descriptor with static storage
 * duration listing the components the library provides. The host then checks
 * every header (struct_size at least the 1.0 size, required functions
 * non-NULL) and calls `init` once, before creating any instance. One library
 * may provide several kinds. Names are unique per kind across all loaded
 * libraries.
 */
#ifndef STRATA_C_PLUGIN_H_
#define STRATA_C_PLUGIN_H_

#include "strata/c/common.h"
#include "strata/c/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One component a library provides: a {kind, name, version, vtable}. */
typedef struct strata_plugin_component {
  STRATA_STRUCT_HEADER;
  uint32_t kind;        /**< strata_plugin_kind */
  const char* name;     /**< e.g. "mirrored"; [a-z0-9_]+ */
  const char* version;  /**< the component's own version, e.g. "1.2.0" */
  const void* vtable;   /**< kind-specific vtable; begins with STRATA_STRUCT_HEADER */
} strata_plugin_component;

#define STRATA_PLUGIN_COMPONENT_STRUCT_SIZE ((uint32_t)sizeof(strata_plugin_component))
/** Size at ABI 1.0 (frozen). */
#define STRATA_PLUGIN_COMPONENT_STRUCT_SIZE_1_0 ((uint32_t)48)

/** What strata_plugin_entry_v1 returns. Static storage; never freed. */
typedef struct strata_plugin_desc {
  STRATA_STRUCT_HEADER;
  const char* library_name;     /**< human-readable name of the library */
  const char* library_version;  /**< the library's version string */
  uint32_t num_components;
  /** Array of num_components. Elements are `components[0].struct_size`
   *  bytes apart (the plugin's own size of strata_plugin_component), so a
   *  reader steps by that, not by its own sizeof. */
  const strata_plugin_component* components;
  /** Optional. Called once, after validation and before any instance is
   *  created, on the loading thread. A failure rejects the whole library
   *  with the error's message. `host` stays valid until shutdown. */
  strata_status_t (*init)(const strata_host_api* host, strata_error* err);
  /** Optional. Called once at host shutdown after every instance is gone. */
  void (*shutdown)(void);
} strata_plugin_desc;

#define STRATA_PLUGIN_DESC_STRUCT_SIZE ((uint32_t)sizeof(strata_plugin_desc))
/** Size at ABI 1.0 (frozen): the smallest descriptor a host accepts. */
#define STRATA_PLUGIN_DESC_STRUCT_SIZE_1_0 ((uint32_t)64)

/** Name of the entry symbol of ABI major 1. */
#define STRATA_PLUGIN_ENTRY_V1_SYMBOL "strata_plugin_entry_v1"

/** Signature of the ABI major 1 entry symbol. Returns STRATA_OK and sets
 *  `*out`, or an error (e.g. STRATA_ERR_ABI_MISMATCH when `host_abi_minor` is
 *  too old for the plugin's needs). */
typedef strata_status_t (*strata_plugin_entry_v1_fn)(const strata_host_api* host,
                                                     uint32_t host_abi_minor,
                                                     const strata_plugin_desc** out);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* STRATA_C_PLUGIN_H_ */
