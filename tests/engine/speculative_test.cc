// Speculative decoding in the Generator (prompt lookup, engine/speculative/ngram_proposer.h):
// proposals are kept only where they equal the token the model samples, so the output must be
// the same with and without speculation: greedy and seeded sampling, batched, under
// preemption, with stop strings, penalties and logprobs, on every seed of a sweep (the same
// tokens for every seed means the same distribution). Proposals must be scored and some kept on
// text that repeats itself, and no KV block may be left behind (Generate checks the pool).
#include <gtest/gtest.h>

#include "engine/generator.h"
#include "engine/model.h"
#include "engine/speculative/ngram_proposer.h"
#include "engine/speculative/proposer.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

using V = std::vector<int>;

TEST(NgramProposerTest, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  // ... 1 2 3 [7 8 9] ... 1 2 3 [4 5] ... 1 2 3: the latest occurrence of "1 2 3" wins.
  const V t = {1, 2, 3, 7, 8, 9, 1, 2, 3, 4, 5, 1, 2, 3};
  EXPECT_EQ(ProposeNgram(t, 2), (V{4, 5}));
  EXPECT_EQ(ProposeNgram(t, 5), (V{4, 5, 1, 2, 3}));
  EXPECT_EQ(ProposeNgram(t, 0), V{});
  // Longer suffixes are tried first: "9 1" occurs once, followed by 2.
  const NgramProposerOptions any = {.max_ngram = 4, .min_ngram = 1};
  EXPECT_EQ(ProposeNgram(V{9, 1, 2, 6, 1, 7, 9, 1}, 1, any), V{2});
  // Only the shortest suffix matches; by default suffixes shorter than 3 are not looked up.
  EXPECT_EQ(ProposeNgram(V{5, 6, 8, 6}, 3, any), (V{8, 6}));
  EXPECT_EQ(ProposeNgram(V{5, 6, 8, 6}, 3), V{});
  EXPECT_EQ(ProposeNgram(V{1, 2, 3}, 3), V{});
  EXPECT_EQ(ProposeNgram(V{}, 3), V{});
  EXPECT_EQ(ProposeNgram(V{4}, 3), V{});
  // The suffix's own position never matches itself; an ngram limited to 1 still finds 4 4.
  EXPECT_EQ(ProposeNgram(V{4, 4}, 3, {.max_ngram = 1, .min_ngram = 1}), V{4});
  EXPECT_EQ(ProposeNgram(V{1, 2, 1, 2}, 3, {.max_ngram = 3, .min_ngram = 3}), V{});
}

class SpeculativeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    auto model = Model::Load(testing::Stories260K(), backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = Llama2cTokenizer::Load(testing::Tok512(), 512);
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(*tok);
  }

  GenerationRequest Request(const std::string& prompt, int max_tokens, float temperature,
                            uint64_t seed) {
    GenerationRequest r;
    r.prompt = tok_->Encode(prompt, true);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    return r;
  }

  std::vector<GenerationOutput> Run(std::span<const GenerationRequest> reqs, GeneratorOptions o) {
    Generator gen(model_.get(), tok_.get(), o);
    auto out = gen.Generate(reqs);
    EXPECT_TRUE(out.ok()) << out.status();
    stats_ = gen.stats();
    return out.ok() ? *out : std::vector<GenerationOutput>{};
  }

  // Runs `reqs` without and with speculation (k proposals; by prompt lookup, or by `draft` when
  // given) and expects the same outputs.
  void ExpectSame(std::span<const GenerationRequest> reqs, GeneratorOptions o, int k,
                  const Model* draft = nullptr) {
    const std::vector<GenerationOutput> plain = Run(reqs, o);
    o.speculative.method = draft ? SpeculativeMethod::kDraft : SpeculativeMethod::kNgram;
    o.speculative.num_tokens = k;
    o.speculative.draft = draft;
    const std::vector<GenerationOutput> spec = Run(reqs, o);
    ASSERT_EQ(plain.size(), spec.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].tokens, spec[i].tokens) << "request " << i << " k " << k;
      EXPECT_EQ(plain[i].text, spec[i].text) << "request " << i;
      EXPECT_EQ(plain[i].finish, spec[i].finish) << "request " << i;
      ASSERT_EQ(plain[i].logprobs.size(), spec[i].logprobs.size());
      for (size_t t = 0; t < plain[i].logprobs.size(); ++t) {
        EXPECT_NEAR(plain[i].logprobs[t].logprob, spec[i].logprobs[t].logprob, 1e-4);
      }
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Llama2cTokenizer> tok_;
  GenerationStats stats_;
};

