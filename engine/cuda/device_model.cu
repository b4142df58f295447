// The device-resident Llama-family model: weights uploaded once, the paged KV cache and every
// activation buffer on the device, one forward step = one host-to-device copy of the packed
// step metadata (step_plan.h), kernels on the model's own stream, one device-to-host copy of the
// logits or sampled tokens. Decode-only steps are padded to a batch bucket and run as a CUDA
// graph captured once per bucket. The layer sequence is engine/model.cc's Model::Forward, op for
// op, so the CPU model is its twin (tests/engine/cuda/cuda_model_test.cc). The KV cache is f32
// (attention by the hand-written kernels) or bf16 / fp8 (attention by FlashInfer, planned once
// per step: kernels/cuda/fi_attention.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/device_model.h"
#include "engine/cuda/step_plan.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fi_attention.h"
#include "kernels/cuda/ops.h"

struct TandemModel {
  TandemModelDesc desc{};
  tandem::cuda::StepLimits limits;
  tandem::cuda::WorkspaceLayout ws;
  std::vector<float> inv_freq_host;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<void*> allocations;
  size_t weight_bytes = 0, kv_bytes = 0;

  struct Layer {
    void *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr, *w1 = nullptr, *w2 = nullptr,
         *w3 = nullptr;
    float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
  };
  int embedding_dtype = 0;
  void* embedding = nullptr;   // [vocab, dim]
  void* classifier = nullptr;  // [vocab, dim] weight_dtype
  float* final_norm = nullptr;
  float* inv_freq = nullptr;  // [head_dim / 2]
  std::vector<Layer> layers;
  char* kv = nullptr;  // [n_layers, 2 (K, V), num_blocks + 1, block_size, kv_width] of kv_dtype
  float* scales = nullptr;                  // fp8: [n_layers, num_blocks + 1, 2, n_kv_heads]
  tandem::cuda::FiAttention* fi = nullptr;  // bf16 / fp8 caches: their attention
  char* work = nullptr;
  void* host_stage = nullptr;  // pinned, ws.meta_bytes: the step's upload
  void* wire = nullptr;        // device staging of pack / unpack
  size_t wire_bytes = 0;
  int* table = nullptr;  // device staging of a pack / unpack block table
  size_t table_ints = 0;

  // (decode bucket, context bucket) -> captured step (nullptr: its capture failed)
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs;
  long long graph_replays = 0;
  int graph_failures = 0;
  std::mutex mu;  // one step or pack / unpack at a time

  int kv_width() const { return desc.n_kv_heads * desc.head_dim; }
  // Bytes of one layer's K (or V) cache.
  size_t LayerKvBytes() const {
    return static_cast<size_t>(desc.num_blocks + 1) * desc.block_size * kv_width() *
           tandem::cuda::KvElementBytes(desc.kv_dtype);
  }
  void* k_cache(int l) const { return kv + 2 * LayerKvBytes() * l; }
  void* v_cache(int l) const { return kv + 2 * LayerKvBytes() * l + LayerKvBytes(); }
  size_t LayerScales() const {
    return static_cast<size_t>(desc.num_blocks + 1) * 2 * desc.n_kv_heads;
  }
  float* layer_scales(int l) const { return scales ? scales + LayerScales() * l : nullptr; }
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(work + offset);
  }
};

