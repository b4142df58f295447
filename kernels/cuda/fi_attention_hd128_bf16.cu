// FlashInfer's batch attention for head_dim 128 over a bf16 KV cache (fi_attention.h).
#include "kernels/cuda/fi_attention_impl.cuh"

namespace tandem::cuda {

int FiRunHd128Bf16(const FiLaunch& l) { return fi::Run<128, fi::Bf16>(l); }

}  // namespace tandem::cuda
