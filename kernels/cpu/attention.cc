// Causal attention over the paged KV cache on the CPU.
//
// Work is split into (query tile, head) items. A query tile is up to kTileTokens consecutive
// tokens of one sequence at consecutive positions (a prefill chunk; a decode token is a tile of
// one), so each K and V row is read once per tile instead of once per token. Per item:
//   scores[i, j] = q_i · k_j · scale (1 / sqrt(head_dim) unless set)  for j in token i's window
//   p[i, j]      = exp(scores[i, j] - max_j) / sum_j
//   out_i        = sum_j p[i, j] · v_j
// The scalar path is the plain per-token loop and serves as the reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace tandem::cpu {
namespace {

constexpr int kTileTokens = 8;
constexpr int kPrefetchRows = 6;  // K/V rows requested ahead of use

// The cache slot of sequence position `pos`; the slot's row is [n_kv_heads, head_dim].
inline int64_t SlotOf(const PagedAttentionArgs& a, const int* table, int pos) {
  return static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
}

// Where KV head `kvh` of position `pos` lives in K (kv = 0) or V (kv = 1), and its scale.
struct Row {
  const void* data;
  float scale;
};
inline Row RowOf(const KvLayerRef& c, const PagedAttentionArgs& a, const int* table, int pos,
                 int kv, int kvh) {
  const int64_t esize = static_cast<int64_t>(DTypeSize(c.dtype));
  const char* base = static_cast<const char*>(kv == 0 ? c.k : c.v);
  const int block = table[pos / a.block_size];
  const int64_t slot = static_cast<int64_t>(block) * a.block_size + pos % a.block_size;
  return {base + (slot * c.width() + static_cast<int64_t>(kvh) * a.head_dim) * esize,
          c.scale(block, kv, kvh)};
}

// Element d of a cache row, as float32 (unscaled).
inline float Elem(DType dtype, const void* row, int d) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(row)[d];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(row)[d]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(row)[d]);
    case DType::kFp8E4M3:
      return Fp8E4M3ToF32(static_cast<const uint8_t*>(row)[d]);
  }
  return 0.0f;
}

