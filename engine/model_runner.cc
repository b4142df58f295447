#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "engine/cuda/step_plan.h"
#include "kernels/backend_loader.h"

namespace tandem {
namespace {

class CpuModelRunner : public ModelRunner {
 public:
  CpuModelRunner(const Model* model, KvCache cache, bool samples_rows)
      : model_(model), cache_(std::move(cache)), samples_rows_(samples_rows) {}
  std::string_view device() const override { return "cpu"; }
  int num_blocks() const override { return cache_.num_blocks(); }
  int block_size() const override { return cache_.block_size(); }
  absl::Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits,
                       const std::function<void(int)>& on_layer_kv) override {
    return model_->Forward(batch, &cache_, logits, on_layer_kv);
  }
  KvCache* host_kv_cache() override { return &cache_; }
  KvCacheSpec kv_spec() const override { return cache_.spec(); }

  // The host twin of a device runner's sampling: the same draw per row, only the tokens out.
  bool samples_on_device() const override { return samples_rows_; }
  absl::Status ForwardSample(std::span<const SequenceChunk> batch,
                             std::span<const SamplingParams> params,
                             std::span<const uint64_t> positions,
                             std::vector<int>* tokens) override {
    if (!samples_rows_) return ModelRunner::ForwardSample(batch, params, positions, tokens);
    if (absl::Status s = Forward(batch, &logits_, nullptr); !s.ok()) return s;
    const size_t vocab = model_->config().vocab_size;
    const size_t rows = logits_.size() / vocab;
    if (params.size() != rows || positions.size() != rows) {
      return absl::InvalidArgumentError("forward (cpu): one sampling row per logit row");
    }
    tokens->resize(rows);
    for (size_t r = 0; r < rows; ++r) {
      (*tokens)[r] = Sample(std::span<const float>(logits_).subspan(r * vocab, vocab), params[r],
                            positions[r]);
    }
    return absl::OkStatus();
  }

 private:
  const Model* model_;
  KvCache cache_;
  const bool samples_rows_;
  std::vector<float> logits_;
};

absl::Status CudaError(const TandemCudaApi* api, int rc, const char* what) {
  // cudaErrorInvalidValue (1) is what the library's argument checks return.
  const std::string msg = absl::StrFormat("%s: %s", what, api->last_error());
  return rc == 1 ? absl::InvalidArgumentError(msg) : absl::InternalError(msg);
}

class CudaModelRunner : public ModelRunner {
 public:
  CudaModelRunner(const TandemCudaApi* api, TandemModel* m, const ModelConfig& c,
                  const ModelRunnerOptions& o)
      : api_(api), model_(m), config_(c), options_(o) {}
  ~CudaModelRunner() override { api_->model_destroy(model_); }
  std::string_view device() const override { return "cuda"; }
  int num_blocks() const override { return options_.num_blocks; }
  int block_size() const override { return options_.block_size; }

  absl::Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits,
                       const std::function<void(int)>& on_layer_kv) override {
    const int rows = Marshal(batch);
    if (rows == 0) return absl::InvalidArgumentError("forward: empty batch");
    logits->resize(static_cast<size_t>(rows) * config_.vocab_size);
    if (absl::Status s = RunMarshalled(rows, nullptr, logits->data(), nullptr); !s.ok()) return s;
    if (on_layer_kv) {
      for (int l = 0; l < config_.n_layers; ++l) on_layer_kv(l);
    }
    return absl::OkStatus();
  }

