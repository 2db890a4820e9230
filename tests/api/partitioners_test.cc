// SPDX-License-Identifier: Apache-2.0
// Partitioners, shard layouts and ps placement against the numbers TF
// computes: TF's own test cases (sharded_variable_test.py,
// parameter_server_strategy_v2_test.py), and tables worked out by hand from
// the formulas in partitioned_variables.py (each cross-checked with a
// Python transcription of TF's float arithmetic).
#include "strata/partitioners.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "strata/error.hpp"

namespace strata {
namespace {

using Shape = std::vector<std::int64_t>;

// Runs `fn`, which must throw InvalidArgumentError whose message contains
// every one of `parts`.
template <class Fn>
void expect_invalid(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT);
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::vector<std::int64_t> rows_of(const ShardLayout& l) {
  std::vector<std::int64_t> r;
  for (const auto& s : l.shards) r.push_back(s.num_rows);
  return r;
}

std::vector<std::int64_t> offsets_of(const ShardLayout& l) {
  std::vector<std::int64_t> r;
  for (const auto& s : l.shards) r.push_back(s.row_offset);
  return r;
}

// ---------------------------------------------------------------------------
// TF's PartitionerTest (sharded_variable_test.py), case for case.

TEST(PartitionerTest, TfFixedShardsPartitioner) {
  // test_fixed_shards_partitioner
  EXPECT_EQ(FixedShardsPartitioner(2)({10, 3}, DType::kFloat32), (Shape{2, 1}));
}

TEST(PartitionerTest, TfMinSizePartitioner) {
  // test_min_size_partitioner: [6, 1] float32 = 24 bytes; 24 / 4 = 6 wanted.
  EXPECT_EQ(MinSizePartitioner(4, 2)({6, 1}, DType::kFloat32), (Shape{2, 1}));
  EXPECT_EQ(MinSizePartitioner(4, 10)({6, 1}, DType::kFloat32), (Shape{6, 1}));
}

TEST(PartitionerTest, TfMaxSizePartitioner) {
  // test_max_size_partitioner: a row is 4 bytes.
  EXPECT_EQ(MaxSizePartitioner(4)({6, 1}, DType::kFloat32), (Shape{6, 1}));
  EXPECT_EQ(MaxSizePartitioner(4, 2)({6, 1}, DType::kFloat32), (Shape{2, 1}));
  EXPECT_EQ(MaxSizePartitioner(1024)({6, 1}, DType::kFloat32), (Shape{1, 1}));
}

TEST(PartitionerTest, TfMinMaxDocstringExample) {
  // min_max_variable_partitioner's docstring: float32 [1024, 1024] with the
  // 256 KiB default gives 4 MiB / 256 KiB = 16 shards, or max_partitions if
  // fewer.
  EXPECT_EQ(MinSizePartitioner(256 << 10, 16)({1024, 1024}, DType::kFloat32), (Shape{16, 1}));
  EXPECT_EQ(MinSizePartitioner(256 << 10, 64)({1024, 1024}, DType::kFloat32), (Shape{16, 1}));
  EXPECT_EQ(MinSizePartitioner(256 << 10, 5)({1024, 1024}, DType::kFloat32), (Shape{5, 1}));
}

TEST(PartitionerTest, DefaultsAreTfs) {
  MinSizePartitioner min;
  EXPECT_EQ(min.min_shard_bytes(), 256 << 10);
  EXPECT_EQ(min.max_shards(), 1);
  EXPECT_EQ(min.bytes_per_string(), 16);
  MaxSizePartitioner max(100);
  EXPECT_EQ(max.max_shards(), 0);  // TF's None
  EXPECT_EQ(max.bytes_per_string(), 16);
  // max_shards = 1 by default: even a huge variable stays in one shard.
  EXPECT_EQ(min({1 << 20, 1024}, DType::kFloat64), (Shape{1, 1}));
}

// ---------------------------------------------------------------------------
// Tables from TF's formulas.

struct MinCase {
  Shape shape;
  DType dtype;
  std::int64_t min_shard_bytes, max_shards, want;
};

TEST(PartitionerTest, MinSizeTable) {
  // max(1, min(rows, max_shards, ceil(elements * dtype_size / min_shard_bytes))), e.g.
  //   [1000, 10] f32, 999:  40000 / 999  = 40.04 -> 41 (rows 1000, max 100)
  //   [1000, 10] f32, 1001: 40000 / 1001 = 39.96 -> 40
  //   [10, 3] f16, 7: 60 / 7 = 8.57 -> 9;  [10, 3] bf16, 1: 60 wanted, 10 rows -> 10
  //   [300000] u8, 256 KiB: 300000 / 262144 = 1.14 -> 2
  //   [0, 4] and [7, 0]: 0 bytes -> 0 wanted -> max(1, 0) = 1
  const std::vector<MinCase> cases = {
      {{1024, 1024}, DType::kFloat32, 256 << 10, 100, 16},
      {{1024, 1024}, DType::kFloat64, 256 << 10, 100, 32},
      {{1000, 10}, DType::kFloat32, 1000, 100, 40},
      {{1000, 10}, DType::kFloat32, 1001, 100, 40},
      {{1000, 10}, DType::kFloat32, 999, 100, 41},
      {{10, 3}, DType::kFloat16, 7, 100, 9},
      {{10, 3}, DType::kBFloat16, 1, 100, 10},
      {{5}, DType::kUInt8, 1, 1, 1},
      {{100}, DType::kInt32, 256 << 10, 1, 1},
      {{300000}, DType::kUInt8, 256 << 10, 4, 2},
      {{0, 4}, DType::kFloat32, 1, 10, 1},
      {{7, 0}, DType::kFloat32, 1, 10, 1},
      {{1}, DType::kFloat64, 1, 10, 1},
      {{3, 2, 2}, DType::kInt64, 10, 5, 3},
      {{64, 64}, DType::kFloat32, 256 << 10, 4, 1},
      {{10}, DType::kInt64, 64 << 20, 2, 1},  // testPartitionToOne's partitioner
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.shape) + " " + dtype_name(c.dtype) + " min " +
                 std::to_string(c.min_shard_bytes) + " max " + std::to_string(c.max_shards));
    Shape want(c.shape.size(), 1);
    want[0] = c.want;
    EXPECT_EQ(MinSizePartitioner(c.min_shard_bytes, c.max_shards)(c.shape, c.dtype), want);
  }
}

