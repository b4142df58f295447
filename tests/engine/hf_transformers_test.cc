// The Hugging Face path against transformers itself: tiny random-weight checkpoints saved by
// save_pretrained with transformers' float32 logits beside them (tests/fixtures/hf, made by
// scripts/make_hf_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generator.h"
#include "engine/model.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

class HfTransformersTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTransformersTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/hf/" + GetParam();
  const auto expected = testing::LoadJson(dir + "/expected.json");
  ASSERT_TRUE(expected.is_object()) << dir;
  auto backend = MakeCpuBackend();
  auto model = Model::Load(dir, backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto cache = KvCache::Create(c, 8, 16);
  ASSERT_TRUE(cache.ok());
  std::vector<int> table = {0, 1, 2, 3, 4, 5, 6, 7};
  for (const auto& cs : expected["cases"]) {
    const std::vector<int> ids = cs["input_ids"];
    SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
    std::vector<float> logits;
    ASSERT_TRUE((*model)->Forward({&chunk, 1}, &*cache, &logits).ok());
    const auto& want = cs["logits"];
    ASSERT_EQ(logits.size(), want.size() * c.vocab_size);
    for (size_t p = 0; p < want.size(); ++p) {
      const std::vector<float> row = want[p];
      float max_abs = 0, max_err = 0;
      for (int v = 0; v < c.vocab_size; ++v) {
        max_abs = std::max(max_abs, std::abs(row[v]));
        max_err = std::max(max_err, std::abs(logits[p * c.vocab_size + v] - row[v]));
      }
      // Both sides compute in float32 from the same (upcast) weights; they differ only in
      // summation order (~1e-6 relative per op, compounding over 2 layers) and in the fixtures'
      // rounding to 6 significant digits (5e-6 relative). 1e-4 of the row's largest logit is
      // two orders above that and two below the smallest real bug (a wrong rotation or a
      // missing bias moves logits by 3..20).
      EXPECT_LE(max_err, 1e-4f * std::max(1.0f, max_abs))
          << GetParam() << " sequence of " << ids.size() << " position " << p;
    }
  }
  // Greedy continuation as model.generate(do_sample=False) with EOS disabled.
  GenerationRequest req;
  req.prompt = expected["greedy_prompt"].get<std::vector<int>>();
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  const std::vector<int> want = expected["greedy_tokens"];
  req.max_tokens = static_cast<int>(want.size());
  Generator gen(model->get(), nullptr, {});
  auto out = gen.Generate({&req, 1});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].tokens, want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTransformersTest,
                         ::testing::Values("llama3_f32", "llama_tied_bf16", "qwen2_f32",
                                           "mistral_f16", "llama_sharded_f32"));

TEST(HfConfigTest, ReadsArchitectureSpecifics) {
  const std::string base = testing::SourceDir() + "/tests/fixtures/hf/";
  auto llama3 = ModelConfig::FromHfJson(*ReadFileToString(base + "llama3_f32/config.json"));
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama3->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_FALSE(llama3->tie_word_embeddings);
  auto qwen = ModelConfig::FromHfJson(*ReadFileToString(base + "qwen2_f32/config.json"));
  ASSERT_TRUE(qwen.ok());
  EXPECT_TRUE(qwen->qkv_bias);
  EXPECT_TRUE(qwen->tie_word_embeddings);
  EXPECT_EQ(qwen->sliding_window, 0);
}

TEST(HfConfigTest, Llama3ScalingTouchesAllThreeBands) {
  ModelConfig c;
  c.head_dim = 16;
  c.rope_theta = 500000;
  c.rope_style = RopeStyle::kHalf;
  const auto plain = c.RopeInvFreq();
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 64};
  const auto scaled = c.RopeInvFreq();
  EXPECT_EQ(scaled[0], plain[0]);  // high frequency: unchanged
  EXPECT_NE(scaled[1], plain[1]);  // smoothed
  EXPECT_NE(scaled[1], plain[1] / 8);
  EXPECT_FLOAT_EQ(scaled[7], plain[7] / 8);  // low frequency: divided by factor
}

}  // namespace
}  // namespace tandem
