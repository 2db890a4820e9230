// SPDX-License-Identifier: Apache-2.0
// Distributed input: batch splitting across replicas, auto-sharding across
// workers, lock-step ends, distribute_datasets_from_function, iterators and
// the bad-use errors. Single-process cases run in this process (mirrored
// with 1-4 replicas); multi-worker cases run real processes under strata-run
// (multi_worker_mirrored over TCP) and check the union of what they saw.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../run/subprocess.h"
#include "dist_data_case.h"
#include "strata/records.hpp"

namespace strata::test {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Case {
  int workers = 1;
  int local = 1;
  std::int64_t length = 10;
  std::int64_t batch = 4;
  bool drop = false;
  std::string policy = "AUTO";
  std::string mode = "dataset";
  std::string source = "memory";
  std::vector<std::int64_t> file_sizes;  // records source: ids split over files of these sizes
  int epochs = 2;
  int variant_rank = -1;                 // see Args::variant_rank
  std::string composite;                 // see composite_source in dist_data_case.h
  std::int64_t cycle = 2, block = 1;
  std::size_t split = 0;
  bool glob = false;                     // pass "<dir>/part-*.rec" instead of the file names
  std::string label() const {
    std::string s = "W" + std::to_string(workers) + " L" + std::to_string(local) + " N" + std::to_string(length) +
                    " B" + std::to_string(batch) + (drop ? " drop" : "") + " " + policy + " " + mode + " " + source;
    if (!file_sizes.empty()) {
      s += " files";
      for (auto f : file_sizes) s += ":" + std::to_string(f);
    }
    if (!composite.empty()) s += " " + composite + " split " + std::to_string(split);
    return s;
  }
};

std::string devices(int local) {
  std::string d;
  for (int i = 0; i < local; ++i) d += (i ? ",cpu:" : "cpu:") + std::to_string(i);
  return d;
}

using Steps = std::vector<std::vector<std::vector<std::int64_t>>>;  // [step][local replica] -> ids

// The ids of every record file (consecutive ids over file_sizes).
std::vector<std::vector<std::int64_t>> file_ids(const Case& c) {
  std::vector<std::vector<std::int64_t>> out;
  std::int64_t id = 0;
  for (std::int64_t n : c.file_sizes) {
    out.emplace_back();
    for (std::int64_t i = 0; i < n; ++i) out.back().push_back(id++);
  }
  return out;
}

// tf's interleave order, after the reference model _interleave in
// tensorflow/python/data/kernel_tests/interleave_test.py: `cycle` open
// lists, `block` items from each in turn; an exhausted list leaves its slot
// empty until the next pass over the slots refills it.
std::vector<std::int64_t> interleave_ref(const std::vector<std::vector<std::int64_t>>& lists, std::int64_t cycle,
                                         std::int64_t block) {
  std::deque<std::vector<std::int64_t>> waiting(lists.begin(), lists.end());
  std::vector<std::optional<std::pair<std::vector<std::int64_t>, std::size_t>>> open(static_cast<std::size_t>(cycle));
  std::int64_t num_open = 0;
  for (auto& slot : open)
    if (!waiting.empty()) {
      slot.emplace(waiting.front(), 0);
      waiting.pop_front();
      ++num_open;
    }
  std::vector<std::int64_t> out;
  while (num_open > 0 || !waiting.empty()) {
    for (auto& slot : open) {
      if (!slot) {
        if (waiting.empty()) continue;
        slot.emplace(waiting.front(), 0);
        waiting.pop_front();
        ++num_open;
      }
      for (std::int64_t k = 0; k < block; ++k) {
        if (slot->second == slot->first.size()) {
          slot.reset();
          --num_open;
          break;
        }
        out.push_back(slot->first[slot->second++]);
      }
    }
  }
  return out;
}

// The composite pipeline's ids on worker w of W (W = 1: unsharded): under
// FILE every reader gets files k with k % W == w of its own file list.
std::vector<std::int64_t> composite_stream(const Case& c, int W, int w) {
  const auto files = file_ids(c);
  auto mine = [&](std::size_t from, std::size_t to) {
    std::vector<std::vector<std::int64_t>> out;
    for (std::size_t k = from; k < to; ++k)
      if (static_cast<int>((k - from) % static_cast<std::size_t>(W)) == w) out.push_back(files[k]);
    return out;
  };
  auto flat = [](const std::vector<std::vector<std::int64_t>>& lists) {
    std::vector<std::int64_t> out;
    for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
    return out;
  };
  const std::size_t n = files.size(), split = c.split;
  if (c.composite == "interleave") return interleave_ref(mine(0, n), c.cycle, c.block);
  if (c.composite == "flat_map" || c.composite == "assert" || c.composite == "unique") return flat(mine(0, n));
  if (c.composite == "concatenate") {
    auto ids = flat(mine(0, split));
    const auto b = flat(mine(split, n));
    ids.insert(ids.end(), b.begin(), b.end());
    return ids;
  }
  if (c.composite == "zip") {
    const auto a = flat(mine(0, split)), b = flat(mine(split, n));
    std::vector<std::int64_t> ids;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) ids.push_back(a[i] + 1000 * b[i]);
    return ids;
  }
  if (c.composite == "mixed") {
    auto ids = flat(mine(0, split));
    ids.push_back(c.length);
    ids.push_back(c.length + 1);
    return ids;
  }
  ADD_FAILURE() << "no model for composite " << c.composite;
  return {};
}

