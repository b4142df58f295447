// FlashInfer's batch attention for head_dim 64 over a fp8 KV cache (fi_attention.h).
#include "kernels/cuda/fi_attention_impl.cuh"

namespace tandem::cuda {

int FiRunHd64Fp8(const FiLaunch& l) { return fi::Run<64, fi::Fp8>(l); }

}  // namespace tandem::cuda
