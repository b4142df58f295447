// Plain CPU implementations of the backend operations. They are the reference ("CPU twin") that
// every other backend is tested against, and the CPU backend itself.
#ifndef TANDEM_KERNELS_CPU_CPU_OPS_H_
#define TANDEM_KERNELS_CPU_CPU_OPS_H_

#include <cstdint>

#include "kernels/backend.h"

namespace tandem::cpu {

// Dot product of two float32 vectors of length n (AVX2/FMA when the CPU has it).
float Dot(const float* a, const float* b, int64_t n);

// See Backend for the contracts. `pool` may be nullptr (single-threaded).
void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n);
void RmsNorm(const float* x, const float* weight, float* y, int n, int dim, float eps);
void Rope(float* x, int n, int n_heads, int head_dim, const int* positions, const float* inv_freq,
          RopeStyle style);
void WriteKv(const float* k, const float* v, const int* slots, int n, int width, float* k_cache,
             float* v_cache);
void PagedAttention(const float* q, const float* k_cache, const float* v_cache,
                    const PagedAttentionArgs& args, float* out);
void SiluMul(const float* gate, const float* up, float* out, int64_t n);
void Embedding(const int* ids, const WeightRef& table, float* out, int n);
void Add(float* x, const float* y, int64_t n);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_CPU_OPS_H_
