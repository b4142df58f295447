// llama2.c checkpoints (run.c's "legacy" format): a header of 7 int32
//   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
// (a negative vocab_size means a separate classifier follows), then float32 weights in the
// order of run.c's memory_map_weights, including the old RoPE tables that are skipped.
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/loaders/model_weights.h"

namespace tandem {

absl::StatusOr<std::pair<ModelConfig, ModelWeights>> LoadLlama2cCheckpoint(
    const std::string& path) {
  auto file_or = MappedFile::Open(path);
  if (!file_or.ok()) return file_or.status();
  return ParseLlama2cCheckpoint(*std::move(file_or));
}

absl::StatusOr<std::pair<ModelConfig, ModelWeights>> ParseLlama2cCheckpoint(
    std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrFormat("%s: not a valid llama2.c checkpoint: %s", path, why));
  };
  if (file->size() < 28) return corrupt("shorter than the 28-byte header");
  int32_t h[7];
  std::memcpy(h, file->data(), sizeof(h));
  ModelConfig c;
  c.architecture = "llama2c";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  const bool shared_classifier = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
  c.max_seq_len = h[6];
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.rope_style = RopeStyle::kInterleaved;
  c.tie_word_embeddings = shared_classifier;
  c.bos_token_id = 1;
  c.eos_token_ids = {1};  // run.c stops when the model produces BOS
  if (c.n_heads > 0 && c.dim % c.n_heads != 0) return corrupt("dim is not a multiple of n_heads");
  if (absl::Status s = c.Validate(); !s.ok()) return corrupt(std::string(s.message()));
  if (c.vocab_size < 3) return corrupt("vocab_size must be at least 3 (unk, bos, eos)");

  const int64_t dim = c.dim, hid = c.hidden_dim, L = c.n_layers, kv = c.kv_dim(),
                vocab = c.vocab_size, q = c.q_dim();
  const int64_t rope_table = int64_t{c.max_seq_len} * c.head_dim / 2;
  // The size the header describes, in 128 bits: a corrupt header's products overflow 64.
  using Wide = unsigned __int128;
  const Wide expected_floats = Wide(vocab) * dim + Wide(L) * dim + Wide(L) * dim * q +
                               2 * Wide(L) * kv * dim + Wide(L) * q * dim + Wide(L) * dim +
                               3 * Wide(L) * dim * hid + dim + 2 * Wide(rope_table) +
                               (shared_classifier ? 0 : Wide(vocab) * dim);
  const Wide expected = 28 + 4 * expected_floats;
  if (Wide(file->size()) != expected) {
    return corrupt(absl::StrFormat("%d bytes, but the header describes %.0f (truncated or corrupt)",
                                   file->size(), static_cast<double>(expected)));
  }

  const float* p = reinterpret_cast<const float*>(file->data() + 28);
  auto take = [&p](int64_t n) {
    const float* r = p;
    p += n;
    return r;
  };
  auto mat = [](const float* data, int64_t rows, int64_t cols) {
    return WeightRef{DType::kF32, data, rows, cols};
  };
  ModelWeights w;
  w.files.push_back(file);
  w.token_embedding = mat(take(vocab * dim), vocab, dim);
  w.layers.resize(L);
  const float* rms_att = take(L * dim);
  const float* wq = take(L * q * dim);
  const float* wk = take(L * kv * dim);
  const float* wv = take(L * kv * dim);
  const float* wo = take(L * dim * q);
  const float* rms_ffn = take(L * dim);
  const float* w1 = take(L * hid * dim);
  const float* w2 = take(L * dim * hid);
  const float* w3 = take(L * hid * dim);
  w.final_norm = take(dim);
  take(2 * rope_table);  // freq_cis_real, freq_cis_imag: unused, RoPE is computed
  w.classifier = shared_classifier ? w.token_embedding : mat(take(vocab * dim), vocab, dim);
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& lw = w.layers[l];
    lw.attn_norm = rms_att + l * dim;
    lw.ffn_norm = rms_ffn + l * dim;
    lw.wq = mat(wq + l * q * dim, q, dim);
    lw.wk = mat(wk + l * kv * dim, kv, dim);
    lw.wv = mat(wv + l * kv * dim, kv, dim);
    lw.wo = mat(wo + l * dim * q, dim, q);
    lw.w1 = mat(w1 + l * hid * dim, hid, dim);
    lw.w2 = mat(w2 + l * dim * hid, dim, hid);
    lw.w3 = mat(w3 + l * hid * dim, hid, dim);
  }
  return std::make_pair(std::move(c), std::move(w));
}

}  // namespace tandem