void AttentionTokenScalar(const float* q, const KvLayerRef& c, const PagedAttentionArgs& a, int t,
                          int h, std::vector<float>& scores, float* out) {
  const int group = a.n_heads / a.n_kv_heads;
  const float inv_sqrt = a.ScoreScale();
  const int kvh = h / group;
  const int pos = a.token_pos[t];
  const int* table = a.block_tables + static_cast<int64_t>(a.token_seq[t]) * a.max_blocks_per_seq;
  const float* qh = q + (static_cast<int64_t>(t) * a.n_heads + h) * a.head_dim;
  float* oh = out + (static_cast<int64_t>(t) * a.n_heads + h) * a.head_dim;
  const int first = a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
  scores.resize(pos + 1);
  float max_score = -INFINITY;
  for (int j = first; j <= pos; ++j) {
    const Row kj = RowOf(c, a, table, j, 0, kvh);
    float s = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) s += qh[d] * Elem(c.dtype, kj.data, d);
    scores[j] = s * kj.scale * inv_sqrt;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (int j = first; j <= pos; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  std::fill(oh, oh + a.head_dim, 0.0f);
  for (int j = first; j <= pos; ++j) {
    const Row vj = RowOf(c, a, table, j, 1, kvh);
    const float p = scores[j] / sum * vj.scale;
    for (int d = 0; d < a.head_dim; ++d) oh[d] += p * Elem(c.dtype, vj.data, d);
  }
}

// A tile: tokens [t0, t0 + m) of one sequence at positions [pos0, pos0 + m).
struct Tile {
  int t0;
  int m;
};

std::vector<Tile> MakeTiles(const PagedAttentionArgs& a) {
  std::vector<Tile> tiles;
  for (int t = 0; t < a.num_tokens;) {
    int m = 1;
    while (m < kTileTokens && t + m < a.num_tokens && a.token_seq[t + m] == a.token_seq[t] &&
           a.token_pos[t + m] == a.token_pos[t] + m) {
      ++m;
    }
    tiles.push_back({t, m});
    t += m;
  }
  return tiles;
}

// scores[t * lds + r] = (k[r] · q[t]) * scale * kscale[r] for NK <= 3 keys of type D and
// NQ <= 4 queries q + t * ldq.
template <DType D, int NQ>
TANDEM_AVX2 void ScoreTile(const void* const* keys, const float* kscale, int nk, const float* q,
                           int64_t ldq, int hd, float scale, float* scores, int64_t lds) {
  float out[3][NQ];
  simd::DotTile<D, 3, NQ>(keys, q, ldq, hd, out);
  for (int t = 0; t < NQ; ++t) {
    for (int r = 0; r < nk; ++r) scores[t * lds + r] = out[r][t] * scale * kscale[r];
  }
}

// out[t][d0, d0 + 8 * NV) = inv_sum[t] * sum_j p[t * ldp + j] * v_j[d0, ...) over the `len`
// value rows v_j = vrows[j] of type D, for NQ <= 3 queries: 3 × 4 accumulators at most, each V
// load shared by the NQ queries. (A row's scale is folded into p.)
template <DType D, int NQ, int NV>
TANDEM_AVX2 void WeightedSumTile(const void* const* vrows, int len, int d0, const float* p,
                                 int64_t ldp, const float* inv_sum, float* const* out) {
  constexpr int64_t kEsize = static_cast<int64_t>(D == DType::kF32       ? 4
                                                  : D == DType::kFp8E4M3 ? 1
                                                                         : 2);
  __m256 acc[NQ][NV];
  for (int t = 0; t < NQ; ++t) {
    for (int c = 0; c < NV; ++c) acc[t][c] = _mm256_setzero_ps();
  }
  for (int j = 0; j < len; ++j) {
    // Rows of a long context come from memory, one short row per position: ask ahead.
    if (j + kPrefetchRows < len) {
      const char* ahead = static_cast<const char*>(vrows[j + kPrefetchRows]) + d0 * kEsize;
      _mm_prefetch(ahead, _MM_HINT_T0);
      if (NV > 2 && kEsize == 4) _mm_prefetch(ahead + 64, _MM_HINT_T0);
    }
    __m256 v[NV];
    for (int c = 0; c < NV; ++c) v[c] = simd::Load8<D>(vrows[j], d0 + 8 * c);
    for (int t = 0; t < NQ; ++t) {
      const __m256 pj = _mm256_set1_ps(p[t * ldp + j]);
      for (int c = 0; c < NV; ++c) acc[t][c] = _mm256_fmadd_ps(pj, v[c], acc[t][c]);
    }
  }
  for (int t = 0; t < NQ; ++t) {
    const __m256 s = _mm256_set1_ps(inv_sum[t]);
    for (int c = 0; c < NV; ++c) {
      _mm256_storeu_ps(out[t] + d0 + 8 * c, _mm256_mul_ps(acc[t][c], s));
    }
  }
}

template <DType D, int NQ>
TANDEM_AVX2 void WeightedSum(const void* const* vrows, int len, int hd, const float* p, int64_t ldp,
                             const float* inv_sum, float* const* out) {
  int d = 0;
  for (; d + 32 <= hd; d += 32) WeightedSumTile<D, NQ, 4>(vrows, len, d, p, ldp, inv_sum, out);
  for (; d + 8 <= hd; d += 8) WeightedSumTile<D, NQ, 1>(vrows, len, d, p, ldp, inv_sum, out);
  for (; d < hd; ++d) {  // head_dim not a multiple of 8
    for (int t = 0; t < NQ; ++t) {
      float acc = 0.0f;
      for (int j = 0; j < len; ++j) acc += p[t * ldp + j] * simd::Load1<D>(vrows[j], d);
      out[t][d] = acc * inv_sum[t];
    }
  }
}

// One (tile, head) item: queries i < m of the tile attend to keys [first(i), pos0 + i] within the
// tile's span [lo, hi]. `scores` holds [m, span] (zero outside each query's keys after the
// softmax); `vrows` [span] pointers and `vscale` their scales (fp8).
template <DType D>
TANDEM_AVX2 void AttentionTileAvx2(const float* q, const KvLayerRef& c, const PagedAttentionArgs& a,
                                   Tile tile, int h, std::vector<float>& scores,
                                   std::vector<const void*>& vrows, std::vector<float>& vscale,
                                   float* out) {
  constexpr bool kScaled = D == DType::kFp8E4M3;
  const int hd = a.head_dim;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t ldq = static_cast<int64_t>(a.n_heads) * hd;  // between consecutive tokens
  const float inv_sqrt = a.ScoreScale();
  const int* table =
      a.block_tables + static_cast<int64_t>(a.token_seq[tile.t0]) * a.max_blocks_per_seq;
  const int pos0 = a.token_pos[tile.t0];
  const int m = tile.m;
  auto first = [&](int i) {
    return a.sliding_window > 0 ? std::max(0, pos0 + i - a.sliding_window + 1) : 0;
  };
  const int lo = first(0), hi = pos0 + m - 1;
  const int span = hi - lo + 1;
  scores.resize(static_cast<size_t>(m) * span);
  vrows.resize(span);
  if (kScaled) vscale.resize(span);
  const float* q0 = q + (static_cast<int64_t>(tile.t0) * a.n_heads + h) * hd;
  float* oi[kTileTokens];
  for (int i = 0; i < m; ++i)
    oi[i] = out + (static_cast<int64_t>(tile.t0 + i) * a.n_heads + h) * hd;

  // Scores, one pass over K: tiles of 3 keys × 4 queries.
  for (int j = lo; j <= hi; j += 3) {
    const int nk = std::min(3, hi - j + 1);
    for (int r = 0; r < 3 && j + kPrefetchRows + r <= hi; ++r) {  // as in WeightedSumTile
      const char* kr =
          static_cast<const char*>(RowOf(c, a, table, j + kPrefetchRows + r, 0, kvh).data);
      for (int b = 0; b < hd * static_cast<int>(DTypeSize(D)); b += 64) {
        _mm_prefetch(kr + b, _MM_HINT_T0);
      }
    }
    const void* keys[3];
    float kscale[3];
    for (int r = 0; r < 3; ++r) {  // keys past the end alias the last one
      const Row kr = RowOf(c, a, table, j + std::min(r, nk - 1), 0, kvh);
      keys[r] = kr.data;
      kscale[r] = kr.scale;
    }
    for (int r = 0; r < nk; ++r) {
      const Row vr = RowOf(c, a, table, j + r, 1, kvh);
      vrows[j + r - lo] = vr.data;
      if (kScaled) vscale[j + r - lo] = vr.scale;
    }
    float* sj = scores.data() + (j - lo);
    int i = 0;
    for (; i + 4 <= m; i += 4) {
      ScoreTile<D, 4>(keys, kscale, nk, q0 + i * ldq, ldq, hd, inv_sqrt,
                      sj + static_cast<size_t>(i) * span, span);
    }
    switch (m - i) {
      case 1:
        ScoreTile<D, 1>(keys, kscale, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + i * span, span);
        break;
      case 2:
        ScoreTile<D, 2>(keys, kscale, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + i * span, span);
        break;
      case 3:
        ScoreTile<D, 3>(keys, kscale, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + i * span, span);
        break;
      default:
        break;
    }
  }
  // Softmax numerators in place, zero outside each query's keys; sums kept per query.
  float inv_sum[kTileTokens];
  for (int i = 0; i < m; ++i) {
    float* row = scores.data() + static_cast<size_t>(i) * span;
    const int b = first(i) - lo, e = pos0 + i - lo + 1;  // valid [b, e)
    std::fill(row, row + b, 0.0f);
    std::fill(row + e, row + span, 0.0f);
    float* s = row + b;
    const int len = e - b;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= len; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    float max_score = simd::HorizontalMax(mx);
    for (; j < len; ++j) max_score = std::max(max_score, s[j]);
    const __m256 mv = _mm256_set1_ps(max_score);
    __m256 acc = _mm256_setzero_ps();
    j = 0;
    for (; j + 8 <= len; j += 8) {
      const __m256 ex = simd::Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
      _mm256_storeu_ps(s + j, ex);
      acc = _mm256_add_ps(acc, ex);
    }
    float sum = simd::HorizontalSum(acc);
    for (; j < len; ++j) sum += (s[j] = std::exp(s[j] - max_score));
    inv_sum[i] = 1.0f / sum;
    if (kScaled) {  // each V row's scale, folded into its weight
      for (j = 0; j < len; ++j) s[j] *= vscale[b + j];
    }
  }
  // Weighted sum of V, one pass over V per group of 3 queries.
  int i = 0;
  for (; i + 3 <= m; i += 3) {
    WeightedSum<D, 3>(vrows.data(), span, hd, scores.data() + static_cast<size_t>(i) * span, span,
                      inv_sum + i, oi + i);
  }
  if (m - i == 2) {
    WeightedSum<D, 2>(vrows.data(), span, hd, scores.data() + static_cast<size_t>(i) * span, span,
                      inv_sum + i, oi + i);
  } else if (m - i == 1) {
    WeightedSum<D, 1>(vrows.data(), span, hd, scores.data() + static_cast<size_t>(i) * span, span,
                      inv_sum + i, oi + i);
  }
}

template <DType D>
void PagedAttentionAvx2(const float* q, const KvLayerRef& c, const PagedAttentionArgs& a,
                        float* out, ThreadPool* pool) {
  const std::vector<Tile> tiles = MakeTiles(a);
  // Items in reverse order: the long (late) tiles of a prefill start first, which balances the
  // dynamic split.
  const int64_t items = static_cast<int64_t>(tiles.size()) * a.n_heads;
  ParallelFor(pool, items, 1, [&](int64_t w0, int64_t w1) {
    thread_local std::vector<float> scores;
    thread_local std::vector<const void*> vrows;
    thread_local std::vector<float> vscale;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t item = items - 1 - w;
      AttentionTileAvx2<D>(q, c, a, tiles[item / a.n_heads], static_cast<int>(item % a.n_heads),
                           scores, vrows, vscale, out);
    }
  });
}

}  // namespace

