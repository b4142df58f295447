// A model's weights as the loaders read them (memory-mapped where the file's layout allows,
// converted into owned buffers where not), and the loaders of each format: the layer below the
// model (engine/model.h), which computes with them.
#ifndef TANDEM_ENGINE_LOADERS_MODEL_WEIGHTS_H_
#define TANDEM_ENGINE_LOADERS_MODEL_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "formats/mapped_file.h"
#include "kernels/backend.h"

namespace tandem {

// One SwiGLU/GeGLU MLP: a dense layer's, or one expert of a mixture.
struct ExpertWeights {
  WeightRef w1;  // gate [expert_hidden_dim, dim]
  WeightRef w2;  // down [dim, expert_hidden_dim]
  WeightRef w3;  // up [expert_hidden_dim, dim]
};

struct LayerWeights {
  WeightRef wq;                           // [q_dim, dim]
  WeightRef wk;                           // [kv_dim, dim]
  WeightRef wv;                           // [kv_dim, dim]
  WeightRef wo;                           // [dim, q_dim]
  WeightRef w1;                           // gate [hidden_dim, dim]
  WeightRef w2;                           // down [dim, hidden_dim]
  WeightRef w3;                           // up [hidden_dim, dim]
  const float* attn_norm = nullptr;       // [dim]
  const float* ffn_norm = nullptr;        // [dim]
  const float* bq = nullptr;              // [q_dim] or nullptr
  const float* bk = nullptr;              // [kv_dim] or nullptr
  const float* bv = nullptr;              // [kv_dim] or nullptr
  const float* q_norm = nullptr;          // [head_dim], shared by every query head; or nullptr
  const float* k_norm = nullptr;          // [head_dim], shared by every KV head; or nullptr
  const float* post_attn_norm = nullptr;  // [dim] Gemma: on the attention output; or nullptr
  const float* post_ffn_norm = nullptr;   // [dim] Gemma: on the MLP output; or nullptr
  // A mixture-of-experts layer (ModelConfig::LayerIsMoe): the router and the experts, in place of
  // w1/w2/w3 (which are then empty).
  WeightRef router;                    // [n_experts, dim]
  std::vector<ExpertWeights> experts;  // [n_experts]

  // Every matrix the layer holds (attention, MLP, router, experts), for code that treats them
  // alike (conversion, sizes, uploads).
  std::vector<const WeightRef*> Matrices() const;
  std::vector<WeightRef*> MutableMatrices();
};

struct ModelWeights {
  WeightRef token_embedding;  // [vocab_size, dim]
  std::vector<LayerWeights> layers;
  const float* final_norm = nullptr;  // [dim]
  WeightRef classifier;               // [vocab_size, dim]; == token_embedding when tied

  // What the pointers above point into.
  std::vector<std::shared_ptr<MappedFile>> files;
  std::vector<std::vector<float>> owned;           // small tensors converted to float32
  std::vector<std::vector<uint16_t>> owned16;      // matrices converted to f16/bf16 at load
  std::vector<std::vector<uint8_t>> owned_blocks;  // matrices quantized at load

  // Converts a tensor of any dtype to float32 kept in `owned`.
  const float* Own(DType dtype, const void* data, int64_t n);
  // Converts every matrix not already stored as `dtype` into a buffer owned here (a tied
  // classifier stays the same buffer as the embedding). To a quantized dtype, a matrix whose
  // rows are not whole blocks of it takes the nearest type with 32-element blocks, as
  // llama.cpp's quantizer does (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0; rows that are not
  // whole 32-element blocks: f16).
  void ConvertMatrices(DType dtype);
};

// Where a transformers 4 checkpoint keeps layer `layer`'s mixture of experts: the router is
// router(), expert e's matrices gate(e), up(e) and down(e). Qwen3-MoE: model.layers.L.mlp.gate and
// mlp.experts.E.{gate,up,down}_proj; Mixtral: block_sparse_moe.gate and
// block_sparse_moe.experts.E.{w1,w3,w2}.
struct HfMoeNames {
  HfMoeNames(const ModelConfig& c, int layer);
  std::string prefix;  // "model.layers.L.mlp." or "model.layers.L.block_sparse_moe."
  bool mixtral;
  std::string router() const { return prefix + "gate.weight"; }
  std::string gate(int e) const { return Expert(e, mixtral ? "w1" : "gate_proj"); }
  std::string up(int e) const { return Expert(e, mixtral ? "w3" : "up_proj"); }
  std::string down(int e) const { return Expert(e, mixtral ? "w2" : "down_proj"); }

 private:
  std::string Expert(int e, const char* name) const;
};

// llama2.c checkpoint (the legacy 7-int header; shared or separate classifier).
absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadLlama2cCheckpoint(const std::string& path);
// The same for a checkpoint already open (or held in memory); errors name file->path().
absl::StatusOr<std::pair<ModelConfig, ModelWeights>> ParseLlama2cCheckpoint(
    std::shared_ptr<MappedFile> file);
// Hugging Face directory: config.json + model.safetensors or model.safetensors.index.json.
absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadHfModel(const std::string& dir);
class GgufFile;
// GGUF file (formats/gguf.h): architectures llama (with experts: Mixtral), mistral, qwen2, qwen3,
// qwen3moe and gemma3; from a path or a file already read.
absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadGgufModel(const std::string& path);
absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadGgufModel(const GgufFile& file);
// The configuration a GGUF file's metadata describes; a metadata key that changes the math and
// that Tandem does not implement is UNIMPLEMENTED naming it.
absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file);

}  // namespace tandem

#endif  // TANDEM_ENGINE_LOADERS_MODEL_WEIGHTS_H_
