#include "engine/model_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem {

absl::Status ModelConfig::Validate() const {
  auto bad = [](std::string_view field, int64_t v) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model config: %s = %d is invalid", field, v));
  };
  if (dim <= 0) return bad("dim", dim);
  if (hidden_dim <= 0) return bad("hidden_dim", hidden_dim);
  if (n_layers <= 0 || n_layers > 4096) return bad("n_layers", n_layers);
  if (n_heads <= 0) return bad("n_heads", n_heads);
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return bad("n_kv_heads", n_kv_heads);
  if (head_dim <= 0 || head_dim % 2 != 0) return bad("head_dim", head_dim);
  if (vocab_size <= 0) return bad("vocab_size", vocab_size);
  if (max_seq_len <= 0) return bad("max_seq_len", max_seq_len);
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError("model config: rope_theta must be positive");
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps)) {
    return absl::InvalidArgumentError("model config: rms_norm_eps must be positive");
  }
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    return absl::InvalidArgumentError("model config: rope_scaling.factor must be positive");
  }
  for (int id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) return bad("eos_token_id", id);
  }
  if (bos_token_id >= vocab_size) return bad("bos_token_id", bos_token_id);
  if (!sliding_layers.empty() && static_cast<int>(sliding_layers.size()) != n_layers) {
    return bad("layer_types entries", static_cast<int64_t>(sliding_layers.size()));
  }
  if (sliding_window < 0) return bad("sliding_window", sliding_window);
  if (!(embedding_scale > 0) || !std::isfinite(embedding_scale)) {
    return absl::InvalidArgumentError("model config: the embedding scale must be positive");
  }
  if (query_pre_attn_scalar < 0 || !std::isfinite(query_pre_attn_scalar)) {
    return absl::InvalidArgumentError("model config: query_pre_attn_scalar must be positive");
  }
  if (rope_local_theta < 0 || !std::isfinite(rope_local_theta)) {
    return absl::InvalidArgumentError("model config: rope_local_base_freq must be positive");
  }
  if (n_experts < 0 || n_experts > 4096) return bad("num_experts", n_experts);
  if (n_experts > 0) {
    if (n_experts_used < 1 || n_experts_used > n_experts) {
      return bad("num_experts_per_tok", n_experts_used);
    }
    if (expert_hidden_dim <= 0) return bad("moe_intermediate_size", expert_hidden_dim);
  }
  if (!dense_layers.empty() && static_cast<int>(dense_layers.size()) != n_layers) {
    return bad("dense layer entries", static_cast<int64_t>(dense_layers.size()));
  }
  return absl::OkStatus();
}

int ModelConfig::MoeLayers() const {
  int n = 0;
  for (int l = 0; l < n_layers; ++l) n += LayerIsMoe(l);
  return n;
}

bool ModelConfig::MixedLayers() const {
  if (sliding_window == 0 || sliding_layers.empty()) return false;
  return std::any_of(sliding_layers.begin(), sliding_layers.end(), [](uint8_t s) { return s; }) &&
         std::any_of(sliding_layers.begin(), sliding_layers.end(), [](uint8_t s) { return !s; });
}

float ModelConfig::AttentionScale() const {
  const float scalar = query_pre_attn_scalar > 0 ? query_pre_attn_scalar : head_dim;
  return 1.0f / std::sqrt(scalar);
}

std::vector<float> ModelConfig::LocalRopeInvFreq() const {
  if (rope_local_theta <= 0) return RopeInvFreq();
  ModelConfig local = *this;
  local.rope_theta = rope_local_theta;
  local.rope_scaling = RopeScaling{};
  return local.RopeInvFreq();
}