TEST_F(SpeculativeTest, GreedyIsIdenticalAndProposalsAreKept) {
  // stories260K repeats names and phrases: prompt lookup finds them.
  const GenerationRequest r =
      Request("Once upon a time, there was a little girl named Lily.", 200, 0, 0);
  for (int k : {1, 2, 4, 8}) ExpectSame({&r, 1}, {}, k);
  EXPECT_GT(stats_.proposed_tokens, 0);
  EXPECT_GT(stats_.accepted_tokens, 0);
  EXPECT_LT(stats_.steps, 200) << "k=8 should take fewer steps than tokens";
}

TEST_F(SpeculativeTest, SeededSamplingIsIdenticalForEverySeed) {
  int kept = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    GenerationRequest r = Request("One day, Tom and his dog", 60, 0.8f, seed);
    r.sampling.top_p = 0.95f;
    ExpectSame({&r, 1}, {}, 4);
    kept += stats_.accepted_tokens;
  }
  EXPECT_GT(kept, 0);
}

TEST_F(SpeculativeTest, BatchedPreemptedStoppedAndPenalizedAreIdentical) {
  std::vector<GenerationRequest> reqs;
  const char* prompts[] = {"Once upon a time", "The cat", "One day, Lily met a", "Tom said",
                           "Lily and Lily and Lily and"};
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r = Request(prompts[i], 50 + 9 * i, i % 2 ? 1.0f : 0.0f, 100 + i);
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 2;
    if (i == 1) r.stop_strings = {"park"};
    if (i == 3) {
      r.sampling.repetition_penalty = 1.3f;
      r.sampling.presence_penalty = 0.5f;
    }
    reqs.push_back(r);
  }
  ExpectSame(reqs, {}, 4);
  // A cache too small for all five at once: sequences are preempted and recomputed.
  GeneratorOptions small;
  small.block_size = 4;
  small.num_blocks = 40;
  ExpectSame(reqs, small, 6);
  EXPECT_GT(stats_.preemptions, 0);
  // Proposals near the context length and max_tokens are cut, never run past them.
  GenerationRequest near_end = Request("Once upon a time", 400, 0, 0);
  near_end.prompt.resize(model_->config().max_seq_len - 30, near_end.prompt.back());
  ExpectSame({&near_end, 1}, {}, 8);
}

// The draft model is the target itself converted to q8_0 (close to it, not equal: some
// proposals are rejected), and the target itself (every greedy proposal is kept but where
// batched and single-row arithmetic round differently).
TEST_F(SpeculativeTest, DraftModelOutputIsIdentical) {
  auto q8 = Model::Load(testing::Stories260K(), backend_.get(), DType::kQ8_0);
  ASSERT_TRUE(q8.ok()) << q8.status();
  const GenerationRequest greedy = Request("Once upon a time, there was a little girl", 120, 0, 0);
  ExpectSame({&greedy, 1}, {}, 4, q8->get());
  EXPECT_GT(stats_.accepted_tokens, stats_.proposed_tokens / 2);
  EXPECT_LT(stats_.steps, 80);
  ExpectSame({&greedy, 1}, {}, 6, model_.get());
  EXPECT_GE(stats_.accepted_tokens, stats_.proposed_tokens * 9 / 10);
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    GenerationRequest r = Request("One day, Tom and his dog", 60, 0.8f, seed);
    r.sampling.logprobs = true;
    ExpectSame({&r, 1}, {}, 3, q8->get());
  }
}

