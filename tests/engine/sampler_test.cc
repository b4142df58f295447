#include "engine/sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/sampling/output_constraint.h"
#include "structured/json_matcher.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace tandem {
namespace {

int Kept(const std::vector<double>& d) {
  return static_cast<int>(std::count_if(d.begin(), d.end(), [](double p) { return p > 0; }));
}

// logits = log of [0.4, 0.25, 0.15, 0.1, 0.06, 0.04]
std::vector<float> Logits() {
  std::vector<float> l;
  for (double p : {0.4, 0.25, 0.15, 0.1, 0.06, 0.04}) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(SamplerTest, GreedyTakesFirstMaximum) {
  std::vector<float> l = {1, 3, 3, 2};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Sample(l, p, 0), 1);
  EXPECT_EQ(Argmax(l), 1);
}

TEST(SamplerTest, TopKKeepsExactlyK) {
  SamplingParams p;
  for (int k = 1; k <= 6; ++k) {
    p.top_k = k;
    const auto d = SamplingDistribution(Logits(), p);
    EXPECT_EQ(Kept(d), k);
    for (int i = 0; i < k; ++i) EXPECT_GT(d[i], 0);  // the k most likely
  }
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingP) {
  SamplingParams p;
  p.top_p = 0.39f;  // 0.4 alone reaches it
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 1);
  p.top_p = 0.41f;
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 2);
  p.top_p = 0.79f;  // 0.4 + 0.25 + 0.15 = 0.8 reaches it
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 3);
  p.top_p = 0.81f;
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 4);
  p.top_p = 1.0f;
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 6);
}

TEST(SamplerTest, TopKAndTopPKeepTheIntersection) {
  SamplingParams p;
  p.top_k = 2;
  p.top_p = 0.9f;  // top-p alone keeps 4
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 2);
  p.top_k = 5;
  p.top_p = 0.6f;  // top-p alone keeps 2
  EXPECT_EQ(Kept(SamplingDistribution(Logits(), p)), 2);
}

TEST(SamplerTest, KeptSetIsRenormalized) {
  SamplingParams p;
  p.top_k = 2;
  const auto d = SamplingDistribution(Logits(), p);
  EXPECT_NEAR(d[0], 0.4 / 0.65, 1e-6);
  EXPECT_NEAR(d[1], 0.25 / 0.65, 1e-6);
}

TEST(SamplerTest, TemperatureScalesLogits) {
  const auto l = Logits();
  SamplingParams p;
  p.temperature = 0.5f;
  const auto d = SamplingDistribution(l, p);
  // softmax(log p / 0.5) = p^2 / sum p^2
  double z = 0;
  for (double q : {0.4, 0.25, 0.15, 0.1, 0.06, 0.04}) z += q * q;
  EXPECT_NEAR(d[0], 0.16 / z, 1e-6);
  EXPECT_NEAR(d[5], 0.0016 / z, 1e-6);
  p.temperature = 2.0f;  // sqrt(p) / sum sqrt(p)
  const auto d2 = SamplingDistribution(l, p);
  double z2 = 0;
  for (double q : {0.4, 0.25, 0.15, 0.1, 0.06, 0.04}) z2 += std::sqrt(q);
  EXPECT_NEAR(d2[1], std::sqrt(0.25) / z2, 1e-6);
}

