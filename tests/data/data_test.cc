// SPDX-License-Identifier: Apache-2.0
// strata::Dataset and the "memory" and "generator" input pipelines.
#include "strata/data.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "strata/c/input.h"
#include "strata/plugin_host.hpp"
#include "test_support.h"

#if STRATA_TEST_HAVE_RECORDS
#include "strata/records.hpp"
#endif

namespace strata {
namespace {

using test::TempDir;

// ------------------------------------------------------------ helpers ---

/// x = 0..n-1 (int64), one element per value.
Dataset range(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  Element e;
  e.add("x", Tensor::from_vector(v));
  return Dataset::from_tensor_slices(std::move(e));
}

/// Every element's "x" as a flat list (batches are flattened).
std::vector<std::int64_t> values(const Dataset& ds) {
  std::vector<std::int64_t> out;
  for (Element& e : ds) {
    std::vector<std::int64_t> v = e["x"].to_vector<std::int64_t>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

/// The first dimension of every element's "x".
std::vector<std::int64_t> batch_sizes(const Dataset& ds) {
  std::vector<std::int64_t> out;
  for (Element& e : ds) out.push_back(e["x"].shape().at(0));
  return out;
}

std::vector<std::int64_t> iota(std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

/// A generator of `n` scalars x = 0..n-1.
Dataset counting_generator(std::int64_t n) {
  return Dataset::from_generator([n](const InputContext&) {
    auto i = std::make_shared<std::int64_t>(0);
    return Dataset::Generator([i, n]() -> std::optional<Element> {
      if (*i >= n) return std::nullopt;
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>((*i)++));
      return e;
    });
  });
}

struct MyError : std::runtime_error {
  explicit MyError(const std::string& s) : std::runtime_error(s) {}
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// .npy writer (format 1.0 unless `version` says otherwise).
void write_npy(const std::string& path, const std::string& descr, const std::vector<std::int64_t>& shape,
               const void* data, std::size_t bytes, int version = 1, bool fortran = false) {
  std::string shp = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) shp += (i ? ", " : "") + std::to_string(shape[i]);
  shp += shape.size() == 1 ? ",)" : ")";
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shp + ", }";
  const std::size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY", 6);
  const char ver[2] = {static_cast<char>(version), 0};
  f.write(ver, 2);
  const std::uint32_t len = static_cast<std::uint32_t>(header.size());
  const unsigned char l[4] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>((len >> 8) & 0xff),
                              static_cast<unsigned char>((len >> 16) & 0xff), static_cast<unsigned char>(len >> 24)};
  f.write(reinterpret_cast<const char*>(l), version == 1 ? 2 : 4);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// Drives a plugin through its C vtable.
struct RawPipeline {
  PluginInstance inst;
  const strata_input_vtable* vt;
  RawPipeline(const std::string& name, const std::string& options, int pipelines = 1, int id = 0)
      : inst(open(name, options, pipelines, id)), vt(inst.vtable_as<strata_input_vtable>()) {}
  static PluginInstance open(const std::string& name, const std::string& options, int pipelines, int id) {
    strata_input_context ctx{};
    STRATA_INIT_HEADER(&ctx, strata_input_context);
    ctx.num_input_pipelines = pipelines;
    ctx.input_pipeline_id = id;
    ctx.num_replicas_in_sync = 1;
    return PluginHost::global().create_input_pipeline(name, options, ctx);
  }
  strata_input_t h() const { return static_cast<strata_input_t>(inst.handle()); }
  strata_status_t shard(strata_shard_policy p, int n, int i, std::string* msg = nullptr) {
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st = vt->shard(h(), p, n, i, &err);
    if (msg) *msg = err.message;
    return st;
  }
  std::uint32_t flags() {
    std::uint32_t f = 0;
    std::string files;
    strata_error err;
    strata_error_init(&err);
    EXPECT_EQ(vt->shard_info(
                  h(), &f, [](void* u, const char* d, std::uint64_t n) { static_cast<std::string*>(u)->append(d, n); },
                  &files, &err),
              STRATA_OK);
    EXPECT_EQ(files, "");
    return f;
  }
  /// Scalar int64 "x" of every element until the end.
  std::vector<std::int64_t> drain() {
    std::vector<std::int64_t> out;
    for (;;) {
      strata_element el{};
      STRATA_INIT_HEADER(&el, strata_element);
      strata_error err;
      strata_error_init(&err);
      const strata_status_t st = vt->next(h(), 1000, &el, &err);
      if (st == STRATA_ERR_OUT_OF_RANGE) return out;
      EXPECT_EQ(st, STRATA_OK) << err.message;
      if (st != STRATA_OK) return out;
      EXPECT_EQ(el.num_components, 1u);
      EXPECT_STREQ(el.names[0], "x");
      Tensor t = Tensor::adopt(el.tensors[0]);
      out.push_back(*t.data<std::int64_t>());
    }
  }
};

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

// ------------------------------------------------------------- Element ---

TEST(ElementTest, AddLookupClone) {
  Element e;
  e.add("a", Tensor::from_vector<float>({1, 2})).add("b", Tensor::scalar<std::int64_t>(7));
  EXPECT_EQ(e.size(), 2u);
  EXPECT_EQ(e["b"].to_vector<std::int64_t>(), std::vector<std::int64_t>{7});
  EXPECT_THROW(e.add("a", Tensor::scalar<float>(1)), InvalidArgumentError);
  const std::string msg = error_of([&] { (void)e["zz"]; });
  EXPECT_NE(msg.find("'zz'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a, b"), std::string::npos) << msg;
  EXPECT_THROW((void)e["zz"], NotFoundError);
  Element c = e.clone();
  c["a"].data<float>()[0] = 99;
  EXPECT_EQ(e["a"].to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(c["a"].to_vector<float>(), (std::vector<float>{99, 2}));
}

TEST(ElementTest, AtMostSixteenComponents) {
  Element e;
  for (int i = 0; i < 16; ++i) e.add("c" + std::to_string(i), Tensor::scalar<float>(1));
  EXPECT_THROW(e.add("c16", Tensor::scalar<float>(1)), InvalidArgumentError);
}

// --------------------------------------------------------- memory source ---

TEST(DatasetTest, FromTensorSlicesYieldsRows) {
  Element e;
  e.add("x", Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}));
  e.add("y", Tensor::from_vector<std::int64_t>({10, 11, 12, 13}));
  const Dataset ds = Dataset::from_tensor_slices(std::move(e));
  EXPECT_EQ(ds.cardinality(), 4);
  int i = 0;
  for (Element& el : ds) {
    ASSERT_EQ(el.names, (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(el["x"].shape(), (std::vector<std::int64_t>{2}));
    EXPECT_EQ(el["x"].to_vector<float>(), (std::vector<float>{float(2 * i), float(2 * i + 1)}));
    EXPECT_EQ(el["y"].ndim(), 0);
    EXPECT_EQ(el["y"].to_vector<std::int64_t>(), std::vector<std::int64_t>{10 + i});
    ++i;
  }
  EXPECT_EQ(i, 4);
}

TEST(DatasetTest, FromTensorSlicesRejectsBadComponents) {
  Element e;
  e.add("x", Tensor::from_vector<float>({1, 2, 3}));
  e.add("y", Tensor::from_vector<float>({1, 2}));
  const std::string msg = error_of([&] { Dataset::from_tensor_slices(std::move(e)); });
  EXPECT_NE(msg.find("first dimension"), std::string::npos) << msg;
  Element s;
  s.add("x", Tensor::scalar<float>(1));
  EXPECT_THROW(Dataset::from_tensor_slices(std::move(s)), InvalidArgumentError);
  EXPECT_THROW(Dataset::from_tensor_slices(Element{}), InvalidArgumentError);
}

TEST(DatasetTest, BorrowedTensorsAreNotCopiedAtCreation) {
  std::vector<std::int64_t> data = {5, 6, 7};
  Element e;
  e.add("x", Tensor::borrow(TensorView(data.data(), {3}, DType::kInt64)));
  const Dataset ds = Dataset::from_tensor_slices(std::move(e));
  data[1] = 60;  // the dataset reads the caller's memory when iterated
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{5, 60, 7}));
}

// ---------------------------------------------------------------- batch ---

TEST(DatasetTest, BatchKeepsShortLastBatch) {
  const Dataset ds = range(10).batch(3);
  EXPECT_EQ(batch_sizes(ds), (std::vector<std::int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(values(ds), iota(0, 10));
  EXPECT_EQ(ds.cardinality(), 4);
}

TEST(DatasetTest, BatchDropRemainder) {
  const Dataset ds = range(10).batch(3, /*drop_remainder=*/true);
  EXPECT_EQ(batch_sizes(ds), (std::vector<std::int64_t>{3, 3, 3}));
  EXPECT_EQ(values(ds), iota(0, 9));
  EXPECT_EQ(ds.cardinality(), 3);
  EXPECT_EQ(batch_sizes(range(9).batch(3, true)), (std::vector<std::int64_t>{3, 3, 3}));
  EXPECT_EQ(batch_sizes(range(2).batch(3, true)), (std::vector<std::int64_t>{}));
  EXPECT_EQ(batch_sizes(range(2).batch(3, false)), (std::vector<std::int64_t>{2}));
}

TEST(DatasetTest, BatchStacksMultiDimensionalComponents) {
  Element e;
  e.add("x", Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 2, 2}));
  DatasetIterator it = Dataset::from_tensor_slices(std::move(e)).batch(2).make_iterator();
  std::optional<Element> b = it.next();
  ASSERT_TRUE(b);
  EXPECT_EQ((*b)["x"].shape(), (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ((*b)["x"].to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  b = it.next();
  ASSERT_TRUE(b);
  EXPECT_EQ((*b)["x"].shape(), (std::vector<std::int64_t>{1, 2, 2}));
  EXPECT_FALSE(it.next());
  EXPECT_FALSE(it.next());  // stays at the end
}

TEST(DatasetTest, BatchShapeMismatchError) {
  const Dataset ds = Dataset::from_generator([](const InputContext&) {
    auto i = std::make_shared<int>(0);
    return Dataset::Generator([i]() -> std::optional<Element> {
      if (*i >= 4) return std::nullopt;
      Element e;
      e.add("feat", Tensor::zeros({*i == 1 ? 3 : 2}, DType::kFloat32));
      ++*i;
      return e;
    });
  });
  DatasetIterator it = ds.batch(2).make_iterator();
  try {
    it.next();
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'feat'"), std::string::npos) << m;
    EXPECT_NE(m.find("[2]"), std::string::npos) << m;
    EXPECT_NE(m.find("[3]"), std::string::npos) << m;
  }
}

TEST(DatasetTest, BatchSizeMustBePositive) {
  EXPECT_THROW(range(3).batch(0), InvalidArgumentError);
  EXPECT_THROW(range(3).batch(-2), InvalidArgumentError);
}

// -------------------------------------------------------------- shuffle ---

TEST(DatasetTest, ShuffleIsDeterministicPermutation) {
  const std::vector<std::int64_t> a = values(range(100).shuffle(20, 7));
  const std::vector<std::int64_t> b = values(range(100).shuffle(20, 7));  // a new dataset, same seed
  EXPECT_EQ(a, b);
  EXPECT_NE(a, iota(0, 100));
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(0, 100));
  EXPECT_NE(values(range(100).shuffle(20, 8)), a);
}

TEST(DatasetTest, ShuffleBufferBoundsDisplacement) {
  // With a buffer of b, element i can come out no earlier than position i - b + 1.
  const std::vector<std::int64_t> v = values(range(200).shuffle(5, 3));
  for (std::size_t pos = 0; pos < v.size(); ++pos) EXPECT_GE(static_cast<std::int64_t>(pos), v[pos] - 4);
  EXPECT_EQ(values(range(20).shuffle(1, 3)), iota(0, 20));  // a buffer of one keeps the order
}

TEST(DatasetTest, ReshuffleEachIterationDiffersBetweenPasses) {
  const Dataset ds = range(50).shuffle(50, 11);
  const std::vector<std::int64_t> p0 = values(ds), p1 = values(ds), p2 = values(ds);
  EXPECT_NE(p0, p1);
  EXPECT_NE(p1, p2);
  // The pass number drives it: a fresh dataset replays the same sequence.
  const Dataset again = range(50).shuffle(50, 11);
  EXPECT_EQ(values(again), p0);
  EXPECT_EQ(values(again), p1);
}

TEST(DatasetTest, NoReshuffleRepeatsTheOrder) {
  const Dataset ds = range(50).shuffle(50, 11, /*reshuffle_each_iteration=*/false);
  const std::vector<std::int64_t> p0 = values(ds);
  EXPECT_EQ(values(ds), p0);
  EXPECT_EQ(values(ds.repeat(2)), [&] {
    std::vector<std::int64_t> v = p0;
    v.insert(v.end(), p0.begin(), p0.end());
    return v;
  }());
}

TEST(DatasetTest, ShuffleInsideRepeatReshufflesEachRound) {
  const std::vector<std::int64_t> v = values(range(30).shuffle(30, 5).repeat(2));
  ASSERT_EQ(v.size(), 60u);
  const std::vector<std::int64_t> first(v.begin(), v.begin() + 30), second(v.begin() + 30, v.end());
  EXPECT_NE(first, second);
  std::vector<std::int64_t> s = second;
  std::sort(s.begin(), s.end());
  EXPECT_EQ(s, iota(0, 30));
}

TEST(DatasetTest, ShuffleBufferMustBePositive) { EXPECT_THROW(range(3).shuffle(0, 1), InvalidArgumentError); }

// ---------------------------------------------------- repeat, take, skip ---

TEST(DatasetTest, RepeatTwice) {
  std::vector<std::int64_t> want = iota(0, 4);
  want.insert(want.end(), want.begin(), want.end());
  EXPECT_EQ(values(range(4).repeat(2)), want);
  EXPECT_EQ(range(4).repeat(2).cardinality(), 8);
  EXPECT_EQ(values(range(4).repeat(0)), std::vector<std::int64_t>{});
  EXPECT_EQ(range(4).repeat(0).cardinality(), 0);
}

TEST(DatasetTest, RepeatForeverWithTake) {
  const Dataset ds = range(3).repeat().take(7);
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(range(3).repeat().cardinality(), -2);
  EXPECT_EQ(ds.cardinality(), 7);
}

TEST(DatasetTest, RepeatReopensGeneratorEachRound) {
  std::atomic<int> starts{0};
  const Dataset ds = Dataset::from_generator([&starts](const InputContext&) {
    ++starts;
    auto i = std::make_shared<int>(0);
    return Dataset::Generator([i]() -> std::optional<Element> {
      if (*i >= 2) return std::nullopt;
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>((*i)++));
      return e;
    });
  });
  EXPECT_EQ(values(ds.repeat(3)), (std::vector<std::int64_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(starts.load(), 3);
}

TEST(DatasetTest, RepeatOfEmptyDatasetEnds) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(values(range(5).take(0).repeat()), std::vector<std::int64_t>{});
  EXPECT_EQ(values(counting_generator(0).repeat()), std::vector<std::int64_t>{});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(range(5).take(0).repeat().cardinality(), 0);
}

TEST(DatasetTest, TakeAndSkip) {
  EXPECT_EQ(values(range(10).take(3)), iota(0, 3));
  EXPECT_EQ(values(range(10).take(30)), iota(0, 10));
  EXPECT_EQ(values(range(10).take(-1)), iota(0, 10));
  EXPECT_EQ(values(range(10).skip(7)), iota(7, 10));
  EXPECT_EQ(values(range(10).skip(30)), std::vector<std::int64_t>{});
  EXPECT_EQ(values(range(10).skip(-1)), std::vector<std::int64_t>{});
  EXPECT_EQ(values(range(10).skip(2).take(3)), iota(2, 5));
  EXPECT_EQ(range(10).take(3).cardinality(), 3);
  EXPECT_EQ(range(10).take(30).cardinality(), 10);
  EXPECT_EQ(range(10).take(-1).cardinality(), 10);
  EXPECT_EQ(range(10).skip(7).cardinality(), 3);
  EXPECT_EQ(range(10).skip(30).cardinality(), 0);
  EXPECT_EQ(range(10).skip(-1).cardinality(), 0);
  EXPECT_THROW(range(10).take(-3), InvalidArgumentError);
  EXPECT_THROW(range(10).skip(-3), InvalidArgumentError);
}

TEST(DatasetTest, TakeDoesNotReadAhead) {
  std::atomic<int> pulled{0};
  const Dataset ds = Dataset::from_generator([&pulled](const InputContext&) {
    return Dataset::Generator([&pulled]() -> std::optional<Element> {
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>(pulled++));
      return e;  // endless
    });
  });
  EXPECT_EQ(values(ds.take(4)), iota(0, 4));
  EXPECT_EQ(pulled.load(), 4);
}

// ------------------------------------------------------------------ map ---

TEST(DatasetTest, MapTransformsEveryElement) {
  const Dataset ds = range(5).map([](Element e) {
    Element o;
    o.add("x", Tensor::scalar<std::int64_t>(e["x"].to_vector<std::int64_t>()[0] * 10));
    o.add("orig", std::move(e["x"]));
    return o;
  });
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{0, 10, 20, 30, 40}));
  EXPECT_EQ(ds.cardinality(), 5);
}

TEST(DatasetTest, MapExceptionKeepsItsType) {
  const Dataset ds = range(5).map([](Element e) -> Element {
    if (e["x"].to_vector<std::int64_t>()[0] == 3) throw MyError("bad element 3");
    return e;
  });
  DatasetIterator it = ds.make_iterator();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(it.next());
  EXPECT_THROW(it.next(), MyError);
  EXPECT_FALSE(it.next());  // a failed pass is over
}

// ------------------------------------------------------------- prefetch ---

TEST(DatasetTest, PrefetchPreservesOrder) {
  EXPECT_EQ(values(range(500).prefetch(3)), iota(0, 500));
  EXPECT_EQ(values(range(100).batch(7).prefetch(1).repeat(2).prefetch(4)), [] {
    std::vector<std::int64_t> v = iota(0, 100);
    v.insert(v.end(), v.begin(), v.end());
    return v;
  }());
  EXPECT_EQ(values(range(10).prefetch(-1)), iota(0, 10));
  EXPECT_THROW(range(3).prefetch(0), InvalidArgumentError);
}

TEST(DatasetTest, PrefetchPropagatesErrorsInOrder) {
  const Dataset ds = Dataset::from_generator([](const InputContext&) {
    auto i = std::make_shared<int>(0);
    return Dataset::Generator([i]() -> std::optional<Element> {
      if (*i == 5) throw MyError("generator failed at 5");
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>((*i)++));
      return e;
    });
  });
  DatasetIterator it = ds.prefetch(3).make_iterator();
  for (std::int64_t k = 0; k < 5; ++k) {
    std::optional<Element> e = it.next();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)["x"].to_vector<std::int64_t>()[0], k);
  }
  try {
    it.next();
    FAIL() << "expected MyError";
  } catch (const MyError& e) {
    EXPECT_STREQ(e.what(), "generator failed at 5");
  }
  EXPECT_FALSE(it.next());
}