void PagedAttention(const float* q, const KvLayerRef& c, const PagedAttentionArgs& a, float* out,
                    ThreadPool* pool) {
  if (ActiveIsa() == Isa::kScalar) {
    ParallelFor(pool, static_cast<int64_t>(a.num_tokens) * a.n_heads, 1,
                [&](int64_t w0, int64_t w1) {
                  std::vector<float> scores;
                  for (int64_t w = w0; w < w1; ++w) {
                    AttentionTokenScalar(q, c, a, static_cast<int>(w / a.n_heads),
                                         static_cast<int>(w % a.n_heads), scores, out);
                  }
                });
    return;
  }
  switch (c.dtype) {
    case DType::kF32:
      return PagedAttentionAvx2<DType::kF32>(q, c, a, out, pool);
    case DType::kBF16:
      return PagedAttentionAvx2<DType::kBF16>(q, c, a, out, pool);
    case DType::kF16:
      return PagedAttentionAvx2<DType::kF16>(q, c, a, out, pool);
    case DType::kFp8E4M3:
      return PagedAttentionAvx2<DType::kFp8E4M3>(q, c, a, out, pool);
    default:  // a KV cache holds one of the four types above (KvCache refuses the others)
      return;
  }
}

void PagedAttention(const float* q, const float* k_cache, const float* v_cache,
                    const PagedAttentionArgs& a, float* out, ThreadPool* pool) {
  PagedAttention(q,
                 F32Cache(const_cast<float*>(k_cache), const_cast<float*>(v_cache), a.block_size,
                          a.n_kv_heads, a.head_dim),
                 a, out, pool);
}

}  // namespace tandem::cpu
