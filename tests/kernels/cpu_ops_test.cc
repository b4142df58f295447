// The CPU kernels against naive double-precision loops, on both ISA paths, and dtype
// conversions.
#include "kernels/cpu/cpu_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "tests/kernels/attention_args.h"
#include "tests/kernels/isa_paths.h"

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

// Every kernel test runs on every instruction-set path (tests/kernels/isa_paths.h), with and
// without a thread pool.
struct KernelParams {
  testing_isa::IsaPath path;
  bool pooled;
};

std::string ParamName(const ::testing::TestParamInfo<KernelParams>& info) {
  return testing_isa::PathName(info.param.path) + (info.param.pooled ? "Pooled" : "Inline");
}

std::vector<KernelParams> AllPaths() {
  std::vector<KernelParams> out;
  for (const testing_isa::IsaPath& path : testing_isa::TestablePaths()) {
    for (bool pooled : {false, true}) out.push_back({path, pooled});
  }
  return out;
}

class KernelTest : public ::testing::TestWithParam<KernelParams> {
 protected:
  void SetUp() override { ASSERT_TRUE(isa_.ok()); }
  ThreadPool* pool() { return GetParam().pooled ? &pool_ : nullptr; }

  testing_isa::ScopedIsa isa_{GetParam().path};
  ThreadPool pool_{3};  // more threads than this machine has cores: exercises the handoff
};

INSTANTIATE_TEST_SUITE_P(Paths, KernelTest, ::testing::ValuesIn(AllPaths()), ParamName);

TEST(IsaTest, SetIsaFallsBackToWhatTheCpuHas) {
  const cpu::Isa saved = cpu::ActiveIsa();
  EXPECT_EQ(cpu::SetIsa(cpu::Isa::kScalar), cpu::Isa::kScalar);
  EXPECT_EQ(cpu::ActiveIsa(), cpu::Isa::kScalar);
  EXPECT_EQ(cpu::SetIsa(cpu::Isa::kAvx2), cpu::CpuHasAvx2() ? cpu::Isa::kAvx2 : cpu::Isa::kScalar);
  const cpu::Isa avx512 = cpu::CpuHasAvx512() ? cpu::Isa::kAvx512
                          : cpu::CpuHasAvx2() ? cpu::Isa::kAvx2
                                              : cpu::Isa::kScalar;
  EXPECT_EQ(cpu::SetIsa(cpu::Isa::kAvx512), avx512);
  const cpu::Isa best = cpu::CpuHasAmx() ? cpu::Isa::kAmx : avx512;
  EXPECT_EQ(cpu::SetIsa(cpu::Isa::kAmx), best);
  EXPECT_EQ(cpu::BestIsa(), best);
  EXPECT_TRUE(!cpu::CpuHasAvx512() || cpu::CpuHasAvx2());
  EXPECT_TRUE(!cpu::CpuHasAmx() || cpu::CpuHasAvx512());
  // With test kernels installed, AVX-512 is selectable on any AVX2 CPU (AMX is not: it has no
  // emulation); removing them falls back.
  if (cpu::CpuHasAvx2()) {
    cpu::SetAvx512KernelsForTesting(&testing_isa::EmulatedAvx512Kernels());
    EXPECT_EQ(cpu::SetIsa(cpu::Isa::kAmx), cpu::Isa::kAvx512);
    EXPECT_STREQ(cpu::ActiveAvx512Kernels().name, "avx512-emulated");
    cpu::SetAvx512KernelsForTesting(nullptr);
    EXPECT_EQ(cpu::ActiveIsa(), avx512);
  }
  if (cpu::CpuHasAmx()) {
    EXPECT_EQ(cpu::SetIsa(cpu::Isa::kAmx), cpu::Isa::kAmx);
    EXPECT_STREQ(cpu::ActiveAvx512Kernels().name, "amx");
  }
  cpu::SetIsa(saved);
}