// The element ids worker w's own stream yields, in order, before batching.
std::vector<std::int64_t> worker_stream(const Case& c, const std::string& policy, int w) {
  std::vector<std::int64_t> ids;
  if (!c.composite.empty()) {
    const bool by_file = c.workers > 1 && policy == "FILE";
    const auto all = composite_stream(c, by_file ? c.workers : 1, by_file ? w : 0);
    if (c.workers == 1 || policy != "HINT") return all;
    for (std::size_t p = 0; p < all.size(); ++p)  // shard(W, w) over positions
      if (static_cast<int>(p % static_cast<std::size_t>(c.workers)) == w) ids.push_back(all[p]);
    return ids;
  }
  if (c.workers > 1 && policy == "FILE") {
    std::int64_t first = 0;
    for (std::size_t k = 0; k < c.file_sizes.size(); ++k) {
      if (static_cast<int>(k % static_cast<std::size_t>(c.workers)) == w)
        for (std::int64_t i = 0; i < c.file_sizes[k]; ++i) ids.push_back(first + i);
      first += c.file_sizes[k];
    }
    return ids;
  }
  for (std::int64_t i = 0; i < c.length; ++i)
    if (c.workers == 1 || policy != "HINT" || i % c.workers == w) ids.push_back(i);
  return ids;
}

std::vector<std::vector<std::int64_t>> batches_of(const std::vector<std::int64_t>& ids, std::int64_t batch, bool drop) {
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t i = 0; i < ids.size(); i += static_cast<std::size_t>(batch)) {
    const std::size_t end = std::min(ids.size(), i + static_cast<std::size_t>(batch));
    if (drop && end - i < static_cast<std::size_t>(batch)) break;
    out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

// What tf.distribute gives worker w, written from its documented algorithm
// (independently of the implementation): see distributed_data.hpp.
//  - DATA across workers: python/distribute/input_lib.py rewrites the
//    rebatch to _LegacyRebatchDataset(N) and auto-shard appends shard(W, w);
//    _LegacyRebatchDataset's docstring: range(8).batch(4) on 3 -> [0,1],
//    [2,3], [].
//  - otherwise: dataset.rebatch(batch_sizes_for_worker(G, W, L, w))
//    (data/experimental/ops/distribute.py; rebatch_dataset_test.py pins
//    G=4, W=3: [2,1,1], [1,1,2], [1,2,1]), which cuts the rows as
//    unbatch().batch(sizes cycled) would (rebatch_test.py,
//    testBatchSizeGreaterThanOriginal), L sub-batches per step.
Steps expected_steps(const Case& c, const std::string& policy, int w) {
  const int W = c.workers, L = c.local, N = W * L;
  const auto batches = batches_of(worker_stream(c, policy, w), c.batch, c.drop);
  Steps steps;
  if (W > 1 && policy == "DATA") {
    for (const auto& b : batches) {
      const auto len = static_cast<std::int64_t>(b.size());
      const std::int64_t mc = ceil_div(len, N);
      std::vector<std::vector<std::int64_t>> step;
      for (int i = 0; i < L; ++i) {
        const std::int64_t k = w + static_cast<std::int64_t>(i) * W;
        const std::int64_t lo = std::min(len, k * mc), hi = std::min(len, lo + mc);
        step.emplace_back(b.begin() + lo, b.begin() + hi);
      }
      steps.push_back(step);
    }
    return steps;
  }
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(N));
  for (int k = 0; k < N; ++k) sizes[static_cast<std::size_t>(k)] = c.batch / N + (k < c.batch % N ? 1 : 0);
  std::rotate(sizes.begin(), sizes.begin() + w * L, sizes.end());
  std::vector<std::int64_t> rows;
  for (const auto& b : batches) rows.insert(rows.end(), b.begin(), b.end());
  std::size_t pos = 0, next = 0;
  while (pos < rows.size()) {
    std::vector<std::vector<std::int64_t>> step;
    for (int i = 0; i < L; ++i) {
      const std::size_t n = std::min(rows.size() - pos, static_cast<std::size_t>(sizes[next]));
      step.emplace_back(rows.begin() + static_cast<std::ptrdiff_t>(pos),
                        rows.begin() + static_cast<std::ptrdiff_t>(pos + n));
      pos += n;
      next = (next + 1) % sizes.size();
    }
    steps.push_back(step);
  }
  return steps;
}

// Check one run's records (one per worker) against the rules of
// distributed_data.hpp.
void check_records(const Case& c, const std::vector<json>& docs, const std::string& expect_policy) {
  SCOPED_TRACE(c.label());
  ASSERT_EQ(static_cast<int>(docs.size()), c.workers);
  const int R = c.workers * c.local;
  for (const json& d : docs) {
    EXPECT_EQ(d["replicas"].get<int>(), R);
    if (!expect_policy.empty()) {
      EXPECT_EQ(d["policy"].get<std::string>(), expect_policy);
    }
  }
  if (c.mode == "dataset") {
    // Exactly what tf.distribute gives, every worker, every step; workers
    // whose input ended get empty batches until the last one ends.
    const std::string policy = docs[0]["policy"].get<std::string>();
    std::vector<Steps> want;
    std::size_t steps = 0;
    for (int w = 0; w < c.workers; ++w) {
      want.push_back(expected_steps(c, policy, w));
      steps = std::max(steps, want.back().size());
    }
    for (auto& ws : want) ws.resize(steps, std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(c.local)));
    for (const json& d : docs) {
      const int w = d["worker"].get<int>();
      for (int e = 0; e < c.epochs; ++e)
        EXPECT_EQ(d["epochs"][e].dump(), json(want[static_cast<std::size_t>(w)]).dump())
            << "worker " << w << ", epoch " << e;
    }
    return;
  }
  for (int e = 0; e < c.epochs; ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e));
    const std::size_t steps = docs[0]["epochs"][e].size();
    for (const json& d : docs) ASSERT_EQ(d["epochs"][e].size(), steps) << "workers did not step in lock-step";
    std::map<std::int64_t, int> seen;
    for (std::size_t t = 0; t < steps; ++t) {
      SCOPED_TRACE("step " + std::to_string(t));
      std::int64_t total = 0;
      for (const json& d : docs) {
        const json& step = d["epochs"][e][t];
        ASSERT_EQ(static_cast<int>(step.size()), c.local);
        for (int i = 0; i < c.local; ++i) {
          const auto ids = step[i].get<std::vector<std::int64_t>>();
          for (auto id : ids) ++seen[id];
          total += static_cast<std::int64_t>(ids.size());
          const std::int64_t per = c.batch / R;
          EXPECT_LE(static_cast<std::int64_t>(ids.size()), per);
          if (c.drop) {
            EXPECT_TRUE(ids.empty() || static_cast<std::int64_t>(ids.size()) == per);
          }
        }
      }
      EXPECT_GT(total, 0) << "a step where no replica had data";
    }
    // Exactly once, nothing missing unless dropped.
    for (const auto& [id, n] : seen) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, c.length);
      EXPECT_EQ(n, 1) << "element " << id;
    }
    if (!c.drop) {
      EXPECT_EQ(static_cast<std::int64_t>(seen.size()), c.length) << "elements missing";
    }
  }
}

