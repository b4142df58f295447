/* The plain C interface of libtandem_cuda.so, the CUDA backend library. Binaries never link the
 * library (nor libcuda): kernels/backend_loader.cc dlopen()s it and calls
 * tandem_cuda_get_api(), so every binary starts on machines without a GPU or driver.
 *
 * Pointers named d_* are device pointers. Every function returns 0 on success, or a non-zero
 * CUDA error code with last_error() describing it. Shapes are in comments as [dims]. */
#ifndef TANDEM_KERNELS_CUDA_CUDA_API_H_
#define TANDEM_KERNELS_CUDA_CUDA_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TANDEM_CUDA_ABI_VERSION 5

/* KV cache dtypes (kernels/dtype.h DType values): f32, bf16, fp8 E4M3 with scales. */
#define TANDEM_KV_F32 0
#define TANDEM_KV_BF16 2
#define TANDEM_KV_FP8 3

/* Decode attention over the paged cache; the fields follow PagedAttentionArgs
 * (kernels/backend.h), pointers on the device. */
typedef struct TandemPagedAttentionArgs {
  int num_tokens;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  int block_size;
  int max_blocks_per_seq;
  const int* token_seq;    /* [num_tokens] */
  const int* token_pos;    /* [num_tokens] */
  const int* block_tables; /* [num_seqs, max_blocks_per_seq] */
  int sliding_window;
} TandemPagedAttentionArgs;

/* Sampling parameters of one row (engine/sampling/sampler.h SamplingParams + the draw's counter).
 */
typedef struct TandemSampleRowParams {
  float temperature;
  int top_k;
  float top_p;
  uint64_t seed;
  uint64_t position;
} TandemSampleRowParams;

/* ---- ABI 3: the device-resident model ---- */

/* The shape of a Llama-family model (engine/model_config.h) and the capacities of its
 * device state. Matrices are stored as weight_dtype: 0 f32 or 2 bf16. */
typedef struct TandemModelDesc {
  int dim;
  int hidden_dim;
  int n_layers;
  int n_heads;
  int n_kv_heads;
  int head_dim; /* <= 256 */
  int vocab_size;
  int max_seq_len;
  int sliding_window; /* > 0: attend to at most this many positions */
  float norm_eps;
  int rope_style;             /* 0 interleaved pairs, 1 halves */
  const float* rope_inv_freq; /* host [head_dim / 2], copied */
  int weight_dtype;           /* 0 f32, 2 bf16 */
  int qkv_bias;               /* 1: layers carry bq, bk, bv */
  /* The KV cache: per layer K and V [num_blocks, block_size, n_kv_heads * head_dim] of kv_dtype,
   * plus one pad block (id num_blocks) that padded graph rows write into; fp8 caches also hold
   * scales [num_blocks + 1, 2, n_kv_heads] f32 per layer. */
  int num_blocks;
  int block_size;
  int max_batch_tokens; /* tokens per forward (padding included) */
  int max_seqs;         /* chunks per forward (padding included) */
  int max_logit_rows;   /* logit rows per forward (padding included) */
  int use_graphs;       /* 1: decode-only steps run as CUDA graphs per batch bucket */
  /* ABI 5: TANDEM_KV_F32 (the hand-written attention kernels), TANDEM_KV_BF16 or TANDEM_KV_FP8
   * (FlashInfer's; head_dim 64 or 128, fi_attention_supported). */
  int kv_dtype;
} TandemModelDesc;

/* Host pointers to one layer's weights; matrices row-major in the desc's weight_dtype. */
typedef struct TandemLayerWeights {
  const void* wq;         /* [n_heads * head_dim, dim] */
  const void* wk;         /* [n_kv_heads * head_dim, dim] */
  const void* wv;         /* [n_kv_heads * head_dim, dim] */
  const void* wo;         /* [dim, n_heads * head_dim] */
  const void* w1;         /* gate [hidden_dim, dim] */
  const void* w2;         /* down [dim, hidden_dim] */
  const void* w3;         /* up [hidden_dim, dim] */
  const float* attn_norm; /* [dim] */
  const float* ffn_norm;  /* [dim] */
  const float* bq;        /* [q_dim] when qkv_bias, else ignored */
  const float* bk;        /* [kv_dim] */
  const float* bv;        /* [kv_dim] */
} TandemLayerWeights;

