// The Hugging Face path against transformers itself: tiny random-weight checkpoints saved by
// save_pretrained with transformers' float32 logits beside them (tests/fixtures/hf, made by
// scripts/make_hf_fixtures.py), and Qwen3 as an HF directory and as GGUF files with its tokenizer
// and chat template (tests/fixtures/hf/qwen3_f32 and gguf/qwen3, scripts/make_qwen3_fixtures.py),
// and Gemma 3 as an HF directory and a GGUF file (tests/fixtures/hf/gemma3_f32 and
// gguf/gemma3_tiny, scripts/make_gemma3_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generator.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "tests/engine/transformers_oracle.h"
#include "tests/test_util.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

using testing::CaseLogits;
using testing::ExpectNearTransformers;
using testing::ExpectTransformersGreedy;
using testing::ExpectTransformersLogits;

class HfTransformersTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTransformersTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/hf/" + GetParam();
  ExpectTransformersLogits(dir, dir + "/expected.json");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTransformersTest,
                         ::testing::Values("llama3_f32", "llama_tied_bf16", "qwen2_f32",
                                           "mistral_f16", "llama_sharded_f32", "qwen3_f32",
                                           "gemma3_f32"));

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

// Qwen2's sliding window as transformers applies it: off unless use_sliding_window is true, and
// then on the layers from max_window_layers on; all of them or none is computed, a split refused.
TEST(HfConfigTest, Qwen2SlidingWindowFollowsTransformers) {
  const std::string base = testing::SourceDir() + "/tests/fixtures/hf/qwen2_f32/config.json";
  nlohmann::json config = nlohmann::json::parse(*ReadFileToString(base));
  config.erase("use_sliding_window");
  config["sliding_window"] = 32;
  config["max_position_embeddings"] = 256;
  const int layers = config["num_hidden_layers"];
  auto off = ModelConfig::FromHfJson(config.dump());
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->sliding_window, 0) << "a window without use_sliding_window";
  config["use_sliding_window"] = true;
  config["max_window_layers"] = 0;
  auto all = ModelConfig::FromHfJson(config.dump());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->sliding_window, 32);
  config["max_window_layers"] = layers;
  auto none = ModelConfig::FromHfJson(config.dump());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->sliding_window, 0);
  config.erase("max_window_layers");  // transformers' default, 28
  auto by_default = ModelConfig::FromHfJson(config.dump());
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ(by_default->sliding_window, 0);
  ASSERT_GE(layers, 2);
  config["max_window_layers"] = 1;
  auto split = ModelConfig::FromHfJson(config.dump());
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("max_window_layers"), std::string::npos)
      << split.status();
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

