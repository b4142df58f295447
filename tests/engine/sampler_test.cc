#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace tandem
