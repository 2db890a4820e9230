// SPDX-License-Identifier: Apache-2.0
#include "strata/sdk/kernels.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "strata/error.hpp"
#include "strata/sdk/tensor.hpp"

namespace strata::sdk {
namespace {

using kernels::bfloat16_to_float;
using kernels::float_to_bfloat16;
using kernels::float_to_half;
using kernels::half_to_float;

// Storage for n_inputs arrays of `count` elements of one dtype, filled from
// doubles, plus conversion back to double.
struct Arrays {
  DLDataType dtype;
  size_t count;
  std::vector<std::vector<unsigned char>> data;

  Arrays(DLDataType d, size_t n_inputs, size_t c) : dtype(d), count(c), data(n_inputs) {
    for (auto& a : data) a.resize(c * (d.bits / 8) + 1);
  }
  void set(size_t i, size_t k, double v) { store(data[i].data(), k, v); }
  void store(void* p, size_t k, double v) const {
    if (dtype_equal(dtype, kFloat32)) static_cast<float*>(p)[k] = static_cast<float>(v);
    else if (dtype_equal(dtype, kFloat64)) static_cast<double*>(p)[k] = v;
    else if (dtype_equal(dtype, kFloat16)) static_cast<uint16_t*>(p)[k] = float_to_half(static_cast<float>(v));
    else if (dtype_equal(dtype, kBFloat16)) static_cast<uint16_t*>(p)[k] = float_to_bfloat16(static_cast<float>(v));
    else if (dtype_equal(dtype, kInt32)) static_cast<int32_t*>(p)[k] = static_cast<int32_t>(v);
    else static_cast<int64_t*>(p)[k] = static_cast<int64_t>(v);
  }
  double load(const void* p, size_t k) const {
    if (dtype_equal(dtype, kFloat32)) return static_cast<const float*>(p)[k];
    if (dtype_equal(dtype, kFloat64)) return static_cast<const double*>(p)[k];
    if (dtype_equal(dtype, kFloat16)) return half_to_float(static_cast<const uint16_t*>(p)[k]);
    if (dtype_equal(dtype, kBFloat16)) return bfloat16_to_float(static_cast<const uint16_t*>(p)[k]);
    if (dtype_equal(dtype, kInt32)) return static_cast<const int32_t*>(p)[k];
    return static_cast<double>(static_cast<const int64_t*>(p)[k]);
  }
  std::vector<const void*> ptrs() const {
    std::vector<const void*> p;
    for (auto& a : data) p.push_back(a.data());
    return p;
  }
};

double tolerance(DLDataType d, double magnitude) {
  if (dtype_equal(d, kFloat16)) return 2e-3 * magnitude + 1e-3;
  if (dtype_equal(d, kBFloat16)) return 1.6e-2 * magnitude + 1e-2;
  if (dtype_equal(d, kFloat32)) return 1e-5 * magnitude + 1e-6;
  if (dtype_equal(d, kFloat64)) return 1e-12 * magnitude;
  return 0;
}

bool is_int(DLDataType d) { return d.code == kDLInt; }

struct Case {
  DLDataType dtype;
  strata_reduce_op op;
};
// Short names in test listings (gtest would otherwise dump the raw bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << int(c.dtype.code) << "/" << int(c.dtype.bits) << " op " << int(c.op);
}

class KernelsTest : public ::testing::TestWithParam<Case> {};

TEST_P(KernelsTest, MatchesDoubleReferenceForOddCounts) {
  const Case c = GetParam();
  std::mt19937 rng(42);
  for (size_t n_inputs : {1u, 2u, 3u, 4u, 5u}) {
    for (size_t count : {0u, 1u, 7u, 1023u, 1024u, 1025u, 3001u}) {
      Arrays a(c.dtype, n_inputs, count);
      std::vector<std::vector<double>> ref(n_inputs, std::vector<double>(count));
      std::uniform_int_distribution<int> small(-8, 8);
      for (size_t i = 0; i < n_inputs; ++i)
        for (size_t k = 0; k < count; ++k) {
          // Values exactly representable in every dtype (bf16 has 8 bits):
          // multiples of 1/4 up to 8, and non-zero for PROD.
          double v = small(rng) / (c.op == STRATA_REDUCE_PROD ? 1.0 : 4.0);
          if (is_int(c.dtype)) v = small(rng);
          if (c.op == STRATA_REDUCE_PROD && v == 0) v = 1;
          a.set(i, k, v);
          ref[i][k] = a.load(a.data[i].data(), k);
        }
      std::vector<unsigned char> out(count * (c.dtype.bits / 8) + 1);
      auto p = a.ptrs();
      kernels::reduce(c.op, c.dtype, n_inputs, p.data(), out.data(), count, static_cast<double>(n_inputs));
      for (size_t k = 0; k < count; ++k) {
        double r = ref[0][k];
        for (size_t i = 1; i < n_inputs; ++i) {
          switch (c.op) {
            case STRATA_REDUCE_SUM:
            case STRATA_REDUCE_MEAN: r += ref[i][k]; break;
            case STRATA_REDUCE_MIN: r = std::min(r, ref[i][k]); break;
            case STRATA_REDUCE_MAX: r = std::max(r, ref[i][k]); break;
            case STRATA_REDUCE_PROD: r *= ref[i][k]; break;
          }
        }
        if (c.op == STRATA_REDUCE_MEAN) r = is_int(c.dtype) ? std::trunc(r / n_inputs) : r / n_inputs;
        const double got = a.load(out.data(), k);
        ASSERT_NEAR(got, r, tolerance(c.dtype, std::fabs(r)))
            << dtype_name(c.dtype) << " " << reduce_op_name(c.op) << " n=" << n_inputs << " count=" << count
            << " k=" << k;
      }
    }
  }
}

TEST_P(KernelsTest, OutputMayAliasAnyInput) {
  const Case c = GetParam();
  const size_t count = 2049, n = 3;
  for (size_t alias = 0; alias < n; ++alias) {
    Arrays a(c.dtype, n, count);
    for (size_t i = 0; i < n; ++i)
      for (size_t k = 0; k < count; ++k) a.set(i, k, static_cast<double>((i + 1) * ((k % 5) + 1)));
    Arrays expect(c.dtype, 1, count);
    auto p = a.ptrs();
    kernels::reduce(c.op, c.dtype, n, p.data(), expect.data[0].data(), count, 3.0);
    kernels::reduce(c.op, c.dtype, n, p.data(), a.data[alias].data(), count, 3.0);
    EXPECT_EQ(0, std::memcmp(expect.data[0].data(), a.data[alias].data(), count * (c.dtype.bits / 8)))
        << "alias with input " << alias;
  }
}

// reduce_broadcast gives every output reduce()'s bits, also when the
// outputs are the inputs themselves (an in-place all-reduce), and writes
// nothing past `count`.
TEST_P(KernelsTest, ReduceBroadcastGivesEveryOutputReducesBits) {
  const Case c = GetParam();
  const size_t esize = c.dtype.bits / 8;
  for (size_t n : {1u, 2u, 3u, 4u})
    for (size_t count : {0u, 1u, 5u, 1023u, 1024u, 1025u, 4099u})
      for (bool in_place : {false, true}) {
        Arrays a(c.dtype, n, count);
        for (size_t i = 0; i < n; ++i)
          for (size_t k = 0; k < count; ++k)
            a.set(i, k, static_cast<double>(static_cast<int>((k * 7 + i * 3) % 11) - 5) / (i + 2.0) + 0.5);
        Arrays expect(c.dtype, 1, count);
        auto p = a.ptrs();
        kernels::reduce(c.op, c.dtype, n, p.data(), expect.data[0].data(), count, static_cast<double>(n));
        Arrays outs(c.dtype, n, count);
        for (auto& o : outs.data) std::fill(o.begin(), o.end(), 0xEE);
        std::vector<void*> dst;
        for (size_t i = 0; i < n; ++i) dst.push_back(in_place ? a.data[i].data() : outs.data[i].data());
        kernels::reduce_broadcast(c.op, c.dtype, n, p.data(), n, dst.data(), count, static_cast<double>(n));
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(0, std::memcmp(expect.data[0].data(), dst[i], count * esize))
              << dtype_name(c.dtype) << " " << reduce_op_name(c.op) << " n=" << n << " count=" << count
              << " output " << i << (in_place ? " in place" : "");
          if (!in_place) {
            EXPECT_EQ(outs.data[i][count * esize], 0xEE) << "output " << i << " count " << count;
          }
        }
      }
}

