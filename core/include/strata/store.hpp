// SPDX-License-Identifier: Apache-2.0
// Configuration of the rendezvous key-value store shared by every process of
// a multi-process job (the store behind strata_host_api's store_* services).
//
// By default each process has an in-process store (enough when every rank
// lives in one process). For a multi-process job, call
// PluginHost::global().connect_store(StoreConfig) once, before creating any
// strategy or transport: the chief passes serve = true and serves the store
// on the port of `address`; every process (the chief included) then talks
// to that server over TCP.
#pragma once

#include <string>

namespace strata {

struct StoreConfig {
  /// "host:port" of the server (IPv6 as "[::1]:port"). With serve = true, port
  /// 0 binds an ephemeral port; read it back with PluginHost::store_address().
  std::string address;
  /// This process runs the server (the chief).
  bool serve = false;
  /// Shared secret ("" = none). Clients with another token are refused with
  /// PERMISSION_DENIED. Usually from STRATA_AUTH_TOKEN or
  /// /rendezvous/auth_token (see PluginHost::connect_store).
  std::string auth_token;
  /// Rendezvous deadline in seconds: how long connecting retries while the
  /// server is not up yet (/timeouts/rendezvous_s).
  double timeout_s = 120;
};

}  // namespace strata
