// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/local_cross_device_ops.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "strata/error.hpp"
#include "strata/sdk/device.hpp"
#include "strata/sdk/options.hpp"

namespace strata::sdk {
namespace {

// Below this many bytes a started batch whose queue is empty is done at once:
// waking the worker costs more than reducing it.
constexpr size_t kInlineBytes = 64 << 10;

std::string where(const char* what, uint32_t t, uint32_t r) {
  return std::string(what) + " tensor " + std::to_string(t) + " of replica " + std::to_string(r);
}

// What check_tensor accepts, without building its message (validation runs
// on every call, so the strings are made only for the error).
bool tensor_ok(const DLTensor& t) {
  if (t.device.device_type != kDLCPU || !dtype_supported(t.dtype)) return false;
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) return false;
  for (int32_t d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0) return false;
  return is_contiguous(t) && (t.data != nullptr || element_count(t) == 0);
}

}  // namespace

// A started batch: the tensors' descriptors copied as 1-D views (the
// caller's pointer arrays and shapes need not outlive the start call; the
// memory they describe must, until request_wait returns).
struct LocalCrossDeviceOps::Request {
  enum State { kQueued, kRunning, kDone };
  strata_reduce_op op = STRATA_REDUCE_SUM;
  uint32_t nt = 0, nr = 0;
  std::vector<int64_t> counts;  // per tensor group
  std::vector<DLTensor> in, out;
  std::vector<const DLTensor*> in_p;
  std::vector<DLTensor*> out_p;
  State state = kQueued;  // guarded by q_mu_
  strata_status_t code = STRATA_OK;
  std::string message;
};

LocalCrossDeviceOps::LocalCrossDeviceOps(Host host, const char* options_json)
    : host_(std::move(host)) {
  check_known_keys(parse_options(options_json, "local cross_device_ops"), {}, "local cross_device_ops");
}

HostStaging& LocalCrossDeviceOps::staging() {
  if (!staging_) staging_ = std::make_unique<HostStaging>(host_);
  return *staging_;
}

LocalCrossDeviceOps::~LocalCrossDeviceOps() {
  shutdown();
  for (void* r : requests_) delete static_cast<Request*>(r);
}

void LocalCrossDeviceOps::shutdown() noexcept {
  {
    std::lock_guard<std::mutex> l(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  // The worker runs what is queued before it exits.
  if (worker_.joinable()) worker_.join();
}

void LocalCrossDeviceOps::execute(Request& req) noexcept {
  try {
    batch_all_reduce(req.op, req.nt, req.nr, req.in_p.data(), req.out_p.data());
  } catch (const Error& e) {
    req.code = e.code() < 0 ? e.code() : STRATA_ERR_INTERNAL;
    req.message = e.what();
  } catch (const std::exception& e) {
    req.code = STRATA_ERR_INTERNAL;
    req.message = std::string("started all_reduce failed: ") + e.what();
  }
}

void LocalCrossDeviceOps::run_queued_locked(const Request* until) {
  for (;;) {
    Request* req;
    {
      std::lock_guard<std::mutex> l(q_mu_);
      if (queue_.empty()) return;
      req = queue_.front();
      queue_.pop_front();
      req->state = Request::kRunning;
    }
    execute(*req);
    {
      std::lock_guard<std::mutex> l(q_mu_);
      req->state = Request::kDone;
    }
    if (req == until) return;
  }
}

void LocalCrossDeviceOps::worker_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(q_mu_);
      q_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
    }
    // Lock order: exec_mu_, then q_mu_. A waiter may have run the batch in
    // the meantime; then the queue is empty and this is a no-op.
    std::lock_guard<ExecGate> g(exec_mu_);
    run_queued_locked(nullptr);
  }
}

void LocalCrossDeviceOps::validate_batch(const char* what, uint32_t nt, uint32_t nr,
                                         const DLTensor* const* inputs,
                                         const DLTensor* const* outputs,
                                         uint32_t outputs_per_tensor) const {
  if (nr == 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, ": num_replicas is 0; pass at least one replica");
  for (uint32_t t = 0; t < nt; ++t) {
    const DLTensor* first = inputs[t * nr];
    if (first == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, where("input", t, 0), " is NULL");
    if (!tensor_ok(*first)) check_tensor(*first, what + std::string(" ") + where("input", t, 0));
    const int64_t count = element_count(*first);
    auto check_one = [&](const DLTensor* x, const char* kind, uint32_t r) {
      if (x == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, ": ", where(kind, t, r), " is NULL");
      if (!tensor_ok(*x)) check_tensor(*x, what + std::string(" ") + where(kind, t, r));
      if (!dtype_equal(x->dtype, first->dtype) || element_count(*x) != count)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, ": ", where(kind, t, r), " is ", tensor_string(*x),
                     " but ", where("input", t, 0), " is ", tensor_string(*first),
                     "; every tensor of a group must have the same dtype and element count");
    };
    for (uint32_t r = 1; r < nr; ++r) check_one(inputs[t * nr + r], "input", r);
    for (uint32_t r = 0; r < outputs_per_tensor; ++r) check_one(outputs[t * outputs_per_tensor + r], "output", r);
  }
}

