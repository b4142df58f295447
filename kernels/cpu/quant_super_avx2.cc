// K-quant decode on AVX2 (Q4_K, Q5_K, Q6_K), a super-block of 256 elements at a time: the AVX2
// twin of avx512_quant_super.inc, for CPUs without AVX-512 (Zen 3 and older).
//
// A super-block's 8 sub-blocks of 32 integers are unpacked into 8 vectors of 32 bytes, in element
// order, so each token's activation blocks (kernels/quant.h) are read as they are. Per token and
// vector, maddubs + madd give 8 int32 lanes of 128 * sum(q * qa) + sum(q * ra); a transpose tree
// sums the 64 lanes into two vectors of the super-block's 16 groups of 16 elements, which are
// converted to float once and scaled by the groups' weight scales and activation units. Scales
// are decoded with a few vector operations per super-block, not per block.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/quant_super.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile_prefetch.h"

namespace tandem::cpu {
namespace {

// Group g (elements [16 g, 16 g + 16)) of lane l of the two folded vectors: lane 4h + j of the
// first holds half h of sub-block j, of the second half h of sub-block 4 + j.
constexpr int FoldedGroup(int vector, int lane) { return 8 * vector + 2 * (lane % 4) + lane / 4; }

// One token's per-lane factors for one super-block (its integers are read from its ActBlocks).
struct alignas(32) SuperFactors {
  float unit[2][8];  // the unit of the block of the lane's group
  float sum[2][8];   // the sum of x over the group; times -32 for Q6_K
};

template <DType T>
void FactorsOf(const ActBlock* a, int64_t supers, SuperFactors* out) {
  for (int64_t s = 0; s < supers; ++s, ++out) {
    const ActBlock* b = a + 8 * s;
    for (int v = 0; v < 2; ++v) {
      for (int l = 0; l < 8; ++l) {
        const int g = FoldedGroup(v, l);
        const ActBlock& ab = b[g / 2];
        out->unit[v][l] = ab.unit;
        const float sum = g % 2 == 0 ? ab.sum16 : ab.sum - ab.sum16;
        out->sum[v][l] = T == DType::kQ6_K ? -32.0f * sum : sum;
      }
    }
  }
}

// A super-block's integers (unsigned, sub-block k in q[k]) and its scales per folded lane:
// value = scale * q - min (min 0 for Q6_K).
struct SuperBlock2 {
  __m256i q[8];
  __m256 scale[2];
  __m256 min[2];
};

// 16-bit shifts by a constant count in either direction.
template <int kBits>
TANDEM_AVX2 inline __m256i Shift16(__m256i v) {
  if constexpr (kBits > 0) {
    return _mm256_slli_epi16(v, kBits);
  } else if constexpr (kBits < 0) {
    return _mm256_srli_epi16(v, -kBits);
  } else {
    return v;
  }
}

// Q5_K: ORs the fifth bits (bit k of the 32 high bytes: sub-block k) into q[k] at bit 4.
template <int K = 0>
TANDEM_AVX2 inline void FifthBits(__m256i h, __m256i* q) {
  if constexpr (K < 8) {
    q[K] = _mm256_or_si256(q[K], _mm256_and_si256(Shift16<4 - K>(h), _mm256_set1_epi8(0x10)));
    FifthBits<K + 1>(h, q);
  }
}

template <DType T>
TANDEM_AVX2 inline void DecodeSuper2(const uint8_t* b, SuperBlock2* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), high2 = _mm256_set1_epi8(0x30);
  if constexpr (T == DType::kQ6_K) {
    for (int n = 0; n < 2; ++n) {  // the halves of 128 elements: quarters 0-3, sub-blocks 4n + qq
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
      __m256i* q = out->q + 4 * n;
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                             _mm256_and_si256(_mm256_slli_epi16(h, 4), high2));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                             _mm256_and_si256(_mm256_slli_epi16(h, 2), high2));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                             _mm256_and_si256(h, high2));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(h, 2), high2));
    }
    // Lane 4h + j of the first vector: scale 2j + h; of the second: 8 + 2j + h.
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(quant_blocks::Bits16(b + 208)));
    for (int v = 0; v < 2; ++v) {
      const __m256i sc =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * v)));
      out->scale[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(sc, order)), d);
      out->min[v] = _mm256_setzero_ps();
    }
  } else {
    constexpr bool kFive = T == DType::kQ5_K;
    const uint8_t* qs = b + (kFive ? 48 : 16);
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
      out->q[2 * i] = _mm256_and_si256(v, low4);
      out->q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
    if constexpr (kFive) {
      FifthBits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)), out->q);
    }
    // The 6-bit scales and minimums as bytes (as avx512_quant_super.inc's DecodeSuper).
    const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
    const __m128i low = _mm_srlv_epi32(_mm_shuffle_epi32(u, 0x98), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i top = _mm_srli_epi32(_mm_shuffle_epi32(u, 0x50), 2);
    const __m128i bytes = _mm_or_si128(
        _mm_and_si128(low, _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F)),
        _mm_and_si128(top, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
    uint32_t halves;
    std::memcpy(&halves, b, 4);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves)));
    const __m256 scales =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), _mm256_broadcastss_ps(dd));
    const __m256 mins =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))),
                      _mm256_broadcastss_ps(_mm_movehdup_ps(dd)));
    // Lane 4h + j: sub-block j (first vector), 4 + j (second).
    for (int v = 0; v < 2; ++v) {
      const __m256i order = _mm256_setr_epi32(4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3, 4 * v,
                                              4 * v + 1, 4 * v + 2, 4 * v + 3);
      out->scale[v] = _mm256_permutevar8x32_ps(scales, order);
      out->min[v] = _mm256_permutevar8x32_ps(mins, order);
    }
  }
}

