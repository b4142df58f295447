// Mixture-of-experts models (Qwen3-MoE and Mixtral) against transformers: the tiny random-weight
// models of scripts/make_moe_fixtures.py as HF directories and GGUF files (tests/fixtures/hf/
// {qwen3_moe_f32, qwen3_moe_mixed_f32, mixtral_f32}, gguf/{qwen3_moe, mixtral}); their logits at
// every position within 1e-4 of the row's largest and identical greedy tokens.
#include <gtest/gtest.h>

#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "tests/engine/transformers_oracle.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::CaseLogits;
using testing::ExpectNearTransformers;
using testing::ExpectTransformersLogits;
using testing::MoeDir;
using testing::MoeGguf;

absl::StatusOr<ModelConfig> ConfigOf(const std::string& dir) {
  return ModelConfig::FromHfJson(*ReadFileToString(dir + "/config.json"));
}

TEST(MoeConfigTest, ReadsEachFamilysExperts) {
  auto qwen = ConfigOf(MoeDir("qwen3_moe_f32"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(qwen->n_experts, 4);
  EXPECT_EQ(qwen->n_experts_used, 2);
  EXPECT_EQ(qwen->expert_hidden_dim, 32);
  EXPECT_TRUE(qwen->norm_topk_prob);
  EXPECT_TRUE(qwen->qk_norm);
  EXPECT_EQ(qwen->head_dim, 16);
  EXPECT_TRUE(qwen->dense_layers.empty());
  EXPECT_EQ(qwen->MoeLayers(), 2);

  // mlp_only_layers = [1]: a dense MLP of intermediate_size between two mixtures.
  auto mixed = ConfigOf(MoeDir("qwen3_moe_mixed_f32"));
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_FALSE(mixed->norm_topk_prob);
  EXPECT_EQ(mixed->n_experts, 6);
  EXPECT_EQ(mixed->n_experts_used, 3);
  EXPECT_EQ(mixed->expert_hidden_dim, 16);
  EXPECT_EQ(mixed->hidden_dim, 48);
  EXPECT_EQ(mixed->dense_layers, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_TRUE(mixed->LayerIsMoe(0));
  EXPECT_FALSE(mixed->LayerIsMoe(1));

  auto mixtral = ConfigOf(MoeDir("mixtral_f32"));
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->architecture, "MixtralForCausalLM");
  EXPECT_EQ(mixtral->n_experts, 4);
  EXPECT_EQ(mixtral->n_experts_used, 2);
  EXPECT_EQ(mixtral->expert_hidden_dim, 32);  // intermediate_size: every MLP is an expert
  EXPECT_TRUE(mixtral->norm_topk_prob);
  EXPECT_FALSE(mixtral->tie_word_embeddings);
}

std::string Qwen3MoeConfigWith(const std::string& extra) {
  return R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32)" +
         extra + "}";
}

TEST(MoeConfigTest, WhatIsNotBuiltIsRefusedByName) {
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "num_experts_per_tok": 9)", "num_experts_per_tok"},
           {R"(, "moe_intermediate_size": 0)", "moe_intermediate_size"},
           {R"(, "mlp_only_layers": [2])", "mlp_only_layers"},
           {R"(, "mlp_only_layers": "all")", "mlp_only_layers"},
           {R"(, "decoder_sparse_step": 0)", "decoder_sparse_step"},
           {R"(, "norm_topk_prob": 1)", "norm_topk_prob"},
           {R"(, "use_sliding_window": true)", "use_sliding_window"},
       }) {
    auto c = ModelConfig::FromHfJson(Qwen3MoeConfigWith(extra));
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
  }
  // Qwen3MoeConfig's defaults: head_dim = hidden / heads (no 128 as in Qwen3), every layer a
  // mixture, weights not renormalised; decoder_sparse_step 2 makes the even layers dense.
  auto c = ModelConfig::FromHfJson(Qwen3MoeConfigWith(R"(, "decoder_sparse_step": 2)"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_EQ(c->dense_layers, (std::vector<uint8_t>{1, 0}));
  // Mixtral always renormalises.
  auto mixtral = ModelConfig::FromHfJson(
      R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
          "norm_topk_prob": false})");
  ASSERT_FALSE(mixtral.ok());
  EXPECT_NE(mixtral.status().message().find("norm_topk_prob"), std::string::npos);
}

class MoeHfTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeHfTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = MoeDir(GetParam());
  ExpectTransformersLogits(dir, dir + "/expected.json");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeHfTest,
                         ::testing::Values("qwen3_moe_f32", "qwen3_moe_mixed_f32", "mixtral_f32"));

struct GgufCase {
  std::string family, hf, architecture;
};

class MoeGgufTest : public ::testing::TestWithParam<GgufCase> {};

// The f32 file holds the HF directory's weights (make_moe_fixtures.py checks them bit for bit):
// a qwen3moe file, and a llama file with experts (Mixtral, its q/k rows permuted).
TEST_P(MoeGgufTest, F32FileMatchesTransformers) {
  const GgufCase& g = GetParam();
  auto backend = MakeCpuBackend();
  auto model = Model::Load(MoeGguf(g.family, g.family + "_f32"), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, g.architecture);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.n_experts_used, 2);
  EXPECT_EQ(c.expert_hidden_dim, 32);
  EXPECT_TRUE(c.norm_topk_prob);
  ExpectTransformersLogits(**model, testing::LoadJson(MoeDir(g.hf) + "/expected.json"), g.family);
}

// The Q8_0 file dequantized to float32 at load against transformers on gguf-py's dequantized
// tensors; as stored (int8 experts, the router kept float32), within 2e-3 (the activations are
// rounded to about 14 bits for the integer products, and this small random model's logits are
// small) and the same greedy tokens.
TEST_P(MoeGgufTest, Q8_0FileMatchesTransformersDequantizedAndAsStored) {
  const GgufCase& g = GetParam();
  const auto expected = testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/" +
                                          g.family + "/expected.json")["q8_0"];
  const std::string path = MoeGguf(g.family, g.family + "_q8_0");
  auto backend = MakeCpuBackend();
  auto as_f32 = Model::Load(path, backend.get(), DType::kF32);
  ASSERT_TRUE(as_f32.ok()) << as_f32.status();
  ExpectTransformersLogits(**as_f32, expected, path + " as f32");
  auto stored = Model::Load(path, backend.get());
  ASSERT_TRUE(stored.ok()) << stored.status();
  const LayerWeights& l = (*stored)->weights().layers[0];
  ASSERT_EQ(l.experts.size(), 4u);
  EXPECT_EQ(l.experts[3].w2.dtype, DType::kQ8_0);
  EXPECT_EQ(l.router.dtype, DType::kF32);
  ExpectNearTransformers(**stored, expected, 2e-3f, path + " as stored");
}

INSTANTIATE_TEST_SUITE_P(
    Families, MoeGgufTest,
    ::testing::Values(GgufCase{"qwen3_moe", "qwen3_moe_f32", "Qwen3MoeForCausalLM"},
                      GgufCase{"mixtral", "mixtral_f32", "MixtralForCausalLM"}),
    [](const ::testing::TestParamInfo<GgufCase>& info) { return info.param.family; });

// --dtype converts every expert and leaves the router as stored (llama.cpp's quantizer does the
// same: the experts a token takes turn on small differences of its router logits).
TEST(MoeTest, ConvertingWeightsKeepsTheRouter) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(MoeDir("qwen3_moe_f32"), backend.get(), DType::kQ8_0);
  ASSERT_TRUE(model.ok()) << model.status();
  for (const LayerWeights& l : (*model)->weights().layers) {
    EXPECT_EQ(l.router.dtype, DType::kF32);
    for (const ExpertWeights& e : l.experts) {
      EXPECT_EQ(e.w1.dtype, DType::kQ8_0);
      EXPECT_EQ(e.w2.dtype, DType::kQ8_0);
      EXPECT_EQ(e.w3.dtype, DType::kQ8_0);
    }
  }
  // Quantized at load as gguf-py quantized the Q8_0 file: that file's oracle holds.
  const auto expected = testing::LoadJson(testing::SourceDir() +
                                          "/tests/fixtures/gguf/qwen3_moe/expected.json")["q8_0"];
  ExpectNearTransformers(**model, expected, 1e-3f, "qwen3_moe_f32 as q8_0");
}

