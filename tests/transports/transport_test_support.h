// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the transport tests (tcp_test, transport_suite_test,
// auto_test): ranks as threads of this process. Ranks as forked processes
// are in forked_ranks.h. Header-only; everything lives in strata::test.
//
// Contracts:
// - Deadlines: every blocking call here is bounded. TransportRank::join and
//   wait take a timeout (20 s unless the test says otherwise). run_ranks()
//   blocks until every thread returns, so its `fn` must itself only make
//   bounded calls.
// - Threads: a TransportRank is used by one thread, except abort(), which
//   another thread may call (the transport vtable's contract).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "strata/error.hpp"
#include "strata/plugin_host.hpp"

namespace strata::test {

/// A host (kDLCPU) buffer descriptor over caller-owned memory.
inline strata_buffer make_buf(void* data, uint64_t bytes, strata_mem_region_t mr = nullptr) {
  strata_buffer b{};
  STRATA_INIT_HEADER(&b, strata_buffer);
  b.data = data;
  b.bytes = bytes;
  b.device = DLDevice{kDLCPU, 0};
  b.mr = mr;
  return b;
}

/// One rank's transport instance (component `name`, JSON `options`) and its
/// communicator, throwing strata errors. Owns the instance, the communicator
/// and the regions registered through reg(): all are released by leave() or
/// the destructor (regions first). Buffers stay owned by the caller and must
/// outlive the requests posted on them.
class TransportRank {
 public:
  TransportRank(PluginHost& host, const std::string& name, const std::string& options)
      : inst_(host.create(STRATA_KIND_TRANSPORT, name, options)) {
    vt_ = inst_.vtable_as<strata_transport_vtable>();
  }
  ~TransportRank() { leave(); }
  TransportRank(const TransportRank&) = delete;
  TransportRank& operator=(const TransportRank&) = delete;

  const strata_transport_vtable* vt() const { return vt_; }
  strata_comm_t comm() const { return comm_; }
  /// Blocks until all `world` ranks joined `name`, or timeout_ms.
  void join(const std::string& name, int rank, int world, int64_t timeout_ms = 20000) {
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->comm_create(handle(), name.c_str(), rank, world, timeout_ms, &comm_, &e), e,
                         "comm_create");
  }
  /// Deregisters what is still registered and destroys the communicator.
  void leave() {
    for (auto mr : regions_) vt_->mem_deregister(comm_, mr);
    regions_.clear();
    if (comm_ != nullptr) vt_->comm_destroy(comm_);
    comm_ = nullptr;
  }
  strata_mem_region_t reg(void* data, uint64_t bytes) {
    strata_mem_region_t mr = nullptr;
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->mem_register(comm_, data, bytes, DLDevice{kDLCPU, 0}, &mr, &e), e, "mem_register");
    regions_.push_back(mr);
    return mr;
  }
  void dereg(strata_mem_region_t mr) {
    const auto it = std::find(regions_.begin(), regions_.end(), mr);
    if (it != regions_.end()) regions_.erase(it);
    vt_->mem_deregister(comm_, mr);
  }
  strata_request_t isend(int peer, uint64_t tag, const void* data, uint64_t bytes, strata_mem_region_t mr = nullptr) {
    strata_buffer b = make_buf(const_cast<void*>(data), bytes, mr);
    strata_request_t r = nullptr;
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->isend(comm_, peer, tag, &b, &r, &e), e, "isend");
    return r;
  }
  strata_request_t irecv(int peer, uint64_t tag, void* data, uint64_t bytes, strata_mem_region_t mr = nullptr) {
    strata_buffer b = make_buf(data, bytes, mr);
    strata_request_t r = nullptr;
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->irecv(comm_, peer, tag, &b, &r, &e), e, "irecv");
    return r;
  }
  /// Blocks until `r` completes or `ms` pass; returns the bytes moved.
  uint64_t wait(strata_request_t r, int64_t ms = 20000) {
    uint64_t n = 0;
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->wait(comm_, r, ms, &n, &e), e, "wait");
    return n;
  }
  /// Never blocks.
  bool test(strata_request_t r, uint64_t* n) {
    int32_t done = 0;
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->test(comm_, r, &done, n, &e), e, "test");
    return done != 0;
  }
  void cancel(strata_request_t r) { vt_->cancel(comm_, r); }
  void abort(const char* why) { vt_->comm_abort(comm_, why); }
  strata_transport_caps caps() {
    strata_transport_caps c{};
    STRATA_INIT_HEADER(&c, strata_transport_caps);
    strata_error e;
    strata_error_init(&e);
    detail::check_status(vt_->get_caps(handle(), &c, &e), e, "get_caps");
    return c;
  }

 private:
  strata_transport_t handle() const { return static_cast<strata_transport_t>(inst_.handle()); }
  PluginInstance inst_;
  const strata_transport_vtable* vt_ = nullptr;
  strata_comm_t comm_ = nullptr;
  std::vector<strata_mem_region_t> regions_;
};

