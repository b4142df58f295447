// Matmul with block-quantized weights (kernels/quant.h) used as stored: the activations are
// quantized per 32 elements to two int8 parts with a float unit (kernels/quant.h), and every
// 32-element block of a weight row is seen as w = s * q + c with q small unsigned integers (signed
// for Q8_0) and s, c floats (s and c per 16 elements for Q6_K). Then
//   sum(w * x) = s * unit * sum(q * (128 qa + ra)) + c * sum(x),
// the integer dot products being exact. The AVX2 path computes sum(q * qa) 32 lanes at a time
// (maddubs: unsigned x signed bytes into int16 pairs, then int32); the scalar path is the same
// arithmetic one element at a time, the twin the AVX2 and AVX-512 paths are tested against
// (the AVX-512 one, in avx512_kernels.inc, uses VNNI's byte dot products).
//
// The K-quants on AVX2 go a super-block at a time instead (quant_super_avx2.cc).
//
// Work: threads split the weight rows; a row's blocks are decoded once per group of 4 tokens.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_super.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile_prefetch.h"
#include "kernels/quant.h"

namespace tandem::cpu {
namespace {

constexpr int kGroupTokens = 4;
constexpr int kTokenBlock = 64;  // tokens whose activations a chunk of rows goes through at once
// Decode reads rows of a few hundred bytes one after another (576 Q4_0 columns: 324 bytes);
// the hardware prefetcher, restarting at each short row, leaves the block loads waiting on
// memory. The row this many rows ahead is prefetched towards L2 (prefetcht1), a chunk's share
// while each chunk computes, as the AVX-512 paths do: all of it at each row's start stalled on
// the fill buffers (Qwen2.5 1.5B re-typed to Q4_0, 2 threads: 0.57 of the bandwidth roofline
// against 0.72).
constexpr int kPrefetchRows = 4;

using quant_blocks::BlockScales;
using quant_blocks::ForQuantType;
using quant_blocks::RawScales;
using quant_blocks::RawScalesOf;
using quant_blocks::ScalesFrom;
using quant_blocks::ScalesOf;

// ---------------------------------------------------------------------------------------------
// Scalar path.

// The 32 integers q of block k.
template <DType T>
inline void IntsOf(const uint8_t* row, int64_t k, int q[32]) {
  if constexpr (T == DType::kQ8_0) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<int8_t>(row[k * 34 + 2 + l]);
  } else if constexpr (T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                       T == DType::kQ5_1) {
    const uint8_t* b = row + k * BlockBytes(T);
    const bool offset = T == DType::kQ4_1 || T == DType::kQ5_1;
    const bool five = T == DType::kQ5_0 || T == DType::kQ5_1;
    uint32_t qh = 0;
    if (five) std::memcpy(&qh, b + (offset ? 4 : 2), 4);
    const uint8_t* qs = b + (offset ? 4 : 2) + (five ? 4 : 0);
    for (int l = 0; l < 16; ++l) {
      q[l] = (qs[l] & 0xF) | static_cast<int>(((qh >> l) & 1) << 4);
      q[l + 16] = (qs[l] >> 4) | static_cast<int>(((qh >> (l + 16)) & 1) << 4);
    }
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    const bool five = T == DType::kQ5_K;
    const uint8_t* b = row + (k / 8) * BlockBytes(T);
    const int j = static_cast<int>(k % 8);
    const uint8_t* qs = b + (five ? 48 : 16) + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      q[l] = (qs[l] >> (4 * (j % 2))) & 0xF;
      if (five) q[l] |= ((b[16 + l] >> j) & 1) << 4;
    }
  } else {  // Q6_K
    const uint8_t* b = row + (k / 8) * 210;
    const int j = static_cast<int>(k % 8), half = j / 4, quarter = j % 4;
    const uint8_t* ql = b + 64 * half + 32 * (quarter % 2);
    const uint8_t* qh = b + 128 + 32 * half;
    for (int l = 0; l < 32; ++l) {
      q[l] = ((ql[l] >> (4 * (quarter / 2))) & 0xF) | (((qh[l] >> (2 * quarter)) & 3) << 4);
    }
  }
}

