// Hugging Face model directories: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json. Weights are used in place from the mappings (f32, f16, bf16);
// norms and biases are converted to float32. Gemma 3 directories name their four norms per layer
// differently and store each norm's weight as (multiplier - 1); Qwen3-MoE and Mixtral store each
// expert's three matrices on their own (transformers 4's layout).
#include <sys/stat.h>

#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/loaders/model_weights.h"
#include "formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Every tensor of the directory: model.safetensors, or the shards its index lists.
absl::StatusOr<std::map<std::string, TensorView>> ReadTensors(const std::string& dir) {
  std::vector<std::string> shard_files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (FileExists(dir + "/model.safetensors")) {
    shard_files.push_back(dir + "/model.safetensors");
  } else if (FileExists(index_path)) {
    auto index_text = ReadFileToString(index_path);
    if (!index_text.ok()) return index_text.status();
    auto j = nlohmann::json::parse(*index_text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrFormat("%s: no weight_map object", index_path));
    }
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        return absl::DataLossError(absl::StrFormat("%s: bad weight_map entry", index_path));
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        return absl::DataLossError(
            absl::StrFormat("%s: shard name \"%s\" is not a plain file name", index_path, f));
      }
      names.insert(f);
    }
    for (const auto& n : names) shard_files.push_back(dir + "/" + n);
  } else {
    return absl::NotFoundError(absl::StrFormat(
        "%s: neither model.safetensors nor model.safetensors.index.json found", dir));
  }
  std::map<std::string, TensorView> tensors;
  for (const auto& f : shard_files) {
    auto st = ReadSafetensors(f);
    if (!st.ok()) return st.status();
    for (auto& [name, view] : st->tensors) tensors[name] = std::move(view);
  }
  return tensors;
}

}  // namespace

absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadHfModel(const std::string& dir) {
  auto config_text = ReadFileToString(dir + "/config.json");
  if (!config_text.ok()) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no config.json (not a Hugging Face model directory)", dir));
  }
  auto config_or = ModelConfig::FromHfJson(*config_text);
  if (!config_or.ok()) {
    return absl::Status(config_or.status().code(),
                        absl::StrFormat("%s/%s", dir, config_or.status().message()));
  }
  ModelConfig c = *config_or;

  auto tensors_or = ReadTensors(dir);
  if (!tensors_or.ok()) return tensors_or.status();
  std::map<std::string, TensorView>& tensors = *tensors_or;

  ModelWeights w;
  std::set<MappedFile*> seen_files;
  for (auto& [name, view] : tensors) {
    if (seen_files.insert(view.file.get()).second) w.files.push_back(view.file);
  }
  auto find = [&](const std::string& name,
                  std::vector<int64_t> shape) -> absl::StatusOr<TensorView> {
    auto it = tensors.find(name);
    if (it == tensors.end())
      return absl::NotFoundError(absl::StrFormat("%s: missing tensor %s", dir, name));
    if (it->second.shape != shape) {
      std::string got, want;
      for (auto d : it->second.shape) got += absl::StrFormat("%d,", d);
      for (auto d : shape) want += absl::StrFormat("%d,", d);
      return absl::DataLossError(
          absl::StrFormat("%s: tensor %s has shape [%s], expected [%s]", dir, name, got, want));
    }
    return it->second;
  };
  absl::Status status;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) -> WeightRef {
    auto t = find(name, {rows, cols});
    if (!t.ok()) {
      if (status.ok()) status = t.status();
      return {};
    }
    return WeightRef{t->dtype, t->data, rows, cols};
  };
  auto vec = [&](const std::string& name, int64_t n) -> const float* {
    auto t = find(name, {n});
    if (!t.ok()) {
      if (status.ok()) status = t.status();
      return nullptr;
    }
    return w.Own(t->dtype, t->data, n);
  };
  // Gemma's RMSNorm multiplies by (1 + weight): the stored weight plus one, in float32 as
  // transformers computes it.
  const bool gemma = c.sandwich_norms;
  auto norm = [&](const std::string& name, int64_t n) -> const float* {
    const float* v = vec(name, n);
    if (v != nullptr && gemma) {
      float* owned = const_cast<float*>(v);  // Own()'s float32 copy
      for (int64_t i = 0; i < n; ++i) owned[i] = 1.0f + owned[i];
    }
    return v;
  };

  const int64_t dim = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  w.token_embedding = matrix("model.embed_tokens.weight", c.vocab_size, dim);
  w.final_norm = norm("model.norm.weight", dim);
  if (!c.tie_word_embeddings || tensors.count("lm_head.weight")) {
    // Some tied checkpoints still store lm_head; it equals the embedding either way.
    w.classifier = matrix("lm_head.weight", c.vocab_size, dim);
  } else {
    w.classifier = w.token_embedding;
  }
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrFormat("model.layers.%d.", l);
    LayerWeights& lw = w.layers[l];
    lw.attn_norm = norm(p + "input_layernorm.weight", dim);
    if (gemma) {  // Gemma's post_attention_layernorm is on the attention output
      lw.post_attn_norm = norm(p + "post_attention_layernorm.weight", dim);
      lw.ffn_norm = norm(p + "pre_feedforward_layernorm.weight", dim);
      lw.post_ffn_norm = norm(p + "post_feedforward_layernorm.weight", dim);
    } else {
      lw.ffn_norm = norm(p + "post_attention_layernorm.weight", dim);
    }
    lw.wq = matrix(p + "self_attn.q_proj.weight", q, dim);
    lw.wk = matrix(p + "self_attn.k_proj.weight", kv, dim);
    lw.wv = matrix(p + "self_attn.v_proj.weight", kv, dim);
    lw.wo = matrix(p + "self_attn.o_proj.weight", dim, q);
    if (c.LayerIsMoe(l)) {
      const HfMoeNames names(c, l);
      const std::string& m = names.prefix;
      const int64_t eh = c.expert_hidden_dim;
      if (tensors.count(m + "experts.gate_up_proj") || tensors.count(m + "experts.down_proj")) {
        return absl::UnimplementedError(absl::StrFormat(
            "%s: %sexperts.gate_up_proj: experts fused into one tensor (transformers 5's "
            "layout) are not supported; save the model with transformers 4 (one tensor per "
            "expert) or convert it to GGUF",
            dir, m));
      }
      lw.router = matrix(names.router(), c.n_experts, dim);
      lw.experts.resize(c.n_experts);
      for (int e = 0; e < c.n_experts && status.ok(); ++e) {
        lw.experts[e] = {matrix(names.gate(e), eh, dim), matrix(names.down(e), dim, eh),
                         matrix(names.up(e), eh, dim)};
      }
    } else {
      lw.w1 = matrix(p + "mlp.gate_proj.weight", hid, dim);
      lw.w2 = matrix(p + "mlp.down_proj.weight", dim, hid);
      lw.w3 = matrix(p + "mlp.up_proj.weight", hid, dim);
    }
    if (c.qkv_bias) {
      lw.bq = vec(p + "self_attn.q_proj.bias", q);
      lw.bk = vec(p + "self_attn.k_proj.bias", kv);
      lw.bv = vec(p + "self_attn.v_proj.bias", kv);
    }
    if (c.qk_norm) {
      lw.q_norm = norm(p + "self_attn.q_norm.weight", c.head_dim);
      lw.k_norm = norm(p + "self_attn.k_norm.weight", c.head_dim);
    }
  }
  if (!status.ok()) return status;
  return std::make_pair(std::move(c), std::move(w));
}

}  // namespace tandem
