// SPDX-License-Identifier: Apache-2.0
// The C ABI v1 promise, pinned: the size and every field offset of every
// public struct and vtable on x86-64 Linux (LP64). A failure here means a
// change broke binary compatibility: fields may only be appended, with
// STRATA_ABI_MINOR raised. Also: plugins built against a newer or an older
// minor load and work, and every plugin exports only its entry symbol.
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "strata/c/strata.h"
#include "strata/plugin_host.hpp"

#if !defined(__x86_64__) || !defined(__linux__)
#error "abi_test pins the x86-64 Linux layout; add the numbers for this platform"
#endif

// ---- pinned layout (computed once from the frozen headers; never edit a number)
static_assert(sizeof(strata_error) == 1048, "strata_error size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_error, struct_size) == 0, "strata_error.struct_size moved");
static_assert(offsetof(strata_error, abi_minor) == 4, "strata_error.abi_minor moved");
static_assert(offsetof(strata_error, ext) == 8, "strata_error.ext moved");
static_assert(offsetof(strata_error, code) == 16, "strata_error.code moved");
static_assert(offsetof(strata_error, message) == 20, "strata_error.message moved");
static_assert(sizeof(strata_plugin_instance) == 48, "strata_plugin_instance size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_plugin_instance, struct_size) == 0, "strata_plugin_instance.struct_size moved");
static_assert(offsetof(strata_plugin_instance, abi_minor) == 4, "strata_plugin_instance.abi_minor moved");
static_assert(offsetof(strata_plugin_instance, ext) == 8, "strata_plugin_instance.ext moved");
static_assert(offsetof(strata_plugin_instance, kind) == 16, "strata_plugin_instance.kind moved");
static_assert(offsetof(strata_plugin_instance, vtable) == 24, "strata_plugin_instance.vtable moved");
static_assert(offsetof(strata_plugin_instance, handle) == 32, "strata_plugin_instance.handle moved");
static_assert(offsetof(strata_plugin_instance, host_token) == 40, "strata_plugin_instance.host_token moved");
static_assert(sizeof(strata_collective_fingerprint) == 64, "strata_collective_fingerprint size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_collective_fingerprint, struct_size) == 0, "strata_collective_fingerprint.struct_size moved");
static_assert(offsetof(strata_collective_fingerprint, abi_minor) == 4, "strata_collective_fingerprint.abi_minor moved");
static_assert(offsetof(strata_collective_fingerprint, ext) == 8, "strata_collective_fingerprint.ext moved");
static_assert(offsetof(strata_collective_fingerprint, communicator) == 16, "strata_collective_fingerprint.communicator moved");
static_assert(offsetof(strata_collective_fingerprint, op) == 24, "strata_collective_fingerprint.op moved");
static_assert(offsetof(strata_collective_fingerprint, reduce_op) == 28, "strata_collective_fingerprint.reduce_op moved");
static_assert(offsetof(strata_collective_fingerprint, sequence) == 32, "strata_collective_fingerprint.sequence moved");
static_assert(offsetof(strata_collective_fingerprint, dtype) == 40, "strata_collective_fingerprint.dtype moved");
static_assert(offsetof(strata_collective_fingerprint, count) == 48, "strata_collective_fingerprint.count moved");
static_assert(offsetof(strata_collective_fingerprint, rank) == 56, "strata_collective_fingerprint.rank moved");
static_assert(offsetof(strata_collective_fingerprint, peer) == 60, "strata_collective_fingerprint.peer moved");
static_assert(sizeof(strata_host_api) == 208, "strata_host_api size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_host_api, struct_size) == 0, "strata_host_api.struct_size moved");
static_assert(offsetof(strata_host_api, abi_minor) == 4, "strata_host_api.abi_minor moved");
static_assert(offsetof(strata_host_api, ext) == 8, "strata_host_api.ext moved");
static_assert(offsetof(strata_host_api, log) == 16, "strata_host_api.log moved");
static_assert(offsetof(strata_host_api, get_config) == 24, "strata_host_api.get_config moved");
static_assert(offsetof(strata_host_api, create_plugin) == 32, "strata_host_api.create_plugin moved");
static_assert(offsetof(strata_host_api, release_plugin) == 40, "strata_host_api.release_plugin moved");
static_assert(offsetof(strata_host_api, allocate) == 48, "strata_host_api.allocate moved");
static_assert(offsetof(strata_host_api, free_memory) == 56, "strata_host_api.free_memory moved");
static_assert(offsetof(strata_host_api, store_set) == 64, "strata_host_api.store_set moved");
static_assert(offsetof(strata_host_api, store_get) == 72, "strata_host_api.store_get moved");
static_assert(offsetof(strata_host_api, store_add) == 80, "strata_host_api.store_add moved");
static_assert(offsetof(strata_host_api, store_wait) == 88, "strata_host_api.store_wait moved");
static_assert(offsetof(strata_host_api, now_ns) == 96, "strata_host_api.now_ns moved");
static_assert(offsetof(strata_host_api, abort_requested) == 104, "strata_host_api.abort_requested moved");
static_assert(offsetof(strata_host_api, record_collective) == 112, "strata_host_api.record_collective moved");
static_assert(offsetof(strata_host_api, request_abort) == 120, "strata_host_api.request_abort moved");
static_assert(offsetof(strata_host_api, ps_variable_create) == 128, "strata_host_api.ps_variable_create moved");
static_assert(offsetof(strata_host_api, ps_variable_read) == 136, "strata_host_api.ps_variable_read moved");
static_assert(offsetof(strata_host_api, ps_variable_update) == 144, "strata_host_api.ps_variable_update moved");
static_assert(offsetof(strata_host_api, device_count) == 152, "strata_host_api.device_count moved");
static_assert(offsetof(strata_host_api, set_device) == 160, "strata_host_api.set_device moved");
static_assert(offsetof(strata_host_api, stream_create) == 168, "strata_host_api.stream_create moved");
static_assert(offsetof(strata_host_api, stream_destroy) == 176, "strata_host_api.stream_destroy moved");
static_assert(offsetof(strata_host_api, stream_synchronize) == 184, "strata_host_api.stream_synchronize moved");
static_assert(offsetof(strata_host_api, memcpy_async) == 192, "strata_host_api.memcpy_async moved");
static_assert(offsetof(strata_host_api, device_update) == 200, "strata_host_api.device_update moved");
static_assert(STRATA_HOST_API_STRUCT_SIZE_1_2 == 128, "1.2 host table size moved");
static_assert(STRATA_HOST_API_STRUCT_SIZE_1_3 == 152, "1.3 host table size moved");
static_assert(STRATA_HOST_API_STRUCT_SIZE_1_4 == 200, "1.4 host table size moved");
static_assert(sizeof(strata_plugin_component) == 48, "strata_plugin_component size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_plugin_component, struct_size) == 0, "strata_plugin_component.struct_size moved");
static_assert(offsetof(strata_plugin_component, abi_minor) == 4, "strata_plugin_component.abi_minor moved");
static_assert(offsetof(strata_plugin_component, ext) == 8, "strata_plugin_component.ext moved");
static_assert(offsetof(strata_plugin_component, kind) == 16, "strata_plugin_component.kind moved");
static_assert(offsetof(strata_plugin_component, name) == 24, "strata_plugin_component.name moved");
static_assert(offsetof(strata_plugin_component, version) == 32, "strata_plugin_component.version moved");
static_assert(offsetof(strata_plugin_component, vtable) == 40, "strata_plugin_component.vtable moved");
static_assert(sizeof(strata_plugin_desc) == 64, "strata_plugin_desc size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_plugin_desc, struct_size) == 0, "strata_plugin_desc.struct_size moved");
static_assert(offsetof(strata_plugin_desc, abi_minor) == 4, "strata_plugin_desc.abi_minor moved");
static_assert(offsetof(strata_plugin_desc, ext) == 8, "strata_plugin_desc.ext moved");
static_assert(offsetof(strata_plugin_desc, library_name) == 16, "strata_plugin_desc.library_name moved");
static_assert(offsetof(strata_plugin_desc, library_version) == 24, "strata_plugin_desc.library_version moved");
static_assert(offsetof(strata_plugin_desc, num_components) == 32, "strata_plugin_desc.num_components moved");
static_assert(offsetof(strata_plugin_desc, components) == 40, "strata_plugin_desc.components moved");
static_assert(offsetof(strata_plugin_desc, init) == 48, "strata_plugin_desc.init moved");
static_assert(offsetof(strata_plugin_desc, shutdown) == 56, "strata_plugin_desc.shutdown moved");
static_assert(sizeof(strata_variable_desc) == 56, "strata_variable_desc size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_variable_desc, struct_size) == 0, "strata_variable_desc.struct_size moved");
static_assert(offsetof(strata_variable_desc, abi_minor) == 4, "strata_variable_desc.abi_minor moved");
static_assert(offsetof(strata_variable_desc, ext) == 8, "strata_variable_desc.ext moved");
static_assert(offsetof(strata_variable_desc, name) == 16, "strata_variable_desc.name moved");
static_assert(offsetof(strata_variable_desc, synchronization) == 24, "strata_variable_desc.synchronization moved");
static_assert(offsetof(strata_variable_desc, aggregation) == 28, "strata_variable_desc.aggregation moved");
static_assert(offsetof(strata_variable_desc, trainable) == 32, "strata_variable_desc.trainable moved");
static_assert(offsetof(strata_variable_desc, attach_ref) == 40, "strata_variable_desc.attach_ref moved");
static_assert(offsetof(strata_variable_desc, attach_ref_len) == 48, "strata_variable_desc.attach_ref_len moved");
static_assert(sizeof(strata_strategy_vtable) == 176, "strata_strategy_vtable size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_strategy_vtable, struct_size) == 0, "strata_strategy_vtable.struct_size moved");
static_assert(offsetof(strata_strategy_vtable, abi_minor) == 4, "strata_strategy_vtable.abi_minor moved");
static_assert(offsetof(strata_strategy_vtable, ext) == 8, "strata_strategy_vtable.ext moved");
static_assert(offsetof(strata_strategy_vtable, create) == 16, "strata_strategy_vtable.create moved");
static_assert(offsetof(strata_strategy_vtable, destroy) == 24, "strata_strategy_vtable.destroy moved");
static_assert(offsetof(strata_strategy_vtable, describe) == 32, "strata_strategy_vtable.describe moved");
static_assert(offsetof(strata_strategy_vtable, run) == 40, "strata_strategy_vtable.run moved");
static_assert(offsetof(strata_strategy_vtable, replica_id_in_sync_group) == 48, "strata_strategy_vtable.replica_id_in_sync_group moved");
static_assert(offsetof(strata_strategy_vtable, replica_all_reduce) == 56, "strata_strategy_vtable.replica_all_reduce moved");
static_assert(offsetof(strata_strategy_vtable, replica_all_gather) == 64, "strata_strategy_vtable.replica_all_gather moved");
static_assert(offsetof(strata_strategy_vtable, replica_merge_call) == 72, "strata_strategy_vtable.replica_merge_call moved");
static_assert(offsetof(strata_strategy_vtable, reduce_to) == 80, "strata_strategy_vtable.reduce_to moved");
static_assert(offsetof(strata_strategy_vtable, gather_to) == 88, "strata_strategy_vtable.gather_to moved");
static_assert(offsetof(strata_strategy_vtable, variable_create) == 96, "strata_strategy_vtable.variable_create moved");
static_assert(offsetof(strata_strategy_vtable, variable_destroy) == 104, "strata_strategy_vtable.variable_destroy moved");
static_assert(offsetof(strata_strategy_vtable, variable_read) == 112, "strata_strategy_vtable.variable_read moved");
static_assert(offsetof(strata_strategy_vtable, variable_update) == 120, "strata_strategy_vtable.variable_update moved");
static_assert(offsetof(strata_strategy_vtable, variable_view) == 128, "strata_strategy_vtable.variable_view moved");
static_assert(offsetof(strata_strategy_vtable, save_state) == 136, "strata_strategy_vtable.save_state moved");
static_assert(offsetof(strata_strategy_vtable, restore_state) == 144, "strata_strategy_vtable.restore_state moved");
static_assert(offsetof(strata_strategy_vtable, set_transport) == 152, "strata_strategy_vtable.set_transport moved");
static_assert(offsetof(strata_strategy_vtable, variable_ref) == 160, "strata_strategy_vtable.variable_ref moved");
static_assert(offsetof(strata_strategy_vtable, replica_stream) == 168, "strata_strategy_vtable.replica_stream moved");
static_assert(STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_2 == 160, "1.2 strategy vtable size moved");
static_assert(STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_3 == 168, "1.3 strategy vtable size moved");
static_assert(sizeof(strata_cross_device_ops_vtable) == 96, "strata_cross_device_ops_vtable size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_cross_device_ops_vtable, struct_size) == 0, "strata_cross_device_ops_vtable.struct_size moved");
static_assert(offsetof(strata_cross_device_ops_vtable, abi_minor) == 4, "strata_cross_device_ops_vtable.abi_minor moved");
static_assert(offsetof(strata_cross_device_ops_vtable, ext) == 8, "strata_cross_device_ops_vtable.ext moved");
static_assert(offsetof(strata_cross_device_ops_vtable, create) == 16, "strata_cross_device_ops_vtable.create moved");
static_assert(offsetof(strata_cross_device_ops_vtable, destroy) == 24, "strata_cross_device_ops_vtable.destroy moved");
static_assert(offsetof(strata_cross_device_ops_vtable, all_reduce) == 32, "strata_cross_device_ops_vtable.all_reduce moved");
static_assert(offsetof(strata_cross_device_ops_vtable, reduce) == 40, "strata_cross_device_ops_vtable.reduce moved");
static_assert(offsetof(strata_cross_device_ops_vtable, broadcast) == 48, "strata_cross_device_ops_vtable.broadcast moved");
static_assert(offsetof(strata_cross_device_ops_vtable, all_gather) == 56, "strata_cross_device_ops_vtable.all_gather moved");
static_assert(offsetof(strata_cross_device_ops_vtable, reduce_scatter) == 64, "strata_cross_device_ops_vtable.reduce_scatter moved");
static_assert(offsetof(strata_cross_device_ops_vtable, all_reduce_start) == 72, "strata_cross_device_ops_vtable.all_reduce_start moved");
static_assert(offsetof(strata_cross_device_ops_vtable, request_wait) == 80, "strata_cross_device_ops_vtable.request_wait moved");
static_assert(offsetof(strata_cross_device_ops_vtable, set_transport) == 88, "strata_cross_device_ops_vtable.set_transport moved");
static_assert(sizeof(strata_transport_caps) == 48, "strata_transport_caps size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_transport_caps, struct_size) == 0, "strata_transport_caps.struct_size moved");
static_assert(offsetof(strata_transport_caps, abi_minor) == 4, "strata_transport_caps.abi_minor moved");
static_assert(offsetof(strata_transport_caps, ext) == 8, "strata_transport_caps.ext moved");
static_assert(offsetof(strata_transport_caps, flags) == 16, "strata_transport_caps.flags moved");
static_assert(offsetof(strata_transport_caps, max_inflight) == 24, "strata_transport_caps.max_inflight moved");
static_assert(offsetof(strata_transport_caps, reserved) == 28, "strata_transport_caps.reserved moved");
static_assert(offsetof(strata_transport_caps, max_message_bytes) == 32, "strata_transport_caps.max_message_bytes moved");
static_assert(offsetof(strata_transport_caps, preferred_chunk_bytes) == 40, "strata_transport_caps.preferred_chunk_bytes moved");
static_assert(sizeof(strata_buffer) == 56, "strata_buffer size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_buffer, struct_size) == 0, "strata_buffer.struct_size moved");
static_assert(offsetof(strata_buffer, abi_minor) == 4, "strata_buffer.abi_minor moved");
static_assert(offsetof(strata_buffer, ext) == 8, "strata_buffer.ext moved");
static_assert(offsetof(strata_buffer, data) == 16, "strata_buffer.data moved");
static_assert(offsetof(strata_buffer, bytes) == 24, "strata_buffer.bytes moved");
static_assert(offsetof(strata_buffer, device) == 32, "strata_buffer.device moved");
static_assert(offsetof(strata_buffer, mr) == 40, "strata_buffer.mr moved");
static_assert(offsetof(strata_buffer, stream) == 48, "strata_buffer.stream moved");
static_assert(sizeof(strata_transport_vtable) == 168, "strata_transport_vtable size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_transport_vtable, struct_size) == 0, "strata_transport_vtable.struct_size moved");
static_assert(offsetof(strata_transport_vtable, abi_minor) == 4, "strata_transport_vtable.abi_minor moved");
static_assert(offsetof(strata_transport_vtable, ext) == 8, "strata_transport_vtable.ext moved");
static_assert(offsetof(strata_transport_vtable, create) == 16, "strata_transport_vtable.create moved");
static_assert(offsetof(strata_transport_vtable, destroy) == 24, "strata_transport_vtable.destroy moved");
static_assert(offsetof(strata_transport_vtable, get_caps) == 32, "strata_transport_vtable.get_caps moved");
static_assert(offsetof(strata_transport_vtable, comm_create) == 40, "strata_transport_vtable.comm_create moved");
static_assert(offsetof(strata_transport_vtable, comm_destroy) == 48, "strata_transport_vtable.comm_destroy moved");
static_assert(offsetof(strata_transport_vtable, comm_abort) == 56, "strata_transport_vtable.comm_abort moved");
static_assert(offsetof(strata_transport_vtable, mem_register) == 64, "strata_transport_vtable.mem_register moved");
static_assert(offsetof(strata_transport_vtable, mem_deregister) == 72, "strata_transport_vtable.mem_deregister moved");
static_assert(offsetof(strata_transport_vtable, isend) == 80, "strata_transport_vtable.isend moved");
static_assert(offsetof(strata_transport_vtable, irecv) == 88, "strata_transport_vtable.irecv moved");
static_assert(offsetof(strata_transport_vtable, test) == 96, "strata_transport_vtable.test moved");
static_assert(offsetof(strata_transport_vtable, wait) == 104, "strata_transport_vtable.wait moved");
static_assert(offsetof(strata_transport_vtable, cancel) == 112, "strata_transport_vtable.cancel moved");
static_assert(offsetof(strata_transport_vtable, all_reduce) == 120, "strata_transport_vtable.all_reduce moved");
static_assert(offsetof(strata_transport_vtable, broadcast) == 128, "strata_transport_vtable.broadcast moved");
static_assert(offsetof(strata_transport_vtable, all_gather) == 136, "strata_transport_vtable.all_gather moved");
static_assert(offsetof(strata_transport_vtable, reduce_scatter) == 144, "strata_transport_vtable.reduce_scatter moved");
static_assert(offsetof(strata_transport_vtable, mem_export) == 152, "strata_transport_vtable.mem_export moved");
static_assert(offsetof(strata_transport_vtable, iwrite) == 160, "strata_transport_vtable.iwrite moved");
static_assert(sizeof(strata_resolver_vtable) == 56, "strata_resolver_vtable size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_resolver_vtable, struct_size) == 0, "strata_resolver_vtable.struct_size moved");
static_assert(offsetof(strata_resolver_vtable, abi_minor) == 4, "strata_resolver_vtable.abi_minor moved");
static_assert(offsetof(strata_resolver_vtable, ext) == 8, "strata_resolver_vtable.ext moved");
static_assert(offsetof(strata_resolver_vtable, create) == 16, "strata_resolver_vtable.create moved");
static_assert(offsetof(strata_resolver_vtable, destroy) == 24, "strata_resolver_vtable.destroy moved");
static_assert(offsetof(strata_resolver_vtable, describe) == 32, "strata_resolver_vtable.describe moved");
static_assert(offsetof(strata_resolver_vtable, master) == 40, "strata_resolver_vtable.master moved");
static_assert(offsetof(strata_resolver_vtable, detect) == 48, "strata_resolver_vtable.detect moved");
static_assert(sizeof(strata_input_context) == 32, "strata_input_context size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_input_context, struct_size) == 0, "strata_input_context.struct_size moved");
static_assert(offsetof(strata_input_context, abi_minor) == 4, "strata_input_context.abi_minor moved");
static_assert(offsetof(strata_input_context, ext) == 8, "strata_input_context.ext moved");
static_assert(offsetof(strata_input_context, num_input_pipelines) == 16, "strata_input_context.num_input_pipelines moved");
static_assert(offsetof(strata_input_context, input_pipeline_id) == 20, "strata_input_context.input_pipeline_id moved");
static_assert(offsetof(strata_input_context, num_replicas_in_sync) == 24, "strata_input_context.num_replicas_in_sync moved");
static_assert(sizeof(strata_element) == 280, "strata_element size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_element, struct_size) == 0, "strata_element.struct_size moved");
static_assert(offsetof(strata_element, abi_minor) == 4, "strata_element.abi_minor moved");
static_assert(offsetof(strata_element, ext) == 8, "strata_element.ext moved");
static_assert(offsetof(strata_element, num_components) == 16, "strata_element.num_components moved");
static_assert(offsetof(strata_element, names) == 24, "strata_element.names moved");
static_assert(offsetof(strata_element, tensors) == 152, "strata_element.tensors moved");
static_assert(sizeof(strata_input_vtable) == 80, "strata_input_vtable size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_input_vtable, struct_size) == 0, "strata_input_vtable.struct_size moved");
static_assert(offsetof(strata_input_vtable, abi_minor) == 4, "strata_input_vtable.abi_minor moved");
static_assert(offsetof(strata_input_vtable, ext) == 8, "strata_input_vtable.ext moved");
static_assert(offsetof(strata_input_vtable, open) == 16, "strata_input_vtable.open moved");
static_assert(offsetof(strata_input_vtable, close) == 24, "strata_input_vtable.close moved");
static_assert(offsetof(strata_input_vtable, shard_info) == 32, "strata_input_vtable.shard_info moved");
static_assert(offsetof(strata_input_vtable, shard) == 40, "strata_input_vtable.shard moved");
static_assert(offsetof(strata_input_vtable, next) == 48, "strata_input_vtable.next moved");
static_assert(offsetof(strata_input_vtable, cardinality) == 56, "strata_input_vtable.cardinality moved");
static_assert(offsetof(strata_input_vtable, save_state) == 64, "strata_input_vtable.save_state moved");
static_assert(offsetof(strata_input_vtable, restore_state) == 72, "strata_input_vtable.restore_state moved");

static_assert(sizeof(strata_input_arrays) == 280, "strata_input_arrays size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_input_arrays, num_components) == 16, "strata_input_arrays.num_components moved");
static_assert(offsetof(strata_input_arrays, names) == 24, "strata_input_arrays.names moved");
static_assert(offsetof(strata_input_arrays, tensors) == 152, "strata_input_arrays.tensors moved");
static_assert(sizeof(strata_input_generator) == 48, "strata_input_generator size changed: the ABI is frozen; append fields and bump STRATA_ABI_MINOR");
static_assert(offsetof(strata_input_generator, user) == 16, "strata_input_generator.user moved");
static_assert(offsetof(strata_input_generator, start) == 24, "strata_input_generator.start moved");
static_assert(offsetof(strata_input_generator, next) == 32, "strata_input_generator.next moved");
static_assert(offsetof(strata_input_generator, finish) == 40, "strata_input_generator.finish moved");

static_assert(STRATA_ABI_MAJOR == 1, "ABI major");
static_assert(STRATA_ABI_MINOR == 5, "ABI minor: add pinned numbers for the new fields when raising it");
// 1.4 sizes: what a 1.4 build hands out (1.5 appended the host's device_update).
// 1.3 sizes: what a 1.3 build hands out (1.4 appended the host device services
// device_count .. memcpy_async and the strategy's replica_stream).
// 1.2 sizes: what a 1.2 build hands out (1.3 appended the ps_variable_* host entries,
// strategy variable_ref and strata_variable_desc.attach_ref/attach_ref_len).
static_assert(offsetof(strata_variable_desc, attach_ref) == 40, "strata_variable_desc 1.2 size");
static_assert(STRATA_HOST_API_STRUCT_SIZE_1_0 == 120, "host table 1.0 size");
static_assert(STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_0 == 128, "strategy vtable 1.0 size");
static_assert(STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_0 == 88, "cross_device_ops vtable 1.0 size");
// 1.1 sizes: what a plugin built against 1.1 hands out (1.2 appended set_transport to both).
static_assert(STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_1 == 152, "strategy vtable 1.1 size");
static_assert(STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_1 == 88, "cross_device_ops vtable 1.1 size");
static_assert(STRATA_TRANSPORT_VTABLE_STRUCT_SIZE_1_0 == 168, "transport vtable 1.0 size");
static_assert(STRATA_RESOLVER_VTABLE_STRUCT_SIZE_1_0 == 56, "resolver vtable 1.0 size");
static_assert(STRATA_INPUT_VTABLE_STRUCT_SIZE_1_0 == 80, "input vtable 1.0 size");
static_assert(STRATA_ERROR_MESSAGE_MAX == 1024 && STRATA_ELEMENT_MAX_COMPONENTS == 16, "array bounds");

namespace strata {
namespace {

namespace fs = std::filesystem;

struct Layout {
  const char* type;
  const char* field;  // nullptr: the sizeof row
  std::size_t actual;
  std::size_t pinned;
};

const Layout kLayout[] = {
    {"strata_error", nullptr, sizeof(strata_error), 1048},
    {"strata_error", "struct_size", offsetof(strata_error, struct_size), 0},
    {"strata_error", "abi_minor", offsetof(strata_error, abi_minor), 4},
    {"strata_error", "ext", offsetof(strata_error, ext), 8},
    {"strata_error", "code", offsetof(strata_error, code), 16},
    {"strata_error", "message", offsetof(strata_error, message), 20},
    {"strata_plugin_instance", nullptr, sizeof(strata_plugin_instance), 48},
    {"strata_plugin_instance", "struct_size", offsetof(strata_plugin_instance, struct_size), 0},
    {"strata_plugin_instance", "abi_minor", offsetof(strata_plugin_instance, abi_minor), 4},
    {"strata_plugin_instance", "ext", offsetof(strata_plugin_instance, ext), 8},
    {"strata_plugin_instance", "kind", offsetof(strata_plugin_instance, kind), 16},
    {"strata_plugin_instance", "vtable", offsetof(strata_plugin_instance, vtable), 24},
    {"strata_plugin_instance", "handle", offsetof(strata_plugin_instance, handle), 32},
    {"strata_plugin_instance", "host_token", offsetof(strata_plugin_instance, host_token), 40},
    {"strata_collective_fingerprint", nullptr, sizeof(strata_collective_fingerprint), 64},
    {"strata_collective_fingerprint", "struct_size", offsetof(strata_collective_fingerprint, struct_size), 0},
    {"strata_collective_fingerprint", "abi_minor", offsetof(strata_collective_fingerprint, abi_minor), 4},
    {"strata_collective_fingerprint", "ext", offsetof(strata_collective_fingerprint, ext), 8},
    {"strata_collective_fingerprint", "communicator", offsetof(strata_collective_fingerprint, communicator), 16},
    {"strata_collective_fingerprint", "op", offsetof(strata_collective_fingerprint, op), 24},
    {"strata_collective_fingerprint", "reduce_op", offsetof(strata_collective_fingerprint, reduce_op), 28},
    {"strata_collective_fingerprint", "sequence", offsetof(strata_collective_fingerprint, sequence), 32},
    {"strata_collective_fingerprint", "dtype", offsetof(strata_collective_fingerprint, dtype), 40},
    {"strata_collective_fingerprint", "count", offsetof(strata_collective_fingerprint, count), 48},
    {"strata_collective_fingerprint", "rank", offsetof(strata_collective_fingerprint, rank), 56},
    {"strata_collective_fingerprint", "peer", offsetof(strata_collective_fingerprint, peer), 60},
    {"strata_host_api", nullptr, sizeof(strata_host_api), 208},
    {"strata_host_api", "struct_size", offsetof(strata_host_api, struct_size), 0},
    {"strata_host_api", "abi_minor", offsetof(strata_host_api, abi_minor), 4},
    {"strata_host_api", "ext", offsetof(strata_host_api, ext), 8},
    {"strata_host_api", "log", offsetof(strata_host_api, log), 16},
    {"strata_host_api", "get_config", offsetof(strata_host_api, get_config), 24},
    {"strata_host_api", "create_plugin", offsetof(strata_host_api, create_plugin), 32},
    {"strata_host_api", "release_plugin", offsetof(strata_host_api, release_plugin), 40},
    {"strata_host_api", "allocate", offsetof(strata_host_api, allocate), 48},
    {"strata_host_api", "free_memory", offsetof(strata_host_api, free_memory), 56},
    {"strata_host_api", "store_set", offsetof(strata_host_api, store_set), 64},
    {"strata_host_api", "store_get", offsetof(strata_host_api, store_get), 72},
    {"strata_host_api", "store_add", offsetof(strata_host_api, store_add), 80},
    {"strata_host_api", "store_wait", offsetof(strata_host_api, store_wait), 88},
    {"strata_host_api", "now_ns", offsetof(strata_host_api, now_ns), 96},
    {"strata_host_api", "abort_requested", offsetof(strata_host_api, abort_requested), 104},
    {"strata_host_api", "record_collective", offsetof(strata_host_api, record_collective), 112},
    {"strata_host_api", "request_abort", offsetof(strata_host_api, request_abort), 120},
    {"strata_host_api", "ps_variable_create", offsetof(strata_host_api, ps_variable_create), 128},
    {"strata_host_api", "ps_variable_read", offsetof(strata_host_api, ps_variable_read), 136},
    {"strata_host_api", "ps_variable_update", offsetof(strata_host_api, ps_variable_update), 144},
    {"strata_host_api", "device_count", offsetof(strata_host_api, device_count), 152},
    {"strata_host_api", "set_device", offsetof(strata_host_api, set_device), 160},
    {"strata_host_api", "stream_create", offsetof(strata_host_api, stream_create), 168},
    {"strata_host_api", "stream_destroy", offsetof(strata_host_api, stream_destroy), 176},
    {"strata_host_api", "stream_synchronize", offsetof(strata_host_api, stream_synchronize), 184},
    {"strata_host_api", "memcpy_async", offsetof(strata_host_api, memcpy_async), 192},
    {"strata_host_api", "device_update", offsetof(strata_host_api, device_update), 200},
    {"strata_plugin_component", nullptr, sizeof(strata_plugin_component), 48},
    {"strata_plugin_component", "struct_size", offsetof(strata_plugin_component, struct_size), 0},
    {"strata_plugin_component", "abi_minor", offsetof(strata_plugin_component, abi_minor), 4},
    {"strata_plugin_component", "ext", offsetof(strata_plugin_component, ext), 8},
    {"strata_plugin_component", "kind", offsetof(strata_plugin_component, kind), 16},
    {"strata_plugin_component", "name", offsetof(strata_plugin_component, name), 24},
    {"strata_plugin_component", "version", offsetof(strata_plugin_component, version), 32},
    {"strata_plugin_component", "vtable", offsetof(strata_plugin_component, vtable), 40},
    {"strata_plugin_desc", nullptr, sizeof(strata_plugin_desc), 64},
    {"strata_plugin_desc", "struct_size", offsetof(strata_plugin_desc, struct_size), 0},
    {"strata_plugin_desc", "abi_minor", offsetof(strata_plugin_desc, abi_minor), 4},
    {"strata_plugin_desc", "ext", offsetof(strata_plugin_desc, ext), 8},
    {"strata_plugin_desc", "library_name", offsetof(strata_plugin_desc, library_name), 16},
    {"strata_plugin_desc", "library_version", offsetof(strata_plugin_desc, library_version), 24},
    {"strata_plugin_desc", "num_components", offsetof(strata_plugin_desc, num_components), 32},
    {"strata_plugin_desc", "components", offsetof(strata_plugin_desc, components), 40},
    {"strata_plugin_desc", "init", offsetof(strata_plugin_desc, init), 48},
    {"strata_plugin_desc", "shutdown", offsetof(strata_plugin_desc, shutdown), 56},
    {"strata_variable_desc", nullptr, sizeof(strata_variable_desc), 56},
    {"strata_variable_desc", "struct_size", offsetof(strata_variable_desc, struct_size), 0},
    {"strata_variable_desc", "abi_minor", offsetof(strata_variable_desc, abi_minor), 4},
    {"strata_variable_desc", "ext", offsetof(strata_variable_desc, ext), 8},
    {"strata_variable_desc", "name", offsetof(strata_variable_desc, name), 16},
    {"strata_variable_desc", "synchronization", offsetof(strata_variable_desc, synchronization), 24},
    {"strata_variable_desc", "aggregation", offsetof(strata_variable_desc, aggregation), 28},
    {"strata_variable_desc", "trainable", offsetof(strata_variable_desc, trainable), 32},
    {"strata_variable_desc", "attach_ref", offsetof(strata_variable_desc, attach_ref), 40},
    {"strata_variable_desc", "attach_ref_len", offsetof(strata_variable_desc, attach_ref_len), 48},
    {"strata_strategy_vtable", nullptr, sizeof(strata_strategy_vtable), 176},
    {"strata_strategy_vtable", "struct_size", offsetof(strata_strategy_vtable, struct_size), 0},
    {"strata_strategy_vtable", "abi_minor", offsetof(strata_strategy_vtable, abi_minor), 4},
    {"strata_strategy_vtable", "ext", offsetof(strata_strategy_vtable, ext), 8},
    {"strata_strategy_vtable", "create", offsetof(strata_strategy_vtable, create), 16},
    {"strata_strategy_vtable", "destroy", offsetof(strata_strategy_vtable, destroy), 24},
    {"strata_strategy_vtable", "describe", offsetof(strata_strategy_vtable, describe), 32},
    {"strata_strategy_vtable", "run", offsetof(strata_strategy_vtable, run), 40},
    {"strata_strategy_vtable", "replica_id_in_sync_group", offsetof(strata_strategy_vtable, replica_id_in_sync_group), 48},
    {"strata_strategy_vtable", "replica_all_reduce", offsetof(strata_strategy_vtable, replica_all_reduce), 56},
    {"strata_strategy_vtable", "replica_all_gather", offsetof(strata_strategy_vtable, replica_all_gather), 64},
    {"strata_strategy_vtable", "replica_merge_call", offsetof(strata_strategy_vtable, replica_merge_call), 72},
    {"strata_strategy_vtable", "reduce_to", offsetof(strata_strategy_vtable, reduce_to), 80},
    {"strata_strategy_vtable", "gather_to", offsetof(strata_strategy_vtable, gather_to), 88},
    {"strata_strategy_vtable", "variable_create", offsetof(strata_strategy_vtable, variable_create), 96},
    {"strata_strategy_vtable", "variable_destroy", offsetof(strata_strategy_vtable, variable_destroy), 104},
    {"strata_strategy_vtable", "variable_read", offsetof(strata_strategy_vtable, variable_read), 112},
    {"strata_strategy_vtable", "variable_update", offsetof(strata_strategy_vtable, variable_update), 120},
    {"strata_strategy_vtable", "variable_view", offsetof(strata_strategy_vtable, variable_view), 128},
    {"strata_strategy_vtable", "save_state", offsetof(strata_strategy_vtable, save_state), 136},
    {"strata_strategy_vtable", "restore_state", offsetof(strata_strategy_vtable, restore_state), 144},
    {"strata_strategy_vtable", "set_transport", offsetof(strata_strategy_vtable, set_transport), 152},
    {"strata_strategy_vtable", "variable_ref", offsetof(strata_strategy_vtable, variable_ref), 160},
    {"strata_strategy_vtable", "replica_stream", offsetof(strata_strategy_vtable, replica_stream), 168},
    {"strata_cross_device_ops_vtable", nullptr, sizeof(strata_cross_device_ops_vtable), 96},
    {"strata_cross_device_ops_vtable", "struct_size", offsetof(strata_cross_device_ops_vtable, struct_size), 0},
    {"strata_cross_device_ops_vtable", "abi_minor", offsetof(strata_cross_device_ops_vtable, abi_minor), 4},
    {"strata_cross_device_ops_vtable", "ext", offsetof(strata_cross_device_ops_vtable, ext), 8},
    {"strata_cross_device_ops_vtable", "create", offsetof(strata_cross_device_ops_vtable, create), 16},
    {"strata_cross_device_ops_vtable", "destroy", offsetof(strata_cross_device_ops_vtable, destroy), 24},
    {"strata_cross_device_ops_vtable", "all_reduce", offsetof(strata_cross_device_ops_vtable, all_reduce), 32},
    {"strata_cross_device_ops_vtable", "reduce", offsetof(strata_cross_device_ops_vtable, reduce), 40},
    {"strata_cross_device_ops_vtable", "broadcast", offsetof(strata_cross_device_ops_vtable, broadcast), 48},
    {"strata_cross_device_ops_vtable", "all_gather", offsetof(strata_cross_device_ops_vtable, all_gather), 56},
    {"strata_cross_device_ops_vtable", "reduce_scatter", offsetof(strata_cross_device_ops_vtable, reduce_scatter), 64},
    {"strata_cross_device_ops_vtable", "all_reduce_start", offsetof(strata_cross_device_ops_vtable, all_reduce_start), 72},
    {"strata_cross_device_ops_vtable", "request_wait", offsetof(strata_cross_device_ops_vtable, request_wait), 80},
    {"strata_cross_device_ops_vtable", "set_transport", offsetof(strata_cross_device_ops_vtable, set_transport), 88},
    {"strata_transport_caps", nullptr, sizeof(strata_transport_caps), 48},
    {"strata_transport_caps", "struct_size", offsetof(strata_transport_caps, struct_size), 0},
    {"strata_transport_caps", "abi_minor", offsetof(strata_transport_caps, abi_minor), 4},
    {"strata_transport_caps", "ext", offsetof(strata_transport_caps, ext), 8},
    {"strata_transport_caps", "flags", offsetof(strata_transport_caps, flags), 16},
    {"strata_transport_caps", "max_inflight", offsetof(strata_transport_caps, max_inflight), 24},
    {"strata_transport_caps", "reserved", offsetof(strata_transport_caps, reserved), 28},
    {"strata_transport_caps", "max_message_bytes", offsetof(strata_transport_caps, max_message_bytes), 32},
    {"strata_transport_caps", "preferred_chunk_bytes", offsetof(strata_transport_caps, preferred_chunk_bytes), 40},
    {"strata_buffer", nullptr, sizeof(strata_buffer), 56},
    {"strata_buffer", "struct_size", offsetof(strata_buffer, struct_size), 0},
    {"strata_buffer", "abi_minor", offsetof(strata_buffer, abi_minor), 4},
    {"strata_buffer", "ext", offsetof(strata_buffer, ext), 8},
    {"strata_buffer", "data", offsetof(strata_buffer, data), 16},
    {"strata_buffer", "bytes", offsetof(strata_buffer, bytes), 24},
    {"strata_buffer", "device", offsetof(strata_buffer, device), 32},
    {"strata_buffer", "mr", offsetof(strata_buffer, mr), 40},
    {"strata_buffer", "stream", offsetof(strata_buffer, stream), 48},
    {"strata_transport_vtable", nullptr, sizeof(strata_transport_vtable), 168},
    {"strata_transport_vtable", "struct_size", offsetof(strata_transport_vtable, struct_size), 0},
    {"strata_transport_vtable", "abi_minor", offsetof(strata_transport_vtable, abi_minor), 4},
    {"strata_transport_vtable", "ext", offsetof(strata_transport_vtable, ext), 8},
    {"strata_transport_vtable", "create", offsetof(strata_transport_vtable, create), 16},
    {"strata_transport_vtable", "destroy", offsetof(strata_transport_vtable, destroy), 24},
    {"strata_transport_vtable", "get_caps", offsetof(strata_transport_vtable, get_caps), 32},
    {"strata_transport_vtable", "comm_create", offsetof(strata_transport_vtable, comm_create), 40},
    {"strata_transport_vtable", "comm_destroy", offsetof(strata_transport_vtable, comm_destroy), 48},
    {"strata_transport_vtable", "comm_abort", offsetof(strata_transport_vtable, comm_abort), 56},
    {"strata_transport_vtable", "mem_register", offsetof(strata_transport_vtable, mem_register), 64},
    {"strata_transport_vtable", "mem_deregister", offsetof(strata_transport_vtable, mem_deregister), 72},
    {"strata_transport_vtable", "isend", offsetof(strata_transport_vtable, isend), 80},
    {"strata_transport_vtable", "irecv", offsetof(strata_transport_vtable, irecv), 88},
    {"strata_transport_vtable", "test", offsetof(strata_transport_vtable, test), 96},
    {"strata_transport_vtable", "wait", offsetof(strata_transport_vtable, wait), 104},
    {"strata_transport_vtable", "cancel", offsetof(strata_transport_vtable, cancel), 112},
    {"strata_transport_vtable", "all_reduce", offsetof(strata_transport_vtable, all_reduce), 120},
    {"strata_transport_vtable", "broadcast", offsetof(strata_transport_vtable, broadcast), 128},
    {"strata_transport_vtable", "all_gather", offsetof(strata_transport_vtable, all_gather), 136},
    {"strata_transport_vtable", "reduce_scatter", offsetof(strata_transport_vtable, reduce_scatter), 144},
    {"strata_transport_vtable", "mem_export", offsetof(strata_transport_vtable, mem_export), 152},
    {"strata_transport_vtable", "iwrite", offsetof(strata_transport_vtable, iwrite), 160},
    {"strata_resolver_vtable", nullptr, sizeof(strata_resolver_vtable), 56},
    {"strata_resolver_vtable", "struct_size", offsetof(strata_resolver_vtable, struct_size), 0},
    {"strata_resolver_vtable", "abi_minor", offsetof(strata_resolver_vtable, abi_minor), 4},
    {"strata_resolver_vtable", "ext", offsetof(strata_resolver_vtable, ext), 8},
    {"strata_resolver_vtable", "create", offsetof(strata_resolver_vtable, create), 16},
    {"strata_resolver_vtable", "destroy", offsetof(strata_resolver_vtable, destroy), 24},
    {"strata_resolver_vtable", "describe", offsetof(strata_resolver_vtable, describe), 32},
    {"strata_resolver_vtable", "master", offsetof(strata_resolver_vtable, master), 40},
    {"strata_resolver_vtable", "detect", offsetof(strata_resolver_vtable, detect), 48},
    {"strata_input_context", nullptr, sizeof(strata_input_context), 32},
    {"strata_input_context", "struct_size", offsetof(strata_input_context, struct_size), 0},
    {"strata_input_context", "abi_minor", offsetof(strata_input_context, abi_minor), 4},
    {"strata_input_context", "ext", offsetof(strata_input_context, ext), 8},
    {"strata_input_context", "num_input_pipelines", offsetof(strata_input_context, num_input_pipelines), 16},
    {"strata_input_context", "input_pipeline_id", offsetof(strata_input_context, input_pipeline_id), 20},
    {"strata_input_context", "num_replicas_in_sync", offsetof(strata_input_context, num_replicas_in_sync), 24},
    {"strata_element", nullptr, sizeof(strata_element), 280},
    {"strata_element", "struct_size", offsetof(strata_element, struct_size), 0},
    {"strata_element", "abi_minor", offsetof(strata_element, abi_minor), 4},
    {"strata_element", "ext", offsetof(strata_element, ext), 8},
    {"strata_element", "num_components", offsetof(strata_element, num_components), 16},
    {"strata_element", "names", offsetof(strata_element, names), 24},
    {"strata_element", "tensors", offsetof(strata_element, tensors), 152},
    {"strata_input_arrays", nullptr, sizeof(strata_input_arrays), 280},
    {"strata_input_arrays", "num_components", offsetof(strata_input_arrays, num_components), 16},
    {"strata_input_arrays", "names", offsetof(strata_input_arrays, names), 24},
    {"strata_input_arrays", "tensors", offsetof(strata_input_arrays, tensors), 152},
    {"strata_input_generator", nullptr, sizeof(strata_input_generator), 48},
    {"strata_input_generator", "user", offsetof(strata_input_generator, user), 16},
    {"strata_input_generator", "start", offsetof(strata_input_generator, start), 24},
    {"strata_input_generator", "next", offsetof(strata_input_generator, next), 32},
    {"strata_input_generator", "finish", offsetof(strata_input_generator, finish), 40},
    {"strata_input_vtable", nullptr, sizeof(strata_input_vtable), 80},
    {"strata_input_vtable", "struct_size", offsetof(strata_input_vtable, struct_size), 0},
    {"strata_input_vtable", "abi_minor", offsetof(strata_input_vtable, abi_minor), 4},
    {"strata_input_vtable", "ext", offsetof(strata_input_vtable, ext), 8},
    {"strata_input_vtable", "open", offsetof(strata_input_vtable, open), 16},
    {"strata_input_vtable", "close", offsetof(strata_input_vtable, close), 24},
    {"strata_input_vtable", "shard_info", offsetof(strata_input_vtable, shard_info), 32},
    {"strata_input_vtable", "shard", offsetof(strata_input_vtable, shard), 40},
    {"strata_input_vtable", "next", offsetof(strata_input_vtable, next), 48},
    {"strata_input_vtable", "cardinality", offsetof(strata_input_vtable, cardinality), 56},
    {"strata_input_vtable", "save_state", offsetof(strata_input_vtable, save_state), 64},
    {"strata_input_vtable", "restore_state", offsetof(strata_input_vtable, restore_state), 72},
};

TEST(AbiTest, LayoutMatchesThePinnedNumbers) {
  std::size_t rows = 0;
  for (const Layout& l : kLayout) {
    ++rows;
    if (l.field) {
      EXPECT_EQ(l.actual, l.pinned) << "offsetof(" << l.type << ", " << l.field << ")";
    } else {
      EXPECT_EQ(l.actual, l.pinned) << "sizeof(" << l.type << ")";
    }
  }
  EXPECT_EQ(rows, 205u);
}

// 1.4: the host hands out the device services in every build (a build
// without CUDA fills them with entries that report UNIMPLEMENTED), so a
// plugin checks STRATA_HAS_FIELD once and then calls them.
TEST(AbiTest, HostTableHasTheDeviceServices) {
  PluginHost host;
  const strata_host_api* api = host.host_api();
  EXPECT_EQ(api->struct_size, STRATA_HOST_API_STRUCT_SIZE);
  EXPECT_EQ(api->abi_minor, static_cast<uint32_t>(STRATA_ABI_MINOR));
  ASSERT_TRUE(STRATA_HAS_FIELD(api, strata_host_api, memcpy_async));
  EXPECT_NE(api->device_count, nullptr);
  EXPECT_NE(api->set_device, nullptr);
  EXPECT_NE(api->stream_create, nullptr);
  EXPECT_NE(api->stream_destroy, nullptr);
  EXPECT_NE(api->stream_synchronize, nullptr);
  EXPECT_NE(api->memcpy_async, nullptr);
  EXPECT_NE(api->device_update, nullptr);  // 1.5
  // A reader of a 1.3 table must not see them, nor a reader of a 1.4 table
  // the 1.5 entry.
  strata_host_api old = *api;
  old.struct_size = STRATA_HOST_API_STRUCT_SIZE_1_3;
  EXPECT_FALSE(STRATA_HAS_FIELD(&old, strata_host_api, device_count));
  EXPECT_TRUE(STRATA_HAS_FIELD(&old, strata_host_api, ps_variable_update));
  old.struct_size = STRATA_HOST_API_STRUCT_SIZE_1_4;
  EXPECT_TRUE(STRATA_HAS_FIELD(&old, strata_host_api, memcpy_async));
  EXPECT_FALSE(STRATA_HAS_FIELD(&old, strata_host_api, device_update));
  strata_error err;
  strata_error_init(&err);
  int32_t count = -1;
  EXPECT_EQ(api->device_count(api, kDLCPU, &count, &err), STRATA_OK);
  EXPECT_EQ(count, 1);
  const strata_status_t st = api->device_count(api, kDLCUDA, &count, &err);
  if (st == STRATA_OK) {
    EXPECT_GT(count, 0);
  } else {
    EXPECT_TRUE(st == STRATA_ERR_FAILED_PRECONDITION || st == STRATA_ERR_UNIMPLEMENTED) << strata_status_string(st);
    EXPECT_EQ(count, 0);
    EXPECT_NE(std::string(err.message), "");
  }
}

TEST(AbiTest, EnumValuesArePinned) {
  EXPECT_EQ(STRATA_ERR_ABI_MISMATCH, -14);
  EXPECT_EQ(STRATA_ERR_INTERNAL, -13);
  EXPECT_EQ(STRATA_KIND_STRATEGY, 1);
  EXPECT_EQ(STRATA_KIND_INPUT_PIPELINE, 5);
  EXPECT_EQ(STRATA_REDUCE_PROD, 4);
  EXPECT_EQ(STRATA_VAR_SYNC_NONE, 3);
  EXPECT_EQ(STRATA_VAR_AGG_ONLY_FIRST_REPLICA, 3);
  EXPECT_EQ(STRATA_COLL_RECV, 8);
  EXPECT_EQ(STRATA_LOG_CRITICAL, 5);
  EXPECT_STREQ(strata_status_string(STRATA_ERR_ABI_MISMATCH), "ABI_MISMATCH");
  EXPECT_STREQ(strata_status_string(12345), "UNKNOWN");
}

void append(void* user, const char* data, uint64_t len) { static_cast<std::string*>(user)->append(data, len); }

TEST(AbiTest, PluginBuiltAgainstANewerMinorLoadsAndWorks) {
  PluginHost host;
  const std::string path = std::string(ABI_FIXTURE_DIR) + "/newer/libstrata-resolver-newer.so";
  host.load_explicit(path);
  int found = 0;
  for (const auto& i : host.discover())
    if (i.name == "newer" || i.name == "newer_second") {
      ++found;
      EXPECT_TRUE(i.ok) << i.error;
      EXPECT_EQ(i.abi, "1." + std::to_string(STRATA_ABI_MINOR + 1));
      EXPECT_EQ(i.version, "2.0.0");
    }
  EXPECT_EQ(found, 2);  // the second component is read with the plugin's own (bigger) stride
  for (const char* name : {"newer", "newer_second"}) {
    PluginInstance inst = host.create(STRATA_KIND_CLUSTER_RESOLVER, name, "{}");
    const auto* vt = inst.vtable_as<strata_resolver_vtable>();
    EXPECT_EQ(vt->struct_size, STRATA_RESOLVER_VTABLE_STRUCT_SIZE);  // truncated to what this host knows
    EXPECT_EQ(vt->abi_minor, static_cast<uint32_t>(STRATA_ABI_MINOR + 1));
    std::string out;
    strata_error err;
    strata_error_init(&err);
    ASSERT_EQ(vt->master(static_cast<strata_resolver_t>(inst.handle()), nullptr, 0, nullptr, append, &out, &err),
              STRATA_OK);
    EXPECT_EQ(out, "newer:1");
    out.clear();
    ASSERT_EQ(vt->describe(static_cast<strata_resolver_t>(inst.handle()), append, &out, &err), STRATA_OK);
    EXPECT_EQ(out, "{\"from\": \"newer\"}");
  }
}

strata_status_t count_replica(void* user, strata_replica_t, uint32_t local_id, strata_error*) {
  ++*static_cast<int*>(user);
  return local_id == 0 ? STRATA_OK : STRATA_ERR_INTERNAL;
}

TEST(AbiTest, PluginBuiltAgainstMinor0LoadsWithNewFieldsNull) {
  const std::string path = std::string(ABI_FIXTURE_DIR) + "/older/libstrata-strategy-older.so";
  // What the plugin itself hands out: a 1.0-sized table whose static object
  // happens to carry non-NULL pointers beyond struct_size.
  void* so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(so, nullptr) << dlerror();
  auto entry = reinterpret_cast<strata_plugin_entry_v1_fn>(dlsym(so, STRATA_PLUGIN_ENTRY_V1_SYMBOL));
  ASSERT_NE(entry, nullptr);
  PluginHost host;
  const strata_plugin_desc* desc = nullptr;
  ASSERT_EQ(entry(host.host_api(), STRATA_ABI_MINOR, &desc), STRATA_OK);
  const auto* raw = static_cast<const strata_strategy_vtable*>(desc->components[0].vtable);
  EXPECT_EQ(raw->struct_size, STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_0);
  EXPECT_EQ(raw->abi_minor, 0u);
  EXPECT_FALSE(STRATA_HAS_FIELD(raw, strata_strategy_vtable, variable_view));
  EXPECT_NE(raw->variable_view, nullptr);  // garbage as far as a 1.1 host is concerned
  EXPECT_NE(raw->set_transport, nullptr);  // and for a 1.2 host

  host.load_explicit(path);
  bool listed = false;
  for (const auto& i : host.discover())
    if (i.name == "older") {
      listed = true;
      EXPECT_TRUE(i.ok) << i.error;
      EXPECT_EQ(i.abi, "1.0");
      EXPECT_EQ(i.kind, "strategy");
    }
  EXPECT_TRUE(listed);
  PluginInstance inst = host.create(STRATA_KIND_STRATEGY, "older", "{}");
  const auto* vt = inst.vtable_as<strata_strategy_vtable>();
  EXPECT_NE(vt, raw);  // the normalized copy
  EXPECT_EQ(vt->variable_view, nullptr);
  EXPECT_EQ(vt->save_state, nullptr);
  EXPECT_EQ(vt->restore_state, nullptr);
  EXPECT_EQ(vt->set_transport, nullptr);  // 1.2: also beyond a 1.0 table
  EXPECT_EQ(vt->replica_stream, nullptr);  // 1.4: also beyond a 1.0 table
  EXPECT_EQ(vt->run, raw->run);
  EXPECT_EQ(vt->variable_update, raw->variable_update);
  std::string out;
  strata_error err;
  strata_error_init(&err);
  auto s = static_cast<strata_strategy_t>(inst.handle());
  ASSERT_EQ(vt->describe(s, append, &out, &err), STRATA_OK);
  EXPECT_NE(out.find("\"num_replicas_in_sync\": 1"), std::string::npos) << out;
  int calls = 0;
  ASSERT_EQ(vt->run(s, count_replica, &calls, &err), STRATA_OK) << err.message;
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(vt->reduce_to(s, STRATA_REDUCE_SUM, 0, nullptr, nullptr, &err), STRATA_ERR_UNIMPLEMENTED);
  dlclose(so);
}

// Every *.so under `dir` (recursively).
void collect_libraries(const std::string& dir, std::vector<std::string>* out) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".so") out->push_back(it->path().string());
}

std::vector<std::string> defined_dynamic_symbols(const std::string& path) {
  std::vector<std::string> syms;
  const std::string cmd = "nm -D --defined-only '" + path + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {"<popen failed>"};
  char line[4096];
  while (fgets(line, sizeof(line), p)) {
    std::istringstream ss(line);
    std::string a, b, c;
    ss >> a >> b >> c;
    // "ADDRESS TYPE NAME"; an nm diagnostic has no such shape and is kept whole.
    syms.push_back(c.empty() ? std::string(line) : c);
  }
  pclose(p);
  return syms;
}

TEST(AbiTest, EveryPluginExportsOnlyItsEntrySymbol) {
  static const std::set<std::string> kLinkerSymbols = {"_init", "_fini", "_edata", "_end", "__bss_start"};
  std::vector<std::string> libs;
  collect_libraries(STRATA_TREE_PLUGIN_DIR, &libs);
  collect_libraries(STRATA_TESTS_BINARY_DIR "/host/plugins", &libs);
  collect_libraries(ABI_FIXTURE_DIR, &libs);
  std::size_t checked = 0;
  for (const auto& lib : libs) {
    const std::string file = fs::path(lib).filename().string();
    if (file.rfind("libstrata-", 0) != 0) continue;
    // The ABI-major-2 fixture exports strata_plugin_entry_v2 on purpose and
    // is built without the plugin version script.
    if (file == "libstrata-resolver-abi2.so") continue;
    ++checked;
    bool has_entry = false;
    for (const auto& s : defined_dynamic_symbols(lib)) {
      if (s == "strata_plugin_entry_v1") {
        has_entry = true;
      } else if (!kLinkerSymbols.count(s)) {
        ADD_FAILURE() << lib << " exports '" << s << "'; plugins must export only strata_plugin_entry_v1 "
                      << "(build with strata_add_plugin, which applies the version script)";
      }
    }
    // The no-entry fixture is the one library meant to lack it.
    if (file != "libstrata-resolver-noentry.so") {
      EXPECT_TRUE(has_entry) << lib << " lacks strata_plugin_entry_v1";
    }
  }
  EXPECT_GE(checked, 2u) << "no plugin libraries found to check";
}

}  // namespace
}  // namespace strata
