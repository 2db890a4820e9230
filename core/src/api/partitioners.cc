// SPDX-License-Identifier: Apache-2.0
// The arithmetic of TF's variable partitioners (sharded_variable.py and
// partitioned_variables.py) and of ParameterServerStrategy's variable
// creation (parameter_server_strategy_v2.py), in exact integer math.
#include "strata/partitioners.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "api/kernels.h"
#include "strata/error.hpp"

namespace strata {
namespace {

// Strata shapes are always fully defined; a negative dimension is a caller
// bug (TF's MaxSizePartitioner raises "shape is not fully defined").
void check_dims(const char* who, const std::vector<std::int64_t>& shape) {
  for (std::int64_t d : shape)
    STRATA_ENFORCE(d >= 0, STRATA_ERR_INVALID_ARGUMENT, who, ": argument `shape` ", detail::shape_string(shape),
                   " has a negative dimension");
}

// Every built-in partitioner cuts axis 0, which a scalar lacks. TF raises
// too (min_max_variable_partitioner: "Can not partition variable along axis
// 0"; the other two index past the end).
void check_partitionable(const char* who, const std::vector<std::int64_t>& shape) {
  STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT, who,
                 ": can not partition a variable along axis 0 when its shape is [] (a scalar); "
                 "ParameterServerStrategy never partitions scalars");
  check_dims(who, shape);
}

// Product of shape[from:] times `scale`. Python's ints do not overflow;
// ours would only for a shape whose byte size exceeds 8 EiB, so say so.
std::int64_t checked_product(const char* who, const std::vector<std::int64_t>& shape, std::size_t from,
                             std::int64_t scale) {
  std::int64_t n = scale;
  for (std::size_t i = from; i < shape.size(); ++i)
    STRATA_ENFORCE(!__builtin_mul_overflow(n, shape[i], &n), STRATA_ERR_INVALID_ARGUMENT, who,
                   ": argument `shape` ", detail::shape_string(shape),
                   " is too large (its size in bytes overflows int64)");
  return n;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

std::vector<std::int64_t> axis0(std::size_t rank, std::int64_t n) {
  std::vector<std::int64_t> parts(rank, 1);
  parts[0] = n;
  return parts;
}

}  // namespace

FixedShardsPartitioner::FixedShardsPartitioner(std::int64_t num_shards) : num_shards_(num_shards) {
  STRATA_ENFORCE(num_shards >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "FixedShardsPartitioner: argument `num_shards` must be positive. Received: ", num_shards);
}

std::vector<std::int64_t> FixedShardsPartitioner::operator()(const std::vector<std::int64_t>& shape,
                                                             DType) const {
  check_partitionable("FixedShardsPartitioner", shape);
  return axis0(shape.size(), std::min(num_shards_, shape[0]));
}

MinSizePartitioner::MinSizePartitioner(std::int64_t min_shard_bytes, std::int64_t max_shards,
                                       std::int64_t bytes_per_string)
    : min_shard_bytes_(min_shard_bytes), max_shards_(max_shards), bytes_per_string_(bytes_per_string) {
  // Checked in TF's order, so the first bad argument is the one reported.
  STRATA_ENFORCE(
      min_shard_bytes >= 1, STRATA_ERR_INVALID_ARGUMENT,
      "MinSizePartitioner: argument `min_shard_bytes` must be positive. Received: ", min_shard_bytes);
  STRATA_ENFORCE(max_shards >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "MinSizePartitioner: argument `max_shards` must be positive. Received: ", max_shards);
  STRATA_ENFORCE(
      bytes_per_string >= 1, STRATA_ERR_INVALID_ARGUMENT,
      "MinSizePartitioner: argument `bytes_per_string` must be positive. Received: ", bytes_per_string);
}

std::vector<std::int64_t> MinSizePartitioner::operator()(const std::vector<std::int64_t>& shape,
                                                         DType dtype) const {
  check_partitionable("MinSizePartitioner", shape);
  const std::int64_t total_bytes =
      checked_product("MinSizePartitioner", shape, 0, static_cast<std::int64_t>(dtype_size(dtype)));
  // TF: max(1, min(rows, max_partitions, ceil(total / min_slice_size))). The
  // outer max(1, .) is what gives a 0-row or 0-byte variable one shard.
  const std::int64_t wanted = ceil_div(total_bytes, min_shard_bytes_);
  return axis0(shape.size(), std::max<std::int64_t>(1, std::min({shape[0], max_shards_, wanted})));
}

MaxSizePartitioner::MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards,
                                       std::int64_t bytes_per_string)
    : max_shard_bytes_(max_shard_bytes), max_shards_(max_shards), bytes_per_string_(bytes_per_string) {
  STRATA_ENFORCE(
      max_shard_bytes >= 1, STRATA_ERR_INVALID_ARGUMENT,
      "MaxSizePartitioner: argument `max_shard_bytes` must be positive. Received: ", max_shard_bytes);
  // TF tests `if max_shards and max_shards < 1`: 0 (like None) means no
  // limit, only a negative count is an error.
  STRATA_ENFORCE(max_shards >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "MaxSizePartitioner: argument `max_shards` must be positive (or 0 for no limit). Received: ",
                 max_shards);
  STRATA_ENFORCE(
      bytes_per_string >= 1, STRATA_ERR_INVALID_ARGUMENT,
      "MaxSizePartitioner: argument `bytes_per_string` must be positive. Received: ", bytes_per_string);
}

