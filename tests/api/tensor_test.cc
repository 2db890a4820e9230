// SPDX-License-Identifier: Apache-2.0
#include "strata/tensor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/values.hpp"

namespace strata {
namespace {

TEST(TensorTest, DTypeRoundTripsThroughDLPack) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                  DType::kInt64, DType::kUInt8}) {
    EXPECT_EQ(dtype_from_dlpack(to_dlpack(d)), d) << dtype_name(d);
    EXPECT_EQ(dtype_size(d) * 8, to_dlpack(d).bits);
  }
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(to_dlpack(DType::kBFloat16).code, kDLBfloat);
  EXPECT_TRUE(is_floating(DType::kFloat16));
  EXPECT_FALSE(is_floating(DType::kInt64));
  EXPECT_STREQ(dtype_name(DType::kUInt8), "uint8");
  EXPECT_THROW(dtype_from_dlpack(DLDataType{kDLUInt, 16, 1}), InvalidArgumentError);
  EXPECT_THROW(dtype_from_dlpack(DLDataType{kDLInt, 8, 1}), InvalidArgumentError);
  EXPECT_THROW(dtype_from_dlpack(DLDataType{kDLFloat, 32, 4}), InvalidArgumentError);
}

TEST(TensorTest, ZerosHasShapeAndAlignment) {
  Tensor t = Tensor::zeros({2, 3}, DType::kFloat32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(t.ndim(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(t.dl().device.device_type, kDLCPU);
  EXPECT_FALSE(t.is_borrowed());
  EXPECT_THROW(Tensor::zeros({-1}, DType::kFloat32), InvalidArgumentError);
}

TEST(TensorTest, FromVectorRoundTripsEveryNativeType) {
  EXPECT_EQ(Tensor::from_vector<float>({1.5f, -2}).to_vector<float>(), (std::vector<float>{1.5f, -2}));
  EXPECT_EQ(Tensor::from_vector<double>({1e300, 2}, {2, 1}).to_vector<double>(),
            (std::vector<double>{1e300, 2}));
  EXPECT_EQ(Tensor::from_vector<std::int32_t>({7, 8, 9}).dtype(), DType::kInt32);
  const std::int64_t big = (std::int64_t{1} << 60) + 3;
  EXPECT_EQ(Tensor::from_vector<std::int64_t>({big}).to_vector<std::int64_t>()[0], big);
  Tensor s = Tensor::scalar(3.25);
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.to_vector<double>(), std::vector<double>{3.25});
  EXPECT_THROW(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), InvalidArgumentError);
}

TEST(TensorTest, DataChecksDtype) {
  Tensor t = Tensor::from_vector<float>({1, 2});
  EXPECT_THROW(t.data<double>(), InvalidArgumentError);
  EXPECT_THROW(t.to_vector<std::int32_t>(), InvalidArgumentError);
  EXPECT_NO_THROW(t.data<float>());
}

TEST(TensorTest, CloneIsDeepAndMoveEmpties) {
  Tensor a = Tensor::from_vector<int>({1, 2, 3});
  Tensor b = a.clone();
  a.data<int>()[0] = 100;
  EXPECT_EQ(b.to_vector<int>(), (std::vector<int>{1, 2, 3}));
  Tensor c = std::move(a);
  EXPECT_FALSE(a.defined());  // NOLINT(bugprone-use-after-move): the moved-from state is the test
  EXPECT_THROW(a.dl(), FailedPreconditionError);
  EXPECT_EQ(c.to_vector<int>()[0], 100);
}

TEST(TensorTest, ToDlpackReleasesAndAdoptTakesOwnership) {
  Tensor a = Tensor::from_vector<double>({4, 5});
  const void* data = a.raw_data();
  DLManagedTensor* m = a.to_dlpack();
  EXPECT_FALSE(a.defined());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dl_tensor.data, data);
  Tensor b = Tensor::adopt(m);
  EXPECT_EQ(b.raw_data(), data);
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{4, 5}));
  EXPECT_THROW(Tensor::adopt(nullptr), InvalidArgumentError);
}

TEST(TensorTest, BorrowIsZeroCopy) {
  std::vector<float> user = {1, 2, 3, 4};  // e.g. an Eigen or libtorch buffer
  TensorView view(user.data(), {2, 2}, DType::kFloat32);
  EXPECT_EQ(view.numel(), 4);
  EXPECT_EQ(view.data<float>(), user.data());
  Tensor b = Tensor::borrow(view);
  EXPECT_TRUE(b.is_borrowed());
  EXPECT_EQ(b.data<float>(), user.data());
  user[3] = 40;
  EXPECT_EQ(b.to_vector<float>()[3], 40);
  Tensor deep = b.clone();
  EXPECT_FALSE(deep.is_borrowed());
  EXPECT_NE(deep.data<float>(), user.data());
  // Destroying the borrowed Tensor leaves the user's memory alone (ASan
  // would report a bad free otherwise).
  b = Tensor();
  EXPECT_EQ(user[0], 1);
}