struct MaxCase {
  Shape shape;
  DType dtype;
  std::int64_t max_shard_bytes, max_shards, want;
};

TEST(PartitionerTest, MaxSizeTable) {
  // rows_per_shard = max(1, floor(max_shard_bytes / row_bytes)),
  // shards = ceil(rows / rows_per_shard), then min(max_shards) unless 0, e.g.
  //   [1000, 10] f32, 399: row 40 B, 399 / 40 = 9.97 -> 9 rows, 1000 / 9 = 111.1 -> 112
  //   [1000, 10] f32, 39: less than a row -> 1 row per shard -> 1000
  //   [10, 3] f16, 18: row 6 B -> 3 rows, 10 / 3 = 3.3 -> 4
  //   [65536, 1024] f32, (64 MiB - 1), TF's suggested limit: row 4 KiB,
  //     67108863 / 4096 = 16383.99 -> 16383 rows, 65536 / 16383 = 4.0002 -> 5
  //     (exactly 64 MiB gives 16384 rows and 4 shards)
  const std::vector<MaxCase> cases = {
      {{1000, 10}, DType::kFloat32, 400, 0, 100},
      {{1000, 10}, DType::kFloat32, 399, 0, 112},
      {{1000, 10}, DType::kFloat32, 401, 0, 100},
      {{1000, 10}, DType::kFloat32, 39, 0, 1000},
      {{1000, 10}, DType::kFloat32, 39, 7, 7},
      {{1000, 10}, DType::kFloat32, 39, 1, 1},
      {{6, 1}, DType::kFloat32, 4, 1, 1},
      {{1000, 10}, DType::kFloat32, 400, 1000, 100},
      {{10, 3}, DType::kFloat16, 7, 0, 10},
      {{10, 3}, DType::kFloat16, 12, 0, 5},
      {{10, 3}, DType::kFloat16, 13, 0, 5},
      {{10, 3}, DType::kFloat16, 18, 0, 4},
      {{1, 100}, DType::kFloat64, 1, 0, 1},
      {{1024, 1024}, DType::kFloat32, (64 << 20) - 1, 0, 1},
      {{65536, 1024}, DType::kFloat32, (64 << 20) - 1, 0, 5},
      {{65536, 1024}, DType::kFloat32, 64 << 20, 0, 4},
      {{7}, DType::kUInt8, 2, 0, 4},
      {{7}, DType::kInt64, 16, 0, 4},
      {{3, 2, 2}, DType::kInt32, 32, 0, 2},
      {{5}, DType::kBFloat16, 1, 0, 5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.shape) + " " + dtype_name(c.dtype) + " max_bytes " +
                 std::to_string(c.max_shard_bytes) + " max_shards " + std::to_string(c.max_shards));
    Shape want(c.shape.size(), 1);
    want[0] = c.want;
    EXPECT_EQ(MaxSizePartitioner(c.max_shard_bytes, c.max_shards)(c.shape, c.dtype), want);
  }
}