/* Host weights, copied to the device once by model_create. NULL as a whole: random weights
 * initialised on the device from random_seed (benchmarks; nothing is built on the host). */
typedef struct TandemModelWeights {
  int embedding_dtype;              /* 0 f32, 1 f16, 2 bf16 */
  const void* token_embedding;      /* [vocab_size, dim] */
  const TandemLayerWeights* layers; /* [n_layers] */
  const float* final_norm;          /* [dim] */
  const void* classifier;           /* [vocab_size, dim] weight_dtype; == token_embedding (same
                                       pointer and dtype) shares the device copy */
} TandemModelWeights;

/* One chunk of a forward step: num_tokens new tokens at positions [start_pos, start_pos +
 * num_tokens) whose block table has num_blocks entries (>= ceil((start_pos + num_tokens) /
 * block_size)). all_logits: a row per new token, else one row (the last token). */
typedef struct TandemStepChunk {
  int num_tokens;
  int start_pos;
  int num_blocks;
  int all_logits;
} TandemStepChunk;

typedef struct TandemModelInfo {
  int num_blocks;
  int block_size;
  int kv_width;               /* n_kv_heads * head_dim */
  size_t weight_bytes;        /* device bytes of the weights */
  size_t kv_bytes;            /* device bytes of the KV cache (pad block included) */
  size_t workspace_bytes;     /* device bytes of the activations and step buffers */
  int graphs_captured;        /* (batch, context) buckets captured so far */
  int graph_capture_failures; /* buckets whose capture failed (they run eagerly) */
  long long graph_replays;    /* decode steps run from a graph (a bucket's first runs eagerly) */
} TandemModelInfo;

typedef struct TandemModel TandemModel;

/* The most query tokens of one prefill_attention tile (one chunk, consecutive positions). */
#define TANDEM_PREFILL_TILE_TOKENS 32

