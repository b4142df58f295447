#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "engine/sampling/output_constraint.h"

namespace tandem {

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be a finite number >= 0, got %g", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("top_k must be >= 0, got %d", top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p must be in (0, 1], got %g", top_p));
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs must be in [0, %d], got %d", kMaxTopLogprobs, top_logprobs));
  }
  for (auto [name, v] : {std::pair{"presence_penalty", presence_penalty},
                         std::pair{"frequency_penalty", frequency_penalty}}) {
    if (!(v >= -2.0f && v <= 2.0f)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: must be in [-2, 2], got %g", name, v));
    }
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 10.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("repetition_penalty: must be in (0, 10], got %g", repetition_penalty));
  }
  if (min_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("min_tokens: must be >= 0, got %d", min_tokens));
  }
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logit_bias: %d entries, more than the limit of %d", logit_bias.size(), kMaxLogitBias));
  }
  std::vector<int> ids;
  for (const auto& [id, bias] : logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias: the bias of token %d must be in [-100, 100], got %g", id, bias));
    }
    if (vocab_size > 0 && (id < 0 || id >= vocab_size)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias: token id %d is outside the vocabulary [0, %d)", id, vocab_size));
    }
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto it = std::adjacent_find(ids.begin(), ids.end()); it != ids.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("logit_bias: token %d appears twice", *it));
  }
  return absl::OkStatus();
}

bool SamplingParams::HasLogitProcessors() const {
  return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
         min_tokens > 0 || !logit_bias.empty() || !json_schema.empty() || !choice.empty() ||
         constraint != nullptr;
}

void ProcessLogits(std::span<float> logits, const SamplingParams& p, const SamplingHistory& h) {
  const int n = static_cast<int>(logits.size());
  auto valid = [n](int id) { return id >= 0 && id < n; };
  for (const auto& [id, bias] : p.logit_bias) {
    if (valid(id)) logits[id] += bias;
  }
  if (p.repetition_penalty != 1.0f) {
    std::vector<int> seen(h.prompt.begin(), h.prompt.end());
    seen.insert(seen.end(), h.output.begin(), h.output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int id : seen) {
      if (!valid(id)) continue;
      float& v = logits[id];
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::vector<int> out(h.output.begin(), h.output.end());
    std::sort(out.begin(), out.end());
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      if (valid(out[i])) {
        logits[out[i]] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      }
      i = j;
    }
  }
  if (static_cast<int64_t>(h.output.size()) < p.min_tokens) {
    for (int id : h.eos_ids) {
      if (valid(id)) logits[id] = -INFINITY;
    }
  }
  if (p.constraint != nullptr) p.constraint->Mask(h.output, h.eos_ids, logits);
}

TokenLogprobs ComputeLogprobs(std::span<const float> logits, int token, int top_n) {
  const int n = static_cast<int>(logits.size());
  double max_v = -INFINITY;
  for (float v : logits) max_v = std::max(max_v, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max_v);
  const double log_z = max_v + std::log(sum);
  TokenLogprobs out;
  out.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);
  top_n = std::clamp(top_n, 0, n);
  if (top_n > 0) {
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_n, order.end(), [&](int a, int b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < top_n; ++i) {
      out.top.emplace_back(order[i],
                           static_cast<float>(static_cast<double>(logits[order[i]]) - log_z));
    }
  }
  return out;
}

namespace {
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t ChoiceSeed(uint64_t seed, int index) {
  if (index == 0) return seed;
  return SplitMix64(SplitMix64(seed) ^ (0x636869636521ull + static_cast<uint64_t>(index)));
}

double CounterUniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int Argmax(std::span<const float> logits) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

std::vector<double> SamplingDistribution(std::span<const float> logits, const SamplingParams& p) {
  const int n = static_cast<int>(logits.size());
  if (p.temperature == 0.0f || n == 0) return {};
  // Softmax of logits / T in double, subtracting the maximum.
  std::vector<double> prob(n);
  double max_v = -INFINITY;
  for (int i = 0; i < n; ++i)
    max_v = std::max(max_v, static_cast<double>(logits[i]) / p.temperature);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    prob[i] = std::exp(static_cast<double>(logits[i]) / p.temperature - max_v);
    sum += prob[i];
  }
  for (double& v : prob) v /= sum;

  int keep = n;
  if (p.top_k > 0) keep = std::min(keep, p.top_k);
  std::vector<int> order;
  if (keep < n || p.top_p < 1.0f) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
    if (p.top_p < 1.0f) {
      // The smallest prefix whose mass reaches top_p.
      double cum = 0.0;
      int count = 0;
      while (count < n) {
        cum += prob[order[count++]];
        if (cum >= p.top_p) break;
      }
      keep = std::min(keep, count);
    }
    std::vector<double> kept(n, 0.0);
    double kept_sum = 0.0;
    for (int i = 0; i < keep; ++i) kept_sum += prob[order[i]];
    for (int i = 0; i < keep; ++i) kept[order[i]] = prob[order[i]] / kept_sum;
    return kept;
  }
  return prob;
}

namespace {

// The draw from logits that already went through the processors.
int Draw(std::span<const float> logits, const SamplingParams& p, uint64_t position) {
  if (p.temperature == 0.0f) return Argmax(logits);
  std::vector<double> dist = SamplingDistribution(logits, p);
  const double u = CounterUniform(p.seed, position);
  double cum = 0.0;
  int last = 0;
  for (int i = 0; i < static_cast<int>(dist.size()); ++i) {
    if (dist[i] == 0.0) continue;
    cum += dist[i];
    last = i;
    if (u < cum) return i;
  }
  return last;  // rounding left u above the total: take the last kept token
}

}  // namespace

int Sample(std::span<const float> logits, const SamplingParams& p, uint64_t position,
           const SamplingHistory& history) {
  if (!p.HasLogitProcessors()) return Draw(logits, p, position);
  thread_local std::vector<float> processed;
  processed.assign(logits.begin(), logits.end());
  ProcessLogits(processed, p, history);
  return Draw(processed, p, position);
}

}  // namespace tandem
