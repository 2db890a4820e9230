// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the TF_CONFIG parser and the checks behind the
// tf_config resolver. Any input must either resolve or be rejected with
// INVALID_ARGUMENT (NOT_FOUND from master() for a task outside the cluster);
// anything else (a crash, another exception, an inconsistent describe())
// aborts so libFuzzer reports it.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cluster_spec.h"
#include "strata/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::resolvers;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    TfConfig tf = parse_tf_config(text);
    Resolution r;
    r.cluster = tf.cluster;
    r.task_type = tf.task_type;
    r.task_id = tf.task_id;
    r.rpc_layer = tf.rpc_layer;
    r.session_master = tf.session_master;
    r.environment = tf.environment;
    r.validate("TF_CONFIG");
    const nlohmann::json d = r.describe();
    // describe() must round-trip: its spec parses back to the same jobs.
    if (parse_cluster_spec(d["cluster_spec"], "describe()").jobs != r.cluster.jobs) std::abort();
    const ClusterRole role = cluster_role(d);
    if (role.worker_count && *role.worker_count < 0) std::abort();
    // An evaluator outside the cluster keeps its own index, as in TF.
    if (role.id_in_cluster && role.worker_count && *role.id_in_cluster >= *role.worker_count &&
        d["task_type"] != "evaluator")
      std::abort();
    (void)d.dump();
    (void)r.master(nullptr, -1, nullptr, "TF_CONFIG");
  } catch (const strata::Error& e) {
    if (e.code() != STRATA_ERR_INVALID_ARGUMENT && e.code() != STRATA_ERR_NOT_FOUND) std::abort();
  }
  return 0;
}