typedef struct TandemCudaApi {
  int abi_version;
  /* Number of usable devices; 0 when there is no driver or no GPU (never an error). */
  int (*device_count)(void);
  const char* (*last_error)(void);
  int (*device_name)(int device, char* buf, size_t len);

  int (*malloc)(void** d_ptr, size_t bytes);
  int (*free)(void* d_ptr);
  int (*memcpy_h2d)(void* d_dst, const void* src, size_t bytes);
  int (*memcpy_d2h)(void* dst, const void* d_src, size_t bytes);
  int (*synchronize)(void);

  /* d_y[n, dim] = d_x / sqrt(mean(d_x^2) + eps) * d_w[dim] */
  int (*rmsnorm)(const float* d_x, const float* d_w, float* d_y, int n, int dim, float eps);
  /* d_out[i] = silu(d_gate[i]) * d_up[i] */
  int (*silu_mul)(const float* d_gate, const float* d_up, float* d_out, int64_t n);
  /* Rotates d_x[n, n_heads, head_dim] in place; d_positions[n], d_inv_freq[head_dim / 2];
   * style 0 = interleaved pairs (llama2.c), 1 = halves (Hugging Face). */
  int (*rope)(float* d_x, int n, int n_heads, int head_dim, const int* d_positions,
              const float* d_inv_freq, int style);
  /* d_x[i] += d_y[i] */
  int (*add)(float* d_x, const float* d_y, int64_t n);

  /* ---- ABI 2 ---- */
  /* d_out[n, cols] (f32) = rows d_ids[n] of d_table[rows, cols] of dtype 0 f32, 1 f16, 2 bf16.
   * An id outside [0, rows) gives a zero row and sets *d_bad = 1 (one device int). */
  int (*embedding)(const int* d_ids, int dtype, const void* d_table, int64_t rows, int64_t cols,
                   float* d_out, int n, int* d_bad);
  /* Scatters d_k[n, width], d_v[n, width] into the caches [num_slots, width] at d_slots[n]. */
  int (*write_kv)(const float* d_k, const float* d_v, const int* d_slots, int n, int width,
                  float* d_k_cache, float* d_v_cache);
  /* d_wire[2, token_count, width] (K rows then V rows, kv_transfer/wire.h) <- tokens
   * [token_start, token_start + token_count) of the caches [num_blocks, block_size, width]
   * through d_block_table; unpack_kv is the inverse. */
  int (*pack_kv)(const float* d_k_cache, const float* d_v_cache, const int* d_block_table,
                 int block_size, int width, int token_start, int token_count, float* d_wire);
  int (*unpack_kv)(const float* d_wire, const int* d_block_table, int block_size, int width,
                   int token_start, int token_count, float* d_k_cache, float* d_v_cache);
  /* d_out[num_tokens, n_heads, head_dim] = attention of d_q[num_tokens, n_heads, head_dim] over
   * the caches [num_blocks, block_size, n_kv_heads, head_dim]; each token attends to at most
   * max_context positions. Split-K over the context, then a reduce; d_workspace of at least
   * paged_attention_workspace_bytes(), 16-byte aligned. */
  size_t (*paged_attention_workspace_bytes)(int num_tokens, int n_heads, int head_dim,
                                            int max_context);
  int (*paged_attention_decode)(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                                const TandemPagedAttentionArgs* args, int max_context,
                                void* d_workspace, size_t workspace_bytes, float* d_out);
  /* d_tokens[rows] sampled from d_logits[rows, vocab] with d_params[rows], as
   * engine/sampling/sampler.cc Sample(); d_workspace of at least sample_workspace_bytes(), 8-byte
   * aligned. */
  size_t (*sample_workspace_bytes)(int rows, int vocab);
  int (*sample)(const float* d_logits, int rows, int vocab, const TandemSampleRowParams* d_params,
                void* d_workspace, size_t workspace_bytes, int* d_tokens);

  /* ---- ABI 3 ---- */
  /* d_y[n, rows] = d_x[n, cols] · d_wᵀ (+ d_bias[rows] when not NULL) through cuBLAS, d_w
   * [rows, cols] of w_dtype 0 f32 (f32 math, no TF32) or 2 bf16 (d_x rounded to bf16 in
   * d_workspace of gemm_workspace_bytes(); f32 accumulation). */
  size_t (*gemm_workspace_bytes)(int n, int cols, int w_dtype);
  int (*gemm)(const float* d_x, int w_dtype, const void* d_w, const float* d_bias, float* d_y,
              int n, int rows, int cols, void* d_workspace, size_t workspace_bytes);
  /* Causal attention like paged_attention_decode for many tokens per sequence (prefill,
   * chunked prefill after a prefix hit): d_tiles[num_tiles, 2] = (first token, count) of runs of
   * at most 32 consecutive tokens of one sequence with consecutive positions (as
   * engine/cuda/step_plan.h BuildAttentionTiles makes them). */
  int (*prefill_attention)(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                           const TandemPagedAttentionArgs* args, const int* d_tiles, int num_tiles,
                           float* d_out);

  /* The device model. create: *out = a model with weights uploaded (or random, weights NULL),
   * KV cache and workspace allocated; every later call runs on its own stream. */
  int (*model_create)(const TandemModelDesc* desc, const TandemModelWeights* weights,
                      uint64_t random_seed, TandemModel** out);
  void (*model_destroy)(TandemModel* model);
  int (*model_info)(const TandemModel* model, TandemModelInfo* info);
  /* One forward step, all pointers on the host: chunks[num_chunks]; tokens = the chunks' new
   * tokens concatenated; block_tables = their block tables concatenated (num_blocks each).
   * Rows = per chunk in order, its last token or (all_logits) each token. Writes logits
   * [rows, vocab_size] when `logits` is not NULL, and, when sample_params[rows] is not NULL,
   * the tokens sampled on the device into sampled[rows]. One host-to-device copy of the step's
   * metadata, one device-to-host copy of the result; returns 0 or an error (bad chunks are
   * rejected before anything runs, naming the chunk and field). *num_rows = rows. */
  int (*model_forward)(TandemModel* model, const TandemStepChunk* chunks, int num_chunks,
                       const int* tokens, const int* block_tables,
                       const TandemSampleRowParams* sample_params, float* logits, int* sampled,
                       int* num_rows);
  /* wire (host) <- tokens [token_start, token_start + token_count) of `layer` through
   * block_table[num_blocks] (host), as kv_transfer/wire.h lays a chunk out: K rows then V rows
   * [2, token_count, kv_width] of the cache's dtype, then for fp8 the sequence's scales
   * [2, n_kv_heads] f32 (ABI 5; f32 rows before). unpack is the inverse (fp8: the scales go into
   * every block the chunk touches). Bounds are checked before anything is copied. */
  int (*model_pack_kv)(TandemModel* model, int layer, const int* block_table, int num_blocks,
                       int token_start, int token_count, void* wire);
  int (*model_unpack_kv)(TandemModel* model, int layer, const int* block_table, int num_blocks,
                         int token_start, int token_count, const void* wire);

  /* ---- ABI 4 ---- */
  /* prefill_attention on the tensor cores, as the device model runs it for bf16 models: Q, K,
   * V and the softmax weights rounded to bf16, products and sums in f32; head_dim % 16 == 0. */
  int (*prefill_attention_bf16)(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                                const TandemPagedAttentionArgs* args, const int* d_tiles,
                                int num_tiles, float* d_out);

  /* ---- ABI 5: KV caches of bf16 and fp8, attention over them by FlashInfer ---- */
  /* 1 when paged_attention_fi (and a device model with this kv_dtype) runs for head_dim and
   * kv_dtype in this library, else 0 with the reason in *why (may be NULL). */
  int (*fi_attention_supported)(int head_dim, int kv_dtype, const char** why);
  /* The current device's free and total memory in bytes (cudaMemGetInfo). */
  int (*device_memory)(size_t* free_bytes, size_t* total_bytes);
  /* write_kv into caches of kv_dtype [num_slots, n_kv_heads * head_dim]: bf16 and fp8 round to
   * nearest even, fp8 rows are divided by their block's scale (d_scales [num_blocks, 2,
   * n_kv_heads]) and saturate at +-448. */
  int (*write_kv_typed)(const float* d_k, const float* d_v, const int* d_slots, int n,
                        int n_kv_heads, int head_dim, int block_size, int kv_dtype,
                        const float* d_scales, void* d_k_cache, void* d_v_cache);
  /* fp8: the scales of a step's chunks before their rows are written, as SetFp8Scales
   * (engine/kv/kv_cache.h): chunk c has rows [d_q_indptr[c], d_q_indptr[c + 1]) of d_k, d_v
   * [tokens, n_kv_heads * head_dim] at positions d_token_pos, block table row c of d_tables
   * [num_chunks, table_stride]. */
  int (*set_fp8_scales)(const float* d_k, const float* d_v, const int* d_q_indptr,
                        const int* d_token_pos, int num_chunks, const int* d_tables,
                        int table_stride, int n_kv_heads, int head_dim, int block_size,
                        float* d_scales);
  /* pack_kv / unpack_kv for caches of kv_dtype, d_wire as model_pack_kv lays it out. */
  int (*pack_kv_typed)(const void* d_k_cache, const void* d_v_cache, const float* d_scales,
                       const int* d_block_table, int block_size, int n_kv_heads, int head_dim,
                       int kv_dtype, int token_start, int token_count, void* d_wire);
  int (*unpack_kv_typed)(const void* d_wire, const int* d_block_table, int block_size,
                         int n_kv_heads, int head_dim, int kv_dtype, int token_start,
                         int token_count, void* d_k_cache, void* d_v_cache, float* d_scales);
  /* Causal attention of a step's chunks over caches of kv_dtype (bf16 or fp8), as the device
   * model runs it: d_q [T, n_heads, head_dim] f32 (rounded to bf16); chunks[num_chunks] (host)
   * in order, chunk s owning the next num_tokens rows at positions [start_pos, start_pos +
   * num_tokens) with block table num_blocks ids of block_tables (host, concatenated); d_scales
   * [num_blocks, 2, n_kv_heads] for fp8; d_out [T, n_heads, head_dim] f32. Plans and allocates
   * its own workspace each call (tests and tools; the device model keeps one). */
  int (*paged_attention_fi)(const float* d_q, int kv_dtype, const void* d_k_cache,
                            const void* d_v_cache, const float* d_scales, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, int sliding_window,
                            const TandemStepChunk* chunks, int num_chunks, const int* block_tables,
                            float* d_out);
} TandemCudaApi;

/* Exported by libtandem_cuda.so. */
const TandemCudaApi* tandem_cuda_get_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KERNELS_CUDA_CUDA_API_H_ */