std::vector<std::int64_t> MaxSizePartitioner::operator()(const std::vector<std::int64_t>& shape,
                                                         DType dtype) const {
  check_partitionable("MaxSizePartitioner", shape);
  const std::int64_t rows = shape[0];
  const std::int64_t row_bytes =
      checked_product("MaxSizePartitioner", shape, 1, static_cast<std::int64_t>(dtype_size(dtype)));
  // TF divides by the row count and then by the row size; either being 0 is
  // a ZeroDivisionError there.
  STRATA_ENFORCE(rows > 0 && row_bytes > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "MaxSizePartitioner: can not partition a variable with no elements (shape ",
                 detail::shape_string(shape), "): its row size is undefined");
  const std::int64_t rows_per_shard = std::max<std::int64_t>(1, max_shard_bytes_ / row_bytes);
  std::int64_t shards = ceil_div(rows, rows_per_shard);
  if (max_shards_ > 0) shards = std::min(shards, max_shards_);
  return axis0(shape.size(), shards);
}

void validate_partitions(const std::vector<std::int64_t>& partitions,
                         const std::vector<std::int64_t>& shape) {
  bool ok = !partitions.empty() && partitions.size() == shape.size() && partitions[0] >= 1;
  for (std::size_t i = 1; ok && i < partitions.size(); ++i) ok = partitions[i] == 1;
  STRATA_ENFORCE(ok, STRATA_ERR_INVALID_ARGUMENT,
                 "variable_partitioner must return one entry per axis whose elements are 1 besides the first "
                 "element (>= 1), got: ",
                 detail::shape_string(partitions), " for a variable of shape ", detail::shape_string(shape));
}

std::pair<std::int64_t, std::int64_t> ShardLayout::locate_row(std::int64_t row) const {
  const std::int64_t rows = shape.empty() ? 0 : shape[0];
  STRATA_ENFORCE(row >= 0 && row < rows, STRATA_ERR_OUT_OF_RANGE, "row ", row,
                 " is out of range for a variable of shape ", detail::shape_string(shape));
  // The first shard whose offset is past `row`, minus one. Binary search
  // rather than TF's closed form so hand-built layouts work too.
  auto it = std::upper_bound(shards.begin(), shards.end(), row,
                             [](std::int64_t r, const ShardSpec& s) { return r < s.row_offset; });
  STRATA_ENFORCE(it != shards.begin(), STRATA_ERR_INTERNAL, "layout of shape ", detail::shape_string(shape),
                 " does not start at row 0");
  const auto& shard = *(it - 1);
  STRATA_ENFORCE(row < shard.row_offset + shard.num_rows, STRATA_ERR_INTERNAL, "layout of shape ",
                 detail::shape_string(shape), " has a gap at row ", row);
  return {static_cast<std::int64_t>((it - 1) - shards.begin()), row - shard.row_offset};
}

