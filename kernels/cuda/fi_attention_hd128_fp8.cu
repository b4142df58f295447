// FlashInfer's batch attention for head_dim 128 over a fp8 KV cache (fi_attention.h).
#include "kernels/cuda/fi_attention_impl.cuh"

namespace tandem::cuda {

int FiRunHd128Fp8(const FiLaunch& l) { return fi::Run<128, fi::Fp8>(l); }

}  // namespace tandem::cuda
