// Batching must not change results: batched decode of different prompts equals each run alone;
// chunked prefill equals one-shot prefill; block sizes 1, 16 and 64 give the same tokens; a
// cache so small that sequences are preempted and recomputed still gives the same tokens.
#include <gtest/gtest.h>

#include "engine/generator.h"
#include "engine/model.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

class BatchingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    auto model = Model::Load(testing::Stories260K(), backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = Llama2cTokenizer::Load(testing::Tok512(), 512);
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(*tok);
    const char* prompts[] = {"Once upon a time", "The cat", "One day, Lily met a",
                             "Tom and his dog went to the big park to play with a ball", ""};
    for (int i = 0; i < 5; ++i) {
      GenerationRequest r;
      r.prompt = tok_->Encode(prompts[i], true);
      r.max_tokens = 40 + 7 * i;
      // Mix greedy and seeded sampling: counter-based draws make both batch-independent.
      if (i % 2 == 1) {
        r.sampling = {0.9f, 40, 0.95f, static_cast<uint64_t>(1000 + i)};
      } else {
        r.sampling.temperature = 0;
      }
      requests_.push_back(r);
    }
  }

  std::vector<GenerationOutput> Run(std::span<const GenerationRequest> reqs, GeneratorOptions o) {
    Generator gen(model_.get(), tok_.get(), o);
    auto out = gen.Generate(reqs);
    EXPECT_TRUE(out.ok()) << out.status();
    last_stats_ = gen.stats();
    return out.ok() ? *out : std::vector<GenerationOutput>{};
  }

  std::vector<std::vector<int>> Alone(GeneratorOptions o = {}) {
    std::vector<std::vector<int>> out;
    for (const auto& r : requests_) out.push_back(Run({&r, 1}, o)[0].tokens);
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Llama2cTokenizer> tok_;
  std::vector<GenerationRequest> requests_;
  GenerationStats last_stats_;
};

