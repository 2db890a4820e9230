// SPDX-License-Identifier: Apache-2.0
// DistributedIterator::save_state / restore_state: a run saved after k
// steps and restored into a newly built distributed dataset gives, on every
// worker, exactly the steps the uninterrupted run gave from step k on, and
// the next epoch is the uninterrupted run's next epoch (reshuffled the
// same). One worker of two replicas runs in this process; two workers run
// as real processes under strata-run (multi_worker_mirrored over TCP).
// DATA states continue on another worker count with the same global
// batches; FILE states on another count are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../run/subprocess.h"
#include "dist_resume_case.h"
#include "strata/records.hpp"

namespace strata::test {
namespace {

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

struct Resume {
  int workers = 1;
  int local = 2;
  std::string source = "memory";
  std::vector<std::int64_t> file_sizes = {11, 9, 13, 7};
  std::int64_t length = 40;
  std::int64_t batch = 6;
  std::string policy = "AUTO";
  std::int64_t shuffle = 8;
  int epochs_before = 1;
  int save_after = 3;
  std::string composite;  // see composite_source in dist_data_case.h (records only)
  std::string label() const {
    return "W" + std::to_string(workers) + " L" + std::to_string(local) + " " + source + " " + policy + " k" +
           std::to_string(save_after);
  }
};

ResumeArgs resume_args(const Resume& s, const std::vector<std::string>& files) {
  ResumeArgs a;
  a.base.strategy = s.workers > 1 ? "multi_worker_mirrored" : "mirrored";
  a.base.devices.clear();
  for (int i = 0; i < s.local; ++i) a.base.devices += (i ? ",cpu:" : "cpu:") + std::to_string(i);
  a.base.source = s.source;
  a.base.files = files;
  a.base.length = s.source == "records" ? 0 : s.length;
  a.base.batch = s.batch;
  a.base.policy = s.policy;
  a.shuffle = s.shuffle;
  a.epochs_before = s.epochs_before;
  a.save_after = s.save_after;
  a.base.composite = s.composite;
  a.base.cycle = 2;
  a.base.block = 2;
  return a;
}

// The run's records, one per worker: in this process for one worker, as
// processes under strata-run otherwise. `save_dir` set: save states there
// as state-<rank>.bin; `restore` set: restore from those files.
std::vector<json> run(const Resume& s, const std::vector<std::string>& files, const std::string& save_dir,
                      const std::vector<std::string>& restore, const std::string& expect_error = "") {
  ResumeArgs a = resume_args(s, files);
  a.restore_from = restore;
  if (s.workers == 1) {
    if (!save_dir.empty()) a.save_to = save_dir + "/state-0.bin";
    return {run_resume(a)};
  }
#ifdef STRATA_RUN_BIN
  TempDir out;
  std::vector<std::string> argv = {STRATA_RUN_BIN, "-n", std::to_string(s.workers), "--timeout", "120", "--",
                                   DIST_RESUME_WORKER_BIN};
  for (const std::string& x :
       std::vector<std::string>{"--strategy", a.base.strategy, "--devices", a.base.devices, "--source", a.base.source,
                                "--length", std::to_string(a.base.length), "--batch", std::to_string(a.base.batch),
                                "--policy", a.base.policy, "--shuffle", std::to_string(a.shuffle), "--epochs-before",
                                std::to_string(a.epochs_before), "--save-after", std::to_string(a.save_after),
                                "--out", out.str() + "/out-{rank}.json"})
    argv.push_back(x);
  if (!s.composite.empty())
    for (const std::string& x : std::vector<std::string>{"--composite", s.composite, "--cycle", "2", "--block", "2"})
      argv.push_back(x);
  if (!files.empty()) {
    argv.push_back("--files");
    for (const auto& f : files) argv.push_back(f);
  }
  if (!save_dir.empty()) {
    argv.push_back("--save-to");
    argv.push_back(save_dir + "/state-{rank}.bin");
  }
  if (!restore.empty()) {
    argv.push_back("--restore-from");
    for (const auto& f : restore) argv.push_back(f);
  }
  ProcResult r = run_program(argv, {{"STRATA_LOG_LEVEL", std::string("warn")}}, 150);
  EXPECT_FALSE(r.timed_out) << s.label() << " hung\n" << r.err;
  if (!expect_error.empty()) {
    EXPECT_NE(r.exit_code, 0) << s.label();
    EXPECT_NE(r.err.find(expect_error), std::string::npos) << s.label() << "\n" << r.err;
    return {};
  }
  EXPECT_EQ(r.exit_code, 0) << s.label() << "\n" << r.out << r.err;
  std::vector<json> docs;
  for (int w = 0; w < s.workers; ++w) {
    const std::string text = slurp(out.str() + "/out-" + std::to_string(w) + ".json");
    if (text.empty()) {
      ADD_FAILURE() << s.label() << ": worker " << w << " wrote no record\n" << r.err;
      return {};
    }
    docs.push_back(json::parse(text));
  }
  return docs;
#else
  ADD_FAILURE() << "strata-run was not built";
  return {};
#endif
}

std::vector<std::string> state_files(const TempDir& dir, int workers) {
  std::vector<std::string> out;
  for (int w = 0; w < workers; ++w) out.push_back(dir.str() + "/state-" + std::to_string(w) + ".bin");
  return out;
}

// Per worker, the uninterrupted run's steps from the save point on equal
// the restored run's, and so does the next epoch.
void check_same_workers(const Resume& s) {
  SCOPED_TRACE(s.label());
  TempDir dir;
  const auto files = s.source == "records" ? write_files(dir, s.file_sizes) : std::vector<std::string>{};
  const auto full = run(s, files, dir.str(), {});
  ASSERT_EQ(static_cast<int>(full.size()), s.workers);
  const auto restored = run(s, files, "", state_files(dir, s.workers));
  ASSERT_EQ(static_cast<int>(restored.size()), s.workers);
  for (int w = 0; w < s.workers; ++w) {
    ASSERT_EQ(full[w]["worker"].get<int>(), w);
    ASSERT_EQ(restored[w]["worker"].get<int>(), w);
    EXPECT_EQ(full[w]["before"].size() + full[w]["after"].size(), full[w]["next_epoch"].size()) << "worker " << w;
    EXPECT_EQ(restored[w]["after"].dump(), full[w]["after"].dump()) << "worker " << w << ", policy "
                                                                   << full[w]["policy"];
    EXPECT_EQ(restored[w]["next_epoch"].dump(), full[w]["next_epoch"].dump()) << "worker " << w;
    EXPECT_GT(full[w]["next_epoch"].size(), 0u);
  }
}

// The global batches of a run's steps: under DATA across W workers of L
// replicas, minibatch k of each global batch is on worker k % W, local
// replica k / W; otherwise (one worker) the local sub-batches in order.
std::vector<std::vector<std::int64_t>> global_batches(const std::vector<json>& docs, const char* key) {
  const int W = static_cast<int>(docs.size());
  const int L = docs[0]["local"].get<int>();
  const bool data = W > 1;
  std::vector<std::vector<std::int64_t>> out;
  const std::size_t steps = docs[0][key].size();
  for (std::size_t t = 0; t < steps; ++t) {
    std::vector<std::int64_t> g;
    for (int k = 0; k < W * L; ++k) {
      const json& d = data ? docs[static_cast<std::size_t>(k % W)] : docs[0];
      const int i = data ? k / W : k;
      for (auto id : d[key][t][i].get<std::vector<std::int64_t>>()) g.push_back(id);
    }
    if (!g.empty()) out.push_back(g);
  }
  return out;
}

// ------------------------------------------------------ single process ---

TEST(DistributedResumeTest, OneWorkerTwoReplicasMemoryAndRecords) {
  for (const std::string source : {"memory", "records"})
    for (const std::string policy : {"AUTO", "DATA", "FILE"})
      for (int k : {0, 1, 3, 6, 100}) {
        if (policy == "FILE" && source == "memory") continue;
        Resume s;
        s.source = source;
        s.policy = policy;
        s.save_after = k;
        check_same_workers(s);
      }
}

TEST(DistributedResumeTest, UnevenSplitKeepsItsCycleAndLeftoverRows) {
  // G = 7 on 3 replicas: sizes 3+2+2, and a short last batch.
  Resume s;
  s.local = 3;
  s.batch = 7;
  s.length = 31;
  for (int k : {1, 2, 4}) {
    s.save_after = k;
    check_same_workers(s);
  }
}

TEST(DistributedResumeTest, BadStatesAreRefused) {
  auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
  Element e;
  e.add("id", Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  auto dist = strategy.distribute_dataset(Dataset::from_tensor_slices(e.clone()).shuffle(4, 1).batch(4));
  auto it = dist.make_iterator();
  (void)it.next();
  const std::string state = it.save_state();
  // Used iterator.
  EXPECT_THROW(it.restore_state({state}), FailedPreconditionError);
  // Garbled and truncated.
  std::string bad = state;
  bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 1);
  auto fresh = dist.make_iterator();
  EXPECT_THROW(fresh.restore_state({bad}), DataLossError);
  EXPECT_THROW(fresh.restore_state({state.substr(0, state.size() - 3)}), DataLossError);
  EXPECT_THROW(fresh.restore_state({}), InvalidArgumentError);
  // Another recipe.
  auto other = strategy.distribute_dataset(Dataset::from_tensor_slices(e.clone()).shuffle(4, 1).batch(2));
  auto o = other.make_iterator();
  EXPECT_THROW(o.restore_state({state}), InvalidArgumentError);
  // A DatasetIterator's state is not a DistributedIterator's.
  DatasetIterator di = Dataset::from_tensor_slices(e.clone()).make_iterator();
  EXPECT_THROW(fresh.restore_state({di.save_state()}), InvalidArgumentError);
  // The refused iterator is still fresh and restores the good state.
  fresh.restore_state({state});
  EXPECT_TRUE(fresh.get_next_as_optional().has_value());
}

TEST(DistributedResumeTest, DatasetsFromFunctionPerReplica) {
  auto run_once = [](int save_after, const std::string& state) {
    auto strategy = Strategy::create("mirrored", R"({"devices":["cpu:0","cpu:1"]})");
    InputOptions io;
    io.experimental_replication_mode = InputReplicationMode::PER_REPLICA;
    auto dist = strategy.distribute_datasets_from_function(
        [](const InputContext& ctx) {
          std::vector<std::int64_t> ids(23);
          for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i);
          Element e;
          e.add("id", Tensor::from_vector(ids));
          return Dataset::from_tensor_slices(std::move(e))
              .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
              .shuffle(5, 3)
              .batch(2);
        },
        io);
    auto it = dist.make_iterator();
    json out = {{"after", json::array()}};
    if (!state.empty()) {
      it.restore_state({state});
    } else {
      for (int s = 0; s < save_after; ++s) (void)it.next();
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      out["state"] = it.save_state();
    }
    out["after"] = drain_steps(it);
    auto next = dist.make_iterator();
    out["next_epoch"] = drain_steps(next);
    return out;
  };
  for (int k : {0, 1, 3, 6}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    const json full = run_once(k, "");
    const json restored = run_once(0, full["state"].get<std::string>());
    EXPECT_EQ(restored["after"].dump(), full["after"].dump());
    EXPECT_EQ(restored["next_epoch"].dump(), full["next_epoch"].dump());
  }
}

// -------------------------------------------------------- multi-worker ---

#ifdef STRATA_RUN_BIN

TEST(DistributedResumeMultiWorkerTest, TwoWorkersDataAndFile) {
  Resume s;
  s.workers = 2;
  s.local = 1;
  s.source = "memory";
  s.policy = "DATA";
  check_same_workers(s);
  s.source = "records";
  s.policy = "FILE";
  s.save_after = 2;
  check_same_workers(s);
  s.policy = "DATA";
  s.save_after = 4;
  check_same_workers(s);
  s.source = "memory";
  s.policy = "HINT";
  s.save_after = 2;
  check_same_workers(s);
}

TEST(DistributedResumeMultiWorkerTest, InterleaveOverListFilesShardedByFile) {
  // list_files -> interleave(from_records, cycle 2, block 2) -> shuffle ->
  // batch, FILE-sharded: the open children (file and byte offset) are in
  // the state.
  Resume s;
  s.workers = 2;
  s.local = 1;
  s.source = "records";
  s.policy = "FILE";
  s.composite = "interleave";
  s.file_sizes = {11, 9, 13, 7, 5, 8};
  for (int k : {1, 4}) {
    s.save_after = k;
    check_same_workers(s);
  }
  s.workers = 1;
  s.local = 2;
  s.policy = "AUTO";
  s.save_after = 3;
  check_same_workers(s);
}

// Every ids of `key`'s steps on worker `w`, flattened in order.
std::vector<std::int64_t> flat_ids(const json& doc, const char* key) {
  std::vector<std::int64_t> out;
  for (const json& step : doc[key])
    for (const json& replica : step)
      for (auto id : replica.get<std::vector<std::int64_t>>()) out.push_back(id);
  return out;
}

TEST(DistributedResumeMultiWorkerTest, OffStateContinuesTheRowStreamOnAnotherWorkerCount) {
  // OFF: every worker reads the whole stream; a one-worker state continues
  // on two workers, each from the saved position, split the new way.
  TempDir dir;
  Resume one;
  one.workers = 1;
  one.local = 2;
  one.policy = "OFF";
  one.batch = 5;  // 3+2 on one worker; 3 and 2 rows a step on two, so steps cut across batches
  Resume two = one;
  two.workers = 2;
  two.local = 1;
  const auto full = run(one, {}, dir.str(), {});
  const auto restored = run(two, {}, "", state_files(dir, 1));
  ASSERT_EQ(restored.size(), 2u);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(restored[w]["policy"].get<std::string>(), "OFF");
    EXPECT_EQ(flat_ids(restored[w], "after"), flat_ids(full[0], "after")) << "worker " << w;
    EXPECT_EQ(flat_ids(restored[w], "next_epoch"), flat_ids(full[0], "next_epoch")) << "worker " << w;
  }
}