Args args_of(const Case& c) {
  Args a;
  a.strategy = c.workers > 1 ? "multi_worker_mirrored" : "mirrored";
  a.devices = devices(c.local);
  a.source = c.source;
  a.length = c.length;
  a.batch = c.batch;
  a.drop = c.drop;
  a.policy = c.policy;
  a.epochs = c.epochs;
  a.mode = c.mode;
  a.composite = c.composite;
  a.cycle = c.cycle;
  a.block = c.block;
  a.split = c.split;
  return a;
}

// Write ids 0..N-1 over record files of the given sizes.
std::vector<std::string> write_files(const TempDir& dir, const std::vector<std::int64_t>& sizes) {
  std::vector<std::string> files;
  std::int64_t id = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    files.push_back(dir.str() + "/part-" + std::to_string(k) + ".rec");
    RecordWriter w(files.back());
    for (std::int64_t i = 0; i < sizes[k]; ++i, ++id) w.write_features({TensorView(&id, {}, DType::kInt64)});
    w.close();
  }
  return files;
}

// ------------------------------------------------------ single process ---

TEST(DistributedDataTest, SplitsEveryBatchAcrossReplicasExactlyOnce) {
  for (int local : {1, 2, 3, 4})
    for (std::int64_t batch : {1, 3, 4, 7, 8})
      for (std::int64_t length : {1, 5, 8, 17})
        for (bool drop : {false, true}) {
          Case c;
          c.local = local;
          c.batch = batch;
          c.length = length;
          c.drop = drop;
          if (drop && length < batch) continue;  // no elements: see NoElementsIsAnError
          json doc = run_distributed(args_of(c));
          check_records(c, {doc}, "OFF");
        }
}

TEST(DistributedDataTest, DocumentedExamplesOfTheSplit) {
  // One worker: dataset.rebatch(batch_sizes_for_worker(G, 1, L, 0)). G = 4
  // on 3 replicas is 2+1+1 (not the legacy rebatch's 2+2+0).
  Case c;
  c.local = 3;
  c.length = 8;
  c.batch = 4;
  c.epochs = 1;
  json doc = run_distributed(args_of(c));
  EXPECT_EQ(doc["epochs"][0].dump(), "[[[0,1],[2],[3]],[[4,5],[6],[7]]]");
  // G = 10 on 4 replicas is 3+3+2+2; a short last batch of 5 fills the
  // sub-batches in order: 3+2+0+0.
  c.local = 4;
  c.length = 15;
  c.batch = 10;
  doc = run_distributed(args_of(c));
  EXPECT_EQ(doc["epochs"][0].dump(), "[[[0,1,2],[3,4,5],[6,7],[8,9]],[[10,11,12],[13,14],[],[]]]");
  // A global batch smaller than the replicas: the last ones get empty
  // batches (rebatch_test.py testEmptySplits: sizes [1,1,1,1,0]).
  c.local = 3;
  c.length = 4;
  c.batch = 2;
  doc = run_distributed(args_of(c));
  EXPECT_EQ(doc["epochs"][0].dump(), "[[[0],[1],[]],[[2],[3],[]]]");
}

TEST(DistributedDataTest, EverySourceKindDistributes) {
  TempDir dir;
  for (const std::string source : {"memory", "generator", "records"}) {
    Case c;
    c.local = 2;
    c.length = 11;
    c.batch = 4;
    c.source = source;
    Args a = args_of(c);
    if (source == "records") a.files = write_files(dir, {4, 0, 7});
    check_records(c, {run_distributed(a)}, "OFF");
  }
}

TEST(DistributedDataTest, DatasetsFromFunctionPerWorkerAndPerReplica) {
  for (const std::string mode : {"per_worker", "per_replica"})
    for (int local : {1, 2, 4})
      for (std::int64_t length : {3, 8, 13})
        for (bool drop : {false, true}) {
          Case c;
          c.mode = mode;
          c.local = local;
          c.batch = 4;
          c.length = length;
          c.drop = drop;
          // Skip the cases with no full batch anywhere (NoElementsIsAnError).
          const std::int64_t per = c.batch / local;
          if (drop && (mode == "per_worker" ? length : ceil_div(length, local)) < per) continue;
          check_records(c, {run_distributed(args_of(c))}, "FUNCTION");
        }
}