template <DType T>
float RowDotScalar(const uint8_t* row, const ActBlock* a, int64_t blocks) {
  float acc = 0;
  int q[32];
  for (int64_t k = 0; k < blocks; ++k) {
    IntsOf<T>(row, k, q);
    const BlockScales s = ScalesOf<T>(row, k);
    int i0 = 0, i1 = 0;
    for (int l = 0; l < 16; ++l) i0 += q[l] * (128 * a[k].q[l] + a[k].r[l]);
    for (int l = 16; l < 32; ++l) i1 += q[l] * (128 * a[k].q[l] + a[k].r[l]);
    acc += a[k].unit * (s.s0 * static_cast<float>(i0) + s.s1 * static_cast<float>(i1)) +
           s.c0 * a[k].sum16 + s.c1 * (a[k].sum - a[k].sum16);
  }
  return acc;
}

// ---------------------------------------------------------------------------------------------
// AVX2 path.

// The 32 integers of block k as bytes (unsigned; signed for Q8_0).
template <DType T>
TANDEM_AVX2 inline __m256i BytesOf(const uint8_t* row, int64_t k) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (T == DType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k * 34 + 2));
  } else if constexpr (T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                       T == DType::kQ5_1) {
    const uint8_t* b = row + k * BlockBytes(T);
    const bool offset = T == DType::kQ4_1 || T == DType::kQ5_1;
    const bool five = T == DType::kQ5_0 || T == DType::kQ5_1;
    const uint8_t* qs = b + (offset ? 4 : 2) + (five ? 4 : 0);
    // The 16 bytes in both halves, the upper half shifted down 4 bits (a 64-bit shift: each
    // byte's high nibble lands in its low one, and the mask drops what came from the next).
    const __m256i v =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    __m256i q = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), low4);
    if constexpr (five) {
      uint32_t qh;
      std::memcpy(&qh, b + (offset ? 4 : 2), 4);
      // Byte i takes byte i / 8 of qh, then keeps bit i % 8 of it as 0x10.
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int>(qh)),
          _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    return q;
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    const bool five = T == DType::kQ5_K;
    const uint8_t* b = row + (k / 8) * BlockBytes(T);
    const int j = static_cast<int>(k % 8);
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (five ? 48 : 16) + 32 * (j / 2)));
    __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 4 * (j % 2)), low4);
    if constexpr (five) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, j), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
    }
    return q;
  } else {  // Q6_K
    const uint8_t* b = row + (k / 8) * 210;
    const int j = static_cast<int>(k % 8), half = j / 4, quarter = j % 4;
    const __m256i l =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half + 32 * (quarter % 2)));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(l, 4 * (quarter / 2)), low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * quarter), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
}

// 32 int32 values (4 vectors, in order) saturated to int8, in order.
TANDEM_AVX2 inline __m256i PackInt8(const __m256i* p, __m256i order) {
  const __m256i w =
      _mm256_packs_epi16(_mm256_packs_epi32(p[0], p[1]), _mm256_packs_epi32(p[2], p[3]));
  return _mm256_permutevar8x32_epi32(w, order);
}

TANDEM_AVX2 inline int SumI32(__m256i a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// kernels/quant.h QuantizeActivations, 32 elements per iteration: the same rounding (to nearest
// even), the int32 results packed to int8 in order.
TANDEM_AVX2 void QuantizeActivationsAvx2(const float* x, ActBlock* out, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t i = 0; i < n / kActBlock; ++i) {
    const float* xb = x + i * kActBlock;
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(xb + 8 * j);
    const __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                      _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127, unit = d / 128;
    const __m256 inv = _mm256_set1_ps(d > 0 ? 1.0f / d : 0.0f);
    const __m256 inv_unit = _mm256_set1_ps(d > 0 ? 1.0f / unit : 0.0f);
    const __m256 vd = _mm256_set1_ps(d);
    __m256i q[4], r[4], sums[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 qf = _mm256_round_ps(_mm256_mul_ps(v[j], inv), kRound);
      const __m256 rest = _mm256_mul_ps(_mm256_sub_ps(v[j], _mm256_mul_ps(vd, qf)), inv_unit);
      q[j] = _mm256_cvtps_epi32(qf);
      r[j] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(rest), lo), hi);
      sums[j] = _mm256_add_epi32(_mm256_slli_epi32(q[j], 7), r[j]);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].q), PackInt8(q, order));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].r), PackInt8(r, order));
    const int sum16 = SumI32(_mm256_add_epi32(sums[0], sums[1]));
    const int sum = sum16 + SumI32(_mm256_add_epi32(sums[2], sums[3]));
    out[i].unit = unit;
    out[i].sum = unit * static_cast<float>(sum);
    out[i].sum16 = unit * static_cast<float>(sum16);
  }
}

