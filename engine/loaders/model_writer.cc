#include "engine/loaders/model_writer.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/loaders/model_weights.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "text/gguf_tokenizer.h"

namespace tandem {
namespace {

absl::Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot create %s: %s", dir, std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The tensors of a Llama-family HF checkpoint for `c`, in file order.
std::vector<TensorSpec> HfTensorSpecs(const ModelConfig& c, DType dtype) {
  std::vector<TensorSpec> specs;
  const int64_t dim = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  specs.push_back({"model.embed_tokens.weight", dtype, {c.vocab_size, dim}});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrFormat("model.layers.%d.", l);
    specs.push_back({p + "input_layernorm.weight", dtype, {dim}});
    specs.push_back({p + "self_attn.q_proj.weight", dtype, {q, dim}});
    specs.push_back({p + "self_attn.k_proj.weight", dtype, {kv, dim}});
    specs.push_back({p + "self_attn.v_proj.weight", dtype, {kv, dim}});
    if (c.qkv_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", dtype, {q}});
      specs.push_back({p + "self_attn.k_proj.bias", dtype, {kv}});
      specs.push_back({p + "self_attn.v_proj.bias", dtype, {kv}});
    }
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", dtype, {c.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", dtype, {c.head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", dtype, {dim, q}});
    specs.push_back({p + "post_attention_layernorm.weight", dtype, {dim}});
    if (!c.LayerIsMoe(l)) {
      specs.push_back({p + "mlp.gate_proj.weight", dtype, {hid, dim}});
      specs.push_back({p + "mlp.up_proj.weight", dtype, {hid, dim}});
      specs.push_back({p + "mlp.down_proj.weight", dtype, {dim, hid}});
      continue;
    }
    const HfMoeNames names(c, l);
    const int64_t eh = c.expert_hidden_dim;
    specs.push_back({names.router(), dtype, {c.n_experts, dim}});
    for (int e = 0; e < c.n_experts; ++e) {
      specs.push_back({names.gate(e), dtype, {eh, dim}});
      specs.push_back({names.up(e), dtype, {eh, dim}});
      specs.push_back({names.down(e), dtype, {dim, eh}});
    }
  }
  specs.push_back({"model.norm.weight", dtype, {dim}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", dtype, {c.vocab_size, dim}});
  return specs;
}

std::string FloatBytes(const float* data, int64_t n) {
  return std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * 4);
}

// Rows of a q or k projection [n_heads * head_dim, cols] reordered from llama2.c's interleaved
// pairs to Hugging Face's halves: new row h*hd + j*hd/2 + i = old row h*hd + 2i + j.
std::string PermuteForHalfRope(const WeightRef& w, int n_heads) {
  const int64_t hd = w.rows / n_heads, cols = w.cols;
  const float* src = static_cast<const float*>(w.data);
  std::vector<float> dst(w.rows * cols);
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        std::memcpy(&dst[(h * hd + j * hd / 2 + i) * cols], &src[(h * hd + 2 * i + j) * cols],
                    cols * 4);
      }
    }
  }
  return FloatBytes(dst.data(), static_cast<int64_t>(dst.size()));
}

}  // namespace

