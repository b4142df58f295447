// Each CUDA kernel against its CPU twin. Skipped where no GPU (or no CUDA library) is present;
// scripts/gpu_check.sh runs it on a machine with one.
#include <gtest/gtest.h>

#include <random>

#include "kernels/backend_loader.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/cuda_device_test.h"

namespace tandem {
namespace {

class CudaTwinTest : public testing::CudaDeviceTest {};

// Tolerances: the GPU sums in a different order (tree reductions) and uses fast intrinsics
// (rsqrtf, __expf-class exp, sincosf); relative error stays below ~1e-5 for these sizes.
TEST_F(CudaTwinTest, RmsNorm) {
  const int n = 5, dim = 4096;
  auto x = Random(n * dim, 1), w = Random(dim, 2);
  std::vector<float> ref(n * dim);
  cpu::RmsNorm(x.data(), w.data(), ref.data(), n, dim, 1e-5f);
  float* dy = Upload(std::vector<float>(n * dim));
  ASSERT_EQ(api_->rmsnorm(Upload(x), Upload(w), dy, n, dim, 1e-5f), 0) << api_->last_error();
  auto got = Download(dy, n * dim);
  for (int i = 0; i < n * dim; ++i) EXPECT_NEAR(got[i], ref[i], 1e-4 * (1 + std::abs(ref[i])));
}

TEST_F(CudaTwinTest, SiluMulAndAdd) {
  const int n = 10000;
  auto g = Random(n, 3), u = Random(n, 4);
  std::vector<float> ref(n);
  cpu::SiluMul(g.data(), u.data(), ref.data(), n);
  float* dg = Upload(g);
  float* du = Upload(u);
  float* dout = Upload(std::vector<float>(n));
  ASSERT_EQ(api_->silu_mul(dg, du, dout, n), 0);
  auto got = Download(dout, n);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * (1 + std::abs(ref[i])));
  ASSERT_EQ(api_->add(dg, du, n), 0);
  auto sum = Download(dg, n);
  for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(sum[i], g[i] + u[i]);
}

TEST_F(CudaTwinTest, RopeBothStyles) {
  const int n = 7, heads = 8, hd = 128;
  auto x = Random(n * heads * hd, 5);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / hd);
  std::vector<int> pos = {0, 1, 2, 100, 511, 2000, 4095};
  void* dpos = nullptr;
  ASSERT_EQ(api_->malloc(&dpos, pos.size() * 4), 0);
  allocs_.push_back(dpos);
  ASSERT_EQ(api_->memcpy_h2d(dpos, pos.data(), pos.size() * 4), 0);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalf}) {
    std::vector<float> ref = x;
    cpu::Rope(ref.data(), n, heads, hd, pos.data(), inv.data(), style);
    float* dx = Upload(x);
    ASSERT_EQ(api_->rope(dx, n, heads, hd, static_cast<int*>(dpos), Upload(inv),
                         style == RopeStyle::kHalf ? 1 : 0),
              0);
    auto got = Download(dx, x.size());
    // Angles up to 4095 rad: float32 argument reduction differs by ~pos * 1e-7.
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], ref[i], 2e-3) << i;
  }
}

}  // namespace
}  // namespace tandem