TEST(DistributedDataTest, PerReplicaPipelinesSeeTheirReplicaId) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1","cpu:2"]})");
  std::vector<InputContext> seen;
  InputOptions io;
  io.experimental_replication_mode = InputReplicationMode::PER_REPLICA;
  auto dist = strategy.distribute_datasets_from_function(
      [&](const InputContext& ctx) {
        seen.push_back(ctx);
        Element e;
        e.add("v", Tensor::from_vector<std::int64_t>({ctx.input_pipeline_id, ctx.input_pipeline_id}, {2}));
        return Dataset::from_tensor_slices(std::move(e)).batch(1);
      },
      io);
  ASSERT_EQ(seen.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].num_input_pipelines, 3);
    EXPECT_EQ(seen[i].input_pipeline_id, i);
    EXPECT_EQ(seen[i].num_replicas_in_sync, 3);
  }
  auto it = dist.make_iterator();
  DistributedElement first = it.next();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(first["v"][static_cast<std::size_t>(i)].to_vector<std::int64_t>()[0], i);
  EXPECT_EQ(first.local_batch_sizes(), (std::vector<std::int64_t>{1, 1, 1}));
}

TEST(DistributedDataTest, InputIsPreparedAheadOnItsOwnThread) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  auto pulled = std::make_shared<std::atomic<int>>(0);
  auto ds = Dataset::from_generator([pulled](const InputContext&) {
              auto i = std::make_shared<std::int64_t>(0);
              return [pulled, i]() -> std::optional<Element> {
                if (*i >= 100) return std::nullopt;
                ++*pulled;
                Element e;
                e.add("x", Tensor::scalar<std::int64_t>((*i)++));
                return e;
              };
            }).batch(2);
  InputOptions io;
  io.prefetch_depth = 3;
  auto dist = strategy.distribute_dataset(ds, io);
  auto it = dist.make_iterator();
  (void)it.next();
  // While the "training step" runs, the input thread fills its queue: 3
  // more steps of 2 elements beyond the one consumed, and then stops.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pulled->load() < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(pulled->load(), 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(pulled->load(), 10) << "the queue is bounded by prefetch_depth";
}

TEST(DistributedDataTest, IteratorEndsCleanly) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  auto dist = strategy.distribute_dataset(Dataset::from_tensor_slices(std::move(e)).batch(2));
  auto it = dist.make_iterator();
  auto a = it.next();
  EXPECT_EQ(a.local_batch_sizes(), (std::vector<std::int64_t>{1, 1}));
  auto b = it.get_next_as_optional();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->local_batch_sizes(), (std::vector<std::int64_t>{1, 0}));
  EXPECT_EQ((*b)["x"][1].shape(), (std::vector<std::int64_t>{0}));
  EXPECT_FALSE(it.get_next_as_optional().has_value());
  EXPECT_THROW(it.next(), OutOfRangeError);
  // A new iterator is a new epoch; an abandoned one stops its thread.
  auto again = dist.make_iterator();
  EXPECT_EQ(again.next().local_batch_sizes(), (std::vector<std::int64_t>{1, 1}));
  const auto t0 = std::chrono::steady_clock::now();
  { DistributedIterator moved = std::move(again); }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(DistributedDataTest, ErrorsInTheInputReachTheStep) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  auto ds = Dataset::from_generator([](const InputContext&) {
              auto i = std::make_shared<int>(0);
              return [i]() -> std::optional<Element> {
                if (++*i == 5) throw InvalidArgumentError("bad example 5");
                Element e;
                e.add("x", Tensor::scalar<float>(1.0f));
                return e;
              };
            }).batch(2);
  auto dist = strategy.distribute_dataset(ds);
  auto it = dist.make_iterator();
  (void)it.next();
  (void)it.next();
  try {
    (void)it.next();
    FAIL() << "expected the generator's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad example 5"), std::string::npos) << e.what();
  }
}

// A callback that blocks is a DeadlineExceededError at the step, not a
// hang, and dropping the iterator does not wait for the callback.
TEST(DistributedDataTest, BlockedInputCallbackIsADeadlineNotAHang) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  auto gate = std::make_shared<Gate>();
  auto ds = Dataset::from_generator([gate](const InputContext&) {
              auto i = std::make_shared<int>(0);
              return [gate, i]() -> std::optional<Element> {
                if (++*i == 3) {  // the second batch never comes until the gate opens
                  std::unique_lock<std::mutex> l(gate->mu);
                  gate->cv.wait(l, [&] { return gate->open; });
                }
                Element e;
                e.add("x", Tensor::scalar<float>(1.0f));
                return e;
              };
            }).batch(2);
  InputOptions io;
  io.timeout_s = 0.5;
  auto dist = strategy.distribute_dataset(ds, io);
  std::chrono::steady_clock::time_point dropped;
  {
    auto it = dist.make_iterator();
    (void)it.next();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)it.next();
      FAIL() << "expected a deadline";
    } catch (const DeadlineExceededError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("step 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("InputOptions::timeout_s"), std::string::npos) << msg;
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(waited, std::chrono::milliseconds(450));
    EXPECT_LT(waited, std::chrono::seconds(5));
    EXPECT_FALSE(it.get_next_as_optional().has_value()) << "an iterator that timed out has ended";
    dropped = std::chrono::steady_clock::now();  // the iterator goes while the callback still blocks
  }
  EXPECT_LT(std::chrono::steady_clock::now() - dropped, std::chrono::seconds(5));
  {
    std::lock_guard<std::mutex> l(gate->mu);
    gate->open = true;
  }
  gate->cv.notify_all();
  // The left-alone input thread finishes once the callback returns; a fresh
  // iterator works.
  io.timeout_s = 30;
  auto dist2 = strategy.distribute_dataset(ds, io);
  std::int64_t rows = 0;
  int steps = 0;
  auto it2 = dist2.make_iterator();
  while (auto b = it2.get_next_as_optional()) {
    for (auto n : b->local_batch_sizes()) rows += n;
    if (++steps == 3) break;
  }
  EXPECT_EQ(rows, 6);
}

