// SPDX-License-Identifier: Apache-2.0
// The "nccl" CrossDeviceOps (tf.distribute.NcclAllReduce): collectives among
// replicas whose tensors live on CUDA devices, with NCCL; across processes
// through a transport with native collectives on device memory ("nccl").
//
// Options (unknown keys are rejected):
//   "num_packs":   batch all-reduce packing, as NcclAllReduce(num_packs=1):
//                  the tensors of one dtype are copied (cudaMemcpyAsync,
//                  device to device) into one contiguous buffer per replica,
//                  which is split into num_packs near-equal element ranges,
//                  one NCCL all-reduce each; 0 = no packing (one all-reduce
//                  per tensor). Default 1.
//   "bytes_per_pack": when > 0, packs are cut by size instead (a pack takes
//                  the next tensor of its dtype until it holds more than this
//                  many bytes), as CommunicationOptions.bytes_per_pack.
//   "rank", "world_size", "communicator", "transport" ({"name", "options"}
//                  or a name; default "nccl"), "setup_timeout_s": the
//                  cross-process group, as the ring cross_device_ops takes
//                  them (default 0 of 1: this process only, no transport).
//   "timeout_s":   deadline of every collective (default
//                  /timeouts/collective_s, else 300).
//
// Devices. Replica r's tensors must all be on one CUDA device, a different
// one per replica (NCCL cannot join two ranks on one GPU); host (kDLCPU)
// tensors are INVALID_ARGUMENT pointing to "ring" (which stages GPU tensors
// through pinned memory and accepts several replicas per device). One NCCL
// communicator per device is made with ncclCommInitAll over the replicas'
// devices, in replica order, and cached per device list with a stream per
// device (a blocking one, ordered after the legacy default stream).
//
// Streams and blocking. Every call is blocking, as the ABI says: the caller
// must have finished the work that writes the inputs (synchronised the
// streams that produced them, unless that is the legacy default stream)
// before the call; the collectives run on this
// instance's streams, and the call returns once they are done, so outputs
// are ready for any stream. The wait polls cudaStreamQuery and
// ncclCommGetAsyncError; at the deadline it aborts the communicators
// (ncclCommAbort; the transport's comm_abort across processes), drops them
// and throws DEADLINE_EXCEEDED naming the operation; the next call builds
// new ones.
//
// Reductions. SUM, MIN, MAX and PROD are NCCL's. MEAN is NCCL's ncclAvg
// within a process (integers: sum, then truncating division; floating
// types: NCCL pre-multiplies every input by 1/n and sums, which may differ
// from sum-then-divide in the last bit when n is not a power of two).
// float16 and bfloat16 are reduced in NCCL's native arithmetic (as
// tf.distribute's NcclAllReduce does), not in float32 end to end as the
// host cross_device_ops do: use "ring" where bit-exact float32 accumulation
// of 16-bit types matters.
//
// Across processes (world_size > 1), hierarchically: the local replicas
// reduce onto replica 0's device (ncclReduce; MEAN of floating types
// pre-multiplies by 1/(world_size * num_replicas) there), the transport
// all-reduces that buffer across processes on replica 0's stream (SUM; for
// integer MEAN the sum is then divided on the host), and ncclBroadcast
// copies it back to every local replica. One transport communicator per
// process (on replica 0's device) keeps the transport's contract of one
// rank per process; the cost is the local reduce and broadcast, which run
// over NVLink/PCIe and are small next to the network. The transport
// communicator is created at the first collective (the device is known
// only then); every process must make the same calls in the same order.
// all_gather concatenates in (rank, local replica) order; reduce_scatter
// gives local replica r of rank k slice k * num_replicas + r; broadcast
// copies rank 0's source. reduce writes the all-reduced value to
// outputs[t] (host or device) on every process.
//
// Dtypes: float16, bfloat16, float32, float64, int32, int64, uint8.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/c/transport.h"
#include "strata/sdk/kernels.hpp"
#include "strata/sdk/options.hpp"
#include "strata/sdk/plugin.hpp"
#include "strata/sdk/rendezvous.hpp"

namespace strata::plugins::nccl {
namespace {

using sdk::dtype_equal;

constexpr const char* kComponent = "nccl cross_device_ops";
constexpr const char* kUseRing =
    "NcclAllReduce needs GPU replicas (tensors on CUDA devices, one device per replica); for CPU replicas use the "
    "\"ring\" cross_device_ops or the strategy's default";

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    STRATA_THROW(STRATA_ERR_INTERNAL, "nccl cross_device_ops: ", what, " failed: ", cudaGetErrorName(e), " (",
                 cudaGetErrorString(e), ")");
}
void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  STRATA_THROW(r == ncclInvalidArgument || r == ncclInvalidUsage ? STRATA_ERR_INVALID_ARGUMENT : STRATA_ERR_INTERNAL,
               "nccl cross_device_ops: ", what, " failed: ", ncclGetErrorString(r),
               last != nullptr && last[0] != '\0' ? std::string(" (") + last + ")" : std::string());
}

// Restores the calling thread's current device (the caller may be a replica
// thread with its own device current).
class DeviceGuard {
 public:
  DeviceGuard() { ok_ = cudaGetDevice(&saved_) == cudaSuccess; }
  ~DeviceGuard() {
    if (ok_) (void)cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = 0;
  bool ok_ = false;
};

bool is_float_type(DLDataType d) { return d.code == kDLFloat || d.code == kDLBfloat; }

ncclDataType_t nccl_type(DLDataType d, const std::string& what) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 32) return ncclFloat32;
    if (d.code == kDLFloat && d.bits == 64) return ncclFloat64;
    if (d.code == kDLFloat && d.bits == 16) return ncclFloat16;
    if (d.code == kDLBfloat && d.bits == 16) return ncclBfloat16;
    if (d.code == kDLInt && d.bits == 32) return ncclInt32;
    if (d.code == kDLInt && d.bits == 64) return ncclInt64;
    if (d.code == kDLUInt && d.bits == 8) return ncclUint8;
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " has dtype ", sdk::dtype_name(d), "; ", kComponent,
               " supports float16, bfloat16, float32, float64, int32, int64 and uint8");
}
size_t esize(DLDataType d) { return size_t(d.bits) / 8; }

