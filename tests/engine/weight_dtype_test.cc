// Weight storage dtypes (Model::Load's weight_dtype, `--dtype`): matrices are converted at load,
// and the f16/bf16 forward passes stay close to the f32 one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

// Logits [n, vocab] of one prefill of `ids` with a logit row for every token.
std::vector<float> AllLogits(const Model& m, const std::vector<int>& ids) {
  auto cache = KvCache::Create(m.config(), 8, 16);
  EXPECT_TRUE(cache.ok());
  std::vector<int> table(8);
  std::iota(table.begin(), table.end(), 0);
  SequenceChunk c{ids, 0, table, true};
  std::vector<float> logits;
  EXPECT_TRUE(m.Forward({&c, 1}, &*cache, &logits).ok());
  return logits;
}

std::vector<int> Prompt(int n, int vocab) {
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 1 + (i * 37 + 11) % (vocab - 1);
  return ids;
}

class WeightDTypeTest : public ::testing::Test {
 protected:
  std::unique_ptr<Model> Load(const std::string& path, std::optional<DType> dt) {
    auto m = Model::Load(path, backend_.get(), dt);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  std::unique_ptr<Backend> backend_ = MakeCpuBackend();
};

TEST_F(WeightDTypeTest, MatricesAreConvertedAndTiesKept) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto m = Load(testing::Stories260K(), dt);
    ASSERT_NE(m, nullptr);
    const ModelWeights& w = m->weights();
    EXPECT_EQ(w.token_embedding.dtype, dt);
    for (const LayerWeights& l : w.layers) {
      for (const WeightRef* r : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) {
        EXPECT_EQ(r->dtype, dt);
      }
    }
    // stories260K ties its classifier to the embedding: still one buffer after conversion.
    EXPECT_EQ(w.classifier.data, w.token_embedding.data);
  }
}

TEST_F(WeightDTypeTest, HalfPrecisionLogitsCloseToFloat) {
  auto f32 = Load(testing::Stories260K(), std::nullopt);
  ASSERT_NE(f32, nullptr);
  const auto ids = Prompt(100, f32->config().vocab_size);
  const auto ref = AllLogits(*f32, ids);
  const int vocab = f32->config().vocab_size;
  // Tolerances: rounding a weight to f16 (11-bit significand) perturbs it by <= 2^-11 relative,
  // bf16 (8 bits) by <= 2^-8. Through 5 layers the perturbations add up like random walks over
  // the dot products; over these 100 positions the observed max |Δlogit| is 0.009 (f16) and
  // 0.08 (bf16), with 0 and 2 greedy flips where the top two logits nearly tie. The bounds leave
  // ~2x margin; a real bug (wrong row, wrong conversion) moves logits by O(1).
  struct Case {
    DType dt;
    double max_abs;
    int max_argmax_flips;
  };
  for (const Case& c : {Case{DType::kF16, 0.02, 1}, Case{DType::kBF16, 0.15, 3}}) {
    auto m = Load(testing::Stories260K(), c.dt);
    ASSERT_NE(m, nullptr);
    const auto got = AllLogits(*m, ids);
    ASSERT_EQ(got.size(), ref.size());
    double max_diff = 0;
    int flips = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* a = ref.data() + t * vocab;
      const float* b = got.data() + t * vocab;
      for (int v = 0; v < vocab; ++v) max_diff = std::max(max_diff, double(std::abs(a[v] - b[v])));
      flips += std::max_element(a, a + vocab) - a != std::max_element(b, b + vocab) - b;
    }
    EXPECT_LT(max_diff, c.max_abs) << DTypeName(c.dt);
    EXPECT_LE(flips, c.max_argmax_flips) << DTypeName(c.dt);
  }
}

TEST_F(WeightDTypeTest, HfBf16CheckpointLoadedAsF32IsExact) {
  // bf16 -> f32 is exact and the kernels convert bf16 to f32 before the same float32 math, so a
  // bf16 checkpoint gives bit-identical logits whether converted at load or in the kernel.
  testing::TempDir dir;
  auto cfg = RandomModelConfig("stories260K");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(WriteRandomModel(*cfg, DType::kBF16, 7, dir.path()).ok());
  auto native = Load(dir.path(), std::nullopt);
  auto as_f32 = Load(dir.path(), DType::kF32);
  ASSERT_NE(native, nullptr);
  ASSERT_NE(as_f32, nullptr);
  EXPECT_EQ(native->weights().layers[0].wq.dtype, DType::kBF16);
  EXPECT_EQ(as_f32->weights().layers[0].wq.dtype, DType::kF32);
  const auto ids = Prompt(20, native->config().vocab_size);
  EXPECT_EQ(AllLogits(*native, ids), AllLogits(*as_f32, ids));
}

}  // namespace
}  // namespace tandem