namespace {

// Writes `out_dir`/model.safetensors (float32, from float32 weights `w`) and config.json;
// `qk(matrix, heads)` gives the bytes of the q and k projections (their row order).
absl::Status WriteHfModel(const std::string& out_dir, const ModelConfig& c, const ModelWeights& w,
                          const std::function<std::string(const WeightRef&, int)>& qk) {
  if (absl::Status s = MakeDir(out_dir); !s.ok()) return s;
  auto matrix = [](const WeightRef& r) {
    return FloatBytes(static_cast<const float*>(r.data), r.rows * r.cols);
  };
  auto produce = [&](const TensorSpec& t) -> std::string {
    const std::string& n = t.name;
    if (n == "model.embed_tokens.weight") return matrix(w.token_embedding);
    if (n == "lm_head.weight") return matrix(w.classifier);
    if (n == "model.norm.weight") return FloatBytes(w.final_norm, t.numel());
    int l = 0;
    char field[128] = {0};
    if (std::sscanf(n.c_str(), "model.layers.%d.%127s", &l, field) != 2) return {};
    const LayerWeights& lw = w.layers[l];
    const std::string f = field;
    if (f == "input_layernorm.weight") return FloatBytes(lw.attn_norm, t.numel());
    if (f == "post_attention_layernorm.weight") return FloatBytes(lw.ffn_norm, t.numel());
    if (f == "self_attn.q_proj.weight") return qk(lw.wq, c.n_heads);
    if (f == "self_attn.k_proj.weight") return qk(lw.wk, c.n_kv_heads);
    if (f == "self_attn.v_proj.weight") return matrix(lw.wv);
    if (f == "self_attn.o_proj.weight") return matrix(lw.wo);
    if (f == "self_attn.q_proj.bias") return FloatBytes(lw.bq, t.numel());
    if (f == "self_attn.k_proj.bias") return FloatBytes(lw.bk, t.numel());
    if (f == "self_attn.v_proj.bias") return FloatBytes(lw.bv, t.numel());
    if (f == "self_attn.q_norm.weight") return FloatBytes(lw.q_norm, t.numel());
    if (f == "self_attn.k_norm.weight") return FloatBytes(lw.k_norm, t.numel());
    if (f == "mlp.gate_proj.weight") return matrix(lw.w1);
    if (f == "mlp.up_proj.weight") return matrix(lw.w3);
    if (f == "mlp.down_proj.weight") return matrix(lw.w2);
    return {};
  };
  if (absl::Status s =
          WriteSafetensors(out_dir + "/model.safetensors", HfTensorSpecs(c, DType::kF32), produce);
      !s.ok()) {
    return s;
  }
  return WriteStringToFile(out_dir + "/config.json", c.ToHfJson());
}

}  // namespace

absl::Status ConvertLlama2cToHf(const std::string& checkpoint, const std::string& out_dir) {
  auto loaded = LoadLlama2cCheckpoint(checkpoint);
  if (!loaded.ok()) return loaded.status();
  ModelConfig c = loaded->first;
  c.architecture = "LlamaForCausalLM";
  c.rope_style = RopeStyle::kHalf;
  // run.c stops when BOS is produced: keep that as the converted model's EOS.
  c.bos_token_id = 1;
  c.eos_token_ids = {1};
  return WriteHfModel(out_dir, c, loaded->second, PermuteForHalfRope);
}

absl::Status ConvertGgufToHf(const std::string& gguf_path, const std::string& out_dir) {
  auto file = GgufFile::Read(gguf_path);
  if (!file.ok()) return file.status();
  auto tokenizer = GgufTokenizer(*file);
  if (!tokenizer.ok()) return tokenizer.status();
  auto loaded = LoadGgufModel(*file);
  if (!loaded.ok()) return loaded.status();
  if (loaded->first.sandwich_norms || loaded->first.n_experts > 0) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: writing %s as a Hugging Face directory is not implemented (the writer knows the "
        "Llama layout only); serve the GGUF file itself",
        gguf_path, loaded->first.architecture));
  }
  loaded->second.ConvertMatrices(DType::kF32);
  // The loader already put the q/k rows in Hugging Face order.
  auto as_is = [](const WeightRef& r, int) {
    return FloatBytes(static_cast<const float*>(r.data), r.rows * r.cols);
  };
  if (absl::Status s = WriteHfModel(out_dir, loaded->first, loaded->second, as_is); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteStringToFile(out_dir + "/tokenizer.json", tokenizer->tokenizer_json);
      !s.ok()) {
    return s;
  }
  return WriteStringToFile(out_dir + "/tokenizer_config.json", tokenizer->tokenizer_config_json);
}

std::vector<std::string> RandomModelShapes() {
  return {"stories260K", "stories15M", "stories110M",  "TinyLlama-1.1B",
          "Llama-2-7B",  "Llama-3-8B", "Mixtral-8x7B", "Qwen3-30B-A3B"};
}

