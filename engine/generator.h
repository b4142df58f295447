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
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/request.h"
#include "engine/sampling/output_constraint.h"
#include "engine/sampling/sampler.h"
#include "engine/speculative/proposer.h"
#include "text/tokenizer.h"

namespace tandem {

class ModelRunner;  // engine/model_runner.h

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

// Log-probability of each token of `ids` given the ones before it (ids[0] gets none), from one
// prefill with logits for every position: result has ids.size() - 1 entries.
absl::StatusOr<std::vector<float>> ScoreTokens(const Model& model, std::span<const int> ids,
                                               DType kv_dtype = DType::kF32);

// ScoreTokens with each position's rank and its top_n (0..kMaxTopLogprobs) most likely tokens.
absl::StatusOr<std::vector<ScoredToken>> ScoreTokensTop(const Model& model,
                                                        std::span<const int> ids, int top_n,
                                                        DType kv_dtype = DType::kF32);

// What a request to score `ids` (top_n per position) may be: at least 2 tokens, each in the
// vocabulary, at most the context; top_n in [0, kMaxTopLogprobs]. INVALID_ARGUMENT naming the
// field otherwise.
absl::Status ValidateScore(const ModelConfig& config, std::span<const int> ids, int top_n);
// `token`'s log-probability under the logits `row`, its rank and the row's top_n tokens.
ScoredToken ScoreRow(std::span<const float> row, int token, int top_n);

}  // namespace tandem

#endif  // TANDEM_ENGINE_GENERATOR_H_