TEST(TensorTest, ViewOfDLTensorAndCopiesKeepTheirShape) {
  std::int64_t shape[2] = {3, 1};
  std::int32_t data[3] = {7, 8, 9};
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 2;
  dl.dtype = to_dlpack(DType::kInt32);
  dl.shape = shape;
  TensorView v = dl;
  EXPECT_EQ(v.shape(), (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(v.data<std::int32_t>()[2], 9);
  TensorView copy = [] {
    static std::int64_t buf[4] = {1, 2, 3, 4};
    TensorView owned(buf, {2, 2}, DType::kInt64);
    return TensorView(owned);  // the copy must own its own shape array
  }();
  EXPECT_EQ(copy.shape(), (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(copy.data<std::int64_t>()[3], 4);
  Tensor t = Tensor::copy_of(v);
  EXPECT_EQ(t.to_vector<std::int32_t>(), (std::vector<std::int32_t>{7, 8, 9}));
}

TEST(TensorTest, NonCompactTensorsAreRejectedForElementAccess) {
  std::int64_t shape[2] = {2, 2};
  std::int64_t strides[2] = {1, 2};  // column-major
  float data[4] = {1, 2, 3, 4};
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 2;
  dl.dtype = to_dlpack(DType::kFloat32);
  dl.shape = shape;
  dl.strides = strides;
  TensorView v = dl;
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_THROW(v.data<float>(), InvalidArgumentError);
  EXPECT_THROW(Tensor::copy_of(v), InvalidArgumentError);
}

TEST(TensorTest, HalfConversionKnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(70000.0f), 0x7c00);  // overflow -> +inf
  EXPECT_EQ(float_to_half(1e-9f), 0x0000);     // underflow -> +0
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
}

TEST(TensorTest, HalfAndBfloat16RoundTripEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << "half " << h;
    const float g = bfloat16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(g)) continue;
    ASSERT_EQ(float_to_bfloat16(g), h) << "bfloat16 " << h;
  }
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie -> even
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::nanf("")))));
}

TEST(TensorTest, FromDoublesConvertsToReducedPrecision) {
  Tensor h = Tensor::from_doubles({0.5, -1.25, 3}, {3}, DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.nbytes(), 6u);
  EXPECT_EQ(h.to_doubles(), (std::vector<double>{0.5, -1.25, 3}));
  Tensor b = Tensor::from_doubles({1.0 / 3}, {1}, DType::kBFloat16);
  EXPECT_NEAR(b.to_doubles()[0], 1.0 / 3, 1e-2);
  EXPECT_NE(b.to_doubles()[0], 1.0 / 3);
}

TEST(TensorTest, DistributedValuesHoldOneTensorPerReplica) {
  std::vector<Tensor> parts;
  parts.push_back(Tensor::scalar(1.0f));
  parts.push_back(Tensor::scalar(2.0f));
  PerReplica p(std::move(parts));
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].to_vector<float>()[0], 2.0f);
  EXPECT_THROW(p[2], OutOfRangeError);
  PerReplica q = p.clone();
  p[0].data<float>()[0] = 10;
  EXPECT_EQ(q[0].to_vector<float>()[0], 1.0f);
  std::vector<Tensor> same;
  same.push_back(Tensor::scalar(5));
  Mirrored m(std::move(same));
  EXPECT_EQ(m.primary().to_vector<int>()[0], 5);
}

}  // namespace
}  // namespace strata

// Large buffers of freed tensors are reused (BufferCache in tensor.cc): a
// reused buffer must still come back cleared from zeros() and hold exactly
// what from_bytes() and clone() put in it, at 64-byte alignment.
TEST(TensorTest, ReusedLargeBuffersAreClearedAndFilledExactly) {
  const std::vector<std::int64_t> shape{1000, 521};  // 2,084,000 bytes of float32: not a whole number of pages
  const void* first = nullptr;
  {
    strata::Tensor a = strata::Tensor::zeros(shape, strata::DType::kFloat32);
    first = a.raw_data();
    float* p = a.data<float>();
    for (std::int64_t i = 0; i < a.numel(); ++i) p[i] = 7.0f;
  }
  strata::Tensor z = strata::Tensor::zeros(shape, strata::DType::kFloat32);
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(z.raw_data(), first) << "a freed buffer of the same size was not reused";
#endif
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(z.raw_data()) % 64, 0u);
  for (float v : z.to_vector<float>()) ASSERT_EQ(v, 0.0f) << "zeros() handed out a reused buffer uncleared";
  std::vector<float> pattern(static_cast<std::size_t>(z.numel()));
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i % 977);
  z = strata::Tensor();
  const strata::Tensor b = strata::Tensor::from_vector(pattern, shape);
  EXPECT_EQ(b.to_vector<float>(), pattern);
  const strata::Tensor c = b.clone();
  EXPECT_NE(c.raw_data(), b.raw_data());
  EXPECT_EQ(c.to_vector<float>(), pattern);
  // A different size does not get that buffer.
  const strata::Tensor d = strata::Tensor::zeros({1024, 1024}, strata::DType::kFloat32);
  for (float v : d.to_vector<float>()) ASSERT_EQ(v, 0.0f);
}
