#include "engine/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/moe_routing.h"
#include "formats/gguf.h"
#include "kernels/quant.h"

namespace tandem {

absl::StatusOr<DType> ParseWeightDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    if (DTypeName(t) == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "--dtype: %s is not one of f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k",
      name));
}

namespace {

// A file named *.gguf that does not begin with GGUF's magic (a text file, an HTML error page
// saved by a failed download) is said to be no GGUF file, rather than tried as the llama2.c
// checkpoint any other file is taken for.
absl::Status CheckGgufName(const std::string& path) {
  std::string ext = path.size() >= 5 ? path.substr(path.size() - 5) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (ext != ".gguf" || IsGgufFile(path)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: not a GGUF file (bad magic: it does not begin with \"GGUF\")", path));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, Backend* backend,
                                                   std::optional<DType> weight_dtype) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("model path %s does not exist", path));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (absl::Status s = CheckGgufName(path); !s.ok()) return s;
  }
  auto loaded = S_ISDIR(st.st_mode) ? LoadHfModel(path)
                : IsGgufFile(path)  ? LoadGgufModel(path)
                                    : LoadLlama2cCheckpoint(path);
  if (!loaded.ok()) return loaded.status();
  if (weight_dtype.has_value()) loaded->second.ConvertMatrices(*weight_dtype);
  return std::make_unique<Model>(std::move(loaded->first), std::move(loaded->second), backend);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("model path %s does not exist", path));
  }
  if (S_ISDIR(st.st_mode)) {
    auto text = ReadFileToString(path + "/config.json");
    if (!text.ok()) return absl::NotFoundError(absl::StrFormat("%s: no config.json", path));
    return ModelConfig::FromHfJson(*text);
  }
  if (absl::Status s = CheckGgufName(path); !s.ok()) return s;
  if (IsGgufFile(path)) {
    auto gguf = GgufFile::Read(path);  // maps the file; reads the metadata pages
    if (!gguf.ok()) return gguf.status();
    return GgufModelConfig(*gguf);
  }
  auto loaded = LoadLlama2cCheckpoint(path);  // maps the file; reads only the header pages
  if (!loaded.ok()) return loaded.status();
  return loaded->first;
}

Model::Model(ModelConfig config, ModelWeights weights, Backend* backend)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(backend),
      inv_freq_(config_.RopeInvFreq()),
      local_inv_freq_(config_.LocalRopeInvFreq()) {}

namespace {

// A Forward call's batch, flattened for the kernels: per token its id, sequence and position;
// per layer group the sequences' block tables and each token's cache slot.
struct FlatBatch {
  std::vector<int> ids, token_seq, token_pos;
  std::vector<int> logit_rows;                 // the tokens whose logits are returned
  std::vector<std::vector<int>> block_tables;  // [groups][num_seqs, max_blocks]
  std::vector<std::vector<int>> slots;         // [groups][num_tokens]
  int max_blocks = 1;
};

// Validates `batch` against the model and the cache (tokens, positions, every block a chunk
// reads or writes) and flattens it.
absl::StatusOr<FlatBatch> Flatten(std::span<const SequenceChunk> batch, const ModelConfig& c,
                                  const KvCache& cache) {
  const int bs = cache.block_size();
  const KvTableLayout layout = cache.spec().table_layout();
  const int groups = layout.n_groups();
  int num_tokens = 0, max_blocks = 1;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceChunk& ch = batch[s];
    const int n = static_cast<int>(ch.tokens.size());
    if (n == 0)
      return absl::InvalidArgumentError(absl::StrFormat("forward: sequence %d has no tokens", s));
    if (ch.start_pos < 0 || ch.start_pos + n > c.max_seq_len) {
      return absl::InvalidArgumentError(
          absl::StrFormat("forward: sequence %d: positions [%d, %d) exceed the context length %d",
                          s, ch.start_pos, ch.start_pos + n, c.max_seq_len));
    }
    for (int t : ch.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("forward: sequence %d: token id %d outside the vocabulary [0, %d)", s,
                            t, c.vocab_size));
      }
    }
    const int logical = layout.LogicalBlocks(ch.start_pos + n);
    if (static_cast<int>(ch.block_table.size()) < logical * groups) {
      return absl::InvalidArgumentError(
          absl::StrFormat("forward: sequence %d: %d blocks cover fewer than %d positions", s,
                          ch.block_table.size(), ch.start_pos + n));
    }
    // Every block the chunk reads or writes: a sliding group's from its window on.
    for (int g = 0; g < groups; ++g) {
      for (int j = layout.FirstLive(g, ch.start_pos); j < logical; ++j) {
        const int b = ch.block_table[j * groups + g];
        if (b < 0 || b >= cache.num_blocks()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("forward: sequence %d: block id %d out of range", s, b));
        }
      }
    }
    num_tokens += n;
    max_blocks = std::max(max_blocks, logical);
  }

  FlatBatch f;
  f.max_blocks = max_blocks;
  f.ids.reserve(num_tokens);
  // Blocks a sliding group let go read as 0 (never reached).
  f.block_tables.assign(groups, std::vector<int>(batch.size() * max_blocks, 0));
  f.slots.resize(groups);
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceChunk& ch = batch[s];
    const int n = static_cast<int>(ch.tokens.size());
    const int logical = layout.LogicalBlocks(ch.start_pos + n);
    for (int j = 0; j < logical; ++j) {
      for (int g = 0; g < groups; ++g) {
        f.block_tables[g][s * max_blocks + j] = std::max(0, ch.block_table[j * groups + g]);
      }
    }
    for (int i = 0; i < n; ++i) {
      const int pos = ch.start_pos + i;
      if (ch.all_logits || i == n - 1) f.logit_rows.push_back(static_cast<int>(f.ids.size()));
      f.ids.push_back(ch.tokens[i]);
      f.token_seq.push_back(static_cast<int>(s));
      f.token_pos.push_back(pos);
      for (int g = 0; g < groups; ++g) {
        f.slots[g].push_back(ch.block_table[(pos / bs) * groups + g] * bs + pos % bs);
      }
    }
  }
  return f;
}

}  // namespace