TEST(IsaTest, NamesParse) {
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
    cpu::Isa parsed = cpu::Isa::kScalar;
    ASSERT_TRUE(cpu::ParseIsa(cpu::IsaName(isa), &parsed));
    EXPECT_EQ(parsed, isa);
  }
  EXPECT_STREQ(cpu::IsaName(cpu::Isa::kAvx512), "avx512");
  EXPECT_STREQ(cpu::IsaName(cpu::Isa::kAmx), "amx");
  cpu::Isa parsed = cpu::Isa::kAvx2;
  EXPECT_FALSE(cpu::ParseIsa("avx1024", &parsed));
  EXPECT_FALSE(cpu::ParseIsa(nullptr, &parsed));
  EXPECT_EQ(parsed, cpu::Isa::kAvx2);
}

TEST_P(KernelTest, MatmulMatchesNaiveLoop) {
  // Token counts cover the decode rows (1-3 tokens), the prefill tiles (4 tokens and tails of
  // 1-3) and more than one 64-token block; rows not a multiple of 3 and cols not a multiple of
  // 8 exercise the row and column tails; 2100 columns take three depth blocks of 700.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int n : {1, 2, 3, 4, 5, 6, 7, 9, 70}) {
      for (auto [rows, cols] :
           {std::pair{37, 70}, std::pair{8, 8}, std::pair{5, 3}, std::pair{7, 2100}}) {
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
        for (bool with_bias : {true, false}) {
          std::vector<float> y(n * rows, NAN);
          cpu::Matmul(x.data(), w, with_bias ? bias.data() : nullptr, y.data(), n, pool());
          for (int t = 0; t < n; ++t) {
            for (int r = 0; r < rows; ++r) {
              double ref = with_bias ? bias[r] : 0.0;
              for (int c = 0; c < cols; ++c) ref += double(x[t * cols + c]) * wq[r * cols + c];
              // float32 accumulation of `cols` products of unit normals in any order: error
              // ~6e-8 * sqrt(cols) * sqrt(cols) (the partial sums' size), well below 2e-6 * cols.
              ASSERT_NEAR(y[t * rows + r], ref, 2e-6 * cols)
                  << DTypeName(dt) << " n=" << n << " rows=" << rows << " t=" << t << " r=" << r;
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelTest, RmsNormSiluAdd) {
  for (int dim : {19, 64, 77}) {
    const int n = 3;
    const auto x = Random(n * dim, 4), w = Random(dim, 5);
    std::vector<float> y(n * dim);
    cpu::RmsNorm(x.data(), w.data(), y.data(), n, dim, 1e-5f, pool());
    for (int t = 0; t < n; ++t) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(x[t * dim + i]) * x[t * dim + i];
      const double s = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) EXPECT_NEAR(y[t * dim + i], w[i] * x[t * dim + i] * s, 1e-5);
    }
  }
  // SiluMul over more than one parallel chunk, with gates far out in both tails (the vector
  // exp clamps its input to [-87, 88]).
  const int64_t m = 40000 + 5;
  auto g = Random(m, 6), u = Random(m, 7);
  g[0] = 100.f, g[1] = -100.f, g[2] = 30.f, g[3] = -30.f;
  std::vector<float> out(m);
  cpu::SiluMul(g.data(), u.data(), out.data(), m, pool());
  for (int64_t i = 0; i < m; ++i) {
    const double ref = g[i] / (1 + std::exp(-double(g[i]))) * u[i];
    // exp with relative error ~2e-7 (vector) or ~1 ulp (libm): relative error ~1e-6.
    ASSERT_NEAR(out[i], ref, 1e-6 * (1 + std::abs(ref))) << i;
  }
  // GeluTanhMul against PyTorch's formula in double, tails included.
  cpu::GeluTanhMul(g.data(), u.data(), out.data(), m, pool());
  for (int64_t i = 0; i < m; ++i) {
    const double x = g[i];
    const double ref =
        0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    ASSERT_NEAR(out[i], ref, 1e-6 * (1 + std::abs(ref))) << i;
  }
  std::vector<float> a = g;
  cpu::Add(a.data(), u.data(), m, pool());
  for (int64_t i = 0; i < m; ++i) ASSERT_FLOAT_EQ(a[i], g[i] + u[i]);
}

TEST_P(KernelTest, RopeStylesAreRelatedByPermutation) {
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
  cpu::Rope(a.data(), n, heads, hd, pos.data(), inv.data(), RopeStyle::kInterleaved, pool());
  cpu::Rope(b.data(), n, heads, hd, pos.data(), inv.data(), RopeStyle::kHalf, pool());
  for (int t = 0; t < n * heads; ++t) {
    for (int i = 0; i < hd / 2; ++i) {
      EXPECT_FLOAT_EQ(a[t * hd + 2 * i], b[t * hd + i]);
      EXPECT_FLOAT_EQ(a[t * hd + 2 * i + 1], b[t * hd + i + hd / 2]);
    }
  }
  // Position 0 is the identity; position 5 rotates pair 0 by 5 radians.
  EXPECT_FLOAT_EQ(a[0], x[0]);
  const int o = 1 * heads * hd;
  EXPECT_NEAR(a[o], x[o] * std::cos(5.0) - x[o + 1] * std::sin(5.0), 1e-5);
}

// Naive attention of token (seq, pos) for query q [n_heads, hd] over the rows k/v
// [len, n_kv_heads, hd] of its sequence, in double precision.
std::vector<double> NaiveAttention(const float* q, const std::vector<float>& k,
                                   const std::vector<float>& v, int pos, int heads, int kvh, int hd,
                                   int window, double scale = 0) {
  if (scale == 0) scale = 1.0 / std::sqrt(double(hd));
  const int width = kvh * hd;
  const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
  std::vector<double> out(heads * hd, 0.0);
  for (int h = 0; h < heads; ++h) {
    const int g = h / (heads / kvh);
    std::vector<double> s(pos + 1);
    double mx = -1e300, sum = 0;
    for (int j = first; j <= pos; ++j) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(q[h * hd + i]) * k[j * width + g * hd + i];
      s[j] = d * scale;
      mx = std::max(mx, s[j]);
    }
    for (int j = first; j <= pos; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int i = 0; i < hd; ++i) {
      for (int j = first; j <= pos; ++j) out[h * hd + i] += s[j] / sum * v[j * width + g * hd + i];
    }
  }
  return out;
}

TEST_P(KernelTest, PagedAttentionMatchesNaive) {
  // Two sequences in one call, as the engine batches them: sequence 0 prefills positions
  // [0, 13) (query tiles of 8 and 5), sequence 1 decodes position 9 after 9 cached positions.
  // GQA (4 query heads on 2 KV heads); head_dim 8, 12 (8 + scalar tail), 40 (32 + 8) and 64; blocks
  // of 4 in shuffled order; with and without a sliding window; head_dim 256 (Gemma 3) with the
  // default score scale and with its own (query_pre_attn_scalar).
  for (int hd : {8, 12, 40, 64, 256}) {
    for (int window : {0, 3}) {
      const float scale = hd == 256 && window == 3 ? 0.125f : 0.0f;
      const int heads = 4, kvh = 2, bs = 4, width = kvh * hd;
      const std::vector<int> lens = {13, 10};
      const std::vector<std::vector<int>> tables = {{5, 0, 7, 2}, {1, 6, 3}};
      const int max_blocks = 4;
      std::vector<int> flat_tables(2 * max_blocks, 0);
      for (int s = 0; s < 2; ++s) {
        std::copy(tables[s].begin(), tables[s].end(), flat_tables.begin() + s * max_blocks);
      }
      std::vector<float> kc(8 * bs * width, NAN), vc(8 * bs * width, NAN);
      std::vector<std::vector<float>> ks, vs;
      for (int s = 0; s < 2; ++s) {
        ks.push_back(Random(lens[s] * width, 10 + s));
        vs.push_back(Random(lens[s] * width, 20 + s));
        std::vector<int> slots;
        for (int p = 0; p < lens[s]; ++p) slots.push_back(tables[s][p / bs] * bs + p % bs);
        cpu::WriteKv(ks[s].data(), vs[s].data(), slots.data(), lens[s], width, kc.data(),
                     vc.data());
      }
      std::vector<int> token_seq, token_pos;
      for (int p = 0; p < 13; ++p) token_seq.push_back(0), token_pos.push_back(p);
      token_seq.push_back(1), token_pos.push_back(9);
      const int T = static_cast<int>(token_seq.size());
      const auto q = Random(T * heads * hd, 30);
      PagedAttentionArgs a = testing::AttentionArgs(heads, kvh, hd, bs, max_blocks, window,
                                                    token_seq, token_pos, flat_tables);
      a.scale = scale;
      std::vector<float> out(T * heads * hd, NAN);
      cpu::PagedAttention(q.data(), kc.data(), vc.data(), a, out.data(), pool());
      for (int t = 0; t < T; ++t) {
        const int s = token_seq[t];
        const auto ref = NaiveAttention(q.data() + t * heads * hd, ks[s], vs[s], token_pos[t],
                                        heads, kvh, hd, window, scale);
        for (int i = 0; i < heads * hd; ++i) {
          // float32 dot products of <= 256 terms and sums of <= 13 weights: ~1e-6.
          ASSERT_NEAR(out[t * heads * hd + i], ref[i], 1e-5)
              << "hd=" << hd << " window=" << window << " t=" << t << " i=" << i;
        }
      }
    }
  }
}

// Every KV cache dtype, on each ISA path: attention over a bf16, f16 or fp8 cache equals the
// naive float64 attention over the values the cache holds (its elements dequantized), to float32
// rounding; and stays within the dtype's own rounding of the float32 result.
TEST_P(KernelTest, PagedAttentionReadsEveryKvDtype) {
  const int heads = 4, kvh = 2, hd = 40, bs = 4, width = kvh * hd, num_blocks = 8;
  const std::vector<int> table = {5, 0, 7, 2};
  const int len = 13;
  const auto k = Random(len * width, 41), v = Random(len * width, 42);
  std::vector<int> slots;
  for (int p = 0; p < len; ++p) slots.push_back(table[p / bs] * bs + p % bs);
  std::vector<int> token_seq(len, 0), token_pos(len);
  for (int p = 0; p < len; ++p) token_pos[p] = p;
  const auto q = Random(len * heads * hd, 43);
  const PagedAttentionArgs a =
      testing::AttentionArgs(heads, kvh, hd, bs, 4, 0, token_seq, token_pos, table);
  // The float32 result, for the rounding bounds.
  std::vector<float> k32(num_blocks * bs * width), v32(num_blocks * bs * width);
  cpu::WriteKv(k.data(), v.data(), slots.data(), len, width, k32.data(), v32.data());
  std::vector<float> out32(len * heads * hd);
  cpu::PagedAttention(q.data(), k32.data(), v32.data(), a, out32.data(), pool());
  // Largest |error| against float32, per dtype: bf16 keeps 8 significant bits, f16 11, fp8 4
  // (with a scale), for unit-variance data through a softmax.
  const std::vector<std::pair<DType, float>> dtypes = {
      {DType::kBF16, 0.03f}, {DType::kF16, 0.004f}, {DType::kFp8E4M3, 0.2f}};
  for (const auto& [dtype, bound] : dtypes) {
    const size_t esize = DTypeSize(dtype);
    std::vector<char> kc(num_blocks * bs * width * esize), vc(kc.size());
    std::vector<float> scales(num_blocks * 2 * kvh, 1.0f);
    KvLayerRef c;
    c.dtype = dtype;
    c.k = kc.data();
    c.v = vc.data();
    c.block_size = bs;
    c.n_kv_heads = kvh;
    c.head_dim = hd;
    if (dtype == DType::kFp8E4M3) {
      // One scale per K/V and head for the whole sequence, as the engine sets them.
      c.scales = scales.data();
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < kvh; ++h) {
          float amax = 0;
          for (int p = 0; p < len; ++p) {
            for (int i = 0; i < hd; ++i) {
              amax = std::max(amax, std::fabs((kv == 0 ? k : v)[p * width + h * hd + i]));
            }
          }
          for (int b : table) scales[(b * 2 + kv) * kvh + h] = amax * 2 / kFp8E4M3Max;
        }
      }
    }
    cpu::WriteKv(k.data(), v.data(), slots.data(), len, c);
    // What the cache holds, dequantized: the exact inputs of the kernel.
    std::vector<float> kd(len * width), vd(len * width);
    for (int p = 0; p < len; ++p) {
      const int block = table[p / bs];
      for (int e = 0; e < width; ++e) {
        const size_t at = (static_cast<size_t>(slots[p]) * width + e) * esize;
        ConvertToF32(dtype, kc.data() + at, &kd[p * width + e], 1);
        ConvertToF32(dtype, vc.data() + at, &vd[p * width + e], 1);
        kd[p * width + e] *= c.scale(block, 0, e / hd);
        vd[p * width + e] *= c.scale(block, 1, e / hd);
      }
    }
    std::vector<float> out(len * heads * hd, NAN);
    cpu::PagedAttention(q.data(), c, a, out.data(), pool());
    float worst = 0;
    for (int t = 0; t < len; ++t) {
      const auto ref = NaiveAttention(q.data() + t * heads * hd, kd, vd, t, heads, kvh, hd, 0);
      for (int i = 0; i < heads * hd; ++i) {
        ASSERT_NEAR(out[t * heads * hd + i], ref[i], 1e-5) << DTypeName(dtype) << " t=" << t;
        worst = std::max(worst, std::fabs(out[t * heads * hd + i] - out32[t * heads * hd + i]));
      }
    }
    EXPECT_LT(worst, bound) << DTypeName(dtype);
    EXPECT_GT(worst, 0.0f) << DTypeName(dtype) << ": the cache was not quantized";
  }
}

