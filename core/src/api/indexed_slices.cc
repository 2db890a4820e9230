// SPDX-License-Identifier: Apache-2.0
// IndexedSlices (tf.IndexedSlices) and its cross-replica reduction: gathered
// rows, as tf.distribute reduces sparse gradients, never densified.
#include <cstring>
#include <string>

#include "api/kernels.h"
#include "api/strategy_impl.h"
#include "strata/strategy.hpp"
#include "strata/values.hpp"

namespace strata {

void IndexedSlices::check(const char* what) const {
  STRATA_ENFORCE(indices.ndim() == 1 && indices.dtype() == DType::kInt64, STRATA_ERR_INVALID_ARGUMENT, what,
                 ": indices must be an int64 vector, got ", dtype_name(indices.dtype()), " of rank ",
                 indices.ndim());
  STRATA_ENFORCE(!dense_shape.empty() && values.ndim() == static_cast<std::int64_t>(dense_shape.size()),
                 STRATA_ERR_INVALID_ARGUMENT, what, ": values have rank ", values.ndim(), " but dense_shape has ",
                 dense_shape.size(), " dimensions; values are rows [n, dense_shape[1:]...]");
  const auto vs = values.shape();
  STRATA_ENFORCE(vs[0] == indices.shape()[0], STRATA_ERR_INVALID_ARGUMENT, what, ": ", vs[0],
                 " rows of values but ", indices.shape()[0], " indices; give one index per row");
  for (std::size_t d = 1; d < dense_shape.size(); ++d)
    STRATA_ENFORCE(vs[d] == dense_shape[d], STRATA_ERR_INVALID_ARGUMENT, what, ": a row has size ", vs[d],
                   " in dimension ", d, " but dense_shape has ", dense_shape[d]);
  const auto* idx = indices.data<std::int64_t>();
  for (std::int64_t i = 0; i < vs[0]; ++i)
    STRATA_ENFORCE(idx[i] >= 0 && idx[i] < dense_shape[0], STRATA_ERR_INVALID_ARGUMENT, what, ": index ", idx[i],
                   " (row ", i, ") is outside [0, ", dense_shape[0], ")");
}

Tensor IndexedSlices::to_dense() const {
  check("IndexedSlices::to_dense");
  Tensor out = Tensor::zeros(dense_shape, values.dtype());
  const std::int64_t rows = values.shape()[0];
  if (rows == 0) return out;
  const std::size_t row_bytes = values.nbytes() / static_cast<std::size_t>(rows);
  const std::vector<std::int64_t> row_shape(dense_shape.begin() + 1, dense_shape.end());
  const auto* idx = indices.data<std::int64_t>();
  for (std::int64_t i = 0; i < rows; ++i) {
    DLTensor src = values.dl();
    src.data = static_cast<char*>(values.raw_data()) + static_cast<std::size_t>(i) * row_bytes;
    src.byte_offset = 0;
    src.ndim = static_cast<std::int32_t>(row_shape.size());
    src.shape = const_cast<std::int64_t*>(row_shape.data());
    src.strides = nullptr;
    DLTensor dst = src;
    dst.data = static_cast<char*>(out.raw_data()) + static_cast<std::size_t>(idx[i]) * row_bytes;
    detail::add_into(dst, src, 1);
  }
  return out;
}

namespace {
// MEAN of gathered rows: every replica's rows, each scaled by 1/N, so that
// the dense sum of the result is the mean of the replicas' dense values.
IndexedSlices finish(ReduceOp op, Tensor values, Tensor indices, std::vector<std::int64_t> dense_shape,
                     int replicas) {
  if (op == ReduceOp::MEAN) detail::divide_by(values.mutable_dl(), replicas);
  return IndexedSlices{std::move(values), std::move(indices), std::move(dense_shape)};
}
}  // namespace

IndexedSlices ReplicaContext::all_reduce(ReduceOp op, const IndexedSlices& value) {
  value.check("ReplicaContext::all_reduce of IndexedSlices");
  // The dense shapes must agree: gathered as one row per replica.
  Tensor shapes = all_gather(Tensor::from_vector(value.dense_shape, {1, static_cast<std::int64_t>(value.dense_shape.size())}), 0);
  const auto* sh = shapes.data<std::int64_t>();
  const std::size_t rank = value.dense_shape.size();
  for (std::int64_t r = 0; r < shapes.shape()[0]; ++r)
    for (std::size_t d = 0; d < rank; ++d)
      STRATA_ENFORCE(sh[static_cast<std::size_t>(r) * rank + d] == value.dense_shape[d], STRATA_ERR_INVALID_ARGUMENT,
                     "ReplicaContext::all_reduce of IndexedSlices: replica ", r, " has dense dimension ", d, " = ",
                     sh[static_cast<std::size_t>(r) * rank + d], " but replica ", replica_id_in_sync_group(),
                     " has ", value.dense_shape[d], "; every replica must reduce slices of the same dense shape");
  Tensor values = all_gather(value.values, 0);
  Tensor indices = all_gather(value.indices, 0);
  return finish(op, std::move(values), std::move(indices), value.dense_shape, num_replicas_in_sync());
}

IndexedSlices Strategy::reduce(ReduceOp op, const std::vector<IndexedSlices>& per_replica) {
  STRATA_ENFORCE(static_cast<int>(per_replica.size()) == num_local_replicas(), STRATA_ERR_INVALID_ARGUMENT,
                 "Strategy::reduce of IndexedSlices: got ", per_replica.size(), " values but this process has ",
                 num_local_replicas(), " replicas; pass one per local replica");
  std::vector<Tensor> values, indices, shapes;
  for (std::size_t i = 0; i < per_replica.size(); ++i) {
    const IndexedSlices& s = per_replica[i];
    s.check("Strategy::reduce of IndexedSlices");
    STRATA_ENFORCE(s.dense_shape == per_replica[0].dense_shape, STRATA_ERR_INVALID_ARGUMENT,
                   "Strategy::reduce of IndexedSlices: local replica ", i,
                   "'s dense_shape differs from local replica 0's; every replica must reduce slices of the same "
                   "dense shape");
    values.push_back(s.values.clone());
    indices.push_back(s.indices.clone());
    shapes.push_back(Tensor::from_vector(s.dense_shape, {1, static_cast<std::int64_t>(s.dense_shape.size())}));
  }
  Tensor all_shapes = gather(PerReplica(std::move(shapes)), 0);
  const auto& want = per_replica.at(0).dense_shape;
  const auto* sh = all_shapes.data<std::int64_t>();
  for (std::int64_t r = 0; r < all_shapes.shape()[0]; ++r)
    STRATA_ENFORCE(std::equal(want.begin(), want.end(), sh + static_cast<std::size_t>(r) * want.size()),
                   STRATA_ERR_INVALID_ARGUMENT, "Strategy::reduce of IndexedSlices: replica ", r,
                   " has another dense_shape than this process's replicas; every replica must reduce slices of "
                   "the same dense shape");
  Tensor v = gather(PerReplica(std::move(values)), 0);
  Tensor ix = gather(PerReplica(std::move(indices)), 0);
  return finish(op, std::move(v), std::move(ix), want, num_replicas_in_sync());
}

}  // namespace strata