TEST(DatasetTest, DestroyingIteratorStopsPrefetchPromptly) {
  std::atomic<int> produced{0};
  const Dataset ds = Dataset::from_generator([&produced](const InputContext&) {
    return Dataset::Generator([&produced]() -> std::optional<Element> {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>(produced++));
      return e;  // endless, slow
    });
  });
  auto t0 = std::chrono::steady_clock::now();
  {
    DatasetIterator it = ds.map([](Element e) { return e; }).prefetch(4).make_iterator();
    ASSERT_TRUE(it.next());
    ASSERT_TRUE(it.next());
    t0 = std::chrono::steady_clock::now();
  }  // the producer is mid-pass (sleeping or waiting for room)
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::milliseconds(500));
  const int after = produced.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(produced.load(), after) << "the producer kept running after the iterator died";
  EXPECT_LE(after, 2 + 4 + 1);  // never more than the buffer ahead
}

TEST(DatasetTest, PrefetchNeverWaitsForeverOnAStuckCallback) {
  // The generator blocks until released (up to 10 s). next() gives up after
  // DatasetOptions::prefetch_timeout_s. Destroying the
  // iterator must not wait for it; the producer finishes on its own later,
  // holding everything it uses (shared state only, nothing on this stack).
  struct Gate {
    std::atomic<bool> release{false};
    std::atomic<bool> blocked{false};
    std::atomic<bool> pass_closed{false};
  };
  auto gate = std::make_shared<Gate>();
  struct OnClose {
    explicit OnClose(std::shared_ptr<Gate> gate) : g(std::move(gate)) {}
    OnClose(const OnClose&) = delete;
    OnClose& operator=(const OnClose&) = delete;
    ~OnClose() { g->pass_closed = true; }
    std::shared_ptr<Gate> g;
  };
  const Dataset ds = Dataset::from_generator([gate](const InputContext&) {
    auto closer = std::make_shared<OnClose>(gate);
    auto i = std::make_shared<int>(0);
    return Dataset::Generator([gate, closer, i]() -> std::optional<Element> {
      if ((*i)++ == 1) {
        gate->blocked = true;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!gate->release && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>(*i));
      return e;
    });
  });
  DatasetOptions o;
  o.prefetch_timeout_s = 0.3;
  std::chrono::steady_clock::time_point t0;
  {
    DatasetIterator it = ds.with_options(o).prefetch(2).make_iterator();
    ASSERT_TRUE(it.next());
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!gate->blocked && std::chrono::steady_clock::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(gate->blocked.load()) << "the producer never reached the second element";
    // Waiting on the stuck callback is a deadline, not a hang.
    const auto w0 = std::chrono::steady_clock::now();
    try {
      it.next();
      FAIL() << "expected DeadlineExceededError";
    } catch (const DeadlineExceededError& e) {
      EXPECT_NE(std::string(e.what()).find("prefetch_timeout_s"), std::string::npos) << e.what();
    }
    const auto waited = std::chrono::steady_clock::now() - w0;
    EXPECT_GE(waited, std::chrono::milliseconds(250));
    EXPECT_LT(waited, std::chrono::seconds(5));
    t0 = std::chrono::steady_clock::now();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_FALSE(gate->pass_closed.load());  // the producer is still inside the callback
  gate->release = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!gate->pass_closed && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(gate->pass_closed.load()) << "the left-behind producer never closed its pass";
  // Let the producer leave its last few instructions before the process ends.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// ---------------------------------------------------------------- shard ---

TEST(DatasetTest, ShardKeepsEveryNth) {
  EXPECT_EQ(values(range(10).shard(3, 1)), (std::vector<std::int64_t>{1, 4, 7}));
  EXPECT_EQ(values(range(10).shard(3, 0)), (std::vector<std::int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(range(10).shard(3, 0).cardinality(), 4);
  EXPECT_EQ(range(10).shard(3, 2).cardinality(), 3);
  std::vector<std::int64_t> all;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int64_t> v = values(range(11).shard(4, i));
    all.insert(all.end(), v.begin(), v.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, iota(0, 11));
}

TEST(DatasetTest, ShardValidatesArguments) {
  EXPECT_THROW(range(10).shard(0, 0), InvalidArgumentError);
  EXPECT_THROW(range(10).shard(3, 3), InvalidArgumentError);
  EXPECT_THROW(range(10).shard(3, -1), InvalidArgumentError);
  EXPECT_THROW(range(10).shard(SHARD_HINT, 0), InvalidArgumentError);
  // The placeholder is accepted in the recipe but needs AutoShardPolicy::HINT to run.
  const Dataset hinted = range(10).shard(SHARD_HINT, SHARD_HINT);
  EXPECT_EQ(hinted.cardinality(), -1);
  const std::string msg = error_of([&] { values(hinted); });
  EXPECT_NE(msg.find("AutoShardPolicy::HINT"), std::string::npos) << msg;
}

// --------------------------------------------------- iteration, options ---

TEST(DatasetTest, ExplicitIteratorAndRangeForOverIt) {
  DatasetIterator it = range(5).make_iterator();
  std::optional<Element> first = it.next();
  ASSERT_TRUE(first);
  std::vector<std::int64_t> rest;
  for (Element& e : it) rest.push_back(e["x"].to_vector<std::int64_t>()[0]);
  EXPECT_EQ(rest, iota(1, 5));
  DatasetIterator empty;
  EXPECT_THROW(empty.next(), FailedPreconditionError);
}

TEST(DatasetTest, IteratorOutlivesDataset) {
  DatasetIterator it = range(6).shuffle(3, 1).batch(2).make_iterator();  // the Dataset temporary is gone
  int n = 0;
  while (it.next()) ++n;
  EXPECT_EQ(n, 3);
}

TEST(DatasetTest, OptionsAreKeptThroughTransformations) {
  DatasetOptions o;
  o.auto_shard_policy = AutoShardPolicy::DATA;
  o.source_timeout_s = 12;
  const Dataset ds = range(4).with_options(o).batch(2).prefetch(1);
  EXPECT_EQ(ds.options().auto_shard_policy, AutoShardPolicy::DATA);
  EXPECT_EQ(ds.options().source_timeout_s, 12);
  EXPECT_EQ(range(4).options().auto_shard_policy, AutoShardPolicy::AUTO);
  EXPECT_EQ(values(ds), iota(0, 4));
  o.source_timeout_s = 0;
  EXPECT_THROW(range(4).with_options(o), InvalidArgumentError);
  o.source_timeout_s = 1;
  o.prefetch_timeout_s = -1;
  EXPECT_THROW(range(4).with_options(o), InvalidArgumentError);
  EXPECT_STREQ(auto_shard_policy_name(AutoShardPolicy::HINT), "HINT");
}

TEST(DatasetTest, CardinalityArithmetic) {
  EXPECT_EQ(range(10).batch(4).repeat(3).cardinality(), 9);
  EXPECT_EQ(range(10).repeat().batch(4).cardinality(), -2);
  EXPECT_EQ(range(10).repeat().skip(3).cardinality(), -2);
  EXPECT_EQ(counting_generator(5).cardinality(), -1);
  EXPECT_EQ(counting_generator(5).take(3).cardinality(), -1);
  EXPECT_EQ(counting_generator(5).repeat().cardinality(), -2);
  EXPECT_EQ(counting_generator(5).repeat().take(3).cardinality(), 3);
  EXPECT_EQ(range(10).shuffle(3, 1).map([](Element e) { return e; }).prefetch(2).cardinality(), 10);
}

TEST(DatasetTest, FromPluginErrors) {
  const std::string msg = error_of([] { values(Dataset::from_plugin("no_such_pipeline")); });
  EXPECT_NE(msg.find("no_such_pipeline"), std::string::npos) << msg;
  EXPECT_THROW(values(Dataset::from_plugin("no_such_pipeline")), NotFoundError);
  EXPECT_THROW(Dataset::from_plugin("memory", "{not json"), InvalidArgumentError);
  EXPECT_THROW(Dataset::from_plugin("memory", "[1]"), InvalidArgumentError);
  // Valid JSON the plugin itself rejects: the error names the option.
  const std::string m2 = error_of([] { values(Dataset::from_plugin("memory", R"({"colour": 1})")); });
  EXPECT_NE(m2.find("colour"), std::string::npos) << m2;
}

// ------------------------------------------------------------ generator ---

TEST(DatasetTest, GeneratorGetsInputContext) {
  const Dataset ds = Dataset::from_generator([](const InputContext& ctx) {
    auto i = std::make_shared<int>(0);
    const std::int64_t id = ctx.input_pipeline_id, n = ctx.num_input_pipelines;
    return Dataset::Generator([i, id, n]() -> std::optional<Element> {
      if (*i >= 2) return std::nullopt;
      ++*i;
      Element e;
      e.add("x", Tensor::from_vector<std::int64_t>({id, n}));
      return e;
    });
  });
  InputContext ctx;
  ctx.num_input_pipelines = 3;
  ctx.input_pipeline_id = 2;
  DatasetIterator it = ds.make_iterator(ctx);
  std::optional<Element> e = it.next();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["x"].to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{0, 1, 0, 1}));
}

TEST(DatasetTest, GeneratorExceptionKeepsItsType) {
  const Dataset ds = Dataset::from_generator([](const InputContext&) {
    auto i = std::make_shared<int>(0);
    return Dataset::Generator([i]() -> std::optional<Element> {
      if ((*i)++ == 2) throw MyError("boom at 2");
      Element e;
      e.add("x", Tensor::scalar<std::int64_t>(*i));
      return e;
    });
  });
  DatasetIterator it = ds.make_iterator();
  ASSERT_TRUE(it.next());
  ASSERT_TRUE(it.next());
  try {
    it.next();
    FAIL() << "expected MyError";
  } catch (const MyError& e) {
    EXPECT_STREQ(e.what(), "boom at 2");
  }
  // A strata error keeps its subclass; one thrown by the make function too.
  const Dataset strata_err = Dataset::from_generator([](const InputContext&) {
    return Dataset::Generator([]() -> std::optional<Element> { throw DataLossError("corrupt thing"); });
  });
  EXPECT_THROW(values(strata_err), DataLossError);
  const Dataset make_throws =
      Dataset::from_generator([](const InputContext&) -> Dataset::Generator { throw MyError("no generator"); });
  EXPECT_THROW(make_throws.make_iterator(), MyError);
  // An OutOfRangeError thrown by the user is an error, not a silent end.
  const Dataset oor = Dataset::from_generator([](const InputContext&) {
    return Dataset::Generator([]() -> std::optional<Element> { throw OutOfRangeError("user's own"); });
  });
  EXPECT_THROW(values(oor), OutOfRangeError);
}

TEST(DatasetTest, GeneratorElementsAreValidated) {
  const Dataset ds = Dataset::from_generator([](const InputContext&) {
    return Dataset::Generator([]() -> std::optional<Element> {
      Element e;
      e.names = {"a", "b"};
      e.tensors.push_back(Tensor::scalar<float>(1));
      return e;
    });
  });
  const std::string msg = error_of([&] { values(ds); });
  EXPECT_NE(msg.find("2 names but 1 tensors"), std::string::npos) << msg;
}

// --------------------------------------------------------------- .npy ---

TEST(NpyTest, ReadsVersionsAndDtypes) {
  TempDir dir;
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::vector<std::int64_t> y = {10, 20, 30, 40};
  const std::vector<std::int32_t> z = {-1, -2, -3, -4};
  const std::vector<double> w = {0.5, 1.5, 2.5, 3.5};
  write_npy(dir.str() + "/x.npy", "<f4", {4, 3}, x.data(), x.size() * 4, 1);
  write_npy(dir.str() + "/y.npy", "<i8", {4}, y.data(), y.size() * 8, 2);
  write_npy(dir.str() + "/z.npy", "<i4", {4, 1}, z.data(), z.size() * 4, 3);
  write_npy(dir.str() + "/w.npy", "<f8", {4}, w.data(), w.size() * 8, 1);
  const Dataset ds = Dataset::from_npy({{"x", dir.str() + "/x.npy"},
                                        {"y", dir.str() + "/y.npy"},
                                        {"z", dir.str() + "/z.npy"},
                                        {"w", dir.str() + "/w.npy"}});
  EXPECT_EQ(ds.cardinality(), 4);
  int i = 0;
  for (Element& e : ds) {
    EXPECT_EQ(e.names, (std::vector<std::string>{"x", "y", "z", "w"}));
    EXPECT_EQ(e["x"].to_vector<float>(), (std::vector<float>{x[3 * i], x[3 * i + 1], x[3 * i + 2]}));
    EXPECT_EQ(e["y"].to_vector<std::int64_t>(), std::vector<std::int64_t>{y[i]});
    EXPECT_EQ(e["z"].shape(), (std::vector<std::int64_t>{1}));
    EXPECT_EQ(e["z"].to_vector<std::int32_t>(), std::vector<std::int32_t>{z[i]});
    EXPECT_EQ(e["w"].to_vector<double>(), std::vector<double>{w[i]});
    ++i;
  }
  EXPECT_EQ(i, 4);
  // Batching .npy rows gives the original array back.
  DatasetIterator it = ds.batch(4).make_iterator();
  std::optional<Element> b = it.next();
  ASSERT_TRUE(b);
  EXPECT_EQ((*b)["x"].shape(), (std::vector<std::int64_t>{4, 3}));
  EXPECT_EQ((*b)["x"].to_vector<float>(), x);
}

TEST(NpyTest, Float16AndUint8) {
  TempDir dir;
  const std::vector<std::uint16_t> h = {float_to_half(1.5f), float_to_half(-2.0f), float_to_half(0.25f)};
  const std::vector<std::uint8_t> u = {0, 1, 2, 200, 201, 255};
  write_npy(dir.str() + "/h.npy", "<f2", {3}, h.data(), h.size() * 2);
  write_npy(dir.str() + "/u.npy", "|u1", {3, 2}, u.data(), u.size());
  // uint8 at the plugin level (any consumer of the C ABI).
  RawPipeline p("memory", R"({"npy": {"h": ")" + dir.str() + R"(/h.npy", "u": ")" + dir.str() + R"(/u.npy"}})");
  strata_element el{};
  STRATA_INIT_HEADER(&el, strata_element);
  strata_error err;
  strata_error_init(&err);
  ASSERT_EQ(p.vt->next(p.h(), 1000, &el, &err), STRATA_OK) << err.message;
  ASSERT_EQ(el.num_components, 2u);
  EXPECT_STREQ(el.names[0], "h");
  EXPECT_STREQ(el.names[1], "u");
  DLManagedTensor* ut = el.tensors[1];
  EXPECT_EQ(ut->dl_tensor.dtype.code, kDLUInt);
  EXPECT_EQ(ut->dl_tensor.dtype.bits, 8);
  ASSERT_EQ(ut->dl_tensor.ndim, 1);
  EXPECT_EQ(ut->dl_tensor.shape[0], 2);
  EXPECT_EQ(static_cast<const std::uint8_t*>(ut->dl_tensor.data)[1], 1);
  ut->deleter(ut);
  Tensor ht = Tensor::adopt(el.tensors[0]);
  EXPECT_EQ(ht.dtype(), DType::kFloat16);
  EXPECT_EQ(ht.to_doubles(), std::vector<double>{1.5});
  // Through the Dataset: float16 rows.
  const Dataset ds = Dataset::from_npy({{"h", dir.str() + "/h.npy"}});
  std::vector<double> got;
  for (Element& e : ds) got.push_back(e["h"].to_doubles()[0]);
  EXPECT_EQ(got, (std::vector<double>{1.5, -2.0, 0.25}));
}

TEST(NpyTest, ErrorsNameTheFile) {
  TempDir dir;
  const std::string d = dir.str();
  const std::vector<float> x = {1, 2, 3, 4};
  auto err = [&](const std::string& file) { return error_of([&] { values(Dataset::from_npy({{"x", file}})); }); };

  const std::string missing = err(d + "/missing.npy");
  EXPECT_NE(missing.find(d + "/missing.npy"), std::string::npos) << missing;
  EXPECT_THROW(values(Dataset::from_npy({{"x", d + "/missing.npy"}})), NotFoundError);

  write_npy(d + "/fortran.npy", "<f4", {2, 2}, x.data(), 16, 1, /*fortran=*/true);
  const std::string f = err(d + "/fortran.npy");
  EXPECT_NE(f.find("fortran.npy"), std::string::npos) << f;
  EXPECT_NE(f.find("Fortran order"), std::string::npos) << f;

  write_npy(d + "/be.npy", ">f4", {4}, x.data(), 16);
  const std::string be = err(d + "/be.npy");
  EXPECT_NE(be.find("be.npy"), std::string::npos) << be;
  EXPECT_NE(be.find("'>f4'"), std::string::npos) << be;

  write_npy(d + "/short.npy", "<f4", {4}, x.data(), 12);  // one float missing
  const std::string sh = err(d + "/short.npy");
  EXPECT_NE(sh.find("short.npy"), std::string::npos) << sh;
  EXPECT_NE(sh.find("truncated"), std::string::npos) << sh;

  {  // cut inside the header
    std::ofstream o(d + "/cut.npy", std::ios::binary);
    o.write("\x93NUMPY\x01\x00\x76\x00{'descr'", 18);
  }
  const std::string cut = err(d + "/cut.npy");
  EXPECT_NE(cut.find("cut.npy"), std::string::npos) << cut;
  EXPECT_NE(cut.find("truncated"), std::string::npos) << cut;

  {
    std::ofstream o(d + "/text.npy");
    o << "just some text, not numpy";
  }
  const std::string txt = err(d + "/text.npy");
  EXPECT_NE(txt.find("text.npy"), std::string::npos) << txt;
  EXPECT_NE(txt.find("not a .npy file"), std::string::npos) << txt;

  const float one = 1;
  write_npy(d + "/scalar.npy", "<f4", {}, &one, 4);
  const std::string sc = err(d + "/scalar.npy");
  EXPECT_NE(sc.find("scalar"), std::string::npos) << sc;

  write_npy(d + "/a.npy", "<f4", {4}, x.data(), 16);
  write_npy(d + "/b.npy", "<f4", {2, 2}, x.data(), 16);
  const std::string mismatch = error_of([&] { values(Dataset::from_npy({{"a", d + "/a.npy"}, {"b", d + "/b.npy"}})); });
  EXPECT_NE(mismatch.find("a.npy"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("b.npy"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("first dimension"), std::string::npos) << mismatch;

  EXPECT_THROW(Dataset::from_npy({}), InvalidArgumentError);
  EXPECT_THROW(Dataset::from_npy({{"a", d + "/a.npy"}, {"a", d + "/b.npy"}}), InvalidArgumentError);
}

// ---------------------------------------------- plugins through the ABI ---

TEST(MemoryPipelineTest, ShardsByDataOnly) {
  std::vector<std::int64_t> v = iota(0, 10);
  Tensor x = Tensor::from_vector(v);
  const DLTensor* t = &x.dl();
  strata_input_arrays a{};
  STRATA_INIT_HEADER(&a, strata_input_arrays);
  a.num_components = 1;
  a.names[0] = "x";
  a.tensors[0] = t;
  const std::string opts = R"({"arrays": ")" + hex(&a) + R"("})";

  RawPipeline p("memory", opts);
  EXPECT_EQ(p.flags(), STRATA_INPUT_CAN_SHARD_BY_DATA);
  std::string msg;
  EXPECT_EQ(p.shard(STRATA_SHARD_FILE, 2, 0, &msg), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("not file-based"), std::string::npos) << msg;
  EXPECT_EQ(p.shard(STRATA_SHARD_DATA, 3, 3, &msg), STRATA_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(p.shard(STRATA_SHARD_DATA, 3, 1), STRATA_OK);
  ASSERT_NE(p.vt->cardinality, nullptr);
  EXPECT_EQ(p.vt->cardinality(p.h()), 3);
  EXPECT_EQ(p.drain(), (std::vector<std::int64_t>{1, 4, 7}));
  EXPECT_EQ(p.shard(STRATA_SHARD_DATA, 2, 0), STRATA_ERR_FAILED_PRECONDITION);  // after next()

  RawPipeline q("memory", opts);
  ASSERT_EQ(q.shard(STRATA_SHARD_DATA, 4, 3), STRATA_OK);
  EXPECT_EQ(q.vt->cardinality(q.h()), 2);
  EXPECT_EQ(q.drain(), (std::vector<std::int64_t>{3, 7}));
}

TEST(MemoryPipelineTest, SaveAndRestorePosition) {
  Tensor x = Tensor::from_vector(iota(0, 10));
  strata_input_arrays a{};
  STRATA_INIT_HEADER(&a, strata_input_arrays);
  a.num_components = 1;
  a.names[0] = "x";
  a.tensors[0] = &x.dl();
  const std::string opts = R"({"arrays": ")" + hex(&a) + R"("})";
  auto save = [](RawPipeline& p) {
    std::string state;
    strata_error err;
    strata_error_init(&err);
    EXPECT_NE(p.vt->save_state, nullptr);
    EXPECT_EQ(p.vt->save_state(
                  p.h(), [](void* u, const char* d, std::uint64_t n) { static_cast<std::string*>(u)->append(d, n); },
                  &state, &err),
              STRATA_OK)
        << err.message;
    return state;
  };
  auto restore = [](RawPipeline& p, const std::string& state, std::string* msg = nullptr) {
    strata_error err;
    strata_error_init(&err);
    const strata_status_t st = p.vt->restore_state(p.h(), state.data(), state.size(), &err);
    if (msg) *msg = err.message;
    return st;
  };

  RawPipeline p("memory", opts);
  ASSERT_EQ(p.shard(STRATA_SHARD_DATA, 2, 1), STRATA_OK);  // rows 1, 3, 5, 7, 9
  strata_element el{};
  STRATA_INIT_HEADER(&el, strata_element);
  for (int i = 0; i < 2; ++i) {  // read 1 and 3
    ASSERT_EQ(p.vt->next(p.h(), 1000, &el, nullptr), STRATA_OK);
    Tensor::adopt(el.tensors[0]);
  }
  const std::string state = save(p);

  RawPipeline q("memory", opts);
  ASSERT_EQ(q.shard(STRATA_SHARD_DATA, 2, 1), STRATA_OK);
  ASSERT_EQ(restore(q, state), STRATA_OK);
  EXPECT_EQ(q.drain(), (std::vector<std::int64_t>{5, 7, 9}));  // neither repeats nor skips

  RawPipeline other_shard("memory", opts);
  std::string msg;
  EXPECT_EQ(restore(other_shard, state, &msg), STRATA_ERR_FAILED_PRECONDITION);
  EXPECT_NE(msg.find("same data and shard"), std::string::npos) << msg;
  EXPECT_EQ(restore(other_shard, "not json", &msg), STRATA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(other_shard.drain(), iota(0, 10));  // failed restores changed nothing
}

TEST(MemoryPipelineTest, BadOptions) {
  auto open_err = [](const std::string& opts) { return error_of([&] { RawPipeline p("memory", opts); }); };
  EXPECT_NE(open_err("{}").find("exactly one"), std::string::npos);
  EXPECT_NE(open_err(R"({"arrays": "0x10", "npy": {}})").find("exactly one"), std::string::npos);
  EXPECT_NE(open_err(R"({"arrays": 5})").find("hex address"), std::string::npos);
  EXPECT_NE(open_err(R"({"arrays": "12345"})").find("0x"), std::string::npos);
  EXPECT_NE(open_err(R"({"arrays": "0xzz"})").find("not a valid"), std::string::npos);
  EXPECT_NE(open_err(R"({"npy": []})").find("non-empty object"), std::string::npos);
  EXPECT_NE(open_err(R"({"npy": {"x": 3}})").find("npy.x"), std::string::npos);
  EXPECT_NE(open_err(R"({"bogus": 1})").find("bogus"), std::string::npos);

  Tensor x = Tensor::from_vector<float>({1, 2});
  strata_input_arrays a{};
  STRATA_INIT_HEADER(&a, strata_input_arrays);
  a.struct_size = 16;  // an older or foreign struct
  a.num_components = 1;
  a.names[0] = "x";
  a.tensors[0] = &x.dl();
  const std::string small = open_err(R"({"arrays": ")" + hex(&a) + R"("})");
  EXPECT_NE(small.find("struct_size 16"), std::string::npos) << small;
  EXPECT_NE(small.find("ABI mismatch"), std::string::npos) << small;
  EXPECT_THROW(RawPipeline("memory", R"({"arrays": ")" + hex(&a) + R"("})"), InvalidArgumentError);

  STRATA_INIT_HEADER(&a, strata_input_arrays);
  a.num_components = 0;
  EXPECT_NE(open_err(R"({"arrays": ")" + hex(&a) + R"("})").find("0 components"), std::string::npos);
  a.num_components = 2;
  a.names[1] = "x";
  a.tensors[1] = &x.dl();
  EXPECT_NE(open_err(R"({"arrays": ")" + hex(&a) + R"("})").find("two components are named 'x'"), std::string::npos);
}

// A C-level generator: yields 0..limit-1, counts starts and finishes.
struct CGen {
  int limit = 10;
  int starts = 0, finishes = 0;
  struct Pass {
    CGen* g;
    int i = 0;
  };
  static strata_status_t start(void* user, const strata_input_context*, void** pass, strata_error*) {
    auto* g = static_cast<CGen*>(user);
    ++g->starts;
    *pass = new Pass{g};
    return STRATA_OK;
  }
  static strata_status_t next(void* pass, strata_element* out, strata_error*) {
    auto* p = static_cast<Pass*>(pass);
    if (p->i >= p->g->limit) return STRATA_ERR_OUT_OF_RANGE;
    out->num_components = 1;
    out->names[0] = "x";
    out->tensors[0] = Tensor::scalar<std::int64_t>(p->i++).to_dlpack();
    return STRATA_OK;
  }
  static void finish(void* pass) {
    auto* p = static_cast<Pass*>(pass);
    ++p->g->finishes;
    delete p;
  }
};

TEST(GeneratorPipelineTest, StartNextFinishAndSharding) {
  CGen g;
  strata_input_generator c{};
  STRATA_INIT_HEADER(&c, strata_input_generator);
  c.user = &g;
  c.start = &CGen::start;
  c.next = &CGen::next;
  c.finish = &CGen::finish;
  const std::string opts = R"({"generator": ")" + hex(&c) + R"("})";
  {
    RawPipeline p("generator", opts);
    EXPECT_EQ(g.starts, 1);
    EXPECT_EQ(p.flags(), STRATA_INPUT_CAN_SHARD_BY_DATA);
    std::string msg;
    EXPECT_EQ(p.shard(STRATA_SHARD_FILE, 2, 0, &msg), STRATA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(msg.find("not file-based"), std::string::npos) << msg;
    ASSERT_EQ(p.shard(STRATA_SHARD_DATA, 3, 2), STRATA_OK);
    ASSERT_NE(p.vt->cardinality, nullptr);
    EXPECT_EQ(p.vt->cardinality(p.h()), -1);
    EXPECT_EQ(p.drain(), (std::vector<std::int64_t>{2, 5, 8}));
    EXPECT_EQ(g.finishes, 0);
  }
  EXPECT_EQ(g.finishes, 1);

  c.struct_size = 8;
  const std::string small = error_of([&] { RawPipeline p("generator", opts); });
  EXPECT_NE(small.find("ABI mismatch"), std::string::npos) << small;
  STRATA_INIT_HEADER(&c, strata_input_generator);
  c.next = nullptr;
  const std::string null_next = error_of([&] { RawPipeline p("generator", opts); });
  EXPECT_NE(null_next.find("next is NULL"), std::string::npos) << null_next;
  EXPECT_NE(error_of([&] { RawPipeline p("generator", "{}"); }).find("needs option \"generator\""), std::string::npos);
  EXPECT_EQ(g.starts, 1);  // rejected options never start a pass
}

// A C-level generator that fails with a given status after `good` elements.
struct FailingGen {
  strata_status_t status;
  const char* message;
  int good = 1;
  static strata_status_t start(void* user, const strata_input_context*, void** pass, strata_error*) {
    *pass = new FailingGen(*static_cast<FailingGen*>(user));
    return STRATA_OK;
  }
  static strata_status_t next(void* pass, strata_element* out, strata_error* err) {
    auto* g = static_cast<FailingGen*>(pass);
    if (g->good-- > 0) {
      out->num_components = 1;
      out->names[0] = "x";
      out->tensors[0] = Tensor::scalar<std::int64_t>(1).to_dlpack();
      return STRATA_OK;
    }
    err->code = g->status;
    std::snprintf(err->message, sizeof err->message, "%s", g->message);
    return g->status;
  }
  static void finish(void* pass) { delete static_cast<FailingGen*>(pass); }
};

TEST(DatasetTest, SourceStatusesBecomeTypedErrors) {
  auto run = [](strata_status_t st, const char* msg) {
    FailingGen g{st, msg};
    strata_input_generator c{};
    STRATA_INIT_HEADER(&c, strata_input_generator);
    c.user = &g;
    c.start = &FailingGen::start;
    c.next = &FailingGen::next;
    c.finish = &FailingGen::finish;
    DatasetIterator it = Dataset::from_plugin("generator", R"({"generator": ")" + hex(&c) + R"("})").make_iterator();
    EXPECT_TRUE(it.next());
    it.next();
  };
  try {
    run(STRATA_ERR_DEADLINE_EXCEEDED, "reader stalled");
    FAIL() << "expected DeadlineExceededError";
  } catch (const DeadlineExceededError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("input pipeline 'generator'"), std::string::npos) << m;
    EXPECT_NE(m.find("reader stalled"), std::string::npos) << m;
    EXPECT_NE(m.find("source_timeout_s"), std::string::npos) << m;
  }
  try {
    run(STRATA_ERR_DATA_LOSS, "bad.rec: corrupt record at byte 42");
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.rec: corrupt record at byte 42"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------- composite datasets ---

/// from_tensors(v).repeat(k): k copies of the int64 value v as "x".
Dataset copies(std::int64_t v, std::int64_t k) {
  Element e;
  e.add("x", Tensor::from_vector(std::vector<std::int64_t>(static_cast<std::size_t>(k), v)));
  return Dataset::from_tensor_slices(std::move(e));
}

/// An element's scalar "x".
std::int64_t x_of(const Element& e) { return e["x"].to_vector<std::int64_t>().at(0); }

/// The "x" of every element, one vector per element (batches kept apart).
std::vector<std::vector<std::int64_t>> batches(const Dataset& ds) {
  std::vector<std::vector<std::int64_t>> out;
  for (Element& e : ds) out.push_back(e["x"].to_vector<std::int64_t>());
  return out;
}

// tf.data.Dataset.interleave's docstring example (range(1, 6), each x
// repeated 6 times, cycle_length=2, block_length=4) and the order rules of
// interleave_test.py (testPythonImplementation's reference model).
TEST(CompositeDatasetTest, InterleaveFollowsTfOrder) {
  const Dataset ds = range(6).skip(1).interleave([](Element e) { return copies(x_of(e), 6); }, 2, 4);
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3,
                                                   4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5}));
  // Datasets of different lengths: a finished one frees its slot, which the
  // next input fills when the turn comes back (cycle 2, block 1 over x
  // copies of x for x = 4, 5, 6).
  const Dataset uneven = copies(4, 1)
                             .concatenate(copies(5, 1))
                             .concatenate(copies(6, 1))
                             .interleave([](Element e) { return copies(x_of(e), x_of(e)); }, 2);
  EXPECT_EQ(values(uneven),
            (std::vector<std::int64_t>{4, 5, 4, 5, 4, 5, 4, 5, 5, 6, 6, 6, 6, 6, 6}));
  EXPECT_EQ(ds.cardinality(), UNKNOWN_CARDINALITY);  // tf: interleave's cardinality is unknown
  // A cycle longer than the input just opens every input at once.
  EXPECT_EQ(values(range(3).interleave([](Element e) { return copies(x_of(e), 2); }, 5)),
            (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2}));
  // Empty inner datasets are skipped; an empty input gives nothing.
  EXPECT_EQ(values(range(3).interleave([](Element e) { return copies(x_of(e), x_of(e) == 1 ? 0 : 2); }, 2)),
            (std::vector<std::int64_t>{0, 0, 2, 2}));
  EXPECT_TRUE(values(range(0).interleave([](Element e) { return copies(x_of(e), 2); }, 2)).empty());
}

TEST(CompositeDatasetTest, FlatMapConcatenatesInOrder) {
  const Dataset ds = range(4).flat_map([](Element e) { return range(x_of(e)); });
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{0, 0, 1, 0, 1, 2}));
  // Every pass calls the function again and gives the same elements.
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{0, 0, 1, 0, 1, 2}));
  // The function's own exception reaches the caller with its type.
  const Dataset bad = range(2).flat_map([](Element) -> Dataset { throw std::out_of_range("no dataset for you"); });
  EXPECT_THROW(values(bad), std::out_of_range);
  const std::string empty = error_of([&] { values(range(2).flat_map([](Element) { return Dataset(nullptr); })); });
  EXPECT_NE(empty.find("returned an empty Dataset"), std::string::npos) << empty;
}

