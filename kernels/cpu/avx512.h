// The AVX-512 path's own kernels: the matmuls, where 16-lane vectors, 32 registers and VNNI's
// one-instruction byte dot products pay. Every other operation on that path runs the AVX2
// kernels (an AVX-512 CPU has AVX2). Internal to kernels/cpu/.
//
// The kernels are written once (avx512_kernels.inc) against SIMDe's names for the intrinsics:
// avx512.cc compiles them to native AVX-512 instructions, and the tests compile the same source
// to SIMDe's portable emulation, so that every CPU runs them against their scalar twins.
#ifndef TANDEM_KERNELS_CPU_AVX512_H_
#define TANDEM_KERNELS_CPU_AVX512_H_

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/quant.h"

namespace tandem::cpu {

struct Avx512Kernels {
  const char* name;
  // y[t * ldy + r] = x[t, :] · w[r, :] (+ bias[r]) for rows [r0, r1) and tokens t < n, on the
  // calling thread; w is f32, f16 or bf16, x [n, w.cols].
  void (*matmul_rows)(const float* x, const WeightRef& w, const float* bias, float* y, int64_t ldy,
                      int n, int64_t r0, int64_t r1);
  // The same for a block-quantized w (w.cols a multiple of 32) against the tokens' activations
  // quantized per 32 (acts: n rows of w.cols / 32 blocks, kernels/quant.h).
  void (*quant_rows)(const WeightRef& w, const ActBlock* acts, const float* bias, float* y,
                     int64_t ldy, int n, int64_t r0, int64_t r1);
  // The same for kQuantGemmTokens tokens or more, with rows across the lanes (a multiple of 16 rows
  // per call but at the matrix's end); block_bias [n, w.cols / 32], Q8_0 only (else nullptr): each
  // activation block's 128 * sum(128 q + r).
  void (*quant_gemm_rows)(const WeightRef& w, const ActBlock* acts, const int32_t* block_bias,
                          const float* bias, float* y, int64_t ldy, int n, int64_t r0, int64_t r1);
};

// The kernels compiled for AVX-512 F, BW, VL, DQ and VNNI (avx512.cc); callable only where
// CpuHasAvx512().
const Avx512Kernels& NativeAvx512Kernels();
// The same with quant_gemm_rows on AMX tiles (kernels/cpu/amx_panels.inc); callable only where
// CpuHasAmx(). nullptr where the compiler cannot build them.
const Avx512Kernels* NativeAmxKernels();

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_AVX512_H_