absl::Status Model::Forward(std::span<const SequenceChunk> batch, KvCache* cache,
                            std::vector<float>* logits,
                            const std::function<void(int layer)>& on_layer_kv) const {
  const ModelConfig& c = config_;
  if (batch.empty()) return absl::InvalidArgumentError("forward: empty batch");
  if (cache->width() != c.kv_dim() || cache->n_layers() != c.n_layers) {
    return absl::InvalidArgumentError("forward: kv cache shape does not match the model");
  }
  absl::StatusOr<FlatBatch> flat = Flatten(batch, c, *cache);
  if (!flat.ok()) return flat.status();
  const std::vector<int>& ids = flat->ids;
  const std::vector<int>& token_pos = flat->token_pos;
  const int num_tokens = static_cast<int>(ids.size());
  const int num_rows = static_cast<int>(flat->logit_rows.size());
  const int groups = static_cast<int>(flat->block_tables.size());
  const KvCacheSpec& spec = cache->spec();

  const int64_t T = num_tokens;
  std::vector<float> x(T * c.dim), xb(T * c.dim);                  // [T, dim]
  std::vector<float> q(T * c.q_dim()), att(T * c.q_dim());         // [T, n_heads, head_dim]
  std::vector<float> k(T * c.kv_dim()), v(T * c.kv_dim());         // [T, n_kv_heads, head_dim]
  std::vector<float> hb(T * c.hidden_dim), hb2(T * c.hidden_dim);  // [T, hidden_dim]
  MoeScratch moe;

  PagedAttentionArgs args;
  args.num_tokens = num_tokens;
  args.n_heads = c.n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = c.head_dim;
  args.block_size = cache->block_size();
  args.max_blocks_per_seq = flat->max_blocks;
  args.token_seq = flat->token_seq.data();
  args.token_pos = token_pos.data();
  args.scale = c.AttentionScale();

  // fp8 caches: per group, every chunk's rows and its group table, for their scales.
  std::vector<std::vector<std::vector<int>>> group_tables(groups);  // [groups][seqs]
  std::vector<std::vector<KvChunkRows>> chunk_rows(groups);
  if (cache->dtype() == DType::kFp8E4M3) {
    for (int g = 0; g < groups; ++g) {
      for (const SequenceChunk& ch : batch) {
        group_tables[g].push_back(GroupTable(spec.table_layout(), ch.block_table, g));
      }
      for (size_t s = 0; s < batch.size(); ++s) {
        chunk_rows[g].push_back(
            {batch[s].start_pos, static_cast<int>(batch[s].tokens.size()), group_tables[g][s]});
      }
    }
  }

  Backend& b = *backend_;
  b.Embedding(ids.data(), weights_.token_embedding, x.data(), num_tokens);
  if (c.embedding_scale != 1.0f) b.Scale(x.data(), c.embedding_scale, T * c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    const int g = spec.group_of(l);
    args.sliding_window = c.LayerWindow(l);
    args.block_tables = flat->block_tables[g].data();
    const float* inv_freq = c.LayerIsLocal(l) ? local_inv_freq_.data() : inv_freq_.data();
    b.RmsNorm(x.data(), w.attn_norm, xb.data(), num_tokens, c.dim, c.norm_eps);
    b.Matmul(xb.data(), w.wq, w.bq, q.data(), num_tokens);
    b.Matmul(xb.data(), w.wk, w.bk, k.data(), num_tokens);
    b.Matmul(xb.data(), w.wv, w.bv, v.data(), num_tokens);
    if (w.q_norm != nullptr) {  // Qwen3: each head normalised on its own, before the rotation
      b.RmsNorm(q.data(), w.q_norm, q.data(), num_tokens * c.n_heads, c.head_dim, c.norm_eps);
      b.RmsNorm(k.data(), w.k_norm, k.data(), num_tokens * c.n_kv_heads, c.head_dim, c.norm_eps);
    }
    b.Rope(q.data(), num_tokens, c.n_heads, c.head_dim, token_pos.data(), inv_freq, c.rope_style);
    b.Rope(k.data(), num_tokens, c.n_kv_heads, c.head_dim, token_pos.data(), inv_freq,
           c.rope_style);
    if (!chunk_rows[g].empty()) SetFp8Scales(cache, l, chunk_rows[g], k.data(), v.data());
    const KvLayerRef layer = cache->layer(l);
    b.WriteKv(k.data(), v.data(), flat->slots[g].data(), num_tokens, layer);
    if (on_layer_kv) on_layer_kv(l);
    b.PagedAttention(q.data(), layer, args, att.data());
    b.Matmul(att.data(), w.wo, nullptr, xb.data(), num_tokens);
    if (w.post_attn_norm != nullptr) {
      b.RmsNorm(xb.data(), w.post_attn_norm, xb.data(), num_tokens, c.dim, c.norm_eps);
    }
    b.Add(x.data(), xb.data(), T * c.dim);
    b.RmsNorm(x.data(), w.ffn_norm, xb.data(), num_tokens, c.dim, c.norm_eps);
    if (c.LayerIsMoe(l)) {
      if (absl::Status s = MoeMlp(w, xb.data(), num_tokens, xb.data(), &moe); !s.ok()) return s;
    } else {
      Mlp({w.w1, w.w2, w.w3}, xb.data(), num_tokens, hb.data(), hb2.data(), xb.data());
    }
    if (w.post_ffn_norm != nullptr) {
      b.RmsNorm(xb.data(), w.post_ffn_norm, xb.data(), num_tokens, c.dim, c.norm_eps);
    }
    b.Add(x.data(), xb.data(), T * c.dim);
  }
  // Only the rows that need logits go through the final norm and the classifier.
  std::vector<float> rows(static_cast<size_t>(num_rows) * c.dim);  // [num_rows, dim]
  for (int r = 0; r < num_rows; ++r) {
    std::copy_n(x.begin() + static_cast<int64_t>(flat->logit_rows[r]) * c.dim, c.dim,
                rows.begin() + static_cast<int64_t>(r) * c.dim);
  }
  b.RmsNorm(rows.data(), weights_.final_norm, rows.data(), num_rows, c.dim, c.norm_eps);
  logits->resize(static_cast<size_t>(num_rows) * c.vocab_size);
  b.Matmul(rows.data(), weights_.classifier, nullptr, logits->data(), num_rows);
  return absl::OkStatus();
}