// ---------------------------------------------------------------------------------------------
// AVX2 decode of the 32-element types, eight blocks at a time: each block's two integer dot
// products are summed to one int32 per block while still integers (a tree of hadds folds eight
// blocks into one vector), and one conversion and two multiply-adds then scale the eight blocks
// together, with their weight scales fetched by one gather. Per block, that leaves the byte
// products and a share of the fold: about two thirds of the instructions of a block scaled on
// its own.

constexpr int kChunkBlocks = 8;

// A token's activation units and sums, block by block (ActBlock's, gathered once per call so
// that eight blocks' are one load).
struct TokenScales {
  const float* unit;
  const float* sum;
};

// 128 * sum(q * qa) + sum(q * ra) of block k as 8 int32 partial sums.
template <DType T>
TANDEM_AVX2 inline __m256i BlockIntDot(__m256i q, const ActBlock& ab) {
  __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.q));
  __m256i ra = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.r));
  if constexpr (T == DType::kQ8_0) {  // signed x signed: move the sign onto the activations
    qa = _mm256_sign_epi8(qa, q);
    ra = _mm256_sign_epi8(ra, q);
    q = _mm256_sign_epi8(q, q);
  }
  const __m256i hi = _mm256_maddubs_epi16(q, qa), lo = _mm256_maddubs_epi16(q, ra);
  return _mm256_add_epi32(_mm256_madd_epi16(hi, _mm256_set1_epi16(128)),
                          _mm256_madd_epi16(lo, _mm256_set1_epi16(1)));
}

// The sums of v[0..7]'s lanes, in order.
TANDEM_AVX2 inline __m256i FoldEight(const __m256i v[kChunkBlocks]) {
  const __m256i g0 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i g1 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                          _mm256_permute2x128_si256(g0, g1, 0x31));
}

// The weight scales d (and for Q4_1/Q5_1 the minimums m) of blocks [k, k + 8) of a row.
template <DType T>
TANDEM_AVX2 inline void ChunkScales(const uint8_t* row, int64_t k, __m256* d, __m256* m) {
  constexpr int kBytes = static_cast<int>(BlockBytes(T));
  const __m256i offsets =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(kBytes));
  // Each block's first 4 bytes: d, then (Q4_1, Q5_1) m, as float16.
  const __m256i raw =
      _mm256_i32gather_epi32(reinterpret_cast<const int*>(row + k * kBytes), offsets, 1);
  const __m256i split = _mm256_permute4x64_epi64(
      _mm256_shuffle_epi8(
          raw, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8,
                                9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)),
      0xD8);
  *d = _mm256_cvtph_ps(_mm256_castsi256_si128(split));
  *m = _mm256_cvtph_ps(_mm256_extracti128_si256(split, 1));
}

