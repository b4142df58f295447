// RouteTokens: the experts each token takes and their weights, grouped by expert.
#include "engine/moe_routing.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tandem {
namespace {

// softmax(row)[e] in double, for the expected weights.
double Prob(const std::vector<float>& row, int e) {
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v));
  return std::exp(static_cast<double>(row[e])) / sum;
}

TEST(MoeRoutingTest, TopKGroupedByExpertInTokenOrder) {
  // 3 tokens over 4 experts, 2 each: token 0 takes 1 and 2, token 1 takes 0 and 1, token 2 takes
  // 3 and 1.
  const std::vector<std::vector<float>> rows = {
      {0.1f, 3.0f, 2.0f, -1.0f}, {5.0f, 4.0f, 0.0f, 0.0f}, {0.0f, 1.0f, -2.0f, 2.5f}};
  std::vector<float> logits;
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
  ExpertRouting r;
  ASSERT_TRUE(RouteTokens(logits, 3, 4, 2, /*normalize=*/true, &r).ok());
  EXPECT_EQ(r.offsets, (std::vector<int>{0, 1, 4, 5, 6}));
  EXPECT_EQ(r.token, (std::vector<int>{1, 0, 1, 2, 0, 2}));
  // Renormalised: the two weights of each token sum to 1 in the ratio of their probabilities.
  const double t0 = Prob(rows[0], 1) + Prob(rows[0], 2);
  EXPECT_NEAR(r.weight[1], Prob(rows[0], 1) / t0, 1e-6);  // token 0, expert 1
  EXPECT_NEAR(r.weight[4], Prob(rows[0], 2) / t0, 1e-6);  // token 0, expert 2
  EXPECT_NEAR(r.weight[0] + r.weight[2], 1.0, 1e-6);      // token 1: experts 0 and 1

  // Without renormalisation the weights are the softmax probabilities themselves.
  ASSERT_TRUE(RouteTokens(logits, 3, 4, 2, /*normalize=*/false, &r).ok());
  EXPECT_NEAR(r.weight[1], Prob(rows[0], 1), 1e-6);
  EXPECT_NEAR(r.weight[5], Prob(rows[2], 3), 1e-6);
}

TEST(MoeRoutingTest, TiesGoToTheLowerExpertAndTopKCanBeAll) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 2.0f};
  ExpertRouting r;
  ASSERT_TRUE(RouteTokens(logits, 1, 4, 2, true, &r).ok());
  EXPECT_EQ(r.offsets, (std::vector<int>{0, 0, 1, 2, 2}));
  EXPECT_FLOAT_EQ(r.weight[0], 0.5f);
  ASSERT_TRUE(RouteTokens(logits, 1, 4, 4, true, &r).ok());
  EXPECT_EQ(r.offsets, (std::vector<int>{0, 1, 2, 3, 4}));
  double sum = 0;
  for (float w : r.weight) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(MoeRoutingTest, BadShapesAreRefusedAndNaNDoesNotBreakTheSort) {
  ExpertRouting r;
  const std::vector<float> four = {0, 1, 2, 3};
  EXPECT_EQ(RouteTokens(four, 2, 4, 2, true, &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RouteTokens(four, 1, 4, 5, true, &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RouteTokens(four, 1, 4, 0, true, &r).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<float> nan = {NAN, 1.0f, NAN, 0.0f};
  ASSERT_TRUE(RouteTokens(nan, 1, 4, 2, true, &r).ok());
  EXPECT_EQ(r.token.size(), 2u);
  EXPECT_EQ(r.offsets.back(), 2);
  ASSERT_TRUE(RouteTokens({}, 0, 4, 2, true, &r).ok());  // an empty step
  EXPECT_TRUE(r.token.empty());
}

}  // namespace
}  // namespace tandem