TEST(DistributedDataTest, InputOptionsAreChecked) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0"]})");
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  auto ds = Dataset::from_tensor_slices(std::move(e)).batch(2);
  InputOptions io;
  io.timeout_s = 0;
  EXPECT_THROW(strategy.distribute_dataset(ds, io), InvalidArgumentError);
  io.timeout_s = 1;
  io.prefetch_depth = 0;
  EXPECT_THROW(strategy.distribute_dataset(ds, io), InvalidArgumentError);
}

// ------------------------------------------------------------- bad use ---

TEST(DistributedDataTest, PerReplicaBatchSizeMustDivide) {
  InputContext ctx{2, 0, 3};
  EXPECT_EQ(ctx.get_per_replica_batch_size(9), 3);
  try {
    (void)ctx.get_per_replica_batch_size(8);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
  // Through distribute_datasets_from_function the error reaches the caller.
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1","cpu:2"]})");
  EXPECT_THROW(strategy.distribute_datasets_from_function([](const InputContext& c) {
    Element e;
    e.add("x", Tensor::from_vector<float>({1, 2}, {2}));
    return Dataset::from_tensor_slices(std::move(e)).batch(c.get_per_replica_batch_size(8));
  }),
               InvalidArgumentError);
}

TEST(DistributedDataTest, NoElementsIsAnError) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  auto empty = Dataset::from_tensor_slices(std::move(e)).take(0).batch(2);
  auto dist = strategy.distribute_dataset(empty);
  auto it = dist.make_iterator();
  try {
    (void)it.get_next_as_optional();
    FAIL() << "an empty dataset must be an error, not zero steps";
  } catch (const InvalidArgumentError& err) {
    EXPECT_NE(std::string(err.what()).find("no elements"), std::string::npos) << err.what();
  }
  // drop_remainder with a batch larger than the data is the same mistake.
  Element f;
  f.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  auto dropped = strategy.distribute_dataset(Dataset::from_tensor_slices(std::move(f)).batch(4, true));
  auto it2 = dropped.make_iterator();
  EXPECT_THROW(it2.next(), InvalidArgumentError);
}

TEST(DistributedDataTest, UnbatchedDatasetIsRefused) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  try {
    (void)strategy.distribute_dataset(Dataset::from_tensor_slices(std::move(e)));
    FAIL();
  } catch (const InvalidArgumentError& err) {
    EXPECT_NE(std::string(err.what()).find(".batch(global_batch_size)"), std::string::npos) << err.what();
  }
}

TEST(DistributedDataTest, FilePolicyNeedsAFileBasedSource) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0"]})");
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  DatasetOptions o;
  o.auto_shard_policy = AutoShardPolicy::FILE;
  try {
    (void)strategy.distribute_dataset(Dataset::from_tensor_slices(std::move(e)).batch(2).with_options(o));
    FAIL();
  } catch (const NotFoundError& err) {  // tf: auto_shard.cc reports a missing reader as NotFound
    EXPECT_NE(std::string(err.what()).find("file-based"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("from_tensor_slices (input pipeline 'memory') does not read files"),
              std::string::npos)
        << err.what();
  }
}

TEST(DistributedDataTest, ShardHintNeedsHintPolicy) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0"]})");
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}, {3}));
  auto ds = Dataset::from_tensor_slices(std::move(e)).shard(SHARD_HINT, SHARD_HINT).batch(2);
  EXPECT_THROW((void)strategy.distribute_dataset(ds), InvalidArgumentError);
  DatasetOptions o;
  o.auto_shard_policy = AutoShardPolicy::HINT;
  auto dist = strategy.distribute_dataset(ds.with_options(o));
  EXPECT_EQ(dist.applied_policy(), "HINT");
  std::int64_t n = 0;
  for (DistributedElement& b : dist) n += b.local_batch_sizes()[0];
  EXPECT_EQ(n, 3);
}

// Under FILE a pipeline needs a reader, found as tf's auto_shard.cc finds
// one (FILE with a missing reader is NotFound there; kernel test
// auto_shard_dataset_test.py testUnsupportedOpInFunction / testNoReaderPipelines):
// list_files read by interleave/flat_map is one; list_files alone, an
// in-memory branch, interleave over non-file elements and unique() are not.
TEST(DistributedDataTest, FilePolicyLooksThroughCompositeDatasets) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0"]})");
  DatasetOptions o;
  o.auto_shard_policy = AutoShardPolicy::FILE;
  TempDir dir;
  const auto files = write_files(dir, {2, 3});
  RecordOptions ro;
  ro.features = {{"id", DType::kInt64, {}}};
  auto read = [ro](Element e) { return Dataset::from_records({Dataset::file_name(e)}, ro); };
  const Dataset listed = Dataset::list_files({dir.str() + "/part-*.rec"}, false);
  auto dist = strategy.distribute_dataset(listed.interleave(read, 2).batch(2).with_options(o));
  EXPECT_EQ(dist.applied_policy(), "FILE");
  std::int64_t n = 0;
  for (DistributedElement& b : dist) n += b.local_batch_sizes()[0];
  EXPECT_EQ(n, 5);
  Element e;
  e.add("id", Tensor::from_vector<std::int64_t>({7, 8}));
  const Dataset memory = Dataset::from_tensor_slices(std::move(e));
  auto expect_not_found = [&](const Dataset& ds, const std::string& why) {
    try {
      (void)strategy.distribute_dataset(ds.batch(2).with_options(o));
      ADD_FAILURE() << "no error; expected one saying: " << why;
    } catch (const NotFoundError& err) {
      EXPECT_NE(std::string(err.what()).find(why), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("AutoShardPolicy::DATA"), std::string::npos) << err.what();
    }
  };
  expect_not_found(listed, "list_files() yields file names, not records");
  expect_not_found(listed.flat_map(read).unique(), "does not look through unique()");
  expect_not_found(memory.interleave([](Element x) { return Dataset::from_tensor_slices(std::move(x)); }, 1),
                   "not over list_files() file names");
  expect_not_found(Dataset::zip({listed.flat_map(read), memory.map([](Element x) {
                                   Element r;
                                   r.add("m", std::move(x.tensors[0]));
                                   return r;
                                 })}),
                   "from_tensor_slices (input pipeline 'memory') does not read files");
  expect_not_found(Dataset::from_records(files, ro).concatenate(memory), "does not read files");
}

