// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/device.hpp"

#include <algorithm>
#include <cstring>

#include "strata/error.hpp"
#include "strata/sdk/kernels.hpp"

namespace strata::sdk {

DLDevice parse_device_spec(const std::string& device, const std::string& option) {
  auto ordinal = [&](size_t prefix) -> int {
    const std::string rest = device.substr(prefix);
    if (rest.empty() || rest.size() > 6 || rest.find_first_not_of("0123456789") != std::string::npos)
      return -1;
    return std::stoi(rest);
  };
  int n = -1;
  DLDeviceType type = kDLCPU;
  if (device.rfind("cpu:", 0) == 0) {
    n = ordinal(4);
  } else if (device.rfind("gpu:", 0) == 0) {
    n = ordinal(4);
    type = kDLCUDA;
  } else if (device.rfind("cuda:", 0) == 0) {
    n = ordinal(5);
    type = kDLCUDA;
  }
  if (n < 0)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "device '", device, "' in option '", option,
                 "' is not of the form \"cpu:<n>\", \"gpu:<n>\" or \"cuda:<n>\" (e.g. \"cpu:0\", \"gpu:0\")");
  return DLDevice{type, n};
}

std::string device_string(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU: return "cpu:" + std::to_string(device.device_id);
    case kDLCUDA: return "gpu:" + std::to_string(device.device_id);
    case kDLCUDAHost: return "cuda_host:" + std::to_string(device.device_id);
    default: return "device_type_" + std::to_string(int(device.device_type)) + ":" + std::to_string(device.device_id);
  }
}

int32_t visible_gpu_count(const Host& host) noexcept {
  if (!host.has_device_services()) return 0;
  int32_t count = 0;
  strata_error err;
  strata_error_init(&err);
  if (host.api()->device_count(host.api(), kDLCUDA, &count, &err) != STRATA_OK) return 0;
  return count;
}

void check_devices(const Host& host, const std::vector<DLDevice>& devices, const std::string& who) {
  bool any = false;
  for (const DLDevice& d : devices) any = any || d.device_type == kDLCUDA;
  if (!any) return;
  if (!host)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, who,
                 ": GPU devices need the host services table (this object was created without one)");
  if (!host.has_device_services())
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, who,
                 ": GPU devices need a host of ABI 1.4 or newer; this host predates the device services");
  int32_t count = 0;
  strata_error err;
  strata_error_init(&err);
  const strata_status_t st = host.api()->device_count(host.api(), kDLCUDA, &count, &err);
  if (st != STRATA_OK)
    ::strata::detail::throw_status(st, ::strata::detail::str_cat(who, ": ", err.message[0] ? err.message : strata_status_string(st)));
  for (const DLDevice& d : devices)
    if (d.device_type == kDLCUDA && d.device_id >= count)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, who, ": device gpu:", d.device_id, " does not exist: ", count,
                   " CUDA device(s) are visible (gpu:0 .. gpu:", count - 1,
                   "); check CUDA_VISIBLE_DEVICES and `nvidia-smi`, or name a visible device");
}

void check_tensor_metadata(const DLTensor& t, const std::string& what) {
  DLTensor tmp = t;
  if (tmp.device.device_type == kDLCUDA || tmp.device.device_type == kDLCUDAHost) tmp.device = DLDevice{kDLCPU, 0};
  check_tensor(tmp, what);
}

namespace {
struct DeviceHolder {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  Host host;
  DLDevice device{};
  void* data = nullptr;
};
void device_holder_deleter(DLManagedTensor* self) {
  auto* h = static_cast<DeviceHolder*>(self->manager_ctx);
  h->host.free_memory(h->device, h->data);
  delete h;
}
}  // namespace

ManagedTensorPtr make_device_tensor(const Host& host, DLDataType dtype, const std::vector<int64_t>& shape,
                                    DLDevice device) {
  if (device.device_type == kDLCPU) return make_tensor(dtype, shape);
  check_dtype_supported(dtype, "new tensor");
  size_t count = 1;
  for (int64_t d : shape) {
    if (d < 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "cannot make a tensor with negative dimension ", d,
                   "; pass a valid shape");
    count *= static_cast<size_t>(d);
  }
  const size_t bytes = count * (dtype.bits / 8) * dtype.lanes;
  auto h = std::make_unique<DeviceHolder>();
  h->shape = shape;
  h->host = host;
  h->device = device;
  h->data = host.allocate(device, bytes, 256);
  if (h->data == nullptr)
    STRATA_THROW(STRATA_ERR_INTERNAL, "cannot allocate ", bytes, " bytes on ", device_string(device),
                 " (out of device memory, or no such device; the host's log has the CUDA error)");
  DLTensor& t = h->managed.dl_tensor;
  t.data = h->data;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &device_holder_deleter;
  return ManagedTensorPtr(&h.release()->managed);
}