void LocalCrossDeviceOps::reduce_into(strata_reduce_op op, DLDataType dtype, uint32_t nr,
                                      const DLTensor* const* group, void* dst, size_t count) {
  ptrs_.resize(nr);
  for (uint32_t r = 0; r < nr; ++r) ptrs_[r] = data_ptr(*group[r]);
  kernels::reduce(op, dtype, nr, ptrs_.data(), dst, count, static_cast<double>(nr));
}

void LocalCrossDeviceOps::all_reduce(strata_reduce_op op, uint32_t nt, uint32_t nr,
                                     const DLTensor* const* inputs, DLTensor* const* outputs) {
  if (HostStaging::any_cuda(nt * nr, inputs) || HostStaging::any_cuda(nt * nr, outputs)) {
    std::lock_guard<std::mutex> l(staging_mu_);
    HostStaging& st = staging();
    st.stage(nt * nr, inputs, nt * nr, outputs);
    all_reduce(op, nt, nr, st.inputs(), st.outputs());
    st.finish();
    return;
  }
  std::lock_guard<ExecGate> exec(exec_mu_);
  run_queued_locked(nullptr);  // started batches first, in order
  validate_batch("all_reduce", nt, nr, inputs, outputs, nr);
  batch_all_reduce(op, nt, nr, inputs, outputs);
}

void LocalCrossDeviceOps::batch_all_reduce(strata_reduce_op op, uint32_t nt, uint32_t nr,
                                           const DLTensor* const* inputs,
                                           DLTensor* const* outputs) {
  // Each block of a group's result goes from an L1 buffer straight into
  // every output (inputs read once, outputs written once).
  ptrs_.resize(nr);
  out_ptrs_.resize(nr);
  for (uint32_t t = 0; t < nt; ++t) {
    const DLTensor& first = *inputs[t * nr];
    for (uint32_t r = 0; r < nr; ++r) {
      ptrs_[r] = data_ptr(*inputs[t * nr + r]);
      out_ptrs_[r] = data_ptr(*outputs[t * nr + r]);
    }
    kernels::reduce_broadcast(op, first.dtype, nr, ptrs_.data(), nr, out_ptrs_.data(),
                              static_cast<size_t>(element_count(first)), static_cast<double>(nr));
  }
}

void LocalCrossDeviceOps::reduce(strata_reduce_op op, uint32_t nt, uint32_t nr,
                                 const DLTensor* const* inputs, DLTensor* const* outputs) {
  if (HostStaging::any_cuda(nt * nr, inputs) || HostStaging::any_cuda(nt, outputs)) {
    std::lock_guard<std::mutex> l(staging_mu_);
    HostStaging& st = staging();
    st.stage(nt * nr, inputs, nt, outputs);
    reduce(op, nt, nr, st.inputs(), st.outputs());
    st.finish();
    return;
  }
  std::lock_guard<ExecGate> exec(exec_mu_);
  run_queued_locked(nullptr);  // started batches first, in order
  validate_batch("reduce", nt, nr, inputs, outputs, 1);
  for (uint32_t t = 0; t < nt; ++t) {
    const DLTensor& first = *inputs[t * nr];
    reduce_into(op, first.dtype, nr, inputs + t * nr, data_ptr(*outputs[t]),
                static_cast<size_t>(element_count(first)));
  }
}

