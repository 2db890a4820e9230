// SPDX-License-Identifier: Apache-2.0
// The ring CrossDeviceOps plugin, loaded through the real plugin host and
// driven through its C vtable, with ranks as threads of this process over
// the in-process fixture transport and over tcp (when built), plus tests
// with real processes over every transport that crosses processes and the
// TCP rendezvous store, including ranks that exit or stop mid-collective.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/plugin_host.hpp"
#include "strata/store.hpp"
#include "strata/sdk/host.hpp"
#include "strata/sdk/kernels.hpp"

namespace strata::test {
namespace {

using nlohmann::json;
using sdk::dtype_equal;
using sdk::kBFloat16;
using sdk::kFloat16;
using sdk::kFloat32;
using sdk::kFloat64;
using sdk::kInt32;
using sdk::kInt64;

#ifdef RING_TEST_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

const std::vector<DLDataType> kDtypes = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64};

// ------------------------------------------------------------ tensors ---

struct Tensor {
  DLDataType dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  DLTensor t{};
  Tensor(DLDataType d, std::vector<int64_t> s) : dtype(d), shape(std::move(s)) {
    bytes.assign(count() * (d.bits / 8) + 8, 0xAB);
    t = DLTensor{bytes.data(), {kDLCPU, 0}, int32_t(shape.size()), d, shape.data(), nullptr, 0};
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  size_t count() const {
    size_t n = 1;
    for (int64_t x : shape) n *= size_t(x);
    return n;
  }
  size_t nbytes() const { return count() * (dtype.bits / 8); }
  void set(size_t i, double v) {
    void* p = bytes.data();
    if (dtype_equal(dtype, kFloat32)) static_cast<float*>(p)[i] = float(v);
    else if (dtype_equal(dtype, kFloat64)) static_cast<double*>(p)[i] = v;
    else if (dtype_equal(dtype, kFloat16)) static_cast<uint16_t*>(p)[i] = sdk::kernels::float_to_half(float(v));
    else if (dtype_equal(dtype, kBFloat16)) static_cast<uint16_t*>(p)[i] = sdk::kernels::float_to_bfloat16(float(v));
    else if (dtype_equal(dtype, kInt32)) static_cast<int32_t*>(p)[i] = int32_t(v);
    else static_cast<int64_t*>(p)[i] = int64_t(v);
  }
  std::vector<unsigned char> data_bytes() const { return {bytes.begin(), bytes.begin() + long(nbytes())}; }
};

double load(DLDataType d, const unsigned char* p, size_t i) {
  if (dtype_equal(d, kFloat32)) return reinterpret_cast<const float*>(p)[i];
  if (dtype_equal(d, kFloat64)) return reinterpret_cast<const double*>(p)[i];
  if (dtype_equal(d, kFloat16)) return sdk::kernels::half_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
  if (dtype_equal(d, kBFloat16)) return sdk::kernels::bfloat16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
  if (dtype_equal(d, kInt32)) return reinterpret_cast<const int32_t*>(p)[i];
  return double(reinterpret_cast<const int64_t*>(p)[i]);
}

// What a value becomes when stored as `d` (rounding as the plugin does).
double as_dtype(DLDataType d, double v) {
  Tensor x(d, {1});
  x.set(0, v);
  return load(d, x.bytes.data(), 0);
}

bool is_int(DLDataType d) { return d.code == kDLInt; }

// Small integers: every sum of up to 16 of them is exact in every dtype.
double value(int rank, int rep, int t, size_t i, bool prod) {
  if (prod) {
    const size_t k = (i * 7 + size_t(rank) * 3 + size_t(rep) * 5 + size_t(t)) % 5;
    return k == 0 ? 2.0 : k == 1 ? -1.0 : 1.0;
  }
  return double(int((i * 7 + size_t(rank) * 3 + size_t(rep) * 5 + size_t(t)) % 17) - 8);
}

// ---------------------------------------------------------------- CDO ---

struct Status {
  strata_status_t code = STRATA_OK;
  std::string message;
};

std::atomic<int> g_comm_id{0};
std::string unique_comm(const std::string& what) {
  return "ringtest-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(g_comm_id++);
}

class Cdo {
 public:
  explicit Cdo(const std::string& options)
      : inst_(PluginHost::global().create(STRATA_KIND_CROSS_DEVICE_OPS, "ring", options)),
        vt_(inst_.vtable_as<strata_cross_device_ops_vtable>()),
        h_(static_cast<strata_cross_device_ops_t>(inst_.handle())) {}
  const strata_cross_device_ops_vtable* vt() const { return vt_; }
  strata_cross_device_ops_t h() const { return h_; }

  Status all_reduce(uint32_t op, std::vector<Tensor*> in, std::vector<Tensor*> out, uint32_t nr) {
    auto [i, o] = ptrs(in, out);
    return call([&](strata_error* e) { return vt_->all_reduce(h_, op, uint32_t(in.size() / nr), nr, i.data(), o.data(), e); });
  }
  Status reduce(uint32_t op, std::vector<Tensor*> in, std::vector<Tensor*> out, uint32_t nr) {
    auto [i, o] = ptrs(in, out);
    return call([&](strata_error* e) { return vt_->reduce(h_, op, uint32_t(in.size() / nr), nr, i.data(), o.data(), e); });
  }
  Status broadcast(Tensor& src, std::vector<Tensor*> out) {
    std::vector<DLTensor*> o;
    for (Tensor* x : out) o.push_back(&x->t);
    return call([&](strata_error* e) { return vt_->broadcast(h_, &src.t, uint32_t(o.size()), o.data(), e); });
  }
  Status all_gather(std::vector<Tensor*> in, int32_t axis, std::vector<Tensor*> out) {
    auto [i, o] = ptrs(in, out);
    return call([&](strata_error* e) { return vt_->all_gather(h_, uint32_t(in.size()), i.data(), axis, o.data(), e); });
  }
  Status reduce_scatter(uint32_t op, std::vector<Tensor*> in, std::vector<Tensor*> out) {
    auto [i, o] = ptrs(in, out);
    return call([&](strata_error* e) { return vt_->reduce_scatter(h_, op, uint32_t(in.size()), i.data(), o.data(), e); });
  }
  Status barrier() {
    const DLTensor* dummy_in = nullptr;
    DLTensor* dummy_out = nullptr;
    return call([&](strata_error* e) { return vt_->all_reduce(h_, STRATA_REDUCE_SUM, 0, 1, &dummy_in, &dummy_out, e); });
  }

 private:
  static std::pair<std::vector<const DLTensor*>, std::vector<DLTensor*>> ptrs(const std::vector<Tensor*>& in,
                                                                             const std::vector<Tensor*>& out) {
    std::vector<const DLTensor*> i;
    std::vector<DLTensor*> o;
    for (Tensor* x : in) i.push_back(&x->t);
    for (Tensor* x : out) o.push_back(&x->t);
    return {i, o};
  }
  template <class F>
  static Status call(F f) {
    strata_error err;
    strata_error_init(&err);
    Status s;
    s.code = f(&err);
    if (s.code != STRATA_OK) s.message = err.message;
    return s;
  }

