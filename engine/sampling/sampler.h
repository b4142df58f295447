// Token sampling: logits → logit_bias → repetition, frequency and presence penalties →
// min_tokens → ÷ T → top-k → top-p → renormalize → draw, with a counter-based random draw keyed
// by (seed, position) so a token never depends on batch composition, on which worker computed
// it, or on a resume.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

class OutputConstraint;  // engine/sampling/output_constraint.h

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (the first maximum wins)
  int top_k = 0;             // 0 = all tokens
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
  // Report each sampled token's log-probability and the top_logprobs most likely tokens (in
  // [0, kMaxTopLogprobs]); see ComputeLogprobs. Never changes the draw.
  bool logprobs = false;
  int top_logprobs = 0;

  // Logit processors (ProcessLogits), OpenAI's and vLLM's definitions. The penalties look at the
  // request's own tokens: presence and frequency at the generated ones, repetition at the prompt
  // and the generated ones.
  float presence_penalty = 0;    // in [-2, 2]: minus this for every token generated at least once
  float frequency_penalty = 0;   // in [-2, 2]: minus this times the token's generated count
  float repetition_penalty = 1;  // in (0, 10]: seen tokens' positive logits ÷ it, negative × it
  int min_tokens = 0;            // >= 0: the EOS ids are excluded until this many are generated
  std::vector<std::pair<int, float>> logit_bias;  // (token id, bias in [-100, 100]) added

  // Structured output: a JSON Schema as JSON text (kJsonObjectSchema for OpenAI's json_object);
  // empty for none. The output is then one JSON value valid against it, then EOS
  // (engine/sampling/output_constraint.h). Where tokens are sampled, `constraint` must hold it
  // compiled for the model's vocabulary: the engines attach it when they admit a request.
  std::string json_schema;
  // With json_schema: text the output starts with before the value and ends with after it
  // (a forced tool call's "<tool_call>\n" and "\n</tool_call>").
  std::string json_prefix;
  std::string json_suffix;
  // Or, instead of json_schema: the output is exactly one of these strings, then EOS.
  std::vector<std::string> choice;
  // Or: the output matches this regular expression as a whole (structured/byte_regex.h), then
  // EOS.
  std::string regex;
  std::shared_ptr<const OutputConstraint> constraint;

  // Whether the output is constrained (json_schema, choice or regex), and the field that asks.
  bool constrained() const { return !json_schema.empty() || !choice.empty() || !regex.empty(); }
  const char* constraint_field() const {
    return !choice.empty() ? "choice" : !regex.empty() ? "regex" : "json_schema";
  }

  // INVALID_ARGUMENT naming the field: temperature < 0 or not finite, top_k < 0, top_p outside
  // (0, 1] or NaN, top_logprobs outside [0, kMaxTopLogprobs], a penalty or bias out of its range
  // or not finite, min_tokens < 0, more than kMaxLogitBias biases, the same id twice, or (with
  // vocab_size > 0) a logit_bias id outside [0, vocab_size).
  absl::Status Validate(int vocab_size = 0) const;
  // Whether any logit processor is on (the logits then differ from the model's).
  bool HasLogitProcessors() const;
};

inline constexpr int kMaxLogitBias = 1024;

// What the logit processors look at: the request's prompt, the tokens it generated so far
// (after a resume, those the router sent back inside the prompt count as generated), and the
// model's EOS ids.
struct SamplingHistory {
  std::span<const int> prompt;
  std::span<const int> output;
  std::span<const int> eos_ids;
};

// Applies p's processors to `logits` in place, in this order: logit_bias; repetition_penalty
// over every distinct token of prompt and output; frequency_penalty x count and
// presence_penalty over the distinct tokens of output; then, while output has fewer than
// min_tokens tokens, the EOS ids to -infinity; last, with a constraint, every token that cannot
// continue the output under the JSON Schema to -infinity. A no-op when !p.HasLogitProcessors().
void ProcessLogits(std::span<float> logits, const SamplingParams& p, const SamplingHistory& h);

inline constexpr int kMaxTopLogprobs = 20;

// A sampled token's log-probability and the most likely tokens at its position.
struct TokenLogprobs {
  float logprob = 0;
  std::vector<std::pair<int, float>> top;  // (token id, log-probability), most likely first
};

// Log-probabilities under the model's own distribution, log-softmax of the raw `logits` (before
// temperature, top-k and top-p, which only shape the draw): the logprob of `token` and the
// `top_n` most likely tokens (ties by lower id). Computed in double. The same numbers as
// ScoreTokens gives for a prompt.
TokenLogprobs ComputeLogprobs(std::span<const float> logits, int token, int top_n);

// A uniform double in [0, 1) that depends only on (seed, counter): SplitMix64 finalizers over
// the two words (a stateless, counter-based generator).
double CounterUniform(uint64_t seed, uint64_t counter);

// The seed of choice `index` of a request that asks for several (OpenAI's `n`): the request's
// own seed for choice 0 (so n = 1 and choice 0 agree), a SplitMix64 mix of (seed, index) after.
// A gRPC client reproduces choice i by sending ChoiceSeed(seed, i) as its seed.
uint64_t ChoiceSeed(uint64_t seed, int index);

// The distribution Sample draws from: probabilities over the vocabulary after temperature,
// top-k, top-p and renormalization (zero outside the kept set). Empty for greedy.
// Top-k and top-p both select a prefix of the tokens sorted by probability (ties by lower id),
// computed on the temperature-scaled distribution, so together they keep the intersection of
// the two sets: the shorter prefix.
std::vector<double> SamplingDistribution(std::span<const float> logits, const SamplingParams& p);

// Picks the next token for `position` (the index the token will take in its sequence) from the
// raw logits: ProcessLogits on a copy when p has processors, then the draw.
int Sample(std::span<const float> logits, const SamplingParams& p, uint64_t position,
           const SamplingHistory& history = {});

// Index of the first maximum.
int Argmax(std::span<const float> logits);

}  // namespace tandem

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLER_H_