// reduce_tree against the same tree as a chain of two-input reduce() calls:
// the same bits (order and per-step rounding), out of place and in place,
// across block edges, with pairs at any leaves, and nothing written past
// `count`. Random values make the order show in the sums; MIN and MAX see
// signed zeros and NaNs, whose result depends on operand order.
TEST_P(KernelsTest, ReduceTreeEqualsItsChainOfTwoInputReduces) {
  const Case c = GetParam();
  const size_t esize = c.dtype.bits / 8;
  const strata_reduce_op step = c.op == STRATA_REDUCE_MEAN ? STRATA_REDUCE_SUM : c.op;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> real(-4, 4), positive(0.5, 2);
  std::uniform_int_distribution<int> small(-9, 9), pick(0, 9);
  // 512 leaves: node pointers and scratch on the heap, 16-element blocks.
  for (size_t leaves : {1u, 2u, 4u, 8u, 16u, 512u})
    for (size_t count : {0u, 1u, 5u, 100u, 1000u, 4099u})  // 4099 crosses blocks in every case
      for (int alias = -1; alias < 1; ++alias) {
        if (leaves > 16 && count > 100) continue;
        std::vector<bool> paired(leaves);
        for (size_t g = 0; g < leaves; ++g) paired[g] = pick(rng) < 5;
        size_t n_values = 0;
        for (size_t g = 0; g < leaves; ++g) n_values += paired[g] ? 2 : 1;
        Arrays a(c.dtype, n_values, count);
        for (size_t i = 0; i < n_values; ++i)
          for (size_t k = 0; k < count; ++k) {
            double v = c.op == STRATA_REDUCE_PROD ? positive(rng) : real(rng);
            if (is_int(c.dtype)) v = small(rng);
            const int special = pick(rng);
            if (!is_int(c.dtype) && (c.op == STRATA_REDUCE_MIN || c.op == STRATA_REDUCE_MAX) && special < 3)
              v = special == 0 ? 0.0 : special == 1 ? -0.0 : std::numeric_limits<double>::quiet_NaN();
            a.set(i, k, v);
          }
        std::vector<const void*> pairs(2 * leaves, nullptr);
        for (size_t g = 0, i = 0; g < leaves; ++g) {
          pairs[2 * g] = a.data[i++].data();
          if (paired[g]) pairs[2 * g + 1] = a.data[i++].data();
        }
        // The reference: each leaf, then each level, by reduce() of two inputs.
        std::vector<std::vector<unsigned char>> level;
        for (size_t g = 0; g < leaves; ++g) {
          std::vector<unsigned char> v(count * esize + 1);
          if (paired[g])
            kernels::reduce(step, c.dtype, 2, &pairs[2 * g], v.data(), count);
          else if (count != 0)
            std::memcpy(v.data(), pairs[2 * g], count * esize);
          level.push_back(std::move(v));
        }
        while (level.size() > 1) {
          std::vector<std::vector<unsigned char>> next;
          for (size_t i = 0; i < level.size(); i += 2) {
            std::vector<unsigned char> v(count * esize + 1);
            const void* in[2] = {level[i].data(), level[i + 1].data()};
            kernels::reduce(step, c.dtype, 2, in, v.data(), count);
            next.push_back(std::move(v));
          }
          level = std::move(next);
        }
        const double divisor = 3.0;
        if (c.op == STRATA_REDUCE_MEAN) kernels::divide(c.dtype, level[0].data(), count, divisor);
        std::vector<unsigned char> out(count * esize + 1, 0xEE);
        void* dst = alias < 0 ? out.data() : a.data[a.data.size() - 1].data();
        kernels::reduce_tree(c.op, c.dtype, leaves, pairs.data(), dst, count, divisor);
        ASSERT_EQ(0, std::memcmp(level[0].data(), dst, count * esize))
            << dtype_name(c.dtype) << " " << reduce_op_name(c.op) << " leaves=" << leaves << " count=" << count
            << (alias < 0 ? "" : " into the last input");
        if (alias < 0) {
          EXPECT_EQ(out[count * esize], 0xEE) << "wrote past count " << count;
        }
      }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (DLDataType d : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64})
    for (strata_reduce_op op : {STRATA_REDUCE_SUM, STRATA_REDUCE_MEAN, STRATA_REDUCE_MIN, STRATA_REDUCE_MAX,
                                STRATA_REDUCE_PROD})
      cases.push_back({d, op});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndOps, KernelsTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return dtype_name(info.param.dtype) + "_" + reduce_op_name(info.param.op);
                         });