std::vector<float> ModelConfig::RopeInvFreq() const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    if (rope_style == RopeStyle::kInterleaved) {
      // run.c: freq = 1.0f / powf(10000.0f, head_dim / (float)head_size), head_dim = 2i.
      inv[i] =
          1.0f / std::pow(rope_theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    } else {
      // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32.
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
      inv[i] = 1.0f / std::pow(rope_theta, exponent);
    }
  }
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (float& f : inv) f /= rope_scaling.factor;
      break;
    case RopeScaling::Type::kLlama3: {
      // transformers' _compute_llama3_parameters.
      const float old_ctx = static_cast<float>(rope_scaling.original_max_position_embeddings);
      const float low_wavelen = old_ctx / rope_scaling.low_freq_factor;
      const float high_wavelen = old_ctx / rope_scaling.high_freq_factor;
      for (float& f : inv) {
        const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
          f = f / rope_scaling.factor;
        } else {
          const float smooth = (old_ctx / wavelen - rope_scaling.low_freq_factor) /
                               (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
          f = (1.0f - smooth) * f / rope_scaling.factor + smooth * f;
        }
      }
      break;
    }
  }
  return inv;
}

namespace {

using nlohmann::json;

absl::StatusOr<int> GetInt(const json& j, const char* key, std::optional<int> fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrFormat("config.json: missing \"%s\"", key));
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("config.json: \"%s\" is not an integer", key));
  }
  const int64_t v = it->get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat("config.json: \"%s\" out of range", key));
  }
  return static_cast<int>(v);
}

absl::StatusOr<float> GetFloat(const json& j, const char* key, float fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrFormat("config.json: \"%s\" is not a number", key));
  }
  return it->get<float>();
}

// `key` as a string, `fallback` when absent or null. (json::value() would throw on a value of
// another type, and an exception here takes the whole process down.)
absl::StatusOr<std::string> GetString(const json& j, const char* key, std::string fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrFormat("config.json: \"%s\" is not a string", key));
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> GetBool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("config.json: \"%s\" must be a boolean", key));
  }
  return it->get<bool>();
}

}  // namespace

namespace {

// Config fields that change a Llama-family model's math in ways Tandem does not implement: a
// model that sets them must be refused, never run as if they were absent.
absl::Status RefuseUnknownMath(const json& j, const std::string& arch) {
  auto refuse = [](const std::string& field, const json& v) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "config.json: %s = %s changes the model's math and is not supported", field, v.dump()));
  };
  auto is_true = [](const json& v) { return v.is_boolean() && v.get<bool>(); };
  auto set = [](const json& v) { return !v.is_null() && !(v.is_boolean() && !v.get<bool>()); };
  const bool gemma = arch == "Gemma3ForCausalLM";
  const bool qwen3 = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  for (const auto& [key, v] : j.items()) {
    if (key == "mlp_bias" && is_true(v)) return refuse(key, v);
    // EmbeddingGemma: attention in both directions, which no generator computes.
    if (key == "use_bidirectional_attention" && is_true(v)) return refuse(key, v);
    // Llama, Mistral and Qwen3 put attention_bias on o_proj too (Qwen2's q/k/v biases are built
    // in).
    if (key == "attention_bias" && is_true(v) && arch != "Qwen2ForCausalLM") return refuse(key, v);
    // Qwen3's sliding window covers only the layers from max_window_layers on (and
    // transformers' eager attention ignores it); Tandem applies a window to every layer or none.
    if (qwen3 && key == "use_sliding_window" && is_true(v)) {
      return refuse(key, v);
    }
    if (key == "partial_rotary_factor" && !(v.is_number() && v.get<double>() == 1.0))
      return refuse(key, v);
    if ((key == "final_logit_softcapping" || key == "attn_logit_softcapping" ||
         key == "quantization_config" || key == "no_rope_layers" || key == "use_qk_norm" ||
         key == "qk_layernorm" || (key == "query_pre_attn_scalar" && !gemma)) &&
        set(v)) {
      return refuse(key, v);
    }
    if ((key == "logits_scaling" || key == "embedding_multiplier" || key == "residual_multiplier" ||
         key == "attention_multiplier") &&
        !(v.is_number() && v.get<double>() == 1.0)) {
      return refuse(key, v);
    }
    // One kind of attention for every layer: Tandem applies sliding_window to all or none (and
    // Qwen3 to none); Gemma 3 interleaves the two (read in ReadGemma3).
    if (key == "layer_types" && v.is_array() && !v.empty() && !gemma) {
      for (const json& t : v) {
        if (t != v[0] || (t != "full_attention" && t != "sliding_attention") ||
            (qwen3 && t != "full_attention")) {
          return refuse(key, v);
        }
      }
    }
  }
  return absl::OkStatus();
}

