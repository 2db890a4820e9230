// SPDX-License-Identifier: Apache-2.0
// mwms_worker: one worker process of mwms_test's API checks. It creates the
// strategy from the job config (STRATA_CONFIG, STRATA_STRATEGY, TF_CONFIG,
// as strata-train does), runs every cross-worker operation with values
// that depend on the global replica id, and prints the raw results as one
// JSON object on stdout; the test computes the expected values itself.
//   mwms_worker [devices,comma,separated | default] [RING|NCCL|AUTO]
// (default: no "devices" option, so the strategy picks its own)
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/strata.hpp"

namespace {

using nlohmann::json;
using strata::DType;
using strata::Tensor;

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> out;
  // Replica-context results of GPU replicas stay on their GPU.
  const std::vector<float> values =
      t.device().device_type == kDLCPU ? t.to_vector<float>() : t.to("cpu:0").to_vector<float>();
  for (float v : values) out.push_back(v);
  return out;
}

Tensor filled(std::int64_t n, std::int64_t cols, float v) {
  return Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n * cols), v), {n, cols});
}

int work(const std::string& devices, const std::string& communication) {
  const char* path = std::getenv("STRATA_CONFIG");
  strata::Config cfg = path ? strata::Config::from_file(path) : strata::Config();
  cfg.apply_env();
  cfg.set("/strategy/name", "\"multi_worker_mirrored\"");
  std::vector<std::string> devs;
  std::stringstream ss(devices);
  for (std::string d; std::getline(ss, d, ',');) devs.push_back(d);
  if (devices != "default") cfg.set("/strategy/options/devices", json(devs).dump());
  if (!communication.empty())
    cfg.set("/strategy/options/communication", json{{"implementation", communication}}.dump());
  strata::Strategy s = strata::Strategy::from_config(cfg);
  auto scope = s.scope();
  json out;
  out["describe"] = json::parse(s.extended().describe_json());
  out["num_replicas_in_sync"] = s.num_replicas_in_sync();
  out["num_local_replicas"] = s.num_local_replicas();
  out["worker_index"] = s.extended().worker_index();
  out["num_workers"] = s.extended().num_workers();
  out["is_chief"] = s.extended().is_chief();
  const strata::InputContext ic = s.extended().input_context();
  out["input_context"] = {ic.num_input_pipelines, ic.input_pipeline_id, ic.num_replicas_in_sync};

  // Initial values differ per worker; the chief's must win everywhere.
  const float w = static_cast<float>(s.extended().worker_index());
  strata::Variable init(Tensor::from_vector(std::vector<float>(3, w + 1.0f), {3}),
                        {"init", true, strata::Synchronization::ON_WRITE, strata::Aggregation::SUM});
  out["initial"] = doubles(init.value());

  strata::Variable on_read_sum(Tensor::zeros({2}, DType::kFloat32),
                               {"sum", false, strata::Synchronization::ON_READ, strata::Aggregation::SUM});
  strata::Variable on_read_mean(Tensor::zeros({2}, DType::kFloat32),
                                {"mean", false, strata::Synchronization::ON_READ, strata::Aggregation::MEAN});
  strata::Variable on_read_first(Tensor::zeros({2}, DType::kFloat32),
                                 {"first", false, strata::Synchronization::ON_READ,
                                  strata::Aggregation::ONLY_FIRST_REPLICA});

  const std::size_t local = static_cast<std::size_t>(s.num_local_replicas());
  std::vector<int> ids(local);
  std::vector<std::vector<double>> replica_gather(local), replica_mean(local), replica_reads(local);
  std::vector<std::vector<std::int64_t>> replica_gather_shape(local);
  // Replica g contributes g+1 rows of value g (uneven sizes along axis 0).
  strata::PerReplica rows = s.run([&](strata::ReplicaContext& ctx) {
    const std::int32_t g = ctx.replica_id_in_sync_group();
    const std::size_t l = ctx.local_replica_id();
    ids[l] = g;
    const Tensor mine = filled(g + 1, 2, static_cast<float>(g));
    const Tensor all = ctx.all_gather(mine, 0);
    replica_gather[l] = doubles(all);
    replica_gather_shape[l] = all.shape();
    replica_mean[l] = doubles(ctx.all_reduce(strata::ReduceOp::MEAN, Tensor::scalar<float>(static_cast<float>(g))));
    const Tensor add = Tensor::from_vector(std::vector<float>{static_cast<float>(g + 1), 1.0f}, {2});
    on_read_sum.assign_add(add);
    on_read_mean.assign_add(add);
    on_read_first.assign_add(add);
    init.assign_add(Tensor::from_vector(std::vector<float>(3, static_cast<float>(g)), {3}));  // ON_WRITE SUM
    replica_reads[l] = doubles(on_read_sum.value());  // the replica's own copy
    return filled(g + 1, 2, static_cast<float>(g));
  });
  // Sparse rows: replica g sends rows {g % 4, (g + 1) % 4} of a [4, 2]
  // table, each [g, 1]; the all-reduce gathers them in replica order.
  std::vector<std::vector<std::int64_t>> sparse_indices(local);
  std::vector<std::vector<double>> sparse_dense(local), sparse_mean_values(local);
  s.run([&](strata::ReplicaContext& ctx) {
    const std::int64_t g = ctx.replica_id_in_sync_group();
    const float gf = static_cast<float>(g);
    strata::IndexedSlices mine{Tensor::from_vector(std::vector<float>{gf, 1.0f, gf, 1.0f}, {2, 2}),
                               Tensor::from_vector(std::vector<std::int64_t>{g % 4, (g + 1) % 4}, {2}),
                               {4, 2}};
    const strata::IndexedSlices sum = ctx.all_reduce(strata::ReduceOp::SUM, mine);
    const strata::IndexedSlices mean = ctx.all_reduce(strata::ReduceOp::MEAN, mine);
    const std::size_t l = ctx.local_replica_id();
    sparse_indices[l] = sum.indices.to_vector<std::int64_t>();
    sparse_dense[l] = doubles(sum.to_dense());
    sparse_mean_values[l] = doubles(mean.values);
  });
  out["sparse_indices"] = sparse_indices;
  out["sparse_dense"] = sparse_dense;
  out["sparse_mean_values"] = sparse_mean_values;
  // A non-distributed value counts once per worker: worker w gives w + 1.
  const Tensor per_worker = Tensor::from_vector(std::vector<float>{w + 1.0f}, {1});
  out["non_distributed_sum"] = doubles(s.reduce(strata::ReduceOp::SUM, per_worker));
  out["non_distributed_mean"] = doubles(s.reduce(strata::ReduceOp::MEAN, per_worker));
  out["replica_ids"] = ids;
  out["replica_all_gather"] = replica_gather;
  out["replica_all_gather_shape"] = replica_gather_shape;
  out["replica_all_reduce_mean"] = replica_mean;
  out["replica_reads"] = replica_reads;
  out["after_sum_update"] = doubles(init.value());
  out["on_read_sum"] = doubles(on_read_sum.value());
  out["on_read_mean"] = doubles(on_read_mean.value());
  out["on_read_first"] = doubles(on_read_first.value());
  const Tensor gathered = s.gather(rows, 0);
  out["gather"] = doubles(gathered);
  out["gather_shape"] = gathered.shape();
  strata::PerReplica ones = s.experimental_distribute_values_from_function([](const strata::ValueContext& vc) {
    return Tensor::from_vector(std::vector<float>{static_cast<float>(vc.replica_id_in_sync_group + 1)}, {1});
  });
  out["reduce_sum"] = doubles(s.reduce(strata::ReduceOp::SUM, ones));
  out["reduce_mean"] = doubles(s.reduce(strata::ReduceOp::MEAN, ones));
  out["reduce_mean_axis0"] = doubles(s.reduce(strata::ReduceOp::MEAN, rows, 0));
  // Cross-replica assign of an ON_READ SUM variable: the total is what was assigned.
  on_read_sum.assign(Tensor::from_vector(std::vector<float>{10.0f, 20.0f}, {2}));
  out["on_read_sum_after_assign"] = doubles(on_read_sum.value());
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return work(argc > 1 ? argv[1] : "cpu:0", argc > 2 ? argv[2] : "");
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "mwms_worker: error: %s (%s)\n", e.what(), e.code_name());
    return 2;
  }
}
