// In-process generation over one model replica: continuous batching of many requests (mixed
// prefill chunks and decode steps in one forward call), a paged KV cache with block
// bookkeeping, sampling and stop conditions. It is the engine under `tandem generate`, the
// benchmarks and the equivalence tests.
#ifndef TANDEM_ENGINE_GENERATOR_H_
#define TANDEM_ENGINE_GENERATOR_H_

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/sampling/output_constraint.h"
#include "engine/sampling/sampler.h"
#include "engine/speculative/proposer.h"
#include "text/tokenizer.h"

namespace tandem {

class ModelRunner;  // engine/model_runner.h

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

struct GeneratorOptions {
  int block_size = 16;
  int num_blocks = 0;          // 0 = enough for every request's prompt + max_tokens
  int max_batch = 256;         // sequences in one step
  int prefill_chunk = 0;       // 0 = whole prompts; else at most this many prompt tokens per
                               // sequence per step (chunked prefill)
  int max_step_tokens = 8192;  // token budget of one forward call
  int64_t max_kv_bytes = int64_t{8} << 30;
  DType kv_dtype = DType::kF32;  // the KV cache (engine/kv/kv_cache.h)
  // Not owned. When set, steps run on it (e.g. the CUDA device model) with its own KV cache:
  // block_size, num_blocks and max_kv_bytes above are then unused.
  ModelRunner* runner = nullptr;
  // Compiles requests' json_schema for the model's vocabulary
  // (engine/sampling/output_constraint.h); without it a request asking for structured output is
  // refused.
  std::shared_ptr<OutputConstraints> constraints;
  // Speculative decoding (engine/speculative/proposer.h): a decoding sequence proposes up to
  // speculative.num_tokens tokens and one forward pass scores them all; the output is the same
  // with and without it. Off by default.
  SpeculativeConfig speculative;

  absl::Status Validate() const;
};

struct GenerationStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t proposed_tokens = 0;     // speculative proposals scored
  int64_t accepted_tokens = 0;     // ... and kept
  double first_token_seconds = 0;  // from start to the first sampled token of request 0
  double total_seconds = 0;
};

class Generator {
 public:
  // `tokenizer` may be nullptr (no text, no stop strings). Both must outlive the generator.
  Generator(const Model* model, const Tokenizer* tokenizer, GeneratorOptions options);

  // Called for every generated token with its request index and the new text (may be empty).
  using TokenCallback = std::function<void(int request, int token, std::string_view text)>;

  // Runs every request to completion. Requests are validated first (INVALID_ARGUMENT naming the
  // field). Requests wait while the KV cache is full; a running sequence that cannot grow is
  // preempted and recomputed later, with identical output (sampling is counter-based).
  absl::StatusOr<std::vector<GenerationOutput>> Generate(
      std::span<const GenerationRequest> requests, const TokenCallback& on_token = nullptr);

  const GenerationStats& stats() const { return stats_; }

 private:
  const Model* model_;
  const Tokenizer* tokenizer_;
  GeneratorOptions options_;
  GenerationStats stats_;
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

// Log-probability of each token of `ids` given the ones before it (ids[0] gets none), from one
// prefill with logits for every position: result has ids.size() - 1 entries.
absl::StatusOr<std::vector<float>> ScoreTokens(const Model& model, std::span<const int> ids,
                                               DType kv_dtype = DType::kF32);

// One scored position: the token's log-probability given those before it, its rank there (1 +
// the tokens with a higher logit, vLLM's definition) and the `top_n` most likely tokens
// (ComputeLogprobs: most likely first, ties by lower id).
struct ScoredToken {
  float logprob = 0;
  int rank = 1;
  std::vector<std::pair<int, float>> top;
};

// ScoreTokens with each position's rank and its top_n (0..kMaxTopLogprobs) most likely tokens.
absl::StatusOr<std::vector<ScoredToken>> ScoreTokensTop(const Model& model,
                                                        std::span<const int> ids, int top_n,
                                                        DType kv_dtype = DType::kF32);

}  // namespace tandem

#endif  // TANDEM_ENGINE_GENERATOR_H_
