// SPDX-License-Identifier: Apache-2.0
// Variable partitioners, sharded-variable layouts and round-robin placement
// on parameter servers: tf.distribute.experimental.partitioners and the
// arithmetic ParameterServerStrategy (V2) applies when it creates variables.
//
// Partitioner. A callable `std::vector<int64_t>(shape, dtype)` that returns,
// per axis of `shape`, how many parts to cut it into: TF's partitions list.
// Only axis 0 may be cut, so a valid result is {N, 1, 1, ...} with N >= 1
// and one entry per axis. Users may write their own (any lambda); the three
// built-in ones below compute exactly what TF's classes of the same name
// compute (sharded_variable.py, via partitioned_variables.py's
// min_max_variable_partitioner and variable_axis_size_partitioner) and never
// return more shards than the variable has rows. Partitioners are immutable
// values, cheap to copy and safe to call from any thread. A scalar (rank 0)
// has no axis to cut: calling a built-in partitioner on one is an
// InvalidArgumentError (TF raises too), and partition_variable() never calls
// the partitioner for one (TF skips partitioning rank-0 variables).
//
//   strata::MinSizePartitioner p(/*min_shard_bytes=*/4, /*max_shards=*/2);
//   p({6, 1}, strata::DType::kFloat32);   // {2, 1}
//
// FixedShardsPartitioner(num_shards): min(num_shards, rows) shards. TF
// accepts num_shards <= 0 here and fails later, when the strategy checks the
// partitions; Strata rejects it at construction. A variable with 0 rows gets
// {0, ...}, which validate_partitions() rejects, as TF's strategy does.
//
// MinSizePartitioner(min_shard_bytes, max_shards, bytes_per_string): as many
// shards as possible with each at least min_shard_bytes:
// max(1, min(rows, max_shards, ceil(total_bytes / min_shard_bytes))).
//
// MaxSizePartitioner(max_shard_bytes, max_shards, bytes_per_string): as few
// shards as possible with each at most max_shard_bytes, where a shard holds
// whole rows and at least one: rows_per_shard = max(1, floor(max_shard_bytes
// / row_bytes)), shards = ceil(rows / rows_per_shard), then capped at
// max_shards unless max_shards is 0 (TF's None: no cap). A variable with no
// elements (a 0 dimension) is an InvalidArgumentError (TF divides by zero).
//
// bytes_per_string: TF's estimate of one string element's size. Strata has
// no string dtype, so it never enters the arithmetic; it is kept (validated,
// readable) for API parity with TF.
//
// Arithmetic is exact integer math. TF uses Python floats for the two byte
// quotients; the results are identical while the variable is below 2^53
// bytes (8 PiB), which covers every variable that fits in memory.
//
// ShardLayout. How TF cuts a variable of R rows into N shards along axis 0
// ("div" strategy): N is first capped at R; the first R % N shards get
// R / N + 1 rows, the rest R / N; shard i starts where shard i-1 ends.
//
//   strata::shard_layout({10, 3}, 3);   // rows 4,3,3 at offsets 0,4,7
//   strata::shard_layout({2, 8}, 5);    // capped: rows 1,1 at offsets 0,1
//
// Placement. ParameterServerStrategy places variables on ps tasks round
// robin in creation order: the k-th variable created in scope() goes to ps
// task k % num_ps. Each shard of a sharded variable is created (and counted)
// as its own variable, in shard order, so the shards of one variable take
// consecutive slots and the next variable continues after the last shard
// (TF's _create_variable_round_robin in parameter_server_strategy_v2.py).
// With 2 ps: a = 2 shards -> ps 0, 1; b (unsharded) -> ps 0; c = 3 shards ->
// ps 1, 0, 1.
//
// Errors: every bad argument is an InvalidArgumentError naming the argument
// and the value received; all are recoverable (nothing was created).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "strata/export.hpp"
#include "strata/tensor.hpp"

namespace strata {

/// tf.distribute.experimental.partitioners.Partitioner: maps a variable's
/// shape and dtype to the number of parts per axis ({N, 1, ...}). Any
/// callable with this signature is a partitioner.
using Partitioner =
    std::function<std::vector<std::int64_t>(const std::vector<std::int64_t>& shape, DType dtype)>;

/// A fixed number of shards, capped at the number of rows.
class STRATA_API FixedShardsPartitioner {
 public:
  /// num_shards < 1: InvalidArgumentError.
  explicit FixedShardsPartitioner(std::int64_t num_shards);
  std::vector<std::int64_t> operator()(const std::vector<std::int64_t>& shape, DType dtype) const;
  std::int64_t num_shards() const { return num_shards_; }

 private:
  std::int64_t num_shards_;
};

/// Shards of at least min_shard_bytes each, as many as allowed (at most
/// max_shards, at most one per row, at least one).
class STRATA_API MinSizePartitioner {
 public:
  /// Any argument < 1: InvalidArgumentError naming it.
  explicit MinSizePartitioner(std::int64_t min_shard_bytes = 256 << 10, std::int64_t max_shards = 1,
                              std::int64_t bytes_per_string = 16);
  std::vector<std::int64_t> operator()(const std::vector<std::int64_t>& shape, DType dtype) const;
  std::int64_t min_shard_bytes() const { return min_shard_bytes_; }
  std::int64_t max_shards() const { return max_shards_; }
  /// Unused: Strata has no string dtype (kept for parity with TF).
  std::int64_t bytes_per_string() const { return bytes_per_string_; }

