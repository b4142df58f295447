// Scoring on a prefill worker runs through its engine: the worker's KV dtype, its scheduler's
// chunks, batched with generation prefills.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/generator.h"
#include "metrics/metrics.h"
#include "prefill_node/prefill_engine.h"
#include "tests/cluster_auth.h"
#include "tests/serving/engine_parts.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

class ScoreTest : public testing::StoriesEngineTest {
 protected:
  void StartPrefill(DType kv_dtype, int64_t step_delay_ms = 0) {
    PrefillEngineOptions po;
    po.block_size = 16;
    po.num_blocks = 256;
    po.kv_dtype = kv_dtype;
    po.scheduler.chunk_size = 7;  // several chunks per prompt
    po.faults.step_delay_ms = step_delay_ms;
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po, &metrics_);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
  }

  void TearDown() override {
    if (prefill_) EXPECT_TRUE(prefill_->Idle());  // the leak check
    prefill_.reset();
  }

  MetricsRegistry registry_{"stories260K"};
  PrefillMetrics metrics_{registry_};
  std::unique_ptr<PrefillEngine> prefill_;
};

// With a bf16 KV cache, a prompt and the tokens greedy generation added to it score as the
// generation path gave them: each generated token's log-probability, from a prefill in chunks
// of 7 instead of one decode step per token. (A float32 cache's scores differ by up to 0.009
// here: the scores are the worker's KV dtype's.)
TEST_F(ScoreTest, ScoresEqualTheGenerationPathsLogprobsWithBf16Kv) {
  StartPrefill(DType::kBF16);
  GenerationRequest r;
  r.prompt = {1, 403, 407, 261, 378};
  r.max_tokens = 24;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.sampling.logprobs = true;
  GeneratorOptions go;
  go.kv_dtype = DType::kBF16;
  Generator alone(model_.get(), nullptr, go);
  auto want = alone.Generate({&r, 1});
  ASSERT_TRUE(want.ok()) << want.status();
  const GenerationOutput& out = (*want)[0];
  ASSERT_EQ(out.tokens.size(), 24u);
  std::vector<int> ids = r.prompt;
  ids.insert(ids.end(), out.tokens.begin(), out.tokens.end());
  auto scored = prefill_->Score(ids, /*top_n=*/2);
  ASSERT_TRUE(scored.ok()) << scored.status();
  ASSERT_EQ(scored->size(), ids.size() - 1);
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    const ScoredToken& s = (*scored)[r.prompt.size() - 1 + i];
    EXPECT_NEAR(s.logprob, out.logprobs[i].logprob, 1e-4) << "token " << i;
    EXPECT_EQ(s.rank, 1) << "greedy: the most likely token, token " << i;
    ASSERT_EQ(s.top.size(), 2u);
    EXPECT_EQ(s.top[0].first, out.tokens[i]);
  }
  // The host scoring function in the same KV dtype agrees.
  auto host = ScoreTokensTop(*model_, ids, 2, DType::kBF16);
  ASSERT_TRUE(host.ok()) << host.status();
  for (size_t i = 0; i < host->size(); ++i) {
    EXPECT_NEAR((*scored)[i].logprob, (*host)[i].logprob, 1e-5) << "position " << i;
  }
  EXPECT_EQ(prefill_->Score(std::vector<int>{1}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prefill_->Score(std::vector<int>{1, 9999}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A Score and a generation prefill submitted together share steps: with 35-token prompts in
// chunks of 7, each alone takes 5 steps; the engine's steps compute both prompts' 70 tokens in
// far fewer than 10.
TEST_F(ScoreTest, AScoreIsBatchedWithAGenerationPrefill) {
  if (!FaultSpec::Compiled()) GTEST_SKIP() << "needs fault injection (step_delay_ms)";
  StartPrefill(DType::kF32, /*step_delay_ms=*/100);
  std::vector<int> prompt(35);
  for (int i = 0; i < 35; ++i) prompt[i] = 1 + (i * 37) % 500;
  std::vector<int> other = prompt;
  other[0] = 2;  // no prefix in common
  absl::StatusOr<std::vector<ScoredToken>> scored = absl::UnknownError("not run");
  std::thread scorer([&] {
    absl::SleepFor(absl::Milliseconds(10));  // during the generation prefill's first step
    scored = prefill_->Score(other, 0);
  });
  // A lease nobody holds: the prefill computes, and its sends are refused (no decode worker).
  KvTarget nowhere{"tcp://127.0.0.1:9", 1, 1, "x"};
  const auto steps0 = metrics_.step_time.Collect().histogram.sample_count;
  const double tokens0 = metrics_.batch_tokens.Collect().histogram.sample_sum;
  auto pre =
      prefill_->Prefill(1, prompt, SamplingParams{}, nowhere, absl::Now() + absl::Seconds(30));
  scorer.join();
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_EQ(scored->size(), 34u);
  const auto steps = metrics_.step_time.Collect().histogram.sample_count - steps0;
  EXPECT_EQ(metrics_.batch_tokens.Collect().histogram.sample_sum - tokens0, 70)
      << "the score's tokens were not computed in the engine's steps";
  EXPECT_LE(steps, 7u) << "the score ran in steps of its own";
  (void)pre;  // refused or not, its compute shared the steps
}

}  // namespace
}  // namespace tandem