size_t count_of(const DLTensor& t) {
  size_t n = 1;
  for (int32_t k = 0; k < t.ndim; ++k) {
    if (t.shape[k] < 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "tensor has a negative dimension");
    n *= size_t(t.shape[k]);
  }
  return n;
}

bool contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expect = 1;
  for (int32_t k = t.ndim - 1; k >= 0; --k) {
    if (t.shape[k] != 1 && t.strides[k] != expect) return false;
    expect *= t.shape[k];
  }
  return true;
}

void* ptr(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

// Checks one tensor; returns its CUDA device (or -1 for a host tensor,
// where `allow_host`).
int check(const DLTensor* t, const std::string& what, bool allow_host = false) {
  if (t == nullptr) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " is NULL");
  if (t->device.device_type == kDLCPU) {
    if (!allow_host) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " is a host (kDLCPU) tensor: ", kUseRing);
  } else if (t->device.device_type != kDLCUDA) {
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, what, " is on DLPack device type ", int(t->device.device_type), ": ",
                 kComponent, " handles kDLCUDA tensors only");
  }
  nccl_type(t->dtype, what);
  if (!contiguous(*t)) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " is not contiguous; pass compact row-major");
  if (t->data == nullptr && count_of(*t) != 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, what, " has NULL data");
  return t->device.device_type == kDLCUDA ? t->device.device_id : -1;
}

int visible_devices() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "nccl cross_device_ops: no CUDA device is visible to this process (",
                 e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                                  : std::string("cudaGetDeviceCount returned 0"),
                 "); ", kUseRing);
  return n;
}

// The scalar 1/n in `d`'s element format, for ncclRedOpCreatePreMulSum.
std::vector<unsigned char> reciprocal(DLDataType d, double n) {
  std::vector<unsigned char> b(esize(d));
  const double v = 1.0 / n;
  if (d.code == kDLFloat && d.bits == 64) std::memcpy(b.data(), &v, 8);
  else if (d.code == kDLFloat && d.bits == 32) { const float f = float(v); std::memcpy(b.data(), &f, 4); }
  else if (d.code == kDLFloat) { const uint16_t h = sdk::kernels::float_to_half(float(v)); std::memcpy(b.data(), &h, 2); }
  else { const uint16_t h = sdk::kernels::float_to_bfloat16(float(v)); std::memcpy(b.data(), &h, 2); }
  return b;
}

template <class T>
void divide_ints(void* p, size_t n, int64_t by) {
  T* x = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<int64_t>(x[i]) / by);
}

// A growable device buffer on one device.
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  int device = 0;
  void reserve(size_t want) {
    if (want <= bytes) return;
    if (data != nullptr) cudaFree(data);
    data = nullptr;
    bytes = 0;
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaMalloc(&data, want), "cudaMalloc of a packing buffer");
    bytes = want;
  }
  ~DeviceBuffer() {
    if (data != nullptr) {
      (void)cudaSetDevice(device);
      (void)cudaFree(data);
    }
  }
};

// The communicators, streams and scratch of one device list (replica order).
struct LocalGroup {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<std::unique_ptr<DeviceBuffer>> scratch;
  bool aborted = false;

  explicit LocalGroup(const std::vector<int>& devs) : devices(devs) {
    comms.assign(devs.size(), nullptr);
    nccl_check(ncclCommInitAll(comms.data(), int(devs.size()), devs.data()), "ncclCommInitAll");
    for (int d : devs) {
      cuda_check(cudaSetDevice(d), "cudaSetDevice");
      cudaStream_t s = nullptr;
      // A blocking stream: it also waits for work the caller left on the
      // device's legacy default stream.
      cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamDefault), "cudaStreamCreate");
      streams.push_back(s);
      scratch.push_back(std::make_unique<DeviceBuffer>());
      scratch.back()->device = d;
    }
  }
  ~LocalGroup() {
    for (size_t i = 0; i < comms.size(); ++i) {
      if (comms[i] == nullptr) continue;
      if (aborted) ncclCommAbort(comms[i]);
      else ncclCommDestroy(comms[i]);
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      (void)cudaSetDevice(devices[i]);
      (void)cudaStreamDestroy(streams[i]);
    }
  }
};

std::string device_list(const std::vector<int>& devs) {
  std::string s;
  for (int d : devs) s += (s.empty() ? "cuda:" : ", cuda:") + std::to_string(d);
  return s;
}

// One reduction of `count` elements: src[r] -> dst[r] for each local replica.
struct Item {
  DLDataType dtype;
  size_t count;
  std::vector<const void*> src;
  std::vector<void*> dst;
  bool packed = false;  // src/dst are filled from the packing scratch later
  size_t offset = 0;    // bytes into the scratch, when packed
};

}  // namespace

class NcclCrossDeviceOps : public sdk::CrossDeviceOpsBase {
 public:
  static constexpr const char* kSubsystem = "cross_device_ops.nccl";