// Qwen3: per-head q/k RMSNorm before RoPE, no q/k/v bias, head_dim 16 where hidden_size /
// num_attention_heads is 8.
TEST(Qwen3Test, ConfigReadsHeadDimAndQkNorms) {
  auto c = ModelConfig::FromHfJson(*ReadFileToString(testing::Qwen3Dir() + "/config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->q_dim(), 64);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{296});  // <|im_end|>
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Qwen3Dir(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  for (const LayerWeights& l : (*model)->weights().layers) {
    EXPECT_NE(l.q_norm, nullptr);
    EXPECT_NE(l.k_norm, nullptr);
    EXPECT_EQ(l.bq, nullptr);
  }
}

std::string Qwen3ConfigWith(const std::string& extra) {
  return R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 128)" +
         extra + "}";
}

TEST(Qwen3Test, FieldsThatChangeTheMathAreRefusedByName) {
  for (const auto& [field, extra] : std::vector<std::pair<std::string, std::string>>{
           {"use_sliding_window", R"(, "use_sliding_window": true, "sliding_window": 32)"},
           {"layer_types", R"(, "layer_types": ["full_attention", "sliding_attention"])"},
           {"layer_types", R"(, "layer_types": ["sliding_attention", "sliding_attention"])"},
           {"attention_bias", R"(, "attention_bias": true)"},
           {"rope", R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 32768})"},
       }) {
    auto r = ModelConfig::FromHfJson(Qwen3ConfigWith(extra));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  }
  // Qwen3Config's defaults where a key is absent: head_dim 128, untied, no sliding window (a
  // sliding_window value alone does not turn it on).
  auto c = ModelConfig::FromHfJson(Qwen3ConfigWith(R"(, "sliding_window": 32)"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_TRUE(c->qk_norm);
  // An architecture outside the list is refused naming the ones Tandem runs.
  auto gemma = ModelConfig::FromHfJson(R"({"architectures": ["Gemma2ForCausalLM"]})");
  EXPECT_NE(gemma.status().message().find("Qwen3ForCausalLM"), std::string::npos) << gemma.status();
}

// The f32 GGUF holds the HF directory's weights (make_qwen3_fixtures.py checks that transformers
// reading it gives the directory's logits), so it is held to the directory's oracle.
TEST(Qwen3Test, GgufF32MatchesTransformers) {
  ExpectTransformersLogits(testing::Qwen3Gguf("qwen3_f32"), testing::Qwen3Dir() + "/expected.json");
}

// The Q8_0 file dequantized to float32 at load against transformers dequantizing it with gguf-py.
TEST(Qwen3Test, GgufQ8_0DequantizedMatchesTransformers) {
  const auto expected =
      testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/qwen3/expected.json");
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Qwen3Gguf("qwen3_q8_0"), backend.get(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectTransformersLogits(**model, expected["q8_0"], "qwen3_q8_0.gguf as f32");
}

// The Q8_0 matrices as stored (int8 dot products on activations quantized to about 14 bits for
// steps under 8 tokens, dequantized tiles above): the same greedy tokens as transformers'
// dequantized model, and logits within 1e-3 of the row's largest (the activations' rounding,
// ~1e-4 relative per matmul over 2 layers; a wrong block layout moves them by whole units).
TEST(Qwen3Test, GgufQ8_0AsStoredStaysWithTransformers) {
  const auto expected =
      testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/qwen3/expected.json")["q8_0"];
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Qwen3Gguf("qwen3_q8_0"), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weights().layers[0].wq.dtype, DType::kQ8_0);
  ExpectNearTransformers(**model, expected, 1e-3f, "qwen3 Q8_0 as stored");
}

// The tokenizer and chat template found beside each form of the model (tokenizer.json and
// tokenizer_config.json in the directory; the tokenizer.ggml.* metadata and chat template in the
// GGUF files) give transformers' ids, decodes and apply_chat_template renders.
TEST(Qwen3Test, TokenizerAndChatTemplateFromEveryFile) {
  const auto expected = testing::LoadJson(testing::Qwen3Dir() + "/expected.json");
  ASSERT_GE(expected["tokenizer"].size(), 60u);
  ASSERT_GE(expected["chat"].size(), 4u);
  for (const std::string& path :
       {testing::Qwen3Dir(), testing::Qwen3Gguf("qwen3_f32"), testing::Qwen3Gguf("qwen3_q8_0")}) {
    SCOPED_TRACE(path);
    auto tok_path = FindTokenizerFor(path, 320);
    ASSERT_TRUE(tok_path.ok()) << tok_path.status();
    auto tok = LoadTokenizer(*tok_path);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ((*tok)->vocab_size(), 320);
    EXPECT_EQ((*tok)->eos_ids(), std::vector<int>{296});
    for (const auto& v : expected["tokenizer"]) {
      const std::string text = v["text"];
      const std::vector<int> want = v["ids"];
      EXPECT_EQ((*tok)->Encode(text, /*add_special_tokens=*/false), want) << v["id"];
      EXPECT_EQ((*tok)->Decode(want), v["decoded"].get<std::string>()) << v["id"];
    }
    auto chat = LoadChatTemplate(path, *tok_path, "");
    ASSERT_TRUE(chat.ok()) << chat.status();
    for (const auto& c : expected["chat"]) {
      auto got = chat->Apply(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, c["rendered"].get<std::string>());
      EXPECT_EQ((*tok)->Encode(*got, false), c["ids"].get<std::vector<int>>());
    }
  }
}

// `tandem model convert` of the Q8_0 GGUF writes a Qwen3 directory (model_type, head_dim, the
// q/k norms) that gives the GGUF's dequantized logits exactly.
TEST(Qwen3Test, ConvertedGgufIsTheSameModel) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/qwen3";
  ASSERT_TRUE(ConvertGgufToHf(testing::Qwen3Gguf("qwen3_q8_0"), out).ok());
  const auto config = nlohmann::json::parse(*ReadFileToString(out + "/config.json"));
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["head_dim"], 16);
  auto backend = MakeCpuBackend();
  auto converted = Model::Load(out, backend.get());
  ASSERT_TRUE(converted.ok()) << converted.status();
  auto gguf = Model::Load(testing::Qwen3Gguf("qwen3_q8_0"), backend.get(), DType::kF32);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const auto expected = testing::LoadJson(testing::Qwen3Dir() + "/expected.json");
  EXPECT_EQ(CaseLogits(**converted, expected), CaseLogits(**gguf, expected));
}

// The CUDA device model has no per-head q/k norm: a Qwen3 model is refused by name there, before
// any device is looked for, rather than run without its norms.
TEST(Qwen3Test, CudaBackendRefusesItByName) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Qwen3Dir(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  ModelRunnerOptions o;
  o.num_blocks = 8;
  auto runner = MakeModelRunner("cuda", model->get(), o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnimplemented) << runner.status();
  EXPECT_NE(runner.status().message().find("Qwen3ForCausalLM"), std::string::npos)
      << runner.status();
}

// Gemma 3 (tests/fixtures/hf/gemma3_f32): layer_types [sliding, full, sliding] with a window of
// 4, query_pre_attn_scalar 24 where head_dim is 16, linear rope scaling on the full layer only.
TEST(Gemma3Test, ConfigReadsTheGemmaLayout) {
  auto c = ModelConfig::FromHfJson(*ReadFileToString(testing::Gemma3Dir() + "/config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->hidden_act, Activation::kGeluTanh);
  EXPECT_TRUE(c->sandwich_norms && c->qk_norm && c->tie_word_embeddings);
  EXPECT_EQ(c->embedding_scale, static_cast<float>(std::sqrt(32.0)));
  EXPECT_EQ(c->AttentionScale(), 1.0f / std::sqrt(24.0f));
  EXPECT_EQ(c->sliding_window, 4);
  EXPECT_EQ(c->sliding_layers, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(c->LayerWindow(0), 4);
  EXPECT_EQ(c->LayerWindow(1), 0);
  EXPECT_TRUE(c->MixedLayers());
  EXPECT_EQ(c->rope_local_theta, 1e4f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  // The full layers rotate with rope_theta scaled by 8; the sliding ones with the local base
  // unscaled.
  const auto global = c->RopeInvFreq(), local = c->LocalRopeInvFreq();
  EXPECT_FLOAT_EQ(global[1], std::pow(1e6f, -2.0f / 16) / 8);
  EXPECT_FLOAT_EQ(local[1], std::pow(1e4f, -2.0f / 16));
  // The HF norm weights are stored as (multiplier - 1).
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Gemma3Dir(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  for (const LayerWeights& l : (*model)->weights().layers) {
    EXPECT_NE(l.post_attn_norm, nullptr);
    EXPECT_NE(l.post_ffn_norm, nullptr);
    EXPECT_NE(l.q_norm, nullptr);
  }
}

std::string Gemma3ConfigWith(const std::string& extra) {
  return R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
             "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
             "vocab_size": 128, "max_position_embeddings": 1024)" +
         extra + "}";
}

TEST(Gemma3Test, FieldsThatChangeTheMathAreRefusedByName) {
  for (const auto& [field, extra] : std::vector<std::pair<std::string, std::string>>{
           {"hidden_activation", R"(, "hidden_activation": "gelu")"},
           {"use_bidirectional_attention", R"(, "use_bidirectional_attention": true)"},
           {"final_logit_softcapping", R"(, "final_logit_softcapping": 30.0)"},
           {"attn_logit_softcapping", R"(, "attn_logit_softcapping": 50.0)"},
           {"layer_types", R"(, "layer_types": ["full_attention"])"},
           {"layer_types", R"(, "layer_types": ["chunked_attention", "full_attention",
               "full_attention", "full_attention", "full_attention", "full_attention"])"},
           {"sliding_attention", R"(, "rope_parameters": {
               "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
               "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                     "rope_theta": 10000.0}})"},
       }) {
    auto r = ModelConfig::FromHfJson(Gemma3ConfigWith(extra));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  }
  // Gemma3TextConfig's defaults: head_dim 256 without the key, window 4096, every sixth layer
  // global, query_pre_attn_scalar 256, tied embeddings.
  auto c = ModelConfig::FromHfJson(R"({"architectures": ["Gemma3ForCausalLM"],
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 7,
      "num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 8192})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->sliding_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(c->AttentionScale(), 1.0f / 16);
  EXPECT_TRUE(c->tie_word_embeddings);
  // Sliding layers and full ones are Gemma's only: other models still take all or none.
  auto llama = ModelConfig::FromHfJson(
      LlamaConfigWith(R"(, "layer_types": ["sliding_attention", "full_attention"])"));
  EXPECT_EQ(llama.status().code(), absl::StatusCode::kInvalidArgument);
}

// transformers 5 writes one rope_parameters per layer type; the model is the same.
TEST(Gemma3Test, RopeParametersPerLayerTypeAreRead) {
  auto v5 = ModelConfig::FromHfJson(Gemma3ConfigWith(R"(, "rope_parameters": {
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})"));
  ASSERT_TRUE(v5.ok()) << v5.status();
  auto v4 = ModelConfig::FromHfJson(Gemma3ConfigWith(R"(, "rope_theta": 1000000.0,
      "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0})"));
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v5->RopeInvFreq(), v4->RopeInvFreq());
  EXPECT_EQ(v5->LocalRopeInvFreq(), v4->LocalRopeInvFreq());
  EXPECT_EQ(v5->rope_scaling.factor, 8.0f);
}

// The gemma3 GGUF (llama.cpp's names, norms stored with Gemma's 1 added; every sixth layer
// global, as a gemma3 file implies) against transformers' logits for the same weights.
TEST(Gemma3Test, GgufF32MatchesTransformers) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/gguf/gemma3_tiny";
  ExpectTransformersLogits(dir + "/gemma3_tiny_f32.gguf", dir + "/expected.json");
}

TEST(Gemma3Test, CudaBackendAndHfWriterRefuseItByName) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Gemma3Dir(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  ModelRunnerOptions o;
  o.num_blocks = 8;
  auto runner = MakeModelRunner("cuda", model->get(), o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnimplemented) << runner.status();
  EXPECT_NE(runner.status().message().find("Gemma3ForCausalLM"), std::string::npos)
      << runner.status();
  testing::TempDir dir;
  const absl::Status converted = ConvertGgufToHf(
      testing::SourceDir() + "/tests/fixtures/gguf/gemma3_tiny/gemma3_tiny_f32.gguf",
      dir.path() + "/out");
  EXPECT_EQ(converted.code(), absl::StatusCode::kUnimplemented) << converted;
  EXPECT_NE(converted.message().find("Gemma3ForCausalLM"), std::string::npos) << converted;
}

}  // namespace
}  // namespace tandem
