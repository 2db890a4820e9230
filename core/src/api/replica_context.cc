// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <exception>

#include "api/kernels.h"
#include "api/strategy_impl.h"
#include "strata/strategy.hpp"

namespace strata {

ReplicaContext::ReplicaContext(detail::StrategyImpl* impl, strata_replica_t replica,
                               std::uint32_t local_id)
    : impl_(impl), replica_(replica), local_id_(local_id) {
  replica_id_ = impl_->vt->replica_id_in_sync_group(impl_->handle, replica_);
}

int ReplicaContext::num_replicas_in_sync() const { return impl_->num_replicas_in_sync; }

Strategy& ReplicaContext::strategy() const { return *impl_->view; }

// The result of a collective lives where its input does (GPU input: GPU
// result; the collective writes every element).
static Tensor result_like(const std::vector<std::int64_t>& shape, DType dtype, DLDevice device) {
  return device.device_type == kDLCUDA ? detail::device_tensor(shape, dtype, device) : Tensor::zeros(shape, dtype);
}

Tensor ReplicaContext::all_reduce(ReduceOp op, const TensorView& value) {
  Tensor out = result_like(value.shape(), value.dtype(), value.device());
  const DLTensor* in = &value.dl();
  DLTensor* o = &out.mutable_dl();
  strata_error err;
  strata_error_init(&err);
  detail::check(impl_->vt->replica_all_reduce(impl_->handle, replica_, to_c(op), 1, &in, &o, &err), err,
                "ReplicaContext::all_reduce");
  return out;
}

std::vector<Tensor> ReplicaContext::all_reduce(ReduceOp op, const std::vector<Tensor>& values) {
  std::vector<Tensor> outs;
  std::vector<const DLTensor*> ins;
  std::vector<DLTensor*> optrs;
  outs.reserve(values.size());
  for (const Tensor& v : values) {
    outs.push_back(result_like(v.shape(), v.dtype(), v.dl().device));
    ins.push_back(&v.dl());
    optrs.push_back(&outs.back().mutable_dl());
  }
  strata_error err;
  strata_error_init(&err);
  detail::check(impl_->vt->replica_all_reduce(impl_->handle, replica_, to_c(op),
                                              static_cast<std::uint32_t>(values.size()), ins.data(),
                                              optrs.data(), &err),
                err, "ReplicaContext::all_reduce (batch)");
  return outs;
}

void ReplicaContext::all_reduce_in_place(ReduceOp op, std::vector<Tensor>& values) {
  std::vector<TensorView> views(values.begin(), values.end());
  all_reduce_in_place(op, views);
}

void ReplicaContext::all_reduce_in_place(ReduceOp op, const std::vector<TensorView>& values) {
  // DLTensor copies so that inputs and outputs alias the same memory, which
  // the contract allows.
  std::vector<DLTensor> tensors;
  tensors.reserve(values.size());
  for (const TensorView& v : values) tensors.push_back(v.dl());
  std::vector<const DLTensor*> ins;
  std::vector<DLTensor*> outs;
  for (DLTensor& t : tensors) {
    ins.push_back(&t);
    outs.push_back(&t);
  }
  strata_error err;
  strata_error_init(&err);
  detail::check(impl_->vt->replica_all_reduce(impl_->handle, replica_, to_c(op),
                                              static_cast<std::uint32_t>(tensors.size()), ins.data(),
                                              outs.data(), &err),
                err, "ReplicaContext::all_reduce_in_place");
}

Tensor ReplicaContext::all_gather(const TensorView& value, int axis) {
  const std::int64_t ndim = value.ndim();
  const std::int64_t a = axis < 0 ? axis + ndim : axis;
  STRATA_ENFORCE(a >= 0 && a < ndim, STRATA_ERR_INVALID_ARGUMENT, "all_gather: axis ", axis,
                 " is out of range for a value of rank ", ndim, "; use -rank <= axis < rank");
  DLManagedTensor* out = nullptr;
  strata_error err;
  strata_error_init(&err);
  detail::check(impl_->vt->replica_all_gather(impl_->handle, replica_, &value.dl(),
                                              static_cast<std::int32_t>(a), &out, &err),
                err, "ReplicaContext::all_gather");
  return Tensor::adopt(out);
}

namespace {

enum class MergeKind { kVoid, kTensor, kPerReplica };

// merge_user: taken from local replica 0 (the contract), so it only points
// at that replica's functions.
struct MergeUser {
  detail::StrategyImpl* impl = nullptr;
  MergeKind kind = MergeKind::kVoid;
  const std::function<void(Strategy&)>* fn_void = nullptr;
  const std::function<Tensor(Strategy&, const PerReplica&)>* fn_tensor = nullptr;
  const std::function<PerReplica(Strategy&, const PerReplica&)>* fn_per_replica = nullptr;
};

// replica_arg: one per replica, on that replica's stack. The merge function
// writes results and errors into every replica's slot; each replica reads
// its own after replica_merge_call returned (the plugin's wait orders it).
struct MergeSlot {
  const DLTensor* arg = nullptr;
  std::uint32_t local_id = 0;
  Tensor result;
  std::exception_ptr error;
};

// The merge function runs in cross-replica context on whatever replica
// thread the plugin picks.
class MergeGuard {
 public:
  explicit MergeGuard(detail::StrategyImpl* impl)
      : saved_replica_(detail::tls().replica), saved_merge_(detail::tls().merge) {
    detail::tls().merge = impl;
    detail::tls().replica = nullptr;
  }
  ~MergeGuard() {
    detail::tls().merge = saved_merge_;
    detail::tls().replica = saved_replica_;
  }
  MergeGuard(const MergeGuard&) = delete;
  MergeGuard& operator=(const MergeGuard&) = delete;
  ReplicaContext* caller() const { return saved_replica_; }

