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

// The fixtures' GGUF: $TANDEM_SMOLLM2_GGUF, else where scripts/test.sh found it at configure
// time, else fetch_model.sh's default cache. "OFF" at configure time (the sanitizer build of
// scripts/fuzz.sh, where a 135M model would run for minutes) skips these tests.
std::string SmolLM2Path() {
  if (const char* env = std::getenv("TANDEM_SMOLLM2_GGUF"); env != nullptr && *env) return env;
  std::string configured = TANDEM_SMOLLM2_GGUF;
  if (configured == "OFF") return "";
  if (!configured.empty()) return configured;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/tandem/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class SmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    expected_ = new nlohmann::json(
        testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/smollm2/expected.json"));
  }
  static void TearDownTestSuite() {
    delete expected_;
    expected_ = nullptr;
  }
  void SetUp() override {
    path_ = SmolLM2Path();
    if (path_.empty()) GTEST_SKIP() << "the SmolLM2 tests are off in this build";
    if (!std::filesystem::exists(path_)) {
      GTEST_SKIP() << path_ << " is missing: run scripts/fetch_model.sh --smollm2";
    }
  }

  // A fresh cache for one sequence of `tokens`, and its block table.
  static KvCache CacheFor(const Model& model, size_t tokens, std::vector<int>* table) {
    const int block = 16, blocks = static_cast<int>(tokens) / block + 1;
    auto cache = KvCache::Create(model.config(), blocks, block);
    EXPECT_TRUE(cache.ok()) << cache.status();
    table->resize(blocks);
    for (int i = 0; i < blocks; ++i) (*table)[i] = i;
    return *std::move(cache);
  }

  // Logits of every position of `ids` (one sequence, a fresh cache).
  static std::vector<float> AllLogits(const Model& model, const std::vector<int>& ids) {
    std::vector<int> table;
    KvCache cache = CacheFor(model, ids.size(), &table);
    SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
    std::vector<float> logits;
    absl::Status s = model.Forward({&chunk, 1}, &cache, &logits);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }

  // The same, one token per forward call (as decode runs).
  static std::vector<float> StepLogits(const Model& model, const std::vector<int>& ids) {
    std::vector<int> table;
    KvCache cache = CacheFor(model, ids.size(), &table);
    std::vector<float> all, logits;
    for (size_t p = 0; p < ids.size(); ++p) {
      SequenceChunk chunk{std::span<const int>(ids).subspan(p, 1), static_cast<int>(p), table,
                          false};
      absl::Status s = model.Forward({&chunk, 1}, &cache, &logits);
      EXPECT_TRUE(s.ok()) << s;
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  std::string path_;
  static nlohmann::json* expected_;
};

nlohmann::json* SmolLM2Test::expected_ = nullptr;

TEST_F(SmolLM2Test, FileIsTheOneTheFixturesWereMadeFrom) {
  auto file = GgufFile::Read(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(*file->String("general.architecture"), "llama");
  EXPECT_EQ(file->Tensor("blk.0.attn_q.weight")->dtype, DType::kQ4_1);
  EXPECT_EQ(file->Tensor("token_embd.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ((*expected_)["gguf_sha256"],
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
}

TEST_F(SmolLM2Test, TokenizerFollowsTheMetadata) {
  auto tok = LoadTokenizer(path_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int>{2});
  int checked = 0, differ = 0;
  for (const auto& v : (*expected_)["tokenizer"]) {
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
  for (const auto& c : (*expected_)["chat"]) {
    auto got = chat->Apply(c["messages"], c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, c["rendered"].get<std::string>());
  }
}

// Float32 from the dequantized file against transformers: logits within 1e-4 of the row's
// largest (both sides dequantize the same blocks exactly and compute in float32: summation
// order over 30 layers and the fixture's 6 significant digits are all that differ) and identical
// greedy tokens.
TEST_F(SmolLM2Test, F32LogitsAndGreedyMatchTransformers) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(path_, backend.get(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  const int vocab = (*model)->config().vocab_size;
  ASSERT_EQ(vocab, 49152);
  for (const auto& cs : (*expected_)["cases"]) {
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

// Native Q4_1/Q8_0 compute (activations in two int8 parts, integer dot products: the decode
// path, one token per step) against the same file dequantized to float32, teacher-forced over a
// 561-token passage: top-1 agreement at least 98%, perplexity within 1%; the float32 perplexity
// equals transformers'. The native prefill (float32 tiles) must give the float32 logits.
TEST_F(SmolLM2Test, NativeQuantizedAgreesWithDequantizedF32) {
  auto backend = MakeCpuBackend();
  auto native = Model::Load(path_, backend.get());
  ASSERT_TRUE(native.ok()) << native.status();
  auto f32 = Model::Load(path_, backend.get(), DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status();
  const std::vector<int> ids = (*expected_)["passage"]["input_ids"];
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
      "native vs f32 over %d positions: top-1 agreement %.2f%%, ppl %.4f vs %.4f (%+.3f%%)\n",
      positions, 100 * agreement, ppl_native, ppl_f32, 100 * (ppl_native / ppl_f32 - 1));
  EXPECT_GE(agreement, 0.98);
  EXPECT_LE(std::abs(ppl_native / ppl_f32 - 1), 0.01);
  EXPECT_NEAR(nll_b / positions, (*expected_)["passage"]["nll_mean"].get<double>(), 1e-4);

  const std::vector<float> prefill = AllLogits(**native, ids);
  ASSERT_EQ(prefill.size(), b.size());
  float max_abs = 0, max_err = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(b[i]));
    max_err = std::max(max_err, std::abs(prefill[i] - b[i]));
  }
  EXPECT_LE(max_err, 1e-4f * max_abs);
}

}  // namespace
}  // namespace tandem