  bool samples_on_device() const override { return true; }
  absl::Status ForwardSample(std::span<const SequenceChunk> batch,
                             std::span<const SamplingParams> params,
                             std::span<const uint64_t> positions,
                             std::vector<int>* tokens) override {
    const int rows = Marshal(batch);
    if (rows == 0) return absl::InvalidArgumentError("forward: empty batch");
    if (static_cast<int>(params.size()) != rows || static_cast<int>(positions.size()) != rows) {
      return absl::InvalidArgumentError("forward (cuda): one sampling row per logit row");
    }
    row_params_.resize(rows);
    for (int r = 0; r < rows; ++r) {
      row_params_[r] = {params[r].temperature, params[r].top_k, params[r].top_p, params[r].seed,
                        positions[r]};
    }
    tokens->resize(rows);
    return RunMarshalled(rows, row_params_.data(), nullptr, tokens->data());
  }

  KvCacheSpec kv_spec() const override {
    return KvCacheSpec::For(config_, options_.block_size, options_.kv_dtype, /*grouped=*/false);
  }
  absl::Status CopyKvOut(int layer, std::span<const int> block_table, int token_start,
                         int token_count, char* out) override {
    if (int rc = api_->model_pack_kv(model_, layer, block_table.data(),
                                     static_cast<int>(block_table.size()), token_start, token_count,
                                     out)) {
      return CudaError(api_, rc, "kv chunk (cuda pack)");
    }
    return absl::OkStatus();
  }
  absl::Status CopyKvIn(int layer, std::span<const int> block_table, int token_start,
                        int token_count, const char* in) override {
    if (int rc = api_->model_unpack_kv(model_, layer, block_table.data(),
                                       static_cast<int>(block_table.size()), token_start,
                                       token_count, in)) {
      return CudaError(api_, rc, "kv chunk (cuda unpack)");
    }
    return absl::OkStatus();
  }

 private:
  const TandemCudaApi* api_;
  TandemModel* model_;
  ModelConfig config_;
  ModelRunnerOptions options_;
  // Fills chunks_, tokens_ and tables_ (the C API's arrays) from `batch`; returns the number of
  // logit rows (0 for an empty batch).
  int Marshal(std::span<const SequenceChunk> batch) {
    chunks_.clear();
    tokens_.clear();
    tables_.clear();
    int rows = 0;
    for (const SequenceChunk& ch : batch) {
      TandemStepChunk c;
      c.num_tokens = static_cast<int>(ch.tokens.size());
      c.start_pos = ch.start_pos;
      c.num_blocks = static_cast<int>(ch.block_table.size());
      c.all_logits = ch.all_logits ? 1 : 0;
      chunks_.push_back(c);
      tokens_.insert(tokens_.end(), ch.tokens.begin(), ch.tokens.end());
      tables_.insert(tables_.end(), ch.block_table.begin(), ch.block_table.end());
      rows += ch.all_logits ? c.num_tokens : 1;
    }
    // Empty spans may have null data: the library wants pointers.
    if (tokens_.empty()) tokens_.push_back(0);
    if (tables_.empty()) tables_.push_back(0);
    return rows;
  }

  // One model_forward of the step Marshal prepared (`rows` logit rows): logits, or the tokens
  // sampled on the device with `params`.
  absl::Status RunMarshalled(int rows, const TandemSampleRowParams* params, float* logits,
                             int* sampled) {
    int got = 0;
    if (int rc =
            api_->model_forward(model_, chunks_.data(), static_cast<int>(chunks_.size()),
                                tokens_.data(), tables_.data(), params, logits, sampled, &got)) {
      return CudaError(api_, rc, "forward (cuda)");
    }
    if (got != rows) return absl::InternalError("forward (cuda): unexpected number of rows");
    return absl::OkStatus();
  }

  // Reused between steps (the engine's loop thread is the only caller of Forward).
  std::vector<TandemStepChunk> chunks_;
  std::vector<TandemSampleRowParams> row_params_;
  std::vector<int> tokens_, tables_;
};

// 0 f32 / 2 bf16, the library's dtype codes; -1 for f16.
int DTypeCode(DType d) {
  return d == DType::kF32 ? 0 : d == DType::kBF16 ? 2 : d == DType::kF16 ? 1 : -1;
}