TEST(PartitionerTest, FixedShardsTable) {
  EXPECT_EQ(FixedShardsPartitioner(4)({3}, DType::kInt32), (Shape{3}));  // testNumPartitionsLargerThanSize
  EXPECT_EQ(FixedShardsPartitioner(4)({10}, DType::kInt32), (Shape{4}));
  EXPECT_EQ(FixedShardsPartitioner(1)({5, 5}, DType::kFloat64), (Shape{1, 1}));
  EXPECT_EQ(FixedShardsPartitioner(7)({7, 2, 3}, DType::kUInt8), (Shape{7, 1, 1}));
  EXPECT_EQ(FixedShardsPartitioner(100)({1}, DType::kFloat16), (Shape{1}));
  // 0 rows: TF returns [0, 1], which the strategy then rejects.
  EXPECT_EQ(FixedShardsPartitioner(3)({0, 5}, DType::kFloat32), (Shape{0, 1}));
  // The dtype does not matter.
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                  DType::kInt64, DType::kUInt8})
    EXPECT_EQ(FixedShardsPartitioner(3)({9, 9}, d), (Shape{3, 1}));
}

TEST(PartitionerTest, NeverMoreShardsThanRows) {
  const std::vector<DType> dtypes = {DType::kUInt8, DType::kFloat16, DType::kFloat32, DType::kInt64};
  for (std::int64_t rows = 1; rows <= 40; ++rows)
    for (std::int64_t cols : {1, 3, 17})
      for (DType d : dtypes)
        for (std::int64_t limit : {1, 2, 5, 64, 1000}) {
          const Shape shape{rows, cols};
          for (const auto& parts :
               {FixedShardsPartitioner(limit)(shape, d), MinSizePartitioner(1, limit)(shape, d),
                MinSizePartitioner(limit, 1000)(shape, d), MaxSizePartitioner(limit)(shape, d),
                MaxSizePartitioner(limit, limit)(shape, d)}) {
            ASSERT_EQ(parts.size(), 2u);
            EXPECT_GE(parts[0], 1);
            EXPECT_LE(parts[0], rows) << rows << "x" << cols << " limit " << limit;
            EXPECT_EQ(parts[1], 1);
          }
          // MaxSize keeps its promise whenever a row fits and max_shards does
          // not bind: every shard (ceil(rows / n) rows at most) fits.
          const std::int64_t row_bytes = cols * static_cast<std::int64_t>(dtype_size(d));
          if (row_bytes <= limit) {
            const std::int64_t n = MaxSizePartitioner(limit)(shape, d)[0];
            EXPECT_LE((rows + n - 1) / n * row_bytes, limit);
          }
        }
}

TEST(PartitionerTest, OneRowVariables) {
  EXPECT_EQ(FixedShardsPartitioner(8)({1, 1000}, DType::kFloat32), (Shape{1, 1}));
  EXPECT_EQ(MinSizePartitioner(1, 8)({1, 1000}, DType::kFloat32), (Shape{1, 1}));
  EXPECT_EQ(MaxSizePartitioner(1)({1, 1000}, DType::kFloat32), (Shape{1, 1}));
}