/// Runs fn(rank) on `world` threads, joins them all, then rethrows the first
/// rank's failure (by rank order).
inline void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// A communicator name no other test of this process (or of a concurrently
/// running test process) uses: base-pid-counter.
inline std::string unique_name(const char* base) {
  static std::atomic<int> n{0};
  return std::string(base) + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

/// Test-data byte i for a message identified by `salt`.
/// The value of `key` in the host's store, waiting up to `ms`; throws
/// strata::Error naming the key's store call when it is not there in time.
inline std::string store_get(const strata_host_api* api, const std::string& key, int64_t ms) {
  std::string out;
  strata_error err;
  strata_error_init(&err);
  auto append = [](void* ctx, const char* data, uint64_t n) { static_cast<std::string*>(ctx)->append(data, n); };
  detail::check_status(api->store_get(api, key.c_str(), append, &out, ms, &err), err, "store_get");
  return out;
}

inline uint8_t pattern(uint64_t i, uint64_t salt) {
  return static_cast<uint8_t>((i * 131 + salt * 7 + (i >> 11)) & 0xff);
}

namespace detail {
// pattern() over a 2 KiB block k (bytes 2048k + j, j < 2048) is
// (j * 131 + salt * 7 + k) mod 256, since 2048 * 131 is a multiple of 256:
// row r = (salt * 7 + k) mod 256 of this table. Filling and checking with
// memcpy/memcmp of whole rows keeps the sanitizer builds from instrumenting
// every byte of the 64 MiB messages (a byte loop took most of their time).
constexpr uint64_t kPatternBlock = 2048;
inline const uint8_t* pattern_row(uint64_t salt, uint64_t block) {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(256 * kPatternBlock);
    for (uint64_t r = 0; r < 256; ++r)
      for (uint64_t j = 0; j < kPatternBlock; ++j) t[r * kPatternBlock + j] = static_cast<uint8_t>((j * 131 + r) & 0xff);
    return t;
  }();
  return table.data() + ((salt * 7 + block) & 0xff) * kPatternBlock;
}
}  // namespace detail

// p[i] = pattern(i, salt) for i < n.
inline void fill_pattern(uint8_t* p, uint64_t n, uint64_t salt) {
  for (uint64_t at = 0, k = 0; at < n; at += detail::kPatternBlock, ++k)
    std::memcpy(p + at, detail::pattern_row(salt, k), std::min(detail::kPatternBlock, n - at));
}

// The first i < n with p[i] != pattern(i, salt), or n when all match.
inline uint64_t pattern_mismatch(const uint8_t* p, uint64_t n, uint64_t salt) {
  for (uint64_t at = 0, k = 0; at < n; at += detail::kPatternBlock, ++k) {
    const uint64_t len = std::min(detail::kPatternBlock, n - at);
    if (std::memcmp(p + at, detail::pattern_row(salt, k), len) != 0)
      for (uint64_t i = at; i < at + len; ++i)
        if (p[i] != pattern(i, salt)) return i;
  }
  return n;
}

}  // namespace strata::test