// Long contexts: a decode token of few sequences is split into parts over its keys (each part
// scored and summed apart, then merged), and reads whole cache rows for every KV head. One
// sequence decoding at position 700 alone (split into as many parts as the threads want), then
// beside a second one at position 40 and a 9-token prefill chunk of a third; GQA of 3 query
// heads per KV head, head_dim 64 and 12 (a scalar tail), with and without a sliding window; f32
// and bf16 caches (against the values the cache holds).
TEST_P(KernelTest, PagedAttentionLongContextsSplitAndMerge) {
  for (int hd : {64, 12}) {
    for (int window : {0, 300}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (bool alone : {true, false}) {
          const int heads = 6, kvh = 2, bs = 16, width = kvh * hd;
          const std::vector<int> lens = {701, 41, 30};
          const int max_blocks = (701 + bs - 1) / bs;
          // Blocks of the three sequences interleaved, in reverse order.
          std::vector<int> flat_tables(3 * max_blocks, 0);
          int next = 3 * max_blocks - 1;
          for (int b = 0; b < max_blocks; ++b) {
            for (int s = 0; s < 3; ++s) {
              if (b * bs < lens[s]) flat_tables[s * max_blocks + b] = next--;
            }
          }
          const int num_blocks = 3 * max_blocks;
          const size_t esize = DTypeSize(dtype);
          std::vector<char> kc(static_cast<size_t>(num_blocks) * bs * width * esize);
          std::vector<char> vc(kc.size());
          KvLayerRef c;
          c.dtype = dtype;
          c.k = kc.data();
          c.v = vc.data();
          c.block_size = bs;
          c.n_kv_heads = kvh;
          c.head_dim = hd;
          std::vector<std::vector<float>> kd(3), vd(3);  // what the cache holds, as float32
          for (int s = 0; s < 3; ++s) {
            const auto k = Random(lens[s] * width, 50 + s), v = Random(lens[s] * width, 60 + s);
            std::vector<int> slots;
            for (int p = 0; p < lens[s]; ++p) {
              slots.push_back(flat_tables[s * max_blocks + p / bs] * bs + p % bs);
            }
            cpu::WriteKv(k.data(), v.data(), slots.data(), lens[s], c);
            kd[s].resize(k.size());
            vd[s].resize(v.size());
            for (int p = 0; p < lens[s]; ++p) {
              const size_t at = static_cast<size_t>(slots[p]) * width * esize;
              ConvertToF32(dtype, kc.data() + at, &kd[s][p * width], width);
              ConvertToF32(dtype, vc.data() + at, &vd[s][p * width], width);
            }
          }
          std::vector<int> token_seq = {0}, token_pos = {700};
          if (!alone) {
            token_seq.push_back(1), token_pos.push_back(40);
            for (int p = 21; p < 30; ++p) token_seq.push_back(2), token_pos.push_back(p);
          }
          const int T = static_cast<int>(token_seq.size());
          const auto q = Random(T * heads * hd, 70);
          const PagedAttentionArgs a = testing::AttentionArgs(
              heads, kvh, hd, bs, max_blocks, window, token_seq, token_pos, flat_tables);
          std::vector<float> out(T * heads * hd, NAN);
          cpu::PagedAttention(q.data(), c, a, out.data(), pool());
          for (int t = 0; t < T; ++t) {
            const int s = token_seq[t];
            const auto ref = NaiveAttention(q.data() + t * heads * hd, kd[s], vd[s], token_pos[t],
                                            heads, kvh, hd, window);
            for (int i = 0; i < heads * hd; ++i) {
              // float32 sums of <= 701 weights of unit-variance values: ~1e-6.
              ASSERT_NEAR(out[t * heads * hd + i], ref[i], 2e-5)
                  << "hd=" << hd << " window=" << window << " " << DTypeName(dtype)
                  << " alone=" << alone << " t=" << t << " i=" << i;
            }
          }
        }
      }
    }
  }
}