// The library's KV dtype code (TANDEM_KV_*), or an error naming --kv-dtype.
absl::StatusOr<int> KvDtypeCode(const TandemCudaApi* api, DType kv, int head_dim) {
  switch (kv) {
    case DType::kF32:
      return TANDEM_KV_F32;
    case DType::kBF16:
    case DType::kFp8E4M3: {
      const int code = kv == DType::kBF16 ? TANDEM_KV_BF16 : TANDEM_KV_FP8;
      const char* why = "";
      if (api->fi_attention_supported(head_dim, code, &why) == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--kv-dtype=%s with --device=cuda: %s (head_dim %d); --kv-dtype=f32 runs everywhere",
            DTypeName(kv), why, head_dim));
      }
      return code;
    }
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "--kv-dtype=%s: the CUDA backend keeps its KV cache in f32, bf16 or fp8 (f16 runs on "
          "--device=cpu)",
          DTypeName(kv)));
  }
}

}  // namespace

std::unique_ptr<ModelRunner> MakeCpuModelRunner(const Model* model, KvCache cache,
                                                bool samples_rows) {
  return std::make_unique<CpuModelRunner>(model, std::move(cache), samples_rows);
}

absl::Status ModelRunnerOptions::Validate() const {
  if (num_blocks < 1) return absl::InvalidArgumentError("cuda runner: num_blocks must be >= 1");
  if (block_size < 1) return absl::InvalidArgumentError("cuda runner: block_size must be >= 1");
  if (max_batch_tokens < 1 || max_seqs < 1 || max_logit_rows < 0) {
    return absl::InvalidArgumentError(
        "cuda runner: max_batch_tokens and max_seqs must be >= 1, max_logit_rows >= 0");
  }
  return absl::OkStatus();
}