// The architecture config.json names, which must be one Tandem runs.
absl::StatusOr<std::string> SupportedArchitecture(const json& j) {
  std::string arch;
  if (auto it = j.find("architectures");
      it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  auto model_type_or = GetString(j, "model_type", "");
  if (!model_type_or.ok()) return model_type_or.status();
  const std::string model_type = *std::move(model_type_or);
  static const char* kSupported[] = {
      "LlamaForCausalLM",  "MistralForCausalLM",  "Qwen2ForCausalLM",  "Qwen3ForCausalLM",
      "Gemma3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"};
  bool supported = false;
  for (const char* s : kSupported) supported |= arch == s;
  if (!supported) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "config.json: unsupported architecture \"%s\" (model_type \"%s\"); supported: "
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "Gemma3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM",
        arch, model_type));
  }
  return arch;
}

// The model's shape: sizes, layer and head counts, vocabulary and context length. `arch` picks
// the default head_dim: hidden_size / num_attention_heads, but 128 for Qwen3 and 256 for Gemma 3
// (their configs' defaults).
absl::Status ReadShape(const json& j, const std::string& arch, ModelConfig* c) {
  auto assign = [](int& dst, absl::StatusOr<int> v) -> absl::Status {
    if (!v.ok()) return v.status();
    dst = *v;
    return absl::OkStatus();
  };
  absl::Status s;
  if (!(s = assign(c->dim, GetInt(j, "hidden_size", std::nullopt))).ok()) return s;
  if (!(s = assign(c->hidden_dim, GetInt(j, "intermediate_size", std::nullopt))).ok()) return s;
  if (!(s = assign(c->n_layers, GetInt(j, "num_hidden_layers", std::nullopt))).ok()) return s;
  if (!(s = assign(c->n_heads, GetInt(j, "num_attention_heads", std::nullopt))).ok()) return s;
  if (!(s = assign(c->n_kv_heads, GetInt(j, "num_key_value_heads", c->n_heads))).ok()) return s;
  if (!(s = assign(c->vocab_size, GetInt(j, "vocab_size", std::nullopt))).ok()) return s;
  if (!(s = assign(c->max_seq_len, GetInt(j, "max_position_embeddings", 2048))).ok()) return s;
  if (c->n_heads <= 0) return absl::InvalidArgumentError("config.json: num_attention_heads <= 0");
  const int default_head_dim = arch == "Qwen3ForCausalLM"    ? 128
                               : arch == "Gemma3ForCausalLM" ? 256
                                                             : c->dim / c->n_heads;
  if (!(s = assign(c->head_dim, GetInt(j, "head_dim", default_head_dim))).ok()) return s;
  return absl::OkStatus();
}

// The object holding the rope settings: "rope_parameters" or the legacy "rope_scaling"; null when
// there is neither.
absl::StatusOr<const json*> FindRopeParameters(const json& j, bool gemma) {
  // transformers 5 writes rope_theta and the scaling together as "rope_parameters"; for Gemma 3,
  // one set per layer type, of which the global layers' is the model's.
  const json* rope = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError("config.json: rope_parameters must be an object");
    }
    if (gemma && it->contains("full_attention")) {
      const json& full = (*it)["full_attention"];
      if (!full.is_object()) {
        return absl::InvalidArgumentError(
            "config.json: rope_parameters.full_attention must be an object");
      }
      return &full;
    }
    if (!it->contains("rope_type") && !it->contains("rope_theta")) {
      return absl::InvalidArgumentError(
          "config.json: rope_parameters per layer type is not supported (one set for every "
          "layer, with rope_type and rope_theta)");
    }
    if (auto legacy = j.find("rope_scaling"); legacy != j.end() && !legacy->is_null()) {
      return absl::InvalidArgumentError(
          "config.json: both rope_parameters and rope_scaling are given; keep one");
    }
    rope = &*it;
  } else if (auto legacy = j.find("rope_scaling"); legacy != j.end() && !legacy->is_null()) {
    if (!legacy->is_object())
      return absl::InvalidArgumentError("config.json: rope_scaling must be an object");
    rope = &*legacy;
  }
  return rope;
}