TEST(CompositeDatasetTest, InterleaveArgumentsAreChecked) {
  auto fn = [](Element e) { return copies(x_of(e), 1); };
  EXPECT_THROW(range(2).interleave(fn, 0), InvalidArgumentError);
  EXPECT_THROW(range(2).interleave(fn, -1), InvalidArgumentError);  // no AUTOTUNE
  EXPECT_THROW(range(2).interleave(fn, 2, 0), InvalidArgumentError);
  EXPECT_THROW(range(2).interleave(nullptr, 2), InvalidArgumentError);
  EXPECT_THROW(range(2).flat_map(nullptr), InvalidArgumentError);
}

// tf.data.Dataset.zip's docstring: zip((a, b)) pairs elements and stops at
// the shortest input; cardinality is the shortest (zip_test.py).
TEST(CompositeDatasetTest, ZipPairsElementsUntilTheShortestEnds) {
  Element b;
  b.add("y", Tensor::from_vector<std::int64_t>({4, 5, 6, 7, 8}));
  const Dataset ds = Dataset::zip({range(3), Dataset::from_tensor_slices(std::move(b))});
  std::vector<std::pair<std::int64_t, std::int64_t>> got;
  for (Element& e : ds) {
    EXPECT_EQ(e.names, (std::vector<std::string>{"x", "y"}));
    got.emplace_back(x_of(e), e["y"].to_vector<std::int64_t>().at(0));
  }
  EXPECT_EQ(got, (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 4}, {1, 5}, {2, 6}}));
  EXPECT_EQ(ds.cardinality(), 3);
  Element c;
  c.add("z", Tensor::from_vector<std::int64_t>({1}));
  const Dataset c1 = Dataset::from_tensor_slices(std::move(c));
  EXPECT_EQ(Dataset::zip({range(3), c1.repeat()}).cardinality(), 3);
  EXPECT_EQ(Dataset::zip({c1.repeat(), c1.repeat()}).cardinality(), INFINITE_CARDINALITY);
  EXPECT_EQ(Dataset::zip({range(3), range(5).unique()}).cardinality(), UNKNOWN_CARDINALITY);
  // Elements are flat: the same name in two inputs is an error naming it.
  const std::string clash = error_of([&] { values(Dataset::zip({range(2), range(2)})); });
  EXPECT_NE(clash.find("component 'x' is in dataset 0 and dataset 1"), std::string::npos) << clash;
  EXPECT_NE(clash.find("rename"), std::string::npos) << clash;
  EXPECT_THROW(Dataset::zip({}), InvalidArgumentError);
}