// shard(SHARD_HINT, SHARD_HINT) inside a branch of zip()/concatenate() is a
// placeholder too (tf's HINT rewrite replaces every one in the graph).
TEST(DistributedDataTest, ShardHintInsideCompositesNeedsHintPolicy) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0"]})");
  Element a, b;
  a.add("x", Tensor::from_vector<float>({1, 2, 3}));
  b.add("x", Tensor::from_vector<float>({4, 5}));
  const Dataset da = Dataset::from_tensor_slices(std::move(a)), db = Dataset::from_tensor_slices(std::move(b));
  const Dataset ds = da.concatenate(db.shard(SHARD_HINT, SHARD_HINT)).batch(2);
  EXPECT_THROW((void)strategy.distribute_dataset(ds), InvalidArgumentError);
  DatasetOptions o;
  o.auto_shard_policy = AutoShardPolicy::HINT;
  auto dist = strategy.distribute_dataset(ds.with_options(o));
  EXPECT_EQ(dist.applied_policy(), "HINT");
  std::int64_t n = 0;
  for (DistributedElement& e : dist) n += e.local_batch_sizes()[0];
  EXPECT_EQ(n, 5);
  const Dataset zipped = Dataset::zip({da.map([](Element e) {
                                         Element r;
                                         r.add("y", std::move(e.tensors[0]));
                                         return r;
                                       }),
                                       db.shard(SHARD_HINT, SHARD_HINT)})
                             .batch(2);
  EXPECT_THROW((void)strategy.distribute_dataset(zipped), InvalidArgumentError);
}

// -------------------------------------------------------- multi-worker ---

#ifdef STRATA_RUN_BIN
// Run `c` as c.workers processes under strata-run; returns their records
// (or, when `expect_error` is set, checks that the run fails with it).
std::vector<json> run_cluster(const Case& c, const std::string& expect_error = "") {
  TempDir dir;
  std::vector<std::string> argv = {STRATA_RUN_BIN, "-n", std::to_string(c.workers), "--timeout", "120", "--",
                                   DIST_DATA_WORKER_BIN};
  const Args a = args_of(c);
  for (const std::string& s :
       std::vector<std::string>{"--strategy", a.strategy, "--devices", a.devices, "--source", a.source, "--length",
                                std::to_string(a.length), "--batch", std::to_string(a.batch), "--policy", a.policy,
                                "--epochs", std::to_string(a.epochs), "--mode", a.mode, "--out",
                                dir.str() + "/out-{rank}.json"})
    argv.push_back(s);
  if (c.drop) argv.push_back("--drop");
  if (c.variant_rank >= 0) {
    argv.push_back("--variant-rank");
    argv.push_back(std::to_string(c.variant_rank));
  }
  if (!c.file_sizes.empty()) {
    argv.push_back("--files");
    const auto files = write_files(dir, c.file_sizes);
    if (c.glob)
      argv.push_back(dir.str() + "/part-*.rec");
    else
      for (const auto& f : files) argv.push_back(f);
  }
  if (!c.composite.empty())
    for (const std::string& s : std::vector<std::string>{"--composite", c.composite, "--cycle", std::to_string(c.cycle),
                                                         "--block", std::to_string(c.block), "--split",
                                                         std::to_string(c.split)})
      argv.push_back(s);
  ProcResult r = run_program(argv, {{"STRATA_LOG_LEVEL", std::string("warn")}}, 150);
  EXPECT_FALSE(r.timed_out) << c.label() << " hung\n" << r.err;
  if (!expect_error.empty()) {
    EXPECT_NE(r.exit_code, 0) << c.label();
    EXPECT_NE(r.err.find(expect_error), std::string::npos) << c.label() << "\n" << r.err;
    return {};
  }
  EXPECT_EQ(r.exit_code, 0) << c.label() << "\n" << r.out << r.err;
  std::vector<json> docs;
  for (int w = 0; w < c.workers; ++w) {
    const std::string text = slurp(dir.str() + "/out-" + std::to_string(w) + ".json");
    if (text.empty()) {
      ADD_FAILURE() << c.label() << ": worker " << w << " wrote no record\n" << r.err;
      return {};
    }
    docs.push_back(json::parse(text));
  }
  return docs;
}

void check_cluster(const Case& c, const std::string& expect_policy) {
  auto docs = run_cluster(c);
  if (!docs.empty()) check_records(c, docs, expect_policy);
}

TEST(DistributedDataMultiWorkerTest, AutoShardsByFileWhenThereAreEnoughFiles) {
  Case c;
  c.workers = 2;
  c.local = 2;
  c.source = "records";
  c.file_sizes = {9, 2, 5, 7};  // uneven: worker 0 reads 14, worker 1 reads 9
  c.length = 23;
  c.batch = 4;
  check_cluster(c, "FILE");
  c.drop = true;
  check_cluster(c, "FILE");
}