TEST(DistributedResumeMultiWorkerTest, DataStateContinuesOnAnotherWorkerCount) {
  TempDir dir;
  // Two workers (DATA) saved after 3 steps -> one worker of two replicas.
  Resume two;
  two.workers = 2;
  two.local = 1;
  two.policy = "DATA";
  Resume one = two;
  one.workers = 1;
  one.local = 2;
  const auto full = run(two, {}, dir.str(), {});
  ASSERT_EQ(full.size(), 2u);
  const auto restored = run(one, {}, "", state_files(dir, 2));
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0]["policy"].get<std::string>(), "DATA");
  EXPECT_EQ(global_batches(restored, "after"), global_batches(full, "after"));
  EXPECT_EQ(global_batches(restored, "next_epoch"), global_batches(full, "next_epoch"));
  // One worker of two replicas saved after 3 steps -> two workers (DATA).
  TempDir dir1;
  const auto full1 = run(one, {}, dir1.str(), {});
  const auto restored2 = run(two, {}, "", state_files(dir1, 1));
  ASSERT_EQ(restored2.size(), 2u);
  EXPECT_EQ(global_batches(restored2, "after"), global_batches(full1, "after"));
  EXPECT_EQ(global_batches(restored2, "next_epoch"), global_batches(full1, "next_epoch"));
}

TEST(DistributedResumeMultiWorkerTest, FileStateOnAnotherWorkerCountIsRefused) {
  TempDir dir;
  Resume two;
  two.workers = 2;
  two.local = 1;
  two.source = "records";
  two.policy = "FILE";
  const auto files = write_files(dir, two.file_sizes);
  const auto full = run(two, files, dir.str(), {});
  ASSERT_EQ(full.size(), 2u);
  Resume one = two;
  one.workers = 1;
  one.local = 2;
  try {
    (void)run(one, files, "", state_files(dir, 2));
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("saved by 2 worker(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("FILE"), std::string::npos) << m;
    EXPECT_NE(m.find("1 worker(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("same worker count"), std::string::npos) << m;
  }
}

#endif  // STRATA_RUN_BIN

}  // namespace
}  // namespace strata::test