namespace tandem::cuda {
namespace {

int Alloc(TandemModel* m, size_t bytes, void** p, const char* what) {
  *p = nullptr;
  if (int e = Check(cudaMalloc(p, bytes == 0 ? 16 : bytes), what)) return e;
  m->allocations.push_back(*p);
  return 0;
}

// Uploads `src` ([count] elements of `elem` bytes), or fills it randomly when src is null and
// `random` is set: uniform in [-scale, scale), or `scale` everywhere when constant.
int Weight(TandemModel* m, const void* src, size_t count, int dtype, bool random, uint64_t seed,
           float scale, bool constant, void** out, const char* what) {
  const size_t elem = dtype == 0 ? 4 : 2;
  if (int e = Alloc(m, count * elem, out, what)) return e;
  m->weight_bytes += count * elem;
  if (random) {
    return FillRandom(*out, dtype == 1 ? 2 : dtype, static_cast<int64_t>(count), seed, scale,
                      constant ? 1 : 0, m->stream);
  }
  if (src == nullptr) return BadArg(what, "weight pointer is null");
  return Check(cudaMemcpyAsync(*out, src, count * elem, cudaMemcpyHostToDevice, m->stream), what);
}

int UploadWeights(TandemModel* m, const TandemModelWeights* w, uint64_t seed) {
  const TandemModelDesc& d = m->desc;
  const bool random = w == nullptr;
  const size_t dim = d.dim, hid = d.hidden_dim, q = static_cast<size_t>(d.n_heads) * d.head_dim,
               kv = static_cast<size_t>(d.n_kv_heads) * d.head_dim, vocab = d.vocab_size;
  const int wd = d.weight_dtype;
  uint64_t s = seed;
  auto mat = [&](const void* src, size_t rows, size_t cols, void** out, const char* what) {
    return Weight(m, src, rows * cols, wd, random, ++s, 1.f / std::sqrt(static_cast<float>(cols)),
                  false, out, what);
  };
  auto vec = [&](const float* src, size_t n, float value, float** out, const char* what) {
    return Weight(m, src, n, 0, random, ++s, value, true, reinterpret_cast<void**>(out), what);
  };
  m->embedding_dtype = random ? wd : w->embedding_dtype;
  if (m->embedding_dtype < 0 || m->embedding_dtype > 2) {
    return BadArg("model_create", "embedding_dtype must be 0, 1 or 2");
  }
  if (int e = Weight(m, random ? nullptr : w->token_embedding, vocab * dim, m->embedding_dtype,
                     random, ++s, 1.f, false, &m->embedding, "upload token_embedding")) {
    return e;
  }
  if (!random && w->classifier == w->token_embedding && m->embedding_dtype == wd) {
    m->classifier = m->embedding;
  } else if (random) {
    m->classifier = m->embedding;  // tied, as the bench's Llama-shaped model does not care
  } else if (int e = mat(w->classifier, vocab, dim, &m->classifier, "upload classifier")) {
    return e;
  }
  if (int e = vec(random ? nullptr : w->final_norm, dim, 1.f, &m->final_norm, "final_norm")) {
    return e;
  }
  if (!random && w->layers == nullptr) return BadArg("model_create", "weights->layers is null");
  m->layers.resize(d.n_layers);
  for (int l = 0; l < d.n_layers; ++l) {
    TandemModel::Layer& L = m->layers[l];
    const TandemLayerWeights* h = random ? nullptr : &w->layers[l];
    if (int e = mat(h ? h->wq : nullptr, q, dim, &L.wq, "upload wq")) return e;
    if (int e = mat(h ? h->wk : nullptr, kv, dim, &L.wk, "upload wk")) return e;
    if (int e = mat(h ? h->wv : nullptr, kv, dim, &L.wv, "upload wv")) return e;
    if (int e = mat(h ? h->wo : nullptr, dim, q, &L.wo, "upload wo")) return e;
    if (int e = mat(h ? h->w1 : nullptr, hid, dim, &L.w1, "upload w1")) return e;
    if (int e = mat(h ? h->w2 : nullptr, dim, hid, &L.w2, "upload w2")) return e;
    if (int e = mat(h ? h->w3 : nullptr, hid, dim, &L.w3, "upload w3")) return e;
    if (int e = vec(h ? h->attn_norm : nullptr, dim, 1.f, &L.attn_norm, "attn_norm")) return e;
    if (int e = vec(h ? h->ffn_norm : nullptr, dim, 1.f, &L.ffn_norm, "ffn_norm")) return e;
    if (d.qkv_bias) {
      if (int e = vec(h ? h->bq : nullptr, q, 0.f, &L.bq, "bq")) return e;
      if (int e = vec(h ? h->bk : nullptr, kv, 0.f, &L.bk, "bk")) return e;
      if (int e = vec(h ? h->bv : nullptr, kv, 0.f, &L.bv, "bv")) return e;
    }
  }
  return 0;
}

// One layer's attention: att [T, q_dim] from q and the layer's cache, which this step's K/V
// rows k, v [T, kv_dim] are first written into (fp8: after the chunks' scales are set).
int Attention(TandemModel* m, int l, const StepLayout& L, int T, int num_seqs, int num_tiles,
              bool decode_only, int max_context, int table_stride, const float* q, const float* k,
              const float* v, float* att) {
  const TandemModelDesc& d = m->desc;
  const WorkspaceLayout& w = m->ws;
  cudaStream_t st = m->stream;
  const int* meta = m->At<int>(w.meta);
  if (d.kv_dtype == kKvF32) {
    float* kc = static_cast<float*>(m->k_cache(l));
    float* vc = static_cast<float*>(m->v_cache(l));
    if (int e = WriteKv(k, v, meta + L.slots, T, m->kv_width(), kc, vc, st)) return e;
    PagedAttentionDeviceArgs a;
    a.num_tokens = T;
    a.n_heads = d.n_heads;
    a.n_kv_heads = d.n_kv_heads;
    a.head_dim = d.head_dim;
    a.block_size = d.block_size;
    a.max_blocks_per_seq = table_stride;
    a.token_seq = meta + L.token_seq;
    a.token_pos = meta + L.token_pos;
    a.block_tables = meta + L.block_tables;
    a.sliding_window = d.sliding_window;
    if (decode_only) {
      return PagedAttentionDecode(q, kc, vc, a, max_context, m->At<void>(w.attn), w.attn_bytes, att,
                                  st);
    }
    // bf16 models take the tensor-core prefill attention; f32 models stay in f32 throughout.
    const bool tc_attention = d.weight_dtype == 2 && d.head_dim % 16 == 0;
    return PrefillAttention(q, kc, vc, a, meta + L.tiles, num_tiles, tc_attention, att, st);
  }
  float* scales = m->layer_scales(l);
  if (d.kv_dtype == kKvFp8) {
    if (int e = SetFp8Scales(k, v, meta + L.fi_q_indptr, meta + L.token_pos, num_seqs,
                             meta + L.block_tables, table_stride, d.n_kv_heads, d.head_dim,
                             d.block_size, scales, st)) {
      return e;
    }
  }
  if (int e = WriteKvTyped(k, v, meta + L.slots, T, d.n_kv_heads, d.head_dim, d.block_size,
                           d.kv_dtype, scales, m->k_cache(l), m->v_cache(l), st)) {
    return e;
  }
  const int64_t n = static_cast<int64_t>(T) * d.n_heads * d.head_dim;
  if (int e = F32ToBf16(q, m->At<void>(w.q16), n, st)) return e;
  FiSequences seqs;
  seqs.q_indptr = meta + L.fi_q_indptr;
  seqs.kv_indptr = meta + L.fi_kv_indptr;
  seqs.kv_indices = meta + L.fi_kv_indices;
  seqs.kv_last_page_len = meta + L.fi_last_page_len;
  if (int e = m->fi->Run(m->At<void>(w.q16), m->k_cache(l), m->v_cache(l), scales, seqs,
                         m->At<void>(w.o16), st)) {
    return e;
  }
  return Bf16ToF32(m->At<void>(w.o16), att, n, st);
}

// The layers and the classifier for the step whose metadata is at ws.meta with `layout` (block
// tables of `table_stride` ids per row, num_seqs sequences); only stream-ordered work, so it can
// be captured into a graph. max_context: the decode attention's context bound (<= table_stride *
// block_size).
int RunStep(TandemModel* m, const StepLayout& L, int T, int R, int num_seqs, int num_tiles,
            bool decode_only, int max_context, int table_stride) {
  const TandemModelDesc& d = m->desc;
  const WorkspaceLayout& w = m->ws;
  cudaStream_t st = m->stream;
  const int* meta = m->At<int>(w.meta);
  const int q_dim = d.n_heads * d.head_dim, kv_dim = m->kv_width();
  float *x = m->At<float>(w.x), *xb = m->At<float>(w.xb), *q = m->At<float>(w.q),
        *k = m->At<float>(w.k), *v = m->At<float>(w.v), *att = m->At<float>(w.att),
        *hb = m->At<float>(w.hb), *hb2 = m->At<float>(w.hb2), *rows = m->At<float>(w.rows),
        *logits = m->At<float>(w.logits);
  void* x16 = m->At<void>(w.x16);
  const size_t x16_bytes = w.q16 - w.x16;
  const int* pos = meta + L.token_pos;
  const int wd = d.weight_dtype;
  // same_input: the previous GEMM had the same input, already rounded to bf16 in x16.
  auto gemm = [&](const float* in, const void* wt, const float* bias, float* out, int n, int r,
                  int c, bool same_input = false) {
    return Gemm(m->cublas, in, wd, wt, bias, out, n, r, c, x16, x16_bytes, st, same_input);
  };
  if (int e = Embedding(meta + L.ids, m->embedding_dtype, m->embedding, d.vocab_size, d.dim, x, T,
                        m->At<int>(w.bad), st)) {
    return e;
  }
  for (int l = 0; l < d.n_layers; ++l) {
    const TandemModel::Layer& W = m->layers[l];
    if (int e = RmsNorm(x, W.attn_norm, xb, T, d.dim, d.norm_eps, st)) return e;
    if (int e = gemm(xb, W.wq, W.bq, q, T, q_dim, d.dim)) return e;
    if (int e = gemm(xb, W.wk, W.bk, k, T, kv_dim, d.dim, true)) return e;
    if (int e = gemm(xb, W.wv, W.bv, v, T, kv_dim, d.dim, true)) return e;
    if (int e = Rope(q, T, d.n_heads, d.head_dim, pos, m->inv_freq, d.rope_style, st)) return e;
    if (int e = Rope(k, T, d.n_kv_heads, d.head_dim, pos, m->inv_freq, d.rope_style, st)) return e;
    if (int e = Attention(m, l, L, T, num_seqs, num_tiles, decode_only, max_context, table_stride,
                          q, k, v, att)) {
      return e;
    }
    if (int e = gemm(att, W.wo, nullptr, xb, T, d.dim, q_dim)) return e;
    if (int e = Add(x, xb, static_cast<int64_t>(T) * d.dim, st)) return e;
    if (int e = RmsNorm(x, W.ffn_norm, xb, T, d.dim, d.norm_eps, st)) return e;
    if (int e = gemm(xb, W.w1, nullptr, hb, T, d.hidden_dim, d.dim)) return e;
    if (int e = gemm(xb, W.w3, nullptr, hb2, T, d.hidden_dim, d.dim, true)) return e;
    if (int e = SiluMul(hb, hb2, hb, static_cast<int64_t>(T) * d.hidden_dim, st)) return e;
    if (int e = gemm(hb, W.w2, nullptr, xb, T, d.dim, d.hidden_dim)) return e;
    if (int e = Add(x, xb, static_cast<int64_t>(T) * d.dim, st)) return e;
  }
  if (int e = GatherRows(x, meta + L.logit_rows, R, d.dim, rows, st)) return e;
  if (int e = RmsNorm(rows, m->final_norm, rows, R, d.dim, d.norm_eps, st)) return e;
  return gemm(rows, m->classifier, nullptr, logits, R, d.vocab_size, d.dim);
}

// Captures the padded decode step of `bucket` rows (not run: capture only records); nullptr
// with the reason in last_error() when the capture fails.
cudaGraphExec_t CaptureDecode(TandemModel* m, const StepLayout& L, int bucket, int context) {
  if (Check(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture")) {
    return nullptr;
  }
  const int run =
      RunStep(m, L, bucket, bucket, bucket, 0, true, context, context / m->desc.block_size);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(m->stream, &graph);
  cudaGraphExec_t exec = nullptr;
  if (run == 0 && Check(end, "cudaStreamEndCapture") == 0) {
    if (Check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate") != 0) {
      exec = nullptr;
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture leaves nothing for the next step to trip on
  return exec;
}

// A padded decode step of `bucket` rows in context bucket `context`. The first step of a
// (bucket, context) runs eagerly (which also warms cuBLAS and loads every kernel before any
// capture), then is captured; later steps replay the graph. One whose capture failed keeps
// running eagerly.
int RunDecodeStep(TandemModel* m, const StepLayout& L, int bucket, int context) {
  const std::pair<int, int> key(bucket, context);
  auto it = m->graphs.find(key);
  if (it != m->graphs.end() && it->second != nullptr) {
    ++m->graph_replays;
    return Check(cudaGraphLaunch(it->second, m->stream), "cudaGraphLaunch");
  }
  if (int e =
          RunStep(m, L, bucket, bucket, bucket, 0, true, context, context / m->desc.block_size)) {
    return e;
  }
  if (it == m->graphs.end()) {
    cudaGraphExec_t exec = CaptureDecode(m, L, bucket, context);
    if (exec == nullptr) ++m->graph_failures;
    m->graphs.emplace(key, exec);
  }
  return 0;
}

int DoForward(TandemModel* m, const TandemStepChunk* chunks, int num_chunks, const int* tokens,
              const int* block_tables, const TandemSampleRowParams* sample_params,
              float* logits_out, int* sampled, int* num_rows) {
  if (chunks == nullptr || tokens == nullptr || block_tables == nullptr || num_chunks <= 0) {
    return BadArg("model_forward", "chunks, tokens and block_tables must be given, num_chunks > 0");
  }
  std::vector<StepChunk> batch(num_chunks);
  size_t tok = 0, blk = 0;
  for (int s = 0; s < num_chunks; ++s) {
    if (chunks[s].num_tokens < 0 || chunks[s].num_blocks < 0) {
      return BadArg("model_forward", "a chunk's num_tokens or num_blocks is negative");
    }
    batch[s].tokens = std::span<const int>(tokens + tok, chunks[s].num_tokens);
    batch[s].block_table = std::span<const int>(block_tables + blk, chunks[s].num_blocks);
    batch[s].start_pos = chunks[s].start_pos;
    batch[s].all_logits = chunks[s].all_logits != 0;
    tok += chunks[s].num_tokens;
    blk += chunks[s].num_blocks;
  }
  StepPlan plan;
  const std::string err = PlanStep(batch, m->limits, m->desc.use_graphs != 0, &plan);
  if (!err.empty()) return BadArg("model_forward", err.c_str());
  const WorkspaceLayout& w = m->ws;
  // One upload: the metadata, then the sampling parameters of the real rows.
  const size_t params_at = SampleParamsOffset(plan.meta.size());
  const size_t bytes = sample_params != nullptr
                           ? params_at + plan.num_real_rows * sizeof(TandemSampleRowParams)
                           : plan.meta.size() * 4;
  if (bytes > w.meta_bytes) return BadArg("model_forward", "step metadata exceeds its buffer");
  // A step that failed half-way may have left its upload in flight from the pinned buffer.
  if (int e = Check(cudaStreamSynchronize(m->stream), "model_forward (previous step)")) return e;
  std::memcpy(m->host_stage, plan.meta.data(), plan.meta.size() * 4);
  if (sample_params != nullptr) {
    std::memcpy(static_cast<char*>(m->host_stage) + params_at, sample_params,
                plan.num_real_rows * sizeof(TandemSampleRowParams));
  }
  if (int e = Check(cudaMemcpyAsync(m->At<void>(w.meta), m->host_stage, bytes,
                                    cudaMemcpyHostToDevice, m->stream),
                    "model_forward upload")) {
    return e;
  }
  const bool graph = plan.context_bucket > 0;  // only when use_graphs asked PlanStep to pad
  if (m->fi != nullptr) {
    // The attention's work split, for every layer of this step (a graph's: before each replay).
    const int32_t* meta = plan.meta.data();
    if (int e = m->fi->Plan(meta + plan.layout.fi_q_indptr, meta + plan.layout.fi_kv_indptr,
                            plan.num_seqs, graph, m->stream)) {
      return e;
    }
  }
  if (graph) {
    if (int e = RunDecodeStep(m, plan.layout, plan.num_tokens, plan.context_bucket)) return e;
  } else if (int e =
                 RunStep(m, plan.layout, plan.num_tokens, plan.num_rows, plan.num_seqs,
                         plan.num_tiles, plan.decode_only, plan.max_context, plan.table_stride)) {
    return e;
  }
  const float* d_logits = m->At<float>(w.logits);
  const int rows = plan.num_real_rows;
  if (sample_params != nullptr && sampled != nullptr) {
    if (int e = Sample(d_logits, rows, m->desc.vocab_size,
                       reinterpret_cast<const SampleRowParams*>(m->work + w.meta + params_at),
                       m->At<void>(w.sample), w.sample_bytes, m->At<int>(w.tokens), m->stream)) {
      return e;
    }
    if (int e = Check(cudaMemcpyAsync(sampled, m->At<int>(w.tokens), rows * sizeof(int),
                                      cudaMemcpyDeviceToHost, m->stream),
                      "model_forward download tokens")) {
      return e;
    }
  }
  if (logits_out != nullptr) {
    if (int e = Check(cudaMemcpyAsync(logits_out, d_logits,
                                      static_cast<size_t>(rows) * m->desc.vocab_size * 4,
                                      cudaMemcpyDeviceToHost, m->stream),
                      "model_forward download logits")) {
      return e;
    }
  }
  if (int e = Check(cudaStreamSynchronize(m->stream), "model_forward")) return e;
  if (num_rows != nullptr) *num_rows = rows;
  return 0;
}

// Checks a pack / unpack request and stages its block table and wire buffer on the device.
int StageKv(TandemModel* m, int layer, const int* block_table, int num_blocks, int token_start,
            int token_count, const char* what) {
  const int bs = m->desc.block_size;
  if (layer < 0 || layer >= m->desc.n_layers) return BadArg(what, "layer out of range");
  if (block_table == nullptr || token_start < 0 || token_count <= 0) {
    return BadArg(what, "block_table given, token_start >= 0, token_count > 0");
  }
  const long long needed = (static_cast<long long>(token_start) + token_count + bs - 1) / bs;
  if (needed > num_blocks) return BadArg(what, "block_table does not cover the token range");
  for (long long i = token_start / bs; i < needed; ++i) {
    if (block_table[i] < 0 || block_table[i] >= m->desc.num_blocks) {
      return BadArg(what, "block id out of range");
    }
  }
  if (static_cast<size_t>(needed) > m->table_ints) {
    if (m->table != nullptr) cudaFree(m->table);
    m->table = nullptr;
    m->table_ints = 0;
    if (int e = Check(cudaMalloc(&m->table, needed * sizeof(int)), what)) return e;
    m->table_ints = needed;
  }
  const size_t wire =
      KvWireBytes(m->desc.kv_dtype, m->desc.n_kv_heads, m->desc.head_dim, token_count);
  if (wire > m->wire_bytes) {
    if (m->wire != nullptr) cudaFree(m->wire);
    m->wire = nullptr;
    m->wire_bytes = 0;
    if (int e = Check(cudaMalloc(&m->wire, wire), what)) return e;
    m->wire_bytes = wire;
  }
  return Check(cudaMemcpyAsync(m->table, block_table, needed * sizeof(int), cudaMemcpyHostToDevice,
                               m->stream),
               what);
}

}  // namespace

int ModelCreate(const TandemModelDesc* desc, const TandemModelWeights* weights,
                uint64_t random_seed, TandemModel** out) {
  if (desc == nullptr || out == nullptr) return BadArg("model_create", "desc and out are needed");
  *out = nullptr;
  const std::string err = ValidateModelDesc(*desc);
  if (!err.empty()) return BadArg("model_create", err.c_str());
  auto* m = new TandemModel();
  m->desc = *desc;
  m->inv_freq_host.assign(desc->rope_inv_freq, desc->rope_inv_freq + desc->head_dim / 2);
  m->desc.rope_inv_freq = m->inv_freq_host.data();
  m->limits = LimitsFromDesc(*desc);
  const int decode_rows = std::min(desc->max_seqs, desc->max_batch_tokens);
  const int max_context = m->limits.max_blocks_per_seq() * desc->block_size;
  WorkspaceShape shape;
  shape.dim = desc->dim;
  shape.hidden_dim = desc->hidden_dim;
  shape.q_dim = desc->n_heads * desc->head_dim;
  shape.kv_dim = m->kv_width();
  shape.n_heads = desc->n_heads;
  shape.head_dim = desc->head_dim;
  shape.vocab_size = desc->vocab_size;
  shape.bf16_weights = desc->weight_dtype == 2;
  shape.fi_attention = desc->kv_dtype != kKvF32;
  m->ws = MakeWorkspaceLayout(
      shape, m->limits,
      // FlashInfer's attention (bf16 / fp8 caches) keeps its own workspace.
      shape.fi_attention
          ? 0
          : PagedAttentionWorkspaceBytes(decode_rows, desc->n_heads, desc->head_dim, max_context),
      SampleWorkspaceBytes(desc->max_logit_rows, desc->vocab_size), sizeof(TandemSampleRowParams));
  auto fail = [m](int e) {
    ModelDestroy(m);
    return e;
  };
  if (int e = Check(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking),
                    "model_create cudaStreamCreate")) {
    return fail(e);
  }
  if (cublasCreate(&m->cublas) != CUBLAS_STATUS_SUCCESS) {
    m->cublas = nullptr;
    return fail(BadArg("model_create", "cublasCreate failed"));
  }
  // A workspace of our own, so that cuBLAS allocates nothing while a graph is captured.
  constexpr size_t kCublasWorkspace = 32u << 20;
  void* cublas_ws = nullptr;
  if (int e = Alloc(m, kCublasWorkspace, &cublas_ws, "model_create cuBLAS workspace")) {
    return fail(e);
  }
  // The stream first: cublasSetStream resets the workspace to the default pool.
  if (cublasSetStream(m->cublas, m->stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(m->cublas, cublas_ws, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS) {
    return fail(BadArg("model_create", "cublasSetStream / cublasSetWorkspace failed"));
  }
  if (int e = UploadWeights(m, weights, random_seed)) return fail(e);
  void* p = nullptr;
  if (int e = Alloc(m, (desc->head_dim / 2) * sizeof(float), &p, "model_create inv_freq")) {
    return fail(e);
  }
  m->inv_freq = static_cast<float*>(p);
  if (int e = Check(
          cudaMemcpyAsync(m->inv_freq, m->inv_freq_host.data(),
                          (desc->head_dim / 2) * sizeof(float), cudaMemcpyHostToDevice, m->stream),
          "model_create inv_freq")) {
    return fail(e);
  }
  m->kv_bytes = 2 * m->LayerKvBytes() * desc->n_layers;
  if (int e = Alloc(m, m->kv_bytes, &p, "model_create KV cache")) return fail(e);
  m->kv = static_cast<char*>(p);
  if (int e = Check(cudaMemsetAsync(m->kv, 0, m->kv_bytes, m->stream), "model_create KV zero")) {
    return fail(e);
  }
  if (desc->kv_dtype == kKvFp8) {
    const size_t n = m->LayerScales() * desc->n_layers;
    if (int e = Alloc(m, n * sizeof(float), &p, "model_create fp8 KV scales")) return fail(e);
    m->scales = static_cast<float*>(p);
    m->kv_bytes += n * sizeof(float);
    if (int e = FillRandom(m->scales, 0, static_cast<int64_t>(n), 0, 1.0f, 1, m->stream)) {
      return fail(e);
    }
  }
  if (desc->kv_dtype != kKvF32) {
    FiShape fs;
    fs.n_heads = desc->n_heads;
    fs.n_kv_heads = desc->n_kv_heads;
    fs.head_dim = desc->head_dim;
    fs.block_size = desc->block_size;
    fs.kv_dtype = desc->kv_dtype;
    fs.sliding_window = desc->sliding_window;
    m->fi = FiAttention::Create(fs, desc->max_batch_tokens, desc->max_seqs);
    if (m->fi == nullptr) return fail(static_cast<int>(cudaErrorInvalidValue));
  }
  if (int e = Alloc(m, m->ws.total, &p, "model_create workspace")) return fail(e);
  m->work = static_cast<char*>(p);
  if (int e = Check(cudaMallocHost(&m->host_stage, m->ws.meta_bytes), "model_create pinned")) {
    return fail(e);
  }
  if (int e = Check(cudaStreamSynchronize(m->stream), "model_create upload")) return fail(e);
  *out = m;
  return 0;
}

void ModelDestroy(TandemModel* m) {
  if (m == nullptr) return;
  if (m->stream != nullptr) cudaStreamSynchronize(m->stream);
  for (auto& [bucket, exec] : m->graphs) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  if (m->cublas != nullptr) cublasDestroy(m->cublas);
  delete m->fi;
  for (void* p : m->allocations) cudaFree(p);
  if (m->wire != nullptr) cudaFree(m->wire);
  if (m->table != nullptr) cudaFree(m->table);
  if (m->host_stage != nullptr) cudaFreeHost(m->host_stage);
  if (m->stream != nullptr) cudaStreamDestroy(m->stream);
  delete m;
}

int ModelInfo(const TandemModel* m, TandemModelInfo* info) {
  if (m == nullptr || info == nullptr) return BadArg("model_info", "model and info are needed");
  info->num_blocks = m->desc.num_blocks;
  info->block_size = m->desc.block_size;
  info->kv_width = m->kv_width();
  info->weight_bytes = m->weight_bytes;
  info->kv_bytes = m->kv_bytes;
  info->workspace_bytes = m->ws.total;
  info->graphs_captured = static_cast<int>(m->graphs.size()) - m->graph_failures;
  info->graph_capture_failures = m->graph_failures;
  info->graph_replays = m->graph_replays;
  return 0;
}

int ModelForward(TandemModel* m, const TandemStepChunk* chunks, int num_chunks, const int* tokens,
                 const int* block_tables, const TandemSampleRowParams* sample_params, float* logits,
                 int* sampled, int* num_rows) {
  if (m == nullptr) return BadArg("model_forward", "model is null");
  std::lock_guard<std::mutex> lock(m->mu);
  return DoForward(m, chunks, num_chunks, tokens, block_tables, sample_params, logits, sampled,
                   num_rows);
}

int ModelPackKv(TandemModel* m, int layer, const int* block_table, int num_blocks, int token_start,
                int token_count, void* wire) {
  if (m == nullptr || wire == nullptr) return BadArg("model_pack_kv", "model and wire needed");
  std::lock_guard<std::mutex> lock(m->mu);
  if (int e =
          StageKv(m, layer, block_table, num_blocks, token_start, token_count, "model_pack_kv")) {
    return e;
  }
  const TandemModelDesc& d = m->desc;
  if (int e = PackKvTyped(m->k_cache(layer), m->v_cache(layer), m->layer_scales(layer), m->table,
                          d.block_size, d.n_kv_heads, d.head_dim, d.kv_dtype, token_start,
                          token_count, m->wire, m->stream)) {
    return e;
  }
  const size_t bytes = KvWireBytes(d.kv_dtype, d.n_kv_heads, d.head_dim, token_count);
  if (int e = Check(cudaMemcpyAsync(wire, m->wire, bytes, cudaMemcpyDeviceToHost, m->stream),
                    "model_pack_kv download")) {
    return e;
  }
  return Check(cudaStreamSynchronize(m->stream), "model_pack_kv");
}

int ModelUnpackKv(TandemModel* m, int layer, const int* block_table, int num_blocks,
                  int token_start, int token_count, const void* wire) {
  if (m == nullptr || wire == nullptr) return BadArg("model_unpack_kv", "model and wire needed");
  std::lock_guard<std::mutex> lock(m->mu);
  if (int e =
          StageKv(m, layer, block_table, num_blocks, token_start, token_count, "model_unpack_kv")) {
    return e;
  }
  const TandemModelDesc& d = m->desc;
  const size_t bytes = KvWireBytes(d.kv_dtype, d.n_kv_heads, d.head_dim, token_count);
  if (int e = Check(cudaMemcpyAsync(m->wire, wire, bytes, cudaMemcpyHostToDevice, m->stream),
                    "model_unpack_kv upload")) {
    return e;
  }
  if (int e = UnpackKvTyped(m->wire, m->table, d.block_size, d.n_kv_heads, d.head_dim, d.kv_dtype,
                            token_start, token_count, m->k_cache(layer), m->v_cache(layer),
                            m->layer_scales(layer), m->stream)) {
    return e;
  }
  return Check(cudaStreamSynchronize(m->stream), "model_unpack_kv");
}

int PagedAttentionFi(const float* d_q, int kv_dtype, const void* d_k_cache, const void* d_v_cache,
                     const float* d_scales, int n_heads, int n_kv_heads, int head_dim,
                     int block_size, int sliding_window, const TandemStepChunk* chunks,
                     int num_chunks, const int* block_tables, float* d_out) {
  if (chunks == nullptr || block_tables == nullptr || num_chunks <= 0 || block_size <= 0) {
    return BadArg("paged_attention_fi", "chunks and block_tables given, num_chunks > 0");
  }
  // The chunks' tables as rows of one stride, then FlashInfer's page lists of them.
  std::vector<int> counts(num_chunks), starts(num_chunks);
  int stride = 1;
  for (int s = 0; s < num_chunks; ++s) {
    counts[s] = chunks[s].num_tokens;
    starts[s] = chunks[s].start_pos;
    const int needed = (starts[s] + counts[s] + block_size - 1) / block_size;
    if (counts[s] <= 0 || starts[s] < 0 || chunks[s].num_blocks < needed) {
      return BadArg("paged_attention_fi", "a chunk without tokens or blocks for its positions");
    }
    stride = std::max(stride, needed);
  }
  std::vector<int32_t> tables(static_cast<size_t>(num_chunks) * stride, 0);
  for (int s = 0, at = 0; s < num_chunks; at += chunks[s].num_blocks, ++s) {
    std::copy_n(block_tables + at, (starts[s] + counts[s] + block_size - 1) / block_size,
                tables.begin() + static_cast<size_t>(s) * stride);
  }
  FiPageLists lists;
  BuildFiPageLists(counts, starts, tables.data(), stride, block_size, &lists);
  const int rows = lists.q_indptr.back();
  FiShape shape;
  shape.n_heads = n_heads;
  shape.n_kv_heads = n_kv_heads;
  shape.head_dim = head_dim;
  shape.block_size = block_size;
  shape.kv_dtype = kv_dtype;
  shape.sliding_window = sliding_window;
  FiAttention* fi = FiAttention::Create(shape, rows, num_chunks);
  if (fi == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  // One device buffer: the four page-list arrays, then bf16 queries and output.
  const size_t ints = lists.q_indptr.size() + lists.kv_indptr.size() +
                      lists.kv_last_page_len.size() + lists.kv_indices.size();
  const size_t elems = static_cast<size_t>(rows) * n_heads * head_dim;
  const size_t ints_bytes = (ints * 4 + 255) / 256 * 256;
  char* buf = nullptr;
  int rc = Check(cudaMalloc(&buf, ints_bytes + 2 * elems * 2), "paged_attention_fi buffers");
  if (rc == 0) {
    int32_t* d = reinterpret_cast<int32_t*>(buf);
    FiSequences seqs;
    size_t at = 0;
    auto put = [&](const std::vector<int32_t>& v, const int** out) {
      *out = d + at;
      if (rc == 0) {
        rc = Check(cudaMemcpy(d + at, v.data(), v.size() * 4, cudaMemcpyHostToDevice),
                   "paged_attention_fi upload");
      }
      at += v.size();
    };
    put(lists.q_indptr, &seqs.q_indptr);
    put(lists.kv_indptr, &seqs.kv_indptr);
    put(lists.kv_last_page_len, &seqs.kv_last_page_len);
    put(lists.kv_indices, &seqs.kv_indices);
    void* q16 = buf + ints_bytes;
    void* o16 = buf + ints_bytes + elems * 2;
    if (rc == 0) rc = F32ToBf16(d_q, q16, static_cast<int64_t>(elems), nullptr);
    if (rc == 0) {
      rc = fi->Plan(lists.q_indptr.data(), lists.kv_indptr.data(), num_chunks, false, nullptr);
    }
    if (rc == 0) rc = fi->Run(q16, d_k_cache, d_v_cache, d_scales, seqs, o16, nullptr);
    if (rc == 0) rc = Bf16ToF32(o16, d_out, static_cast<int64_t>(elems), nullptr);
    if (rc == 0) rc = Check(cudaDeviceSynchronize(), "paged_attention_fi");
    cudaFree(buf);
  }
  delete fi;
  return rc;
}

}  // namespace tandem::cuda