TEST(KernelsTest, SumIsDeterministicLeftToRight) {
  // (1e8 + 1) - 1e8 + ... in float32 depends on order: check the fixed order.
  std::vector<float> a{1e8f}, b{1.0f}, c{-1e8f};
  const void* in[3] = {a.data(), b.data(), c.data()};
  float out = -1;
  kernels::reduce(STRATA_REDUCE_SUM, kFloat32, 3, in, &out, 1);
  EXPECT_EQ(out, (1e8f + 1.0f) + -1e8f);
}

TEST(KernelsTest, HalfAndBfloatAccumulateInFloat32) {
  // 2048 + 1 + 1 is 2050 in float32, but 2048 (1 lost twice) if added in half.
  const uint16_t x = float_to_half(2048.0f), y = float_to_half(1.0f);
  const void* in[3] = {&x, &y, &y};
  uint16_t out = 0;
  kernels::reduce(STRATA_REDUCE_SUM, kFloat16, 3, in, &out, 1);
  EXPECT_EQ(half_to_float(out), 2050.0f);
  const uint16_t bx = float_to_bfloat16(256.0f), by = float_to_bfloat16(1.0f);
  const void* bin[3] = {&bx, &by, &by};
  kernels::reduce(STRATA_REDUCE_SUM, kBFloat16, 3, bin, &out, 1);
  EXPECT_EQ(bfloat16_to_float(out), 258.0f);
}

