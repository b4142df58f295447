// The launchers of libtandem_cuda.so, one .cu per op family; cuda_backend.cu puts them in the C
// table of cuda_api.h, where their contracts are documented. Internal to kernels/cuda/.
#ifndef TANDEM_KERNELS_CUDA_OPS_H_
#define TANDEM_KERNELS_CUDA_OPS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.h"

namespace tandem::cuda {

using PagedAttentionDeviceArgs = TandemPagedAttentionArgs;
using SampleRowParams = TandemSampleRowParams;

int Embedding(const int* d_ids, int dtype, const void* d_table, int64_t rows, int64_t cols,
              float* d_out, int n, int* d_bad);
int WriteKv(const float* d_k, const float* d_v, const int* d_slots, int n, int width,
            float* d_k_cache, float* d_v_cache);
int PackKv(const float* d_k_cache, const float* d_v_cache, const int* d_block_table, int block_size,
           int width, int token_start, int token_count, float* d_wire);
int UnpackKv(const float* d_wire, const int* d_block_table, int block_size, int width,
             int token_start, int token_count, float* d_k_cache, float* d_v_cache);
size_t PagedAttentionWorkspaceBytes(int num_tokens, int n_heads, int head_dim, int max_context);
int PagedAttentionDecode(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                         const PagedAttentionDeviceArgs& args, int max_context, void* d_workspace,
                         size_t workspace_bytes, float* d_out);
size_t SampleWorkspaceBytes(int rows, int vocab);
int Sample(const float* d_logits, int rows, int vocab, const SampleRowParams* d_params,
           void* d_workspace, size_t workspace_bytes, int* d_tokens);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_OPS_H_
