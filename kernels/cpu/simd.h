// AVX2 / FMA / F16C building blocks shared by the CPU kernels. Internal to kernels/cpu/.
//
// Every function here is compiled for AVX2 through a target attribute (the rest of the library
// is built for the baseline ISA), so it may only be called from code that has checked
// cpu::ActiveIsa() == Isa::kAvx2, and only from functions carrying TANDEM_AVX2 themselves.
#ifndef TANDEM_KERNELS_CPU_SIMD_H_
#define TANDEM_KERNELS_CPU_SIMD_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tandem::cpu::simd {

TANDEM_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}

TANDEM_AVX2 inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 8 weights starting at element i of a row of type D, as float32 (fp8: unscaled).
template <DType D>
TANDEM_AVX2 inline __m256 Load8(const void* row, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else if constexpr (D == DType::kFp8E4M3) {
    int64_t bytes;
    std::memcpy(&bytes, static_cast<const uint8_t*>(row) + i, 8);
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
    return _mm256_i32gather_ps(kFp8E4M3ToF32, idx, 4);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (D == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {  // bf16: the upper half of a float32
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// One weight of type D as float32.
template <DType D>
inline float Load1(const void* row, int64_t i) {
  if constexpr (D == DType::kF32) {
    return static_cast<const float*>(row)[i];
  } else if constexpr (D == DType::kFp8E4M3) {
    return Fp8E4M3ToF32(static_cast<const uint8_t*>(row)[i]);
  } else if constexpr (D == DType::kF16) {
    return F16ToF32(static_cast<const uint16_t*>(row)[i]);
  } else {
    return Bf16ToF32(static_cast<const uint16_t*>(row)[i]);
  }
}

// exp(x) for 8 lanes: Cephes' expf (range reduction by ln 2, degree-5 polynomial), relative error
// about 2e-7 on [-87, 88]; inputs are clamped to that range (exp(-inf) gives ~1e-38, not 0).
TANDEM_AVX2 inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Dot product of two float32 vectors of length n.
TANDEM_AVX2 inline float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float s = HorizontalSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// out[r][t] = w[r] · x[t] for NR rows w[r] (pointers to rows of type D) and NT float32 rows
// x + t * ldx, over `cols` elements: NR·NT accumulators (at most 12 of the 16 registers). The
// last cols % 8 elements go through the same FMAs as a zero-padded vector.
template <DType D, int NR, int NT>
TANDEM_AVX2 void DotTile(const void* const* w, const float* x, int64_t ldx, int64_t cols,
                         float out[NR][NT]) {
  __m256 acc[NR][NT];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  constexpr int64_t kEsize = D == DType::kF32 ? 4 : D == DType::kFp8E4M3 ? 1 : 2;
  for (; k + 8 <= cols; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) wv[r] = Load8<D>(w[r], k);
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (k < cols) {
    // The last cols - k < 8 elements, zero-padded to a full vector.
    const int rem = static_cast<int>(cols - k);
    alignas(32) char wtail[8 * 4] = {};
    alignas(32) float xtail[8] = {};
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      std::memcpy(wtail, static_cast<const char*>(w[r]) + k * kEsize, rem * kEsize);
      wv[r] = Load8<D>(wtail, 0);
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      std::memcpy(xtail, x + t * ldx + k, rem * sizeof(float));
      const __m256 xv = _mm256_load_ps(xtail);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) out[r][t] = HorizontalSum(acc[r][t]);
  }
}

}  // namespace tandem::cpu::simd

#endif  // TANDEM_KERNELS_CPU_SIMD_H_