TEST(PartitionerTest, ZeroRowVariables) {
  // MinSize: max(1, .) gives one shard; MaxSize: TF divides by zero.
  EXPECT_EQ(MinSizePartitioner(1, 8)({0, 3}, DType::kFloat32), (Shape{1, 1}));
  expect_invalid([] { MaxSizePartitioner(16)({0, 3}, DType::kFloat32); }, {"MaxSizePartitioner", "[0, 3]"});
  expect_invalid([] { MaxSizePartitioner(16)({4, 0}, DType::kFloat32); }, {"MaxSizePartitioner", "[4, 0]"});
}

TEST(PartitionerTest, UsableAsPartitioner) {
  auto custom = [](const Shape&, DType) { return Shape{2, 1}; };
  std::vector<Partitioner> all = {FixedShardsPartitioner(3), MinSizePartitioner(4, 3), MaxSizePartitioner(8),
                                  custom};
  EXPECT_EQ(all[0]({6, 2}, DType::kFloat32), (Shape{3, 1}));
  EXPECT_EQ(all[1]({6, 2}, DType::kFloat32), (Shape{3, 1}));  // 48 B / 4 = 12, capped at 3
  EXPECT_EQ(all[2]({6, 2}, DType::kFloat32), (Shape{6, 1}));  // row 8 B -> 1 row per shard
  EXPECT_EQ(all[3]({6, 2}, DType::kFloat32), (Shape{2, 1}));
}

// ---------------------------------------------------------------------------
// Validation errors.

TEST(PartitionerTest, ConstructorErrorsNameTheArgument) {
  expect_invalid([] { FixedShardsPartitioner(0); }, {"`num_shards`", "Received: 0"});
  expect_invalid([] { FixedShardsPartitioner(-3); }, {"`num_shards`", "Received: -3"});

  expect_invalid([] { MinSizePartitioner(0); }, {"`min_shard_bytes`", "Received: 0"});
  expect_invalid([] { MinSizePartitioner(-1, 4); }, {"`min_shard_bytes`", "Received: -1"});
  expect_invalid([] { MinSizePartitioner(1, 0); }, {"`max_shards`", "Received: 0"});
  expect_invalid([] { MinSizePartitioner(1, -2); }, {"`max_shards`", "Received: -2"});
  expect_invalid([] { MinSizePartitioner(1, 1, 0); }, {"`bytes_per_string`", "Received: 0"});
  // TF checks in declaration order: the first bad argument is reported.
  expect_invalid([] { MinSizePartitioner(0, 0, 0); }, {"`min_shard_bytes`"});
  expect_invalid([] { MinSizePartitioner(1, 0, 0); }, {"`max_shards`"});

  expect_invalid([] { MaxSizePartitioner(0); }, {"`max_shard_bytes`", "Received: 0"});
  expect_invalid([] { MaxSizePartitioner(-5); }, {"`max_shard_bytes`", "Received: -5"});
  expect_invalid([] { MaxSizePartitioner(1, -1); }, {"`max_shards`", "Received: -1"});
  expect_invalid([] { MaxSizePartitioner(1, 0, 0); }, {"`bytes_per_string`", "Received: 0"});
  expect_invalid([] { MaxSizePartitioner(0, -1, 0); }, {"`max_shard_bytes`"});
  EXPECT_NO_THROW(MaxSizePartitioner(1, 0));  // 0 max_shards = TF's None
}

TEST(PartitionerTest, CallErrors) {
  for (const auto& p :
       std::vector<Partitioner>{FixedShardsPartitioner(2), MinSizePartitioner(), MaxSizePartitioner(16)}) {
    expect_invalid([&] { p({}, DType::kFloat32); }, {"axis 0", "[]"});
    expect_invalid([&] { p({4, -1}, DType::kFloat32); }, {"`shape`", "[4, -1]", "negative"});
  }
  expect_invalid([] { MinSizePartitioner(1, 2)({1LL << 40, 1LL << 40}, DType::kFloat64); }, {"too large"});
}

