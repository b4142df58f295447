// Block-quantized weights: the layouts against gguf-py's dequantization (fixtures made by
// scripts/make_gguf_fixtures.py), the quantizers' round trip, and the quantized matmul on every
// instruction-set path against its scalar twin and against dequantize-then-float32.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/isa_paths.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::string GgmlName(DType t) {
  std::string name(DTypeName(t));
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  return out;
}

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(QuantLayoutTest, DequantizeMatchesGgufPy) {
  const auto fixture =
      testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/dequantize.json");
  ASSERT_TRUE(fixture.contains("types"));
  for (DType t : kQuantTypes) {
    SCOPED_TRACE(GgmlName(t));
    ASSERT_TRUE(fixture["types"].contains(GgmlName(t)));
    const auto& entry = fixture["types"][GgmlName(t)];
    const std::vector<uint8_t> raw = FromHex(entry["hex"]);
    const std::vector<float> want = entry["values"];
    ASSERT_EQ(raw.size() % BlockBytes(t), 0u);
    ASSERT_EQ(want.size(), raw.size() / BlockBytes(t) * BlockElems(t));
    std::vector<float> got(want.size());
    DequantizeRow(t, raw.data(), got.data(), static_cast<int64_t>(got.size()));
    float max_abs = 0;
    for (float w : want) max_abs = std::max(max_abs, std::abs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      // gguf-py multiplies in another order for the K types: a few ulp apart at most.
      ASSERT_NEAR(got[i], want[i], 1e-6f * max_abs) << "element " << i;
    }
  }
}

TEST(QuantLayoutTest, RowBytesAndBlocks) {
  EXPECT_EQ(RowBytes(DType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(DType::kQ4_0, 64), 36);
  EXPECT_EQ(RowBytes(DType::kQ4_K, 512), 288);
  EXPECT_EQ(RowBytes(DType::kQ6_K, 256), 210);
  EXPECT_EQ(RowBytes(DType::kF32, 10), 40);
  for (DType t : kQuantTypes) EXPECT_TRUE(IsQuantized(t)) << GgmlName(t);
  EXPECT_FALSE(IsQuantized(DType::kBF16));
}

TEST(QuantLayoutTest, QuantizeRoundTripErrorIsBoundedByTheBits) {
  const int64_t n = 1024;
  const std::vector<float> x = Random(n, 7);
  double rms = 0;
  for (float v : x) rms += v * v;
  rms = std::sqrt(rms / n);
  for (DType t : kQuantTypes) {
    std::vector<uint8_t> q(RowBytes(t, n));
    std::vector<float> back(n);
    QuantizeRow(t, x.data(), q.data(), n);
    DequantizeRow(t, q.data(), back.data(), n);
    double err = 0;
    for (int64_t i = 0; i < n; ++i) err += (back[i] - x[i]) * (back[i] - x[i]);
    err = std::sqrt(err / n) / rms;
    // One rounding step per element: range / levels / sqrt(12) of a block's range (~5 sigma).
    const double bound = t == DType::kQ8_0                        ? 0.01
                         : t == DType::kQ6_K                      ? 0.04
                         : t == DType::kQ5_0 || t == DType::kQ5_1 ? 0.07
                         : t == DType::kQ5_K                      ? 0.07
                                                                  : 0.14;
    EXPECT_LT(err, bound) << GgmlName(t);
    EXPECT_GT(err, 0.0) << GgmlName(t) << ": a quantizer that loses nothing is not quantizing";
  }
}

TEST(QuantLayoutTest, ActivationBlocksCarryTheirSums) {
  const std::vector<float> x = Random(64, 3);
  ActBlock a[2];
  QuantizeActivations(x.data(), a, 64);
  for (int b = 0; b < 2; ++b) {
    float sum = 0, sum16 = 0;
    int amax = 0, rmax = 0;
    for (int l = 0; l < 32; ++l) {
      const float v = a[b].unit * (128 * a[b].q[l] + a[b].r[l]);
      sum += v;
      if (l < 16) sum16 += v;
      amax = std::max(amax, std::abs(static_cast<int>(a[b].q[l])));
      rmax = std::max(rmax, std::abs(static_cast<int>(a[b].r[l])));
      // Two int8 parts: within half a unit (1 / 32512 of the block's largest value).
      EXPECT_NEAR(v, x[b * 32 + l], a[b].unit * 0.5f + 1e-7f);
    }
    EXPECT_NEAR(a[b].sum, sum, 1e-5f);
    EXPECT_NEAR(a[b].sum16, sum16, 1e-5f);
    EXPECT_EQ(amax, 127);
    EXPECT_LE(rmax, 64);
  }
}

// The quantized matmul on one instruction-set path (tests/kernels/isa_paths.h).
struct QuantCase {
  DType dtype;
  testing_isa::IsaPath path;
};

std::vector<QuantCase> QuantCases() {
  std::vector<QuantCase> out;
  for (DType t : kQuantTypes) {
    for (const testing_isa::IsaPath& path : testing_isa::TestablePaths()) out.push_back({t, path});
  }
  return out;
}

class QuantMatmulTest : public ::testing::TestWithParam<QuantCase> {};

// y = x W^T for W quantized: against float32 on the dequantized W (the activation rounding is
// the only difference), and the AVX2 and AVX-512 paths against the scalar twin (the same
// integers, summed in another order).
TEST_P(QuantMatmulTest, MatchesDequantizedF32AndTheScalarTwin) {
  const DType t = GetParam().dtype;
  ThreadPool pool(3);
  // Rows in whole groups of 4 (decode reduces 4 rows together) or not, an even number of blocks
  // or not (an odd last block where the type allows it: K-quant rows are whole super-blocks).
  const bool k_quant = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const std::pair<int64_t, int64_t> shapes[] = {{40, 512}, {42, 512}, {43, k_quant ? 768 : 544}};
  for (const auto& [rows, cols] : shapes)
    for (int n : {1, 2, 3, 4, 7, 12, 16, 70}) {
      SCOPED_TRACE(GgmlName(t) + " n=" + std::to_string(n) + " cols=" + std::to_string(cols));
      const std::vector<float> w = Random(rows * cols, 11 + n, 0.05f);
      const std::vector<float> x = Random(n * cols, 19 + n);
      const std::vector<float> bias = Random(rows, 5);
      std::vector<uint8_t> wq(rows * RowBytes(t, cols));
      for (int64_t r = 0; r < rows; ++r) {
        QuantizeRow(t, w.data() + r * cols, wq.data() + r * RowBytes(t, cols), cols);
      }
      std::vector<float> wd(rows * cols);
      DequantizeRow(t, wq.data(), wd.data(), rows * cols);
      const WeightRef quant{t, wq.data(), rows, cols};
      const WeightRef dequant{DType::kF32, wd.data(), rows, cols};

      std::vector<float> ref(n * rows), twin(n * rows), got(n * rows);
      {
        testing_isa::ScopedIsa scalar({cpu::Isa::kScalar, false});
        cpu::Matmul(x.data(), dequant, bias.data(), ref.data(), n);
        cpu::Matmul(x.data(), quant, bias.data(), twin.data(), n);
      }
      {
        testing_isa::ScopedIsa isa(GetParam().path);
        ASSERT_TRUE(isa.ok());
        cpu::Matmul(x.data(), quant, bias.data(), got.data(), n, &pool);
      }

      // Integer products (decode, the scalar ISA, batched on AVX-512) are exact: only the float
      // summation order differs from the twin. Batched on AVX2, tiles are dequantized and
      // multiplied in float32: the dequantized reference up to summation order.
      bool integer;
      {
        testing_isa::ScopedIsa isa(GetParam().path);
        integer = cpu::QuantizedMatmulIsInteger(n);
      }
      const std::vector<float>& same = integer ? twin : ref;
      double ref_rms = 0, act_err = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        ref_rms += ref[i] * ref[i];
        act_err += (twin[i] - ref[i]) * (twin[i] - ref[i]);
        ASSERT_NEAR(got[i], same[i], 1e-4f * (1 + std::abs(same[i]))) << "element " << i;
      }
      // Activations to ~14 bits: about 0.5 / 16256 relative error per element, averaging down.
      EXPECT_LT(std::sqrt(act_err / ref_rms), 1e-4);
    }
}