  NcclCrossDeviceOps(sdk::Host host, const char* options_json) : host_(std::move(host)) {
    const nlohmann::json o = sdk::parse_options(options_json, kComponent);
    sdk::check_known_keys(o,
                          {"num_packs", "bytes_per_pack", "rank", "world_size", "communicator", "transport",
                           "timeout_s", "setup_timeout_s"},
                          kComponent);
    num_packs_ = sdk::get_option<int64_t>(o, "num_packs", 1, kComponent);
    if (num_packs_ < 0 || num_packs_ > 1024)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'num_packs' of ", kComponent,
                   " must be in [0, 1024] (0 = no packing, as NcclAllReduce(num_packs=0)); got ", num_packs_);
    bytes_per_pack_ = sdk::get_option<uint64_t>(o, "bytes_per_pack", 0, kComponent);
    world_ = sdk::get_option<int32_t>(o, "world_size", 1, kComponent);
    rank_ = sdk::get_option<int32_t>(o, "rank", 0, kComponent);
    if (world_ < 1)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'world_size' of ", kComponent, " must be >= 1, got ", world_);
    if (rank_ < 0 || rank_ >= world_)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'rank' of ", kComponent, " is ", rank_,
                   " but must be in [0, world_size = ", world_, ")");
    communicator_ = sdk::get_option<std::string>(o, "communicator", "nccl", kComponent);
    if (communicator_.empty())
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "option 'communicator' of ", kComponent, " is empty");
    timeout_ms_ = int64_t(sdk::collective_timeout_s(host_, o, kComponent) * 1000.0);
    setup_timeout_ms_ = int64_t(sdk::rendezvous_timeout_s(host_, o, kComponent) * 1000.0);
    std::string tname = "nccl", topts = "{}";
    std::tie(tname, topts) = sdk::transport_option(o, tname, kComponent);
    // "auto" (what multi_worker_mirrored passes by default) means the
    // transport that has native collectives on device memory.
    if (tname == "auto") tname = "nccl";
    transport_name_ = tname;
    if (world_ > 1) transport_ = host_.create_plugin<strata_transport_vtable>(tname, topts);
  }

  ~NcclCrossDeviceOps() override {
    DeviceGuard g;
    if (tcomm_ != nullptr) transport_.vtable()->comm_destroy(tcomm_);
    tcomm_ = nullptr;
    transport_.reset();
    groups_.clear();
    if (host_stage_ != nullptr) cudaFreeHost(host_stage_);
  }

  void all_reduce(strata_reduce_op op, uint32_t nt, uint32_t nr, const DLTensor* const* inputs,
                  DLTensor* const* outputs) override {
    if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_reduce: num_replicas is 0");
    if (nt == 0) return barrier(nr);
    const std::vector<int> devs = validate_groups("all_reduce", nt, nr, inputs, outputs, nr);
    DeviceGuard guard;
    LocalGroup& g = group(devs);
    // Dtypes in order of first appearance; the tensors of each in order.
    std::vector<std::vector<uint32_t>> by_dtype;
    for (uint32_t t = 0; t < nt; ++t) {
      bool placed = false;
      for (auto& v : by_dtype)
        if (dtype_equal(inputs[v[0] * nr]->dtype, inputs[t * nr]->dtype)) {
          v.push_back(t);
          placed = true;
          break;
        }
      if (!placed) by_dtype.push_back({t});
    }
    std::vector<Item> items;
    struct Packed {
      uint32_t t;
      size_t offset;  // bytes into the scratch
    };
    std::vector<Packed> packed;
    size_t scratch_bytes = 0;
    for (const auto& tensors : by_dtype) {
      const DLDataType dt = inputs[tensors[0] * nr]->dtype;
      if ((num_packs_ == 0 && bytes_per_pack_ == 0) || tensors.size() == 1) {
        for (uint32_t t : tensors) items.push_back(direct_item(t, nr, inputs, outputs));
        continue;
      }
      // Lay the tensors of this dtype out contiguously, 256-byte aligned.
      scratch_bytes = (scratch_bytes + 255) & ~size_t(255);
      const size_t base = scratch_bytes;
      std::vector<size_t> sizes;
      for (uint32_t t : tensors) {
        packed.push_back({t, scratch_bytes});
        sizes.push_back(count_of(*inputs[t * nr]));
        scratch_bytes += sizes.back() * esize(dt);
      }
      const size_t total = (scratch_bytes - base) / esize(dt);
      std::vector<std::pair<size_t, size_t>> ranges;  // element [begin, end) within the dtype's block
      if (bytes_per_pack_ > 0) {
        size_t begin = 0, pos = 0, bytes = 0;
        for (size_t s : sizes) {
          if (bytes > bytes_per_pack_) {
            ranges.push_back({begin, pos});
            begin = pos;
            bytes = 0;
          }
          pos += s;
          bytes += s * esize(dt);
        }
        ranges.push_back({begin, pos});
      } else {
        const size_t k = std::max<size_t>(1, std::min<size_t>(size_t(num_packs_), std::max<size_t>(total, 1)));
        for (size_t i = 0; i < k; ++i) ranges.push_back({total * i / k, total * (i + 1) / k});
      }
      for (const auto& [b, e] : ranges) {
        if (e == b) continue;
        Item it{dt, e - b, std::vector<const void*>(nr), std::vector<void*>(nr)};
        it.packed = true;
        it.offset = base + b * esize(dt);
        items.push_back(std::move(it));
      }
    }
    std::vector<char*> scratch(nr, nullptr);
    if (!packed.empty()) {
      for (uint32_t r = 0; r < nr; ++r) {
        g.scratch[r]->reserve(scratch_bytes);
        scratch[r] = static_cast<char*>(g.scratch[r]->data);
      }
      for (Item& it : items)
        if (it.packed)
          for (uint32_t r = 0; r < nr; ++r) {
            it.src[r] = scratch[r] + it.offset;
            it.dst[r] = scratch[r] + it.offset;
          }
      for (uint32_t r = 0; r < nr; ++r) {
        cuda_check(cudaSetDevice(g.devices[r]), "cudaSetDevice");
        for (const Packed& p : packed) {
          const DLTensor& x = *inputs[p.t * nr + r];
          const size_t b = count_of(x) * esize(x.dtype);
          if (b != 0)
            cuda_check(cudaMemcpyAsync(scratch[r] + p.offset, ptr(x), b, cudaMemcpyDeviceToDevice, g.streams[r]),
                       "cudaMemcpyAsync into a pack");
        }
      }
    }
    reduce_items(g, op, items, /*to_all=*/true, "all_reduce");
    if (!packed.empty()) {
      for (uint32_t r = 0; r < nr; ++r) {
        cuda_check(cudaSetDevice(g.devices[r]), "cudaSetDevice");
        for (const Packed& p : packed) {
          const DLTensor& y = *outputs[p.t * nr + r];
          const size_t b = count_of(y) * esize(y.dtype);
          if (b != 0)
            cuda_check(cudaMemcpyAsync(ptr(y), scratch[r] + p.offset, b, cudaMemcpyDeviceToDevice, g.streams[r]),
                       "cudaMemcpyAsync out of a pack");
        }
      }
    }
    wait(g, "all_reduce");
  }

  void reduce(strata_reduce_op op, uint32_t nt, uint32_t nr, const DLTensor* const* inputs,
              DLTensor* const* outputs) override {
    if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce: num_replicas is 0");
    if (nt == 0) return;
    const std::vector<int> devs = validate_groups("reduce", nt, nr, inputs, outputs, 1);
    DeviceGuard guard;
    LocalGroup& g = group(devs);
    // Reduce onto replica 0's scratch, then copy to wherever outputs[t] is.
    size_t bytes = 0;
    std::vector<size_t> offs;
    for (uint32_t t = 0; t < nt; ++t) {
      bytes = (bytes + 255) & ~size_t(255);
      offs.push_back(bytes);
      bytes += count_of(*inputs[t * nr]) * esize(inputs[t * nr]->dtype);
    }
    g.scratch[0]->reserve(std::max<size_t>(bytes, 1));
    char* s0 = static_cast<char*>(g.scratch[0]->data);
    std::vector<Item> items;
    for (uint32_t t = 0; t < nt; ++t) {
      Item it{inputs[t * nr]->dtype, count_of(*inputs[t * nr]), std::vector<const void*>(nr),
              std::vector<void*>(nr)};
      for (uint32_t r = 0; r < nr; ++r) {
        it.src[r] = ptr(*inputs[t * nr + r]);
        it.dst[r] = r == 0 ? static_cast<void*>(s0 + offs[t]) : const_cast<void*>(it.src[r]);
      }
      items.push_back(std::move(it));
    }
    reduce_items(g, op, items, /*to_all=*/false, "reduce");
    cuda_check(cudaSetDevice(g.devices[0]), "cudaSetDevice");
    for (uint32_t t = 0; t < nt; ++t) {
      const size_t b = items[t].count * esize(items[t].dtype);
      if (b != 0)
        cuda_check(cudaMemcpyAsync(ptr(*outputs[t]), s0 + offs[t], b, cudaMemcpyDefault, g.streams[0]),
                   "cudaMemcpyAsync of a reduce result");
    }
    wait(g, "reduce");
  }

  void broadcast(const DLTensor& src, uint32_t nr, DLTensor* const* dsts) override {
    if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "broadcast: num_replicas is 0");
    const int src_dev = check(&src, "broadcast source", /*allow_host=*/true);
    std::vector<int> devs;
    for (uint32_t r = 0; r < nr; ++r) {
      devs.push_back(check(dsts[r], "broadcast destination " + std::to_string(r)));
      if (!dtype_equal(src.dtype, dsts[r]->dtype) || count_of(src) != count_of(*dsts[r]))
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "broadcast destination ", r, " is ", sdk::tensor_string(*dsts[r]),
                     " but the source is ", sdk::tensor_string(src),
                     "; allocate destinations with the source's dtype and element count");
    }
    check_devices(devs);
    DeviceGuard guard;
    LocalGroup& g = group(devs);
    const size_t count = count_of(src);
    const size_t bytes = count * esize(src.dtype);
    const ncclDataType_t type = nccl_type(src.dtype, "broadcast source");
    int root = 0;
    for (uint32_t r = 0; r < nr; ++r)
      if (src_dev == devs[r]) root = int(r);
    const bool src_in_group = src_dev >= 0 && src_dev == devs[size_t(root)];
    if (world_ > 1) {
      // Rank 0's source goes to its replica 0, across the processes, then
      // to the local replicas.
      root = 0;
      cuda_check(cudaSetDevice(devs[0]), "cudaSetDevice");
      if (rank_ == 0 && bytes != 0 && ptr(src) != ptr(*dsts[0]))
        cuda_check(cudaMemcpyAsync(ptr(*dsts[0]), ptr(src), bytes, cudaMemcpyDefault, g.streams[0]),
                   "cudaMemcpyAsync of the broadcast source");
      strata_comm_t c = transport_comm(g);
      strata_error err;
      strata_error_init(&err);
      if (bytes != 0)
        transport_call(g, "broadcast",
                       transport_.vtable()->broadcast(c, ptr(*dsts[0]), ptr(*dsts[0]), count, src.dtype, 0,
                                                      g.streams[0], &err),
                       err);
    } else if (!src_in_group) {
      cuda_check(cudaSetDevice(devs[0]), "cudaSetDevice");
      if (bytes != 0 && ptr(src) != ptr(*dsts[0]))
        cuda_check(cudaMemcpyAsync(ptr(*dsts[0]), ptr(src), bytes, cudaMemcpyDefault, g.streams[0]),
                   "cudaMemcpyAsync of the broadcast source");
    }
    const bool from_src = world_ == 1 && src_in_group;
    if (bytes != 0 && nr > 1) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (uint32_t r = 0; r < nr; ++r)
        nccl_check(ncclBroadcast(from_src && int(r) == root ? ptr(src) : ptr(*dsts[r]), ptr(*dsts[r]), count, type,
                                 root, g.comms[r], g.streams[r]),
                   "ncclBroadcast", g.comms[r]);
      nccl_check(ncclGroupEnd(), "ncclGroupEnd (broadcast)");
    } else if (bytes != 0 && from_src && ptr(src) != ptr(*dsts[0])) {
      cuda_check(cudaMemcpyAsync(ptr(*dsts[0]), ptr(src), bytes, cudaMemcpyDefault, g.streams[0]),
                 "cudaMemcpyAsync of the broadcast source");
    }
    wait(g, "broadcast");
  }

  void all_gather(uint32_t nr, const DLTensor* const* inputs, int32_t axis, DLTensor* const* outputs) override {
    if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_gather: num_replicas is 0");
    std::vector<int> devs;
    for (uint32_t r = 0; r < nr; ++r) {
      devs.push_back(check(inputs[r], "all_gather input " + std::to_string(r)));
      check(outputs[r], "all_gather output " + std::to_string(r));
      if (outputs[r]->device.device_id != devs.back())
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_gather output ", r, " is on cuda:",
                     outputs[r]->device.device_id, " but its input is on cuda:", devs.back());
      sdk::check_same_type_and_shape(*inputs[0], "all_gather input of replica 0", *inputs[r],
                                     "all_gather input of replica " + std::to_string(r));
    }
    check_devices(devs);
    const DLTensor& first = *inputs[0];
    const int32_t ndim = first.ndim;
    const int32_t ax = axis < 0 ? axis + ndim : axis;
    if (ndim == 0 || ax < 0 || ax >= ndim)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_gather: axis ", axis, " is out of range for ",
                   sdk::tensor_string(first));
    const size_t parts = size_t(world_) * nr;
    for (uint32_t r = 0; r < nr; ++r) {
      const DLTensor& o = *outputs[r];
      bool ok = dtype_equal(o.dtype, first.dtype) && o.ndim == ndim;
      for (int32_t k = 0; ok && k < ndim; ++k)
        ok = k == ax ? size_t(o.shape[k]) == size_t(first.shape[k]) * parts : o.shape[k] == first.shape[k];
      if (!ok)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "all_gather output ", r, " is ", sdk::tensor_string(o),
                     " but gathering ", parts, " inputs ", sdk::tensor_string(first), " along axis ", ax,
                     " needs dimension ", ax, " = ", size_t(first.shape[ax]) * parts,
                     " (", kComponent, " gathers equal shapes only; use \"ring\" for ragged ones)");
    }
    DeviceGuard guard;
    LocalGroup& g = group(devs);
    const ncclDataType_t type = nccl_type(first.dtype, "all_gather input");
    const size_t es = esize(first.dtype);
    const size_t count = count_of(first);
    size_t outer = 1, inner = 1;
    for (int32_t k = 0; k < ax; ++k) outer *= size_t(first.shape[k]);
    for (int32_t k = ax + 1; k < ndim; ++k) inner *= size_t(first.shape[k]);
    const size_t row = size_t(first.shape[ax]) * inner * es;  // one input's bytes per outer index
    if (count == 0) return;
    // Gather whole inputs in (rank, replica) order into a [parts][input]
    // buffer (the output itself when outer == 1), then interleave rows.
    const bool direct = outer == 1;
    std::vector<char*> buf(nr);
    for (uint32_t r = 0; r < nr; ++r) {
      if (direct) {
        buf[r] = static_cast<char*>(ptr(*outputs[r]));
      } else {
        g.scratch[r]->reserve(count * es * parts);
        buf[r] = static_cast<char*>(g.scratch[r]->data);
      }
    }
    // Local replicas go to this rank's slot; across processes replica 0's
    // slot row is exchanged by the transport, then broadcast locally.
    const size_t slot = size_t(rank_) * nr * count;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (uint32_t r = 0; r < nr; ++r)
      nccl_check(ncclAllGather(ptr(*inputs[r]), buf[r] + slot * es, count, type, g.comms[r], g.streams[r]),
                 "ncclAllGather", g.comms[r]);
    nccl_check(ncclGroupEnd(), "ncclGroupEnd (all_gather)");
    if (world_ > 1) {
      strata_comm_t c = transport_comm(g);
      strata_error err;
      strata_error_init(&err);
      cuda_check(cudaSetDevice(devs[0]), "cudaSetDevice");
      transport_call(g, "all_gather",
                     transport_.vtable()->all_gather(c, buf[0] + slot * es, buf[0], nr * count, first.dtype,
                                                     g.streams[0], &err),
                     err);
      if (nr > 1) {
        nccl_check(ncclGroupStart(), "ncclGroupStart");
        for (uint32_t r = 0; r < nr; ++r)
          nccl_check(ncclBroadcast(buf[r], buf[r], parts * count, type, 0, g.comms[r], g.streams[r]),
                     "ncclBroadcast", g.comms[r]);
        nccl_check(ncclGroupEnd(), "ncclGroupEnd (all_gather)");
      }
    }
    if (!direct)
      for (uint32_t r = 0; r < nr; ++r) {
        cuda_check(cudaSetDevice(devs[r]), "cudaSetDevice");
        // Input k's rows land at column k * row of every output row.
        for (size_t k = 0; k < parts; ++k)
          cuda_check(cudaMemcpy2DAsync(static_cast<char*>(ptr(*outputs[r])) + k * row, parts * row,
                                       buf[r] + k * count * es, row, row, outer, cudaMemcpyDeviceToDevice,
                                       g.streams[r]),
                     "cudaMemcpy2DAsync (all_gather interleave)");
      }
    wait(g, "all_gather");
  }

  void reduce_scatter(strata_reduce_op op, uint32_t nr, const DLTensor* const* inputs, DLTensor* const* outputs) {
    if (nr == 0) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter: num_replicas is 0");
    std::vector<int> devs;
    for (uint32_t r = 0; r < nr; ++r) {
      devs.push_back(check(inputs[r], "reduce_scatter input " + std::to_string(r)));
      check(outputs[r], "reduce_scatter output " + std::to_string(r));
      sdk::check_same_type_and_shape(*inputs[0], "reduce_scatter input of replica 0", *inputs[r],
                                     "reduce_scatter input of replica " + std::to_string(r));
    }
    check_devices(devs);
    const DLTensor& first = *inputs[0];
    const int64_t parts = int64_t(world_) * nr;
    if (first.ndim == 0 || first.shape[0] % parts != 0)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter input ", sdk::tensor_string(first),
                   " cannot be split into ", parts, " equal slices along axis 0; make dimension 0 a multiple of ",
                   parts);
    for (uint32_t r = 0; r < nr; ++r) {
      const DLTensor& o = *outputs[r];
      bool ok = dtype_equal(o.dtype, first.dtype) && o.ndim == first.ndim && o.shape[0] == first.shape[0] / parts;
      for (int32_t k = 1; ok && k < o.ndim; ++k) ok = o.shape[k] == first.shape[k];
      if (!ok)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "reduce_scatter output ", r, " is ", sdk::tensor_string(o),
                     " but each of the ", parts, " slices of input ", sdk::tensor_string(first),
                     " has dimension 0 = ", first.shape[0] / parts, "; allocate outputs with that shape");
    }
    DeviceGuard guard;
    LocalGroup& g = group(devs);
    const size_t count = count_of(first), slice = count / size_t(parts), es = esize(first.dtype);
    if (count == 0) return;
    if (world_ == 1) {
      const ncclDataType_t type = nccl_type(first.dtype, "reduce_scatter input");
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (uint32_t r = 0; r < nr; ++r)
        nccl_check(ncclReduceScatter(ptr(*inputs[r]), ptr(*outputs[r]), slice, type, local_op(op), g.comms[r],
                                     g.streams[r]),
                   "ncclReduceScatter", g.comms[r]);
      nccl_check(ncclGroupEnd(), "ncclGroupEnd (reduce_scatter)");
    } else {
      // All-reduce into the scratch, then each replica takes its slice.
      std::vector<Item> items(1, Item{first.dtype, count, std::vector<const void*>(nr), std::vector<void*>(nr)});
      for (uint32_t r = 0; r < nr; ++r) {
        g.scratch[r]->reserve(count * es);
        items[0].src[r] = ptr(*inputs[r]);
        items[0].dst[r] = g.scratch[r]->data;
      }
      reduce_items(g, op, items, /*to_all=*/true, "reduce_scatter");
      for (uint32_t r = 0; r < nr; ++r) {
        cuda_check(cudaSetDevice(devs[r]), "cudaSetDevice");
        const size_t part = size_t(rank_) * nr + r;
        cuda_check(cudaMemcpyAsync(ptr(*outputs[r]), static_cast<char*>(g.scratch[r]->data) + part * slice * es,
                                   slice * es, cudaMemcpyDeviceToDevice, g.streams[r]),
                   "cudaMemcpyAsync (reduce_scatter slice)");
      }
    }
    wait(g, "reduce_scatter");
  }

 private:
  // all_reduce with no tensors: a barrier across processes.
  void barrier(uint32_t) {
    if (world_ == 1) return;
    DeviceGuard guard;
    std::vector<int> devs = last_devices_;
    if (devs.empty()) {
      // A barrier before any tensor: the calling thread's current device.
      visible_devices();
      int cur = 0;
      cuda_check(cudaGetDevice(&cur), "cudaGetDevice");
      devs.push_back(cur);
    }
    LocalGroup& g = group(devs);
    g.scratch[0]->reserve(256);
    strata_comm_t c = transport_comm(g);
    strata_error err;
    strata_error_init(&err);
    cuda_check(cudaSetDevice(g.devices[0]), "cudaSetDevice");
    transport_call(g, "barrier",
                   transport_.vtable()->all_reduce(c, g.scratch[0]->data, g.scratch[0]->data, 1, sdk::kInt32,
                                                   STRATA_REDUCE_SUM, g.streams[0], &err),
                   err);
    wait(g, "barrier");
  }

  static ncclRedOp_t local_op(strata_reduce_op op) {
    switch (op) {
      case STRATA_REDUCE_SUM: return ncclSum;
      case STRATA_REDUCE_MEAN: return ncclAvg;
      case STRATA_REDUCE_MIN: return ncclMin;
      case STRATA_REDUCE_MAX: return ncclMax;
      case STRATA_REDUCE_PROD: return ncclProd;
    }
    return ncclSum;
  }

  // Validates inputs[t*nr + r] (and `opt` outputs per tensor); returns the
  // replicas' devices.
  std::vector<int> validate_groups(const char* what, uint32_t nt, uint32_t nr, const DLTensor* const* inputs,
                                   const DLTensor* const* outputs, uint32_t opt) {
    std::vector<int> devs(nr, -1);
    for (uint32_t t = 0; t < nt; ++t) {
      const DLTensor* x0 = inputs[size_t(t) * nr];
      for (uint32_t r = 0; r < nr; ++r) {
        const std::string name = std::string(what) + " input " + std::to_string(t) + " of replica " + std::to_string(r);
        const DLTensor* x = inputs[size_t(t) * nr + r];
        const int d = check(x, name);
        if (t == 0) devs[r] = d;
        else if (d != devs[r])
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, name, " is on cuda:", d, " but replica ", r,
                       "'s first input is on cuda:", devs[r], "; keep each replica's tensors on its device");
        if (!dtype_equal(x->dtype, x0->dtype) || count_of(*x) != count_of(*x0))
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, name, " is ", sdk::tensor_string(*x), " but replica 0's is ",
                       sdk::tensor_string(*x0), "; all replicas' tensors of a group share dtype and element count");
      }
      for (uint32_t r = 0; r < opt; ++r) {
        const std::string name = std::string(what) + " output " + std::to_string(t) +
                                 (opt > 1 ? " of replica " + std::to_string(r) : std::string());
        const DLTensor* y = outputs[size_t(t) * opt + r];
        const int d = check(y, name, /*allow_host=*/opt == 1);
        if (opt > 1 && d != devs[r])
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, name, " is on cuda:", d, " but the replica's input is on cuda:",
                       devs[r]);
        if (!dtype_equal(y->dtype, x0->dtype) || count_of(*y) != count_of(*x0))
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, name, " is ", sdk::tensor_string(*y), " but the inputs are ",
                       sdk::tensor_string(*x0), "; allocate outputs with the inputs' dtype and element count");
      }
    }
    check_devices(devs);
    return devs;
  }

  static void check_devices(const std::vector<int>& devs) {
    const int n = visible_devices();
    for (size_t r = 0; r < devs.size(); ++r) {
      if (devs[r] < 0 || devs[r] >= n)
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "replica ", r, "'s tensors are on cuda:", devs[r], " but ", n,
                     " CUDA device(s) are visible");
      for (size_t s = 0; s < r; ++s)
        if (devs[s] == devs[r])
          STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "replicas ", s, " and ", r, " are both on cuda:", devs[r],
                       "; NcclAllReduce needs one GPU per replica (NCCL cannot join two ranks on one device): "
                       "use the \"ring\" cross_device_ops for several replicas per GPU");
    }
  }

  LocalGroup& group(const std::vector<int>& devs) {
    last_devices_ = devs;
    auto it = groups_.find(devs);
    if (it == groups_.end()) {
      host_.debug("creating NCCL communicators on ", device_list(devs));
      it = groups_.emplace(devs, std::make_unique<LocalGroup>(devs)).first;
    }
    return *it->second;
  }

  Item direct_item(uint32_t t, uint32_t nr, const DLTensor* const* inputs, DLTensor* const* outputs) {
    Item it{inputs[t * nr]->dtype, count_of(*inputs[t * nr]), std::vector<const void*>(nr), std::vector<void*>(nr)};
    for (uint32_t r = 0; r < nr; ++r) {
      it.src[r] = ptr(*inputs[t * nr + r]);
      it.dst[r] = ptr(*outputs[t * nr + r]);
    }
    return it;
  }

  // Enqueue `items` on the group's streams: the result to every replica's
  // dst (to_all) or to replica 0's dst only.
  void reduce_items(LocalGroup& g, strata_reduce_op op, std::vector<Item>& items, bool to_all, const char* what) {
    const uint32_t nr = uint32_t(g.devices.size());
    if (world_ == 1) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (const Item& it : items) {
        if (it.count == 0) continue;
        const ncclDataType_t type = nccl_type(it.dtype, what);
        for (uint32_t r = 0; r < nr; ++r) {
          if (to_all)
            nccl_check(ncclAllReduce(it.src[r], it.dst[r], it.count, type, local_op(op), g.comms[r], g.streams[r]),
                       "ncclAllReduce", g.comms[r]);
          else
            nccl_check(ncclReduce(it.src[r], it.dst[r], it.count, type, local_op(op), 0, g.comms[r], g.streams[r]),
                       "ncclReduce", g.comms[r]);
        }
      }
      nccl_check(ncclGroupEnd(), (std::string("ncclGroupEnd (") + what + ")").c_str());
      return;
    }
    // Across processes: local reduce onto replica 0, transport, local broadcast.
    const double n_all = double(world_) * nr;
    // MEAN of floating types: every input pre-multiplied by 1/(world * nr)
    // (ncclAvg's arithmetic over all replicas); the operators are made
    // before the group and destroyed once it has been enqueued (this block;
    // nothing in it drops the group).
    {
      std::vector<ncclRedOp_t> premul(nr * items.size(), ncclSum);
      std::vector<bool> made(premul.size(), false);
      struct Destroy {
        std::vector<ncclRedOp_t>& ops;
        std::vector<bool>& made;
        LocalGroup& g;
        uint32_t nr;
        ~Destroy() {
          for (size_t k = 0; k < ops.size(); ++k)
            if (made[k] && g.comms[k % nr] != nullptr) ncclRedOpDestroy(ops[k], g.comms[k % nr]);
        }
      } destroy{premul, made, g, nr};
      if (op == STRATA_REDUCE_MEAN)
        for (size_t i = 0; i < items.size(); ++i) {
          if (items[i].count == 0 || !is_float_type(items[i].dtype)) continue;
          const ncclDataType_t type = nccl_type(items[i].dtype, what);
          std::vector<unsigned char> scalar = reciprocal(items[i].dtype, n_all);
          for (uint32_t r = 0; r < nr; ++r) {
            nccl_check(ncclRedOpCreatePreMulSum(&premul[i * nr + r], scalar.data(), type, ncclScalarHostImmediate,
                                                g.comms[r]),
                       "ncclRedOpCreatePreMulSum", g.comms[r]);
            made[i * nr + r] = true;
          }
        }
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (size_t i = 0; i < items.size(); ++i) {
        const Item& it = items[i];
        if (it.count == 0) continue;
        const ncclDataType_t type = nccl_type(it.dtype, what);
        for (uint32_t r = 0; r < nr; ++r) {
          const ncclRedOp_t o = made[i * nr + r] ? premul[i * nr + r]
                                : op == STRATA_REDUCE_MEAN ? ncclSum
                                                           : local_op(op);
          nccl_check(ncclReduce(it.src[r], it.dst[r], it.count, type, o, 0, g.comms[r], g.streams[r]), "ncclReduce",
                     g.comms[r]);
        }
      }
      nccl_check(ncclGroupEnd(), (std::string("ncclGroupEnd (") + what + ")").c_str());
    }
    strata_comm_t c = transport_comm(g);
    cuda_check(cudaSetDevice(g.devices[0]), "cudaSetDevice");
    const uint32_t top = op == STRATA_REDUCE_MEAN ? uint32_t(STRATA_REDUCE_SUM) : uint32_t(op);
    for (Item& it : items) {
      if (it.count == 0) continue;
      strata_error err;
      strata_error_init(&err);
      transport_call(g, what,
                     transport_.vtable()->all_reduce(c, it.dst[0], it.dst[0], it.count, it.dtype, top, g.streams[0],
                                                     &err),
                     err);
      if (op == STRATA_REDUCE_MEAN && !is_float_type(it.dtype)) {
        // Integer MEAN: exact sum, then truncating division on the host.
        const size_t b = it.count * esize(it.dtype);
        wait(g, what);
        if (host_stage_bytes_ < b) {
          if (host_stage_ != nullptr) cudaFreeHost(host_stage_);
          host_stage_ = nullptr;
          host_stage_bytes_ = 0;
          cuda_check(cudaMallocHost(&host_stage_, b), "cudaMallocHost");
          host_stage_bytes_ = b;
        }
        cuda_check(cudaMemcpy(host_stage_, it.dst[0], b, cudaMemcpyDeviceToHost), "cudaMemcpy");
        const int64_t by = int64_t(n_all);
        if (it.dtype.code == kDLUInt) divide_ints<uint8_t>(host_stage_, it.count, by);
        else if (it.dtype.bits == 32) divide_ints<int32_t>(host_stage_, it.count, by);
        else divide_ints<int64_t>(host_stage_, it.count, by);
        cuda_check(cudaMemcpy(it.dst[0], host_stage_, b, cudaMemcpyHostToDevice), "cudaMemcpy");
      }
    }
    if (!to_all) return;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (const Item& it : items) {
      if (it.count == 0) continue;
      const ncclDataType_t type = nccl_type(it.dtype, what);
      for (uint32_t r = 0; r < nr; ++r)
        nccl_check(ncclBroadcast(it.dst[r], it.dst[r], it.count, type, 0, g.comms[r], g.streams[r]), "ncclBroadcast",
                   g.comms[r]);
    }
    nccl_check(ncclGroupEnd(), (std::string("ncclGroupEnd (") + what + ")").c_str());
  }

  // The transport communicator, created on replica 0's device at first use.
  strata_comm_t transport_comm(LocalGroup& g) {
    if (tcomm_ != nullptr) {
      if (tcomm_device_ != g.devices[0])
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, kComponent, ": replica 0 moved from cuda:", tcomm_device_, " to cuda:",
                     g.devices[0], "; the cross-process communicator lives on the first replica's device");
      return tcomm_;
    }
    const strata_transport_vtable* vt = transport_.vtable();
    strata_transport_caps caps{};
    STRATA_INIT_HEADER(&caps, strata_transport_caps);
    strata_error err;
    strata_error_init(&err);
    ::strata::detail::check_status(vt->get_caps(transport_.handle<strata_transport_t>(), &caps, &err), err,
                                   "transport get_caps");
    if ((caps.flags & STRATA_TRANSPORT_CAP_NATIVE_COLLECTIVES) == 0 || (caps.flags & STRATA_TRANSPORT_CAP_MEM_CUDA) == 0 ||
        vt->all_reduce == nullptr || vt->broadcast == nullptr || vt->all_gather == nullptr)
      STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, kComponent, ": transport '", transport_name_,
                   "' has no native collectives on CUDA memory; use transport \"nccl\", or the \"ring\" "
                   "cross_device_ops over a point-to-point transport");
    cuda_check(cudaSetDevice(g.devices[0]), "cudaSetDevice");
    strata_comm_t c = nullptr;
    strata_error_init(&err);
    ::strata::detail::check_status(vt->comm_create(transport_.handle<strata_transport_t>(), communicator_.c_str(),
                                                   rank_, world_, setup_timeout_ms_, &c, &err),
                                   err, ("joining communicator '" + communicator_ + "'").c_str());
    tcomm_ = c;
    tcomm_device_ = g.devices[0];
    host_.debug("rank ", rank_, " of ", world_, " joined communicator '", communicator_, "' over transport '",
                transport_name_, "' on cuda:", tcomm_device_);
    return c;
  }

  // A transport collective's status (transport_comm checked that the
  // functions exist). Its failure leaves the communicator unusable, so
  // the group and the communicator are dropped (rebuilt at the next call).
  void transport_call(LocalGroup& g, const char* what, strata_status_t s, const strata_error& err) {
    if (s == STRATA_OK) return;
    fail(g, s, ::strata::detail::str_cat("transport '", transport_name_, "' ", what, ": ", err.message));
  }

  // Wait for the group's streams with the collective deadline; abort on
  // deadline or asynchronous NCCL error.
  void wait(LocalGroup& g, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    std::vector<bool> done(g.streams.size(), false);
    size_t left = g.streams.size();
    for (int spin = 0; left != 0; ++spin) {
      for (size_t i = 0; i < g.streams.size(); ++i) {
        if (done[i]) continue;
        const cudaError_t e = cudaStreamQuery(g.streams[i]);
        if (e == cudaSuccess) {
          done[i] = true;
          --left;
          continue;
        }
        if (e != cudaErrorNotReady) {
          fail(g, STRATA_ERR_INTERNAL,
               ::strata::detail::str_cat(what, " on ", device_list(g.devices), " failed on cuda:", g.devices[i], ": ",
                                         cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
        }
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(g.comms[i], &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          const char* last = ncclGetLastError(g.comms[i]);
          fail(g, STRATA_ERR_INTERNAL,
               ::strata::detail::str_cat(what, " on ", device_list(g.devices), ": NCCL reported ",
                                         ncclGetErrorString(async), " on cuda:", g.devices[i],
                                         last != nullptr && last[0] != '\0' ? std::string(" (") + last + ")" : ""));
        }
      }
      if (left == 0) break;
      if (std::chrono::steady_clock::now() >= deadline)
        fail(g, STRATA_ERR_DEADLINE_EXCEEDED,
             ::strata::detail::str_cat(what, " on ", device_list(g.devices),
                                       world_ > 1 ? " (rank " + std::to_string(rank_) + " of " +
                                                        std::to_string(world_) + ")"
                                                  : std::string(),
                                       " did not finish within ", timeout_ms_ / 1000.0,
                                       " s (timeout_s); the NCCL communicators were aborted and are rebuilt at the "
                                       "next call; check that every replica and process makes the same calls"));
      if (host_.abort_requested())
        fail(g, STRATA_ERR_ABORTED,
             ::strata::detail::str_cat(what, " on ", device_list(g.devices), " was aborted (abort requested)"));
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
    }
  }

  [[noreturn]] void fail(LocalGroup& g, strata_status_t code, const std::string& message) {
    g.aborted = true;
    for (ncclComm_t c : g.comms)
      if (c != nullptr) ncclCommAbort(c);
    g.comms.assign(g.comms.size(), nullptr);
    if (tcomm_ != nullptr) {
      transport_.vtable()->comm_abort(tcomm_, message.c_str());
      transport_.vtable()->comm_destroy(tcomm_);
      tcomm_ = nullptr;
    }
    const std::vector<int> devs = g.devices;
    groups_.erase(devs);
    ::strata::detail::throw_status(code, std::string(kComponent) + ": " + message);
  }

  sdk::Host host_;
  int64_t num_packs_ = 1;
  uint64_t bytes_per_pack_ = 0;
  int32_t rank_ = 0;
  int32_t world_ = 1;
  std::string communicator_;
  std::string transport_name_;
  int64_t timeout_ms_ = 300000;
  int64_t setup_timeout_ms_ = 120000;
  sdk::PluginRef<strata_transport_vtable> transport_;
  strata_comm_t tcomm_ = nullptr;
  int tcomm_device_ = -1;
  std::map<std::vector<int>, std::unique_ptr<LocalGroup>> groups_;
  std::vector<int> last_devices_;
  void* host_stage_ = nullptr;
  size_t host_stage_bytes_ = 0;
};

}  // namespace strata::plugins::nccl

STRATA_PLUGIN("strata nccl cross_device_ops", "0.1.0",
              STRATA_CROSS_DEVICE_OPS_COMPONENT(strata::plugins::nccl::NcclCrossDeviceOps, "nccl", "0.1.0"))
