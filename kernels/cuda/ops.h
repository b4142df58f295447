// The launchers of libtandem_cuda.so, one .cu per op family; cuda_backend.cu puts them in the C
// table of cuda_api.h, where their contracts are documented. Each takes the stream to launch on
// (the C table passes the legacy default stream 0; the device model its own stream, which is
// what lets it capture a step as a CUDA graph). Internal to libtandem_cuda.so.
#ifndef TANDEM_KERNELS_CUDA_OPS_H_
#define TANDEM_KERNELS_CUDA_OPS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.h"

namespace tandem::cuda {

using PagedAttentionDeviceArgs = TandemPagedAttentionArgs;

// The kernel entries of the C table (every field but model_*).
void FillKernelEntries(TandemCudaApi* api);
using SampleRowParams = TandemSampleRowParams;

int RmsNorm(const float* d_x, const float* d_w, float* d_y, int n, int dim, float eps,
            cudaStream_t stream);
int SiluMul(const float* d_gate, const float* d_up, float* d_out, int64_t n, cudaStream_t stream);
int Rope(float* d_x, int n, int n_heads, int head_dim, const int* d_positions,
         const float* d_inv_freq, int style, cudaStream_t stream);
int Add(float* d_x, const float* d_y, int64_t n, cudaStream_t stream);
int Embedding(const int* d_ids, int dtype, const void* d_table, int64_t rows, int64_t cols,
              float* d_out, int n, int* d_bad, cudaStream_t stream);
int WriteKv(const float* d_k, const float* d_v, const int* d_slots, int n, int width,
            float* d_k_cache, float* d_v_cache, cudaStream_t stream);
int PackKv(const float* d_k_cache, const float* d_v_cache, const int* d_block_table, int block_size,
           int width, int token_start, int token_count, float* d_wire, cudaStream_t stream);
int UnpackKv(const float* d_wire, const int* d_block_table, int block_size, int width,
             int token_start, int token_count, float* d_k_cache, float* d_v_cache,
             cudaStream_t stream);
// KV cache dtypes (the values of kernels/dtype.h DType): f32, bf16, fp8 E4M3 with scales.
inline constexpr int kKvF32 = 0, kKvBf16 = 2, kKvFp8 = 3;
// Bytes of one element of a cache of kv_dtype (0 for an unknown dtype), and of a packed chunk
// of token_count tokens (K rows, V rows, and for fp8 the scales [2, n_kv_heads] f32).
size_t KvElementBytes(int kv_dtype);
size_t KvWireBytes(int kv_dtype, int n_kv_heads, int head_dim, int token_count);
// WriteKv into caches of kv_dtype (fp8: divided by their block's scale, d_scales [blocks, 2,
// n_kv_heads]).
int WriteKvTyped(const float* d_k, const float* d_v, const int* d_slots, int n, int n_kv_heads,
                 int head_dim, int block_size, int kv_dtype, const float* d_scales, void* d_k_cache,
                 void* d_v_cache, cudaStream_t stream);
// fp8 caches: the scales of a step's chunks, before their rows are written (the CPU twin is
// engine/kv/kv_cache.h SetFp8Scales). Chunk c's rows are [d_q_indptr[c], d_q_indptr[c + 1]) of
// d_k / d_v [tokens, n_kv_heads * head_dim], its start position d_token_pos[first row], its
// block table row c of d_tables [num_chunks, table_stride].
int SetFp8Scales(const float* d_k, const float* d_v, const int* d_q_indptr, const int* d_token_pos,
                 int num_chunks, const int* d_tables, int table_stride, int n_kv_heads,
                 int head_dim, int block_size, float* d_scales, cudaStream_t stream);
// PackKv / UnpackKv of caches of kv_dtype into the wire payload of kv_transfer/wire.h (fp8: the
// scales of the chunk's first block after the rows; unpack sets them in every block it touches).
int PackKvTyped(const void* d_k_cache, const void* d_v_cache, const float* d_scales,
                const int* d_block_table, int block_size, int n_kv_heads, int head_dim,
                int kv_dtype, int token_start, int token_count, void* d_wire, cudaStream_t stream);
int UnpackKvTyped(const void* d_wire, const int* d_block_table, int block_size, int n_kv_heads,
                  int head_dim, int kv_dtype, int token_start, int token_count, void* d_k_cache,
                  void* d_v_cache, float* d_scales, cudaStream_t stream);
// d_y[n] (bf16, rounded to nearest even) = d_x[n] (f32), and back.
int F32ToBf16(const float* d_x, void* d_y, int64_t n, cudaStream_t stream);
int Bf16ToF32(const void* d_x, float* d_y, int64_t n, cudaStream_t stream);
size_t PagedAttentionWorkspaceBytes(int num_tokens, int n_heads, int head_dim, int max_context);
int PagedAttentionDecode(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                         const PagedAttentionDeviceArgs& args, int max_context, void* d_workspace,
                         size_t workspace_bytes, float* d_out, cudaStream_t stream);
// Causal attention of query tiles (prefill_attention.cu); d_tiles [num_tiles, 2]. bf16: the
// tensor-core variant (Q, K, V, P rounded to bf16, f32 accumulation; head_dim % 16 == 0), else
// all f32.
int PrefillAttention(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                     const PagedAttentionDeviceArgs& args, const int* d_tiles, int num_tiles,
                     bool bf16, float* d_out, cudaStream_t stream);
size_t SampleWorkspaceBytes(int rows, int vocab);
int Sample(const float* d_logits, int rows, int vocab, const SampleRowParams* d_params,
           void* d_workspace, size_t workspace_bytes, int* d_tokens, cudaStream_t stream);

// GEMM through cuBLAS (gemm.cu): d_y[n, rows] = d_x[n, cols] · d_wᵀ (+ d_bias). The handle must
// be bound to `stream`. bf16 weights (dtype 2) round d_x to bf16 in d_x16 ([n, cols] bf16,
// GemmWorkspaceBytes) first; f32 weights (dtype 0) run in full f32 (no TF32).
size_t GemmWorkspaceBytes(int n, int cols, int w_dtype);
// x16_ready: d_x16 already holds d_x rounded to bf16 (the previous GEMM of the same input), so
// GEMMs sharing an input (q/k/v, w1/w3) round it once.
int Gemm(cublasHandle_t handle, const float* d_x, int w_dtype, const void* d_w, const float* d_bias,
         float* d_y, int n, int rows, int cols, void* d_x16, size_t x16_bytes, cudaStream_t stream,
         bool x16_ready = false);
// d_dst[r, cols] = d_src[d_rows[r], cols] for r < n.
int GatherRows(const float* d_src, const int* d_rows, int n, int cols, float* d_dst,
               cudaStream_t stream);
// Fills d_out[n] (dtype 0 f32 or 2 bf16) with uniform values in [-scale, scale) from a
// counter-based hash of (seed, index), or with `scale` itself when constant != 0.
int FillRandom(void* d_out, int dtype, int64_t n, uint64_t seed, float scale, int constant,
               cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_OPS_H_