ShardLayout shard_layout(const std::vector<std::int64_t>& shape, std::int64_t num_shards) {
  STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT,
                 "shard_layout: argument `shape` is [] (a scalar); variables are sharded along axis 0");
  check_dims("shard_layout", shape);
  STRATA_ENFORCE(num_shards >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "shard_layout: argument `num_shards` must be positive. Received: ", num_shards);
  const std::int64_t rows = shape[0];
  STRATA_ENFORCE(rows > 0 || num_shards == 1, STRATA_ERR_INVALID_ARGUMENT, "shard_layout: can not split ",
                 "a variable of 0 rows (shape ", detail::shape_string(shape), ") into ", num_shards,
                 " shards; TF can not build a sharded variable of no shards");
  ShardLayout layout;
  layout.shape = shape;
  const std::int64_t n = rows == 0 ? 1 : std::min(num_shards, rows);
  const std::int64_t base = rows / n;
  const std::int64_t extra = rows % n;
  layout.shards.reserve(static_cast<std::size_t>(n));
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    ShardSpec s;
    s.row_offset = offset;
    s.num_rows = base + (i < extra ? 1 : 0);
    s.shape = shape;
    s.shape[0] = s.num_rows;
    offset += s.num_rows;
    layout.shards.push_back(std::move(s));
  }
  return layout;
}

VariablePartition partition_variable(const std::vector<std::int64_t>& shape, DType dtype,
                                     const Partitioner& partitioner) {
  check_dims("partition_variable", shape);
  VariablePartition result;
  if (shape.empty()) {
    // A scalar is placed as one variable, partitioner or not.
    result.layout.shards.push_back(ShardSpec{0, 1, {}});
    return result;
  }
  if (!partitioner) {
    result.layout = shard_layout(shape, 1);
    return result;
  }
  const std::vector<std::int64_t> partitions = partitioner(shape, dtype);
  validate_partitions(partitions, shape);
  // TF compares with 1 before capping at the row count, so only an explicit
  // 1 yields a plain variable.
  if (partitions[0] == 1) {
    result.layout = shard_layout(shape, 1);
    return result;
  }
  STRATA_ENFORCE(shape[0] > 0, STRATA_ERR_INVALID_ARGUMENT, "partition_variable: the partitioner asked for ",
                 partitions[0], " shards of a variable with 0 rows (shape ", detail::shape_string(shape),
                 "); TF can not build a sharded variable of no shards");
  result.sharded = true;
  result.layout = shard_layout(shape, partitions[0]);
  return result;
}

int ps_task_for_variable(std::int64_t creation_index, int num_ps) {
  STRATA_ENFORCE(num_ps >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "ps_task_for_variable: argument `num_ps` must be positive. Received: ", num_ps);
  STRATA_ENFORCE(creation_index >= 0, STRATA_ERR_INVALID_ARGUMENT,
                 "ps_task_for_variable: argument `creation_index` must be >= 0. Received: ", creation_index);
  return static_cast<int>(creation_index % num_ps);
}

RoundRobinPlacer::RoundRobinPlacer(int num_ps) : num_ps_(num_ps) {
  STRATA_ENFORCE(num_ps >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "RoundRobinPlacer: argument `num_ps` must be positive. Received: ", num_ps);
}

int RoundRobinPlacer::place() { return ps_task_for_variable(count_.fetch_add(1), num_ps_); }

std::vector<int> RoundRobinPlacer::place_shards(std::int64_t num_shards) {
  STRATA_ENFORCE(num_shards >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "RoundRobinPlacer: argument `num_shards` must be positive. Received: ", num_shards);
  // One fetch_add reserves the whole block, so the shards stay consecutive
  // as in TF (which creates them one after another in one thread).
  const std::int64_t first = count_.fetch_add(num_shards);
  std::vector<int> tasks;
  tasks.reserve(static_cast<std::size_t>(num_shards));
  for (std::int64_t i = 0; i < num_shards; ++i) tasks.push_back(ps_task_for_variable(first + i, num_ps_));
  return tasks;
}

}  // namespace strata