  PluginInstance inst_;
  const strata_cross_device_ops_vtable* vt_;
  strata_cross_device_ops_t h_;
};

std::string options_for(const std::string& transport, int rank, int world, const std::string& comm,
                        const json& extra) {
  json t = {{"name", transport}};
  // "libfabric_<provider>" parameters: the libfabric transport over that provider.
  if (transport == "libfabric_tcp")
    t = {{"name", "libfabric"}, {"options", {{"provider", "tcp;ofi_rxm"}, {"iface", "lo"}}}};
  else if (transport == "libfabric_shm")
    t = {{"name", "libfabric"}, {"options", {{"provider", "shm"}}}};
  else if (transport == "auto")  // two emulated hosts: ring traffic crosses both sub-communicators
    t = {{"name", "auto"}, {"options", {{"host_id", rank < (world + 1) / 2 ? "a" : "b"}, {"local", "tcp"}}}};
  json o = {{"transport", t}, {"rank", rank}, {"world_size", world}, {"communicator", comm}};
  for (auto it = extra.begin(); it != extra.end(); ++it) o[it.key()] = it.value();
  return o.dump();
}

// Run body(rank, cdo) on `n` threads, each with its own ring instance.
void run_world(const std::string& transport, int n, const json& extra,
               const std::function<void(int, Cdo&)>& body,
               const std::function<json(int)>& per_rank = nullptr) {
  const std::string comm = unique_comm(transport);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        json ex = extra;
        if (per_rank) {
          json more = per_rank(r);
          for (auto it = more.begin(); it != more.end(); ++it) ex[it.key()] = it.value();
        }
        Cdo cdo(options_for(transport, r, n, comm, ex));
        body(r, cdo);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
}

void load_plugins() {
  static bool done = [] {
    PluginHost::global().load_explicit(RING_PLUGIN);
    PluginHost::global().load_explicit(RING_INPROC_TRANSPORT);
#ifdef RING_HAVE_TCP
    PluginHost::global().load_explicit(RING_TCP_TRANSPORT);
#endif
#ifdef RING_HAVE_LIBFABRIC
    PluginHost::global().load_explicit(RING_LIBFABRIC_TRANSPORT);
#endif
#ifdef RING_HAVE_AUTO
    PluginHost::global().load_explicit(RING_AUTO_TRANSPORT);
#endif
#ifdef RING_HAVE_SHMEM
    PluginHost::global().load_explicit(RING_SHMEM_TRANSPORT);
#endif
    return true;
  }();
  (void)done;
}

std::vector<std::string> transports() {
  std::vector<std::string> v{"ring_test_inproc"};
#ifdef RING_HAVE_TCP
  v.push_back("tcp");
#endif
#ifdef RING_HAVE_LIBFABRIC
  v.push_back("libfabric_tcp");
  v.push_back("libfabric_shm");
#endif
#ifdef RING_HAVE_AUTO
  v.push_back("auto");
#endif
#ifdef RING_HAVE_SHMEM
  v.push_back("shmem");
#endif
  return v;
}

// ---------------------------------------------------- the op matrix ---

// One collective on every rank; outputs[rank] holds the rank's output bytes.
using Outputs = std::vector<std::vector<unsigned char>>;

struct World {
  int n;
  uint32_t nr;
};

std::string label(const World& w, DLDataType d, const char* what, size_t size) {
  return std::string(what) + " " + sdk::dtype_name(d) + " size " + std::to_string(size) + " ranks " +
         std::to_string(w.n) + " replicas " + std::to_string(w.nr);
}

// Per rank: run all_reduce/reduce for `op`, return concatenated outputs.
std::vector<unsigned char> do_all_reduce(Cdo& cdo, int rank, const World& w, DLDataType d, size_t size, uint32_t op,
                                         bool reduce_only) {
  std::vector<std::unique_ptr<Tensor>> in, out;
  std::vector<Tensor*> ip, optr;
  const bool prod = op == STRATA_REDUCE_PROD;
  for (uint32_t r = 0; r < w.nr; ++r) {
    in.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{int64_t(size)}));
    for (size_t i = 0; i < size; ++i) in.back()->set(i, value(rank, int(r), 0, i, prod));
    ip.push_back(in.back().get());
  }
  const uint32_t nout = reduce_only ? 1 : w.nr;
  for (uint32_t r = 0; r < nout; ++r) {
    out.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{int64_t(size)}));
    optr.push_back(out.back().get());
  }
  Status s = reduce_only ? cdo.reduce(op, ip, optr, w.nr) : cdo.all_reduce(op, ip, optr, w.nr);
  EXPECT_EQ(s.code, STRATA_OK) << s.message;
  std::vector<unsigned char> all;
  for (auto& o : out) {
    auto b = o->data_bytes();
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

double expected_reduce(const World& w, DLDataType d, uint32_t op, size_t i) {
  const bool prod = op == STRATA_REDUCE_PROD;
  double acc = 0;
  bool first = true;
  for (int k = 0; k < w.n; ++k)
    for (uint32_t r = 0; r < w.nr; ++r) {
      const double v = value(k, int(r), 0, i, prod);
      if (first) acc = v;
      else if (op == STRATA_REDUCE_MIN) acc = std::min(acc, v);
      else if (op == STRATA_REDUCE_MAX) acc = std::max(acc, v);
      else if (op == STRATA_REDUCE_PROD) acc *= v;
      else acc += v;
      first = false;
    }
  if (op == STRATA_REDUCE_MEAN) {
    const int div = w.n * int(w.nr);
    if (is_int(d)) return double(int64_t(acc) / div);
    if (dtype_equal(d, kFloat64)) return acc / div;
    return as_dtype(d, double(float(acc) / float(div)));
  }
  return as_dtype(d, acc);
}

// memcmp/memcpy must not see a null pointer even for 0 bytes (empty vectors
// have a null data()), so the zero-size cases go through these.
bool same_bytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }
void copy_bytes(void* dst, const void* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

void check_all_reduce(const Outputs& outs, const World& w, DLDataType d, size_t size, uint32_t op, uint32_t nout,
                      const std::string& what) {
  const size_t esize = d.bits / 8;
  for (int k = 0; k < w.n; ++k) {
    ASSERT_EQ(outs[size_t(k)].size(), size * esize * nout) << what;
    EXPECT_TRUE(same_bytes(outs[size_t(k)].data(), outs[0].data(), outs[0].size()))
        << what << ": rank " << k << " differs from rank 0";
  }
  for (uint32_t r = 0; r < nout; ++r)
    for (size_t i = 0; i < size; ++i) {
      const double got = load(d, outs[0].data() + r * size * esize, i);
      const double want = expected_reduce(w, d, op, i);
      if (got != want) {
        ADD_FAILURE() << what << " op " << sdk::reduce_op_name(op) << ": output " << r << " element " << i
                      << " is " << got << ", expected " << want;
        return;
      }
    }
}

// Size along the gather axis of replica r on rank k.
int64_t gather_len(size_t size, int k, uint32_t r) { return int64_t(size / 4) + (k + 2 * int(r)) % 3; }

void run_matrix(const std::string& transport, const World& w, const json& extra, const std::vector<size_t>& sizes) {
  // Every rank runs the same sequence; results land in per-case, per-rank slots.
  struct Case {
    std::string what;
    std::function<std::vector<unsigned char>(Cdo&, int)> run;
    std::function<void(const Outputs&)> check;
  };
  std::vector<Case> cases;
  for (DLDataType d : kDtypes) {
    for (size_t size : sizes) {
      for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MIN, STRATA_REDUCE_MAX,
                          STRATA_REDUCE_PROD}) {
        if (op == STRATA_REDUCE_PROD && w.n * int(w.nr) > 8) continue;  // keep products exact
        const std::string what = label(w, d, "all_reduce", size);
        cases.push_back({what, [=](Cdo& c, int rank) { return do_all_reduce(c, rank, w, d, size, op, false); },
                         [=](const Outputs& o) { check_all_reduce(o, w, d, size, op, w.nr, what); }});
      }
      {
        const std::string what = label(w, d, "reduce", size);
        cases.push_back({what,
                         [=](Cdo& c, int rank) { return do_all_reduce(c, rank, w, d, size, STRATA_REDUCE_SUM, true); },
                         [=](const Outputs& o) { check_all_reduce(o, w, d, size, STRATA_REDUCE_SUM, 1, what); }});
      }
      {
        const std::string what = label(w, d, "broadcast", size);
        cases.push_back({what,
                         [=](Cdo& c, int rank) {
                           Tensor src(d, {int64_t(size)});
                           for (size_t i = 0; i < size; ++i) src.set(i, value(rank, 0, 1, i, false));
                           std::vector<std::unique_ptr<Tensor>> dst;
                           std::vector<Tensor*> dp;
                           for (uint32_t r = 0; r < w.nr; ++r) {
                             dst.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{int64_t(size)}));
                             dp.push_back(dst.back().get());
                           }
                           Status s = c.broadcast(src, dp);
                           EXPECT_EQ(s.code, STRATA_OK) << s.message;
                           std::vector<unsigned char> all;
                           for (auto& x : dst) {
                             auto b = x->data_bytes();
                             all.insert(all.end(), b.begin(), b.end());
                           }
                           return all;
                         },
                         [=](const Outputs& o) {
                           Tensor want(d, {int64_t(size)});
                           for (size_t i = 0; i < size; ++i) want.set(i, value(0, 0, 1, i, false));
                           const auto wb = want.data_bytes();
                           for (int k = 0; k < w.n; ++k)
                             for (uint32_t r = 0; r < w.nr; ++r)
                               EXPECT_TRUE(same_bytes(o[size_t(k)].data() + r * wb.size(), wb.data(), wb.size()))
                                   << what << ": rank " << k << " replica " << r;
                         }});
      }
      for (int32_t axis : {0, 1}) {
        const std::string what = label(w, d, axis == 0 ? "all_gather axis 0" : "all_gather axis 1", size);
        // Inputs [len, 3] (axis 0) or [2, len] (axis 1); element = f(rank, replica, position).
        auto shape_of = [=](int64_t len) {
          return axis == 0 ? std::vector<int64_t>{len, 3} : std::vector<int64_t>{2, len};
        };
        int64_t total = 0;
        for (int k = 0; k < w.n; ++k)
          for (uint32_t r = 0; r < w.nr; ++r) total += gather_len(size, k, r);
        cases.push_back({what,
                         [=](Cdo& c, int rank) {
                           std::vector<std::unique_ptr<Tensor>> in, out;
                           std::vector<Tensor*> ip, op;
                           for (uint32_t r = 0; r < w.nr; ++r) {
                             in.push_back(std::make_unique<Tensor>(d, shape_of(gather_len(size, rank, r))));
                             for (size_t i = 0; i < in.back()->count(); ++i)
                               in.back()->set(i, value(rank, int(r), 2, i, false));
                             ip.push_back(in.back().get());
                             out.push_back(std::make_unique<Tensor>(d, shape_of(total)));
                             op.push_back(out.back().get());
                           }
                           Status s = c.all_gather(ip, axis, op);
                           EXPECT_EQ(s.code, STRATA_OK) << s.message;
                           std::vector<unsigned char> all;
                           for (auto& x : out) {
                             auto b = x->data_bytes();
                             all.insert(all.end(), b.begin(), b.end());
                           }
                           return all;
                         },
                         [=](const Outputs& o) {
                           // Reference: concatenation in (rank, replica) order.
                           Tensor want(d, shape_of(total));
                           int64_t col = 0;
                           for (int k = 0; k < w.n; ++k)
                             for (uint32_t r = 0; r < w.nr; ++r) {
                               const int64_t len = gather_len(size, k, r);
                               for (int64_t a = 0; a < len; ++a)
                                 for (int64_t b = 0; b < (axis == 0 ? 3 : 2); ++b) {
                                   const size_t src = size_t(axis == 0 ? a * 3 + b : b * len + a);
                                   const size_t dst = size_t(axis == 0 ? (col + a) * 3 + b : b * total + col + a);
                                   want.set(dst, value(k, int(r), 2, src, false));
                                 }
                               col += len;
                             }
                           const auto wb = want.data_bytes();
                           for (int k = 0; k < w.n; ++k)
                             for (uint32_t r = 0; r < w.nr; ++r)
                               EXPECT_TRUE(same_bytes(o[size_t(k)].data() + r * wb.size(), wb.data(), wb.size()))
                                   << what << ": rank " << k << " replica " << r;
                         }});
      }
      for (uint32_t op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
        const std::string what = label(w, d, "reduce_scatter", size);
        const int64_t parts = int64_t(w.n) * w.nr;
        const int64_t rows = parts * int64_t(size / size_t(2 * parts));  // may be 0
        cases.push_back({what,
                         [=](Cdo& c, int rank) {
                           std::vector<std::unique_ptr<Tensor>> in, out;
                           std::vector<Tensor*> ip, opp;
                           for (uint32_t r = 0; r < w.nr; ++r) {
                             in.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{rows, 2}));
                             for (size_t i = 0; i < in.back()->count(); ++i)
                               in.back()->set(i, value(rank, int(r), 0, i, false));
                             ip.push_back(in.back().get());
                             out.push_back(std::make_unique<Tensor>(d, std::vector<int64_t>{rows / parts, 2}));
                             opp.push_back(out.back().get());
                           }
                           Status s = c.reduce_scatter(op, ip, opp);
                           EXPECT_EQ(s.code, STRATA_OK) << s.message;
                           std::vector<unsigned char> all;
                           for (auto& x : out) {
                             auto b = x->data_bytes();
                             all.insert(all.end(), b.begin(), b.end());
                           }
                           return all;
                         },
                         [=](const Outputs& o) {
                           const size_t slice = size_t(rows / parts) * 2;
                           const size_t esize = d.bits / 8;
                           for (int k = 0; k < w.n; ++k)
                             for (uint32_t r = 0; r < w.nr; ++r)
                               for (size_t i = 0; i < slice; ++i) {
                                 const size_t g = (size_t(k) * w.nr + r) * slice + i;
                                 const double got = load(d, o[size_t(k)].data() + r * slice * esize, i);
                                 const double want = expected_reduce(w, d, op, g);
                                 if (got != want) {
                                   ADD_FAILURE() << what << " " << sdk::reduce_op_name(op) << ": rank " << k
                                                 << " replica " << r << " element " << i << " is " << got
                                                 << ", expected " << want;
                                   return;
                                 }
                               }
                         }});
      }
    }
  }
  std::vector<Outputs> results(cases.size(), Outputs(size_t(w.n)));
  run_world(transport, w.n, extra, [&](int rank, Cdo& cdo) {
    for (size_t c = 0; c < cases.size(); ++c) results[c][size_t(rank)] = cases[c].run(cdo, rank);
  });
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c].what);
    cases[c].check(results[c]);
    if (::testing::Test::HasFailure()) return;
  }
}

