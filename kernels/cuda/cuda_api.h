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

#define TANDEM_CUDA_ABI_VERSION 2

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

/* Sampling parameters of one row (engine/sampler.h SamplingParams + the draw's counter). */
typedef struct TandemSampleRowParams {
  float temperature;
  int top_k;
  float top_p;
  uint64_t seed;
  uint64_t position;
} TandemSampleRowParams;

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
  /* d_tokens[rows] sampled from d_logits[rows, vocab] with d_params[rows], as engine/sampler.cc
   * Sample(); d_workspace of at least sample_workspace_bytes(), 8-byte aligned. */
  size_t (*sample_workspace_bytes)(int rows, int vocab);
  int (*sample)(const float* d_logits, int rows, int vocab, const TandemSampleRowParams* d_params,
                void* d_workspace, size_t workspace_bytes, int* d_tokens);
} TandemCudaApi;

/* Exported by libtandem_cuda.so. */
const TandemCudaApi* tandem_cuda_get_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KERNELS_CUDA_CUDA_API_H_ */