void Model::Mlp(const ExpertWeights& m, const float* x, int rows, float* h1, float* h3,
                float* out) const {
  Backend& b = *backend_;
  const int64_t n = static_cast<int64_t>(rows) * m.w1.rows;
  b.Matmul(x, m.w1, nullptr, h1, rows);
  b.Matmul(x, m.w3, nullptr, h3, rows);
  if (config_.hidden_act == Activation::kGeluTanh) {
    b.GeluTanhMul(h1, h3, h1, n);
  } else {
    b.SiluMul(h1, h3, h1, n);
  }
  b.Matmul(h1, m.w2, nullptr, out, rows);
}

absl::Status Model::MoeMlp(const LayerWeights& w, const float* x, int num_tokens, float* out,
                           MoeScratch* s) const {
  const ModelConfig& c = config_;
  const int64_t dim = c.dim, T = num_tokens;
  s->router_logits.resize(T * c.n_experts);
  backend_->Matmul(x, w.router, nullptr, s->router_logits.data(), num_tokens);
  if (absl::Status st = RouteTokens(s->router_logits, num_tokens, c.n_experts, c.n_experts_used,
                                    c.norm_topk_prob, &s->routing);
      !st.ok()) {
    return st;
  }
  s->sum.assign(T * dim, 0.0f);
  // Each expert runs once over the rows of every token that chose it; the weighted outputs are
  // added in expert order, as transformers' index_add_ adds them.
  for (int e = 0; e < c.n_experts; ++e) {
    const int begin = s->routing.offsets[e], rows = s->routing.offsets[e + 1] - begin;
    if (rows == 0) continue;
    s->in.resize(rows * dim);
    s->out.resize(rows * dim);
    s->h1.resize(static_cast<int64_t>(rows) * c.expert_hidden_dim);
    s->h3.resize(static_cast<int64_t>(rows) * c.expert_hidden_dim);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(x + s->routing.token[begin + r] * dim, dim, s->in.begin() + r * dim);
    }
    Mlp(w.experts[e], s->in.data(), rows, s->h1.data(), s->h3.data(), s->out.data());
    for (int r = 0; r < rows; ++r) {
      float* dst = s->sum.data() + s->routing.token[begin + r] * dim;
      const float* src = s->out.data() + static_cast<int64_t>(r) * dim;
      const float weight = s->routing.weight[begin + r];
      for (int64_t i = 0; i < dim; ++i) dst[i] += src[i] * weight;
    }
  }
  std::copy(s->sum.begin(), s->sum.end(), out);
  return absl::OkStatus();
}

}  // namespace tandem
