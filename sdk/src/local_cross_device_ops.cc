// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/local_cross_device_ops.hpp"

#include <cstring>
#include <string>

#include "strata/error.hpp"
#include "strata/sdk/options.hpp"

namespace strata::sdk {
namespace {

// The request token of an operation that already completed.
struct DoneRequest {
  uint64_t magic = 0x5354524154415251ull;
};

std::string where(const char* what, uint32_t t, uint32_t r) {
  return std::string(what) + " tensor " + std::to_string(t) + " of replica " + std::to_string(r);
}

}  // namespace

LocalCrossDeviceOps::LocalCrossDeviceOps(Host host, const char* options_json)
    : host_(std::move(host)) {
  check_known_keys(parse_options(options_json, "local cross_device_ops"), {}, "local cross_device_ops");
}

LocalCrossDeviceOps::~LocalCrossDeviceOps() {
  for (void* r : requests_) delete static_cast<DoneRequest*>(r);
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
    check_tensor(*first, what + std::string(" ") + where("input", t, 0));
    const int64_t count = element_count(*first);
    auto check_one = [&](const DLTensor* x, const std::string& name) {
      if (x == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, ": ", name, " is NULL");
      check_tensor(*x, what + std::string(" ") + name);
      if (!dtype_equal(x->dtype, first->dtype) || element_count(*x) != count)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, ": ", name, " is ", tensor_string(*x),
                     " but ", where("input", t, 0), " is ", tensor_string(*first),
                     "; every tensor of a group must have the same dtype and element count");
    };
    for (uint32_t r = 1; r < nr; ++r) check_one(inputs[t * nr + r], where("input", t, r));
    for (uint32_t r = 0; r < outputs_per_tensor; ++r)
      check_one(outputs[t * outputs_per_tensor + r], where("output", t, r));
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
  validate_batch("all_reduce", nt, nr, inputs, outputs, nr);
  batch_all_reduce(op, nt, nr, inputs, outputs);
}

void LocalCrossDeviceOps::batch_all_reduce(strata_reduce_op op, uint32_t nt, uint32_t nr,
                                           const DLTensor* const* inputs,
                                           DLTensor* const* outputs) {
  for (uint32_t t = 0; t < nt; ++t) {
    const DLTensor& first = *inputs[t * nr];
    const size_t count = static_cast<size_t>(element_count(first));
    void* dst0 = data_ptr(*outputs[t * nr]);
    reduce_into(op, first.dtype, nr, inputs + t * nr, dst0, count);
    const size_t bytes = count * dtype_size(first.dtype);
    for (uint32_t r = 1; r < nr; ++r) {
      void* dst = data_ptr(*outputs[t * nr + r]);
      if (dst != dst0 && bytes) std::memcpy(dst, dst0, bytes);
    }
  }
}

void LocalCrossDeviceOps::reduce(strata_reduce_op op, uint32_t nt, uint32_t nr,
                                 const DLTensor* const* inputs, DLTensor* const* outputs) {
  validate_batch("reduce", nt, nr, inputs, outputs, 1);
  for (uint32_t t = 0; t < nt; ++t) {
    const DLTensor& first = *inputs[t * nr];
    reduce_into(op, first.dtype, nr, inputs + t * nr, data_ptr(*outputs[t]),
                static_cast<size_t>(element_count(first)));
  }
}

void LocalCrossDeviceOps::broadcast(const DLTensor& src, uint32_t nr, DLTensor* const* dsts) {
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
  auto req = std::make_unique<DoneRequest>();
  requests_.reserve(requests_.size() + 1);
  all_reduce(op, nt, nr, inputs, outputs);
  requests_.insert(req.get());
  return reinterpret_cast<strata_cdo_request_t>(req.release());
}

void LocalCrossDeviceOps::request_wait(strata_cdo_request_t request, int64_t timeout_ms) {
  auto it = requests_.find(request);
  if (it == requests_.end())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT,
                 "request_wait: unknown request (already waited for, or from another instance); "
                 "wait for each started request exactly once");
  requests_.erase(it);
  delete reinterpret_cast<DoneRequest*>(request);
}

}  // namespace strata::sdk