// acc[t] += blocks [k, k + 8) of row · token t.
template <DType T, int NT>
TANDEM_AVX2 inline void ChunkDots(const uint8_t* row, int64_t k, const ActBlock* const* a,
                                  const TokenScales* ts, __m256* acc) {
  __m256i v[NT][kChunkBlocks];
#pragma GCC unroll 8
  for (int b = 0; b < kChunkBlocks; ++b) {
    const __m256i q = BytesOf<T>(row, k + b);
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) v[t][b] = BlockIntDot<T>(q, a[t][k + b]);
  }
  __m256 d, m;
  ChunkScales<T>(row, k, &d, &m);
  for (int t = 0; t < NT; ++t) {
    const __m256 dots = _mm256_cvtepi32_ps(FoldEight(v[t]));
    const __m256 unit = _mm256_loadu_ps(ts[t].unit + k), sum = _mm256_loadu_ps(ts[t].sum + k);
    if constexpr (T == DType::kQ4_1 || T == DType::kQ5_1) {  // w = d q + m
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dots, unit), d, _mm256_fmadd_ps(m, sum, acc[t]));
    } else if constexpr (T == DType::kQ8_0) {
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dots, unit), d, acc[t]);
    } else {  // w = d (q - 8) or d (q - 16)
      const __m256 bias = _mm256_set1_ps(T == DType::kQ4_0 ? -8.0f : -16.0f);
      acc[t] = _mm256_fmadd_ps(_mm256_fmadd_ps(dots, unit, _mm256_mul_ps(bias, sum)), d, acc[t]);
    }
  }
}

// out[t] = row · token t for NT tokens: whole chunks of 8 blocks, then the last blocks one at a
// time. A token's result has the same bits whatever NT. `ahead` (or nullptr): a row to bring
// towards L2 meanwhile, a chunk's share at a time (kernels/cpu/tile_prefetch.h).
template <DType T, int NT>
TANDEM_AVX2 void ChunkRowDotsAvx2(const uint8_t* row, const uint8_t* ahead,
                                  const ActBlock* const* a, const TokenScales* ts, int64_t blocks,
                                  float* out) {
  constexpr int64_t kChunkBytes = kChunkBlocks * BlockBytes(T);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kChunkBlocks <= blocks; k += kChunkBlocks) {
    if (ahead != nullptr) PrefetchL2(ahead + k * BlockBytes(T), kChunkBytes);
    ChunkDots<T, NT>(row, k, a, ts, acc);
  }
  if (ahead != nullptr && k < blocks) {
    PrefetchL2(ahead + k * BlockBytes(T), (blocks - k) * BlockBytes(T));
  }
  float tail[NT] = {};
  for (; k < blocks; ++k) {
    const __m256i q = BytesOf<T>(row, k);
    const BlockScales sc = ScalesOf<T>(row, k);
    for (int t = 0; t < NT; ++t) {
      const ActBlock& ab = a[t][k];
      const float dot = static_cast<float>(SumI32(BlockIntDot<T>(q, ab)));
      tail[t] += sc.s0 * ab.unit * dot + sc.c0 * ab.sum;
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = simd::HorizontalSum(acc[t]) + tail[t];
}

template <DType T>
TANDEM_AVX2 void RowsAvx2(const uint8_t* w, int64_t row_bytes, int64_t blocks, const ActBlock* acts,
                          const float* bias, float* y, int64_t ldy, int n, int64_t r0, int64_t r1) {
  // The tokens' units and sums, block by block (this thread's copy): token t's units at
  // scales[2 t blocks], its sums right after.
  thread_local std::vector<float> scales;
  scales.resize(static_cast<size_t>(2 * n * blocks));
  for (int t = 0; t < n; ++t) {
    float* unit = scales.data() + 2 * t * blocks;
    for (int64_t k = 0; k < blocks; ++k) {
      unit[k] = acts[t * blocks + k].unit;
      unit[blocks + k] = acts[t * blocks + k].sum;
    }
  }
  for (int tb = 0; tb < n; tb += kTokenBlock) {
    const int te = std::min(n, tb + kTokenBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w + r * row_bytes;
      const float b = bias ? bias[r] : 0.0f;
      // The row kPrefetchRows ahead is brought in while this one computes.
      const uint8_t* ahead = r + kPrefetchRows < r1 ? row + kPrefetchRows * row_bytes : nullptr;
      for (int t = tb; t < te; t += kGroupTokens) {
        const int nt = std::min(kGroupTokens, te - t);
        const uint8_t* next = t == tb ? ahead : nullptr;
        const ActBlock* a[kGroupTokens];
        TokenScales ts[kGroupTokens];
        for (int i = 0; i < kGroupTokens; ++i) {
          const int token = t + std::min(i, nt - 1);
          a[i] = acts + token * blocks;
          ts[i] = {scales.data() + 2 * token * blocks, scales.data() + (2 * token + 1) * blocks};
        }
        float out[kGroupTokens];
        switch (nt) {
          case 4:
            ChunkRowDotsAvx2<T, 4>(row, next, a, ts, blocks, out);
            break;
          case 3:
            ChunkRowDotsAvx2<T, 3>(row, next, a, ts, blocks, out);
            break;
          case 2:
            ChunkRowDotsAvx2<T, 2>(row, next, a, ts, blocks, out);
            break;
          default:
            ChunkRowDotsAvx2<T, 1>(row, next, a, ts, blocks, out);
            break;
        }
        for (int i = 0; i < nt; ++i) y[(t + i) * ldy + r] = out[i] + b;
      }
    }
  }
}

template <DType T>
void RowsScalar(const uint8_t* w, int64_t row_bytes, int64_t blocks, const ActBlock* acts,
                const float* bias, float* y, int64_t ldy, int n, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (int t = 0; t < n; ++t) {
      y[t * ldy + r] = RowDotScalar<T>(row, acts + t * blocks, blocks) + (bias ? bias[r] : 0.0f);
    }
  }
}

