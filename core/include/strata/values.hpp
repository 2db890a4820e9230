// SPDX-License-Identifier: Apache-2.0
// Distributed values (tf.distribute.DistributedValues): one Tensor per local
// replica, in local replica order. PerReplica holds a possibly different
// value per replica (what run() returns, per-replica inputs); Mirrored holds
// the same value on every replica (broadcast results, reduce_to
// destinations). Both own their tensors and are move-only; clone() copies.
//
// Thread-safety: like std::vector; concurrent reads are fine, and each
// replica may use its own component concurrently with the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/error.hpp"
#include "strata/export.hpp"
#include "strata/tensor.hpp"

namespace strata {

/// tf.distribute.ReduceOp.
enum class ReduceOp { SUM, MEAN };

/// The C ABI operator of `op`.
inline strata_reduce_op to_c(ReduceOp op) {
  return op == ReduceOp::SUM ? STRATA_REDUCE_SUM : STRATA_REDUCE_MEAN;
}

/// "SUM" or "MEAN" (tf.distribute.ReduceOp's values).
inline const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::SUM ? "SUM" : "MEAN"; }

/// tf.distribute.ReduceOp("SUM"): the op of that exact name;
/// InvalidArgumentError for any other (TF's ValueError), "sum" included.
inline ReduceOp reduce_op_from_name(const std::string& name) {
  if (name == "SUM") return ReduceOp::SUM;
  if (name == "MEAN") return ReduceOp::MEAN;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "'", name,
               "' is not a valid ReduceOp; use \"SUM\" or \"MEAN\" (upper case, as tf.distribute.ReduceOp)");
}

class DistributedValues {
 public:
  DistributedValues() = default;
  explicit DistributedValues(std::vector<Tensor> values) : values_(std::move(values)) {}
  DistributedValues(DistributedValues&&) noexcept = default;
  DistributedValues& operator=(DistributedValues&&) noexcept = default;

  /// Number of components (= local replicas of the strategy it came from).
  std::size_t size() const { return values_.size(); }
  /// Component of local replica `i`; throws OutOfRangeError when i >= size().
  const Tensor& operator[](std::size_t i) const {
    STRATA_ENFORCE(i < values_.size(), STRATA_ERR_OUT_OF_RANGE, "local replica index ", i,
                   " out of range; this value has ", values_.size(), " components");
    return values_[i];
  }
  Tensor& operator[](std::size_t i) {
    STRATA_ENFORCE(i < values_.size(), STRATA_ERR_OUT_OF_RANGE, "local replica index ", i,
                   " out of range; this value has ", values_.size(), " components");
    return values_[i];
  }
  const std::vector<Tensor>& values() const { return values_; }
  /// Take the components out (this value becomes empty).
  std::vector<Tensor> release() { return std::move(values_); }

 protected:
  ~DistributedValues() = default;
  std::vector<Tensor> clone_values() const {
    std::vector<Tensor> out;
    out.reserve(values_.size());
    for (const Tensor& t : values_) out.push_back(t.clone());
    return out;
  }
  std::vector<Tensor> values_;
};

/// tf.IndexedSlices: the rows `values` ([n, ...]) of a dense tensor of
/// shape `dense_shape` at row `indices` (int64 [n]; a row may repeat, and
/// repeated rows add up). Sparse gradients of embeddings are these: reducing
/// them across replicas gathers every replica's rows instead of adding dense
/// tensors (ReplicaContext::all_reduce, Strategy::reduce), so the cost
/// follows the rows touched, not the table size.
struct STRATA_API IndexedSlices {
  Tensor values;
  Tensor indices;
  std::vector<std::int64_t> dense_shape;

  /// InvalidArgumentError naming the problem unless indices is int64 [n],
  /// values is [n, dense_shape[1:]...] and every index is in
  /// [0, dense_shape[0]). `what` names the value in the message.
  void check(const char* what) const;
  /// The dense tensor: zeros with every row of `values` added at its index
  /// (tf.convert_to_tensor of an IndexedSlices).
  Tensor to_dense() const;
};

/// A value per local replica (tf.distribute PerReplica).
class PerReplica : public DistributedValues {
 public:
  PerReplica() = default;
  explicit PerReplica(std::vector<Tensor> values) : DistributedValues(std::move(values)) {}
  PerReplica clone() const { return PerReplica(clone_values()); }
};

/// The same value on every local replica (tf.distribute Mirrored).
class Mirrored : public DistributedValues {
 public:
  Mirrored() = default;
  explicit Mirrored(std::vector<Tensor> values) : DistributedValues(std::move(values)) {}
  Mirrored clone() const { return Mirrored(clone_values()); }
  /// The value (component of local replica 0).
  const Tensor& primary() const { return (*this)[0]; }
};

}  // namespace strata
