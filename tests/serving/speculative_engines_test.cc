// Speculative decoding on the decode worker's engine (engine/speculative/proposer.h), by prompt
// lookup and by a draft model: prefill then decode gives exactly the tokens (and logprobs) of the
// engine alone without speculation, greedy and seeded, batched with plain decode steps, under
// preemption and with requests that opt out; the counters and metrics agree; nothing leaks.
#include <gtest/gtest.h>

#include "decode_node/decode_engine.h"
#include "engine/generator.h"
#include "metrics/metrics.h"
#include "prefill_node/prefill_engine.h"
#include "tests/cluster_auth.h"
#include "tests/serving/engine_pair.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

class SpeculativeEnginesTest : public ::testing::TestWithParam<SpeculativeMethod> {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = std::move(*Model::Load(testing::Stories260K(), backend_.get()));
    // The draft: the same model in q8_0, close to it but not equal.
    draft_ = std::move(*Model::Load(testing::Stories260K(), backend_.get(), DType::kQ8_0));
    tok_ = std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
    auto sender = MakeKvSender("local", {});
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
    PrefillEngineOptions po;
    po.num_blocks = 256;
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    registry_ = std::make_unique<MetricsRegistry>("stories260K");
    metrics_ = std::make_unique<DecodeMetrics>(*registry_);
  }
  void TearDown() override {
    EXPECT_TRUE(prefill_->Idle());
    if (decode_) {
      EXPECT_TRUE(decode_->Idle());
    }
    decode_.reset();
    prefill_.reset();
  }

  void StartDecode(int num_blocks, int k = 4, bool samples_in_runner = false) {
    DecodeEngineOptions dopt;
    dopt.block_size = 4;
    dopt.num_blocks = num_blocks;
    dopt.transport = "local";
    dopt.listen = "speculative-engines-test";
    dopt.speculative.method = GetParam();
    dopt.speculative.num_tokens = k;
    dopt.speculative.draft = draft_.get();
    dopt.cpu_samples_rows = samples_in_runner;
    decode_.reset();
    auto d = DecodeEngine::Create(model_.get(), dopt, metrics_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
  }

  std::vector<GenerationRequest> OracleRequests(int max_tokens) {
    const auto ref =
        testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
    std::vector<GenerationRequest> reqs;
    for (const auto& c : ref["greedy"]) {
      for (int seeded = 0; seeded < 2; ++seeded) {
        GenerationRequest r;
        r.prompt = c["prompt_ids"].get<std::vector<int>>();
        r.max_tokens = max_tokens;
        r.sampling.temperature = seeded ? 0.8f : 0.0f;
        r.sampling.top_p = seeded ? 0.9f : 1.0f;
        r.sampling.seed = 99 + reqs.size();
        reqs.push_back(r);
      }
    }
    return reqs;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> draft_;
  std::unique_ptr<Llama2cTokenizer> tok_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<PrefillEngine> prefill_;
  std::unique_ptr<MetricsRegistry> registry_;
  std::unique_ptr<DecodeMetrics> metrics_;
  std::unique_ptr<DecodeEngine> decode_;
};

TEST_P(SpeculativeEnginesTest, SameTokensAsTheEngineAloneWithoutSpeculation) {
  StartDecode(2048);
  // Concurrently: verify steps share the batch with each other and with plain decode steps.
  testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(),
                                        OracleRequests(120));
  const SpeculationStats st = decode_->speculation();
  EXPECT_GT(st.verify_steps, 0);
  EXPECT_GT(st.proposed_tokens, 0);
  EXPECT_GT(st.accepted_tokens, 0);
  EXPECT_LE(st.accepted_tokens, st.proposed_tokens);
  EXPECT_EQ(metrics_->spec_draft_tokens.Value(), static_cast<double>(st.proposed_tokens));
  EXPECT_EQ(metrics_->spec_accepted_tokens.Value(), static_cast<double>(st.accepted_tokens));
  const std::string text = registry_->Serialize();
  EXPECT_NE(text.find("tandem_spec_decode_acceptance_length_count"), std::string::npos);
}

// Where the runner samples (a GPU; here the CPU runner's host twin of it), verify steps are drawn
// there too, a row per token at its own position: the same tokens.
TEST_P(SpeculativeEnginesTest, RowsSampledByTheRunnerGiveTheSameTokens) {
  StartDecode(2048, 5, /*samples_in_runner=*/true);
  testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(),
                                        OracleRequests(100));
  EXPECT_GT(decode_->speculation().accepted_tokens, 0);
}

TEST_P(SpeculativeEnginesTest, PreemptedSequencesGiveTheSameTokens) {
  // 64 blocks of 4 tokens for 8 sequences of up to ~110 tokens: preemption and recompute, with
  // proposals' blocks taken only when free.
  StartDecode(64, 6);
  std::vector<GenerationRequest> reqs = OracleRequests(100);
  reqs.resize(8);
  testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(), reqs,
                                        /*start_together=*/true);
  EXPECT_GT(decode_->preemptions(), 0);
  EXPECT_GT(decode_->speculation().accepted_tokens, 0);
}

TEST_P(SpeculativeEnginesTest, OptedOutRequestsNeverPropose) {
  StartDecode(2048);
  std::vector<GenerationRequest> reqs = OracleRequests(60);
  for (GenerationRequest& r : reqs) r.speculative = false;
  testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(), reqs);
  EXPECT_EQ(decode_->speculation().proposed_tokens, 0);
}

TEST_P(SpeculativeEnginesTest, LogprobsAreTheModelsOwn) {
  StartDecode(2048);
  GenerationRequest r;
  r.prompt = tok_->Encode("Once upon a time, there was a little girl named Lily.", true);
  r.max_tokens = 80;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 3;
  Generator alone(model_.get(), nullptr, {});
  auto want = alone.Generate({&r, 1});
  ASSERT_TRUE(want.ok()) << want.status();
  auto adm = decode_->Admit(r);
  ASSERT_TRUE(adm.ok()) << adm.status();
  auto pre = prefill_->Prefill(adm->handle, r.prompt, r.sampling, adm->target,
                               absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(pre.ok()) << pre.status();
  ASSERT_TRUE(decode_->Start(adm->handle, pre->first_token).ok());
  std::vector<int> tokens = {pre->first_token};
  ASSERT_TRUE(pre->first_logprobs.has_value());
  std::vector<TokenLogprobs> logprobs = {*pre->first_logprobs};
  for (;;) {
    DecodeEngine::Output o = decode_->Next(adm->handle, absl::Seconds(10));
    ASSERT_TRUE(o.error.ok()) << o.error;
    ASSERT_EQ(o.tokens.size(), o.logprobs.size());
    tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
    logprobs.insert(logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    if (o.finish) break;
  }
  EXPECT_EQ(tokens, (*want)[0].tokens);
  ASSERT_EQ(logprobs.size(), (*want)[0].logprobs.size());
  for (size_t i = 0; i < logprobs.size(); ++i) {
    EXPECT_NEAR(logprobs[i].logprob, (*want)[0].logprobs[i].logprob, 1e-4) << i;
    ASSERT_EQ(logprobs[i].top.size(), 3u);
    EXPECT_EQ(logprobs[i].top[0].first, (*want)[0].logprobs[i].top[0].first) << i;
  }
  EXPECT_GT(decode_->speculation().accepted_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Proposers, SpeculativeEnginesTest,
                         ::testing::Values(SpeculativeMethod::kNgram, SpeculativeMethod::kDraft),
                         [](const auto& info) {
                           return std::string(SpeculativeMethodName(info.param));
                         });

}  // namespace
}  // namespace tandem