TEST(KernelsTest, HalfConversionEdgeCases) {
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);          // max half
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);          // below the rounding midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);          // ties to even -> inf
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  const uint16_t nan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(half_to_float(nan)));
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  // Every finite half round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(float_to_half(half_to_float(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(KernelsTest, Bfloat16ConversionRoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(-std::numeric_limits<float>::infinity())),
            -std::numeric_limits<float>::infinity());
}

TEST(KernelsTest, RejectsBadArguments) {
  float x = 1;
  const void* in[1] = {&x};
  try {
    kernels::reduce(STRATA_REDUCE_SUM, DLDataType{kDLUInt, 8, 1}, 1, in, &x, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("uint8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::reduce(STRATA_REDUCE_SUM, kFloat32, 0, in, &x, 1), InvalidArgumentError);
  EXPECT_THROW(kernels::reduce(static_cast<strata_reduce_op>(9), kFloat32, 1, in, &x, 1), InvalidArgumentError);
  EXPECT_THROW(kernels::reduce(STRATA_REDUCE_MEAN, kFloat32, 1, in, &x, 1, 0.0), InvalidArgumentError);
}

TEST(KernelsTest, ReduceTreeRejectsBadArguments) {
  float x = 1, y = 2, out = 0;
  const void* three[6] = {&x, nullptr, &y, nullptr, &x, nullptr};
  try {
    kernels::reduce_tree(STRATA_REDUCE_SUM, kFloat32, 3, three, &out, 1);
    FAIL() << "3 leaves accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), STRATA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("power of two of leaves; got 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::reduce_tree(STRATA_REDUCE_SUM, kFloat32, 0, three, &out, 1), InvalidArgumentError);
  const void* hole[4] = {&x, nullptr, nullptr, &y};
  try {
    kernels::reduce_tree(STRATA_REDUCE_SUM, kFloat32, 2, hole, &out, 1);
    FAIL() << "a leaf without its first value accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaf 1 has no first value"), std::string::npos) << e.what();
  }
  const void* two[4] = {&x, nullptr, &y, nullptr};
  EXPECT_THROW(kernels::reduce_tree(STRATA_REDUCE_MEAN, kFloat32, 2, two, &out, 1, 0.0), InvalidArgumentError);
  EXPECT_THROW(kernels::reduce_tree(STRATA_REDUCE_SUM, DLDataType{kDLUInt, 8, 1}, 2, two, &out, 1),
               InvalidArgumentError);
  EXPECT_EQ(out, 0.0f);
  kernels::reduce_tree(STRATA_REDUCE_SUM, kFloat32, 2, two, &out, 1);
  EXPECT_EQ(out, 3.0f);
}

TEST(KernelsTest, UpdateAndDivide) {
  std::vector<int32_t> d{10, 20, 30}, s{1, 2, 3};
  kernels::apply_update(STRATA_VAR_ASSIGN_ADD, kInt32, d.data(), s.data(), 3);
  EXPECT_EQ(d, (std::vector<int32_t>{11, 22, 33}));
  kernels::apply_update(STRATA_VAR_ASSIGN_SUB, kInt32, d.data(), s.data(), 3);
  EXPECT_EQ(d, (std::vector<int32_t>{10, 20, 30}));
  kernels::divide(kInt32, d.data(), 3, 4);
  EXPECT_EQ(d, (std::vector<int32_t>{2, 5, 7}));
  std::vector<uint16_t> h{float_to_half(3.0f)}, hs{float_to_half(0.5f)};
  kernels::apply_update(STRATA_VAR_ASSIGN_SUB, kFloat16, h.data(), hs.data(), 1);
  EXPECT_EQ(half_to_float(h[0]), 2.5f);
}

TEST(KernelsTest, TensorChecks) {
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {3, 1};
  int64_t bad_strides[2] = {1, 2};
  float data[6] = {};
  DLTensor t{data, {kDLCPU, 0}, 2, kFloat32, shape, nullptr, 0};
  EXPECT_EQ(element_count(t), 6);
  EXPECT_EQ(byte_size(t), 24u);
  EXPECT_TRUE(is_contiguous(t));
  t.strides = strides;
  EXPECT_TRUE(is_contiguous(t));
  t.strides = bad_strides;
  EXPECT_FALSE(is_contiguous(t));
  EXPECT_THROW(check_contiguous(t, "x"), InvalidArgumentError);
  t.strides = nullptr;
  DLTensor gpu = t;
  gpu.device.device_type = kDLCUDA;
  EXPECT_THROW(check_cpu(gpu, "x"), UnimplementedError);
  int64_t shape2[2] = {3, 2};
  DLTensor u = t;
  u.shape = shape2;
  try {
    check_same_shape(t, "a", u, "b");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
  }
  EXPECT_EQ(dtype_name(kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(DLDataType{kDLFloat, 32, 4}), "float32x4");
  EXPECT_THROW(dtype_size(DLDataType{kDLFloat, 32, 4}), InvalidArgumentError);
}

TEST(KernelsTest, ConcatAlongEachAxis) {
  int64_t sa[2] = {2, 1}, sb[2] = {2, 2};
  float a[2] = {1, 2}, b[4] = {3, 4, 5, 6};
  DLTensor ta{a, {kDLCPU, 0}, 2, kFloat32, sa, nullptr, 0};
  DLTensor tb{b, {kDLCPU, 0}, 2, kFloat32, sb, nullptr, 0};
  const DLTensor* in[2] = {&ta, &tb};
  auto shape = concat_shape(in, 2, 1);
  ASSERT_EQ(shape, (std::vector<int64_t>{2, 3}));
  auto out = make_tensor(kFloat32, shape);
  concat(in, 2, -1, out->dl_tensor);
  const float* o = static_cast<const float*>(out->dl_tensor.data);
  EXPECT_EQ(std::vector<float>(o, o + 6), (std::vector<float>{1, 3, 4, 2, 5, 6}));
  EXPECT_THROW(concat_shape(in, 2, 0), InvalidArgumentError);  // dim 1 differs
  EXPECT_THROW(concat_shape(in, 2, 2), InvalidArgumentError);  // axis out of range
}

}  // namespace
}  // namespace strata::sdk
