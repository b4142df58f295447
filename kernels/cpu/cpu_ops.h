// CPU implementations of the backend operations: the CPU backend itself, and the reference
// ("CPU twin") that every other backend is tested against.
//
// Each operation has a portable scalar path and an AVX2/FMA/F16C path, chosen at run time
// (ActiveIsa()). f16/bf16 weights are converted to float32 inside the kernels; compute and
// accumulation are float32. `pool` may be nullptr (the calling thread does all the work).
#ifndef TANDEM_KERNELS_CPU_CPU_OPS_H_
#define TANDEM_KERNELS_CPU_CPU_OPS_H_

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::cpu {

enum class Isa : uint8_t { kScalar, kAvx2 };

// Whether this CPU has AVX2, FMA and F16C.
bool CpuHasAvx2();
// The instruction set the kernels use: kAvx2 when the CPU has it, unless the environment sets
// TANDEM_CPU_ISA=scalar.
Isa ActiveIsa();
// Forces the kernels onto `isa` (tests use it to cover both paths); kAvx2 on a CPU without it
// selects kScalar. Returns the ISA now active. Not to be called while kernels run.
Isa SetIsa(Isa isa);

// Dot product of two float32 vectors of length n.
float Dot(const float* a, const float* b, int64_t n);

// See Backend for the contracts.
void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n,
            ThreadPool* pool = nullptr);
// Matmul with block-quantized weights (w.cols a multiple of 32; kernels/cpu/quant_matmul.cc).
// Decode (n < kQuantGemmTokens, or the scalar ISA): activations quantized per 32 into two int8
// parts, integer dot products. Prefill and batched decode with AVX2: each thread dequantizes a
// tile of rows into float32 and runs the float32 GEMM on it (the weights stay quantized in
// memory; each is decoded once per call instead of once per token group). Matmul calls it.
inline constexpr int kQuantGemmTokens = 8;
void QuantizedMatmul(const float* x, const WeightRef& w, const float* bias, float* y, int n,
                     ThreadPool* pool = nullptr);
// Building block of the quantized prefill: y[t, r] (ld ldy) = x[t, :] · w[r, :] (+ bias[r]) for
// a float32 tile w [rows, cols] of contiguous rows, n tokens, on the calling thread. AVX2 only.
void GemmF32TileAvx2(const float* x, const float* w, int64_t rows, int64_t cols, const float* bias,
                     float* y, int64_t ldy, int n);
void RmsNorm(const float* x, const float* weight, float* y, int n, int dim, float eps,
             ThreadPool* pool = nullptr);
void Rope(float* x, int n, int n_heads, int head_dim, const int* positions, const float* inv_freq,
          RopeStyle style, ThreadPool* pool = nullptr);
void WriteKv(const float* k, const float* v, const int* slots, int n, const KvLayerRef& cache);
void PagedAttention(const float* q, const KvLayerRef& cache, const PagedAttentionArgs& args,
                    float* out, ThreadPool* pool = nullptr);
// The same over float32 caches [num_slots, width].
void WriteKv(const float* k, const float* v, const int* slots, int n, int width, float* k_cache,
             float* v_cache);
void PagedAttention(const float* q, const float* k_cache, const float* v_cache,
                    const PagedAttentionArgs& args, float* out, ThreadPool* pool = nullptr);
// A float32 cache as a KvLayerRef (the width split as args' n_kv_heads x head_dim).
KvLayerRef F32Cache(float* k_cache, float* v_cache, int block_size, int n_kv_heads, int head_dim);
void SiluMul(const float* gate, const float* up, float* out, int64_t n, ThreadPool* pool = nullptr);
void Embedding(const int* ids, const WeightRef& table, float* out, int n);
void Add(float* x, const float* y, int64_t n, ThreadPool* pool = nullptr);

// Runs fn over [0, n) on `pool` in chunks of `grain`, or inline when pool is nullptr.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_CPU_OPS_H_