// rope_theta, from the top level or `rope` (which may be null); the two must agree.
absl::StatusOr<float> ReadRopeTheta(const json& j, const json* rope) {
  auto top_theta = GetFloat(j, "rope_theta", 10000.0f);
  if (!top_theta.ok()) return top_theta.status();
  auto theta = rope != nullptr ? GetFloat(*rope, "rope_theta", *top_theta) : top_theta;
  if (!theta.ok()) return theta.status();
  if (rope != nullptr && rope->contains("rope_theta") && j.contains("rope_theta") &&
      *theta != *top_theta) {
    return absl::InvalidArgumentError(
        absl::StrFormat("config.json: rope_theta %g disagrees with rope_parameters.rope_theta %g",
                        *top_theta, *theta));
  }
  return *theta;
}

// The rope scaling type and its parameters from the rope settings object `rope`.
absl::Status ReadRopeScaling(const json& rope, RopeScaling* scaling) {
  const json* it = &rope;
  auto legacy_type = GetString(*it, "type", "");
  if (!legacy_type.ok()) return legacy_type.status();
  auto type_or = GetString(*it, "rope_type", *legacy_type);
  if (!type_or.ok()) return type_or.status();
  const std::string type = *std::move(type_or);
  auto factor = GetFloat(*it, "factor", 1.0f);
  if (!factor.ok()) return factor.status();
  scaling->factor = *factor;
  if (type == "default") {
    scaling->type = RopeScaling::Type::kNone;
  } else if (type == "linear") {
    scaling->type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    scaling->type = RopeScaling::Type::kLlama3;
    auto lo = GetFloat(*it, "low_freq_factor", 1.0f);
    auto hi = GetFloat(*it, "high_freq_factor", 4.0f);
    auto orig = GetInt(*it, "original_max_position_embeddings", 8192);
    if (!lo.ok()) return lo.status();
    if (!hi.ok()) return hi.status();
    if (!orig.ok()) return orig.status();
    scaling->low_freq_factor = *lo;
    scaling->high_freq_factor = *hi;
    scaling->original_max_position_embeddings = *orig;
    if (!(*hi > *lo)) {
      return absl::InvalidArgumentError(
          "config.json: rope_scaling.high_freq_factor must exceed low_freq_factor");
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("config.json: unsupported rope type \"%s\" (Tandem has default, "
                        "linear and llama3)",
                        type));
  }
  return absl::OkStatus();
}

// Appends eos_token_id (one id or a list of them), when present, to `eos_token_ids`.
absl::Status ReadEosTokenIds(const json& j, std::vector<int>* eos_token_ids) {
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    // An id outside int32 must not wrap into a valid one.
    auto push = [&eos_token_ids](const json& e) {
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX) ||
          e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX) {
        return false;
      }
      eos_token_ids->push_back(static_cast<int>(e.get<int64_t>()));
      return true;
    };
    if (it->is_number_integer()) {
      if (!push(*it)) return absl::InvalidArgumentError("config.json: eos_token_id out of range");
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!push(e)) {
          return absl::InvalidArgumentError(
              "config.json: eos_token_id entries must be integers in range");
        }
      }
    } else {
      return absl::InvalidArgumentError("config.json: eos_token_id must be an integer or a list");
    }
  }
  return absl::OkStatus();
}