TEST(SamplerTest, SeedAndPositionReproduce) {
  SamplingParams p;
  p.seed = 42;
  std::vector<int> a, b, c;
  for (int pos = 0; pos < 100; ++pos) {
    a.push_back(Sample(Logits(), p, pos));
    b.push_back(Sample(Logits(), p, pos));
  }
  p.seed = 43;
  for (int pos = 0; pos < 100; ++pos) c.push_back(Sample(Logits(), p, pos));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Empirical frequencies over many counters match the distribution: a chi-square test with a
// fixed seed (5 degrees of freedom; the 99.9% critical value is 20.5).
TEST(SamplerTest, FrequenciesMatchDistribution) {
  SamplingParams p;
  p.seed = 2024;
  p.temperature = 0.8f;
  p.top_k = 5;
  const auto dist = SamplingDistribution(Logits(), p);
  const int n = 200000;
  std::vector<int> counts(6, 0);
  for (int i = 0; i < n; ++i) ++counts[Sample(Logits(), p, i)];
  EXPECT_EQ(counts[5], 0);  // outside top-k
  double chi2 = 0;
  for (int i = 0; i < 5; ++i) {
    const double e = dist[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 20.5) << "chi-square " << chi2;
}

TEST(SamplerTest, CounterUniformIsInUnitInterval) {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = CounterUniform(9, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(SamplerTest, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.Validate().ok());
  p.temperature = -0.1f;
  EXPECT_NE(p.Validate().message().find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(p.Validate().message().find("top_p"), std::string::npos);
  p = {};
  p.top_p = NAN;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.top_k = -3;
  EXPECT_NE(p.Validate().message().find("top_k"), std::string::npos);
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const TokenLogprobs lp = ComputeLogprobs(logits, 0, 3);
  EXPECT_NEAR(lp.logprob, 1.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // a tie: the lower id first
  EXPECT_EQ(lp.top[1].first, 2);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_EQ(lp.top[2].second, lp.logprob);
  EXPECT_TRUE(ComputeLogprobs(logits, 3, 0).top.empty());
  EXPECT_EQ(ComputeLogprobs(logits, 3, 99).top.size(), 4u);  // at most the vocabulary
  SamplingParams p;
  p.logprobs = true;
  p.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_NE(p.Validate().message().find("top_logprobs"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Logit processors: each as defined, in the documented order, and only when asked for.

TEST(LogitProcessorTest, BiasAndPenaltiesAsDefined) {
  const std::vector<float> raw = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f};
  const std::vector<int> prompt = {4, 1};
  const std::vector<int> output = {0, 2, 0, 0};  // token 0 three times, token 2 once
  const SamplingHistory h{prompt, output, {}};

  SamplingParams bias;
  bias.logit_bias = {{3, -5.0f}, {5, 1.5f}};
  std::vector<float> l = raw;
  ProcessLogits(l, bias, h);
  EXPECT_EQ(l, (std::vector<float>{2.0f, -1.0f, 0.5f, -2.0f, -2.0f, 1.5f}));

  // Repetition: every distinct token of prompt and output once, by the sign of its logit.
  SamplingParams rep;
  rep.repetition_penalty = 2.0f;
  l = raw;
  ProcessLogits(l, rep, h);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -2.0f, 0.25f, 3.0f, -4.0f, 0.0f}));

  // Frequency x count and presence once, over the output only (the prompt's 4 and 1 untouched).
  SamplingParams freq;
  freq.frequency_penalty = 0.5f;
  freq.presence_penalty = 0.25f;
  l = raw;
  ProcessLogits(l, freq, h);
  EXPECT_EQ(
      l, (std::vector<float>{2.0f - 1.5f - 0.25f, -1.0f, 0.5f - 0.5f - 0.25f, 3.0f, -2.0f, 0.0f}));

  // The order: bias first, then repetition (which sees the biased sign), then frequency.
  SamplingParams all;
  all.logit_bias = {{1, 3.0f}};
  all.repetition_penalty = 2.0f;
  all.frequency_penalty = 1.0f;
  l = raw;
  ProcessLogits(l, all, h);
  EXPECT_FLOAT_EQ(l[1], (-1.0f + 3.0f) / 2.0f);
  EXPECT_FLOAT_EQ(l[0], 2.0f / 2.0f - 3.0f);
  EXPECT_FLOAT_EQ(l[3], 3.0f);
}

TEST(LogitProcessorTest, MinTokensExcludesEosUntilEnoughAreGenerated) {
  const std::vector<float> raw = {0.0f, 5.0f, 1.0f};  // EOS (1) is the greedy choice
  const std::vector<int> eos = {1};
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  const std::vector<int> none, one = {2}, two = {2, 2};
  EXPECT_EQ(Sample(raw, p, 0, {{}, none, eos}), 2);
  EXPECT_EQ(Sample(raw, p, 1, {{}, one, eos}), 2);
  EXPECT_EQ(Sample(raw, p, 2, {{}, two, eos}), 1);
  // Sampled: EOS is never drawn before min_tokens, over many seeds.
  p.temperature = 1;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    p.seed = seed;
    ASSERT_NE(Sample(raw, p, 0, {{}, one, eos}), 1) << seed;
  }
}

TEST(LogitProcessorTest, PenaltiesChangeTheDistributionAsDefined) {
  // The sampled distribution is softmax of the processed logits: token 0 seen 3 times with
  // frequency 0.5 loses 1.5 nats against the others.
  const std::vector<float> raw = {1.0f, 1.0f, 1.0f};
  const std::vector<int> output = {0, 0, 0};
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  std::vector<float> l = raw;
  ProcessLogits(l, p, {{}, output, {}});
  const auto d = SamplingDistribution(l, p);
  EXPECT_NEAR(d[0] / d[1], std::exp(-1.5), 1e-9);
  // Frequencies over many seeds follow it.
  int zeros = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    p.seed = static_cast<uint64_t>(i);
    zeros += Sample(raw, p, 7, {{}, output, {}}) == 0;
  }
  const double want = d[0];
  EXPECT_NEAR(zeros / double(n), want, 4 * std::sqrt(want * (1 - want) / n));
}

TEST(LogitProcessorTest, NoProcessorsLeaveTheDrawUnchangedAndSeedsReproduce) {
  const std::vector<float> raw = Logits();
  SamplingParams plain;
  plain.seed = 3;
  EXPECT_FALSE(plain.HasLogitProcessors());
  const std::vector<int> output = {0, 1, 2};
  for (uint64_t pos = 0; pos < 50; ++pos) {
    ASSERT_EQ(Sample(raw, plain, pos, {{}, output, {}}), Sample(raw, plain, pos));
  }
  SamplingParams pen = plain;
  pen.presence_penalty = 1.0f;
  EXPECT_TRUE(pen.HasLogitProcessors());
  for (uint64_t pos = 0; pos < 50; ++pos) {
    ASSERT_EQ(Sample(raw, pen, pos, {{}, output, {}}), Sample(raw, pen, pos, {{}, output, {}}));
  }
}

TEST(LogitProcessorTest, ValidateNamesTheField) {
  auto error = [](auto set) {
    SamplingParams p;
    set(p);
    return std::string(p.Validate().message());
  };
  EXPECT_EQ(error([](SamplingParams&) {}), "");
  EXPECT_NE(error([](SamplingParams& p) { p.presence_penalty = 2.5f; }).find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.frequency_penalty = NAN; }).find("frequency_penalty"),
            std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.min_tokens = -1; }).find("min_tokens"),
            std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) {
              p.logit_bias = {{1, 101.0f}};
            }).find("logit_bias"),
            std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) {
              p.logit_bias = {{1, 1.0f}, {1, 2.0f}};
            }).find("appears twice"),
            std::string::npos);
  EXPECT_NE(
      error([](SamplingParams& p) { p.logit_bias.resize(kMaxLogitBias + 1); }).find("logit_bias"),
      std::string::npos);
}