// Per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3.
TANDEM_AVX2 inline __m256i Fold32(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
// Per 128-bit lane: the sums of the four vectors folded into ab and cd.
TANDEM_AVX2 inline __m256i Fold64(__m256i ab, __m256i cd) {
  return _mm256_add_epi64(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}

// 128 * sum(q * qa) + sum(q * ra) per 4 bytes.
TANDEM_AVX2 inline __m256i BlockDot(__m256i q, const ActBlock& a) {
  const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
  const __m256i ra = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.r));
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, qa), _mm256_set1_epi16(128)),
                          _mm256_madd_epi16(_mm256_maddubs_epi16(q, ra), _mm256_set1_epi16(1)));
}

template <DType T>
TANDEM_AVX2 inline __m256 SuperDot2(const SuperBlock2& sb, const ActBlock* a, const SuperFactors& f,
                                    __m256 acc) {
  __m256i dot[8];
  for (int k = 0; k < 8; ++k) dot[k] = BlockDot(sb.q[k], a[k]);
  for (int v = 0; v < 2; ++v) {
    const __m256i* d = dot + 4 * v;
    const __m256 x = _mm256_cvtepi32_ps(Fold64(Fold32(d[0], d[1]), Fold32(d[2], d[3])));
    const __m256 unit = _mm256_load_ps(f.unit[v]), sum = _mm256_load_ps(f.sum[v]);
    if constexpr (T == DType::kQ6_K) {
      acc = _mm256_fmadd_ps(_mm256_fmadd_ps(x, unit, sum), sb.scale[v], acc);
    } else {
      acc = _mm256_fnmadd_ps(sb.min[v], sum,
                             _mm256_fmadd_ps(_mm256_mul_ps(x, unit), sb.scale[v], acc));
    }
  }
  return acc;
}