 private:
  std::int64_t min_shard_bytes_;
  std::int64_t max_shards_;
  std::int64_t bytes_per_string_;
};

/// Shards of at most max_shard_bytes each (whole rows, at least one row per
/// shard), as few as possible; max_shards (0 = no limit, TF's None) takes
/// precedence, so shards may then exceed max_shard_bytes.
class STRATA_API MaxSizePartitioner {
 public:
  /// max_shard_bytes < 1, max_shards < 0, bytes_per_string < 1:
  /// InvalidArgumentError naming the argument.
  explicit MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards = 0,
                              std::int64_t bytes_per_string = 16);
  std::vector<std::int64_t> operator()(const std::vector<std::int64_t>& shape, DType dtype) const;
  std::int64_t max_shard_bytes() const { return max_shard_bytes_; }
  /// 0: no limit.
  std::int64_t max_shards() const { return max_shards_; }
  /// Unused: Strata has no string dtype (kept for parity with TF).
  std::int64_t bytes_per_string() const { return bytes_per_string_; }

 private:
  std::int64_t max_shard_bytes_;
  std::int64_t max_shards_;
  std::int64_t bytes_per_string_;
};

/// Checks what a partitioner returned for a variable of `shape`, as
/// ParameterServerStrategy does before creating it: one entry per axis,
/// partitions[0] >= 1, every other entry 1 (the strategy then makes
/// min(partitions[0], rows) shards). InvalidArgumentError otherwise
/// (TF's ValueError "variable_partitioner must return a list/tuple whose
/// elements are 1 besides the first element (non-zero)"). Stricter than TF
/// in two places, both of which TF only fails on later or not at all: the
/// length must equal the rank, and a negative first entry is rejected here.
STRATA_API void validate_partitions(const std::vector<std::int64_t>& partitions,
                                    const std::vector<std::int64_t>& shape);

/// One shard of a variable split along axis 0.
struct ShardSpec {
  std::int64_t row_offset = 0;      ///< first row of the full variable in this shard
  std::int64_t num_rows = 0;        ///< rows in this shard
  std::vector<std::int64_t> shape;  ///< {num_rows, shape[1:]...}
};

/// A variable's shards along axis 0, in order; they tile the rows exactly.
struct STRATA_API ShardLayout {
  std::vector<std::int64_t> shape;  ///< the full variable's shape
  std::vector<ShardSpec> shards;

  std::int64_t num_shards() const { return static_cast<std::int64_t>(shards.size()); }
  /// The shard holding `row` of the full variable and the row's index in it
  /// (for routing scatter updates and sparse reads). Row out of range:
  /// OutOfRangeError.
  std::pair<std::int64_t, std::int64_t> locate_row(std::int64_t row) const;
};

/// TF's uneven split of `shape` (rank >= 1, no negative dimension) into
/// min(num_shards, rows) shards, the first rows % n one row larger. With 0
/// rows only num_shards == 1 is valid (one empty shard: an unsharded
/// variable); TF cannot build a sharded variable of no shards. Invalid
/// arguments: InvalidArgumentError.
STRATA_API ShardLayout shard_layout(const std::vector<std::int64_t>& shape, std::int64_t num_shards);

/// What ParameterServerStrategy creates for a variable of `shape` and
/// `dtype` (TF's _create_variable): without a partitioner, or for a scalar,
/// a plain variable; otherwise the partitioner's result, validated; a plain
/// variable when partitions[0] == 1, else a sharded variable of
/// min(partitions[0], rows) shards. Note TF's order of checks: a custom
/// partitioner that returns {5, 1} for a 1-row variable yields a sharded
/// variable with one shard.
struct VariablePartition {
  bool sharded = false;  ///< a ShardedVariable (else one plain variable)
  ShardLayout layout;    ///< plain: one shard spanning the variable (a scalar: num_rows 1, shape {})
};
STRATA_API VariablePartition partition_variable(const std::vector<std::int64_t>& shape, DType dtype,
                                                const Partitioner& partitioner);

/// The ps task of the variable created `creation_index`-th (0-based,
/// counting every shard as one variable) in a cluster of num_ps ps tasks:
/// creation_index % num_ps. creation_index < 0 or num_ps < 1:
/// InvalidArgumentError.
STRATA_API int ps_task_for_variable(std::int64_t creation_index, int num_ps);

/// The creation counter of one strategy: hands out ps tasks round robin as
/// variables (and shards) are created. Thread-safe: the shards of one
/// place_shards() call always take consecutive slots, even when other
/// threads create variables at the same time.
class STRATA_API RoundRobinPlacer {
 public:
  /// num_ps < 1: InvalidArgumentError.
  explicit RoundRobinPlacer(int num_ps);
  /// The ps task of the next plain variable.
  int place();
  /// The ps tasks of the next sharded variable's shards, in shard order.
  /// num_shards < 1: InvalidArgumentError.
  std::vector<int> place_shards(std::int64_t num_shards);
  /// Variables (shards counted one each) placed so far.
  std::int64_t created() const { return count_.load(); }
  int num_ps() const { return num_ps_; }

 private:
  int num_ps_;
  std::atomic<std::int64_t> count_{0};
};

}  // namespace strata