absl::StatusOr<ModelConfig> RandomModelConfig(const std::string& shape) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.rope_style = RopeStyle::kHalf;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.norm_eps = 1e-5f;
  auto set = [&](int dim, int hid, int layers, int heads, int kv, int vocab, int ctx) {
    c.dim = dim;
    c.hidden_dim = hid;
    c.n_layers = layers;
    c.n_heads = heads;
    c.n_kv_heads = kv;
    c.head_dim = dim / heads;
    c.vocab_size = vocab;
    c.max_seq_len = ctx;
  };
  if (shape == "stories260K") {
    set(64, 172, 5, 8, 4, 512, 512);
    c.tie_word_embeddings = true;
  } else if (shape == "stories15M") {
    set(288, 768, 6, 6, 6, 32000, 256);
    c.tie_word_embeddings = true;
  } else if (shape == "stories110M") {
    set(768, 2048, 12, 12, 12, 32000, 1024);
    c.tie_word_embeddings = true;
  } else if (shape == "TinyLlama-1.1B") {
    set(2048, 5632, 22, 32, 4, 32000, 2048);
  } else if (shape == "Llama-2-7B") {
    set(4096, 11008, 32, 32, 32, 32000, 4096);
  } else if (shape == "Llama-3-8B") {
    set(4096, 14336, 32, 32, 8, 128256, 8192);
    c.rope_theta = 500000.0f;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001, 128009};
  } else if (shape == "Mixtral-8x7B") {
    set(4096, 14336, 32, 32, 8, 32000, 32768);
    c.architecture = "MixtralForCausalLM";
    c.rope_theta = 1e6f;
    c.n_experts = 8;
    c.n_experts_used = 2;
    c.expert_hidden_dim = 14336;
  } else if (shape == "Qwen3-30B-A3B") {
    set(2048, 6144, 48, 32, 4, 151936, 40960);
    c.architecture = "Qwen3MoeForCausalLM";
    c.head_dim = 128;
    c.qk_norm = true;
    c.rope_theta = 1e6f;
    c.norm_eps = 1e-6f;
    c.n_experts = 128;
    c.n_experts_used = 8;
    c.expert_hidden_dim = 768;
    c.bos_token_id = 151643;
    c.eos_token_ids = {151645};
  } else {
    std::string names;
    for (const auto& n : RandomModelShapes()) names += " " + n;
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown shape \"%s\"; known:%s", shape, names));
  }
  return c;
}

absl::Status WriteRandomModel(const ModelConfig& config, DType dtype, uint64_t seed,
                              const std::string& out_dir) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (absl::Status s = MakeDir(out_dir); !s.ok()) return s;
  const auto specs = HfTensorSpecs(config, dtype);
  uint64_t tensor_index = 0;
  auto produce = [&](const TensorSpec& t) -> std::string {
    const int64_t n = t.numel();
    std::string bytes(static_cast<size_t>(n) * DTypeSize(dtype), '\0');
    const bool is_norm = t.shape.size() == 1 && t.name.find("norm") != std::string::npos;
    // Uniform in [-a, a] has std a / sqrt(3); aim for std 1 / sqrt(fan_in).
    const double fan_in = t.shape.size() == 2 ? static_cast<double>(t.shape[1]) : 1.0;
    const float a = static_cast<float>(std::sqrt(3.0 / fan_in));
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + (++tensor_index) * 0xbf58476d1ce4e5b9ull;
    for (int64_t i = 0; i < n; ++i) {
      float v = 1.0f;
      if (!is_norm) {
        state += 0x9e3779b97f4a7c15ull;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        v = (static_cast<float>(z >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * a;
      }
      if (dtype == DType::kF32) {
        std::memcpy(&bytes[i * 4], &v, 4);
      } else {
        const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(&bytes[i * 2], &h, 2);
      }
    }
    return bytes;
  };
  if (absl::Status s = WriteSafetensors(out_dir + "/model.safetensors", specs, produce); !s.ok())
    return s;
  const char* tag = dtype == DType::kF32    ? "float32"
                    : dtype == DType::kBF16 ? "bfloat16"
                                            : "float16";
  return WriteStringToFile(out_dir + "/config.json", config.ToHfJson(tag));
}

}  // namespace tandem