TEST(DistributedDataMultiWorkerTest, AutoFallsBackToDataWithTooFewFiles) {
  Case c;
  c.workers = 3;
  c.local = 1;
  c.source = "records";
  c.file_sizes = {6, 5};
  c.length = 11;
  c.batch = 5;
  check_cluster(c, "DATA");
}

TEST(DistributedDataMultiWorkerTest, AutoUsesDataForInMemorySources) {
  for (int local : {1, 2})
    for (std::int64_t batch : {2, 3, 8})
      for (bool drop : {false, true}) {
        Case c;
        c.workers = 2;
        c.local = local;
        c.length = 13;
        c.batch = batch;
        c.drop = drop;
        check_cluster(c, "DATA");
      }
}

TEST(DistributedDataMultiWorkerTest, ExplicitPolicies) {
  Case c;
  c.workers = 2;
  c.local = 2;
  c.source = "records";
  c.file_sizes = {3, 8, 1};
  c.length = 12;
  c.batch = 6;
  for (const std::string policy : {"FILE", "DATA", "OFF"}) {
    c.policy = policy;
    check_cluster(c, policy);
  }
  c.policy = "HINT";
  c.source = "generator";
  c.file_sizes.clear();
  check_cluster(c, "HINT");
}

TEST(DistributedDataMultiWorkerTest, UnevenWorkersStepInLockStepUntilAllAreDone) {
  Case c;
  c.workers = 3;
  c.local = 2;
  c.source = "records";
  c.file_sizes = {1, 20, 4};  // worker 1 has far more data than the others
  c.length = 25;
  c.batch = 6;
  check_cluster(c, "FILE");
}

// A worker whose shard yields no batch at all still steps in lock-step; its
// replicas get empty batches with the layout the other workers agree on.
TEST(DistributedDataMultiWorkerTest, WorkersWithNoBatchGetEmptyBatchesOfTheRightLayout) {
  Case c;
  c.workers = 2;
  c.local = 2;
  c.source = "records";
  c.file_sizes = {1, 6};  // worker 0: one record, less than its share of 2, dropped
  c.length = 7;
  c.batch = 4;
  c.drop = true;
  check_cluster(c, "FILE");
  c.workers = 3;
  c.local = 1;
  c.file_sizes = {1, 1, 9};  // workers 0 and 1 have no batch, worker 2 has four
  c.length = 11;
  c.batch = 6;
  check_cluster(c, "FILE");
}

TEST(DistributedDataMultiWorkerTest, WorkersWithDifferentLayoutsFail) {
  Case c;
  c.workers = 3;
  c.source = "records";
  c.file_sizes = {1, 6, 6};
  c.length = 13;
  c.batch = 6;
  c.drop = true;
  c.policy = "FILE";
  c.variant_rank = 2;  // worker 2 adds a component; worker 0 has no batch and asks for the layout
  run_cluster(c, "the workers' inputs have different element layouts");
}

TEST(DistributedDataMultiWorkerTest, DatasetsFromFunction) {
  for (const std::string mode : {"per_worker", "per_replica"}) {
    Case c;
    c.workers = 2;
    c.local = 2;
    c.length = 15;
    c.batch = 4;
    c.mode = mode;
    check_cluster(c, "FUNCTION");
  }
}

TEST(DistributedDataMultiWorkerTest, FileShardingWithTooFewFilesFails) {
  Case c;
  c.workers = 3;
  c.source = "records";
  c.file_sizes = {4, 4};
  c.length = 8;
  c.policy = "FILE";
  run_cluster(c, "needs at least 3 files");
}

// A global batch smaller than the number of workers is not an error: each
// step two of the three workers get one row and the empty turn rotates
// (batch_sizes_for_worker(2, 3, 1, w) = [1,1,0], [1,0,1], [0,1,1]).
TEST(DistributedDataMultiWorkerTest, GlobalBatchSmallerThanWorkersRotatesTheEmptyTurn) {
  Case c;
  c.workers = 3;
  c.source = "records";
  c.file_sizes = {4, 4, 4};
  c.length = 12;
  c.batch = 2;
  c.policy = "FILE";
  c.epochs = 1;
  auto docs = run_cluster(c);
  ASSERT_EQ(docs.size(), 3u);
  check_records(c, docs, "FILE");
  EXPECT_EQ(docs[2]["epochs"][0][0].dump(), "[[]]") << "worker 2's first turn is empty";
  EXPECT_EQ(docs[2]["epochs"][0][1].dump(), "[[8]]");
}

// batch_sizes_for_worker's own example: G = 7, 2 workers x 2 replicas, one
// file of 7 per worker: worker 0 [A0,A1],[A2,A3] then [A4,A5],[A6]; worker 1
// [B0,B1],[B2] then [B3,B4],[B5,B6]; every step sums to 7.
TEST(DistributedDataMultiWorkerTest, RemainderRotatesAcrossWorkersAsTfDistributeDocuments) {
  Case c;
  c.workers = 2;
  c.local = 2;
  c.source = "records";
  c.file_sizes = {7, 7};
  c.length = 14;
  c.batch = 7;
  c.policy = "FILE";
  c.epochs = 1;
  auto docs = run_cluster(c);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0]["epochs"][0].dump(), "[[[0,1],[2,3]],[[4,5],[6]]]");
  EXPECT_EQ(docs[1]["epochs"][0].dump(), "[[[7,8],[9]],[[10,11],[12,13]]]");
  // DATA: both read the same batch of 7; minibatches of ceil(7/4) = 2 and
  // worker w's local replica i takes minibatch w + 2i.
  c.policy = "DATA";
  docs = run_cluster(c);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0]["epochs"][0][0].dump(), "[[0,1],[4,5]]");
  EXPECT_EQ(docs[1]["epochs"][0][0].dump(), "[[2,3],[6]]");
}
// --------------------------------------- multi-worker: composite inputs ---
// auto_shard_dataset_test.py builds list_files -> interleave/flat_map of
// TFRecordDataset pipelines and checks that FILE sharding gives worker w
// files w, w + W, ... (testFlatMapReaderPipeline, testInterleaveReaderPipeline
// with cycle and block lengths, testConcatenateReaderPipeline,
// testZipReaderPipeline); each case here checks every worker's exact steps.

