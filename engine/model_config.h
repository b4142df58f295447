// The shape and hyper-parameters of a Llama-family, Gemma 3 or mixture-of-experts (Qwen3-MoE,
// Mixtral) model, from a llama2.c header, a GGUF file's metadata or a Hugging Face config.json.
#ifndef TANDEM_ENGINE_MODEL_CONFIG_H_
#define TANDEM_ENGINE_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace tandem {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  // Llama 3 only.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

// The activation of the MLP's gate: out = act(gate) * up.
enum class Activation : uint8_t {
  kSilu,      // SwiGLU: Llama, Mistral, Qwen
  kGeluTanh,  // GeGLU with PyTorch's tanh-approximated GELU: Gemma
};

struct ModelConfig {
  std::string architecture;  // "llama2c", "LlamaForCausalLM", "MistralForCausalLM", ...
  int dim = 0;               // hidden size
  int hidden_dim = 0;        // MLP intermediate size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_seq_len = 0;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kHalf;
  RopeScaling rope_scaling;
  int sliding_window = 0;           // attend to at most this many positions; 0 = all
  bool qkv_bias = false;            // Qwen2: q/k/v projections carry a bias
  bool qk_norm = false;             // Qwen3: RMSNorm over each head of q and k, before RoPE
  bool tie_word_embeddings = true;  // classifier shares the token embedding
  // Gemma 3: GeGLU, embeddings scaled by sqrt(dim), a norm after attention and after the MLP as
  // well as before, its own attention scale, and sliding-window layers interleaved with global
  // ones that rotate with their own RoPE base. The defaults are the Llama family's.
  Activation hidden_act = Activation::kSilu;
  float embedding_scale = 1.0f;     // token embeddings are multiplied by this
  bool sandwich_norms = false;      // RMSNorm of the attention and MLP outputs before the residual
  float query_pre_attn_scalar = 0;  // attention scores are scaled by 1/sqrt(this); 0 = head_dim
  std::vector<uint8_t> sliding_layers;  // [n_layers] 1 = the window applies; empty = every layer
  float rope_local_theta = 0;           // RoPE base of sliding layers (unscaled); 0 = rope_theta
  // Mixture of experts (Qwen3-MoE, Mixtral): the MLP of an expert layer is n_experts SwiGLU
  // MLPs of expert_hidden_dim; a linear router scores them per token, softmax over all of them,
  // and the token goes through the n_experts_used best, its output their weighted sum.
  int n_experts = 0;           // 0 = a dense model
  int n_experts_used = 0;      // top-k
  int expert_hidden_dim = 0;   // each expert's intermediate size
  bool norm_topk_prob = true;  // the k weights are renormalised to sum to 1 (Mixtral: always)
  std::vector<uint8_t> dense_layers;  // [n_layers] 1 = a dense MLP of hidden_dim; empty = none
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  // generation stops when one of these is produced

  int q_dim() const { return n_heads * head_dim; }
  // The window layer `l` attends within; 0 = every earlier position.
  int LayerWindow(int l) const {
    return sliding_layers.empty() || sliding_layers[l] ? sliding_window : 0;
  }
  // Whether layer `l` is one of the sliding-window layers of a model that has both kinds (its
  // RoPE base is rope_local_theta).
  bool LayerIsLocal(int l) const { return !sliding_layers.empty() && sliding_layers[l]; }
  // Whether some layers slide and others do not (Gemma 3).
  bool MixedLayers() const;
  // 1/sqrt(query_pre_attn_scalar, else head_dim).
  float AttentionScale() const;
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Whether layer `l`'s MLP is a mixture of experts.
  bool LayerIsMoe(int l) const {
    return n_experts > 0 && (dense_layers.empty() || !dense_layers[l]);
  }
  // The number of expert layers.
  int MoeLayers() const;

  // Checks the numbers are positive and consistent (heads divide, head_dim even, ...).
  absl::Status Validate() const;

  // inv_freq[head_dim / 2] for RoPE, with rope_scaling applied, computed as the reference
  // implementation of each format does (llama2.c: 1 / powf(theta, 2i / head_dim) in float;
  // Hugging Face: float32 theta ** (2i / head_dim)).
  std::vector<float> RopeInvFreq() const;
  // inv_freq of the sliding-window layers: rope_local_theta without scaling, when it is set;
  // else RopeInvFreq().
  std::vector<float> LocalRopeInvFreq() const;

  // Parses a Hugging Face config.json (Llama, Mistral, Qwen2, Qwen3 and their relatives).
  static absl::StatusOr<ModelConfig> FromHfJson(const std::string& json_text);
  // The config.json that FromHfJson reads back into this config; `torch_dtype` names the
  // weights' type ("float32", "bfloat16", "float16").
  std::string ToHfJson(std::string_view torch_dtype = "float32") const;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_CONFIG_H_
