// SPDX-License-Identifier: Apache-2.0
// The distributed-input check shared by dist_data_worker (one process of a
// multi-worker run) and distributed_data_test (single-process cases run
// in-process): builds a dataset of element ids 0..N-1 from the chosen
// source, distributes it with the chosen strategy and policy, and records
// which ids every local replica saw at every step of every epoch.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/strata.hpp"

namespace strata::test {

using nlohmann::json;

struct Args {
  std::string strategy = "mirrored";
  std::string devices = "cpu:0";
  std::string source = "memory";
  std::vector<std::string> files;
  std::int64_t length = 10;
  std::int64_t batch = 4;
  bool drop = false;
  std::string policy = "AUTO";
  int epochs = 1;
  std::string mode = "dataset";  // dataset | per_worker | per_replica
  int prefetch = 2;
  // The process with this STRATA_RANK adds a component "extra" to its
  // elements (to test the check that workers agree on the layout); -1: none.
  int variant_rank = -1;
  // A composite pipeline over the record files (see composite_source); empty:
  // `source` alone.
  std::string composite;
  std::int64_t cycle = 2;  // interleave's cycle_length and block_length
  std::int64_t block = 1;
  std::size_t split = 0;   // zip/concatenate/mixed: files[0, split) feed the first input
};

inline strata::AutoShardPolicy parse_policy(const std::string& p) {
  if (p == "AUTO") return strata::AutoShardPolicy::AUTO;
  if (p == "FILE") return strata::AutoShardPolicy::FILE;
  if (p == "DATA") return strata::AutoShardPolicy::DATA;
  if (p == "OFF") return strata::AutoShardPolicy::OFF;
  if (p == "HINT") return strata::AutoShardPolicy::HINT;
  throw std::invalid_argument("unknown policy " + p);
}

// The composite pipelines auto-sharding looks through (ids as "id"):
//  interleave, flat_map: list_files(files, no shuffle) read by from_records
//    (interleave(cycle, block) / flat_map); `files` may be glob patterns;
//  unique: flat_map's pipeline then unique() (no reader for auto-shard);
//  assert: flat_map's pipeline then assert_cardinality(length);
//  concatenate: from_records(files[:split]) then list_files(files[split:])
//    read by flat_map;
//  zip: from_records(files[:split]) zipped with from_records(files[split:]),
//    id = a + 1000 * b;
//  mixed: from_records(files[:split]) then in-memory ids length, length + 1
//    (one branch has no reader).
inline strata::Dataset composite_source(const Args& a) {
  strata::RecordOptions o;
  o.features = {{"id", strata::DType::kInt64, {}}};
  auto read = [o](strata::Element e) { return strata::Dataset::from_records({strata::Dataset::file_name(e)}, o); };
  const std::vector<std::string> first(a.files.begin(), a.files.begin() + static_cast<std::ptrdiff_t>(a.split));
  const std::vector<std::string> second(a.files.begin() + static_cast<std::ptrdiff_t>(a.split), a.files.end());
  const strata::Dataset listed = strata::Dataset::list_files(a.files, /*shuffle=*/false);
  if (a.composite == "interleave") return listed.interleave(read, a.cycle, a.block);
  if (a.composite == "flat_map") return listed.flat_map(read);
  if (a.composite == "unique") return listed.flat_map(read).unique();
  if (a.composite == "assert") return listed.flat_map(read).assert_cardinality(a.length);
  if (a.composite == "concatenate")
    return strata::Dataset::from_records(first, o).concatenate(
        strata::Dataset::list_files(second, false).flat_map(read));
  if (a.composite == "zip")
    return strata::Dataset::zip({strata::Dataset::from_records(first, o),
                                 strata::Dataset::from_records(second, o).map([](strata::Element e) {
                                   strata::Element r;
                                   r.add("b", std::move(e.tensors[0]));
                                   return r;
                                 })})
        .map([](strata::Element e) {
          const std::int64_t id = e["id"].to_vector<std::int64_t>()[0] + 1000 * e["b"].to_vector<std::int64_t>()[0];
          strata::Element r;
          r.add("id", strata::Tensor::scalar<std::int64_t>(id));
          return r;
        });
  if (a.composite == "mixed") {
    strata::Element e;
    e.add("id", strata::Tensor::from_vector<std::int64_t>({a.length, a.length + 1}));
    return strata::Dataset::from_records(first, o).concatenate(strata::Dataset::from_tensor_slices(std::move(e)));
  }
  throw std::invalid_argument("unknown composite " + a.composite);
}

// Element ids 0..length-1 as component "id" (int64 scalars).
inline strata::Dataset source(const Args& a) {
  if (!a.composite.empty()) return composite_source(a);
  if (a.source == "records") {
    strata::RecordOptions o;
    o.features = {{"id", strata::DType::kInt64, {}}};
    return strata::Dataset::from_records(a.files, o);
  }
  if (a.source == "generator") {
    const std::int64_t n = a.length;
    return strata::Dataset::from_generator([n](const strata::InputContext&) {
      auto next = std::make_shared<std::int64_t>(0);
      return [n, next]() -> std::optional<strata::Element> {
        if (*next >= n) return std::nullopt;
        strata::Element e;
        e.add("id", strata::Tensor::scalar<std::int64_t>((*next)++));
        return e;
      };
    });
  }
  std::vector<std::int64_t> ids(static_cast<std::size_t>(a.length));
  for (std::int64_t i = 0; i < a.length; ++i) ids[static_cast<std::size_t>(i)] = i;
  strata::Element e;
  e.add("id", strata::Tensor::from_vector(ids, {a.length}));
  return strata::Dataset::from_tensor_slices(std::move(e));
}

inline std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Run the case and return the record of what every local replica saw.
inline json run_distributed(const Args& a) {
  json opts = {{"devices", split_csv(a.devices)}};
  strata::Strategy strategy = strata::Strategy::create(a.strategy, opts.dump());
  strata::InputOptions io;
  io.prefetch_depth = a.prefetch;
  strata::DatasetOptions dopts;
  dopts.auto_shard_policy = parse_policy(a.policy);
  std::optional<strata::DistributedDataset> dist;
  if (a.mode == "dataset") {
    strata::Dataset ds = source(a);
    const char* rank = std::getenv("STRATA_RANK");
    if (a.variant_rank >= 0 && rank != nullptr && std::atoi(rank) == a.variant_rank)
      ds = ds.map([](strata::Element e) {
        e.add("extra", strata::Tensor::scalar<float>(1.0f));
        return e;
      });
    if (a.policy == "HINT") ds = ds.shard(strata::SHARD_HINT, strata::SHARD_HINT);
    dist.emplace(strategy.distribute_dataset(ds.batch(a.batch, a.drop).with_options(dopts), io));
  } else {
    io.experimental_replication_mode =
        a.mode == "per_replica" ? strata::InputReplicationMode::PER_REPLICA : strata::InputReplicationMode::PER_WORKER;
    dist.emplace(strategy.distribute_datasets_from_function(
        [&](const strata::InputContext& ctx) {
          return source(a)
              .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
              .batch(ctx.get_per_replica_batch_size(a.batch), a.drop);
        },
        io));
  }
  const auto& ext = strategy.extended();
  json doc = {{"worker", ext.worker_index()},
              {"num_workers", ext.num_workers()},
              {"replicas", strategy.num_replicas_in_sync()},
              {"local", strategy.num_local_replicas()},
              {"policy", dist->applied_policy()},
              {"epochs", json::array()}};
  // Global replica ids of the local replicas, in local order.
  std::vector<int> ids(static_cast<std::size_t>(strategy.num_local_replicas()));
  strategy.run([&](strata::ReplicaContext& ctx) { ids[ctx.local_replica_id()] = ctx.replica_id_in_sync_group(); });
  doc["replica_ids"] = ids;
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    json steps = json::array();
    if (epoch % 2 == 0) {
      for (strata::DistributedElement& batch : *dist) {
        json step = json::array();
        for (const strata::Tensor& t : batch["id"].values()) step.push_back(t.to_vector<std::int64_t>());
        steps.push_back(step);
      }
    } else {  // odd epochs use the explicit iterator API
      strata::DistributedIterator it = dist->make_iterator();
      while (auto batch = it.get_next_as_optional()) {
        json step = json::array();
        for (const strata::Tensor& t : (*batch)["id"].values()) step.push_back(t.to_vector<std::int64_t>());
        steps.push_back(step);
      }
      if (it.get_next_as_optional()) throw std::runtime_error("an ended iterator produced another step");
      try {
        it.next();
        throw std::runtime_error("next() after the end did not throw");
      } catch (const strata::OutOfRangeError&) {
      }
    }
    doc["epochs"].push_back(steps);
  }
  return doc;
}

}  // namespace strata::test