TEST_F(SpeculativeTest, DraftModelBatchedPreemptedAndShortOfCache) {
  auto q8 = Model::Load(testing::Stories260K(), backend_.get(), DType::kQ8_0);
  ASSERT_TRUE(q8.ok()) << q8.status();
  std::vector<GenerationRequest> reqs;
  const char* prompts[] = {"Once upon a time", "The cat", "One day, Lily met a", "Tom said"};
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = Request(prompts[i], 40 + 13 * i, i % 2 ? 0.9f : 0.0f, 7 + i);
    if (i == 2) r.stop_strings = {"happy"};
    reqs.push_back(r);
  }
  ExpectSame(reqs, {}, 4, q8->get());
  GeneratorOptions small;
  small.block_size = 4;
  small.num_blocks = 24;
  ExpectSame(reqs, small, 5, q8->get());
  EXPECT_GT(stats_.preemptions, 0);
  // A draft cache with room for one sequence at a time: the others propose nothing meanwhile.
  GeneratorOptions tiny_draft;
  tiny_draft.speculative.max_draft_kv_bytes =
      KvCacheSpec::For((*q8)->config(), 16, DType::kF32).bytes_per_block() * 8;
  ExpectSame(reqs, tiny_draft, 4, q8->get());
  EXPECT_GT(stats_.accepted_tokens, 0);
}

// The draft proposer under tight limits (forward calls of at most 8 tokens and 2 sequences:
// prompts caught up over several calls, proposals made in groups) proposes what it does
// unconstrained, and again on the next step after the sequences grew (its KV kept, cut back to
// what the sequence still shares).
TEST_F(SpeculativeTest, DraftProposerUnderStepLimitsProposesTheSame) {
  SpeculativeConfig config;
  config.method = SpeculativeMethod::kDraft;
  config.num_tokens = 4;
  config.draft = model_.get();
  DraftRunnerOptions wide;
  wide.num_blocks = 256;
  DraftRunnerOptions narrow = wide;
  narrow.max_seqs = 2;
  narrow.max_step_tokens = 8;
  auto a = MakeProposer(config, model_->config(), wide);
  auto b = MakeProposer(config, model_->config(), narrow);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  std::vector<std::vector<int>> seqs;
  for (const char* p : {"Once upon a time, there was a little girl named Lily.", "The cat sat",
                        "One day, Tom and his dog went to the park to play.", "Lily said", "Tom"}) {
    seqs.push_back(tok_->Encode(p, true));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<ProposalRequest> reqs;
    for (size_t i = 0; i < seqs.size(); ++i) {
      reqs.push_back({i, seqs[i], static_cast<int>(1 + (i + step) % 4)});
    }
    std::vector<std::vector<int>> pa, pb;
    ASSERT_TRUE((*a)->Propose(reqs, &pa).ok());
    ASSERT_TRUE((*b)->Propose(reqs, &pb).ok());
    EXPECT_EQ(pa, pb) << "step " << step;
    for (size_t i = 0; i < seqs.size(); ++i) {
      ASSERT_FALSE(pa[i].empty());
      EXPECT_LE(pa[i].size(), static_cast<size_t>(reqs[i].max_tokens));
      // The sequence keeps the first proposal and one token of its own.
      seqs[i].push_back(pa[i][0]);
      seqs[i].push_back(7 + static_cast<int>(i));
    }
  }
  EXPECT_FALSE((*a)->Idle());
  for (uint64_t i = 0; i < seqs.size(); ++i) {
    (*a)->Forget(i);
    (*b)->Forget(i);
  }
  EXPECT_TRUE((*a)->Idle());
  EXPECT_TRUE((*b)->Idle());
}