void LocalCrossDeviceOps::broadcast(const DLTensor& src, uint32_t nr, DLTensor* const* dsts) {
  const DLTensor* src_p[1] = {&src};
  if (HostStaging::any_cuda(1, src_p) || HostStaging::any_cuda(nr, dsts)) {
    std::lock_guard<std::mutex> l(staging_mu_);
    HostStaging& st = staging();
    st.stage(1, src_p, nr, dsts);
    broadcast(*st.inputs()[0], nr, st.outputs());
    st.finish();
    return;
  }
  std::lock_guard<ExecGate> exec(exec_mu_);
  run_queued_locked(nullptr);  // started batches first, in order
  check_tensor(src, "broadcast source");
  if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "broadcast: num_replicas is 0");
  for (uint32_t r = 0; r < nr; ++r) {
    if (dsts[r] == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "broadcast destination ", r, " is NULL");
    check_tensor(*dsts[r], "broadcast destination " + std::to_string(r));
    if (!dtype_equal(src.dtype, dsts[r]->dtype) || element_count(src) != element_count(*dsts[r]))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "broadcast destination ", r, " is ",
                   tensor_string(*dsts[r]), " but the source is ", tensor_string(src),
                   "; allocate destinations with the source's dtype and element count");
  }
  const size_t bytes = byte_size(src);
  for (uint32_t r = 0; r < nr; ++r) {
    void* d = data_ptr(*dsts[r]);
    if (d != data_ptr(src) && bytes) std::memmove(d, data_ptr(src), bytes);
  }
}

void LocalCrossDeviceOps::all_gather(uint32_t nr, const DLTensor* const* inputs, int32_t axis,
                                     DLTensor* const* outputs) {
  if (HostStaging::any_cuda(nr, inputs) || HostStaging::any_cuda(nr, outputs)) {
    std::lock_guard<std::mutex> l(staging_mu_);
    HostStaging& st = staging();
    st.stage(nr, inputs, nr, outputs);
    all_gather(nr, st.inputs(), axis, st.outputs());
    st.finish();
    return;
  }
  std::lock_guard<ExecGate> exec(exec_mu_);
  run_queued_locked(nullptr);  // started batches first, in order
  if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_gather: num_replicas is 0");
  for (uint32_t r = 0; r < nr; ++r)
    if (outputs[r] == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_gather output ", r, " is NULL");
  concat(inputs, nr, axis, *outputs[0]);
  const size_t bytes = byte_size(*outputs[0]);
  for (uint32_t r = 1; r < nr; ++r) {
    check_tensor(*outputs[r], "all_gather output " + std::to_string(r));
    check_same_type_and_shape(*outputs[0], "all_gather output 0", *outputs[r],
                              "all_gather output " + std::to_string(r));
    void* d = data_ptr(*outputs[r]);
    if (d != data_ptr(*outputs[0]) && bytes) std::memcpy(d, data_ptr(*outputs[0]), bytes);
  }
}

void LocalCrossDeviceOps::reduce_scatter(strata_reduce_op op, uint32_t nr,
                                         const DLTensor* const* inputs, DLTensor* const* outputs) {
  if (HostStaging::any_cuda(nr, inputs) || HostStaging::any_cuda(nr, outputs)) {
    std::lock_guard<std::mutex> l(staging_mu_);
    HostStaging& st = staging();
    st.stage(nr, inputs, nr, outputs);
    reduce_scatter(op, nr, st.inputs(), st.outputs());
    st.finish();
    return;
  }
  std::lock_guard<ExecGate> exec(exec_mu_);
  run_queued_locked(nullptr);  // started batches first, in order
  if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter: num_replicas is 0");
  for (uint32_t r = 0; r < nr; ++r) {
    if (inputs[r] == nullptr || outputs[r] == nullptr)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter: input or output ", r, " is NULL");
    check_tensor(*inputs[r], where("reduce_scatter input", 0, r));
    check_tensor(*outputs[r], where("reduce_scatter output", 0, r));
    check_same_type_and_shape(*inputs[0], "reduce_scatter input of replica 0", *inputs[r],
                              "reduce_scatter input of replica " + std::to_string(r));
  }
  const DLTensor& first = *inputs[0];
  if (first.ndim == 0 || first.shape[0] % nr != 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter input ", tensor_string(first),
                 " cannot be split into ", nr, " equal slices along axis 0; make dimension 0 a "
                 "multiple of the number of replicas");
  const size_t count = static_cast<size_t>(element_count(first));
  const size_t slice = count / nr;
  for (uint32_t r = 0; r < nr; ++r) {
    const DLTensor& o = *outputs[r];
    bool ok = dtype_equal(o.dtype, first.dtype) && o.ndim == first.ndim && o.shape[0] == first.shape[0] / nr;
    for (int32_t d = 1; ok && d < o.ndim; ++d) ok = o.shape[d] == first.shape[d];
    if (!ok)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter output ", r, " is ", tensor_string(o),
                   " but the slice of input ", tensor_string(first), " for ", nr,
                   " replicas has dimension 0 = ", first.shape[0] / nr,
                   "; allocate outputs with that shape");
  }
  const size_t esize = dtype_size(first.dtype);
  scratch_.reserve(count * esize);
  reduce_into(op, first.dtype, nr, inputs, scratch_.data(), count);
  for (uint32_t r = 0; r < nr; ++r)
    if (slice) std::memcpy(data_ptr(*outputs[r]), static_cast<char*>(scratch_.data()) + r * slice * esize, slice * esize);
}