TEST(PartitionerTest, ValidatePartitions) {
  // testInvalidPartitioner: a rank-3 variable and [], [0, 1, 1], [2, 2, 1].
  const Shape shape{2, 2, 2};
  for (const Shape& bad : {Shape{}, Shape{0, 1, 1}, Shape{2, 2, 1}, Shape{-1, 1, 1}, Shape{2, 1},
                           Shape{2, 1, 1, 1}, Shape{1, 1, 0}})
    expect_invalid([&] { validate_partitions(bad, shape); }, {"variable_partitioner", "[2, 2, 2]"});
  EXPECT_NO_THROW(validate_partitions({2, 1, 1}, shape));
  EXPECT_NO_THROW(validate_partitions({1, 1, 1}, shape));
  EXPECT_NO_THROW(validate_partitions({9, 1, 1}, shape));  // more than rows: capped later, as in TF
  expect_invalid([] { validate_partitions({}, {}); }, {"variable_partitioner"});
}

// ---------------------------------------------------------------------------
// Layouts.

TEST(ShardLayoutTest, UnevenSplitFirstShardsLarger) {
  // 10 rows / 3 = 3 rem 1: the first shard gets the extra row.
  ShardLayout l = shard_layout({10, 3}, 3);
  EXPECT_EQ(rows_of(l), (Shape{4, 3, 3}));
  EXPECT_EQ(offsets_of(l), (Shape{0, 4, 7}));
  EXPECT_EQ(l.shards[1].shape, (Shape{3, 3}));
  EXPECT_EQ(l.shape, (Shape{10, 3}));
  // parameter_server_strategy_v2.py's comment and testNonCallableInitialValue.
  l = shard_layout({10}, 4);
  EXPECT_EQ(rows_of(l), (Shape{3, 3, 2, 2}));
  EXPECT_EQ(offsets_of(l), (Shape{0, 3, 6, 8}));
  // 100 = 7 * 14 + 2.
  l = shard_layout({100, 2}, 7);
  EXPECT_EQ(rows_of(l), (Shape{15, 15, 14, 14, 14, 14, 14}));
  EXPECT_EQ(offsets_of(l), (Shape{0, 15, 30, 44, 58, 72, 86}));
}

TEST(ShardLayoutTest, TfTestLayouts) {
  // test_scatter_add_uneven_partition: 32 rows as 11, 11, 10.
  EXPECT_EQ(rows_of(shard_layout({32, 1}, 3)), (Shape{11, 11, 10}));
  // test_scatter_ops_even_partition: 30 rows as 10, 10, 10.
  EXPECT_EQ(rows_of(shard_layout({30, 1}, 3)), (Shape{10, 10, 10}));
  // test_slicing: 8 rows as 3, 3, 2; test_embedding_lookup: 5 rows as 2, 2, 1.
  EXPECT_EQ(rows_of(shard_layout({8, 2}, 3)), (Shape{3, 3, 2}));
  EXPECT_EQ(rows_of(shard_layout({5, 2}, 3)), (Shape{2, 2, 1}));
  // testBasic: [5, 2] and [6, 1] in 2 shards; testCustomPartitionAwareInitializer: [4, 4].
  EXPECT_EQ(rows_of(shard_layout({5, 2}, 2)), (Shape{3, 2}));
  EXPECT_EQ(rows_of(shard_layout({6, 1}, 2)), (Shape{3, 3}));
  EXPECT_EQ(rows_of(shard_layout({4, 4}, 2)), (Shape{2, 2}));
  // testNumPartitionsLargerThanSize: 3 rows in 4 shards -> 3 shards of 1.
  EXPECT_EQ(rows_of(shard_layout({3}, 4)), (Shape{1, 1, 1}));
}

TEST(ShardLayoutTest, CappedAtRows) {
  ShardLayout l = shard_layout({2, 8}, 5);
  EXPECT_EQ(l.num_shards(), 2);
  EXPECT_EQ(rows_of(l), (Shape{1, 1}));
  EXPECT_EQ(offsets_of(l), (Shape{0, 1}));
  EXPECT_EQ(rows_of(shard_layout({1, 3}, 4)), (Shape{1}));
  EXPECT_EQ(rows_of(shard_layout({7}, 7)), (Shape{1, 1, 1, 1, 1, 1, 1}));
}