// A step of several sequences (a prefill chunk and decode tokens together, as the decode worker
// batches them) routes each token on its own: every sequence's logits equal those it gets alone.
TEST(MoeTest, BatchedStepGivesEachSequenceItsOwnLogits) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(MoeDir("mixtral_f32"), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto cache = KvCache::Create((*model)->config(), 16, 16);
  ASSERT_TRUE(cache.ok());
  const std::vector<std::vector<int>> prompts = {{5, 77, 140, 9, 300, 12, 61}, {200}, {3, 4}};
  const std::vector<std::vector<int>> tables = {{0, 1}, {2}, {3}};
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceChunk ch{prompts[i], 0, tables[i], /*all_logits=*/true};
    ASSERT_TRUE((*model)->Forward({&ch, 1}, &*cache, &alone.emplace_back()).ok());
  }
  std::vector<SequenceChunk> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    batch.push_back({prompts[i], 0, tables[i], /*all_logits=*/true});
  }
  std::vector<float> together;
  ASSERT_TRUE((*model)->Forward(batch, &*cache, &together).ok());
  const size_t vocab = (*model)->config().vocab_size;
  size_t row = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (size_t r = 0; r < alone[i].size(); ++r) {
      EXPECT_NEAR(together[row * vocab + r], alone[i][r], 1e-4f)
          << "sequence " << i << " value " << r;
    }
    row += prompts[i].size();
  }
}

// The CUDA device model and the HF writer have no experts: refused by name.
TEST(MoeTest, CudaBackendAndHfWriterRefuseByName) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(MoeDir("qwen3_moe_f32"), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  ModelRunnerOptions o;
  o.num_blocks = 8;
  auto runner = MakeModelRunner("cuda", model->get(), o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnimplemented) << runner.status();
  EXPECT_NE(runner.status().message().find("mixture of experts"), std::string::npos)
      << runner.status();
  testing::TempDir dir;
  absl::Status s = ConvertGgufToHf(MoeGguf("mixtral", "mixtral_q8_0"), dir.path() + "/out");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("MixtralForCausalLM"), std::string::npos) << s;
}

// The planner's named mixture shapes are valid configs, and `tandem model random` writes a
// mixture that the HF loader reads back, experts and all.
TEST(MoeTest, RandomMixturesWriteAndLoad) {
  for (const char* name : {"Mixtral-8x7B", "Qwen3-30B-A3B"}) {
    auto c = RandomModelConfig(name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->Validate().ok()) << name;
    EXPECT_GT(c->n_experts, 0) << name;
  }
  for (const char* arch : {"MixtralForCausalLM", "Qwen3MoeForCausalLM"}) {
    SCOPED_TRACE(arch);
    auto c = RandomModelConfig("stories260K");
    ASSERT_TRUE(c.ok());
    c->architecture = arch;
    c->qk_norm = std::string(arch) == "Qwen3MoeForCausalLM";
    c->n_experts = 3;
    c->n_experts_used = 2;
    c->expert_hidden_dim = std::string(arch) == "MixtralForCausalLM" ? c->hidden_dim : 64;
    testing::TempDir dir;
    ASSERT_TRUE(WriteRandomModel(*c, DType::kF32, 5, dir.path() + "/m").ok());
    auto backend = MakeCpuBackend();
    auto model = Model::Load(dir.path() + "/m", backend.get());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->config().n_experts, 3);
    EXPECT_EQ((*model)->config().expert_hidden_dim, c->expert_hidden_dim);
    ASSERT_EQ((*model)->weights().layers[4].experts.size(), 3u);
    auto cache = KvCache::Create((*model)->config(), 4, 16);
    ASSERT_TRUE(cache.ok());
    const std::vector<int> ids = {1, 2, 3}, table = {0};
    SequenceChunk ch{ids, 0, table};
    std::vector<float> logits;
    ASSERT_TRUE((*model)->Forward({&ch, 1}, &*cache, &logits).ok());
    EXPECT_EQ(logits.size(), static_cast<size_t>((*model)->config().vocab_size));
  }
}

}  // namespace
}  // namespace tandem
