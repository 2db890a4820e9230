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
#include <utility>
#include <vector>

#include "strata/error.hpp"
#include "strata/tensor.hpp"

namespace strata {

/// tf.distribute.ReduceOp.
enum class ReduceOp { SUM, MEAN };

/// The C ABI operator of `op`.
inline strata_reduce_op to_c(ReduceOp op) {
  return op == ReduceOp::SUM ? STRATA_REDUCE_SUM : STRATA_REDUCE_MEAN;
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