// tf.data.Dataset.concatenate's docstring ([1, 2, 3] then [4 .. 7]) and
// concatenate_test.py (cardinality; incompatible element types fail).
TEST(CompositeDatasetTest, ConcatenateAppendsTheSecondDataset) {
  const Dataset ds = range(4).skip(1).concatenate(range(8).skip(4));
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ds.cardinality(), 7);
  EXPECT_EQ(range(0).concatenate(range(2)).cardinality(), 2);
  EXPECT_EQ(values(range(0).concatenate(range(2))), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(range(2).concatenate(range(2).repeat()).cardinality(), INFINITE_CARDINALITY);
  EXPECT_EQ(range(2).unique().concatenate(range(2).repeat()).cardinality(), UNKNOWN_CARDINALITY);
  Element f;
  f.add("x", Tensor::from_vector<float>({1.5f}));
  const Dataset floats = Dataset::from_tensor_slices(std::move(f));
  const std::string msg = error_of([&] { values(range(2).concatenate(floats)); });
  EXPECT_NE(msg.find("{x: int64}"), std::string::npos) << msg;
  EXPECT_NE(msg.find("{x: float32}"), std::string::npos) << msg;
  EXPECT_THROW(values(range(2).concatenate(floats)), InvalidArgumentError);
}

// tf.data.Dataset.unique's docstring: [1, 37, 2, 37, 2, 1] -> [1, 37, 2];
// unique_test.py: int32/int64 (and string) only, one component.
TEST(CompositeDatasetTest, UniqueKeepsFirstOccurrences) {
  Element e;
  e.add("x", Tensor::from_vector<std::int64_t>({1, 37, 2, 37, 2, 1}));
  const Dataset ds = Dataset::from_tensor_slices(std::move(e)).unique();
  EXPECT_EQ(values(ds), (std::vector<std::int64_t>{1, 37, 2}));
  EXPECT_EQ(ds.cardinality(), UNKNOWN_CARDINALITY);
  Element i32;
  i32.add("y", Tensor::from_vector<std::int32_t>({5, 5, 6, 5}));
  std::vector<std::int32_t> got;
  for (Element& el : Dataset::from_tensor_slices(std::move(i32)).unique())
    got.push_back(el["y"].to_vector<std::int32_t>()[0]);
  EXPECT_EQ(got, (std::vector<std::int32_t>{5, 6}));
  Element f;
  f.add("x", Tensor::from_vector<float>({1.0f, 1.0f}));
  const std::string fl = error_of([&] { values(Dataset::from_tensor_slices(std::move(f)).unique()); });
  EXPECT_NE(fl.find("float32"), std::string::npos) << fl;
  const std::string two = error_of([&] { values(Dataset::zip({range(2), copies(1, 2).map([](Element x) {
    Element r;
    r.add("z", std::move(x.tensors[0]));
    return r;
  })}).unique()); });
  EXPECT_NE(two.find("needs exactly one"), std::string::npos) << two;
}