// The decode path's rows on `isa` (kAvx512: the AVX-512 kernels, avx512.h).
template <DType T>
void RunRows(Isa isa, const WeightRef& w, const ActBlock* acts, const float* bias, float* y, int n,
             ThreadPool* pool) {
  const int64_t blocks = w.cols / kActBlock, row_bytes = RowBytes(w.dtype, w.cols);
  const auto* data = static_cast<const uint8_t*>(w.data);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const int64_t grain = std::max<int64_t>(16, w.rows / (4 * threads));
  ParallelFor(pool, w.rows, grain, [&](int64_t r0, int64_t r1) {
    if (isa >= Isa::kAvx512) {
      ActiveAvx512Kernels().quant_rows(w, acts, bias, y, w.rows, n, r0, r1);
    } else if (isa == Isa::kAvx2) {
      if constexpr (BlockElems(T) == 256) {  // K-quants: a super-block at a time
        SuperRowsAvx2(data, T, row_bytes, blocks, acts, bias, y, w.rows, n, r0, r1);
      } else {
        RowsAvx2<T>(data, row_bytes, blocks, acts, bias, y, w.rows, n, r0, r1);
      }
    } else {
      RowsScalar<T>(data, row_bytes, blocks, acts, bias, y, w.rows, n, r0, r1);
    }
  });
}

// Rows [r0, r1) of w as float32 rows of blocks * 32 values in dst.
template <DType T>
TANDEM_AVX2 void DequantizeRowsAvx2(const uint8_t* w, int64_t row_bytes, int64_t blocks, int64_t r0,
                                    int64_t r1, float* dst) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* out = dst + (r - r0) * blocks * kActBlock;
    for (int64_t k = 0; k < blocks; ++k, out += kActBlock) {
      const __m256i q = BytesOf<T>(row, k);
      const RawScales raw = RawScalesOf<T>(row, k);
      const float h0 = _cvtsh_ss(raw.h0), h1 = _cvtsh_ss(raw.h1);
      const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
      for (int h = 0; h < 2; ++h) {
        const __m256 s = _mm256_set1_ps(h0 * (h == 0 ? raw.a0 : raw.a1));
        const __m256 c = _mm256_set1_ps(h1 * (h == 0 ? raw.b0 : raw.b1));
        for (int g = 0; g < 2; ++g) {
          const __m128i bytes = g == 0 ? halves[h] : _mm_srli_si128(halves[h], 8);
          const __m256i ints =
              T == DType::kQ8_0 ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
          _mm256_storeu_ps(out + 16 * h + 8 * g, _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints), s, c));
        }
      }
    }
  }
}

constexpr int64_t kGemmTileRows = 48;  // a float32 tile of up to 48 x 1536 x 4 B fits in L2

