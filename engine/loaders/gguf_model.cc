// Llama-family, Gemma 3 and mixture-of-experts models from GGUF files (architectures llama,
// mistral, qwen2, qwen3, qwen3moe and gemma3; a llama file with experts is Mixtral) on the model
// code every other format uses; each expert is a slice of its layer's stacked ffn_*_exps tensor.
// Matrices stay in the mapping as stored (F32, F16, BF16 or a block-quantized type), except the
// query and key projections of llama and mistral files: llama.cpp's converter reorders their rows
// for its interleaved rotary embedding, so they are copied back into Hugging Face order (whole rows
// move; quantized rows move as they are).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/loaders/model_weights.h"
#include "formats/gguf.h"
#include "kernels/quant.h"

namespace tandem {
namespace {

// The metadata keys of an architecture that change the math and that this loader reads; a key
// under "ARCH." that is not here (or below) and not known to be harmless is refused by name.
const char* const kReadKeys[] = {
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "rope.freq_base",
    "rope.dimension_count",
    "vocab_size",
    "rope.scaling.type",
    "rope.scaling.factor",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
};
// Keys that do not change the forward pass.
const char* const kHarmlessKeys[] = {
    "tensor_data_layout", "rope.scaling.original_context_length", "rope.scaling.finetuned",
    "attention.layer_norm_epsilon",  // a LayerNorm eps: Llama models use the RMS one
};

absl::Status CheckArchitectureKeys(const GgufFile& f, const std::string& arch) {
  const std::string prefix = arch + ".";
  for (const auto& [key, value] : f.metadata()) {
    if (!key.starts_with(prefix)) continue;
    const std::string rest = key.substr(prefix.size());
    const bool known = std::any_of(std::begin(kReadKeys), std::end(kReadKeys),
                                   [&](const char* k) { return rest == k; }) ||
                       std::any_of(std::begin(kHarmlessKeys), std::end(kHarmlessKeys),
                                   [&](const char* k) { return rest == k; });
    if (!known) {
      return absl::UnimplementedError(absl::StrFormat(
          "%s: metadata %s changes the model in a way Tandem does not implement", f.path(), key));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PositiveInt(const GgufFile& f, const std::string& key,
                                std::optional<int64_t> fallback = std::nullopt) {
  auto v = fallback ? f.Int(key, *fallback) : f.Int(key);
  if (!v.ok()) return v.status();
  if (*v <= 0 || *v > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s is %d", f.path(), key, *v));
  }
  return static_cast<int>(*v);
}

// What a gemma3 file leaves to the reader (llama.cpp fixes the same values): every sixth layer
// global and the others sliding, the sliding layers' RoPE base 10000, the attention scale
// 1/sqrt(head_dim) (1/sqrt(hidden / heads) for the 62-layer 27B), embeddings times sqrt(hidden),
// and <end_of_turn> as a stop beside the EOS token.
void SetGemma3Layout(const GgufFile& f, ModelConfig* c) {
  c->sliding_layers.assign(c->n_layers, 0);
  for (int l = 0; l < c->n_layers; ++l) c->sliding_layers[l] = (l + 1) % 6 != 0;
  c->rope_local_theta = 10000.0f;
  c->query_pre_attn_scalar =
      static_cast<float>(c->n_layers == 62 ? c->dim / c->n_heads : c->head_dim);
  c->embedding_scale = std::sqrt(static_cast<float>(c->dim));
  if (const GgufValue* tokens = f.Find("tokenizer.ggml.tokens")) {
    for (size_t i = 0; i < tokens->strings.size(); ++i) {
      if (tokens->strings[i] != "<end_of_turn>") continue;
      const int id = static_cast<int>(i);
      if (std::find(c->eos_token_ids.begin(), c->eos_token_ids.end(), id) ==
          c->eos_token_ids.end()) {
        c->eos_token_ids.push_back(id);
      }
      break;
    }
  }
}

// The experts of a qwen3moe file, or of a llama file that has them (Mixtral): every layer a
// mixture, each token's top-k weights renormalised (llama.cpp fixes both for these
// architectures). `p` is the metadata prefix ("qwen3moe.").
absl::Status ReadExperts(const GgufFile& f, const std::string& p, ModelConfig* c) {
  auto experts = f.Int(p + "expert_count", 0);
  if (!experts.ok()) return experts.status();
  if (*experts == 0 && c->architecture != "Qwen3MoeForCausalLM") return absl::OkStatus();
  auto count = PositiveInt(f, p + "expert_count");
  auto used = PositiveInt(f, p + "expert_used_count");
  auto hidden = PositiveInt(f, p + "expert_feed_forward_length", c->hidden_dim);
  for (const auto* v : {&count, &used, &hidden}) {
    if (!v->ok()) return v->status();
  }
  if (c->architecture == "LlamaForCausalLM") c->architecture = "MixtralForCausalLM";
  if (c->architecture != "MixtralForCausalLM" && c->architecture != "Qwen3MoeForCausalLM") {
    return absl::UnimplementedError(
        absl::StrFormat("%s: %sexpert_count: experts in a %s file are not implemented", f.path(), p,
                        c->architecture));
  }
  c->n_experts = *count;
  c->n_experts_used = *used;
  c->expert_hidden_dim = *hidden;
  c->norm_topk_prob = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& f) {
  auto arch = f.String("general.architecture");
  if (!arch.ok()) return arch.status();
  ModelConfig c;
  if (*arch == "llama" || *arch == "mistral") {
    c.architecture = *arch == "llama" ? "LlamaForCausalLM" : "MistralForCausalLM";
  } else if (*arch == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
    c.qkv_bias = true;
  } else if (*arch == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
    c.qk_norm = true;
  } else if (*arch == "qwen3moe") {
    c.architecture = "Qwen3MoeForCausalLM";
    c.qk_norm = true;
  } else if (*arch == "gemma3") {
    c.architecture = "Gemma3ForCausalLM";
    c.qk_norm = true;
    c.sandwich_norms = true;
    c.hidden_act = Activation::kGeluTanh;
  } else {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: architecture \"%s\" (Tandem runs llama, mistral, qwen2, qwen3, qwen3moe and gemma3)",
        f.path(), *arch));
  }
  if (absl::Status s = CheckArchitectureKeys(f, *arch); !s.ok()) return s;
  const std::string p = *arch + ".";
  auto scaling = f.String(p + "rope.scaling.type");
  if (scaling.ok() && *scaling == "linear") {
    auto factor = f.Float(p + "rope.scaling.factor", 1.0);
    if (!factor.ok()) return factor.status();
    if (!(*factor > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %srope.scaling.factor must be positive", f.path(), p));
    }
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    c.rope_scaling.factor = static_cast<float>(*factor);
  } else if (scaling.ok() && *scaling != "none") {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: %srope.scaling.type \"%s\" is not implemented", f.path(), p, *scaling));
  }
  if (f.Tensor("rope_freqs.weight") != nullptr) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 scaling) are not "
        "implemented for GGUF files",
        f.path()));
  }
  auto dim = PositiveInt(f, p + "embedding_length");
  auto layers = PositiveInt(f, p + "block_count");
  auto hidden = PositiveInt(f, p + "feed_forward_length");
  auto heads = PositiveInt(f, p + "attention.head_count");
  auto ctx = PositiveInt(f, p + "context_length");
  for (const auto* v : {&dim, &layers, &hidden, &heads, &ctx}) {
    if (!v->ok()) return v->status();
  }
  auto kv_heads = PositiveInt(f, p + "attention.head_count_kv", *heads);
  if (!kv_heads.ok()) return kv_heads.status();
  auto head_dim = PositiveInt(f, p + "attention.key_length", *dim / *heads);
  if (!head_dim.ok()) return head_dim.status();
  auto value_dim = PositiveInt(f, p + "attention.value_length", *head_dim);
  auto rope_dim = PositiveInt(f, p + "rope.dimension_count", *head_dim);
  if (!value_dim.ok()) return value_dim.status();
  if (!rope_dim.ok()) return rope_dim.status();
  if (*value_dim != *head_dim || *rope_dim != *head_dim) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: key length %d, value length %d and rotary dimensions %d differ (Tandem rotates "
        "whole heads of one size)",
        f.path(), *head_dim, *value_dim, *rope_dim));
  }
  auto theta = f.Float(p + "rope.freq_base", 10000.0);
  auto eps = f.Float(p + "attention.layer_norm_rms_epsilon");
  auto window = f.Int(p + "attention.sliding_window", 0);
  if (!theta.ok()) return theta.status();
  if (!eps.ok()) return eps.status();
  if (!window.ok()) return window.status();
  const GgufTensor* embd = f.Tensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::DataLossError(absl::StrFormat("%s: no 2-D token_embd.weight", f.path()));
  }
  c.dim = *dim;
  c.hidden_dim = *hidden;
  c.n_layers = *layers;
  c.n_heads = *heads;
  c.n_kv_heads = *kv_heads;
  c.head_dim = *head_dim;
  c.vocab_size = static_cast<int>(embd->dims[1]);
  c.max_seq_len = *ctx;
  c.rope_theta = static_cast<float>(*theta);
  c.norm_eps = static_cast<float>(*eps);
  c.rope_style = RopeStyle::kHalf;  // after the q/k rows are put back in HF order
  c.sliding_window = static_cast<int>(std::max<int64_t>(0, *window));
  c.tie_word_embeddings = f.Tensor("output.weight") == nullptr;
  auto bos = f.Int("tokenizer.ggml.bos_token_id", -1);
  auto eos = f.Int("tokenizer.ggml.eos_token_id", -1);
  if (!bos.ok()) return bos.status();
  if (!eos.ok()) return eos.status();
  c.bos_token_id = static_cast<int>(*bos);
  if (*eos >= 0) c.eos_token_ids.push_back(static_cast<int>(*eos));
  if (auto eot = f.Int("tokenizer.ggml.eot_token_id", -1); eot.ok() && *eot >= 0 && *eot != *eos) {
    c.eos_token_ids.push_back(static_cast<int>(*eot));
  }
  if (c.architecture == "Gemma3ForCausalLM") SetGemma3Layout(f, &c);
  if (absl::Status s = ReadExperts(f, p, &c); !s.ok()) return s;
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("%s: %s", f.path(), s.message()));
  }
  return c;
}

absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadGgufModel(const std::string& path) {
  auto file = GgufFile::Read(path);
  if (!file.ok()) return file.status();
  return LoadGgufModel(*file);
}

absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadGgufModel(const GgufFile& f) {
  auto config = GgufModelConfig(f);
  if (!config.ok()) return config.status();
  ModelConfig c = *config;
  // llama.cpp permutes the q/k rows of the models it runs with interleaved RoPE (llama,
  // mistral); Qwen's rotate halves (NEOX) and keep Hugging Face's order.
  const bool permuted = c.architecture == "LlamaForCausalLM" ||
                        c.architecture == "MistralForCausalLM" ||
                        c.architecture == "MixtralForCausalLM";

  ModelWeights w;
  w.files.push_back(f.file());
  absl::Status status;
  auto find = [&](const std::string& name, std::vector<int64_t> dims) -> const GgufTensor* {
    const GgufTensor* t = f.Tensor(name);
    if (t == nullptr) {
      if (status.ok())
        status = absl::DataLossError(absl::StrFormat("%s: no tensor %s", f.path(), name));
      return nullptr;
    }
    if (t->dims != dims) {
      std::string got, want;
      for (auto d : t->dims) got += absl::StrFormat("%d,", d);
      for (auto d : dims) want += absl::StrFormat("%d,", d);
      if (status.ok()) {
        status = absl::DataLossError(absl::StrFormat("%s: tensor %s has dims [%s], expected [%s]",
                                                     f.path(), name, got, want));
      }
      return nullptr;
    }
    if (!t->dtype) {
      if (status.ok()) {
        status = absl::UnimplementedError(
            absl::StrFormat("%s: tensor %s is %s, a type Tandem does not compute with (F32, F16, "
                            "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                            f.path(), name, GgmlTypeName(t->ggml_type)));
      }
      return nullptr;
    }
    return t;
  };
  // GGUF dims are [cols, rows].
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) -> WeightRef {
    const GgufTensor* t = find(name, {cols, rows});
    return t ? WeightRef{*t->dtype, t->data, rows, cols} : WeightRef{};
  };
  // A stack of n_experts matrices [rows, cols] (GGUF dims [cols, rows, n_experts]): one
  // reference into the mapping per expert.
  auto experts = [&](const std::string& name, int64_t rows, int64_t cols) {
    std::vector<WeightRef> out;
    const GgufTensor* t = find(name, {cols, rows, c.n_experts});
    if (t == nullptr) return out;
    const int64_t stride = rows * RowBytes(*t->dtype, cols);
    for (int e = 0; e < c.n_experts; ++e) {
      out.push_back(
          WeightRef{*t->dtype, static_cast<const char*>(t->data) + e * stride, rows, cols});
    }
    return out;
  };
  auto vec = [&](const std::string& name, int64_t n) -> const float* {
    const GgufTensor* t = find(name, {n});
    return t ? w.Own(*t->dtype, t->data, n) : nullptr;
  };
  // llama.cpp stores each head's rows as (0, hd/2, 1, hd/2 + 1, ...): row 2j + h of a head is
  // Hugging Face row h * hd/2 + j.
  auto unpermute = [&](WeightRef m, int n_heads) -> WeightRef {
    if (m.data == nullptr || !permuted) return m;
    const int64_t row_bytes = RowBytes(m.dtype, m.cols), hd = c.head_dim;
    std::vector<uint16_t>& buf = w.owned16.emplace_back((m.rows * row_bytes + 1) / 2);
    auto* dst = reinterpret_cast<char*>(buf.data());
    const auto* src = static_cast<const char*>(m.data);
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t half = 0; half < 2; ++half) {
        for (int64_t j = 0; j < hd / 2; ++j) {
          std::memcpy(dst + (h * hd + half * hd / 2 + j) * row_bytes,
                      src + (h * hd + 2 * j + half) * row_bytes, row_bytes);
        }
      }
    }
    m.data = dst;
    return m;
  };

  const int64_t dim = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  const int64_t eh = c.expert_hidden_dim;
  w.token_embedding = matrix("token_embd.weight", c.vocab_size, dim);
  w.final_norm = vec("output_norm.weight", dim);
  w.classifier =
      c.tie_word_embeddings ? w.token_embedding : matrix("output.weight", c.vocab_size, dim);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers && status.ok(); ++l) {
    const std::string p = absl::StrFormat("blk.%d.", l);
    LayerWeights& lw = w.layers[l];
    lw.attn_norm = vec(p + "attn_norm.weight", dim);
    lw.ffn_norm = vec(p + "ffn_norm.weight", dim);
    if (c.sandwich_norms) {  // stored as the multiplier itself (llama.cpp adds Gemma's 1)
      lw.post_attn_norm = vec(p + "post_attention_norm.weight", dim);
      lw.post_ffn_norm = vec(p + "post_ffw_norm.weight", dim);
    }
    lw.wq = unpermute(matrix(p + "attn_q.weight", q, dim), c.n_heads);
    lw.wk = unpermute(matrix(p + "attn_k.weight", kv, dim), c.n_kv_heads);
    lw.wv = matrix(p + "attn_v.weight", kv, dim);
    lw.wo = matrix(p + "attn_output.weight", dim, q);
    if (c.LayerIsMoe(l)) {
      lw.router = matrix(p + "ffn_gate_inp.weight", c.n_experts, dim);
      const std::vector<WeightRef> gate = experts(p + "ffn_gate_exps.weight", eh, dim);
      const std::vector<WeightRef> down = experts(p + "ffn_down_exps.weight", dim, eh);
      const std::vector<WeightRef> up = experts(p + "ffn_up_exps.weight", eh, dim);
      if (!status.ok()) break;
      lw.experts.resize(c.n_experts);
      for (int e = 0; e < c.n_experts; ++e) lw.experts[e] = {gate[e], down[e], up[e]};
    } else {
      lw.w1 = matrix(p + "ffn_gate.weight", hid, dim);
      lw.w2 = matrix(p + "ffn_down.weight", dim, hid);
      lw.w3 = matrix(p + "ffn_up.weight", hid, dim);
    }
    if (c.qkv_bias) {
      lw.bq = vec(p + "attn_q.bias", q);
      lw.bk = vec(p + "attn_k.bias", kv);
      lw.bv = vec(p + "attn_v.bias", kv);
    }
    if (c.qk_norm) {
      lw.q_norm = vec(p + "attn_q_norm.weight", c.head_dim);
      lw.k_norm = vec(p + "attn_k_norm.weight", c.head_dim);
    }
  }
  if (!status.ok()) return status;
  return std::make_pair(std::move(c), std::move(w));
}

}  // namespace tandem
