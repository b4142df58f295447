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
#include "kernels/quant.h"

namespace tandem::cpu {
namespace {

constexpr int kGroupTokens = 4;
constexpr int kTokenBlock = 64;  // tokens whose activations a chunk of rows goes through at once
// Decode reads rows of a few hundred bytes one after another (576 Q4_0 columns: 324 bytes);
// the hardware prefetcher, restarting at each short row, leaves the block loads waiting on
// memory. Prefetching the row this many rows ahead measured about 10% more decode tokens/s
// (SmolLM2 Q4_0, 2 threads); towards L2 (prefetcht1), as the AVX-512 paths do, a little more.
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
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4);
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

// sum(q * qa) as 8 int32 lanes (lanes 0-3: elements [0, 16), 4-7: [16, 32)).
template <DType T>
TANDEM_AVX2 inline __m256i IntDot(__m256i q, __m256i qa) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (T == DType::kQ8_0) {  // signed x signed: move the sign onto the activation
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(qa, q)),
                             ones);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, qa), ones);
  }
}

// out[t] = row · token t, for NT tokens whose activation blocks start at a[t].
template <DType T, int NT>
TANDEM_AVX2 void RowDotsAvx2(const uint8_t* row, const ActBlock* const* a, int64_t blocks,
                             float* out) {
  __m256 acc[NT];
  float offset[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    offset[t] = 0;
  }
  for (int64_t k = 0; k < blocks; ++k) {
    const __m256i q = BytesOf<T>(row, k);
    const RawScales r = RawScalesOf<T>(row, k);
    const BlockScales s = ScalesFrom(r, _cvtsh_ss(r.h0), _cvtsh_ss(r.h1));
    // One scale for the whole block except Q6_K's two halves.
    const __m256 scale = T == DType::kQ6_K
                             ? _mm256_setr_ps(s.s0, s.s0, s.s0, s.s0, s.s1, s.s1, s.s1, s.s1)
                             : _mm256_set1_ps(s.s0);
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const ActBlock& ab = a[t][k];
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.q));
      const __m256i ra = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.r));
      const __m256i dot =
          _mm256_add_epi32(_mm256_slli_epi32(IntDot<T>(q, qa), 7), IntDot<T>(q, ra));
      const __m256 scaled = T == DType::kQ6_K ? _mm256_mul_ps(scale, _mm256_set1_ps(ab.unit))
                                              : _mm256_set1_ps(s.s0 * ab.unit);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scaled, acc[t]);
      if constexpr (T == DType::kQ6_K) {
        offset[t] += s.c0 * ab.sum16 + s.c1 * (ab.sum - ab.sum16);
      } else if constexpr (T != DType::kQ8_0) {
        offset[t] += s.c0 * ab.sum;
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = simd::HorizontalSum(acc[t]) + offset[t];
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

template <DType T>
TANDEM_AVX2 void RowsAvx2(const uint8_t* w, int64_t row_bytes, int64_t blocks, const ActBlock* acts,
                          const float* bias, float* y, int64_t ldy, int n, int64_t r0, int64_t r1) {
  for (int tb = 0; tb < n; tb += kTokenBlock) {
    const int te = std::min(n, tb + kTokenBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w + r * row_bytes;
      const float b = bias ? bias[r] : 0.0f;
      if (r + kPrefetchRows < r1) {
        const uint8_t* ahead = row + kPrefetchRows * row_bytes;
        for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(ahead + off, 0, 2);
      }
      for (int t = tb; t < te; t += kGroupTokens) {
        const int nt = std::min(kGroupTokens, te - t);
        const ActBlock* a[kGroupTokens];
        for (int i = 0; i < kGroupTokens; ++i) a[i] = acts + (t + std::min(i, nt - 1)) * blocks;
        float out[kGroupTokens];
        switch (nt) {
          case 4:
            RowDotsAvx2<T, 4>(row, a, blocks, out);
            break;
          case 3:
            RowDotsAvx2<T, 3>(row, a, blocks, out);
            break;
          case 2:
            RowDotsAvx2<T, 2>(row, a, blocks, out);
            break;
          default:
            RowDotsAvx2<T, 1>(row, a, blocks, out);
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
    if (isa == Isa::kAvx512) {
      ActiveAvx512Kernels().quant_rows(w, acts, bias, y, w.rows, n, r0, r1);
    } else if (isa == Isa::kAvx2 && BlockElems(T) == 256) {  // K-quants: a super-block at a time
      SuperRowsAvx2(data, T, row_bytes, blocks, acts, bias, y, w.rows, n, r0, r1);
    } else if (isa == Isa::kAvx2) {
      RowsAvx2<T>(data, row_bytes, blocks, acts, bias, y, w.rows, n, r0, r1);
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

// Batched on AVX-512: int8 products, panels of 16 rows (avx512_kernels.inc).
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
  const int64_t grain = std::max<int64_t>(1, w.rows / (4 * threads) / 16) * 16;
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
  if (n >= kQuantGemmTokens && isa == Isa::kAvx512) {
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