TEST_F(BatchingTest, BatchedDecodeEqualsAlone) {
  const auto alone = Alone();
  const auto batched = Run(requests_, {});
  ASSERT_EQ(batched.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(batched[i].tokens, alone[i]) << i;
  EXPECT_LT(last_stats_.steps, 5 * 40) << "requests were not batched";
}

TEST_F(BatchingTest, ChunkedPrefillEqualsOneShot) {
  const auto alone = Alone();
  for (int chunk : {1, 3, 8}) {
    GeneratorOptions o;
    o.prefill_chunk = chunk;
    const auto chunked = Run(requests_, o);
    for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(chunked[i].tokens, alone[i]) << chunk;
  }
}

TEST_F(BatchingTest, BlockSizeDoesNotChangeTokens) {
  const auto reference = Alone();
  for (int bs : {1, 16, 64}) {
    GeneratorOptions o;
    o.block_size = bs;
    const auto out = Run(requests_, o);
    for (size_t i = 0; i < reference.size(); ++i) EXPECT_EQ(out[i].tokens, reference[i]) << bs;
  }
}

TEST_F(BatchingTest, PreemptionRecomputesIdentically) {
  const auto reference = Alone();
  GeneratorOptions o;
  o.block_size = 4;
  o.num_blocks = 30;  // ~120 tokens for five sequences of up to ~80: some must wait or yield
  const auto out = Run(requests_, o);
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_EQ(out[i].tokens, reference[i]) << i;
  EXPECT_GT(last_stats_.preemptions, 0);
}

// Asking for logprobs never changes the tokens; they are the model's distribution, the numbers
// ScoreTokens gives for the same sequence (whatever the temperature).
TEST_F(BatchingTest, LogprobsMatchScoreTokens) {
  const auto reference = Alone();
  std::vector<GenerationRequest> reqs = requests_;
  for (auto& r : reqs) {
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 4;
  }
  const auto out = Run(reqs, {});
  ASSERT_EQ(out.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(out[i].tokens, reference[i]) << i;
    ASSERT_EQ(out[i].logprobs.size(), out[i].tokens.size()) << i;
    std::vector<int> seq = reqs[i].prompt;
    seq.insert(seq.end(), out[i].tokens.begin(), out[i].tokens.end());
    auto score = ScoreTokens(*model_, seq);
    ASSERT_TRUE(score.ok()) << score.status();
    for (size_t t = 0; t < out[i].tokens.size(); ++t) {
      const TokenLogprobs& lp = out[i].logprobs[t];
      // Batched decode steps and one full-sequence prefill round differently in float.
      EXPECT_NEAR(lp.logprob, (*score)[reqs[i].prompt.size() - 1 + t], 1e-3) << i << " " << t;
      ASSERT_EQ(lp.top.size(), 4u);
      if (reqs[i].sampling.temperature == 0) EXPECT_EQ(lp.top[0].first, out[i].tokens[t]);
    }
  }
}

TEST_F(BatchingTest, StopConditions) {
  GenerationRequest r;
  r.prompt = tok_->Encode("Once upon a time", true);
  r.sampling.temperature = 0;
  r.max_tokens = 100;
  r.stop_strings = {"Lily"};
  const auto out = Run({&r, 1}, {});
  EXPECT_EQ(out[0].finish, FinishReason::kStop);
  EXPECT_EQ(out[0].text, ", there was a little girl named ");  // stop string not emitted

  r.stop_strings.clear();
  r.max_tokens = 7;
  EXPECT_EQ(Run({&r, 1}, {})[0].finish, FinishReason::kLength);
  EXPECT_EQ(Run({&r, 1}, {})[0].tokens.size(), 7u);

  // The context limit (512 for stories260K).
  r.max_tokens = 10000;
  r.ignore_eos = true;
  const auto ctx = Run({&r, 1}, {});
  EXPECT_EQ(ctx[0].finish, FinishReason::kContext);
  EXPECT_EQ(r.prompt.size() + ctx[0].tokens.size(), 512u);
}

TEST_F(BatchingTest, EosStopsLikeRunC) {
  // Sampling at high temperature eventually produces BOS (id 1), where run.c stops.
  GenerationRequest r;
  r.prompt = tok_->Encode("The end", true);
  r.sampling = {1.0f, 0, 1.0f, 7};
  r.max_tokens = 400;
  const auto out = Run({&r, 1}, {});
  if (out[0].finish == FinishReason::kStop) {
    EXPECT_EQ(out[0].tokens.back(), 1);
  } else {
    EXPECT_EQ(std::count(out[0].tokens.begin(), out[0].tokens.end(), 1), 0);
  }
}

TEST_F(BatchingTest, InvalidRequestsNameTheField) {
  auto expect_invalid = [&](GenerationRequest r, const std::string& field) {
    Generator gen(model_.get(), tok_.get(), {});
    auto out = gen.Generate({&r, 1});
    ASSERT_FALSE(out.ok()) << field;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find(field), std::string::npos) << out.status();
  };
  GenerationRequest ok;
  ok.prompt = {1, 403};
  GenerationRequest r = ok;
  r.prompt.clear();
  expect_invalid(r, "prompt");
  r = ok;
  r.prompt = {1, 512};
  expect_invalid(r, "prompt");
  r = ok;
  r.prompt.assign(512, 5);
  expect_invalid(r, "prompt");
  r = ok;
  r.max_tokens = 0;
  expect_invalid(r, "max_tokens");
  r = ok;
  r.sampling.temperature = -1;
  expect_invalid(r, "temperature");
  r = ok;
  r.sampling.temperature = NAN;
  expect_invalid(r, "temperature");
  r = ok;
  r.sampling.temperature = INFINITY;
  expect_invalid(r, "temperature");
  r = ok;
  r.sampling.top_p = 0;
  expect_invalid(r, "top_p");
  r = ok;
  r.sampling.top_p = 1.5f;
  expect_invalid(r, "top_p");
  r = ok;
  r.sampling.top_k = -1;
  expect_invalid(r, "top_k");
}

TEST_F(BatchingTest, ForwardRejectsBadChunks) {
  auto cache = KvCache::Create(model_->config(), 4, 16);
  ASSERT_TRUE(cache.ok());
  std::vector<int> table = {0, 1, 2, 3};
  std::vector<int> tokens = {1, 9999};
  std::vector<float> logits;
  SequenceChunk bad_token{tokens, 0, table, false};
  EXPECT_FALSE(model_->Forward({&bad_token, 1}, &*cache, &logits).ok());
  tokens = {1, 2};
  SequenceChunk no_blocks{tokens, 60, table, false};  // needs 4 blocks for position 61: ok
  EXPECT_TRUE(model_->Forward({&no_blocks, 1}, &*cache, &logits).ok());
  SequenceChunk past_blocks{tokens, 63, table, false};  // position 64 needs a 5th block
  EXPECT_FALSE(model_->Forward({&past_blocks, 1}, &*cache, &logits).ok());
  std::vector<int> bad_table = {0, 7};
  SequenceChunk bad_block{tokens, 16, bad_table, false};
  EXPECT_FALSE(model_->Forward({&bad_block, 1}, &*cache, &logits).ok());
}

}  // namespace
}  // namespace tandem