// Gemma 3's departures from the Llama layout (Gemma3TextConfig's fields and defaults): GeGLU,
// sqrt(hidden_size) embedding scale, sandwich norms, query_pre_attn_scalar, and the layer types
// (layer_types, else every sliding_window_pattern-th layer global) with the sliding layers'
// RoPE base. `c` already holds the shape, rope_theta and the sliding window.
absl::Status ReadGemma3(const json& j, ModelConfig* c) {
  auto act = GetString(j, "hidden_activation", "gelu_pytorch_tanh");
  if (!act.ok()) return act.status();
  if (*act != "gelu_pytorch_tanh" && *act != "gelu_tanh") {
    return absl::InvalidArgumentError(
        absl::StrFormat("config.json: hidden_activation \"%s\" is not supported (Gemma 3 uses "
                        "gelu_pytorch_tanh)",
                        *act));
  }
  c->hidden_act = Activation::kGeluTanh;
  c->sandwich_norms = true;
  c->qk_norm = true;
  // transformers keeps sqrt(hidden_size) as a float32 tensor.
  c->embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c->dim)));
  auto scalar = GetFloat(j, "query_pre_attn_scalar", 256.0f);
  if (!scalar.ok()) return scalar.status();
  if (!(*scalar > 0)) {
    return absl::InvalidArgumentError("config.json: query_pre_attn_scalar must be positive");
  }
  c->query_pre_attn_scalar = *scalar;
  // The sliding layers' RoPE base: rope_local_base_freq, or transformers 5's
  // rope_parameters.sliding_attention (which must not scale).
  auto local = GetFloat(j, "rope_local_base_freq", 10000.0f);
  if (!local.ok()) return local.status();
  c->rope_local_theta = *local;
  if (auto it = j.find("rope_parameters");
      it != j.end() && it->is_object() && it->contains("sliding_attention")) {
    const json& sliding = (*it)["sliding_attention"];
    if (!sliding.is_object()) {
      return absl::InvalidArgumentError(
          "config.json: rope_parameters.sliding_attention must be an object");
    }
    RopeScaling none;
    if (absl::Status s = ReadRopeScaling(sliding, &none); !s.ok()) return s;
    if (none.type != RopeScaling::Type::kNone) {
      return absl::InvalidArgumentError(
          "config.json: rope scaling of the sliding layers (rope_parameters.sliding_attention) "
          "is not supported");
    }
    auto theta = GetFloat(sliding, "rope_theta", c->rope_local_theta);
    if (!theta.ok()) return theta.status();
    c->rope_local_theta = *theta;
  }
  if (!j.contains("sliding_window")) c->sliding_window = 4096 < c->max_seq_len ? 4096 : 0;
  c->sliding_layers.assign(c->n_layers, 0);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int>(it->size()) != c->n_layers) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "config.json: layer_types must list one type per layer (%d)", c->n_layers));
    }
    for (int l = 0; l < c->n_layers; ++l) {
      const json& t = (*it)[l];
      if (t != "sliding_attention" && t != "full_attention") {
        return absl::InvalidArgumentError(
            absl::StrFormat("config.json: layer_types[%d] = %s (Tandem has sliding_attention and "
                            "full_attention)",
                            l, t.dump()));
      }
      c->sliding_layers[l] = t == "sliding_attention";
    }
  } else {
    auto pattern = GetInt(j, "sliding_window_pattern", 6);
    if (!pattern.ok()) return pattern.status();
    if (*pattern <= 0) {
      return absl::InvalidArgumentError("config.json: sliding_window_pattern must be positive");
    }
    for (int l = 0; l < c->n_layers; ++l) c->sliding_layers[l] = (l + 1) % *pattern != 0;
  }
  return absl::OkStatus();
}