absl::Status CudaSupportsModel(const ModelConfig& c) {
  if (c.hidden_act != Activation::kSilu || c.sandwich_norms || c.embedding_scale != 1.0f ||
      c.query_pre_attn_scalar > 0 || !c.sliding_layers.empty()) {
    // Gemma 3's GeGLU, sandwich norms, scaled embeddings, attention scale and interleaved
    // sliding layers are not in the device model.
    return absl::UnimplementedError(absl::StrFormat(
        "--device=cuda: %s (GeGLU, norms after attention and MLP, interleaved sliding-window "
        "layers) is not implemented by the CUDA backend; run it with --device=cpu",
        c.architecture));
  }
  if (c.n_experts > 0) {
    return absl::UnimplementedError(absl::StrFormat(
        "--device=cuda: %s is a mixture of experts, which the CUDA backend does not implement; "
        "run it with --device=cpu",
        c.architecture));
  }
  if (c.qk_norm) {
    // The device model (engine/cuda/device_model.cu) has no per-head q/k norm: refused rather
    // than run without it.
    return absl::UnimplementedError(absl::StrFormat(
        "--device=cuda: %s normalises each head of q and k (q_norm/k_norm), which the CUDA "
        "backend does not implement; run it with --device=cpu",
        c.architecture));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaModelRunner(const Model& model,
                                                                 const ModelRunnerOptions& o) {
  if (absl::Status s = o.Validate(); !s.ok()) return s;
  const ModelConfig& c = model.config();
  if (absl::Status s = CudaSupportsModel(c); !s.ok()) return s;
  auto api = LoadCudaApi();
  if (!api.ok()) {
    return absl::UnavailableError(absl::StrFormat("--device=cuda: %s", api.status().message()));
  }
  const ModelWeights& w = model.weights();
  const DType wd = w.classifier.dtype;
  for (const LayerWeights& l : w.layers) {
    for (const WeightRef* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) {
      if (m->dtype != wd) {
        return absl::InvalidArgumentError(
            "--device=cuda: the model's matrices must share one dtype (load with --dtype)");
      }
    }
  }
  if (wd != DType::kF32 && wd != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--device=cuda: matrices of dtype %s are not supported (f32 or bf16; use --dtype)",
        DTypeName(wd)));
  }
  if (DTypeCode(w.token_embedding.dtype) < 0) {
    return absl::InvalidArgumentError("--device=cuda: unsupported token embedding dtype");
  }
  absl::StatusOr<int> kv_code = KvDtypeCode(*api, o.kv_dtype, c.head_dim);
  if (!kv_code.ok()) return kv_code.status();
  const std::vector<float> inv_freq = c.RopeInvFreq();
  TandemModelDesc d{};
  d.dim = c.dim;
  d.hidden_dim = c.hidden_dim;
  d.n_layers = c.n_layers;
  d.n_heads = c.n_heads;
  d.n_kv_heads = c.n_kv_heads;
  d.head_dim = c.head_dim;
  d.vocab_size = c.vocab_size;
  d.max_seq_len = c.max_seq_len;
  d.sliding_window = c.sliding_window;
  d.norm_eps = c.norm_eps;
  d.rope_style = c.rope_style == RopeStyle::kInterleaved ? 0 : 1;
  d.rope_inv_freq = inv_freq.data();
  d.weight_dtype = DTypeCode(wd);
  d.qkv_bias = c.qkv_bias ? 1 : 0;
  d.num_blocks = o.num_blocks;
  d.block_size = o.block_size;
  // A padded decode step must fit: capacities are rounded up to the step's bucket.
  const int seqs = std::min(o.max_seqs, o.max_batch_tokens);
  const int bucket = cuda::DecodeBucket(seqs);
  d.max_seqs = bucket > 0 ? bucket : seqs;
  d.max_batch_tokens = std::max(o.max_batch_tokens, d.max_seqs);
  d.max_logit_rows = std::max(o.max_logit_rows, d.max_seqs);
  d.use_graphs = o.use_graphs ? 1 : 0;
  d.kv_dtype = *kv_code;
  std::vector<TandemLayerWeights> layers(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = w.layers[i];
    layers[i] = {l.wq.data, l.wk.data,   l.wv.data,  l.wo.data, l.w1.data, l.w2.data,
                 l.w3.data, l.attn_norm, l.ffn_norm, l.bq,      l.bk,      l.bv};
  }
  TandemModelWeights tw{};
  tw.embedding_dtype = DTypeCode(w.token_embedding.dtype);
  tw.token_embedding = w.token_embedding.data;
  tw.layers = layers.data();
  tw.final_norm = w.final_norm;
  tw.classifier = w.classifier.data;
  TandemModel* m = nullptr;
  if (int rc = (*api)->model_create(&d, &tw, 0, &m)) {
    return CudaError(*api, rc, "--device=cuda: creating the device model");
  }
  return std::unique_ptr<ModelRunner>(new CudaModelRunner(*api, m, c, o));
}

absl::StatusOr<DType> ResolveKvDtype(std::string_view name, std::string_view device,
                                     const ModelConfig& config) {
  if (name != "auto" && !name.empty()) return ParseKvDtype(name);
  if (device != "cuda") return DType::kF32;
  auto api = LoadCudaApi();
  if (!api.ok()) return DType::kF32;  // MakeModelRunner reports the missing device
  return (*api)->fi_attention_supported(config.head_dim, TANDEM_KV_BF16, nullptr) != 0
             ? DType::kBF16
             : DType::kF32;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeModelRunner(const std::string& device,
                                                             const Model* model,
                                                             const ModelRunnerOptions& options) {
  if (device == "cuda") return MakeCudaModelRunner(*model, options);
  if (device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrFormat("device: \"%s\" is not one of cpu, cuda", device));
  }
  auto cache =
      KvCache::Create(model->config(), options.num_blocks, options.block_size, 0, options.kv_dtype);
  if (!cache.ok()) return cache.status();
  return MakeCpuModelRunner(model, std::move(*cache));
}

}  // namespace tandem