TEST(ShardLayoutTest, ZeroRows) {
  ShardLayout l = shard_layout({0, 3}, 1);
  ASSERT_EQ(l.num_shards(), 1);
  EXPECT_EQ(l.shards[0].num_rows, 0);
  EXPECT_EQ(l.shards[0].shape, (Shape{0, 3}));
  expect_invalid([] { shard_layout({0, 3}, 2); }, {"0 rows", "[0, 3]"});
}

TEST(ShardLayoutTest, Errors) {
  expect_invalid([] { shard_layout({4}, 0); }, {"`num_shards`", "Received: 0"});
  expect_invalid([] { shard_layout({4}, -2); }, {"`num_shards`", "Received: -2"});
  expect_invalid([] { shard_layout({}, 1); }, {"`shape`", "[]"});
  expect_invalid([] { shard_layout({-4, 2}, 1); }, {"`shape`", "[-4, 2]"});
}

TEST(ShardLayoutTest, EveryRowsAndShardsCombination) {
  // The closed form: n = min(shards, rows); shard i has rows/n + (i < rows%n).
  for (std::int64_t rows = 1; rows <= 50; ++rows)
    for (std::int64_t shards = 1; shards <= 60; ++shards) {
      ShardLayout l = shard_layout({rows, 2, 3}, shards);
      const std::int64_t n = std::min(shards, rows);
      ASSERT_EQ(l.num_shards(), n);
      std::int64_t next = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto& s = l.shards[static_cast<std::size_t>(i)];
        EXPECT_EQ(s.row_offset, next);
        EXPECT_EQ(s.num_rows, rows / n + (i < rows % n ? 1 : 0)) << rows << "/" << shards << " shard " << i;
        EXPECT_EQ(s.shape, (Shape{s.num_rows, 2, 3}));
        next += s.num_rows;
      }
      EXPECT_EQ(next, rows);
    }
}

TEST(ShardLayoutTest, LocateRow) {
  ShardLayout l = shard_layout({10, 3}, 3);  // 4, 3, 3
  using P = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(l.locate_row(0), (P{0, 0}));
  EXPECT_EQ(l.locate_row(3), (P{0, 3}));
  EXPECT_EQ(l.locate_row(4), (P{1, 0}));
  EXPECT_EQ(l.locate_row(6), (P{1, 2}));
  EXPECT_EQ(l.locate_row(7), (P{2, 0}));
  EXPECT_EQ(l.locate_row(9), (P{2, 2}));
  EXPECT_THROW(l.locate_row(10), OutOfRangeError);
  EXPECT_THROW(l.locate_row(-1), OutOfRangeError);
  // test_scatter_add_uneven_partition's indices 0, 10, 11, 12, 30, 31 over 11, 11, 10.
  ShardLayout s = shard_layout({32, 1}, 3);
  EXPECT_EQ(s.locate_row(10), (P{0, 10}));
  EXPECT_EQ(s.locate_row(11), (P{1, 0}));
  EXPECT_EQ(s.locate_row(12), (P{1, 1}));
  EXPECT_EQ(s.locate_row(30), (P{2, 8}));
  EXPECT_EQ(s.locate_row(31), (P{2, 9}));
  for (std::int64_t r = 0; r < 32; ++r) {
    auto [shard, local] = s.locate_row(r);
    EXPECT_EQ(s.shards[static_cast<std::size_t>(shard)].row_offset + local, r);
  }
  EXPECT_THROW(shard_layout({0, 2}, 1).locate_row(0), OutOfRangeError);
}

// ---------------------------------------------------------------------------
// What ParameterServerStrategy creates.

TEST(PartitionVariableTest, NoPartitionerOrScalarIsPlain) {
  VariablePartition p = partition_variable({4}, DType::kInt32, nullptr);  // testDefaultNoPartition
  EXPECT_FALSE(p.sharded);
  EXPECT_EQ(rows_of(p.layout), (Shape{4}));
  int calls = 0;
  Partitioner counting = [&](const Shape&, DType) {
    ++calls;
    return Shape{};
  };
  p = partition_variable({}, DType::kFloat32, counting);
  EXPECT_FALSE(p.sharded);
  EXPECT_EQ(calls, 0);  // TF skips the partitioner for rank-0 variables
  ASSERT_EQ(p.layout.num_shards(), 1);
  EXPECT_EQ(p.layout.shards[0].shape, Shape{});
}

