#include "engine/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tandem {

absl::Status RouteTokens(std::span<const float> logits, int num_tokens, int n_experts, int k,
                         bool normalize, ExpertRouting* out) {
  if (num_tokens < 0 || n_experts < 1 || k < 1 || k > n_experts ||
      logits.size() != static_cast<size_t>(num_tokens) * n_experts) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expert routing: %d tokens, %d experts, top %d and %d logits do not agree",
                        num_tokens, n_experts, k, logits.size()));
  }
  std::vector<int> chosen(static_cast<size_t>(num_tokens) * k);      // [T, k] expert ids
  std::vector<float> chosen_w(static_cast<size_t>(num_tokens) * k);  // [T, k] their weights
  std::vector<float> prob(n_experts);
  std::vector<int> order(n_experts);
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + static_cast<size_t>(t) * n_experts;
    // softmax(dim=-1, dtype=float32): exp(x - max) / sum.
    float max = row[0];
    for (int e = 1; e < n_experts; ++e) max = std::max(max, row[e]);
    float sum = 0;
    for (int e = 0; e < n_experts; ++e) {
      prob[e] = std::exp(row[e] - max);
      sum += prob[e];
    }
    for (int e = 0; e < n_experts; ++e) {
      prob[e] /= sum;
      if (std::isnan(prob[e])) prob[e] = 0;  // a broken model's NaN must not break the sort
    }
    // The k largest, descending; equal probabilities keep the lower index first.
    for (int e = 0; e < n_experts; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
    });
    float top_sum = 0;
    for (int i = 0; i < k; ++i) top_sum += prob[order[i]];
    for (int i = 0; i < k; ++i) {
      chosen[t * k + i] = order[i];
      chosen_w[t * k + i] = normalize ? prob[order[i]] / top_sum : prob[order[i]];
    }
  }
  // Group by expert (a counting sort keeps token order within each expert).
  out->offsets.assign(n_experts + 1, 0);
  for (int e : chosen) ++out->offsets[e + 1];
  for (int e = 0; e < n_experts; ++e) out->offsets[e + 1] += out->offsets[e];
  out->token.resize(chosen.size());
  out->weight.resize(chosen.size());
  std::vector<int> next(out->offsets.begin(), out->offsets.end() - 1);
  for (int t = 0; t < num_tokens; ++t) {
    for (int i = 0; i < k; ++i) {
      const int slot = next[chosen[t * k + i]]++;
      out->token[slot] = t;
      out->weight[slot] = chosen_w[t * k + i];
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
