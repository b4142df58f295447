// The KV cache in bf16, f16 and fp8 against float32, on stories260K (the llama2.c reference
// sequences) and on a transformers fixture: the largest logit difference over every position,
// relative to the largest logit, and the perplexity of a fixed text. f32 stays the default and
// bit-identical (every other engine test runs it). The bounds, and why:
//   bf16 (8 significant bits) and f16 (11): logits within 3% of their range, perplexity 0.5%;
//   fp8 E4M3 (4 significant bits, a scale per sequence, layer and KV head): logits within 25%
//   (stories260K's heads have 8 dimensions: little averaging of the rounding), perplexity 2%.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine/generator.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "tests/test_util.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

struct Bound {
  DType dtype;
  double logit;  // max |logit - f32 logit| / max |f32 logit|
  double perplexity;
};
const Bound kBounds[] = {
    {DType::kBF16, 0.03, 0.005}, {DType::kF16, 0.03, 0.005}, {DType::kFp8E4M3, 0.25, 0.02}};

// All-position logits of `ids` in one forward pass over a cache of `dtype`.
std::vector<float> Logits(const Model& model, const std::vector<int>& ids, DType dtype) {
  const int bs = 16, nb = static_cast<int>(ids.size() + bs - 1) / bs;
  auto cache = KvCache::Create(model.config(), nb, bs, 0, dtype);
  EXPECT_TRUE(cache.ok()) << cache.status();
  std::vector<int> table(nb);
  for (int i = 0; i < nb; ++i) table[i] = i;
  SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
  std::vector<float> logits;
  const absl::Status s = model.Forward({&chunk, 1}, &*cache, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

double Perplexity(const Model& model, const std::vector<int>& ids, DType dtype) {
  auto lp = ScoreTokens(model, ids, dtype);
  EXPECT_TRUE(lp.ok()) << lp.status();
  double nll = 0;
  for (float x : *lp) nll -= x;
  return std::exp(nll / static_cast<double>(lp->size()));
}

// `sequences`: the logits of every position; `text`: the perplexity.
void CheckModel(const Model& model, const std::vector<std::vector<int>>& sequences,
                const std::vector<int>& text, const std::string& name) {
  const double p32 = Perplexity(model, text, DType::kF32);
  for (const Bound& b : kBounds) {
    double worst = 0;
    for (const auto& ids : sequences) {
      const std::vector<float> want = Logits(model, ids, DType::kF32);
      const std::vector<float> got = Logits(model, ids, b.dtype);
      ASSERT_EQ(got.size(), want.size());
      float max_abs = 0, max_err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(want[i]));
        max_err = std::max(max_err, std::fabs(got[i] - want[i]));
      }
      worst = std::max(worst, static_cast<double>(max_err / max_abs));
    }
    const double ppl_worst = std::fabs(Perplexity(model, text, b.dtype) / p32 - 1);
    std::printf("%s kv %s: max |logit error| %.4f of the largest logit, perplexity within %.3f%%\n",
                name.c_str(), std::string(DTypeName(b.dtype)).c_str(), worst, 100 * ppl_worst);
    EXPECT_LT(worst, b.logit) << name << " " << DTypeName(b.dtype);
    EXPECT_LT(ppl_worst, b.perplexity) << name << " " << DTypeName(b.dtype);
    EXPECT_GT(worst, 0.0) << name << " " << DTypeName(b.dtype) << ": nothing was quantized";
  }
}

TEST(KvDtypeTest, Stories260KReferenceSequences) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Stories260K(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  const auto ref = testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
  std::vector<std::vector<int>> sequences;
  for (const auto& c : ref["greedy"]) {
    // The prompt and every token llama2.c generated after it.
    const std::vector<int> prompt = c["prompt_ids"];
    const std::vector<int> after = c["ids_after_each_position"];
    std::vector<int> ids = {prompt[0]};
    ids.insert(ids.end(), after.begin(), after.end());
    sequences.push_back(ids);
  }
  // The fixed text: the story llama2.c wrote from the first reference prompt, as tandem score
  // reads it.
  auto tok = LoadTokenizer(testing::Tok512(), 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int> text = (*tok)->Encode(ref["greedy"][0]["stdout"].get<std::string>(), true);
  CheckModel(**model, sequences, text, "stories260K");
}

TEST(KvDtypeTest, TransformersFixture) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/hf/llama3_f32";
  const auto expected = testing::LoadJson(dir + "/expected.json");
  auto backend = MakeCpuBackend();
  auto model = Model::Load(dir, backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::vector<int>> sequences;
  std::vector<int> text;  // every case's ids, one after another
  for (const auto& c : expected["cases"]) {
    sequences.push_back(c["input_ids"]);
    text.insert(text.end(), sequences.back().begin(), sequences.back().end());
  }
  CheckModel(**model, sequences, text, "llama3_f32 fixture");
}

}  // namespace
}  // namespace tandem