TEST(PartitionVariableTest, TfStrategyCases) {
  // testNonCallableInitialValue: FixedShardsPartitioner(4), 10 rows.
  VariablePartition p = partition_variable({10}, DType::kInt32, FixedShardsPartitioner(4));
  EXPECT_TRUE(p.sharded);
  EXPECT_EQ(rows_of(p.layout), (Shape{3, 3, 2, 2}));
  // testNumPartitionsLargerThanSize: 4 shards of 3 rows -> 3.
  p = partition_variable({3}, DType::kInt32, FixedShardsPartitioner(4));
  EXPECT_TRUE(p.sharded);
  EXPECT_EQ(rows_of(p.layout), (Shape{1, 1, 1}));
  // testPartitionToOne: MinSize(64 MiB, 2) on 10 int64 -> a plain variable.
  p = partition_variable({10}, DType::kInt64, MinSizePartitioner(64 << 20, 2));
  EXPECT_FALSE(p.sharded);
  EXPECT_EQ(rows_of(p.layout), (Shape{10}));
  // testBasic: FixedShardsPartitioner(2) on [5, 2] and [6, 1].
  EXPECT_EQ(rows_of(partition_variable({5, 2}, DType::kInt64, FixedShardsPartitioner(2)).layout),
            (Shape{3, 2}));
  EXPECT_EQ(rows_of(partition_variable({6, 1}, DType::kInt64, FixedShardsPartitioner(2)).layout),
            (Shape{3, 3}));
  // testInvalidPartitioner.
  for (const Shape& bad : {Shape{}, Shape{0, 1, 1}, Shape{2, 2, 1}}) {
    Partitioner user = [bad](const Shape&, DType) { return bad; };
    expect_invalid([&] { partition_variable({2, 2, 2}, DType::kInt32, user); }, {"variable_partitioner"});
  }
}

TEST(PartitionVariableTest, TfOrderOfChecks) {
  // TF compares partitions[0] with 1 before capping at the row count: a
  // custom {5, 1} on one row is a sharded variable of one shard.
  VariablePartition p = partition_variable({1, 3}, DType::kFloat32, [](const Shape&, DType) {
    return Shape{5, 1};
  });
  EXPECT_TRUE(p.sharded);
  EXPECT_EQ(rows_of(p.layout), (Shape{1}));
}

TEST(PartitionVariableTest, ZeroRows) {
  // MinSize: one plain, empty variable.
  VariablePartition p = partition_variable({0, 5}, DType::kFloat32, MinSizePartitioner(1, 4));
  EXPECT_FALSE(p.sharded);
  EXPECT_EQ(rows_of(p.layout), (Shape{0}));
  // FixedShards returns {0, 1}: the strategy's check rejects it.
  expect_invalid(
      [] {
        partition_variable({0, 5}, DType::kFloat32, FixedShardsPartitioner(3));
      },
      {"variable_partitioner", "[0, 1]"});
  // MaxSize: no row size.
  expect_invalid(
      [] {
        partition_variable({0, 5}, DType::kFloat32, MaxSizePartitioner(8));
      },
      {"MaxSizePartitioner"});
  // A custom partitioner asking for several shards of nothing.
  expect_invalid(
      [] {
        partition_variable({0, 5}, DType::kFloat32, [](const Shape&, DType) { return Shape{3, 1}; });
      },
      {"0 rows"});
}

// ---------------------------------------------------------------------------
// Placement on parameter servers.

TEST(PlacementTest, RoundRobinInCreationOrder) {
  for (int k = 0; k < 10; ++k) EXPECT_EQ(ps_task_for_variable(k, 1), 0);
  const std::vector<int> two = {0, 1, 0, 1, 0, 1};
  const std::vector<int> three = {0, 1, 2, 0, 1, 2};
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(ps_task_for_variable(k, 2), two[static_cast<std::size_t>(k)]);
    EXPECT_EQ(ps_task_for_variable(k, 3), three[static_cast<std::size_t>(k)]);
  }
  EXPECT_EQ(ps_task_for_variable(1000000007, 3), 1000000007 % 3);
}

