// SPDX-License-Identifier: Apache-2.0
#include "strata/distribute.hpp"

#include "api/kernels.h"
#include "api/strategy_impl.h"

namespace strata {

Strategy& get_strategy() { return *detail::current_impl().view; }

bool has_strategy() { return detail::current_non_default() != nullptr; }

bool in_cross_replica_context() {
  const detail::ThreadState& t = detail::tls();
  if (t.merge != nullptr) return true;
  if (t.replica != nullptr) return false;
  return detail::current_non_default() != nullptr;
}

ReplicaContext* get_replica_context() {
  const detail::ThreadState& t = detail::tls();
  if (t.merge != nullptr) return nullptr;
  if (t.replica != nullptr) return t.replica;
  if (detail::current_non_default() != nullptr) return nullptr;
  return detail::default_impl().default_replica.get();
}

namespace {

void require_replica_or_default(const char* what) {
  STRATA_ENFORCE(!(has_strategy() && in_cross_replica_context()), STRATA_ERR_FAILED_PRECONDITION,
                 "You are calling ", what,
                 " in cross-replica context, while it was expected to be called in replica "
                 "context; call it inside Strategy::run");
}

}  // namespace

Tensor compute_average_loss(const TensorView& per_example_loss, std::optional<std::int64_t> global_batch_size,
                            std::optional<TensorView> sample_weight) {
  const DLTensor& loss = per_example_loss.dl();
  detail::check_host_compact(loss, "per_example_loss");
  const DType dtype = per_example_loss.dtype();
  STRATA_ENFORCE(is_floating(dtype), STRATA_ERR_INVALID_ARGUMENT,
                 "compute_average_loss: per_example_loss has dtype ", dtype_name(dtype),
                 "; pass a floating-point loss");
  STRATA_ENFORCE(loss.ndim >= 1, STRATA_ERR_INVALID_ARGUMENT,
                 "compute_average_loss: per_example_loss is a scalar; pass one loss per example "
                 "(rank >= 1)");
  double total = 0;
  if (sample_weight) {
    const DLTensor& w = sample_weight->dl();
    detail::check_host_compact(w, "sample_weight");
    const std::int64_t n = detail::numel(loss), wn = detail::numel(w);
    // Broadcast as TF does for the shapes that occur: a scalar weight, one
    // weight per loss element, or one weight per example (leading dim).
    std::int64_t inner = 0;
    if (w.ndim == 0 || wn == 1) {
      inner = n;
    } else if (wn == n) {
      inner = 1;
    } else if (w.ndim == 1 && wn == loss.shape[0]) {
      inner = wn ? n / wn : 0;
    }
    STRATA_ENFORCE(inner > 0 || n == 0, STRATA_ERR_INVALID_ARGUMENT,
                   "compute_average_loss: sample_weight of shape ", detail::shape_string(w),
                   " cannot be broadcast to per_example_loss of shape ", detail::shape_string(loss),
                   "; pass a scalar, the loss's shape, or [batch]");
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t wi = (w.ndim == 0 || wn == 1) ? 0 : i / inner;
      total += detail::load_double(loss, i) * detail::load_double(w, wi);
    }
  } else {
    total = detail::sum_all(loss);
  }
  std::int64_t global = 0;
  if (global_batch_size) {
    global = *global_batch_size;
    STRATA_ENFORCE(global > 0, STRATA_ERR_INVALID_ARGUMENT,
                   "compute_average_loss: global_batch_size must be positive, got ", global);
  } else {
    require_replica_or_default("compute_average_loss");
    global = loss.shape[0] * get_strategy().num_replicas_in_sync();
  }
  // div_no_nan, as TF: an empty global batch gives 0 instead of NaN.
  const double result = global == 0 ? 0.0 : total / static_cast<double>(global);
  return Tensor::from_doubles({result}, {}, dtype);
}

Tensor scale_regularization_loss(const TensorView& regularization_loss) {
  require_replica_or_default("scale_regularization_loss");
  const DLTensor& loss = regularization_loss.dl();
  detail::check_host_compact(loss, "regularization_loss");
  const DType dtype = regularization_loss.dtype();
  STRATA_ENFORCE(is_floating(dtype), STRATA_ERR_INVALID_ARGUMENT,
                 "scale_regularization_loss: the loss has dtype ", dtype_name(dtype),
                 "; pass a floating-point loss");
  const double r = detail::sum_all(loss) / get_strategy().num_replicas_in_sync();
  return Tensor::from_doubles({r}, {}, dtype);
}

}  // namespace strata