// `n` vectors of `size` floats in [-1, 1) from a linear congruential
// generator (the order of additions shows in their sums' bits).
std::vector<std::vector<float>> random_floats(int n, size_t size, uint32_t seed) {
  std::vector<std::vector<float>> data(static_cast<size_t>(n));
  for (auto& v : data) {
    v.resize(size);
    for (float& x : v) {
      seed = seed * 1664525u + 1013904223u;
      x = float(seed >> 8) / float(1 << 24) * 2.0f - 1.0f;
    }
  }
  return data;
}

class RingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { load_plugins(); }
  const std::string& transport() const { return GetParam(); }
};

std::vector<size_t> matrix_sizes() {
  if (kSanitized) return {0, 1, 7, 13, 1001, 9000};
  return {0, 1, 7, 13, 1001, 40000};
}

// Direct exchange for small payloads, ring with 1 MiB chunks above 64 KiB.
TEST_P(RingTest, AllOpsAllDtypesDefaultOptions) {
  for (World w : {World{2, 1}, World{3, 2}, World{4, 1}, World{8, 1}}) {
    if (kSanitized && w.n == 8) continue;
    run_matrix(transport(), w, json::object(), matrix_sizes());
    if (HasFailure()) return;
  }
}

// Always the ring, with tiny chunks: counts below world_size, empty and
// uneven segments, many chunks per segment in flight.
TEST_P(RingTest, AllOpsAllDtypesRingSmallChunks) {
  const json extra = {{"direct_max_bytes", 0}, {"chunk_bytes", 64}};
  for (World w : {World{2, 2}, World{3, 1}, World{5, 2}, World{8, 1}}) {
    // 64-byte chunks over real sockets are slow; 8 ranks run in process only.
    if ((kSanitized || transport() == "tcp" || transport().rfind("libfabric", 0) == 0) && w.n > 5) continue;
    if (kSanitized && w.n > 3) continue;
    run_matrix(transport(), w, extra, kSanitized ? std::vector<size_t>{0, 1, 7, 13, 1001}
                                                 : std::vector<size_t>{0, 1, 7, 13, 1001, 5003});
    if (HasFailure()) return;
  }
}

// Above direct_max_ranks nothing talks to every rank: small payloads take
// the ring and the barrier is a dissemination barrier (3, 5 and 8 ranks: a
// world that is not a power of two included). Every op and dtype still
// gives the right result.
TEST_P(RingTest, AboveDirectMaxRanksSmallPayloadsAndBarriersUseBoundedPeers) {
  const json extra = {{"direct_max_ranks", 2}};
  // 3, 5 and 6 ranks fold 1, 1 and 2 ranks into the recursive doubling's
  // power of two (4); 8 folds none.
  for (World w : {World{3, 1}, World{5, 2}, World{6, 1}, World{8, 1}}) {
    if (kSanitized && w.n > 5) continue;
    run_matrix(transport(), w, extra, kSanitized ? std::vector<size_t>{0, 1, 7, 13} : std::vector<size_t>{0, 1, 7, 13, 1001});
    if (HasFailure()) return;
  }
}

// Recursive doubling (above direct_max_ranks for small all-reduces, and
// with 4 or more ranks up to doubling_max_bytes): with random floats
// (where the order of additions shows in the bits) every rank must still end
// with the same bits, including the ranks folded in and out (7 ranks: 3 fold
// into a power of two of 4; 6 ranks: 2).
TEST_P(RingTest, RecursiveDoublingIsBitIdenticalOnEveryRank) {
  struct Case {
    int n;
    json extra;
    size_t size;
  };
  const json doubling = {{"doubling_max_bytes", 262144}};  // off by default
  const std::vector<Case> cases = {{kSanitized ? 5 : 7, {{"direct_max_ranks", 2}}, 1000},  // 4000 bytes
                                   {4, doubling, kSanitized ? 20000 : 60000},           // 240 KB: still doubling
                                   {6, doubling, 1000}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.n) + " ranks, " + c.extra.dump() + ", " + std::to_string(c.size) + " floats");
    const int n = c.n;
    const size_t size = c.size;
    const std::vector<std::vector<float>> data = random_floats(n, size, 777);
    Outputs outs(n);
    run_world(transport(), n, c.extra, [&](int rank, Cdo& cdo) {
      Tensor in(kFloat32, {int64_t(size)}), out(kFloat32, {int64_t(size)});
      copy_bytes(in.bytes.data(), data[size_t(rank)].data(), size * 4);
      for (strata_reduce_op op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN}) {
        Status s = cdo.all_reduce(op, {&in}, {&out}, 1);
        EXPECT_EQ(s.code, STRATA_OK) << s.message;
      }
      outs[size_t(rank)] = out.data_bytes();  // the MEAN
    });
    for (int k = 1; k < n; ++k) ASSERT_EQ(outs[size_t(k)], outs[0]) << "rank " << k << " differs from rank 0";
    for (size_t i = 0; i < size; ++i) {
      double want = 0;
      for (int k = 0; k < n; ++k) want += double(data[size_t(k)][i]);
      ASSERT_NEAR(load(kFloat32, outs[0].data(), i), want / n, 1e-5) << i;
    }
  }
}

// Random (non-integer) float data: results are bit-identical on every rank
// and from run to run, and close to a float64 reference.
TEST_P(RingTest, BitIdenticalAcrossRanksAndRuns) {
  const size_t size = kSanitized ? 20011 : 200011;
  const int n = 3;
  const std::vector<std::vector<float>> data = random_floats(n, size, 12345);
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 2; ++run) {
    Outputs outs(n);
    run_world(transport(), n, {{"chunk_bytes", 4096}}, [&](int rank, Cdo& cdo) {
      Tensor in(kFloat32, {int64_t(size)}), out(kFloat32, {int64_t(size)});
      copy_bytes(in.bytes.data(), data[size_t(rank)].data(), size * 4);
      Status s = cdo.all_reduce(STRATA_REDUCE_SUM, {&in}, {&out}, 1);
      EXPECT_EQ(s.code, STRATA_OK) << s.message;
      outs[size_t(rank)] = out.data_bytes();
    });
    for (int k = 1; k < n; ++k) ASSERT_EQ(outs[size_t(k)], outs[0]) << "rank " << k << " differs from rank 0";
    for (size_t i = 0; i < size; ++i) {
      const double want = double(data[0][i]) + double(data[1][i]) + double(data[2][i]);
      ASSERT_NEAR(load(kFloat32, outs[0].data(), i), want, 1e-5) << i;
    }
    if (run == 0) first = outs;
    else EXPECT_EQ(first[0], outs[0]) << "results differ between two runs";
  }
}

