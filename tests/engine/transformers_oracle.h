// The oracle tests' comparison with transformers: a model's logits at every position of the
// fixtures' cases and its greedy continuation against the ones transformers computed
// (make_hf_fixtures.py's expected.json schema: "cases" [{"input_ids", "logits"}],
// "greedy_prompt", "greedy_tokens").
#ifndef TANDEM_TESTS_ENGINE_TRANSFORMERS_ORACLE_H_
#define TANDEM_TESTS_ENGINE_TRANSFORMERS_ORACLE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/model.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace tandem::testing {

// The logits of every position of each case's input_ids (make_hf_fixtures.py's schema), as
// [positions * vocab_size] per case.
inline std::vector<std::vector<float>> CaseLogits(const Model& model,
                                                  const nlohmann::json& expected) {
  std::vector<std::vector<float>> out;
  // Room for 128 positions, in the cache's layer groups.
  const std::vector<int> table =
      ContiguousTable(KvCacheSpec::For(model.config(), 16, DType::kF32).table_layout(), 128);
  auto cache = KvCache::Create(model.config(), static_cast<int>(table.size()), 16);
  EXPECT_TRUE(cache.ok());
  if (!cache.ok()) return out;
  for (const auto& cs : expected["cases"]) {
    const std::vector<int> ids = cs["input_ids"];
    SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
    absl::Status s = model.Forward({&chunk, 1}, &*cache, &out.emplace_back());
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

// The largest |logit - transformers' logit| of each position, over the row's largest |logit|.
inline std::vector<float> RelativeErrors(const std::vector<float>& logits,
                                         const nlohmann::json& want, int vocab) {
  std::vector<float> errors;
  if (logits.size() != want.size() * vocab) {
    ADD_FAILURE() << logits.size() << " logits for " << want.size() << " rows of " << vocab;
    return errors;
  }
  for (size_t p = 0; p < want.size(); ++p) {
    const std::vector<float> row = want[p];
    float max_abs = 0, max_err = 0;
    for (int v = 0; v < vocab; ++v) {
      max_abs = std::max(max_abs, std::abs(row[v]));
      max_err = std::max(max_err, std::abs(logits[p * vocab + v] - row[v]));
    }
    errors.push_back(max_err / std::max(1.0f, max_abs));
  }
  return errors;
}

// `model`'s greedy continuation of expected["greedy_prompt"] against
// model.generate(do_sample=False) with EOS disabled (expected["greedy_tokens"]).
inline void ExpectTransformersGreedy(const Model& model, const nlohmann::json& expected,
                                     const std::string& what) {
  GenerationRequest req;
  req.prompt = expected["greedy_prompt"].get<std::vector<int>>();
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  const std::vector<int> want = expected["greedy_tokens"];
  req.max_tokens = static_cast<int>(want.size());
  Generator gen(&model, nullptr, {});
  auto out = gen.Generate({&req, 1});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].tokens, want) << what;
}

// `model` against transformers' logits and greedy tokens in `expected` (`what` names them).
inline void ExpectTransformersLogits(const Model& model, const nlohmann::json& expected,
                                     const std::string& what) {
  ASSERT_TRUE(expected.is_object()) << what;
  const int vocab = model.config().vocab_size;
  const auto logits = CaseLogits(model, expected);
  ASSERT_EQ(logits.size(), expected["cases"].size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const auto& cs = expected["cases"][i];
    const std::vector<float> errors = RelativeErrors(logits[i], cs["logits"], vocab);
    for (size_t p = 0; p < errors.size(); ++p) {
      // Both sides compute in float32 from the same (upcast) weights; they differ only in
      // summation order (~1e-6 relative per op, compounding over 2 layers) and in the fixtures'
      // rounding to 6 significant digits (5e-6 relative). 1e-4 of the row's largest logit is
      // two orders above that and two below the smallest real bug (a wrong rotation or a
      // missing bias moves logits by 3..20).
      EXPECT_LE(errors[p], 1e-4f) << what << " sequence of " << cs["input_ids"].size()
                                  << " position " << p;
    }
  }
  ExpectTransformersGreedy(model, expected, what);
}

// The model at `path` against transformers' logits and greedy tokens in `expected_path`.
inline void ExpectTransformersLogits(const std::string& path, const std::string& expected_path,
                                     std::optional<DType> dtype = std::nullopt) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(path, backend.get(), dtype);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectTransformersLogits(**model, testing::LoadJson(expected_path), path);
}

// A model whose weights are quantized as stored against transformers' logits of the same weights
// dequantized: every position within `tolerance` of the row's largest logit, and the same greedy
// tokens. Prints the worst relative error (`what` names the model).
inline void ExpectNearTransformers(const Model& model, const nlohmann::json& expected,
                                   float tolerance, const std::string& what) {
  const auto logits = CaseLogits(model, expected);
  ASSERT_EQ(logits.size(), expected["cases"].size());
  float worst = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    for (float e :
         RelativeErrors(logits[i], expected["cases"][i]["logits"], model.config().vocab_size)) {
      worst = std::max(worst, e);
    }
  }
  std::printf("%s against transformers' dequantized logits: %.2e\n", what.c_str(), worst);
  EXPECT_LE(worst, tolerance) << what;
  ExpectTransformersGreedy(model, expected, what);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_ENGINE_TRANSFORMERS_ORACLE_H_