template <DType T>
void GemmRows(const float* x, const WeightRef& w, const float* bias, float* y, int n,
              ThreadPool* pool) {
  const int64_t blocks = w.cols / kActBlock, row_bytes = RowBytes(w.dtype, w.cols);
  const auto* data = static_cast<const uint8_t*>(w.data);
  ParallelFor(pool, w.rows, kGemmTileRows, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> tile;
    tile.resize(static_cast<size_t>(kGemmTileRows * w.cols));
    for (int64_t r = r0; r < r1; r += kGemmTileRows) {
      const int64_t nr = std::min(kGemmTileRows, r1 - r);
      DequantizeRowsAvx2<T>(data, row_bytes, blocks, r, r + nr, tile.data());
      GemmF32Tile(x, tile.data(), nr, w.cols, bias ? bias + r : nullptr, y + r, w.rows, n);
    }
  });
}

// The tokens' activations quantized per 32 (kernels/quant.h) into the calling thread's buffer
// (pool threads reach it through the pointer).
const ActBlock* QuantizeTokens(Isa isa, const float* x, int64_t cols, int n, ThreadPool* pool) {
  const int64_t blocks = cols / kActBlock;
  thread_local std::vector<ActBlock> buffer;
  buffer.resize(static_cast<size_t>(n * blocks));
  ActBlock* acts = buffer.data();
  ParallelFor(pool, n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (isa != Isa::kScalar) {
        QuantizeActivationsAvx2(x + t * cols, acts + t * blocks, cols);
      } else {
        QuantizeActivations(x + t * cols, acts + t * blocks, cols);
      }
    }
  });
  return acts;
}

// Batched on AVX-512: int8 products, panels of 16 rows (avx512_kernels.inc; on AMX tiles with
// Isa::kAmx, amx_panels.inc).
void PanelGemmAvx512(const float* x, const WeightRef& w, const float* bias, float* y, int n,
                     ThreadPool* pool) {
  const int64_t blocks = w.cols / kActBlock;
  const ActBlock* acts = QuantizeTokens(Isa::kAvx512, x, w.cols, n, pool);
  const int32_t* bb = nullptr;  // Q8_0: each block's bias (pool threads: through bb)
  if (w.dtype == DType::kQ8_0) {
    thread_local std::vector<int32_t> buffer;
    buffer.resize(static_cast<size_t>(n * blocks));
    for (int64_t b = 0; b < n * blocks; ++b) buffer[b] = Q8BlockBias(acts[b]);
    bb = buffer.data();
  }
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  // On tiles, each call repacks all the tokens' activations (amx_panels.inc): one share of rows
  // per thread, so that each thread packs them once.
  const int shares = ActiveIsa() == Isa::kAmx && n >= 16 ? threads : 4 * threads;
  const int64_t grain = std::max<int64_t>(1, w.rows / shares / 16) * 16;
  ParallelFor(pool, w.rows, grain, [&](int64_t r0, int64_t r1) {
    ActiveAvx512Kernels().quant_gemm_rows(w, acts, bb, bias, y, w.rows, n, r0, r1);
  });
}

}  // namespace

bool QuantizedMatmulIsInteger(int n) {
  const Isa isa = ActiveIsa();
  return n < kQuantGemmTokens || isa != Isa::kAvx2;
}

void QuantizedMatmul(const float* x, const WeightRef& w, const float* bias, float* y, int n,
                     ThreadPool* pool) {
  const Isa isa = ActiveIsa();
  if (n >= kQuantGemmTokens && isa >= Isa::kAvx512) {
    return PanelGemmAvx512(x, w, bias, y, n, pool);
  }
  if (n >= kQuantGemmTokens && isa != Isa::kScalar) {
    return ForQuantType(w.dtype,
                        [&](auto t) { GemmRows<decltype(t)::value>(x, w, bias, y, n, pool); });
  }
  const ActBlock* acts = QuantizeTokens(isa, x, w.cols, n, pool);
  ForQuantType(w.dtype,
               [&](auto t) { RunRows<decltype(t)::value>(isa, w, acts, bias, y, n, pool); });
}

}  // namespace tandem::cpu