TEST_P(RingTest, LargeAllReduce) {
  const size_t size = kSanitized ? (size_t(8) << 20) / 4 : (size_t(64) << 20) / 4;
  Outputs outs(2);
  const auto t0 = std::chrono::steady_clock::now();
  run_world(transport(), 2, json::object(), [&](int rank, Cdo& cdo) {
    Tensor in(kFloat32, {int64_t(size)});
    float* p = reinterpret_cast<float*>(in.bytes.data());
    for (size_t i = 0; i < size; ++i) p[i] = float(int(i % 1000) - 500 + rank);
    Status s = cdo.all_reduce(STRATA_REDUCE_SUM, {&in}, {&in}, 1);  // in place
    EXPECT_EQ(s.code, STRATA_OK) << s.message;
    outs[size_t(rank)] = in.data_bytes();
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("seconds", std::to_string(secs));
  ASSERT_EQ(outs[0], outs[1]);
  for (size_t i = 0; i < size; ++i) {
    const float want = float(2 * (int(i % 1000) - 500) + 1);
    if (load(kFloat32, outs[0].data(), i) != want) {
      FAIL() << "element " << i << " is " << load(kFloat32, outs[0].data(), i) << ", expected " << want;
    }
  }
}

// Mixed dtypes and sizes in one batch; small bytes_per_pack splits them
// into several collectives (counted through the host's fingerprint record).
TEST_P(RingTest, BatchPacking) {
  struct Spec {
    DLDataType d;
    int64_t n;
  };
  const std::vector<Spec> specs = {{kFloat32, 10}, {kFloat32, 300}, {kInt32, 7},   {kFloat16, 50},
                                   {kFloat32, 1},  {kFloat64, 0},   {kBFloat16, 33}, {kFloat32, 2000}};
  // tf.distribute's group_by_size with 1024-byte packs: a pack takes the next
  // tensor while it holds at most 1024 bytes. float32: [10, 300] (40 + 1200 B,
  // closed once over 1024) | [1, 2000] (4 + 8000 B); the other dtypes one
  // pack each: 6 collectives per batch (closing a pack before it would
  // exceed the limit, as Strata did before, made 8).
  const int n = 3;
  const uint32_t nr = 2;
  const std::string comm = unique_comm("pack");
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      try {
        Cdo cdo(options_for(transport(), rank, n, comm, {{"bytes_per_pack", 1024}, {"direct_max_bytes", 512}}));
        std::vector<std::unique_ptr<Tensor>> in, out;
        std::vector<Tensor*> ip, op;
        for (size_t t = 0; t < specs.size(); ++t)
          for (uint32_t r = 0; r < nr; ++r) {
            in.push_back(std::make_unique<Tensor>(specs[t].d, std::vector<int64_t>{specs[t].n}));
            for (size_t i = 0; i < size_t(specs[t].n); ++i) in.back()->set(i, value(rank, int(r), int(t), i, false));
            ip.push_back(in.back().get());
            out.push_back(std::make_unique<Tensor>(specs[t].d, std::vector<int64_t>{specs[t].n}));
            op.push_back(out.back().get());
          }
        for (int iter = 0; iter < 2; ++iter) {
          Status s = cdo.all_reduce(STRATA_REDUCE_MEAN, ip, op, nr);
          ASSERT_EQ(s.code, STRATA_OK) << s.message;
          for (size_t t = 0; t < specs.size(); ++t)
            for (uint32_t r = 0; r < nr; ++r)
              for (size_t i = 0; i < size_t(specs[t].n); ++i) {
                double acc = 0;
                for (int k = 0; k < n; ++k)
                  for (uint32_t q = 0; q < nr; ++q) acc += value(k, int(q), int(t), i, false);
                const DLDataType d = specs[t].d;
                const double want = is_int(d)                     ? double(int64_t(acc) / (n * int(nr)))
                                    : dtype_equal(d, kFloat64) ? acc / (n * nr)
                                                               : as_dtype(d, double(float(acc) / float(n * nr)));
                const double got = load(d, op[t * nr + r]->bytes.data(), i);
                ASSERT_EQ(got, want) << "tensor " << t << " replica " << r << " element " << i;
              }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
  const json last = json::parse(PluginHost::global().last_collectives_json());
  ASSERT_TRUE(last.contains(comm)) << last.dump();
  EXPECT_EQ(last[comm]["sequence"].get<uint64_t>(), 11u) << "two batches of 6 packs each: sequences 0..11";
}

// Started all-reduces overlap with the caller's work and complete in order;
// a blocking call queues behind them.
TEST_P(RingTest, StartWaitOverlaps) {
  const int n = 3;
  const std::vector<size_t> sizes = {5, 100000, 3, 70000};
  run_world(transport(), n, {{"chunk_bytes", 8192}}, [&](int rank, Cdo& cdo) {
    std::vector<std::unique_ptr<Tensor>> ts;
    std::vector<strata_cdo_request_t> reqs;
    std::vector<std::vector<const DLTensor*>> ins;
    std::vector<std::vector<DLTensor*>> outs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      ts.push_back(std::make_unique<Tensor>(kFloat32, std::vector<int64_t>{int64_t(sizes[k])}));
      for (size_t i = 0; i < sizes[k]; ++i) ts.back()->set(i, value(rank, 0, int(k), i, false));
      ins.push_back({&ts.back()->t});
      outs.push_back({&ts.back()->t});  // in place
      strata_error err;
      strata_error_init(&err);
      strata_cdo_request_t req = nullptr;
      ASSERT_EQ(STRATA_OK, cdo.vt()->all_reduce_start(cdo.h(), STRATA_REDUCE_SUM, 1, 1, ins.back().data(),
                                                      outs.back().data(), &req, &err))
          << err.message;
      reqs.push_back(req);
    }
    // A blocking call while four are pending runs after them.
    Tensor b(kInt64, {9}), bo(kInt64, {9});
    for (size_t i = 0; i < 9; ++i) b.set(i, double(rank + 1));
    Status s = cdo.all_reduce(STRATA_REDUCE_SUM, {&b}, {&bo}, 1);
    ASSERT_EQ(s.code, STRATA_OK) << s.message;
    for (size_t i = 0; i < 9; ++i) EXPECT_EQ(load(kInt64, bo.bytes.data(), i), double(n * (n + 1) / 2));
    // Wait out of order.
    for (size_t k : {size_t(2), size_t(0), size_t(3), size_t(1)}) {
      strata_error err;
      strata_error_init(&err);
      ASSERT_EQ(STRATA_OK, cdo.vt()->request_wait(cdo.h(), reqs[k], 10000, &err)) << err.message;
      for (size_t i = 0; i < sizes[k]; ++i) {
        double want = 0;
        for (int q = 0; q < n; ++q) want += value(q, 0, int(k), i, false);
        ASSERT_EQ(load(kFloat32, ts[k]->bytes.data(), i), want) << "request " << k << " element " << i;
      }
    }
    strata_error err;
    strata_error_init(&err);
    EXPECT_EQ(STRATA_ERR_INVALID_ARGUMENT, cdo.vt()->request_wait(cdo.h(), reqs[0], 10, &err))
        << "a request may be waited for once";
  });
}

TEST_P(RingTest, BarrierWaitsForEveryRank) {
  for (const json& extra : {json::object(), json{{"direct_max_ranks", 2}}}) {  // all-to-all, then dissemination
  SCOPED_TRACE(extra.dump());
  const int n = extra.empty() ? 4 : 7;
  std::atomic<int64_t> late_arrival_ns{0};
  std::vector<int64_t> returned(static_cast<size_t>(n));
  run_world(transport(), n, extra, [&](int rank, Cdo& cdo) {
    for (int round = 0; round < 3; ++round) {
      if (rank == 2 && round == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        late_arrival_ns = std::chrono::steady_clock::now().time_since_epoch().count();
      }
      Status s = cdo.barrier();
      ASSERT_EQ(s.code, STRATA_OK) << s.message;
      if (round == 1) returned[size_t(rank)] = std::chrono::steady_clock::now().time_since_epoch().count();
    }
  });
  for (int k = 0; k < n; ++k) EXPECT_GE(returned[size_t(k)], late_arrival_ns.load()) << "rank " << k;
  }
}

// ------------------------------------------------------------ failures ---

struct Mismatch {
  std::string name;
  std::function<Status(Cdo&)> rank1;
  std::string rank1_text;
};

Status ar_float(Cdo& c, DLDataType d, size_t n) {
  Tensor x(d, {int64_t(n)});
  return c.all_reduce(STRATA_REDUCE_SUM, {&x}, {&x}, 1);
}

// Every mismatch case with 2, 3 and 4 ranks: both sides name it. `transport`
// (a "transport" ring option) and `others_wait_ms` (the ranks other than 1
// start that much later) are for the lazy transport below.
void check_mismatches(const std::string& name, const json& transport, int others_wait_ms) {
  const std::vector<Mismatch> cases = {
      {"op", [](Cdo& c) {
         Tensor x(kFloat32, {10}), o(kFloat32, {10 * 2});
         return c.all_gather({&x}, 0, {&o});
       }, "rank 1 called all_gather(float32 x 10)"},
      {"size", [](Cdo& c) { return ar_float(c, kFloat32, 1001); }, "rank 1 called all_reduce(SUM, float32 x 1001)"},
      {"dtype", [](Cdo& c) { return ar_float(c, kFloat64, 1000); }, "rank 1 called all_reduce(SUM, float64 x 1000)"},
      {"direct_vs_ring", [](Cdo& c) { return ar_float(c, kFloat32, 100000); },
       "rank 1 called all_reduce(SUM, float32 x 100000)"},
      {"halving_or_ring", [](Cdo& c) { return ar_float(c, kFloat32, 200000); },
       "rank 1 called all_reduce(SUM, float32 x 200000)"},
      // 120 KB: with doubling on (4 ranks), a message too large for the
      // others' receives, whose failure must still end in the mismatch.
      {"larger_message", [](Cdo& c) { return ar_float(c, kFloat32, 30000); },
       "rank 1 called all_reduce(SUM, float32 x 30000)"},
  };
  // 4 ranks: the others' all-reduce is the direct exchange in rounds, or
  // recursive doubling, whose messages carry the fingerprint (no step 0 of
  // their own), and rank 1's in the last case recursive halving.
  json doubling = {{"timeout_s", 20}, {"doubling_max_bytes", 262144}, {"halving_max_bytes", 4194304}};
  json rounds = {{"timeout_s", 20}, {"direct_doubling", true}};
  if (!transport.is_null()) doubling["transport"] = rounds["transport"] = transport;
  for (const auto& [n, extra] : {std::pair<int, json>{2, rounds}, {3, rounds}, {4, rounds}, {4, doubling}}) {
    for (const Mismatch& m : cases) {
      SCOPED_TRACE(m.name + " with " + std::to_string(n) + " ranks, " + extra.dump());
      std::vector<Status> st(static_cast<size_t>(n)), after(static_cast<size_t>(n));
      run_world(name, n, extra, [&](int rank, Cdo& cdo) {
        if (rank != 1 && others_wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(others_wait_ms));
        st[size_t(rank)] = rank == 1 ? m.rank1(cdo) : ar_float(cdo, kFloat32, 1000);
        after[size_t(rank)] = ar_float(cdo, kFloat32, 4);
      });
      for (int k = 0; k < n; ++k) {
        EXPECT_NE(st[size_t(k)].code, STRATA_OK) << "rank " << k << " did not fail";
        EXPECT_EQ(after[size_t(k)].code, STRATA_ERR_FAILED_PRECONDITION) << after[size_t(k)].message;
      }
      for (int k : {0, 1}) {
        EXPECT_EQ(st[size_t(k)].code, STRATA_ERR_INVALID_ARGUMENT) << "rank " << k << ": " << st[size_t(k)].message;
        EXPECT_NE(st[size_t(k)].message.find("collective mismatch at #0"), std::string::npos) << st[size_t(k)].message;
        EXPECT_NE(st[size_t(k)].message.find("rank 0 called all_reduce(SUM, float32 x 1000)"), std::string::npos)
            << st[size_t(k)].message;
        EXPECT_NE(st[size_t(k)].message.find(m.rank1_text), std::string::npos) << st[size_t(k)].message;
      }
    }
  }
}

TEST_P(RingTest, MismatchedCollectivesFailOnBothSides) { check_mismatches(transport(), json(), 0); }

// A transport that moves sends only inside its sender's wait or test (as
// libfabric's providers do), with rank 1's larger messages already waiting
// when the others post their receives: a rank whose receive fails at once
// (too small for rank 1's message) must still let its own message to rank 1
// leave, or rank 1 sees only its abort and cannot name the mismatch.
TEST(RingLazyTransport, MismatchedCollectivesFailOnBothSides) {
  load_plugins();
  check_mismatches("ring_test_inproc", {{"name", "ring_test_inproc"}, {"options", {{"lazy_sends", true}}}}, 150);
}

void check_another_algorithm(const std::string& name, const json& transport, int rank1_wait_ms);

// The same for options that pick another algorithm on rank 1, with the
// others' messages already waiting when rank 1 posts its receives: rank 1
// finds the difference first and must let its own message leave, so that
// the others can say what rank 1 runs.
TEST(RingLazyTransport, AnotherAlgorithmOnOneRankIsReported) {
  load_plugins();
  check_another_algorithm("ring_test_inproc", {{"name", "ring_test_inproc"}, {"options", {{"lazy_sends", true}}}},
                          150);
}

// Options that pick another all-reduce algorithm on one rank (here rank 1
// never uses recursive doubling, so it sends step 0 with its value where the
// others send the first round) are reported as such, not as a hang or as
// wrong sums.
// `transport` (a "transport" ring option) and `rank1_wait_ms` (rank 1
// starts that much later) are for the lazy transport below.
void check_another_algorithm(const std::string& name, const json& transport, int rank1_wait_ms) {
  const int n = 4;
  struct Case {
    const char* option;
    size_t count;
    const char* theirs;  // what rank 1 runs, as the others see it
    json on;             // every rank's options; rank 1 then sets `option` to 0
  };
  // 1000 floats: recursive doubling (rank 1: the direct exchange); 100,000
  // floats (400 KB): recursive halving, or the pairwise exchange (rank 1:
  // the ring).
  json on = {{"timeout_s", 20}, {"doubling_max_bytes", 262144}, {"halving_max_bytes", 4194304},
             {"direct_doubling", false}, {"pairwise_max_bytes", 0}};
  if (!transport.is_null()) on["transport"] = transport;
  json pairwise = on;
  pairwise["halving_max_bytes"] = 0;
  pairwise["pairwise_max_bytes"] = 4194304;
  pairwise["pairwise_min_bytes"] = 0;
  for (const Case& c : {Case{"doubling_max_bytes", 1000, "it sent the direct exchange where", on},
                        Case{"halving_max_bytes", 100000, "it sent the ring where", on},
                        Case{"pairwise_max_bytes", 100000, "it sent the ring where", pairwise}}) {
    SCOPED_TRACE(c.option);
    std::vector<Status> st(static_cast<size_t>(n));
    run_world(
        name, n, c.on,
        [&](int rank, Cdo& cdo) {
          if (rank == 1 && rank1_wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(rank1_wait_ms));
          st[size_t(rank)] = ar_float(cdo, kFloat32, c.count);
        },
        [&](int rank) { return rank == 1 ? json{{c.option, 0}} : json::object(); });
    for (int k = 0; k < n; ++k) {
      const std::string& m = st[size_t(k)].message;
      EXPECT_EQ(st[size_t(k)].code, STRATA_ERR_INVALID_ARGUMENT) << "rank " << k << ": " << m;
      EXPECT_NE(m.find("with another algorithm"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("'") + c.option + "'"), std::string::npos) << m;
    }
    // The verdict all ranks share comes from one rank's report; at least
    // the others' view of rank 1 shows up in it or in the rank's own part.
    bool named = false;
    for (int k = 0; k < n; ++k) named = named || st[size_t(k)].message.find(c.theirs) != std::string::npos;
    EXPECT_TRUE(named) << st[0].message;
  }
}

TEST_P(RingTest, AnotherAlgorithmOnOneRankIsReported) {
  check_another_algorithm(transport(), json(), 0);
  const int n = 4;
  // The defaults of doubling_max_bytes (1000 floats) and of the pairwise
  // exchange (above 1 MiB up to 64 MiB): on over tcp (every message costs
  // system calls and wake-ups), off over the others (shared memory: cheap
  // messages), so rank 1's explicit "off" disagrees with the others'
  // default over tcp only, and at 400 KB (the ring everywhere) nowhere.
  // direct_doubling off changes nothing at 1000 floats: recursive doubling
  // takes them over tcp, the one-round exchange elsewhere.
  struct Default {
    const char* option;
    size_t count;
    bool tcp_differs;
  };
  for (const Default& c : {Default{"doubling_max_bytes", 1000, true}, Default{"direct_doubling", 1000, false},
                           Default{"pairwise_max_bytes", 300000, true},
                           Default{"pairwise_max_bytes", 100000, false}}) {
    SCOPED_TRACE(std::string(c.option) + "'s default at " + std::to_string(c.count) + " floats");
    std::vector<Status> st(static_cast<size_t>(n));
    run_world(
        transport(), n, {{"timeout_s", 20}},
        [&](int rank, Cdo& cdo) { st[size_t(rank)] = ar_float(cdo, kFloat32, c.count); },
        [&](int rank) {
          return rank != 1 ? json::object()
                 : std::string(c.option) == "direct_doubling" ? json{{c.option, false}} : json{{c.option, 0}};
        });
    for (int k = 0; k < n; ++k) {
      const std::string& m = st[size_t(k)].message;
      if (transport() == "tcp" && c.tcp_differs) {
        EXPECT_EQ(st[size_t(k)].code, STRATA_ERR_INVALID_ARGUMENT) << "rank " << k << ": " << m;
        EXPECT_NE(m.find("with another algorithm"), std::string::npos) << m;
      } else {
        EXPECT_EQ(st[size_t(k)].code, STRATA_OK) << "rank " << k << ": " << m;
      }
    }
  }
}

// The pairwise exchange sends each segment straight to the rank that
// reduces it, which adds the n values in the ring's order and operand order
// (op(v_k, acc), around the ring from the segment's first rank): the ring's
// bits, so tcp's default does not make results depend on the transport.
// 3 and 4 ranks (5 in process); segments that do not split evenly; chunks
// of 16 KiB (several per segment, a short last one); in place and out of
// place; SUM against a float64 reference, and MIN over signed zeros and NaNs,
// whose result depends on which operand comes first.
// Every rank's result of an all-reduce of data[rank] among data.size()
// ranks, out of place and then in place: two entries appended to `outs`.
void all_reduce_both_ways(const std::string& transport, const json& options, strata_reduce_op op,
                          const std::vector<std::vector<float>>& data, std::vector<Outputs>& outs) {
  const int n = int(data.size());
  const size_t size = data[0].size();
  Outputs oop(n), ip(n);
  run_world(transport, n, options, [&](int rank, Cdo& cdo) {
    Tensor in(kFloat32, {int64_t(size)}), out(kFloat32, {int64_t(size)});
    copy_bytes(in.bytes.data(), data[size_t(rank)].data(), size * 4);
    Status s = cdo.all_reduce(op, {&in}, {&out}, 1);
    EXPECT_EQ(s.code, STRATA_OK) << s.message;
    oop[size_t(rank)] = out.data_bytes();
    s = cdo.all_reduce(op, {&in}, {&in}, 1);
    EXPECT_EQ(s.code, STRATA_OK) << s.message;
    ip[size_t(rank)] = in.data_bytes();
  });
  outs.push_back(oop);
  outs.push_back(ip);
}

// Where MIN's operand order shows: mostly zeros of either sign, some NaNs
// (two payloads), some numbers.
void mostly_signed_zeros_and_nans(std::vector<std::vector<float>>& data) {
  uint32_t seed = 7;
  for (auto& v : data)
    for (float& x : v) {
      seed = seed * 1664525u + 1013904223u;
      const uint32_t pick = (seed >> 24) % 8;
      if (pick < 3) x = 0.0f;
      else if (pick < 6) x = -0.0f;
      else if (pick == 6) x = (seed & 1) ? std::numeric_limits<float>::quiet_NaN() : -std::nanf("7");
    }
}

TEST_P(RingTest, PairwiseExchangeGivesTheRingsBits) {
  struct Case {
    strata_reduce_op op;
    size_t size;
    uint64_t chunk_bytes;  // 0: the transport's
  };
  for (int n : {3, 4, 5}) {
    if (n == 5 && (kSanitized || transport() != "ring_test_inproc")) continue;
    for (const Case& c : {Case{STRATA_REDUCE_SUM, 16385, 0}, Case{STRATA_REDUCE_SUM, 100003, 16384},
                          Case{STRATA_REDUCE_MIN, 30001, 16384}}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(c.size) + " floats, op " +
                   std::to_string(int(c.op)) + ", chunk_bytes " + std::to_string(c.chunk_bytes));
      std::vector<std::vector<float>> data = random_floats(n, c.size, 2027);
      if (c.op == STRATA_REDUCE_MIN) mostly_signed_zeros_and_nans(data);
      std::vector<Outputs> outs;  // the ring, then pairwise: out of place, in place
      for (uint64_t pairwise : {uint64_t(0), uint64_t(1) << 30}) {
        all_reduce_both_ways(
            transport(), {{"pairwise_max_bytes", pairwise}, {"pairwise_min_bytes", 0}, {"chunk_bytes", c.chunk_bytes}},
            c.op, data, outs);
      }
      for (size_t v = 0; v < outs.size(); ++v)
        for (int k = 0; k < n; ++k)
          ASSERT_EQ(outs[v][size_t(k)], outs[0][0]) << "variant " << v << " (0-1 ring, 2-3 pairwise), rank " << k;
      if (c.op == STRATA_REDUCE_SUM) {
        for (size_t i = 0; i < c.size; ++i) {
          double want = 0;
          for (int k = 0; k < n; ++k) want += double(data[size_t(k)][i]);
          ASSERT_NEAR(load(kFloat32, outs[0][0].data(), i), want, 1e-4) << i;
        }
      }
    }
  }
}

// From 4 ranks, all-reduces up to direct_max_bytes (64 KiB) fold the n
// values in recursive doubling's order whatever the algorithm: the direct
// exchange in one round (shared memory's default), in log2 n rounds and
// recursive doubling itself (tcp's default) give the same bits, so a job's
// results do not depend on the transport. Random floats (SUM) and signed
// zeros with NaNs (MIN, where the operand order shows), in place and out of
// place; 5 ranks have no rounds, and fold one rank in and out.
TEST_P(RingTest, SmallAllReducesGiveTheSameBitsInEveryAlgorithm) {
  const json one_round = {{"direct_doubling", false}, {"doubling_max_bytes", 0}};
  const json rounds = {{"direct_doubling", true}, {"doubling_max_bytes", 0}};
  const json doubling = {{"doubling_max_bytes", 65536}};
  for (int n : {4, 5, 8}) {
    if (n != 4 && (kSanitized || transport() != "ring_test_inproc")) continue;
    for (strata_reduce_op op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MIN}) {
      for (size_t size : {size_t(1), size_t(1001), size_t(16384)}) {
        SCOPED_TRACE(std::to_string(n) + " ranks, op " + std::to_string(int(op)) + ", " + std::to_string(size) +
                     " floats");
        std::vector<std::vector<float>> data = random_floats(n, size, 99);
        if (op == STRATA_REDUCE_MIN) mostly_signed_zeros_and_nans(data);
        std::vector<json> variants = {one_round, doubling};
        if (n != 5) variants.push_back(rounds);
        std::vector<Outputs> outs;  // per variant: out of place, in place
        for (const json& v : variants) {
          all_reduce_both_ways(transport(), v, op, data, outs);
        }
        for (size_t v = 0; v < outs.size(); ++v)
          for (int k = 0; k < n; ++k)
            ASSERT_EQ(outs[v][size_t(k)], outs[0][0]) << variants[v / 2].dump() << (v % 2 ? ", in place" : "")
                                                      << ": rank " << k << " differs";
        if (op != STRATA_REDUCE_SUM) continue;
        for (size_t i = 0; i < size; ++i) {
          double want = 0;
          for (int k = 0; k < n; ++k) want += double(data[size_t(k)][i]);
          ASSERT_NEAR(load(kFloat32, outs[0][0].data(), i), want, 1e-4) << i;
        }
      }
    }
  }
}

// Bad values of the algorithm options are refused when the instance is
// created, naming the option and what it must be.
TEST(RingOptions, BadAlgorithmOptionsAreRefused) {
  load_plugins();
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"doubling_max_bytes", 2000000000}}, "option 'doubling_max_bytes' of ring cross_device_ops is 2000000000 but "
                                              "must be at most 1 GiB"},
      {{{"doubling_max_bytes", -1}}, "doubling_max_bytes"},
      {{{"halving_max_bytes", "4M"}}, "halving_max_bytes"},
      {{{"pairwise_max_bytes", 1ull << 31}}, "option 'pairwise_max_bytes' of ring cross_device_ops is 2147483648 "
                                              "but must be at most 1 GiB"},
      {{{"pairwise_max_bytes", -5}}, "pairwise_max_bytes"},
      {{{"pairwise_min_bytes", -1}}, "pairwise_min_bytes"},
      {{{"pairwise_min_bytes", 8388608}, {"pairwise_max_bytes", 4194304}},
       "options 'pairwise_min_bytes' (8388608) and 'pairwise_max_bytes' (4194304) of ring cross_device_ops leave "
       "no size for the pairwise exchange"},
  };
  for (const auto& [extra, want] : cases) {
    try {
      Cdo cdo(options_for("tcp", 0, 1, "ringtest-badopt", extra));
      ADD_FAILURE() << extra.dump() << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << extra.dump() << ": " << e.what();
    }
  }
}

