// CPU implementations of the backend operations: the CPU backend itself, and the reference
// ("CPU twin") that every other backend is tested against.
//
// Each operation has a portable scalar path and an AVX2/FMA/F16C path, chosen at run time
// (ActiveIsa()); on CPUs with AVX-512 (F, BW, VL, DQ, VNNI) the matmuls have AVX-512 kernels
// (kernels/cpu/avx512.h) and everything else runs the AVX2 ones. f16/bf16 weights are converted to
// float32 inside the kernels; compute and accumulation are float32. `pool` may be nullptr (the
// calling thread does all the work).
#ifndef TANDEM_KERNELS_CPU_CPU_OPS_H_
#define TANDEM_KERNELS_CPU_CPU_OPS_H_

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::cpu {

// Ordered: each ISA includes the ones before it.
// kAmx: the AVX-512 kernels, with the batched quantized matmuls on AMX-INT8 tiles.
enum class Isa : uint8_t { kScalar, kAvx2, kAvx512, kAmx };

struct Avx512Kernels;

// "scalar", "avx2", "avx512", "amx", and back (false for any other name).
const char* IsaName(Isa isa);
bool ParseIsa(const char* name, Isa* isa);
// Whether this CPU has AVX2, FMA and F16C.
bool CpuHasAvx2();
// Whether it also has AVX-512 F, BW, VL, DQ and VNNI (and the OS saves the AVX-512 registers).
bool CpuHasAvx512();
// Whether it also has AMX-TILE and AMX-INT8, the OS saves the tile state, and this process was
// granted its use (the first call asks Linux for it).
bool CpuHasAmx();
// The best instruction set this CPU has.
Isa BestIsa();
// The instruction set the kernels use: BestIsa(), unless the environment sets TANDEM_CPU_ISA to
// scalar, avx2, avx512 or amx (capped at what the CPU has).
Isa ActiveIsa();
// Forces the kernels onto `isa` (tests use it to cover every path). An ISA the CPU lacks
// selects the best one below it. Returns the ISA now active. Not to be called while kernels run.
Isa SetIsa(Isa isa);
// The AVX-512 kernels the kAvx512 path calls: NativeAvx512Kernels(), or those set for testing.
const Avx512Kernels& ActiveAvx512Kernels();
// Tests: run the kAvx512 path with `kernels` (SIMDe's emulation of the AVX-512 kernels) on any
// CPU with AVX2, so that SetIsa(kAvx512) selects it there; nullptr goes back to the CPU's own.
void SetAvx512KernelsForTesting(const Avx512Kernels* kernels);

// Dot product of two float32 vectors of length n.
float Dot(const float* a, const float* b, int64_t n);

// See Backend for the contracts.
void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n,
            ThreadPool* pool = nullptr);
// Matmul with block-quantized weights (w.cols a multiple of 32; kernels/cpu/quant_matmul.cc).
// Decode (n < kQuantGemmTokens, or the scalar ISA): activations quantized per 32 into two int8
// parts, integer dot products. Prefill and batched decode: with AVX-512, panels of 16 rows packed
// per call with the rows across the lanes and the same int8 products (on AMX tiles with kAmx);
// with AVX2, each thread dequantizes a tile of rows into float32 and runs the float32 GEMM on it
// (the weights stay quantized in memory; each is decoded once per call instead of once per token
// group). Matmul calls it.
inline constexpr int kQuantGemmTokens = 8;
void QuantizedMatmul(const float* x, const WeightRef& w, const float* bias, float* y, int n,
                     ThreadPool* pool = nullptr);
// Whether QuantizedMatmul, on the active ISA, multiplies `n` tokens' quantized activations by the
// weights as integers (else, batched on AVX2, it multiplies dequantized float32 tiles).
bool QuantizedMatmulIsInteger(int n);
// Building block of the quantized prefill: y[t, r] (ld ldy) = x[t, :] · w[r, :] (+ bias[r]) for
// a float32 tile w [rows, cols] of contiguous rows, n tokens, on the calling thread. AVX2 and
// AVX-512 only.
void GemmF32Tile(const float* x, const float* w, int64_t rows, int64_t cols, const float* bias,
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
void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n,
                 ThreadPool* pool = nullptr);
void Scale(float* x, float s, int64_t n);
void Embedding(const int* ids, const WeightRef& table, float* out, int n);
void Add(float* x, const float* y, int64_t n, ThreadPool* pool = nullptr);

// Runs fn over [0, n) on `pool` in chunks of `grain`, or inline when pool is nullptr.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_CPU_OPS_H_