// assert_cardinality_test.py: a correct count passes and sets
// cardinality(); too many fails at element n + 1 ("at least"), too few at
// the end ("only"), both as FailedPreconditionError.
TEST(CompositeDatasetTest, AssertCardinalityFailsWhenTheCountDiffers) {
  const Dataset ok = range(10).unique().assert_cardinality(10);
  EXPECT_EQ(ok.cardinality(), 10);
  EXPECT_EQ(values(ok), iota(0, 10));
  std::vector<std::int64_t> seen;
  try {
    for (Element& e : range(10).assert_cardinality(5)) seen.push_back(x_of(e));
    FAIL() << "no error";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("expected to have 5 elements but has at least 6 elements"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seen, iota(0, 5));  // the first five still arrive
  try {
    values(range(10).assert_cardinality(15));
    FAIL() << "no error";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.what()).find("expected to have 15 elements but had only 10 elements"),
              std::string::npos)
        << e.what();
  }
  const std::string inf = error_of([&] { values(range(3).assert_cardinality(INFINITE_CARDINALITY)); });
  EXPECT_NE(inf.find("an infinite number of elements but had only 3 elements"), std::string::npos) << inf;
  EXPECT_EQ(range(1).repeat().assert_cardinality(INFINITE_CARDINALITY).take(4).cardinality(), 4);
  EXPECT_THROW(range(1).assert_cardinality(-3), InvalidArgumentError);
}