// Recursive halving then doubling (4 and 8 ranks, between doubling_max_bytes
// and halving_max_bytes): random floats, an element count that does not
// split evenly into blocks, in place and out of place; every rank ends with
// the same bits, close to a float64 reference.
TEST_P(RingTest, HalvingAndDoublingIsBitIdenticalOnEveryRank) {
  const size_t size = kSanitized ? 70001 : 100003;  // 280-400 KB
  for (int n : {4, 8}) {
    if (n == 8 && (kSanitized || transport() != "ring_test_inproc")) continue;
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const std::vector<std::vector<float>> data = random_floats(n, size, 4242);
    Outputs in_place(n), out_of_place(n);
    run_world(transport(), n, {{"halving_max_bytes", 4194304}}, [&](int rank, Cdo& cdo) {  // tcp's default
      Tensor in(kFloat32, {int64_t(size)}), out(kFloat32, {int64_t(size)});
      copy_bytes(in.bytes.data(), data[size_t(rank)].data(), size * 4);
      Status s = cdo.all_reduce(STRATA_REDUCE_SUM, {&in}, {&out}, 1);
      EXPECT_EQ(s.code, STRATA_OK) << s.message;
      out_of_place[size_t(rank)] = out.data_bytes();
      EXPECT_EQ(in.data_bytes(), std::vector<unsigned char>(reinterpret_cast<const unsigned char*>(
                                                               data[size_t(rank)].data()),
                                                           reinterpret_cast<const unsigned char*>(
                                                               data[size_t(rank)].data() + size)))
          << "the input changed";
      s = cdo.all_reduce(STRATA_REDUCE_SUM, {&in}, {&in}, 1);
      EXPECT_EQ(s.code, STRATA_OK) << s.message;
      in_place[size_t(rank)] = in.data_bytes();
    });
    for (int k = 0; k < n; ++k) {
      ASSERT_EQ(out_of_place[size_t(k)], out_of_place[0]) << "rank " << k << " differs from rank 0";
      ASSERT_EQ(in_place[size_t(k)], out_of_place[0]) << "rank " << k << " in place differs";
    }
    for (size_t i = 0; i < size; ++i) {
      double want = 0;
      for (int k = 0; k < n; ++k) want += double(data[size_t(k)][i]);
      ASSERT_NEAR(load(kFloat32, out_of_place[0].data(), i), want, 1e-4) << i;
    }
  }
}

