// One generation request as every engine takes it (the in-process Generator, the prefill and
// decode engines, the router's ingress), what it produces, and the checks and stop rule they
// share. Nothing here runs a model.
#ifndef TANDEM_ENGINE_REQUEST_H_
#define TANDEM_ENGINE_REQUEST_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/model_config.h"
#include "engine/sampling/sampler.h"

namespace tandem {

class Tokenizer;  // text/tokenizer.h

enum class FinishReason {
  kStop,    // an EOS id or a stop string
  kLength,  // max_tokens reached
  kContext  // the model's context length reached
};
std::string_view FinishReasonName(FinishReason r);

struct GenerationRequest {
  std::vector<int> prompt;  // token ids (with BOS when the model wants it); not empty
  SamplingParams sampling;
  int max_tokens = 16;                    // >= 1
  std::vector<std::string> stop_strings;  // need a tokenizer
  bool ignore_eos = false;
  // How many of the prompt's last ids this request generated itself: the router resumes a
  // request on other workers by sending its tokens so far as the prompt. The logit processors
  // (presence, frequency, min_tokens) count them as generated. In [0, prompt.size()).
  int output_tokens = 0;
  // Whether the engine may speculate for this request (when it speculates at all); the output is
  // the same either way, so this only trades speed: false opts out.
  bool speculative = true;
};

struct GenerationOutput {
  std::vector<int> tokens;  // generated ids (a stopping EOS id included)
  std::string text;         // their text (stop string excluded), when a tokenizer was given
  std::vector<TokenLogprobs> logprobs;  // one per token, with sampling.logprobs
  FinishReason finish = FinishReason::kLength;
};

// Whether generation ends after `token`, the `generated`-th token of the request, which makes
// the sequence `total_len` tokens long (prompt included): an EOS id (unless ignore_eos), then
// max_tokens, then the context length. Stop strings are checked on text by the caller.
std::optional<FinishReason> CheckFinish(const ModelConfig& config, const GenerationRequest& r,
                                        int token, int generated, int total_len);

// The history the logit processors see for request r whose sequence so far (prompt, then the
// generated ids) is `tokens`.
SamplingHistory HistoryOf(const GenerationRequest& r, std::span<const int> tokens,
                          const ModelConfig& config);
// The same for a sequence whose first `prompt_tokens` ids are the prompt proper.
SamplingHistory HistoryOf(std::span<const int> tokens, size_t prompt_tokens,
                          const ModelConfig& config);

// Checks a request against the model (prompt ids in the vocabulary, prompt within the
// context, sampling values, logit_bias ids, min_tokens within max_tokens, max_tokens,
// output_tokens) and names the offending field.
absl::Status ValidateRequest(const GenerationRequest& r, const ModelConfig& config,
                             const Tokenizer* tokenizer);
// Every id of `ids` in [0, vocab_size): else INVALID_ARGUMENT naming `field`, the id and its
// index (ValidateRequest's prompt, a Score's sequence).
absl::Status CheckTokenIds(std::span<const int> ids, int vocab_size, std::string_view field);

// One scored position: the token's log-probability given those before it, its rank there (1 +
// the tokens with a higher logit, vLLM's definition) and the `top_n` most likely tokens
// (ComputeLogprobs: most likely first, ties by lower id).
struct ScoredToken {
  float logprob = 0;
  int rank = 1;
  std::vector<std::pair<int, float>> top;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_REQUEST_H_