// The experts of Qwen3MoeConfig (num_experts, num_experts_per_tok, moe_intermediate_size,
// norm_topk_prob, and the dense layers mlp_only_layers and decoder_sparse_step leave) or of
// MixtralConfig (num_local_experts and num_experts_per_tok, each expert intermediate_size wide,
// weights always renormalised), with those classes' defaults.
absl::Status ReadExperts(const json& j, const std::string& arch, ModelConfig* c) {
  const bool mixtral = arch == "MixtralForCausalLM";
  auto experts = GetInt(j, mixtral ? "num_local_experts" : "num_experts", mixtral ? 8 : 128);
  auto used = GetInt(j, "num_experts_per_tok", mixtral ? 2 : 8);
  auto hidden =
      mixtral ? absl::StatusOr<int>(c->hidden_dim) : GetInt(j, "moe_intermediate_size", 768);
  auto norm = GetBool(j, "norm_topk_prob", mixtral);
  auto step = GetInt(j, "decoder_sparse_step", 1);
  if (!experts.ok()) return experts.status();
  if (!used.ok()) return used.status();
  if (!hidden.ok()) return hidden.status();
  if (!norm.ok()) return norm.status();
  if (!step.ok()) return step.status();
  if (mixtral && j.contains("norm_topk_prob") && !*norm) {
    return absl::InvalidArgumentError(
        "config.json: norm_topk_prob = false is not Mixtral's routing (it renormalises)");
  }
  if (*experts < (mixtral ? 1 : 0) || *used < 0 || *hidden <= 0 || *step <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "config.json: %s = %d, num_experts_per_tok = %d, moe_intermediate_size = %d, "
        "decoder_sparse_step = %d: each must be positive",
        mixtral ? "num_local_experts" : "num_experts", *experts, *used, *hidden, *step));
  }
  c->n_experts = *experts;
  c->n_experts_used = *used;
  c->expert_hidden_dim = *hidden;
  c->norm_topk_prob = *norm;
  if (c->n_experts == 0) return absl::OkStatus();  // every layer dense
  // Qwen3-MoE: a layer is dense when listed in mlp_only_layers or off the sparse step.
  std::vector<uint8_t> dense(c->n_layers, 0);
  bool any_dense = false;
  for (int l = 0; l < c->n_layers; ++l) {
    dense[l] = (l + 1) % *step != 0;
    any_dense |= dense[l] != 0;
  }
  if (auto it = j.find("mlp_only_layers"); !mixtral && it != j.end() && !it->is_null()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError("config.json: mlp_only_layers must be a list of layers");
    }
    for (const json& e : *it) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c->n_layers) {
        return absl::InvalidArgumentError(
            absl::StrFormat("config.json: mlp_only_layers entry %s is not a layer index below %d",
                            e.dump(), c->n_layers));
      }
      dense[e.get<int64_t>()] = 1;
      any_dense = true;
    }
  }
  if (any_dense) c->dense_layers = std::move(dense);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromHfJson(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  ModelConfig c;
  c.rope_style = RopeStyle::kHalf;
  auto arch_or = SupportedArchitecture(j);
  if (!arch_or.ok()) return arch_or.status();
  const std::string arch = *std::move(arch_or);
  c.architecture = arch;
  if (arch != "Gemma3ForCausalLM") {
    if (auto it = j.find("hidden_act"); it != j.end() && it->is_string() && *it != "silu") {
      return absl::InvalidArgumentError("config.json: hidden_act must be \"silu\"");
    }
  }
  if (absl::Status s = ReadShape(j, arch, &c); !s.ok()) return s;
  if (absl::Status unsupported = RefuseUnknownMath(j, arch); !unsupported.ok()) return unsupported;
  auto rope_or = FindRopeParameters(j, arch == "Gemma3ForCausalLM");
  if (!rope_or.ok()) return rope_or.status();
  const json* rope = *rope_or;
  auto theta = ReadRopeTheta(j, rope);
  if (!theta.ok()) return theta.status();
  c.rope_theta = *theta;
  auto eps = GetFloat(j, "rms_norm_eps", 1e-6f);
  if (!eps.ok()) return eps.status();
  c.norm_eps = *eps;
  auto tie =
      GetBool(j, "tie_word_embeddings", arch == "Qwen2ForCausalLM" || arch == "Gemma3ForCausalLM");
  if (!tie.ok()) return tie.status();
  c.tie_word_embeddings = *tie;
  // Mistral's sliding window. Qwen2 and Qwen3 name one too but use it only with
  // use_sliding_window (false unless set, as in transformers; Qwen3's true is refused above), and
  // Qwen2 then only on the layers from max_window_layers on: every layer or none is what Tandem
  // computes, anything between is refused by name.
  const bool qwen =
      arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  auto use_sliding_window = GetBool(j, "use_sliding_window", !qwen);
  if (!use_sliding_window.ok()) return use_sliding_window.status();
  if (arch == "Qwen2ForCausalLM" && *use_sliding_window) {
    auto first_windowed = GetInt(j, "max_window_layers", 28);
    if (!first_windowed.ok()) return first_windowed.status();
    if (*first_windowed >= c.n_layers) {
      *use_sliding_window = false;
    } else if (*first_windowed > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "config.json: max_window_layers = %d windows only layers %d..%d of %d (sliding window "
          "on some layers and not others) and is not supported",
          *first_windowed, *first_windowed, c.n_layers - 1, c.n_layers));
    }
  }
  if (auto it = j.find("sliding_window");
      it != j.end() && it->is_number_integer() && *use_sliding_window) {
    // (int64: get<int> would wrap a huge window into an arbitrary one.)
    const int64_t window = it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX
                               ? INT64_MAX
                               : it->get<int64_t>();
    // Negative means none; a window the context never reaches is none too.
    c.sliding_window = window <= 0 || window >= c.max_seq_len ? 0 : static_cast<int>(window);
  }
  c.qkv_bias = arch == "Qwen2ForCausalLM";
  c.qk_norm = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  if (auto it = j.find("attention_bias"); it != j.end() && it->is_boolean()) {
    c.qkv_bias = c.qkv_bias || it->get<bool>();
  }
  if (rope != nullptr) {
    if (absl::Status s = ReadRopeScaling(*rope, &c.rope_scaling); !s.ok()) return s;
  }
  if (arch == "Gemma3ForCausalLM") {
    if (absl::Status s = ReadGemma3(j, &c); !s.ok()) return s;
  }
  if (arch == "Qwen3MoeForCausalLM" || arch == "MixtralForCausalLM") {
    if (absl::Status s = ReadExperts(j, arch, &c); !s.ok()) return s;
  }
  auto bos = GetInt(j, "bos_token_id", -1);
  if (!bos.ok()) return bos.status();
  c.bos_token_id = *bos;
  if (absl::Status s = ReadEosTokenIds(j, &c.eos_token_ids); !s.ok()) return s;
  if (absl::Status v = c.Validate(); !v.ok()) return v;
  return c;
}