// rebatch_test.py, case by case (range(n).batch(b).rebatch(sizes)).
TEST(CompositeDatasetTest, RebatchCutsRowsAsUnbatchBatchWould) {
  using B = std::vector<std::vector<std::int64_t>>;
  for (bool drop : {false, true}) {
    // testBasic / testScalarBatchSizeInput
    EXPECT_EQ(batches(range(8).batch(4, true).rebatch({2, 2}, drop)), (B{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(batches(range(8).batch(4, true).rebatch(2, drop)), (B{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    // testBatchSizeGreaterThanOriginal
    EXPECT_EQ(batches(range(12).batch(4).rebatch({6}, drop)), (B{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}));
    // testEmptySplits: a 0 gives an empty batch
    EXPECT_EQ(batches(range(8).batch(4, true).rebatch({1, 1, 1, 1, 0}, drop)),
              (B{{0}, {1}, {2}, {3}, {}, {4}, {5}, {6}, {7}, {}}));
    // testEmptyFirstSplits: the trailing [] comes from a 0 that reads nothing
    EXPECT_EQ(batches(range(8).batch(4, true).rebatch({0, 1}, drop)),
              (B{{}, {0}, {}, {1}, {}, {2}, {}, {3}, {}, {4}, {}, {5}, {}, {6}, {}, {7}, {}}));
    // testEmptyLastSplits
    EXPECT_EQ(batches(range(8).batch(4, true).rebatch({1, 0}, drop)),
              (B{{0}, {}, {1}, {}, {2}, {}, {3}, {}, {4}, {}, {5}, {}, {6}, {}, {7}, {}}));
  }
  // testPartialBatch / testPartialBatchWithDropRemainder
  EXPECT_EQ(batches(range(5).batch(4).rebatch({2, 2})), (B{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(batches(range(5).batch(4).rebatch({2, 2}, true)), (B{{0, 1}, {2, 3}}));
  // testBatchSizeEqualToOriginal
  for (std::int64_t b : {2, 3, 4})
    for (bool drop : {false, true})
      EXPECT_EQ(batches(range(11).batch(b, drop).rebatch(b)), batches(range(11).batch(b, drop)));
  // testMultipleBatches: only the outer dimension is re-cut
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::int64_t> flat;
  for (Element& e : range(16).batch(2, true).batch(4, true).rebatch({2, 2})) {
    shapes.push_back(e["x"].shape());
    const auto v = e["x"].to_vector<std::int64_t>();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  EXPECT_EQ(shapes, (std::vector<std::vector<std::int64_t>>(4, {2, 2})));
  EXPECT_EQ(flat, iota(0, 16));
  // Every component is cut at the same rows (testNestedDictionaryOutput).
  Element two;
  two.add("a", Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 4, 5, 6, 7}));
  two.add("c", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<std::vector<float>> cs;
  for (Element& e : Dataset::from_tensor_slices(std::move(two)).batch(4, true).rebatch({2, 2}))
    cs.push_back(e["c"].to_vector<float>());
  EXPECT_EQ(cs, (std::vector<std::vector<float>>{{1, 2}, {3, 4}, {5, 6}, {7, 8}}));
  EXPECT_EQ(range(8).batch(4).rebatch(2).repeat().cardinality(), INFINITE_CARDINALITY);
}

TEST(CompositeDatasetTest, RebatchErrors) {
  EXPECT_THROW(range(4).batch(2).rebatch(std::vector<std::int64_t>{}), InvalidArgumentError);
  EXPECT_THROW(range(4).batch(2).rebatch({1, -1}), InvalidArgumentError);
  const std::string zeros = error_of([&] { range(4).batch(2).rebatch({0, 0}); });
  EXPECT_NE(zeros.find("at least one positive size"), std::string::npos) << zeros;
  const std::string scalar = error_of([&] { values(range(4).rebatch(2)); });
  EXPECT_NE(scalar.find("is a scalar"), std::string::npos) << scalar;
}

// dataset_ops.list_files: sorted matches of every pattern; shuffle is a
// full shuffle; no match is an error (list_files_test.py testEmptyDirectory,
// testSimpleDirectory, testFileSuffixes, testNoShuffle).
TEST(CompositeDatasetTest, ListFilesMatchesSortsAndShuffles) {
  TempDir dir;
  for (const char* n : {"b.rec", "a.rec", "c.rec", "d.txt"}) std::ofstream(dir.str() + "/" + n) << "x";
  auto names = [](const Dataset& ds) {
    std::vector<std::string> out;
    for (Element& e : ds) out.push_back(Dataset::file_name(e));
    return out;
  };
  const std::string d = dir.str() + "/";
  const Dataset sorted = Dataset::list_files({d + "*.rec"}, /*shuffle=*/false);
  EXPECT_EQ(names(sorted), (std::vector<std::string>{d + "a.rec", d + "b.rec", d + "c.rec"}));
  EXPECT_EQ(sorted.cardinality(), 3);
  // Several patterns: one sorted list of all matches.
  EXPECT_EQ(names(Dataset::list_files({d + "*.txt", d + "a*"}, false)),
            (std::vector<std::string>{d + "a.rec", d + "d.txt"}));
  // Elements are uint8 vectors named "filename".
  for (Element& e : sorted) {
    EXPECT_EQ(e.names, std::vector<std::string>{"filename"});
    EXPECT_EQ(e["filename"].dtype(), DType::kUInt8);
  }
  const Dataset shuffled = Dataset::list_files({d + "*"}, /*shuffle=*/true, /*seed=*/7);
  const auto p1 = names(shuffled);
  auto s1 = p1;
  std::sort(s1.begin(), s1.end());
  EXPECT_EQ(s1, (std::vector<std::string>{d + "a.rec", d + "b.rec", d + "c.rec", d + "d.txt"}));
  EXPECT_EQ(names(Dataset::list_files({d + "*"}, true, 7)), p1) << "same seed, same first pass";
  EXPECT_EQ(shuffled.cardinality(), 4);
  const std::string none = error_of([&] { Dataset::list_files({d + "*.none", d + "x*"}); });
  EXPECT_NE(none.find("no files match " + d + "*.none, " + d + "x*"), std::string::npos) << none;
  EXPECT_THROW(Dataset::list_files({d + "*.none"}), InvalidArgumentError);
  EXPECT_THROW(Dataset::list_files({}), InvalidArgumentError);
  const std::string notname = error_of([&] {
    for (Element& e : range(1)) Dataset::file_name(e);
  });
  EXPECT_NE(notname.find("no component 'filename'"), std::string::npos) << notname;
}


#if STRATA_TEST_HAVE_RECORDS
// ------------------------------------------------------------- records ---

TEST(RecordsDatasetTest, FromRecordsWithAndWithoutFeatures) {
  TempDir dir;
  std::vector<std::string> files;
  std::int64_t k = 0;
  for (int f = 0; f < 2; ++f) {
    files.push_back(dir.str() + "/part-" + std::to_string(f) + ".rec");
    RecordWriter w(files.back());
    for (int r = 0; r < 5; ++r, ++k) {
      std::vector<float> x = {float(k), float(k) + 0.5f};
      std::vector<std::int64_t> y = {k};
      w.write_features({TensorView(x.data(), {2}, DType::kFloat32), TensorView(y.data(), {1}, DType::kInt64)});
    }
    w.close();
  }
  RecordOptions opts;
  opts.features = {{"x", DType::kFloat32, {2}}, {"y", DType::kInt64, {1}}};
  const Dataset ds = Dataset::from_records(files, opts);
  std::vector<std::int64_t> ys;
  for (Element& b : ds.batch(4)) {
    ASSERT_EQ(b.names, (std::vector<std::string>{"x", "y"}));
    const std::vector<float> x = b["x"].to_vector<float>();
    const std::vector<std::int64_t> y = b["y"].to_vector<std::int64_t>();
    for (std::size_t i = 0; i < y.size(); ++i) {
      EXPECT_EQ(x[2 * i], float(y[i]));
      EXPECT_EQ(x[2 * i + 1], float(y[i]) + 0.5f);
    }
    ys.insert(ys.end(), y.begin(), y.end());
  }
  EXPECT_EQ(ys, iota(0, 10));
  // Without features: one uint8 component "record" with the payload bytes.
  int n = 0;
  for (Element& e : Dataset::from_records(files)) {
    EXPECT_EQ(e.names, std::vector<std::string>{"record"});
    EXPECT_EQ(e["record"].dtype(), DType::kUInt8);
    EXPECT_EQ(e["record"].shape(), (std::vector<std::int64_t>{2 * 4 + 8}));
    ++n;
  }
  EXPECT_EQ(n, 10);
  const std::string missing = error_of([&] { values(Dataset::from_records({dir.str() + "/nope.rec"})); });
  EXPECT_NE(missing.find("nope.rec"), std::string::npos) << missing;
  EXPECT_THROW(Dataset::from_records({}), InvalidArgumentError);
}
// The input pipeline tf.data's guides build: list_files, then interleave
// (or flat_map) opening each file (auto_shard_dataset_test.py's pipelines).
TEST(RecordsDatasetTest, ListFilesInterleaveFromRecords) {
  TempDir dir;
  for (std::int64_t f = 0; f < 3; ++f) {
    RecordWriter w(dir.str() + "/part-" + std::to_string(f) + ".rec");
    for (std::int64_t r = 0; r < 3; ++r) {
      std::int64_t id = f * 10 + r;
      w.write_features({TensorView(&id, {}, DType::kInt64)});
    }
    w.close();
  }
  RecordOptions opts;
  opts.features = {{"x", DType::kInt64, {}}};
  const Dataset files = Dataset::list_files({dir.str() + "/part-*.rec"}, /*shuffle=*/false);
  auto read = [opts](Element e) { return Dataset::from_records({Dataset::file_name(e)}, opts); };
  EXPECT_EQ(values(files.interleave(read, 2, 2)), (std::vector<std::int64_t>{0, 1, 10, 11, 2, 12, 20, 21, 22}));
  EXPECT_EQ(values(files.flat_map(read)), (std::vector<std::int64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22}));
  // A missing file surfaces from inside the interleave, naming it.
  const std::string msg = error_of([&] {
    values(files.flat_map(
        [opts](Element e) { return Dataset::from_records({Dataset::file_name(e) + ".gone"}, opts); }));
  });
  EXPECT_NE(msg.find("part-0.rec.gone"), std::string::npos) << msg;
}
#endif

}  // namespace
}  // namespace strata