// The router's check of a constrained output ended at EOS (OutputConstraint::Completes): true
// only for the prefix, one whole value and the suffix.
TEST(OutputConstraintTest, CompletesOnlyWithAWholeValue) {
  const std::vector<std::string> vocab = {"<", ">", "{", "}", "\"a\"", ":", "1", ",", " ", ""};
  auto mask = std::make_shared<structured::TokenMask>(vocab);
  auto schema = structured::JsonSchema::Compile(
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})", "<",
      ">");
  ASSERT_TRUE(schema.ok()) << schema.status();
  const OutputConstraint c(*schema, mask);
  EXPECT_TRUE(c.Completes(std::vector<int>{0, 2, 4, 5, 6, 3, 1}));  // <{"a":1}>
  EXPECT_FALSE(c.Completes(std::vector<int>{0, 2, 4, 5, 6, 3}));    // no suffix
  EXPECT_FALSE(c.Completes(std::vector<int>{0, 2, 4, 5}));          // cut mid-value
  EXPECT_FALSE(c.Completes(std::vector<int>{0, 2, 3, 1}));          // "a" is required
  EXPECT_FALSE(c.Completes(std::vector<int>{0, 2, 4, 5, 6, 3, 1, 1}));
  EXPECT_FALSE(c.Completes(std::vector<int>{9}));  // a token with no bytes
}

// Masks are cached per matcher state: every random output of a regex constraint masks exactly as
// a mask computed afresh from its replayed matcher, and states met again are not recomputed.
TEST(OutputConstraintTest, CachedMasksEqualFreshOnes) {
  std::vector<std::string> vocab;
  for (char c = 'a'; c <= 'e'; ++c) vocab.push_back(std::string(1, c));
  for (const char* t : {"ab", "ba", "cde", " ", ",", ".", " a", "e.", ", b", ""})
    vocab.push_back(t);
  auto mask = std::make_shared<structured::TokenMask>(vocab);
  auto schema = structured::JsonSchema::Regex("([a-e]+[ ,.]){1,6}");
  ASSERT_TRUE(schema.ok()) << schema.status();
  const OutputConstraint c(*schema, mask);
  const std::vector<int> eos = {static_cast<int>(vocab.size()) - 1};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> output;
    structured::JsonMatcher matcher(**schema);
    for (int step = 0; step < 12; ++step) {
      std::vector<float> logits(vocab.size(), 0.0f);
      c.Mask(output, eos, logits);
      std::vector<uint8_t> fresh;
      mask->Allowed(matcher, eos, &fresh);
      std::vector<int> allowed;
      for (size_t i = 0; i < vocab.size(); ++i) {
        ASSERT_EQ(logits[i] == 0.0f, fresh[i] == 1) << "trial " << trial << " token " << i;
        if (fresh[i] && static_cast<int>(i) != eos[0]) allowed.push_back(static_cast<int>(i));
      }
      if (allowed.empty()) break;
      const int next = allowed[rng() % allowed.size()];
      ASSERT_TRUE(mask->Advance(&matcher, next));
      output.push_back(next);
    }
  }
  EXPECT_GT(c.masks_reused(), 10 * c.masks_computed());
}

}  // namespace
}  // namespace tandem