// Batch invariance: below kQuantGemmTokens tokens, a token's outputs are the same bits whether it
// is multiplied alone or beside others (and whichever rows a thread took). The decode worker's
// batches and speculative decoding's verify steps rely on it to give the tokens of decoding alone.
TEST_P(QuantMatmulTest, TokensGetTheSameBitsAloneAndInABatch) {
  const DType t = GetParam().dtype;
  ThreadPool pool(3);
  const bool k_quant = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const std::pair<int64_t, int64_t> shapes[] = {{42, 512}, {43, k_quant ? 768 : 544}};
  testing_isa::ScopedIsa isa(GetParam().path);
  ASSERT_TRUE(isa.ok());
  for (const auto& [rows, cols] : shapes) {
    const std::vector<float> w = Random(rows * cols, 3, 0.05f);
    const std::vector<float> bias = Random(rows, 4);
    std::vector<uint8_t> wq(rows * RowBytes(t, cols));
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRow(t, w.data() + r * cols, wq.data() + r * RowBytes(t, cols), cols);
    }
    const WeightRef quant{t, wq.data(), rows, cols};
    for (int n = 2; n < cpu::kQuantGemmTokens; ++n) {
      SCOPED_TRACE(GgmlName(t) + " n=" + std::to_string(n) + " cols=" + std::to_string(cols));
      const std::vector<float> x = Random(n * cols, 7 + n);
      std::vector<float> batch(n * rows), alone(rows);
      cpu::Matmul(x.data(), quant, bias.data(), batch.data(), n, &pool);
      for (int token = 0; token < n; ++token) {
        cpu::Matmul(x.data() + token * cols, quant, bias.data(), alone.data(), 1, &pool);
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(batch[token * rows + r], alone[r]) << "token " << token << " row " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantMatmulTest, ::testing::ValuesIn(QuantCases()),
                         [](const ::testing::TestParamInfo<QuantCase>& info) {
                           return GgmlName(info.param.dtype) +
                                  testing_isa::PathName(info.param.path);
                         });

TEST(QuantEmbeddingTest, RowsAreDequantized) {
  const int64_t rows = 5, cols = 256;
  const std::vector<float> w = Random(rows * cols, 1);
  for (DType t : kQuantTypes) {
    std::vector<uint8_t> wq(rows * RowBytes(t, cols));
    QuantizeRow(t, w.data(), wq.data(), rows * cols);
    std::vector<float> all(rows * cols);
    DequantizeRow(t, wq.data(), all.data(), rows * cols);
    const int ids[] = {4, 0, 4};
    std::vector<float> out(3 * cols);
    cpu::Embedding(ids, {t, wq.data(), rows, cols}, out.data(), 3);
    for (int i = 0; i < 3; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(out[i * cols + c], all[ids[i] * cols + c]) << GgmlName(t);
      }
    }
  }
}

}  // namespace
}  // namespace tandem