std::string ModelConfig::ToHfJson(std::string_view torch_dtype) const {
  json j;
  j["architectures"] = {architecture == "llama2c" ? "LlamaForCausalLM" : architecture};
  j["model_type"] = architecture == "Qwen2ForCausalLM"      ? "qwen2"
                    : architecture == "Qwen3ForCausalLM"    ? "qwen3"
                    : architecture == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                    : architecture == "MixtralForCausalLM"  ? "mixtral"
                    : architecture == "Gemma3ForCausalLM"   ? "gemma3_text"
                    : architecture == "MistralForCausalLM"  ? "mistral"
                                                            : "llama";
  j["hidden_size"] = dim;
  j["intermediate_size"] = hidden_dim;
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_seq_len;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = norm_eps;
  if (hidden_act == Activation::kGeluTanh) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
  } else {
    j["hidden_act"] = "silu";
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = qkv_bias;
  if (sliding_window > 0) j["sliding_window"] = sliding_window;
  if (architecture == "Gemma3ForCausalLM") {
    j["query_pre_attn_scalar"] = query_pre_attn_scalar;
    j["rope_local_base_freq"] = rope_local_theta;
    json types = json::array();
    for (uint8_t s : sliding_layers) types.push_back(s ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (architecture == "MixtralForCausalLM") {
    j["num_local_experts"] = n_experts;
    j["num_experts_per_tok"] = n_experts_used;
  } else if (architecture == "Qwen3MoeForCausalLM") {
    j["num_experts"] = n_experts;
    j["num_experts_per_tok"] = n_experts_used;
    j["moe_intermediate_size"] = expert_hidden_dim;
    j["norm_topk_prob"] = norm_topk_prob;
    json dense = json::array();
    for (int l = 0; l < static_cast<int>(dense_layers.size()); ++l) {
      if (dense_layers[l]) dense.push_back(l);
    }
    j["mlp_only_layers"] = dense;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  if (rope_scaling.type == RopeScaling::Type::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  } else if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  j["torch_dtype"] = std::string(torch_dtype);
  return j.dump(2) + "\n";
}

}  // namespace tandem
