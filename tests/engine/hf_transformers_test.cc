// The Hugging Face path against transformers itself: tiny random-weight checkpoints saved by
// save_pretrained with transformers' float32 logits beside them (tests/fixtures/hf, made by
// scripts/make_hf_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generator.h"
#include "engine/model.h"
#include "tests/test_util.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

// The model in `dir` against transformers' logits and greedy tokens in `expected_path`.
void ExpectTransformersLogits(const std::string& dir, const std::string& expected_path) {
  const auto expected = testing::LoadJson(expected_path);
  ASSERT_TRUE(expected.is_object()) << expected_path;
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
          << dir << " sequence of " << ids.size() << " position " << p;
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

class HfTransformersTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTransformersTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/hf/" + GetParam();
  ExpectTransformersLogits(dir, dir + "/expected.json");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTransformersTest,
                         ::testing::Values("llama3_f32", "llama_tied_bf16", "qwen2_f32",
                                           "mistral_f16", "llama_sharded_f32"));

// The same models saved by transformers 5 (tests/fixtures/hf5, make_hf5_fixtures.py): the rope
// settings live in rope_parameters, and the logits must not move.
class Hf5Test : public ::testing::TestWithParam<std::string> {};

TEST_P(Hf5Test, SavedByTransformers5GivesTheSameLogits) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/hf5/" + GetParam();
  auto config = ModelConfig::FromHfJson(*ReadFileToString(dir + "/config.json"));
  ASSERT_TRUE(config.ok()) << config.status();
  auto v4 = ModelConfig::FromHfJson(*ReadFileToString(testing::SourceDir() + "/tests/fixtures/hf/" +
                                                      GetParam() + "/config.json"));
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(config->rope_theta, v4->rope_theta);
  EXPECT_EQ(config->rope_scaling.type, v4->rope_scaling.type);
  EXPECT_EQ(config->rope_scaling.factor, v4->rope_scaling.factor);
  ExpectTransformersLogits(
      dir, testing::SourceDir() + "/tests/fixtures/hf/" + GetParam() + "/expected.json");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Hf5Test, ::testing::Values("llama3_f32", "qwen2_f32"));

std::string LlamaConfigWith(const std::string& extra) {
  return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128)" +
         extra + "}";
}

TEST(HfConfigTest, RopeParametersAreRead) {
  auto c = ModelConfig::FromHfJson(
      LlamaConfigWith(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 123.0})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 123.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  c = ModelConfig::FromHfJson(LlamaConfigWith(
      R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_theta, 5e5f);
  // Contradictions and shapes Tandem cannot follow are errors naming the field.
  for (const std::string& bad : {
           std::string(R"(, "rope_theta": 10.0, "rope_parameters": {"rope_theta": 20.0})"),
           std::string(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})"),
           std::string(R"(, "rope_parameters": {"full_attention": {"rope_theta": 1.0}})"),
           std::string(
               R"(, "rope_parameters": {"rope_theta": 1.0}, "rope_scaling": {"factor": 2})"),
           std::string(R"(, "rope_parameters": 5)"),
       }) {
    auto r = ModelConfig::FromHfJson(LlamaConfigWith(bad));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("rope"), std::string::npos) << r.status();
  }
}

TEST(HfConfigTest, FieldsThatChangeTheMathAreRefusedByName) {
  for (const auto& [field, extra] : std::vector<std::pair<std::string, std::string>>{
           {"mlp_bias", R"(, "mlp_bias": true)"},
           {"attention_bias", R"(, "attention_bias": true)"},
           {"partial_rotary_factor", R"(, "partial_rotary_factor": 0.5)"},
           {"final_logit_softcapping", R"(, "final_logit_softcapping": 30.0)"},
           {"attn_logit_softcapping", R"(, "attn_logit_softcapping": 50.0)"},
           {"quantization_config", R"(, "quantization_config": {"quant_method": "gptq"})"},
           {"logits_scaling", R"(, "logits_scaling": 8.0)"},
           {"layer_types", R"(, "layer_types": ["full_attention", "sliding_attention"])"},
           {"no_rope_layers", R"(, "no_rope_layers": [1, 0])"},
       }) {
    auto r = ModelConfig::FromHfJson(LlamaConfigWith(extra));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  }
  // The harmless values of the same fields load.
  auto ok = ModelConfig::FromHfJson(LlamaConfigWith(
      R"(, "mlp_bias": false, "attention_bias": false, "partial_rotary_factor": 1.0,
         "final_logit_softcapping": null, "layer_types": ["full_attention", "full_attention"],
         "logits_scaling": 1.0, "pretraining_tp": 1, "dtype": "bfloat16")"));
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// transformers 5 saves the chat template to chat_template.jinja, not tokenizer_config.json.
TEST(HfChatTemplateTest, TemplateBesideTheConfigRendersAsTransformers5) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/hf5/chatml_tokenizer";
  const auto expected = testing::LoadJson(dir + "/expected.json");
  for (const std::string& model_path : {dir, std::string()}) {
    auto chat = LoadChatTemplate(model_path, model_path.empty() ? dir + "/tokenizer.json" : "", "");
    ASSERT_TRUE(chat.ok()) << chat.status();
    for (const auto& c : expected["chat"]) {
      auto got = chat->Apply(c["messages"], c["add_generation_prompt"].get<bool>());
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, c["rendered"].get<std::string>());
    }
  }
}

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
