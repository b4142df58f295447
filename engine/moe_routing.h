// Mixture-of-experts routing as transformers' Qwen3-MoE and Mixtral blocks compute it: per token,
// a softmax over every expert's router logit, the k most probable experts, their probabilities
// renormalised to sum to 1 where the model says so. The result is grouped by expert, so that each
// expert's MLP runs once over all the tokens (of every sequence in a step) that chose it.
#ifndef TANDEM_ENGINE_MOE_ROUTING_H_
#define TANDEM_ENGINE_MOE_ROUTING_H_

#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct ExpertRouting {
  // Expert e's rows are [offsets[e], offsets[e + 1]) of `token` and `weight`, in token order.
  std::vector<int> offsets;   // [n_experts + 1]
  std::vector<int> token;     // [num_tokens * k] the token (row of the step) each entry routes
  std::vector<float> weight;  // [num_tokens * k] its routing weight
};

// Routes `num_tokens` tokens given their router logits [num_tokens, n_experts] to k experts each
// (ties to the lower expert index, as torch.topk); `normalize` divides the k probabilities by
// their sum. INVALID_ARGUMENT when the sizes disagree or k is outside [1, n_experts].
absl::Status RouteTokens(std::span<const float> logits, int num_tokens, int n_experts, int k,
                         bool normalize, ExpertRouting* out);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MOE_ROUTING_H_
