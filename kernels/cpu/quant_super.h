// K-quant decode rows on AVX2, a super-block at a time (quant_super_avx2.cc). Internal to
// kernels/cpu/: quant_matmul.cc calls it for Q4_K, Q5_K and Q6_K weights on the AVX2 path.
#ifndef TANDEM_KERNELS_CPU_QUANT_SUPER_H_
#define TANDEM_KERNELS_CPU_QUANT_SUPER_H_

#include <cstdint>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

namespace tandem::cpu {

// y[t * ldy + r] = row r of w · token t (+ bias[r]) for rows [r0, r1) and tokens t < n: w of
// type t (Q4_K, Q5_K or Q6_K; anything else does nothing), rows of row_bytes, `blocks` blocks of
// 32 per row; acts [n, blocks] (kernels/quant.h). Callable only where the CPU has AVX2.
void SuperRowsAvx2(const uint8_t* w, DType t, int64_t row_bytes, int64_t blocks,
                   const ActBlock* acts, const float* bias, float* y, int64_t ldy, int n,
                   int64_t r0, int64_t r1);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_QUANT_SUPER_H_
