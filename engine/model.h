// The Llama-family forward pass (RMSNorm, RoPE, GQA attention over a paged KV cache, SwiGLU
// MLP, tied or separate classifier; Qwen2's q/k/v biases and Qwen3's per-head q/k norms; Gemma 3's
// scaled embeddings, GeGLU, norms after attention and MLP, and sliding-window layers with their
// own RoPE base; Qwen3-MoE's and Mixtral's mixture-of-experts MLPs, each expert run once over the
// tokens of the whole step that chose it), written once against the Backend interface.
//
// One Forward call takes new tokens of many sequences: a prefill is a sequence with many new
// tokens (or a chunk of them), a decode step is one new token for each of many sequences; both
// can share a call.
#ifndef TANDEM_ENGINE_MODEL_H_
#define TANDEM_ENGINE_MODEL_H_

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/loaders/model_weights.h"
#include "engine/model_config.h"
#include "engine/moe_routing.h"
#include "formats/mapped_file.h"
#include "kernels/backend.h"

namespace tandem {

// The new tokens of one sequence in a Forward call.
struct SequenceChunk {
  std::span<const int> tokens;  // [n] new token ids, n >= 1
  int start_pos = 0;            // position of tokens[0]; KV for [0, start_pos) is cached
  // Blocks covering positions [0, start_pos + n), per layer group (engine/kv/block_table.h: the
  // cache's table layout; a sliding group's blocks behind its window may be kNoBlock).
  std::span<const int> block_table;
  bool all_logits = false;  // logits for every new token instead of only the last
};

// The weight dtypes a --dtype flag names: f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k,
// q5_k, q6_k. INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<DType> ParseWeightDType(std::string_view name);

class Model {
 public:
  // Loads a Hugging Face model directory, a GGUF file or a llama2.c checkpoint (.bin), chosen
  // by `path`.
  // With `weight_dtype`, matrices stored in another dtype are converted to it at load (else
  // they are used in place as stored). The backend must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Load(
      const std::string& path, Backend* backend, std::optional<DType> weight_dtype = std::nullopt);
  Model(ModelConfig config, ModelWeights weights, Backend* backend);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }

  // Runs the new tokens of `batch` (their KV is written into `cache`) and writes logits
  // [rows, vocab_size] to `logits`: per chunk in order, one row (its last token) or, with
  // all_logits, one row per new token. Invalid chunks (token out of range, position past the
  // context, missing blocks) are rejected before anything is computed.
  // `on_layer_kv(layer)`, when given, is called as soon as the K/V of `layer` for every chunk
  // are final in `cache` (before that layer's attention): the prefill worker ships them then,
  // overlapping the transfer with the remaining layers.
  absl::Status Forward(std::span<const SequenceChunk> batch, KvCache* cache,
                       std::vector<float>* logits,
                       const std::function<void(int layer)>& on_layer_kv = nullptr) const;

 private:
  // Reused by the expert layers of one Forward call.
  struct MoeScratch {
    std::vector<float> router_logits;  // [T, n_experts]
    ExpertRouting routing;
    std::vector<float> in, out;  // [rows, dim] one expert's tokens, gathered, and its output
    std::vector<float> h1, h3;   // [rows, expert_hidden_dim]
    std::vector<float> sum;      // [T, dim] the weighted sum over the chosen experts
  };
  // out[rows, dim] = w2 · (act(w1 · x) * (w3 · x)) for x[rows, dim]; h1, h3 [rows, hidden] are
  // scratch. `out` may be `x`.
  void Mlp(const ExpertWeights& m, const float* x, int rows, float* h1, float* h3,
           float* out) const;
  // The mixture-of-experts MLP of layer `w` over x[T, dim] into out[T, dim] (may be `x`).
  absl::Status MoeMlp(const LayerWeights& w, const float* x, int num_tokens, float* out,
                      MoeScratch* s) const;

  ModelConfig config_;
  ModelWeights weights_;
  Backend* backend_;
  std::vector<float> inv_freq_;        // [head_dim / 2]
  std::vector<float> local_inv_freq_;  // [head_dim / 2] of sliding-window layers
};

// Only the configuration of the model at `path` (directory or checkpoint), for processes that
// need its shape but not its weights (the router).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_H_