strata_cdo_request_t LocalCrossDeviceOps::all_reduce_start(strata_reduce_op op, uint32_t nt,
                                                           uint32_t nr, const DLTensor* const* inputs,
                                                           DLTensor* const* outputs) {
  if (HostStaging::any_cuda(nt * nr, inputs) || HostStaging::any_cuda(nt * nr, outputs))
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED,
                 "all_reduce_start of GPU tensors: this cross_device_ops stages GPU tensors through host "
                 "memory and has no asynchronous form for them; call all_reduce instead (or use the nccl "
                 "cross_device_ops)");
  validate_batch("all_reduce_start", nt, nr, inputs, outputs, nr);
  auto req = std::make_unique<Request>();
  req->op = op;
  req->nt = nt;
  req->nr = nr;
  const size_t total = static_cast<size_t>(nt) * nr;
  req->counts.resize(nt);
  req->in.resize(total);
  req->out.resize(total);
  size_t bytes = 0;
  for (uint32_t t = 0; t < nt; ++t) {
    req->counts[t] = element_count(*inputs[t * nr]);
    bytes += static_cast<size_t>(req->counts[t]) * dtype_size(inputs[t * nr]->dtype) * nr;
    for (uint32_t r = 0; r < nr; ++r) {
      auto view = [&](const DLTensor& x) {
        DLTensor v{};
        v.data = data_ptr(x);
        v.device = x.device;
        v.ndim = 1;
        v.dtype = x.dtype;
        v.shape = &req->counts[t];
        return v;
      };
      req->in[t * nr + r] = view(*inputs[t * nr + r]);
      req->out[t * nr + r] = view(*outputs[t * nr + r]);
    }
  }
  for (size_t i = 0; i < total; ++i) {
    req->in_p.push_back(&req->in[i]);
    req->out_p.push_back(&req->out[i]);
  }
  requests_.reserve(requests_.size() + 1);
  Request* raw = req.get();
  bool inline_done = false;
  if (bytes < kInlineBytes && exec_mu_.try_lock()) {
    std::lock_guard<ExecGate> exec(exec_mu_, std::adopt_lock);
    bool idle;
    {
      std::lock_guard<std::mutex> l(q_mu_);
      idle = queue_.empty();
      if (idle) raw->state = Request::kRunning;
    }
    if (idle) {
      execute(*raw);
      std::lock_guard<std::mutex> l(q_mu_);
      raw->state = Request::kDone;
      inline_done = true;
    }
  }
  if (!inline_done) {
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    {
      std::lock_guard<std::mutex> l(q_mu_);
      queue_.push_back(raw);
    }
    q_cv_.notify_one();
  }
  requests_.insert(raw);
  return reinterpret_cast<strata_cdo_request_t>(req.release());
}

void LocalCrossDeviceOps::request_wait(strata_cdo_request_t request, int64_t timeout_ms) {
  auto it = requests_.find(request);
  if (it == requests_.end())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "request_wait: unknown request (already waited for, or from another instance); "
                 "wait for each started request exactly once");
  Request* req = reinterpret_cast<Request*>(request);
  auto done = [&] {
    std::lock_guard<std::mutex> l(q_mu_);
    return req->state == Request::kDone;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  while (!done()) {
    // Not finished: take the right to run batches (the worker holds it while
    // it runs one) and run the queue up to this request ourselves.
    bool got;
    if (timeout_ms < 0) {
      exec_mu_.lock();
      got = true;
    } else {
      got = timeout_ms > 0 && exec_mu_.try_lock_until(deadline);
    }
    if (!got) {
      if (done()) break;
      STRATA_THROW(STRATA_ERR_DEADLINE_EXCEEDED, "request_wait: the started all_reduce did not finish within ",
                   timeout_ms, " ms; it is still running: wait again, or destroy the cross_device_ops");
    }
    std::lock_guard<ExecGate> exec(exec_mu_, std::adopt_lock);
    run_queued_locked(req);
  }
  requests_.erase(it);
  std::unique_ptr<Request> owned(req);
  if (owned->code != STRATA_OK) ::strata::detail::throw_status(owned->code, owned->message);
}

}  // namespace strata::sdk
