// SmolLM2-135M-Instruct as a Q4_1 GGUF (scripts/fetch_model.sh --smollm2) against transformers
// reading the same file (tests/fixtures/gguf/smollm2, made by scripts/make_gguf_fixtures.py):
// the tokenizer and chat template built from the metadata, float32 logits and greedy tokens, and
// the native quantized compute against the dequantized float32 model on the same file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "engine/generator.h"
#include "engine/model.h"
#include "formats/gguf.h"
#include "tests/test_util.h"
#include "text/chat_template/chat_template.h"
#include "text/gguf_tokenizer.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

// A fresh cache for one sequence of `tokens`, and its block table.
KvCache CacheFor(const Model& model, size_t tokens, std::vector<int>* table) {
  const int block = 16;
  *table = ContiguousTable(KvCacheSpec::For(model.config(), block, DType::kF32).table_layout(),
                           static_cast<int>(tokens) + 1);
  auto cache = KvCache::Create(model.config(), static_cast<int>(table->size()), block);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

// Logits of every position of `ids` (one sequence, a fresh cache).
std::vector<float> AllLogits(const Model& model, const std::vector<int>& ids) {
  std::vector<int> table;
  KvCache cache = CacheFor(model, ids.size(), &table);
  SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
  std::vector<float> logits;
  absl::Status s = model.Forward({&chunk, 1}, &cache, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

// The same, one token per forward call (as decode runs).
std::vector<float> StepLogits(const Model& model, const std::vector<int>& ids) {
  std::vector<int> table;
  KvCache cache = CacheFor(model, ids.size(), &table);
  std::vector<float> all, logits;
  for (size_t p = 0; p < ids.size(); ++p) {
    SequenceChunk chunk{std::span<const int>(ids).subspan(p, 1), static_cast<int>(p), table, false};
    absl::Status s = model.Forward({&chunk, 1}, &cache, &logits);
    EXPECT_TRUE(s.ok()) << s;
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// One real model file and its fixture (tests/fixtures/gguf/<fixture>/expected.json); the tests
// skip, saying how to fetch it, where the file is missing.
class RealGgufTest : public ::testing::Test {
 protected:
  void Open(const std::string& path, const std::string& fixture, const std::string& fetch_flag) {
    path_ = path;
    if (path_.empty()) GTEST_SKIP() << "the real-model tests are off in this build";
    if (!std::filesystem::exists(path_)) {
      GTEST_SKIP() << path_ << " is missing: run scripts/fetch_model.sh " << fetch_flag;
    }
    expected_ = testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/" + fixture +
                                  "/expected.json");
    ASSERT_TRUE(expected_.is_object()) << fixture;
  }

  // Float32 from the dequantized file against transformers: logits within 1e-4 of the row's
  // largest (both sides dequantize the same blocks exactly and compute in float32: summation
  // order over the layers and the fixture's 6 significant digits are all that differ) and
  // identical greedy tokens.
  void ExpectF32MatchesTransformers(int vocab_size);
  // Native compute of the stored blocks (activations in two int8 parts, integer dot products:
  // the decode path, one token per step) against the same file dequantized to float32,
  // teacher-forced over the passage: top-1 agreement at least 98%, perplexity within 1%; the
  // float32 perplexity equals transformers'. The native prefill (float32 tiles) must give the
  // float32 logits.
  void ExpectNativeAgreesWithF32();

  std::string path_;
  nlohmann::json expected_;
};

class SmolLM2Test : public RealGgufTest {
 protected:
  void SetUp() override { Open(testing::SmolLM2Path(), "smollm2", "--smollm2"); }
};

TEST_F(SmolLM2Test, FileIsTheOneTheFixturesWereMadeFrom) {
  auto file = GgufFile::Read(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(*file->String("general.architecture"), "llama");
  EXPECT_EQ(file->Tensor("blk.0.attn_q.weight")->dtype, DType::kQ4_1);
  EXPECT_EQ(file->Tensor("token_embd.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(expected_["gguf_sha256"],
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
}

TEST_F(SmolLM2Test, TokenizerFollowsTheMetadata) {
  auto tok = LoadTokenizer(path_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int>{2});
  int checked = 0, differ = 0;
  for (const auto& v : expected_["tokenizer"]) {
    const std::string text = v["text"];
    SCOPED_TRACE(v["id"].get<std::string>());
    const std::vector<int> want = v["ids"];
    EXPECT_EQ((*tok)->Encode(text, /*add_special_tokens=*/false), want);
    EXPECT_EQ((*tok)->Decode(want), v["decoded"].get<std::string>());
    // transformers' GGUF converter leaves out the "smollm" digit split (of every Unicode
    // number character, e.g. "²" and "①"), so its ids differ on texts where that matters.
    if (v["transformers_ids"] != v["ids"]) ++differ;
    ++checked;
  }
  EXPECT_GT(checked, 60);
  EXPECT_GE(differ, 1);
}

TEST_F(SmolLM2Test, ChatTemplateRendersAsApplyChatTemplate) {
  auto file = GgufFile::Read(path_);
  ASSERT_TRUE(file.ok());
  auto files = GgufTokenizer(*file);
  ASSERT_TRUE(files.ok()) << files.status();
  auto chat = TokenizerChatTemplate::FromConfig(files->tokenizer_config_json);
  ASSERT_TRUE(chat.ok()) << chat.status();
  for (const auto& c : expected_["chat"]) {
    auto got = chat->Apply(c["messages"], c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, c["rendered"].get<std::string>());
  }
}

void RealGgufTest::ExpectF32MatchesTransformers(int vocab_size) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(path_, backend.get(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  const int vocab = (*model)->config().vocab_size;
  ASSERT_EQ(vocab, vocab_size);
  for (const auto& cs : expected_["cases"]) {
    SCOPED_TRACE(cs["name"].get<std::string>());
    const std::vector<int> ids = cs["input_ids"];
    const std::vector<float> logits = AllLogits(**model, ids);
    ASSERT_EQ(logits.size(), ids.size() * vocab);
    for (const auto& pos : cs["positions"]) {
      const int p = pos["position"];
      const float* row = logits.data() + static_cast<size_t>(p) * vocab;
      const float tol = 1e-4f * pos["max_abs"].get<float>();
      for (const auto& entry : pos["top"]) {
        EXPECT_NEAR(row[entry[0].get<int>()], entry[1].get<float>(), tol) << "position " << p;
      }
      const int start = pos["slice_start"];
      const std::vector<float> slice = pos["slice"];
      for (size_t i = 0; i < slice.size(); ++i) {
        EXPECT_NEAR(row[start + i], slice[i], tol) << "position " << p << " id " << start + i;
      }
    }
    GenerationRequest req;
    req.prompt = ids;
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    const std::vector<int> want = cs["greedy"];
    req.max_tokens = static_cast<int>(want.size());
    Generator gen(model->get(), nullptr, {});
    auto out = gen.Generate({&req, 1});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].tokens, want);
  }
}

void RealGgufTest::ExpectNativeAgreesWithF32() {
  auto backend = MakeCpuBackend();
  auto native = Model::Load(path_, backend.get());
  ASSERT_TRUE(native.ok()) << native.status();
  auto f32 = Model::Load(path_, backend.get(), DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status();
  const std::vector<int> ids = expected_["passage"]["input_ids"];
  ASSERT_GE(ids.size(), 501u);
  const int vocab = (*f32)->config().vocab_size;
  // The native model token by token (the decode path: integer dot products), the float32 one
  // in one prefill.
  const std::vector<float> a = StepLogits(**native, ids);
  const std::vector<float> b = AllLogits(**f32, ids);
  auto nll = [&](const float* row, int target) {
    double mx = row[0];
    for (int v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    return mx + std::log(sum) - row[target];
  };
  int agree = 0;
  double nll_a = 0, nll_b = 0;
  const int positions = static_cast<int>(ids.size()) - 1;
  for (int p = 0; p < positions; ++p) {
    const float* ra = a.data() + static_cast<size_t>(p) * vocab;
    const float* rb = b.data() + static_cast<size_t>(p) * vocab;
    agree += std::max_element(ra, ra + vocab) - ra == std::max_element(rb, rb + vocab) - rb;
    nll_a += nll(ra, ids[p + 1]);
    nll_b += nll(rb, ids[p + 1]);
  }
  const double agreement = static_cast<double>(agree) / positions;
  const double ppl_native = std::exp(nll_a / positions), ppl_f32 = std::exp(nll_b / positions);
  std::printf(
      "%s: native vs f32 over %d positions: top-1 agreement %.2f%%, ppl %.4f vs %.4f (%+.3f%%)\n",
      path_.c_str(), positions, 100 * agreement, ppl_native, ppl_f32,
      100 * (ppl_native / ppl_f32 - 1));
  EXPECT_GE(agreement, 0.98);
  EXPECT_LE(std::abs(ppl_native / ppl_f32 - 1), 0.01);
  EXPECT_NEAR(nll_b / positions, expected_["passage"]["nll_mean"].get<double>(), 1e-4);

  // The native model in one prefill (the batched paths: int8 panels with AVX-512, float32 GEMM on
  // dequantized tiles with AVX2) and token by token (the decode path) both stay near float32:
  // within 1e-4 x max|logit| in RMS over every logit, and 1e-2 x max|logit| at worst. The paths
  // round differently, and a few positions of a long passage amplify any rounding: Gemma's worst
  // position measured 0.03 to 0.15 (of 37) across paths whose RMS are all 0.001-0.002.
  const std::vector<float> prefill = AllLogits(**native, ids);
  ASSERT_EQ(prefill.size(), b.size());
  float max_abs = 0, prefill_max = 0, decode_max = 0;
  double prefill_sq = 0, decode_sq = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(b[i]));
    prefill_max = std::max(prefill_max, std::abs(prefill[i] - b[i]));
    decode_max = std::max(decode_max, std::abs(a[i] - b[i]));
    prefill_sq += double(prefill[i] - b[i]) * (prefill[i] - b[i]);
    decode_sq += double(a[i] - b[i]) * (a[i] - b[i]);
  }
  const double prefill_rms = std::sqrt(prefill_sq / b.size());
  const double decode_rms = std::sqrt(decode_sq / b.size());
  std::printf("%s: prefill against f32: RMS %.3g, max %.3g; decode: RMS %.3g, max %.3g\n",
              path_.c_str(), prefill_rms, prefill_max, decode_rms, decode_max);
  for (const auto& [rms, worst] :
       {std::pair{prefill_rms, prefill_max}, std::pair{decode_rms, decode_max}}) {
    EXPECT_LE(rms, 1e-4 * max_abs);
    EXPECT_LE(worst, 1e-2f * max_abs);
  }
}

// SmolLM2: Q4_1 matrices and a Q8_0 embedding, 30 layers, a 561-token passage.
TEST_F(SmolLM2Test, F32LogitsAndGreedyMatchTransformers) { ExpectF32MatchesTransformers(49152); }
TEST_F(SmolLM2Test, NativeQuantizedAgreesWithDequantizedF32) { ExpectNativeAgreesWithF32(); }

class Gemma270MTest : public RealGgufTest {
 protected:
  void SetUp() override { Open(testing::Gemma270MPath(), "gemma3_270m", "--gemma3"); }
};

TEST_F(Gemma270MTest, FileIsTheOneTheFixturesWereMadeFrom) {
  auto file = GgufFile::Read(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file->String("general.architecture"), "gemma3");
  EXPECT_EQ(file->Tensor("blk.0.attn_q.weight")->dtype, DType::kQ5_0);
  EXPECT_EQ(file->Tensor("blk.0.attn_output.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ(file->Tensor("blk.0.ffn_down.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ(file->Tensor("token_embd.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(expected_["gguf_sha256"],
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818");
}

// What the file states and what a gemma3 file leaves to the reader (as llama.cpp fills it in).
TEST_F(Gemma270MTest, ConfigFollowsTheFile) {
  auto file = GgufFile::Read(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  auto c = GgufModelConfig(*file);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(c->n_layers, 18);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->n_kv_heads, 1);
  EXPECT_EQ(c->sliding_window, 512);
  ASSERT_EQ(c->sliding_layers.size(), 18u);
  for (int l = 0; l < 18; ++l) EXPECT_EQ(c->LayerIsLocal(l), (l + 1) % 6 != 0) << l;
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_local_theta, 1e4f);
  EXPECT_EQ(c->AttentionScale(), 1.0f / 16.0f);
  EXPECT_EQ(c->embedding_scale, std::sqrt(640.0f));
  EXPECT_EQ(c->hidden_act, Activation::kGeluTanh);
  EXPECT_TRUE(c->sandwich_norms && c->qk_norm && c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 106}));  // <eos>, <end_of_turn>
}

// The 262k-piece sentencepiece vocabulary from the metadata gives llama.cpp's ids (merges by the
// pieces' scores, as the file says) and transformers' decodes. transformers' GGUF tokenizer
// rebuilds BPE merges from the vocabulary instead; where it differs the file is followed.
TEST_F(Gemma270MTest, TokenizerFollowsTheFileAsLlamaCpp) {
  auto tok = LoadTokenizer(path_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 262144);
  int checked = 0, transformers_differ = 0;
  for (const auto& v : expected_["tokenizer"]) {
    const std::string text = v["text"];
    SCOPED_TRACE(v["id"].dump());
    const std::vector<int> want = v["ids"];
    EXPECT_EQ((*tok)->Encode(text, /*add_special_tokens=*/false), want);
    EXPECT_EQ((*tok)->Decode(want), v["decoded"].get<std::string>());
    transformers_differ += v["transformers_ids"] != v["ids"];
    ++checked;
  }
  std::printf("gemma3 tokenizer: %d texts, transformers' rebuilt merges differ on %d\n", checked,
              transformers_differ);
  EXPECT_GT(checked, 60);
  // A prompt starts with <bos>, as the file says (add_bos_token).
  const std::vector<int> plain = expected_["cases"][0]["input_ids"];
  EXPECT_EQ((*tok)->Encode("The capital of France is", /*add_special_tokens=*/true), plain);
}

// Gemma 3 270M: Q5_0/Q8_0/Q4_K/Q6_K tensors; a plain prompt, a turn-marked prompt and the
// passage past the 512-position window of the sliding layers (positions 511..513 checked too).
TEST_F(Gemma270MTest, F32LogitsAndGreedyMatchTransformers) { ExpectF32MatchesTransformers(262144); }
TEST_F(Gemma270MTest, NativeQuantizedAgreesWithDequantizedF32) { ExpectNativeAgreesWithF32(); }

}  // namespace
}  // namespace tandem