// A rank that never calls the collective: the others fail within their
// timeout, naming it, instead of hanging.
TEST_P(RingTest, StoppedRankTimesOut) {
  const int n = 3;
  std::vector<Status> st(n);
  std::vector<double> secs(n);
  std::atomic<int> finished{0};
  // The ring's timeout also bounds the rendezvous that builds the
  // communicator; libfabric's fi_getinfo alone takes a good part of a second
  // under ThreadSanitizer, so sanitized builds wait longer for the stalled rank.
  const int timeout_s = kSanitized ? 4 : 1;
  run_world(transport(), n, {{"timeout_s", timeout_s}}, [&](int rank, Cdo& cdo) {
    if (rank == 2) {
      // Stay alive (connections open) until the others gave up.
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (finished.load() < n - 1 && std::chrono::steady_clock::now() < limit)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    st[size_t(rank)] = ar_float(cdo, kFloat32, 50000);
    secs[size_t(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++finished;
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(st[size_t(k)].code, STRATA_OK);
    EXPECT_LT(secs[size_t(k)], 10.0 + timeout_s) << "rank " << k;
    EXPECT_NE(st[size_t(k)].message.find("all_reduce #0"), std::string::npos) << st[size_t(k)].message;
  }
  // Rank 1's left and right neighbour is rank 2 or rank 0; the one that
  // timed out names rank 2 as the culprit.
  bool named = false;
  for (int k = 0; k < 2; ++k)
    named = named || (st[size_t(k)].code == STRATA_ERR_DEADLINE_EXCEEDED &&
                      st[size_t(k)].message.find("rank 2") != std::string::npos);
  EXPECT_TRUE(named) << st[0].message << "\n" << st[1].message;
  // One duration for one wait: the configured deadline and the time waited,
  // each labelled, and not the length of the transport's last wait slice.
  for (int k = 0; k < 2; ++k) {
    const std::string& m = st[size_t(k)].message;
    if (st[size_t(k)].code != STRATA_ERR_DEADLINE_EXCEEDED) continue;
    EXPECT_NE(m.find("within the " + std::to_string(timeout_s) + " s deadline (timeout_s"), std::string::npos) << m;
    EXPECT_NE(m.find("; waited "), std::string::npos) << m;
    EXPECT_EQ(m.find(" ms"), std::string::npos) << "a second duration: " << m;
  }
}

// A failing rank aborts its communicator: ranks that were waiting on it
// fail fast, long before their own (60 s) deadline.
TEST_P(RingTest, AbortPropagatesFast) {
  const int n = 4;
  std::vector<Status> st(n);
  std::vector<double> secs(n);
  // The ring (not tcp's default pairwise exchange, whose step 0 reaches
  // every rank): only ring neighbours compare fingerprints.
  run_world(transport(), n, {{"timeout_s", 60}, {"direct_max_bytes", 0}, {"pairwise_max_bytes", 0}},
            [&](int rank, Cdo& cdo) {
    const auto t0 = std::chrono::steady_clock::now();
    // Rank 0 disagrees with everyone; its neighbours 1 and 3 see it and
    // abort, which must unblock rank 2 (whose neighbours agree with it).
    st[size_t(rank)] = ar_float(cdo, kFloat32, rank == 0 ? 1000 : 100000);
    secs[size_t(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  for (int k = 0; k < n; ++k) {
    EXPECT_NE(st[size_t(k)].code, STRATA_OK) << "rank " << k;
    EXPECT_LT(secs[size_t(k)], 10.0) << "rank " << k << ": " << st[size_t(k)].message;
  }
  EXPECT_NE(st[2].message.find("all_reduce #0"), std::string::npos) << st[2].message;
}

// A rank that destroys its instance (connections closed) makes the others
// fail fast too.
TEST_P(RingTest, DestroyedRankFailsOthersFast) {
  const int n = 3;
  std::vector<Status> st(n);
  std::vector<double> secs(n);
  run_world(transport(), n, {{"timeout_s", 60}}, [&](int rank, Cdo& cdo) {
    if (rank == 1) return;  // destroyed at once
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    st[size_t(rank)] = ar_float(cdo, kFloat32, 100000);
    secs[size_t(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  for (int k : {0, 2}) {
    EXPECT_NE(st[size_t(k)].code, STRATA_OK) << "rank " << k;
    EXPECT_LT(secs[size_t(k)], 10.0) << "rank " << k;
    EXPECT_NE(st[size_t(k)].message.find("rank 1"), std::string::npos) << st[size_t(k)].message;
  }
}

// Issue 11: a rank that is alive (its heartbeat advances) but has not
// entered the collective when the others' deadline passes is named as a
// straggler, with what its heartbeat shows, not as dead or frozen.
TEST_P(RingTest, AStragglerIsNamedWithWhatItIsDoing) {
  if (transport() != "tcp") GTEST_SKIP() << "the verdict does not depend on the transport; tcp covers it";
  const int n = 3;
  std::vector<Status> st(n);
  run_world(transport(), n,
            {{"timeout_s", 1.5}, {"heartbeat_timeout_s", 20}, {"heartbeat_interval_s", 0.25},
             {"diagnosis_timeout_s", 4}},
            [&](int rank, Cdo& cdo) {
              st[size_t(rank)] = ar_float(cdo, kFloat32, 1000);  // #0, together
              if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(kSanitized ? 8 : 5));
              const Status s = ar_float(cdo, kFloat32, 1000);    // #1: rank 2 is late
              if (rank != 2) st[size_t(rank)] = s;
            });
  EXPECT_EQ(st[2].code, STRATA_OK) << st[2].message;
  for (int k : {0, 1}) {
    const std::string& m = st[size_t(k)].message;
    EXPECT_EQ(st[size_t(k)].code, STRATA_ERR_DEADLINE_EXCEEDED) << m;
    EXPECT_EQ(m.rfind("rank 2 of 3 did not join #1 all_reduce(SUM, float32 x 1000) in time: a straggler", 0), 0u) << m;
    EXPECT_NE(m.find("is alive and its last heartbeat showed #0 all_reduce(SUM, float32 x 1000) completed"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(st[0].message.substr(0, st[0].message.find(" [rank ")),
            st[1].message.substr(0, st[1].message.find(" [rank ")))
      << "the survivors' verdicts differ";
}

INSTANTIATE_TEST_SUITE_P(Transports, RingTest, ::testing::ValuesIn(transports()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ------------------------------------------------------ plain options ---

class RingOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override { load_plugins(); }
};

TEST_F(RingOptionsTest, RejectsUnknownAndInvalidOptions) {
  auto expect_error = [](const std::string& opts, const std::string& text) {
    try {
      Cdo c(opts);
      ADD_FAILURE() << "accepted " << opts;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"num_packs": 2})", "unknown option 'num_packs'");
  expect_error(R"({"rank": 3, "world_size": 2})", "option 'rank'");
  expect_error(R"({"world_size": 0})", "world_size");
  expect_error(R"({"timeout_s": 0})", "timeout_s");
  expect_error(R"({"transport": {"name": "tcp", "bogus": 1}})", "unknown option 'bogus'");
  expect_error(R"({"transport": 7})", "option 'transport'");
}

TEST_F(RingOptionsTest, SingleProcessNeedsNoTransport) {
  Cdo c(R"({"transport": {"name": "no_such_transport"}})");
  Tensor a(kFloat32, {3}), b(kFloat32, {3}), o1(kFloat32, {3}), o2(kFloat32, {3});
  for (size_t i = 0; i < 3; ++i) {
    a.set(i, double(i));
    b.set(i, 10.0);
  }
  Status s = c.all_reduce(STRATA_REDUCE_MEAN, {&a, &b}, {&o1, &o2}, 2);
  ASSERT_EQ(s.code, STRATA_OK) << s.message;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(load(kFloat32, o1.bytes.data(), i), (double(i) + 10.0) / 2);
    EXPECT_EQ(load(kFloat32, o2.bytes.data(), i), (double(i) + 10.0) / 2);
  }
  EXPECT_EQ(c.barrier().code, STRATA_OK);
}

TEST_F(RingOptionsTest, RegisteredMemoryTransport) {
  // A transport that requires registered memory sees only registered buffers.
  Outputs outs(2);
  run_world("ring_test_inproc", 2, {{"transport", {{"name", "ring_test_inproc"}, {"options", {{"requires_mr", true}}}}},
                                    {"chunk_bytes", 1024}},
            [&](int rank, Cdo& cdo) {
              for (size_t size : {size_t(3), size_t(5000)}) {
                Tensor x(kInt32, {int64_t(size)});
                for (size_t i = 0; i < size; ++i) x.set(i, double(rank + 1));
                Status s = cdo.all_reduce(STRATA_REDUCE_SUM, {&x}, {&x}, 1);
                ASSERT_EQ(s.code, STRATA_OK) << s.message;
                for (size_t i = 0; i < size; ++i) ASSERT_EQ(load(kInt32, x.bytes.data(), i), 3.0);
              }
            });
}


// ------------------------------------------------- real processes ---

#ifdef RING_HAVE_TCP
// Real processes: this executable re-runs itself as RingProcessChild.Run
// with RING_CHILD_* set (the transport parameter in RING_CHILD_TRANSPORT).
// Rank 0 serves the TCP rendezvous store on an ephemeral port and writes its
// address to a file; the others connect to it. Every transport but the
// in-process fixture runs, since only they cross processes.
extern "C" char** environ;

// How the failure tests take rank `crash` away after a barrier: it exits
// (the transport may see the connection drop) or stops (it only goes silent,
// so the survivors can only notice at their deadline).
enum class Fault { kNone, kExit, kStop };

struct ProcRun {
  std::string transport;
  int world = 3;
  int crash = -1;
  Fault fault = Fault::kNone;
  int timeout_s = 20;
  std::vector<std::string> env{};               // more NAME=value for every child
  std::string child_test = "RingProcessChild.Run";
};

// "auto" in transports() emulates two hosts (tcp inside, tcp across); this
// parameter is auto as configured by default, where all ranks share this
// host and talk over libfabric/shm.
constexpr const char* kAutoOneHost = "auto_one_host";

constexpr int kStoppedStatus = 1000;  // reap(): the child stopped and was killed by the parent

pid_t spawn_child(const ProcRun& run, int rank, const std::string& store, const std::string& addr_file,
                  const std::string& comm) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "RING_CHILD_", 11) != 0) env.emplace_back(*e);
  env.push_back("RING_CHILD_RANK=" + std::to_string(rank));
  env.push_back("RING_CHILD_WORLD=" + std::to_string(run.world));
  env.push_back("RING_CHILD_STORE=" + store);
  env.push_back("RING_CHILD_ADDR_FILE=" + addr_file);
  env.push_back("RING_CHILD_CRASH=" + std::to_string(run.crash));
  env.push_back(std::string("RING_CHILD_FAULT=") + (run.fault == Fault::kStop ? "stop" : "exit"));
  env.push_back("RING_CHILD_TIMEOUT_S=" + std::to_string(run.timeout_s));
  env.push_back("RING_CHILD_TRANSPORT=" + run.transport);
  env.push_back("RING_CHILD_COMM=" + comm);
  env.push_back("STRATA_AUTH_TOKEN=ring-test-token");
  env.push_back("STRATA_LOG_LEVEL=warn");
  for (const std::string& e : run.env) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self(4096, '\0');
  const ssize_t len = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (len <= 0) return -1;
  self.resize(size_t(len));
  std::string filter = "--gtest_filter=" + run.child_test;
  char* argv[] = {self.data(), filter.data(), nullptr};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    ::execve(self.c_str(), argv, envp.data());
    ::_exit(127);
  }
  return pid;
}

// Reap every child by the deadline; kill the rest. Returns exit statuses
// (128 + signal when killed). A child that stops counts as done; once the
// others are done it is SIGKILLed and reported as kStoppedStatus, so a
// stopped rank is never left behind.
std::vector<int> reap(std::vector<pid_t>& pids, std::chrono::seconds limit) {
  std::vector<int> status(pids.size(), -1);
  std::vector<bool> stopped(pids.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  size_t left = 0;
  for (pid_t p : pids) left += p > 0 ? 1 : 0;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int st = 0;
      if (pids[i] <= 0 || stopped[i] || ::waitpid(pids[i], &st, WNOHANG | WUNTRACED) != pids[i]) continue;
      if (WIFSTOPPED(st)) {
        stopped[i] = true;
        status[i] = kStoppedStatus;
      } else {
        status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[i] = -1;
      }
      --left;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i)
    if (pids[i] > 0) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], nullptr, 0);
      pids[i] = -1;
    }
  return status;
}

std::vector<int> run_processes(const ProcRun& run) {
  const std::string addr_file = ::testing::TempDir() + "ring-store-" + std::to_string(::getpid()) + "-" +
                                std::to_string(g_comm_id++);
  const std::string comm = unique_comm("proc");
  std::remove(addr_file.c_str());
  std::vector<pid_t> pids{spawn_child(run, 0, "127.0.0.1:0", addr_file, comm)};
  std::string addr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (addr.empty() && std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(addr_file);
    std::getline(f, addr);
    if (addr.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    int st = 0;
    if (addr.empty() && ::waitpid(pids[0], &st, WNOHANG) == pids[0]) {
      pids[0] = -1;
      std::ifstream again(addr_file);  // it may have published just before it ended
      std::getline(again, addr);
      break;
    }
  }
  if (!addr.empty())
    for (int r = 1; r < run.world; ++r) pids.push_back(spawn_child(run, r, addr, addr_file, comm));
  std::vector<int> st = reap(pids, std::chrono::seconds(90));
  std::remove(addr_file.c_str());
  if (addr.empty()) ADD_FAILURE() << "rank 0 never published the store address";
  return st;
}

TEST(RingProcessChild, Run) {
  const char* rank_s = std::getenv("RING_CHILD_RANK");
  if (rank_s == nullptr) GTEST_SKIP() << "runs only as a child process of the RingProcessTest tests";
  load_plugins();
  const int rank = std::atoi(rank_s);
  const int world = std::atoi(std::getenv("RING_CHILD_WORLD"));
  const int crash = std::atoi(std::getenv("RING_CHILD_CRASH"));
  const bool stop = std::string(std::getenv("RING_CHILD_FAULT")) == "stop";
  const int timeout_s = std::atoi(std::getenv("RING_CHILD_TIMEOUT_S"));
  StoreConfig cfg;
  cfg.address = std::getenv("RING_CHILD_STORE");
  cfg.serve = rank == 0;
  cfg.timeout_s = 30;
  PluginHost::global().connect_store(cfg);
  if (rank == 0) {
    const std::string file = std::getenv("RING_CHILD_ADDR_FILE");
    {
      std::ofstream f(file + ".tmp");
      f << PluginHost::global().store_address() << "\n";
    }
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  const std::string transport = std::getenv("RING_CHILD_TRANSPORT");
  json opts = json::parse(options_for(transport == kAutoOneHost ? "auto" : transport, rank, world,
                                      std::getenv("RING_CHILD_COMM"), {{"timeout_s", timeout_s}}));
  if (transport == kAutoOneHost) opts["transport"] = {{"name", "auto"}};  // the real default: every rank local
  Cdo cdo(opts.dump());
  for (size_t size : {size_t(1), size_t(1000), size_t(300001)}) {
    Tensor x(kInt64, {int64_t(size)});
    for (size_t i = 0; i < size; ++i) x.set(i, double(int64_t(i) * (rank + 1)));
    Status s = cdo.all_reduce(STRATA_REDUCE_SUM, {&x}, {&x}, 1);
    ASSERT_EQ(s.code, STRATA_OK) << s.message;
    const double f = world * (world + 1) / 2;
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(load(kInt64, x.bytes.data(), i), double(i) * f) << i;
  }
  {
    Tensor in(kFloat32, {int64_t(rank + 1)}), out(kFloat32, {int64_t(world * (world + 1) / 2)});
    for (int i = 0; i <= rank; ++i) in.set(size_t(i), double(rank));
    Status s = cdo.all_gather({&in}, 0, {&out});
    ASSERT_EQ(s.code, STRATA_OK) << s.message;
    size_t pos = 0;
    for (int k = 0; k < world; ++k)
      for (int i = 0; i <= k; ++i) ASSERT_EQ(load(kFloat32, out.bytes.data(), pos++), double(k));
  }
  if (crash < 0) return;
  {
    const Status b = cdo.barrier();
    ASSERT_EQ(b.code, STRATA_OK) << b.message;
  }
  // A rank leaves the barrier once its own messages are received and its
  // sends complete locally, which over libfabric's tcp provider can be
  // before a peer has received them: the crashing rank waits until every
  // rank has marked itself past the barrier, so the fault lands in the
  // all-reduce, not in a survivor's barrier (store_get waits for the key,
  // up to 30 s, then throws naming it).
  const sdk::Host host(PluginHost::global().host_api());
  const std::string past = std::string("ringtest-past-barrier/") + std::getenv("RING_CHILD_COMM") + "/";
  host.store_set(past + std::to_string(rank), "1", 30000);
  if (rank == crash) {
    for (int r = 0; r < world; ++r) host.store_get(past + std::to_string(r), 30000);
    if (stop) ::kill(::getpid(), SIGSTOP);  // silent from here on; the parent SIGKILLs it
    ::_exit(7);                             // dies without closing anything cleanly
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status s = ar_float(cdo, kFloat32, 200000);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string culprit = "rank " + std::to_string(crash);
  EXPECT_NE(s.code, STRATA_OK);
  EXPECT_NE(s.message.find("all_reduce #"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find(culprit), std::string::npos) << "the error does not name " << culprit << ": "
                                                         << s.message;
  // Every survivor's error starts with the same verdict naming the culprit
  // (the culprit analysis), whichever neighbour it was waiting for.
  if (stop) {
    // The collective deadline (shorter than the heartbeat one here) ends the
    // wait; the diagnosis then finds the process stopped in /proc.
    EXPECT_EQ(s.message.rfind(culprit + " of 3 is frozen (" + culprit + "'s process (pid ", 0), 0u) << s.message;
    EXPECT_NE(s.message.find("is stopped (SIGSTOP"), std::string::npos) << s.message;
    EXPECT_EQ(s.code, STRATA_ERR_DEADLINE_EXCEEDED) << s.message;
    EXPECT_GE(secs, timeout_s * 0.9) << s.message;
    EXPECT_LT(secs, timeout_s + 5.0) << s.message;
  } else {
    // A dead peer is noticed when its connection drops, far before timeout_s.
    EXPECT_EQ(s.message.rfind(culprit + " of 3 died (" + culprit + "'s process (pid ", 0), 0u) << s.message;
    EXPECT_EQ(s.code, STRATA_ERR_UNAVAILABLE) << s.message;
    EXPECT_LT(secs, kSanitized ? 5.0 : 1.0) << s.message;
  }
  std::cerr << "rank " << rank << " failed as expected after " << secs << " s (code " << s.code
            << "): " << s.message << "\n";
}

std::vector<std::string> process_transports() {
  std::vector<std::string> v;
  for (const std::string& t : transports())
    if (t != "ring_test_inproc") v.push_back(t);
#if defined(RING_HAVE_AUTO) && defined(RING_HAVE_LIBFABRIC)
  v.push_back(kAutoOneHost);
#endif
  return v;
}

class RingProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (std::getenv("RING_CHILD_RANK") != nullptr) GTEST_SKIP();
  }
  // Takes `crash` away as `fault` after a barrier: every survivor must exit 0
  // (its own checks passed), the crashed rank as the fault leaves it.
  void expect_survivors(int crash, Fault fault, int timeout_s) {
    ProcRun run{GetParam(), 3, crash, fault, timeout_s};
    const std::vector<int> st = run_processes(run);
    ASSERT_EQ(st.size(), 3u);
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(st[size_t(r)], r != crash ? 0 : fault == Fault::kStop ? kStoppedStatus : 7) << "rank " << r;
  }
};

TEST_P(RingProcessTest, CollectivesAcrossProcesses) {
  const std::vector<int> st = run_processes(ProcRun{GetParam()});
  for (size_t r = 0; r < st.size(); ++r) EXPECT_EQ(st[r], 0) << "rank " << r;
  EXPECT_EQ(st.size(), 3u);
}

TEST_P(RingProcessTest, CrashedProcessFailsTheOthers) { expect_survivors(2, Fault::kExit, 20); }

// The middle rank: its two ring neighbours are different processes.
TEST_P(RingProcessTest, CrashedMiddleProcessFailsTheOthers) { expect_survivors(1, Fault::kExit, 20); }

// The timeout also bounds each child's rendezvous, slower under sanitizers.
TEST_P(RingProcessTest, StoppedProcessTimesOutTheOthers) { expect_survivors(1, Fault::kStop, kSanitized ? 6 : 3); }

INSTANTIATE_TEST_SUITE_P(Transports, RingProcessTest, ::testing::ValuesIn(process_transports()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ------------------------------------------------------- fault matrix ---
// Issue 11's fault matrix: one rank (the chief = rank 0, the first worker,
// a middle one, the last) is SIGKILLed or SIGSTOPped by a thread of its own,
// before it joins (setup), during a loop of small all-reduces or during a
// large one, in 4- and 8-rank jobs. Every survivor must fail with the same
// verdict naming that rank, a dead one within 1 s of the signal, a stopped
// one within the heartbeat deadline (2 s here; the collective deadline is a
// minute), one that never joined at the rendezvous deadline.

int64_t epoch_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr double kFaultHeartbeatS = 2.0;
constexpr int kFaultRendezvousS = kSanitized ? 8 : 3;

TEST(RingFaultChild, Run) {
  const char* rank_s = std::getenv("RING_CHILD_RANK");
  if (rank_s == nullptr || std::getenv("FAULT_KIND") == nullptr)
    GTEST_SKIP() << "runs only as a child process of Cases/RingFaultMatrix";
  load_plugins();
  const int rank = std::atoi(rank_s);
  const int world = std::atoi(std::getenv("RING_CHILD_WORLD"));
  const int victim = std::atoi(std::getenv("FAULT_RANK"));
  const std::string kind = std::getenv("FAULT_KIND"), phase = std::getenv("FAULT_PHASE");
  const std::string dir = std::getenv("FAULT_DIR");
  const size_t elems = size_t(std::atoll(std::getenv("FAULT_ELEMS")));
  auto inject = [&] {
    {
      std::ofstream f(dir + "/fault.tmp");
      f << epoch_ms_now() << "\n";
    }
    std::rename((dir + "/fault.tmp").c_str(), (dir + "/fault").c_str());
    ::kill(::getpid(), kind == "kill" ? SIGKILL : SIGSTOP);
    ::pause();  // SIGKILLed by the parent once the others are done
  };
  Status s;
  int64_t failed_ms = 0;
  StoreConfig cfg;
  cfg.address = std::getenv("RING_CHILD_STORE");
  cfg.serve = rank == 0;
  cfg.timeout_s = kFaultRendezvousS;
  try {
    PluginHost::global().connect_store(cfg);
    if (rank == 0) {
      const std::string file = std::getenv("RING_CHILD_ADDR_FILE");
      {
        std::ofstream f(file + ".tmp");
        f << PluginHost::global().store_address() << "\n";
      }
      std::rename((file + ".tmp").c_str(), file.c_str());
    }
    if (phase == "setup" && rank == victim) inject();
    Cdo cdo(options_for("tcp", rank, world, std::getenv("RING_CHILD_COMM"),
                        {{"timeout_s", 60}, {"setup_timeout_s", kFaultRendezvousS},
                         {"heartbeat_timeout_s", kFaultHeartbeatS}, {"heartbeat_interval_s", 0.5}}));
    // One collective before the fault: every rank has zero-filled its tensor
    // and the ring its scratch memory, so the fault lands in a collective in
    // flight. (Started at once, the victim died while the survivors still
    // filled 64 MiB tensors, which took 2 s and, beside a full suite, 5 s of
    // the measured detection time.)
    Tensor x(kFloat32, {int64_t(elems)});
    s = cdo.all_reduce(STRATA_REDUCE_SUM, {&x}, {&x}, 1);
    std::thread killer;
    if (rank == victim && s.code == STRATA_OK) killer = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      inject();
    });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (s.code == STRATA_OK && std::chrono::steady_clock::now() < until)
      s = cdo.all_reduce(STRATA_REDUCE_SUM, {&x}, {&x}, 1);
    failed_ms = epoch_ms_now();
    if (killer.joinable()) killer.join();
  } catch (const Error& e) {
    failed_ms = epoch_ms_now();
    s = Status{e.code(), e.what()};
  }
  ASSERT_NE(rank, victim) << "the victim must not get here";
  // The victim wrote its fault time before the signal.
  int64_t fault_ms = 0;
  for (int i = 0; i < 500 && fault_ms == 0; ++i) {
    std::ifstream f(dir + "/fault");
    if (!(f >> fault_ms)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double secs = fault_ms == 0 ? -1 : double(failed_ms - fault_ms) / 1000.0;
  json out = {{"rank", rank}, {"secs", secs}, {"code", int(s.code)}, {"message", s.message}};
  std::ofstream(dir + "/rank-" + std::to_string(rank) + ".result") << out.dump() << "\n";
  EXPECT_NE(s.code, STRATA_OK);
}

struct FaultCase {
  int world;
  int victim;
  std::string kind;   // kill, stop
  std::string phase;  // setup, small, large
};

// What every survivor's error must start with (or contain, for setup).
bool names_culprit(const FaultCase& c, const std::string& m) {
  const std::string who = "rank " + std::to_string(c.victim) + " of " + std::to_string(c.world);
  if (c.phase == "setup") {
    if (c.victim == 0) return m.find("store") != std::string::npos;  // the chief serves the store: nobody can join
    // At its own deadline a survivor says the victim "never joined"; one
    // that started later (a slow fork) still waits when the chief gives up
    // at the chief's deadline, and says the victim "had not joined" when
    // the store went away. Both name the victim.
    return m.find(who + " never joined") != std::string::npos || m.find(who + " had not joined") != std::string::npos;
  }
  if (m.rfind(who, 0) != 0) return false;
  const size_t verdict_end = m.find(" [rank ");
  const std::string verdict = m.substr(0, verdict_end);
  return c.kind == "kill" ? verdict.find(" died") != std::string::npos
                          : verdict.find(" is frozen") != std::string::npos;
}

// Every case of the matrix, each its own test so that ctest runs them side by
// side (they mostly wait on deadlines: one test of all 44 cases took 144 s).
std::vector<FaultCase> fault_cases() {
  std::vector<FaultCase> cases;
  for (int world : kSanitized ? std::vector<int>{4} : std::vector<int>{4, 8})
    for (int victim : {0, 1, world / 2, world - 1})
      for (const char* kind : {"kill", "stop"})
        for (const char* phase : {"setup", "small", "large"}) {
          // Bounded CI time: setup faults (each a rendezvous deadline) for
          // every position with 4 ranks, for two with 8; sanitized builds
          // run half the positions.
          if (std::string(phase) == "setup" && world == 8 && victim != 0 && victim != world / 2) continue;
          if (kSanitized && (victim == 1 || victim == world - 1)) continue;
          if (kSanitized && std::string(phase) == "setup" && victim == 0) continue;
          cases.push_back({world, victim, kind, phase});
        }
  return cases;
}

class RingFaultMatrix : public ::testing::TestWithParam<FaultCase> {};

TEST_P(RingFaultMatrix, EverySurvivorNamesTheCulprit) {
  if (std::getenv("RING_CHILD_RANK") != nullptr) GTEST_SKIP();
  const FaultCase& c = GetParam();
  // FAULT_MATRIX_REPS=5 repeats the case (detection-time medians for the notes).
  const int reps = std::getenv("FAULT_MATRIX_REPS") ? std::max(1, std::atoi(std::getenv("FAULT_MATRIX_REPS"))) : 1;
  const size_t large = kSanitized ? (size_t(1) << 20) : (size_t(16) << 20);  // 4 MiB / 64 MiB of float32
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    const std::string dir =
        ::testing::TempDir() + "fault-" + std::to_string(::getpid()) + "-" + std::to_string(g_comm_id++);
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
    ProcRun run{"tcp", c.world, -1, Fault::kNone, 60};
    run.child_test = "RingFaultChild.Run";
    run.env = {"FAULT_RANK=" + std::to_string(c.victim), "FAULT_KIND=" + c.kind, "FAULT_PHASE=" + c.phase,
               "FAULT_DIR=" + dir, "FAULT_ELEMS=" + std::to_string(c.phase == "large" ? large : size_t(1000))};
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> st = run_processes(run);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(st.size(), size_t(c.world));
    std::string first_verdict;
    for (int r = 0; r < c.world; ++r) {
      if (r == c.victim) {
        // (A chief that ends before the others start is reaped early: -1.)
        if (!(c.victim == 0 && c.phase == "setup" && st[0] == -1)) {
          EXPECT_EQ(st[size_t(r)], c.kind == "kill" ? 128 + SIGKILL : kStoppedStatus);
        }
        continue;
      }
      EXPECT_EQ(st[size_t(r)], 0) << "survivor rank " << r;
      std::ifstream f(dir + "/rank-" + std::to_string(r) + ".result");
      json j = json::parse(f, nullptr, false);
      if (j.is_discarded()) {
        ADD_FAILURE() << "rank " << r << " wrote no result";
        continue;
      }
      const std::string m = j["message"].get<std::string>();
      const double secs = j["secs"].get<double>();
      times.push_back(secs);
      EXPECT_TRUE(names_culprit(c, m)) << "rank " << r << ": " << m;
      // The same verdict, in the same words, on every survivor.
      const std::string verdict = m.substr(0, m.find(" [rank "));
      if (c.phase != "setup") {
        if (first_verdict.empty()) first_verdict = verdict;
        EXPECT_EQ(verdict, first_verdict) << "rank " << r;
      }
      // Bounds that tell detection from a timeout (60 s), not speed targets.
      // On a 2.1 GHz 2-core VM (2026-12-06, beside a CI run) a kill in a
      // 64 MiB all-reduce of 8 ranks is reported in 0.08-0.14 s (medians);
      // the median above is the figure to watch. (The 1.5-5.6 s measured
      // before the warm-up collective above was the survivors zero-filling
      // their tensors after the victim had died.)
      const double limit = c.phase == "setup" ? kFaultRendezvousS + 3.0
                           : c.kind == "kill" ? 5.0
                                              : kFaultHeartbeatS + 6.0;
      EXPECT_GE(secs, 0) << m;
      EXPECT_LT(secs, limit) << "rank " << r << " after " << secs << " s: " << m;
    }
    EXPECT_LT(took, 60) << "no hang";
    std::filesystem::remove_all(dir);
  }
  std::sort(times.begin(), times.end());
  std::cout << "detection time (fault to error on each survivor), " << c.world << " ranks, " << c.kind << " rank "
            << c.victim << " during " << c.phase << ": median " << (times.empty() ? -1 : times[times.size() / 2])
            << " s, max " << (times.empty() ? -1 : times.back()) << " s over " << times.size()
            << " survivor reports\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, RingFaultMatrix, ::testing::ValuesIn(fault_cases()),
                         [](const ::testing::TestParamInfo<FaultCase>& i) {
                           return i.param.kind + "_rank" + std::to_string(i.param.victim) + "_of" +
                                  std::to_string(i.param.world) + "_during_" + i.param.phase;
                         });
#endif  // RING_HAVE_TCP

}  // namespace
}  // namespace strata::test
