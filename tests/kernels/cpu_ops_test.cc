// The CPU kernels against naive double-precision loops, and dtype conversions.
#include "kernels/cpu/cpu_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace tandem {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(DTypeTest, Bf16AndF16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.14159f, 65504.0f, 1e-5f, -1e-7f}) {
    EXPECT_NEAR(Bf16ToF32(F32ToBf16(f)), f, std::abs(f) / 128 + 1e-38f) << f;
    EXPECT_NEAR(F16ToF32(F32ToF16(f)), f, std::abs(f) / 1024 + 6e-8f) << f;
  }
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);                  // overflow to infinity
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(NAN))));
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  // Every f16 value converts back exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), h) << std::hex << h;
  }
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, MatchesNaiveLoop) {
  const DType dt = GetParam();
  for (int n : {1, 3, 4, 9}) {
    const int rows = 37, cols = 70;
    const auto x = Random(n * cols, 1);
    const auto wf = Random(rows * cols, 2);
    const auto bias = Random(rows, 3);
    std::vector<uint16_t> w16(rows * cols);
    std::vector<float> wq(rows * cols);  // the weights as the kernel sees them
    for (int i = 0; i < rows * cols; ++i) {
      if (dt == DType::kF32) {
        wq[i] = wf[i];
      } else {
        w16[i] = dt == DType::kBF16 ? F32ToBf16(wf[i]) : F32ToF16(wf[i]);
        wq[i] = dt == DType::kBF16 ? Bf16ToF32(w16[i]) : F16ToF32(w16[i]);
      }
    }
    WeightRef w{dt, dt == DType::kF32 ? static_cast<const void*>(wf.data()) : w16.data(), rows,
                cols};
    std::vector<float> y(n * rows);
    cpu::Matmul(x.data(), w, bias.data(), y.data(), n);
    for (int t = 0; t < n; ++t) {
      for (int r = 0; r < rows; ++r) {
        double ref = bias[r];
        for (int c = 0; c < cols; ++c) ref += double(x[t * cols + c]) * wq[r * cols + c];
        // float32 accumulation of 70 products of unit normals: error ~1e-6 * sqrt(70) * |terms|
        EXPECT_NEAR(y[t * rows + r], ref, 1e-4) << t << "," << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, MatmulTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16));

TEST(CpuOpsTest, RmsNormSiluAdd) {
  const int n = 3, dim = 19;
  const auto x = Random(n * dim, 4), w = Random(dim, 5);
  std::vector<float> y(n * dim);
  cpu::RmsNorm(x.data(), w.data(), y.data(), n, dim, 1e-5f);
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[t * dim + i]) * x[t * dim + i];
    const double s = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) EXPECT_NEAR(y[t * dim + i], w[i] * x[t * dim + i] * s, 1e-5);
  }
  std::vector<float> out(n * dim);
  cpu::SiluMul(x.data(), w.data(), out.data(), dim);
  for (int i = 0; i < dim; ++i) {
    EXPECT_NEAR(out[i], x[i] / (1 + std::exp(-double(x[i]))) * w[i], 1e-5);
  }
  std::vector<float> a = x;
  cpu::Add(a.data(), x.data(), n * dim);
  for (int i = 0; i < n * dim; ++i) EXPECT_FLOAT_EQ(a[i], 2 * x[i]);
}

TEST(CpuOpsTest, RopeStylesAreRelatedByPermutation) {
  // Interleaved RoPE on x equals half-style RoPE on x with pairs (2i, 2i+1) moved to (i, i+hd/2).
  const int hd = 8, heads = 2, n = 3;
  const auto x = Random(n * heads * hd, 6);
  std::vector<float> inv = {1.0f, 0.1f, 0.01f, 0.001f};
  std::vector<int> pos = {0, 5, 17};
  std::vector<float> a = x, b(x.size());
  for (int t = 0; t < n * heads; ++t) {
    for (int i = 0; i < hd / 2; ++i) {
      b[t * hd + i] = x[t * hd + 2 * i];
      b[t * hd + i + hd / 2] = x[t * hd + 2 * i + 1];
    }
  }
  cpu::Rope(a.data(), n, heads, hd, pos.data(), inv.data(), RopeStyle::kInterleaved);
  cpu::Rope(b.data(), n, heads, hd, pos.data(), inv.data(), RopeStyle::kHalf);
  for (int t = 0; t < n * heads; ++t) {
    for (int i = 0; i < hd / 2; ++i) {
      EXPECT_FLOAT_EQ(a[t * hd + 2 * i], b[t * hd + i]);
      EXPECT_FLOAT_EQ(a[t * hd + 2 * i + 1], b[t * hd + i + hd / 2]);
    }
  }
  // Position 0 is the identity.
  EXPECT_FLOAT_EQ(a[0], x[0]);
}

TEST(CpuOpsTest, PagedAttentionMatchesContiguous) {
  // One sequence of 5 tokens scattered over blocks of 2 in a shuffled order.
  const int heads = 4, kvh = 2, hd = 8, len = 5, bs = 2;
  const int width = kvh * hd;
  const auto q = Random(heads * hd, 7);
  const auto k = Random(len * width, 8), v = Random(len * width, 9);
  std::vector<int> table = {3, 0, 2};
  std::vector<float> kc(4 * bs * width, NAN), vc(4 * bs * width, NAN);
  std::vector<int> slots;
  for (int p = 0; p < len; ++p) slots.push_back(table[p / bs] * bs + p % bs);
  cpu::WriteKv(k.data(), v.data(), slots.data(), len, width, kc.data(), vc.data());
  int seq = 0, pos = len - 1;
  PagedAttentionArgs a;
  a.num_tokens = 1;
  a.n_heads = heads;
  a.n_kv_heads = kvh;
  a.head_dim = hd;
  a.block_size = bs;
  a.max_blocks_per_seq = 3;
  a.token_seq = &seq;
  a.token_pos = &pos;
  a.block_tables = table.data();
  std::vector<float> out(heads * hd);
  cpu::PagedAttention(q.data(), kc.data(), vc.data(), a, out.data());
  for (int h = 0; h < heads; ++h) {
    const int g = h / (heads / kvh);
    std::vector<double> s(len);
    double mx = -1e30, sum = 0;
    for (int j = 0; j < len; ++j) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(q[h * hd + i]) * k[j * width + g * hd + i];
      s[j] = d / std::sqrt(double(hd));
      mx = std::max(mx, s[j]);
    }
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int i = 0; i < hd; ++i) {
      double o = 0;
      for (int j = 0; j < len; ++j) o += s[j] / sum * v[j * width + g * hd + i];
      EXPECT_NEAR(out[h * hd + i], o, 1e-5);
    }
  }
  // A sliding window of 2 attends to positions 3 and 4 only: changing K/V at 0..2 is invisible.
  a.sliding_window = 2;
  std::vector<float> w1(heads * hd), w2(heads * hd);
  cpu::PagedAttention(q.data(), kc.data(), vc.data(), a, w1.data());
  for (int p = 0; p < 3; ++p) {
    for (int i = 0; i < width; ++i) kc[slots[p] * width + i] = vc[slots[p] * width + i] = 100.f;
  }
  cpu::PagedAttention(q.data(), kc.data(), vc.data(), a, w2.data());
  EXPECT_EQ(w1, w2);
}

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 100, 1001}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, 7, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << n << " " << i;
  }
}

}  // namespace
}  // namespace tandem
