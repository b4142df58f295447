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
                int token_start, int token_count, float* wire);
int ModelUnpackKv(TandemModel* model, int layer, const int* block_table, int num_blocks,
                  int token_start, int token_count, const float* wire);

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_DEVICE_MODEL_H_
