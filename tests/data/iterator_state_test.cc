// SPDX-License-Identifier: Apache-2.0
// DatasetIterator::save_state / restore_state: for every transformation and
// the usual compositions, a pass interrupted after k elements and restored
// into a fresh iterator of a newly built Dataset (what a restarted program
// does) yields exactly the rest of an uninterrupted pass; and bad states
// are refused with the documented error kinds.
#include "strata/data.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "strata/records.hpp"
#include "test_support.h"

namespace strata {
namespace {

using test::TempDir;

/// x = 0..n-1 (int64), one element per value.
Dataset range(std::int64_t n, std::int64_t from = 0) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  Element e;
  e.add("x", Tensor::from_vector(v));
  return Dataset::from_tensor_slices(std::move(e));
}

/// An element as text: every component's name, dtype, shape and bytes.
std::string fingerprint(const Element& e) {
  std::string s;
  for (std::size_t i = 0; i < e.tensors.size(); ++i) {
    const Tensor& t = e.tensors[i];
    s += e.names[i] + ":" + dtype_name(t.dtype()) + "[";
    for (std::int64_t d : t.shape()) s += std::to_string(d) + ",";
    s += "]=";
    const Tensor c = t.clone();
    const auto* p = static_cast<const unsigned char*>(c.raw_data());
    for (std::size_t b = 0; b < c.nbytes(); ++b) s += std::to_string(p[b]) + ".";
    s += ";";
  }
  return s;
}

std::vector<std::string> drain(DatasetIterator& it) {
  std::vector<std::string> out;
  while (std::optional<Element> e = it.next()) out.push_back(fingerprint(*e));
  return out;
}

std::vector<std::string> pass_of(const Dataset& ds) {
  DatasetIterator it = ds.make_iterator();
  return drain(it);
}

std::vector<std::string> tail(const std::vector<std::string>& v, std::size_t k) {
  return std::vector<std::string>(v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
}

/// The check every test runs: for each k, read k elements of pass 0 of a
/// freshly built dataset, save, and (a) the same iterator goes on
/// unchanged, (b) saving again gives the same bytes, (c) a fresh iterator
/// of another freshly built dataset restored from the state yields exactly
/// the rest of the uninterrupted pass, and (d) the restored iterator's own
/// state restores the same way (a restored position saves again).
/// `settle` waits before saving (lets prefetch threads fill their buffers).
void check_resume(const std::function<Dataset()>& build, std::vector<std::size_t> ks, bool settle = false) {
  const std::vector<std::string> full = pass_of(build());
  ASSERT_FALSE(full.empty());
  ks.push_back(0);
  ks.push_back(full.size());
  for (std::size_t k : ks) {
    if (k > full.size()) k = full.size();
    SCOPED_TRACE("k = " + std::to_string(k) + " of " + std::to_string(full.size()));
    Dataset first = build();
    DatasetIterator it = first.make_iterator();
    for (std::size_t i = 0; i < k; ++i) {
      std::optional<Element> e = it.next();
      ASSERT_TRUE(e);
      ASSERT_EQ(fingerprint(*e), full[i]);
    }
    if (settle) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const std::string state = it.save_state();
    EXPECT_EQ(it.save_state(), state) << "saving twice in a row gave different bytes";
    Dataset again = build();
    DatasetIterator restored = again.make_iterator();
    restored.restore_state(state);
    const std::string restored_state = restored.save_state();
    EXPECT_EQ(drain(restored), tail(full, k)) << "restored pass differs";
    EXPECT_EQ(drain(it), tail(full, k)) << "the saved iterator changed by saving";
    Dataset third = build();
    DatasetIterator re = third.make_iterator();
    re.restore_state(restored_state);
    EXPECT_EQ(drain(re), tail(full, k)) << "a restored iterator's own state differs";
  }
}

std::vector<std::string> write_record_files(const TempDir& dir, const std::vector<std::int64_t>& sizes,
                                            std::int64_t first_id = 0) {
  std::vector<std::string> files;
  std::int64_t id = first_id;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    files.push_back(dir.str() + "/part-" + std::to_string(first_id) + "-" + std::to_string(k) + ".rec");
    RecordWriter w(files.back());
    for (std::int64_t i = 0; i < sizes[k]; ++i, ++id) {
      float y = static_cast<float>(id) * 0.5f;
      w.write_features({TensorView(&id, {}, DType::kInt64), TensorView(&y, {}, DType::kFloat32)});
    }
    w.close();
  }
  return files;
}

RecordOptions id_features() {
  RecordOptions o;
  o.features = {{"id", DType::kInt64, {}}, {"y", DType::kFloat32, {}}};
  o.buffer_bytes = 4096;  // several refills per file
  return o;
}

// ------------------------------------------------------- single stages ---

TEST(IteratorStateTest, MemorySource) {
  check_resume([] { return range(10); }, {1, 5, 9});
}

TEST(IteratorStateTest, RecordsSourceAcrossFiles) {
  TempDir dir;
  const auto files = write_record_files(dir, {5, 0, 300, 7});
  check_resume([&] { return Dataset::from_records(files, id_features()); }, {1, 4, 5, 6, 150, 305, 311});
}

TEST(IteratorStateTest, ShuffleMidBuffer) {
  check_resume([] { return range(40).shuffle(8, 3); }, {1, 3, 8, 20, 33, 39});
}

TEST(IteratorStateTest, BatchWithAndWithoutRemainder) {
  check_resume([] { return range(11).batch(3); }, {1, 2, 3});
  check_resume([] { return range(11).batch(3, true); }, {1, 2});
  // The last batch ends exactly at the last row: saved before the source
  // has reported its end.
  check_resume([] { return range(10).batch(5); }, {1});
  check_resume([] { return range(10).shard(2, 1).batch(5); }, {});
}

TEST(IteratorStateTest, RepeatAtAndAroundRoundBoundaries) {
  check_resume([] { return range(5).repeat(3); }, {4, 5, 6, 10, 14});
  check_resume([] { return range(4).shuffle(4, 9).repeat(3); }, {3, 4, 5, 8, 11});
  // repeat() forever, cut by take().
  check_resume([] { return range(3).repeat().take(10); }, {2, 3, 7});
}

TEST(IteratorStateTest, TakeSkipShardMapAssertCardinality) {
  check_resume([] { return range(20).skip(3).take(12); }, {1, 6, 11});
  check_resume([] { return range(20).shard(3, 1); }, {1, 3, 6});
  check_resume(
      [] {
        return range(12).map([](Element e) {
          std::vector<std::int64_t> v = e["x"].to_vector<std::int64_t>();
          Element r;
          r.add("x", Tensor::scalar<std::int64_t>(v[0] * v[0]));
          return r;
        });
      },
      {1, 6});
  check_resume([] { return range(9).assert_cardinality(9); }, {1, 8});
}

TEST(IteratorStateTest, PrefetchKeepsWhatItReadAhead) {
  // The thread fills its buffer before save (settle): the state carries the
  // buffered elements and the input's position after them.
  check_resume([] { return range(30).prefetch(4); }, {1, 2, 10, 27}, /*settle=*/true);
  check_resume([] { return range(30).map([](Element e) { return e; }).prefetch(2).batch(4).prefetch(1); },
               {1, 3, 7}, true);
}

TEST(IteratorStateTest, UniqueRemembersWhatItSaw) {
  check_resume(
      [] {
        Element e;
        e.add("x", Tensor::from_vector<std::int64_t>({3, 1, 3, 2, 1, 5, 2, 7, 3, 5, 8}));
        return Dataset::from_tensor_slices(std::move(e)).unique();
      },
      {1, 2, 3, 4, 5});
}

TEST(IteratorStateTest, RebatchKeepsQueuedRowsAndItsCycle) {
  check_resume([] { return range(23).batch(4).rebatch({3, 2, 0, 5}); }, {1, 2, 3, 4, 5, 7});
  check_resume([] { return range(23).batch(5).rebatch(4, true); }, {1, 2, 4});
}

TEST(IteratorStateTest, ZipAndConcatenate) {
  auto renamed = [](Dataset d, const char* name) {
    return d.map([name](Element e) {
      Element r;
      r.add(name, std::move(e.tensors[0]));
      return r;
    });
  };
  check_resume([&] { return Dataset::zip({range(7), renamed(range(10, 100), "b")}); }, {1, 3, 6});
  check_resume([] { return range(4).concatenate(range(5, 50)); }, {1, 3, 4, 5, 8});
}

TEST(IteratorStateTest, ListFilesShuffledEveryPass) {
  TempDir dir;
  const auto files = write_record_files(dir, {1, 1, 1, 1, 1, 1});
  check_resume([&] { return Dataset::list_files({dir.str() + "/*.rec"}, true, 4); }, {1, 3, 5});
}

TEST(IteratorStateTest, GeneratorIsRestoredByCounting) {
  auto gen = [] {
    return Dataset::from_generator([](const InputContext&) {
      auto i = std::make_shared<std::int64_t>(0);
      return Dataset::Generator([i]() -> std::optional<Element> {
        if (*i >= 17) return std::nullopt;
        Element e;
        e.add("x", Tensor::scalar<std::int64_t>((*i)++));
        return e;
      });
    });
  };
  check_resume([&] { return gen().shuffle(5, 1).batch(2); }, {1, 4, 8});
}

// --------------------------------------------------------- compositions ---

TEST(IteratorStateTest, RecordsShuffleRepeatBatchPrefetch) {
  TempDir dir;
  const auto files = write_record_files(dir, {9, 14, 6});
  // 29 records, 3 rounds = 87 elements, batches of 4 = 22 (last short).
  check_resume(
      [&] { return Dataset::from_records(files, id_features()).shuffle(10, 42).repeat(3).batch(4).prefetch(2); },
      {1, 3, 7, 8, 15, 21}, /*settle=*/true);
}

TEST(IteratorStateTest, MemoryShuffleBatch) {
  check_resume([] { return range(50).shuffle(16, 5).batch(7); }, {1, 2, 4, 6});
}

TEST(IteratorStateTest, InterleaveOverListFilesOfRecordFiles) {
  TempDir dir;
  const auto files = write_record_files(dir, {5, 3, 8, 1, 6});
  const RecordOptions o = id_features();
  auto read = [o](Element e) { return Dataset::from_records({Dataset::file_name(e)}, o); };
  check_resume([&] { return Dataset::list_files({dir.str() + "/*.rec"}, true, 11).interleave(read, 2, 2); },
               {1, 2, 3, 5, 9, 16, 22});
  check_resume([&] { return Dataset::list_files({dir.str() + "/*.rec"}, false).flat_map(read).batch(3); },
               {1, 2, 5});
  // Children that are themselves stateful (shuffle inside the function).
  auto shuffled = [o](Element e) { return Dataset::from_records({Dataset::file_name(e)}, o).shuffle(3, 2); };
  check_resume([&] { return Dataset::list_files({dir.str() + "/*.rec"}, false).interleave(shuffled, 3, 1); },
               {1, 4, 10, 20});
}

TEST(IteratorStateTest, EndedPassSavesTheEnd) {
  Dataset ds = range(3);
  DatasetIterator it = ds.make_iterator();
  while (it.next()) {
  }
  const std::string state = it.save_state();
  Dataset again = range(3);
  DatasetIterator r = again.make_iterator();
  r.restore_state(state);
  EXPECT_FALSE(r.next());
}

// --------------------------------------------------------- pass numbers ---

TEST(IteratorStateTest, RestoredPassKeepsItsNumberAndLaterPassesContinue) {
  auto build = [] { return range(12).shuffle(12, 77, /*reshuffle_each_iteration=*/true).batch(3); };
  // The uninterrupted program: passes 0..4.
  Dataset ds = build();
  std::vector<std::vector<std::string>> passes;
  for (int p = 0; p < 5; ++p) passes.push_back(pass_of(ds));
  ASSERT_NE(passes[3], passes[2]) << "reshuffle_each_iteration should change the order";
  // The interrupted one: passes 0..2, then 2 elements of pass 3, saved.
  Dataset first = build();
  for (int p = 0; p < 3; ++p) (void)pass_of(first);
  DatasetIterator it = first.make_iterator();
  ASSERT_TRUE(it.next());
  ASSERT_TRUE(it.next());
  const std::string state = it.save_state();
  // The restarted program: a new Dataset, its first iterator restored.
  Dataset restarted = build();
  DatasetIterator r = restarted.make_iterator();
  r.restore_state(state);
  EXPECT_EQ(drain(r), tail(passes[3], 2));
  EXPECT_EQ(pass_of(restarted), passes[4]) << "the pass after the restored one must be pass 4";
}

// ------------------------------------------------------------ bad input ---

TEST(IteratorStateTest, SavingPastAFailedReadAheadIsFailedPrecondition) {
  const Dataset ds = Dataset::from_generator([](const InputContext&) {
    auto i = std::make_shared<int>(0);
    return Dataset::Generator([i]() -> std::optional<Element> {
      if (*i == 4) throw InvalidArgumentError("bad element 4");
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>((*i)++));
      return e;
    });
  });
  DatasetIterator it = ds.prefetch(8).make_iterator();
  ASSERT_TRUE(it.next());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {  // until the thread has run into the error
    try {
      (void)it.save_state();
    } catch (const FailedPreconditionError& e) {
      EXPECT_NE(std::string(e.what()).find("bad element 4"), std::string::npos) << e.what();
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "save_state never saw the read-ahead error";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The elements before the error are still delivered, then the error.
  for (int k = 1; k < 4; ++k) ASSERT_TRUE(it.next());
  EXPECT_THROW(it.next(), InvalidArgumentError);
}

TEST(IteratorStateTest, RestoreIntoAUsedIteratorIsFailedPrecondition) {
  Dataset ds = range(5);
  DatasetIterator a = ds.make_iterator();
  ASSERT_TRUE(a.next());
  const std::string state = a.save_state();
  DatasetIterator b = ds.make_iterator();
  ASSERT_TRUE(b.next());
  EXPECT_THROW(b.restore_state(state), FailedPreconditionError);
  DatasetIterator empty;
  EXPECT_THROW(empty.restore_state(state), FailedPreconditionError);
  EXPECT_THROW(empty.save_state(), FailedPreconditionError);
}

TEST(IteratorStateTest, ADifferentRecipeIsInvalidArgumentNamingTheTransformation) {
  DatasetIterator a = range(10).shuffle(4, 1).batch(2).make_iterator();
  ASSERT_TRUE(a.next());
  const std::string state = a.save_state();
  DatasetIterator b = range(10).shuffle(4, 1).batch(3).make_iterator();
  try {
    b.restore_state(state);
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("batch(2"), std::string::npos) << m;
    EXPECT_NE(m.find("batch(3"), std::string::npos) << m;
    EXPECT_NE(m.find("transformation 2"), std::string::npos) << m;
  }
  DatasetIterator c = range(10).shuffle(4, 2).batch(2).make_iterator();
  EXPECT_THROW(c.restore_state(state), InvalidArgumentError);
  DatasetIterator d = range(10).shuffle(4, 1).batch(2).prefetch(1).make_iterator();
  EXPECT_THROW(d.restore_state(state), InvalidArgumentError);
  DatasetIterator e = range(11).shuffle(4, 1).batch(2).make_iterator();
  EXPECT_THROW(e.restore_state(state), InvalidArgumentError);
  // The same recipe opened for another input pipeline.
  DatasetIterator f = range(10).shuffle(4, 1).batch(2).make_iterator(InputContext{2, 1, 2});
  EXPECT_THROW(f.restore_state(state), InvalidArgumentError);
  // Arrays of the same length but another layout.
  Element floats;
  floats.add("x", Tensor::from_vector<float>(std::vector<float>(10, 1.0f)));
  DatasetIterator h = Dataset::from_tensor_slices(std::move(floats)).shuffle(4, 1).batch(2).make_iterator();
  EXPECT_THROW(h.restore_state(state), InvalidArgumentError);
  // b was refused without being touched: it is still fresh and whole.
  DatasetIterator g = range(10).shuffle(4, 1).batch(3).make_iterator();
  EXPECT_EQ(drain(b), drain(g));
}

TEST(IteratorStateTest, TruncatedOrGarbledBytesAreDataLoss) {
  TempDir dir;
  const auto files = write_record_files(dir, {20});
  auto build = [&] { return Dataset::from_records(files, id_features()).shuffle(5, 1).batch(2).prefetch(1); };
  DatasetIterator it = build().make_iterator();
  ASSERT_TRUE(it.next());
  const std::string state = it.save_state();
  auto restore = [&](const std::string& bytes) {
    DatasetIterator r = build().make_iterator();
    r.restore_state(bytes);
  };
  EXPECT_THROW(restore(""), DataLossError);
  EXPECT_THROW(restore("not a state at all, just some text of a fair length"), DataLossError);
  for (std::size_t cut : {std::size_t{1}, std::size_t{10}, state.size() / 2, state.size() - 1})
    EXPECT_THROW(restore(state.substr(0, cut)), DataLossError) << "cut at " << cut;
  EXPECT_THROW(restore(state + "x"), DataLossError);
  for (std::size_t pos : {std::size_t{3}, std::size_t{30}, state.size() / 2, state.size() - 1}) {
    std::string bad = state;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x5a);
    EXPECT_THROW(restore(bad), DataLossError) << "byte " << pos;
  }
  EXPECT_NO_THROW(restore(state));
}

}  // namespace
}  // namespace strata
