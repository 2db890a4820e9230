// SPDX-License-Identifier: Apache-2.0
// The host-API entries (strata/c/host.h, since 1.3) through which a strategy
// plugin (parameter_server) creates, reads and updates variables on the ps
// tasks: the connections belong to this process's ClusterCoordinator or
// strata::Server, which plugins cannot link. A variable reference is the
// wire encoding of its VariableInfo (what RemoteVariable sends to workers).
#pragma once

#include "strata/c/host.h"

namespace strata::ps_detail {

strata_status_t host_ps_variable_create(const strata_host_api* host, const char* name, const DLTensor* initial,
                                        const char* options_json, strata_write_fn write, void* user,
                                        strata_error* err);
strata_status_t host_ps_variable_read(const strata_host_api* host, const void* ref, uint64_t ref_len,
                                      DLManagedTensor** out, strata_error* err);
strata_status_t host_ps_variable_update(const strata_host_api* host, const void* ref, uint64_t ref_len,
                                        uint32_t op, const DLTensor* value, strata_error* err);

}  // namespace strata::ps_detail
