// Causal attention over the paged KV cache on the CPU.
//
// Work is split into (query tile, head) items. A query tile is up to kTileTokens consecutive
// tokens of one sequence at consecutive positions (a prefill chunk; a decode token is a tile of
// one), so each K and V row is read once per tile instead of once per token. Per item:
//   scores[i, j] = q_i · k_j / sqrt(head_dim)  for j in the window of token i
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

// The cache slot of sequence position `pos`; the slot's row is [n_kv_heads, head_dim] floats.
inline int64_t SlotOf(const PagedAttentionArgs& a, const int* table, int pos) {
  return static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
}

void AttentionTokenScalar(const float* q, const float* k_cache, const float* v_cache,
                          const PagedAttentionArgs& a, int t, int h, std::vector<float>& scores,
                          float* out) {
  const int group = a.n_heads / a.n_kv_heads;
  const int64_t kv_width = static_cast<int64_t>(a.n_kv_heads) * a.head_dim;
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  const int kvh = h / group;
  const int pos = a.token_pos[t];
  const int* table = a.block_tables + static_cast<int64_t>(a.token_seq[t]) * a.max_blocks_per_seq;
  const float* qh = q + (static_cast<int64_t>(t) * a.n_heads + h) * a.head_dim;
  float* oh = out + (static_cast<int64_t>(t) * a.n_heads + h) * a.head_dim;
  const int first = a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
  scores.resize(pos + 1);
  float max_score = -INFINITY;
  for (int j = first; j <= pos; ++j) {
    const float* kj = k_cache + SlotOf(a, table, j) * kv_width + int64_t{kvh} * a.head_dim;
    float s = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) s += qh[d] * kj[d];
    scores[j] = s * inv_sqrt;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (int j = first; j <= pos; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  std::fill(oh, oh + a.head_dim, 0.0f);
  for (int j = first; j <= pos; ++j) {
    const float* vj = v_cache + SlotOf(a, table, j) * kv_width + int64_t{kvh} * a.head_dim;
    const float p = scores[j] / sum;
    for (int d = 0; d < a.head_dim; ++d) oh[d] += p * vj[d];
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

// scores[t * lds + r] = (k[r] · q[t]) * scale for NK <= 3 keys and NQ <= 4 queries q + t * ldq.
template <int NQ>
TANDEM_AVX2 void ScoreTile(const void* const* keys, int nk, const float* q, int64_t ldq, int hd,
                           float scale, float* scores, int64_t lds) {
  float out[3][NQ];
  simd::DotTile<DType::kF32, 3, NQ>(keys, q, ldq, hd, out);
  for (int t = 0; t < NQ; ++t) {
    for (int r = 0; r < nk; ++r) scores[t * lds + r] = out[r][t] * scale;
  }
}

// out[t][d0, d0 + 8 * NV) = inv_sum[t] * sum_j p[t * ldp + j] * v_j[d0, ...) over the `len`
// value rows v_j = vrows[j], for NQ <= 3 queries: 3 × 4 accumulators at most, each V load
// shared by the NQ queries.
template <int NQ, int NV>
TANDEM_AVX2 void WeightedSumTile(const float* const* vrows, int len, int d0, const float* p,
                                 int64_t ldp, const float* inv_sum, float* const* out) {
  __m256 acc[NQ][NV];
  for (int t = 0; t < NQ; ++t) {
    for (int c = 0; c < NV; ++c) acc[t][c] = _mm256_setzero_ps();
  }
  for (int j = 0; j < len; ++j) {
    // Rows of a long context come from memory, one short row per position: ask ahead.
    if (j + kPrefetchRows < len) {
      _mm_prefetch(reinterpret_cast<const char*>(vrows[j + kPrefetchRows] + d0), _MM_HINT_T0);
      if (NV > 2) {
        _mm_prefetch(reinterpret_cast<const char*>(vrows[j + kPrefetchRows] + d0 + 16),
                     _MM_HINT_T0);
      }
    }
    __m256 v[NV];
    for (int c = 0; c < NV; ++c) v[c] = _mm256_loadu_ps(vrows[j] + d0 + 8 * c);
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

template <int NQ>
TANDEM_AVX2 void WeightedSum(const float* const* vrows, int len, int hd, const float* p,
                             int64_t ldp, const float* inv_sum, float* const* out) {
  int d = 0;
  for (; d + 32 <= hd; d += 32) WeightedSumTile<NQ, 4>(vrows, len, d, p, ldp, inv_sum, out);
  for (; d + 8 <= hd; d += 8) WeightedSumTile<NQ, 1>(vrows, len, d, p, ldp, inv_sum, out);
  for (; d < hd; ++d) {  // head_dim not a multiple of 8
    for (int t = 0; t < NQ; ++t) {
      float acc = 0.0f;
      for (int j = 0; j < len; ++j) acc += p[t * ldp + j] * vrows[j][d];
      out[t][d] = acc * inv_sum[t];
    }
  }
}

// One (tile, head) item: queries i < m of the tile attend to keys [first(i), pos0 + i] within the
// tile's span [lo, hi]. `scores` holds [m, span] (zero outside each query's keys after the
// softmax); `vrows` [span] pointers.
TANDEM_AVX2 void AttentionTileAvx2(const float* q, const float* k_cache, const float* v_cache,
                                   const PagedAttentionArgs& a, Tile tile, int h,
                                   std::vector<float>& scores, std::vector<const float*>& vrows,
                                   float* out) {
  const int hd = a.head_dim;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t kv_width = static_cast<int64_t>(a.n_kv_heads) * hd;
  const int64_t ldq = static_cast<int64_t>(a.n_heads) * hd;  // between consecutive tokens
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
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
  const float* q0 = q + (static_cast<int64_t>(tile.t0) * a.n_heads + h) * hd;
  float* oi[kTileTokens];
  for (int i = 0; i < m; ++i)
    oi[i] = out + (static_cast<int64_t>(tile.t0 + i) * a.n_heads + h) * hd;

  // Scores, one pass over K: tiles of 3 keys × 4 queries.
  for (int j = lo; j <= hi; j += 3) {
    const int nk = std::min(3, hi - j + 1);
    for (int r = 0; r < 3 && j + kPrefetchRows + r <= hi; ++r) {  // as in WeightedSumTile
      const char* kr = reinterpret_cast<const char*>(
          k_cache + SlotOf(a, table, j + kPrefetchRows + r) * kv_width + int64_t{kvh} * hd);
      for (int b = 0; b < hd * 4; b += 64) _mm_prefetch(kr + b, _MM_HINT_T0);
    }
    const void* keys[3];
    for (int r = 0; r < 3; ++r) {  // keys past the end alias the last one
      keys[r] = k_cache + SlotOf(a, table, j + std::min(r, nk - 1)) * kv_width + int64_t{kvh} * hd;
    }
    for (int r = 0; r < nk; ++r) {
      vrows[j + r - lo] = v_cache + SlotOf(a, table, j + r) * kv_width + int64_t{kvh} * hd;
    }
    float* sj = scores.data() + (j - lo);
    int i = 0;
    for (; i + 4 <= m; i += 4) {
      ScoreTile<4>(keys, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + static_cast<size_t>(i) * span,
                   span);
    }
    switch (m - i) {
      case 1:
        ScoreTile<1>(keys, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + i * span, span);
        break;
      case 2:
        ScoreTile<2>(keys, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + i * span, span);
        break;
      case 3:
        ScoreTile<3>(keys, nk, q0 + i * ldq, ldq, hd, inv_sqrt, sj + i * span, span);
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
  }
  // Weighted sum of V, one pass over V per group of 3 queries.
  int i = 0;
  for (; i + 3 <= m; i += 3) {
    WeightedSum<3>(vrows.data(), span, hd, scores.data() + static_cast<size_t>(i) * span, span,
                   inv_sum + i, oi + i);
  }
  if (m - i == 2) {
    WeightedSum<2>(vrows.data(), span, hd, scores.data() + static_cast<size_t>(i) * span, span,
                   inv_sum + i, oi + i);
  } else if (m - i == 1) {
    WeightedSum<1>(vrows.data(), span, hd, scores.data() + static_cast<size_t>(i) * span, span,
                   inv_sum + i, oi + i);
  }
}

}  // namespace

void PagedAttention(const float* q, const float* k_cache, const float* v_cache,
                    const PagedAttentionArgs& a, float* out, ThreadPool* pool) {
  if (ActiveIsa() != Isa::kAvx2) {
    ParallelFor(pool, static_cast<int64_t>(a.num_tokens) * a.n_heads, 1,
                [&](int64_t w0, int64_t w1) {
                  std::vector<float> scores;
                  for (int64_t w = w0; w < w1; ++w) {
                    AttentionTokenScalar(q, k_cache, v_cache, a, static_cast<int>(w / a.n_heads),
                                         static_cast<int>(w % a.n_heads), scores, out);
                  }
                });
    return;
  }
  const std::vector<Tile> tiles = MakeTiles(a);
  // Items in reverse order: the long (late) tiles of a prefill start first, which balances the
  // dynamic split.
  const int64_t items = static_cast<int64_t>(tiles.size()) * a.n_heads;
  ParallelFor(pool, items, 1, [&](int64_t w0, int64_t w1) {
    thread_local std::vector<float> scores;
    thread_local std::vector<const float*> vrows;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t item = items - 1 - w;
      AttentionTileAvx2(q, k_cache, v_cache, a, tiles[item / a.n_heads],
                        static_cast<int>(item % a.n_heads), scores, vrows, out);
    }
  });
}

}  // namespace tandem::cpu