TEST(DtypeTest, Fp8E4M3RoundTripAndRounding) {
  // Every finite code decodes and encodes back to itself.
  for (int b = 0; b < 256; ++b) {
    const float x = Fp8E4M3ToF32(static_cast<uint8_t>(b));
    if (std::isnan(x)) {
      EXPECT_EQ(F32ToFp8E4M3(x) & 0x7f, 0x7f);
      continue;
    }
    EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(x)), x) << b;
  }
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), 1.0f / 512);
  EXPECT_EQ(F32ToFp8E4M3(1e9f), 0x7e);  // saturates
  EXPECT_EQ(F32ToFp8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.0625f)), 1.0f);            // halfway: to even (1.0)
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.1875f)), 1.25f);           // halfway: to even (1.25)
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.0f / 1024)), 0.0f);        // half the smallest: even
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(3.0f / 1024)), 2.0f / 512);  // 1.5 steps: to even 2
  // Relative error of a normal value within half a step of 3 mantissa bits.
  for (float x = 0.02f; x < 440; x *= 1.013f) {
    EXPECT_LE(std::fabs(Fp8E4M3ToF32(F32ToFp8E4M3(x)) - x), x / 16 * 1.0001f) << x;
  }
}

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 100, 1001}) {
    for (int64_t grain : {1, 7, 2000}) {
      std::vector<int> hits(n, 0);
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_TRUE(b % grain == 0 && (e - b == grain || e == n)) << b << " " << e;
        for (int64_t i = b; i < e; ++i) ++hits[i];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << n << " " << i;
    }
  }
}

TEST(ThreadPoolTest, ManyLoopsSpinningAndSleeping) {
  // Back-to-back loops meet spinning workers; loops after a pause longer than the spin time meet
  // sleeping ones. Neither may lose a wake-up.
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    if (round % 500 == 499) {
      std::this_thread::sleep_for(std::chrono::microseconds(3 * ThreadPool::kSpinMicros));
    }
    pool.ParallelFor(4, 1, [&](int64_t b, int64_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 2000 * 4);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int i = 0; i < 300; ++i) {
      pool.ParallelFor(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 300 * 10);
}

}  // namespace
}  // namespace tandem