 private:
  ReplicaContext* saved_replica_;
  detail::StrategyImpl* saved_merge_;
};

strata_status_t merge_trampoline(void* merge_user, void* const* replica_args, std::uint32_t n,
                                 strata_error* err) {
  auto* u = static_cast<MergeUser*>(merge_user);
  std::vector<MergeSlot*> slots(n);
  for (std::uint32_t i = 0; i < n; ++i) slots[i] = static_cast<MergeSlot*>(replica_args[i]);
  MergeGuard guard(u->impl);
  try {
    Strategy& s = *u->impl->view;
    if (u->kind == MergeKind::kVoid) {
      (*u->fn_void)(s);
      return STRATA_OK;
    }
    std::vector<Tensor> args;
    for (std::uint32_t i = 0; i < n; ++i) args.push_back(Tensor::borrow(*slots[i]->arg));
    const PerReplica per_replica(std::move(args));
    if (u->kind == MergeKind::kTensor) {
      Tensor r = (*u->fn_tensor)(s, per_replica);
      STRATA_ENFORCE(r.defined(), STRATA_ERR_INVALID_ARGUMENT,
                     "merge_call: the merge function returned an empty Tensor; return a value");
      for (std::uint32_t i = 0; i < n; ++i) slots[i]->result = r.clone();
    } else {
      PerReplica r = (*u->fn_per_replica)(s, per_replica);
      STRATA_ENFORCE(r.size() == n, STRATA_ERR_INVALID_ARGUMENT, "merge_call: the merge function returned ",
                     r.size(), " components for ", n, " replicas; return one per replica");
      for (std::uint32_t i = 0; i < n; ++i) slots[i]->result = std::move(r[i]);
    }
    return STRATA_OK;
  } catch (...) {
    const strata_status_t code = detail::status_from_current_exception(err);
    // The replica whose thread ran the function rethrows the original (type
    // kept); the others report that it failed elsewhere.
    const std::exception_ptr original = std::current_exception();
    const std::uint32_t caller = guard.caller() ? guard.caller()->local_replica_id() : 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      slots[i]->error = slots[i]->local_id == caller
                            ? original
                            : std::make_exception_ptr(AbortedError(
                                  std::string("merge_call failed on another replica: ") +
                                  (err ? err->message : strata_status_string(code))));
    }
    return code;
  }
}

Tensor do_merge(detail::StrategyImpl* impl, strata_replica_t replica, std::uint32_t local_id,
                MergeUser& user, const DLTensor* arg) {
  STRATA_ENFORCE(detail::tls().merge == nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "merge_call was called inside a merge function (cross-replica context); call it "
                 "only from a replica function");
  MergeSlot slot;
  slot.arg = arg;
  slot.local_id = local_id;
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st =
      impl->vt->replica_merge_call(impl->handle, replica, &merge_trampoline, &user, &slot, &err);
  if (slot.error) std::rethrow_exception(slot.error);
  detail::check(st, err, "ReplicaContext::merge_call");
  return std::move(slot.result);
}

}  // namespace

void ReplicaContext::merge_call(const std::function<void(Strategy&)>& fn) {
  MergeUser u;
  u.impl = impl_;
  u.kind = MergeKind::kVoid;
  u.fn_void = &fn;
  do_merge(impl_, replica_, local_id_, u, nullptr);
}

Tensor ReplicaContext::merge_call(const std::function<Tensor(Strategy&, const PerReplica&)>& fn,
                                  const TensorView& arg) {
  MergeUser u;
  u.impl = impl_;
  u.kind = MergeKind::kTensor;
  u.fn_tensor = &fn;
  return do_merge(impl_, replica_, local_id_, u, &arg.dl());
}

Tensor ReplicaContext::merge_call_per_replica(
    const std::function<PerReplica(Strategy&, const PerReplica&)>& fn, const TensorView& arg) {
  MergeUser u;
  u.impl = impl_;
  u.kind = MergeKind::kPerReplica;
  u.fn_per_replica = &fn;
  return do_merge(impl_, replica_, local_id_, u, &arg.dl());
}

void* ReplicaContext::stream() const {
  // replica_stream is a 1.4 field: NULL (host replicas only) for older plugins.
  if (!STRATA_HAS_FIELD(impl_->vt, strata_strategy_vtable, replica_stream) || impl_->vt->replica_stream == nullptr)
    return nullptr;
  return impl_->vt->replica_stream(impl_->handle, replica_);
}

}  // namespace strata