TEST(DistributedDataMultiWorkerTest, AutoShardsListFilesReadByInterleaveOrFlatMap) {
  Case c;
  c.workers = 2;
  c.source = "records";
  c.composite = "interleave";
  c.cycle = 2;
  c.block = 2;
  c.glob = true;  // list_files gets "<dir>/part-*.rec"
  c.file_sizes = {3, 5, 2, 4, 1};
  c.length = 15;
  c.batch = 4;
  check_cluster(c, "FILE");
  c.composite = "flat_map";
  c.workers = 3;
  c.local = 2;
  c.batch = 6;
  check_cluster(c, "FILE");
}

TEST(DistributedDataMultiWorkerTest, ZipAndConcatenateShardEveryBranchByFile) {
  Case c;
  c.workers = 2;
  c.source = "records";
  c.composite = "concatenate";  // from_records(2 files) then list_files(2 files) read by flat_map
  c.split = 2;
  c.file_sizes = {3, 4, 2, 5};
  c.length = 14;
  c.batch = 4;
  check_cluster(c, "FILE");
  c.composite = "zip";  // worker 0 zips ids 0-2 with 7-10, worker 1 ids 3-6 with 11-12
  c.file_sizes = {3, 4, 4, 2};
  c.length = 13;
  c.batch = 2;
  check_cluster(c, "FILE");
  c.policy = "DATA";  // everyone reads everything: the zip of all of A with all of B
  check_cluster(c, "DATA");
}

// auto_shard.cc: under AUTO a pipeline without a reader (NotFound) is
// sharded by DATA instead; under FILE it is an error.
TEST(DistributedDataMultiWorkerTest, PipelinesWithoutAReaderFallBackToDataUnderAuto) {
  Case c;
  c.workers = 2;
  c.source = "records";
  c.composite = "unique";
  c.file_sizes = {3, 4, 2};
  c.length = 9;
  c.batch = 4;
  check_cluster(c, "DATA");
  c.composite = "mixed";  // from_records(files) then two in-memory ids
  c.split = 3;
  check_cluster(c, "DATA");
  c.policy = "FILE";
  run_cluster(c, "does not read files, so it cannot be sharded by file; use AutoShardPolicy::DATA (or AUTO)");
  c.composite = "unique";
  run_cluster(c, "does not look through unique()");
}

// shard_dataset_op.cc (require_non_empty, set by the FILE rewrite): a
// reader with fewer files than workers is InvalidArgument; Strata says so
// when the dataset is distributed, on every worker, and for zip/concatenate
// the branch with the fewest files counts.
TEST(DistributedDataMultiWorkerTest, FileShardingListFilesWithTooFewFilesFails) {
  Case c;
  c.workers = 3;
  c.source = "records";
  c.composite = "interleave";
  c.file_sizes = {4, 4};
  c.length = 8;
  c.policy = "FILE";
  run_cluster(c, "needs at least 3 files (one per worker) but the dataset has 2");
  c.workers = 2;
  c.composite = "zip";
  c.split = 2;
  c.file_sizes = {2, 2, 5};  // the second branch has one file
  c.length = 9;
  run_cluster(c, "needs at least 2 files (one per worker) but the dataset has 1");
  c.policy = "AUTO";  // Strata's AUTO falls back to DATA here (see README)
  check_cluster(c, "DATA");
}

// The FILE rewrite removes assert_cardinality (auto_shard.cc warns that it
// is not handled): each worker sees only its files. DATA keeps it: every
// worker reads all elements, so the count holds.
TEST(DistributedDataMultiWorkerTest, AssertCardinalityIsDroppedWhenShardingByFile) {
  Case c;
  c.workers = 2;
  c.source = "records";
  c.composite = "assert";
  c.file_sizes = {3, 4, 5};
  c.length = 12;
  c.batch = 4;
  check_cluster(c, "FILE");
  c.policy = "DATA";
  check_cluster(c, "DATA");
}

// Empty files and more workers than elements: workers whose files hold no
// record step with empty batches; no record anywhere is an error.
TEST(DistributedDataMultiWorkerTest, EmptyFilesAndMoreWorkersThanElements) {
  Case c;
  c.workers = 3;
  c.source = "records";
  c.composite = "interleave";
  c.file_sizes = {0, 2, 0, 0, 1, 0};  // worker 1 has all 3 records
  c.length = 3;
  c.batch = 2;
  c.epochs = 1;
  check_cluster(c, "FILE");
  c.composite = "unique";  // no reader: DATA, 2 elements over 3 workers
  c.file_sizes = {1, 1, 0};
  c.length = 2;
  check_cluster(c, "DATA");
  c.composite = "flat_map";
  c.file_sizes = {0, 0, 0};
  c.length = 0;
  run_cluster(c, "no elements");
}

// HINT over a composite: run_distributed appends shard(SHARD_HINT,
// SHARD_HINT), which becomes shard(W, w) (auto_shard_dataset_test.py
// testShardHint forms).
TEST(DistributedDataMultiWorkerTest, ShardHintOverCompositeDatasets) {
  Case c;
  c.workers = 2;
  c.source = "records";
  c.composite = "concatenate";
  c.split = 1;
  c.file_sizes = {3, 4};
  c.length = 7;
  c.batch = 2;
  c.policy = "HINT";
  check_cluster(c, "HINT");
}
#endif

}  // namespace
}  // namespace strata::test