// ------------------------------------------------------------ staging ---

HostStaging::~HostStaging() {
  if (pinned_ != nullptr) host_.free_memory(DLDevice{kDLCUDAHost, 0}, pinned_);
}

bool HostStaging::any_cuda(uint32_t n, const DLTensor* const* tensors) {
  for (uint32_t i = 0; i < n; ++i)
    if (tensors[i] != nullptr && on_cuda(*tensors[i])) return true;
  return false;
}

void HostStaging::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (pinned_ != nullptr) host_.free_memory(DLDevice{kDLCUDAHost, 0}, pinned_);
  pinned_ = host_.allocate(DLDevice{kDLCUDAHost, 0}, bytes, 256);
  if (pinned_ == nullptr) pageable_.reserve(bytes);  // still correct, only slower
  capacity_ = bytes;
}

void HostStaging::stage(uint32_t num_inputs, const DLTensor* const* inputs, uint32_t num_outputs,
                        DLTensor* const* outputs) {
  entries_.clear();
  size_t total = 0;
  std::vector<char> copy_in;
  auto entry_of = [&](const DLTensor& t, bool input, const char* what, uint32_t i) -> uint32_t {
    if (!is_contiguous(t))
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " ", i, " on ", device_string(t.device),
                   " is not contiguous; GPU tensors are staged through host memory and must be compact");
    const char* addr = static_cast<const char*>(t.data) + t.byte_offset;
    const size_t bytes = byte_size(t);
    for (uint32_t e = 0; e < entries_.size(); ++e)
      if (entries_[e].address == addr && entries_[e].device.device_type == t.device.device_type &&
          entries_[e].device.device_id == t.device.device_id && entries_[e].bytes == bytes) {
        if (input) copy_in[e] = 1;
        return e;
      }
    entries_.push_back(Entry{t.device, addr, total, bytes});
    copy_in.push_back(input ? 1 : 0);
    total += (bytes + 255) & ~size_t{255};
    return static_cast<uint32_t>(entries_.size() - 1);
  };
  std::vector<uint32_t> in_entry(num_inputs, UINT32_MAX);
  out_entry_.assign(num_outputs, UINT32_MAX);
  for (uint32_t i = 0; i < num_inputs; ++i)
    if (inputs[i] != nullptr && on_cuda(*inputs[i])) in_entry[i] = entry_of(*inputs[i], true, "input", i);
  for (uint32_t i = 0; i < num_outputs; ++i)
    if (outputs[i] != nullptr && on_cuda(*outputs[i])) out_entry_[i] = entry_of(*outputs[i], false, "output", i);
  reserve(std::max<size_t>(total, 256));
  char* base = static_cast<char*>(pinned_ != nullptr ? pinned_ : pageable_.data());
  const DLDevice host_dev = pinned_ != nullptr ? DLDevice{kDLCUDAHost, 0} : DLDevice{kDLCPU, 0};
  for (uint32_t e = 0; e < entries_.size(); ++e)
    if (copy_in[e])
      host_.copy(base + entries_[e].offset, host_dev, entries_[e].address, entries_[e].device, entries_[e].bytes);
  auto view = [&](const DLTensor& t, uint32_t e) {
    DLTensor v = t;
    if (e != UINT32_MAX) {
      v.data = base + entries_[e].offset;
      v.byte_offset = 0;
      v.device = DLDevice{kDLCPU, 0};  // the host kernels' device; the memory may be pinned
    }
    return v;
  };
  in_.resize(num_inputs);
  in_p_.resize(num_inputs);
  for (uint32_t i = 0; i < num_inputs; ++i) {
    if (inputs[i] == nullptr) {
      in_p_[i] = nullptr;
      continue;
    }
    in_[i] = view(*inputs[i], in_entry[i]);
    in_p_[i] = &in_[i];
  }
  out_.resize(num_outputs);
  out_p_.resize(num_outputs);
  for (uint32_t i = 0; i < num_outputs; ++i) {
    if (outputs[i] == nullptr) {
      out_p_[i] = nullptr;
      continue;
    }
    out_[i] = view(*outputs[i], out_entry_[i]);
    out_p_[i] = &out_[i];
  }
}

void HostStaging::finish() {
  const char* base = static_cast<const char*>(pinned_ != nullptr ? pinned_ : pageable_.data());
  const DLDevice host_dev = pinned_ != nullptr ? DLDevice{kDLCUDAHost, 0} : DLDevice{kDLCPU, 0};
  std::vector<char> done(entries_.size(), 0);
  for (uint32_t e : out_entry_) {
    if (e == UINT32_MAX || done[e]) continue;
    done[e] = 1;
    const Entry& x = entries_[e];
    host_.copy(const_cast<char*>(x.address), x.device, base + x.offset, host_dev, x.bytes);
  }
}

}  // namespace strata::sdk
