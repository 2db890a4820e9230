// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the checkpoint tests: strategy options, deterministic
// tensor contents (random bit patterns, NaN payloads included), byte-exact
// comparison and an independent CRC32C.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/strata.hpp"

namespace strata::test {

inline std::string devices_json(int n) {
  std::string s = R"({"devices": [)";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string("\"cpu:") + std::to_string(i) + "\"";
  return s + "], \"timeout_s\": 30}";
}

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v{DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                    DType::kInt32,   DType::kInt64,   DType::kUInt8};
  return v;
}

/// `shape` filled with pseudo-random bytes from `seed`: every bit pattern
/// may occur (NaN payloads, -0, subnormals), so a round trip that converts
/// values instead of copying bytes shows.
inline Tensor random_tensor(DType dtype, const std::vector<std::int64_t>& shape, std::uint32_t seed) {
  Tensor t = Tensor::zeros(shape, dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

inline std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  return std::vector<unsigned char>(p, p + t.nbytes());
}

/// CRC32C written bit by bit (no table), to check the library's.
inline std::uint32_t crc32c_bitwise(const void* data, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

}  // namespace strata::test