TEST(SpeculativeRuleTest, KeepsProposalsWhileTheyEqualTheDrawnTokens) {
  // The model draws 5 7 9 4 at rows 0..3; proposals 5 7 8: rows 0 and 1 agree, row 2 draws 9.
  const V drawn = {5, 7, 9, 4};
  V emitted;
  auto sample = [&](int row) { return drawn[row]; };
  auto emit = [&](int token) {
    emitted.push_back(token);
    return false;
  };
  EXPECT_EQ(VerifyProposals(V{5, 7, 8}, sample, emit), 2);
  EXPECT_EQ(emitted, (V{5, 7, 9}));
  // All kept: one token more than the proposals.
  emitted.clear();
  EXPECT_EQ(VerifyProposals(V{5, 7, 9}, sample, emit), 3);
  EXPECT_EQ(emitted, (V{5, 7, 9, 4}));
  // None: the first row's token alone, as a plain step.
  emitted.clear();
  EXPECT_EQ(VerifyProposals(V{6}, sample, emit), 0);
  EXPECT_EQ(emitted, V{5});
  // The sequence ends at its second token (EOS, max_tokens): nothing after it is drawn.
  emitted.clear();
  auto emit_two = [&](int token) {
    emitted.push_back(token);
    return emitted.size() == 2;
  };
  EXPECT_EQ(VerifyProposals(V{5, 7, 9}, sample, emit_two), 1);
  EXPECT_EQ(emitted, (V{5, 7}));
}

TEST(SpeculativeRuleTest, ProposalRoomStopsAtMaxTokensAndTheContext) {
  // ProposalRoom(K, max_tokens, generated, length, max_seq_len)
  EXPECT_EQ(ProposalRoom(4, 100, 10, 50, 512), 4);
  EXPECT_EQ(ProposalRoom(4, 100, 97, 50, 512), 2);  // 3 tokens left: 2 proposals + 1
  EXPECT_EQ(ProposalRoom(4, 100, 99, 50, 512), 0);  // the last token: a plain step
  EXPECT_EQ(ProposalRoom(4, 100, 10, 510, 512), 1);
  EXPECT_EQ(ProposalRoom(4, 100, 10, 511, 512), 0);
  EXPECT_EQ(ProposalRoom(4, 100, 100, 50, 512), 0);
}

TEST(SpeculativeOptionsTest, RefusesOutOfRangeAndForeignDrafts) {
  auto backend = MakeCpuBackend();
  auto model = Model::Load(testing::Stories260K(), backend.get());
  ASSERT_TRUE(model.ok());
  const ModelConfig& c = (*model)->config();
  SpeculativeConfig o;
  EXPECT_TRUE(o.Validate(c).ok());  // off
  o.method = SpeculativeMethod::kNgram;
  o.num_tokens = 65;
  EXPECT_NE(o.Validate(c).message().find("--spec-tokens"), std::string::npos);
  o.num_tokens = 4;
  o.ngram.min_ngram = 0;
  EXPECT_FALSE(o.Validate(c).ok());
  o.ngram = {};
  o.method = SpeculativeMethod::kDraft;
  EXPECT_NE(o.Validate(c).message().find("--draft-model"), std::string::npos);
  ModelConfig other = c;
  other.vocab_size = 1000;
  o.draft = model->get();
  EXPECT_TRUE(o.Validate(c).ok());
  EXPECT_NE(o.Validate(other).message().find("vocabulary"), std::string::npos);
  EXPECT_EQ(*ParseSpeculativeMethod("draft"), SpeculativeMethod::kDraft);
  EXPECT_NE(ParseSpeculativeMethod("eagle").status().message().find("--speculative"),
            std::string::npos);
  GeneratorOptions g;
  g.speculative = o;
  g.speculative.draft = nullptr;
  Generator gen(model->get(), nullptr, g);
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  EXPECT_EQ(gen.Generate({&r, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
