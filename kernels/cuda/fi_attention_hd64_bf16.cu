// FlashInfer's batch attention for head_dim 64 over a bf16 KV cache (fi_attention.h).
#include "kernels/cuda/fi_attention_impl.cuh"

namespace tandem::cuda {

int FiRunHd64Bf16(const FiLaunch& l) { return fi::Run<64, fi::Bf16>(l); }

}  // namespace tandem::cuda
