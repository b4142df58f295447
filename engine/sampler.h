// Token sampling: logits ÷ T → top-k → top-p → renormalize → draw, with a counter-based random
// draw keyed by (seed, position) so a token never depends on batch composition, on which worker
// computed it, or on a resume.
#ifndef TANDEM_ENGINE_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (the first maximum wins)
  int top_k = 0;             // 0 = all tokens
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;

  // INVALID_ARGUMENT naming the field: temperature < 0 or not finite, top_k < 0, top_p outside
  // (0, 1] or NaN.
  absl::Status Validate() const;
};

// A uniform double in [0, 1) that depends only on (seed, counter): SplitMix64 finalizers over
// the two words (a stateless, counter-based generator).
double CounterUniform(uint64_t seed, uint64_t counter);

// The distribution Sample draws from: probabilities over the vocabulary after temperature,
// top-k, top-p and renormalization (zero outside the kept set). Empty for greedy.
// Top-k and top-p both select a prefix of the tokens sorted by probability (ties by lower id),
// computed on the temperature-scaled distribution, so together they keep the intersection of
// the two sets: the shorter prefix.
std::vector<double> SamplingDistribution(std::span<const float> logits, const SamplingParams& p);

// Picks the next token for `position` (the index the token will take in its sequence).
int Sample(std::span<const float> logits, const SamplingParams& p, uint64_t position);

// Index of the first maximum.
int Argmax(std::span<const float> logits);

}  // namespace tandem

#endif  // TANDEM_ENGINE_SAMPLER_H_
