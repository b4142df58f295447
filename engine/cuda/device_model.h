// The device-resident model of libtandem_cuda.so (device_model.cu): the C table's model_*
// entries. Internal to libtandem_cuda.so.
#ifndef TANDEM_ENGINE_CUDA_DEVICE_MODEL_H_
#define TANDEM_ENGINE_CUDA_DEVICE_MODEL_H_

#include "kernels/cuda/cuda_api.h"

namespace tandem::cuda {

int ModelCreate(const TandemModelDesc* desc, const TandemModelWeights* weights,
                uint64_t random_seed, TandemModel** out);
void ModelDestroy(TandemModel* model);
int ModelInfo(const TandemModel* model, TandemModelInfo* info);
int ModelForward(TandemModel* model, const TandemStepChunk* chunks, int num_chunks,
                 const int* tokens, const int* block_tables,
                 const TandemSampleRowParams* sample_params, float* logits, int* sampled,
                 int* num_rows);
int ModelPackKv(TandemModel* model, int layer, const int* block_table, int num_blocks,
                int token_start, int token_count, void* wire);
int ModelUnpackKv(TandemModel* model, int layer, const int* block_table, int num_blocks,
                  int token_start, int token_count, const void* wire);
// The C table's paged_attention_fi: FlashInfer's attention of one step's chunks, its page lists
// built here (step_plan.h) and its workspace made for the call.
int PagedAttentionFi(const float* d_q, int kv_dtype, const void* d_k_cache, const void* d_v_cache,
                     const float* d_scales, int n_heads, int n_kv_heads, int head_dim,
                     int block_size, int sliding_window, const TandemStepChunk* chunks,
                     int num_chunks, const int* block_tables, float* d_out);

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_DEVICE_MODEL_H_
