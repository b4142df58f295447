// The sort-free top-k / top-p boundary of the CUDA sampler (kernels/cuda/sample_boundary.h),
// run on the host with sequential reductions, against engine/sampling/sampler.cc's kept set. The
// device kernel runs the same function with block reductions (its twin test needs a GPU).
#include "kernels/cuda/sample_boundary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/sampling/sampler.h"

namespace tandem {
namespace {

struct HostRows {
  const std::vector<double>& p;
  long long CountGe(uint64_t b) {
    long long c = 0;
    for (double x : p) c += sampling::ProbBits(x) >= b;
    return c;
  }
  double MassGe(uint64_t b) {
    double m = 0;
    for (double x : p) m += sampling::ProbBits(x) >= b ? x : 0.0;
    return m;
  }
  long long TiesBelow(uint64_t v, int x) {
    long long c = 0;
    for (int i = 0; i < x; ++i) c += sampling::ProbBits(p[i]) == v;
    return c;
  }
};

// softmax(logits / T) in double, as SamplingDistribution computes it.
std::vector<double> Probs(const std::vector<float>& logits, float temperature) {
  double max_v = -INFINITY;
  for (float l : logits) max_v = std::max(max_v, static_cast<double>(l) / temperature);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = std::exp(static_cast<double>(logits[i]) / temperature - max_v);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

TEST(SampleBoundaryTest, KeepsExactlyTheCpuSetWithTies) {
  std::mt19937 rng(11);
  int cases = 0;
  for (int vocab : {1, 2, 7, 100, 5000}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::normal_distribution<float> d(0.f, 2.f);
      std::vector<float> logits(vocab);
      for (float& l : logits) l = d(rng);
      // Ties: copy some values around, including the maximum, and quantize a few rows hard.
      if (trial % 3 == 0) {
        for (int i = 0; i < vocab / 3; ++i) logits[rng() % vocab] = logits[rng() % vocab];
      }
      if (trial % 5 == 0) {
        for (float& l : logits) l = std::round(l);
      }
      SamplingParams sp;
      sp.temperature = std::vector<float>{0.5f, 1.f, 1.7f}[trial % 3];
      sp.top_k = std::vector<int>{0, 1, 3, 40, vocab, vocab + 5}[trial % 6];
      sp.top_p = std::vector<float>{1.f, 0.9f, 0.5f, 0.05f, 0.999f}[trial % 5];
      const std::vector<double> p = Probs(logits, sp.temperature);
      HostRows rows{p};
      bool limited = false;
      const sampling::KeepBoundary b =
          sampling::FindKeepBoundary(rows, vocab, sp.top_k, sp.top_p, &limited);
      const std::vector<double> want = SamplingDistribution(logits, sp);
      ASSERT_EQ(want.size(), static_cast<size_t>(vocab));
      const bool cpu_limited = (sp.top_k > 0 && sp.top_k < vocab) || sp.top_p < 1.f;
      EXPECT_EQ(limited, cpu_limited);
      for (int i = 0; i < vocab; ++i) {
        ASSERT_EQ(sampling::Kept(b, p[i], i), want[i] != 0.0)
            << "vocab " << vocab << " trial " << trial << " token " << i << " top_k " << sp.top_k
            << " top_p " << sp.top_p;
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 200);
}

}  // namespace
}  // namespace tandem