TEST(PlacementTest, TfStrategyPlacements) {
  // parameter_server_strategy_v2_test.py runs 2 ps tasks.
  {  // testNonCallableInitialValue: 4 shards -> ps 0, 1, 0, 1.
    RoundRobinPlacer ps(2);
    EXPECT_EQ(ps.place_shards(4), (std::vector<int>{0, 1, 0, 1}));
  }
  {  // testNumPartitionsLargerThanSize: 3 shards -> 0, 1, 0.
    RoundRobinPlacer ps(2);
    EXPECT_EQ(ps.place_shards(3), (std::vector<int>{0, 1, 0}));
  }
  {  // testBasic: v1 and v2 of 2 shards each -> 0, 1 and again 0, 1.
    RoundRobinPlacer ps(2);
    EXPECT_EQ(ps.place_shards(2), (std::vector<int>{0, 1}));
    EXPECT_EQ(ps.place_shards(2), (std::vector<int>{0, 1}));
  }
  {  // testPartitionToOne: two plain variables -> 0, then 1.
    RoundRobinPlacer ps(2);
    EXPECT_EQ(ps.place(), 0);
    EXPECT_EQ(ps.place(), 1);
    EXPECT_EQ(ps.created(), 2);
  }
}

TEST(PlacementTest, ShardsContinueTheRoundRobin) {
  RoundRobinPlacer one(1);
  EXPECT_EQ(one.place_shards(3), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(one.place(), 0);

  RoundRobinPlacer two(2);
  EXPECT_EQ(two.place_shards(2), (std::vector<int>{0, 1}));     // a
  EXPECT_EQ(two.place(), 0);                                    // b
  EXPECT_EQ(two.place_shards(3), (std::vector<int>{1, 0, 1}));  // c
  EXPECT_EQ(two.created(), 6);

  RoundRobinPlacer three(3);
  EXPECT_EQ(three.place_shards(2), (std::vector<int>{0, 1}));
  EXPECT_EQ(three.place(), 2);
  EXPECT_EQ(three.place_shards(4), (std::vector<int>{0, 1, 2, 0}));
  EXPECT_EQ(three.place(), 1);
  EXPECT_EQ(three.created(), 8);
  // The same as asking ps_task_for_variable for indices 8, 9, ...
  EXPECT_EQ(three.place_shards(2),
            (std::vector<int>{ps_task_for_variable(8, 3), ps_task_for_variable(9, 3)}));
}

TEST(PlacementTest, ConcurrentShardsStayConsecutive) {
  RoundRobinPlacer ps(3);
  constexpr int kThreads = 4, kVars = 200, kShards = 5;
  std::vector<std::vector<std::vector<int>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int v = 0; v < kVars; ++v) got[static_cast<std::size_t>(t)].push_back(ps.place_shards(kShards));
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ps.created(), static_cast<std::int64_t>(kThreads) * kVars * kShards);
  std::vector<int> per_ps(3, 0);
  for (const auto& vars : got)
    for (const auto& tasks : vars) {
      ASSERT_EQ(tasks.size(), static_cast<std::size_t>(kShards));
      for (int i = 0; i < kShards; ++i) {
        EXPECT_EQ(tasks[static_cast<std::size_t>(i)], (tasks[0] + i) % 3);
        ++per_ps[static_cast<std::size_t>(tasks[static_cast<std::size_t>(i)])];
      }
    }
  // 4000 slots over 3 tasks: 1334, 1333, 1333.
  EXPECT_EQ(per_ps, (std::vector<int>{1334, 1333, 1333}));
}

TEST(PlacementTest, Errors) {
  expect_invalid([] { ps_task_for_variable(0, 0); }, {"`num_ps`", "Received: 0"});
  expect_invalid([] { ps_task_for_variable(0, -1); }, {"`num_ps`", "Received: -1"});
  expect_invalid([] { ps_task_for_variable(-1, 2); }, {"`creation_index`", "Received: -1"});
  expect_invalid([] { RoundRobinPlacer(0); }, {"`num_ps`", "Received: 0"});
  RoundRobinPlacer ps(2);
  expect_invalid([&] { ps.place_shards(0); }, {"`num_shards`", "Received: 0"});
  EXPECT_EQ(ps.created(), 0);
}

}  // namespace
}  // namespace strata