// out[t] = row · token t for NT tokens (activation blocks a[t], factors f[t]); a token's
// arithmetic does not depend on NT (batch invariance).
// `ahead` (or nullptr): a row to bring towards L2 meanwhile, as the AVX-512 path does
// (kernels/cpu/tile_prefetch.h).
template <DType T, int NT>
TANDEM_AVX2 void SuperRowDots2(const uint8_t* row, const uint8_t* ahead, const ActBlock* const* a,
                               const SuperFactors* const* f, int64_t supers, float* out) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    if (ahead != nullptr) PrefetchL2(ahead + s * BlockBytes(T), BlockBytes(T));
    SuperBlock2 sb;
    DecodeSuper2<T>(row + s * BlockBytes(T), &sb);
    for (int t = 0; t < NT; ++t) acc[t] = SuperDot2<T>(sb, a[t] + 8 * s, f[t][s], acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = simd::HorizontalSum(acc[t]);
}

constexpr int kGroupTokens = 4;
constexpr int kTokenBlock = 64;
constexpr int kPrefetchRows = 4;

template <DType T, int NT = kGroupTokens>
TANDEM_AVX2 void GroupDots2(int nt, const uint8_t* row, const uint8_t* ahead,
                            const ActBlock* const* a, const SuperFactors* const* f, int64_t supers,
                            float* out) {
  if constexpr (NT > 1) {
    if (nt < NT) return GroupDots2<T, NT - 1>(nt, row, ahead, a, f, supers, out);
  }
  SuperRowDots2<T, NT>(row, ahead, a, f, supers, out);
}

template <DType T>
void SuperRowsAvx2Of(const uint8_t* w, int64_t row_bytes, int64_t blocks, const ActBlock* acts,
                     const float* bias, float* y, int64_t ldy, int n, int64_t r0, int64_t r1) {
  const int64_t supers = blocks / 8;
  thread_local std::vector<SuperFactors> factors;  // the token block's, token by token
  for (int tb = 0; tb < n; tb += kTokenBlock) {
    const int te = std::min(n, tb + kTokenBlock);
    factors.resize(static_cast<size_t>(te - tb) * supers);
    for (int t = tb; t < te; ++t) {
      FactorsOf<T>(acts + t * blocks, supers, factors.data() + (t - tb) * supers);
    }
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w + r * row_bytes;
      // The row kPrefetchRows ahead is brought in while this one computes.
      const uint8_t* ahead = r + kPrefetchRows < r1 ? row + kPrefetchRows * row_bytes : nullptr;
      const float b = bias ? bias[r] : 0.0f;
      for (int t = tb; t < te; t += kGroupTokens) {
        const int nt = std::min(kGroupTokens, te - t);
        const ActBlock* a[kGroupTokens];
        const SuperFactors* f[kGroupTokens];
        for (int i = 0; i < kGroupTokens; ++i) {
          const int token = t + std::min(i, nt - 1);
          a[i] = acts + token * blocks;
          f[i] = factors.data() + (token - tb) * supers;
        }
        float out[kGroupTokens];
        GroupDots2<T>(nt, row, t == tb ? ahead : nullptr, a, f, supers, out);
        for (int i = 0; i < nt; ++i) y[(t + i) * ldy + r] = out[i] + b;
      }
    }
  }
}

}  // namespace

void SuperRowsAvx2(const uint8_t* w, DType t, int64_t row_bytes, int64_t blocks,
                   const ActBlock* acts, const float* bias, float* y, int64_t ldy, int n,
                   int64_t r0, int64_t r1) {
  switch (t) {
    case DType::kQ4_K:
      return SuperRowsAvx2Of<DType::kQ4_K>(w, row_bytes, blocks, acts, bias, y, ldy, n, r0, r1);
    case DType::kQ5_K:
      return SuperRowsAvx2Of<DType::kQ5_K>(w, row_bytes, blocks, acts, bias, y, ldy, n, r0, r1);
    case DType::kQ6_K:
      return SuperRowsAvx2Of<DType::kQ6_K>(w, row_bytes, blocks, acts, bias, y, ldy, n, r0, r1);
    default:
      return;
  }
}

}  // namespace tandem::cpu
