// SPDX-License-Identifier: Apache-2.0
// CUDA tensors in SDK components, through the host services (ABI 1.4): the
// SDK links no CUDA, so every copy and allocation goes through Host.
//
// Device names: "cpu:<n>" (host memory, kDLCPU), "gpu:<n>" and its alias
// "cuda:<n>" (CUDA device n as CUDA numbers the visible devices, kDLCUDA).
//
// HostStaging: the SDK's host kernels read host memory only, so a component
// that gets kDLCUDA tensors copies them into pinned host buffers, runs the
// host code and copies the results back ("staging"). Correct before fast:
// each staged call copies every GPU tensor twice over PCIe and synchronises.
// Not thread-safe: one per component, used under that component's lock.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/sdk/host.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::sdk {

inline bool on_cuda(const DLTensor& t) { return t.device.device_type == kDLCUDA; }

/// "cpu:<n>" -> {kDLCPU, n}; "gpu:<n>" / "cuda:<n>" -> {kDLCUDA, n} (not
/// checked against the visible devices: see check_devices). Anything else:
/// INVALID_ARGUMENT naming `option`.
DLDevice parse_device_spec(const std::string& device, const std::string& option);
/// "cpu:0", "gpu:1", ...
std::string device_string(DLDevice device);
/// Throw unless every kDLCUDA device in `devices` is visible through the
/// host: FAILED_PRECONDITION "no CUDA device visible: ..." (the host's
/// message) when there is none, INVALID_ARGUMENT naming the ordinal and the
/// visible count when one is out of range. `who` prefixes the message.
void check_devices(const Host& host, const std::vector<DLDevice>& devices, const std::string& who);
/// The visible GPU count, 0 when there is none (or no CUDA, or an old host);
/// never throws.
int32_t visible_gpu_count(const Host& host) noexcept;
/// check_tensor for a tensor of any device: the metadata checks, not the
/// device (kDLCUDA is accepted).
void check_tensor_metadata(const DLTensor& t, const std::string& what);

/// A managed tensor in `device`'s memory (kDLCUDA through host.allocate;
/// kDLCPU as make_tensor). Its deleter frees through the same host table.
ManagedTensorPtr make_device_tensor(const Host& host, DLDataType dtype, const std::vector<int64_t>& shape,
                                    DLDevice device);

class HostStaging {
 public:
  explicit HostStaging(Host host) : host_(std::move(host)) {}
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  ~HostStaging();

  /// Whether any of the tensors lives on a CUDA device.
  static bool any_cuda(uint32_t n, const DLTensor* const* tensors);

  /// Host views of `inputs` (GPU ones copied to host) and `outputs` (GPU
  /// ones get host buffers; an output aliasing an input shares its buffer,
  /// so in-place calls stay in place). Host tensors are passed through.
  /// Valid until the next stage() or destruction.
  void stage(uint32_t num_inputs, const DLTensor* const* inputs, uint32_t num_outputs,
             DLTensor* const* outputs);
  const DLTensor* const* inputs() const { return in_p_.data(); }
  DLTensor* const* outputs() const { return out_p_.data(); }
  /// Copy the staged outputs back to their GPUs (synchronously).
  void finish();

 private:
  struct Entry {
    DLDevice device;
    const char* address;  // device address (data + byte_offset)
    size_t offset;        // in the arena
    size_t bytes;
  };
  size_t place(const DLTensor& t, bool copy_in, bool* found);
  void reserve(size_t bytes);

  Host host_;
  void* pinned_ = nullptr;  // arena: pinned when the host can, else pageable_
  size_t capacity_ = 0;
  AlignedBuffer pageable_;
  std::vector<Entry> entries_;
  std::vector<DLTensor> in_, out_;
  std::vector<const DLTensor*> in_p_;
  std::vector<DLTensor*> out_p_;
  std::vector<uint32_t> out_entry_;  // entry index per output, UINT32_MAX = host tensor
};

}  // namespace strata::sdk
