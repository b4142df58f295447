// Causal attention over the paged KV cache on the CPU.
//
// Work is split into (query tile, KV head) items. A query tile is up to kTileTokens consecutive
// tokens of one sequence at consecutive positions (a prefill chunk; a decode token is a tile of
// one); an item holds every query head that reads its KV head (grouped-query attention), so each
// K and V row is read once per item instead of once per token and head. Per query:
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

// The first key a query at position `pos` attends to: 0, or the start of its sliding window.
inline int FirstKey(const PagedAttentionArgs& a, int pos) {
  return a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
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
    default:  // a KV cache holds one of the four types above (KvCache refuses the others)
      return 0.0f;
  }
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
  const int first = FirstKey(a, pos);
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

// The dot products of one float32 query q[hd] with the 8 keys krows[0, 8) of type D, as one
// vector: 8 accumulators summed by a tree of horizontal adds.
template <DType D>
TANDEM_AVX2 inline __m256 Dot8Keys(const void* const* krows, const float* q, int hd) {
  __m256 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  int d = 0;
  for (; d + 8 <= hd; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(simd::Load8<D>(krows[r], d), qv, acc[r]);
  }
  // [a0(0..1) a0(2..3) a1(0..1) a1(2..3) | a0(4..5) ...] and so on down to one sum per key:
  // the low 128 bits of h0123 hold keys 0-3's sums of lanes 0-3, the high 128 bits lanes 4-7.
  const __m256 h0123 =
      _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 h4567 =
      _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                              _mm256_permute2f128_ps(h0123, h4567, 0x31));
  if (d < hd) {  // head_dim not a multiple of 8
    alignas(32) float tail[8];
    for (int r = 0; r < 8; ++r) {
      float t = 0.0f;
      for (int e = d; e < hd; ++e) t += q[e] * simd::Load1<D>(krows[r], e);
      tail[r] = t;
    }
    sums = _mm256_add_ps(sums, _mm256_load_ps(tail));
  }
  return sums;
}

// acc[t][d0, d0 + 8 * NV) += sum_j p[t][j] * v_j[d0, ...) over the `n` value rows v_j = vrows[j]
// of type D, for NQ queries: NQ × NV accumulators (at most 8, with the NV loads and a broadcast
// 13 of the 16 registers), each V load shared by the NQ queries.
template <DType D, int NQ, int NV>
TANDEM_AVX2 void WeightedSumTile(const void* const* vrows, int n, int d0, const float* const* p,
                                 float* const* acc) {
  __m256 a[NQ][NV];
  for (int t = 0; t < NQ; ++t) {
    for (int c = 0; c < NV; ++c) a[t][c] = _mm256_loadu_ps(acc[t] + d0 + 8 * c);
  }
  for (int j = 0; j < n; ++j) {
    __m256 v[NV];
    for (int c = 0; c < NV; ++c) v[c] = simd::Load8<D>(vrows[j], d0 + 8 * c);
    for (int t = 0; t < NQ; ++t) {
      const __m256 pj = _mm256_set1_ps(p[t][j]);
      for (int c = 0; c < NV; ++c) a[t][c] = _mm256_fmadd_ps(pj, v[c], a[t][c]);
    }
  }
  for (int t = 0; t < NQ; ++t) {
    for (int c = 0; c < NV; ++c) _mm256_storeu_ps(acc[t] + d0 + 8 * c, a[t][c]);
  }
}

template <DType D, int NQ>
TANDEM_AVX2 void WeightedSum(const void* const* vrows, int n, int hd, const float* const* p,
                             float* const* acc) {
  int d = 0;
  for (; d + 32 <= hd; d += 32) WeightedSumTile<D, NQ, 4>(vrows, n, d, p, acc);
  for (; d + 8 <= hd; d += 8) WeightedSumTile<D, NQ, 1>(vrows, n, d, p, acc);
  for (; d < hd; ++d) {  // head_dim not a multiple of 8
    for (int t = 0; t < NQ; ++t) {
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) sum += p[t][j] * simd::Load1<D>(vrows[j], d);
      acc[t][d] += sum;
    }
  }
}

// An item of work: the queries of `tile` whose heads read KV heads [g0, g1), against part
// `part` of `parts` of the tile's keys. A decode token (a tile of one) takes every KV head, so
// it reads whole cache rows (a row holds every KV head of a position: reading one head's slice
// of each row streams at a third of the bandwidth); a long context of few sequences is split
// into parts, each scored and summed on its own and merged after (split-K). A prefill tile
// takes one KV head, keeping its scores [tokens × group, span] small.
struct Item {
  int tile;
  int g0, g1;
  int part, parts;
  int64_t partial;  // parts > 1: its first row in the partial results
};

// A query's unnormalized result in a split item: its weighted sum of V [head_dim], then the
// maximum score and the sum of exp(score - maximum) over the part's keys.
inline int64_t PartialStride(int hd) { return hd + 2; }

struct ItemScratch {
  std::vector<float> scores;      // [queries, span]
  std::vector<const char*> rows;  // [span + kKeyGroup] start of each K row, then [span] V
  std::vector<float> kscale;      // fp8: [KV heads, span + kKeyGroup]
  std::vector<float> vscale;      // fp8: [KV heads, span]
  std::vector<float> max, sum;    // [queries]
  std::vector<const float*> queries;
  std::vector<float*> acc;
};

constexpr int kKeyGroup = 8;     // keys scored together (Dot8Keys)
constexpr int kValueChunk = 16;  // V rows per pass of the accumulators
constexpr int kAhead = 2;        // key groups or value chunks requested ahead of use

// Requests bytes [b0, b1) of rows[0, n) into the L2 cache (into L1, T0, the requests of a
// group outrun the L1 miss buffers and stall the loop).
inline void PrefetchRows(const char* const* rows, int n, int64_t b0, int64_t b1) {
  for (int e = 0; e < n; ++e) {
    for (int64_t b = b0; b < b1; b += 64) _mm_prefetch(rows[e] + b, _MM_HINT_T1);
  }
}

// s[0, len) = exp(s[j] - max s) in place; *max and *sum (of the numerators) for the query.
// len 0 (a part without the query's keys): max -inf, sum 0.
TANDEM_AVX2 inline void SoftmaxNumerators(float* s, int len, float* max, float* sum) {
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
  float total = simd::HorizontalSum(acc);
  for (; j < len; ++j) total += (s[j] = std::exp(s[j] - max_score));
  *max = max_score;
  *sum = total;
}

template <DType D>
TANDEM_AVX2 void AttentionItemAvx2(const float* q, const KvLayerRef& c, const PagedAttentionArgs& a,
                                   Tile tile, const Item& it, ItemScratch& w, float* out,
                                   float* partial) {
  constexpr bool kScaled = D == DType::kFp8E4M3;
  constexpr int64_t kEsize = D == DType::kF32 ? 4 : D == DType::kFp8E4M3 ? 1 : 2;
  const int hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const int64_t head_bytes = hd * kEsize, row_bytes = c.width() * kEsize;
  const int* table =
      a.block_tables + static_cast<int64_t>(a.token_seq[tile.t0]) * a.max_blocks_per_seq;
  const int pos0 = a.token_pos[tile.t0];
  const int m = tile.m;
  auto first = [&](int i) { return FirstKey(a, pos0 + i); };
  // This part's keys [k0, k0 + span) of the tile's [first(0), pos0 + m).
  const int lo = first(0), all = pos0 + m - lo;
  const int k0 = lo + static_cast<int>(static_cast<int64_t>(all) * it.part / it.parts);
  const int span = lo + static_cast<int>(static_cast<int64_t>(all) * (it.part + 1) / it.parts) - k0;
  const int ng = it.g1 - it.g0, hs = ng * group, nq = m * hs;
  const int64_t b0 = it.g0 * head_bytes, b1 = it.g1 * head_bytes;  // the item's bytes of a row

  // Where each key's row starts, block by block: a block's slots are consecutive rows.
  const int kstride = span + kKeyGroup;
  w.rows.resize(kstride + span);
  const char** krows = w.rows.data();
  const char** vrows = w.rows.data() + kstride;
  if (kScaled) {
    w.kscale.assign(static_cast<size_t>(ng) * kstride, 0.0f);
    w.vscale.resize(static_cast<size_t>(ng) * span);
  }
  for (int pos = k0; pos < k0 + span;) {
    const int off = pos % a.block_size;
    const int block = table[pos / a.block_size];
    const int n = std::min(a.block_size - off, k0 + span - pos);
    const int64_t at = (static_cast<int64_t>(block) * a.block_size + off) * row_bytes;
    for (int e = 0; e < n; ++e) {
      krows[pos - k0 + e] = static_cast<const char*>(c.k) + at + e * row_bytes;
      vrows[pos - k0 + e] = static_cast<const char*>(c.v) + at + e * row_bytes;
    }
    if (kScaled) {
      for (int g = 0; g < ng; ++g) {
        std::fill_n(w.kscale.begin() + g * kstride + (pos - k0), n, c.scale(block, 0, it.g0 + g));
        std::fill_n(w.vscale.begin() + g * span + (pos - k0), n, c.scale(block, 1, it.g0 + g));
      }
    }
    pos += n;
  }
  std::fill(krows + span, krows + kstride, krows[span - 1]);  // a last partial group repeats

  // Query r = i * hs + (h - g0 * group): token i of the tile, head h.
  w.queries.resize(nq);
  w.acc.resize(nq);
  for (int i = 0; i < m; ++i) {
    for (int hh = 0; hh < hs; ++hh) {
      const int r = i * hs + hh;
      const int64_t at = (static_cast<int64_t>(tile.t0 + i) * a.n_heads + it.g0 * group + hh) * hd;
      w.queries[r] = q + at;
      w.acc[r] = it.parts == 1 ? out + at : partial + (it.partial + r) * PartialStride(hd);
      std::fill_n(w.acc[r], hd, 0.0f);
    }
  }
  w.scores.resize(static_cast<size_t>(nq) * span + kKeyGroup);

  // Scores, one pass over K in groups of 8 keys, each group's rows shared by every query.
  const float inv_sqrt = a.ScoreScale();
  for (int j = 0; j < span; j += kKeyGroup) {
    const int ahead = j + kAhead * kKeyGroup;
    if (ahead < span) PrefetchRows(krows + ahead, std::min(kKeyGroup, span - ahead), b0, b1);
    for (int g = 0; g < ng; ++g) {
      const void* keys[kKeyGroup];
      for (int e = 0; e < kKeyGroup; ++e) keys[e] = krows[j + e] + b0 + g * head_bytes;
      const __m256 ks = kScaled ? _mm256_mul_ps(_mm256_loadu_ps(w.kscale.data() + g * kstride + j),
                                                _mm256_set1_ps(inv_sqrt))
                                : _mm256_set1_ps(inv_sqrt);
      for (int i = 0; i < m; ++i) {
        for (int hh = g * group; hh < (g + 1) * group; ++hh) {
          const int r = i * hs + hh;
          const __m256 dots = _mm256_mul_ps(Dot8Keys<D>(keys, w.queries[r], hd), ks);
          float* dst = w.scores.data() + static_cast<size_t>(r) * span + j;
          if (j + kKeyGroup <= span) {
            _mm256_storeu_ps(dst, dots);
          } else {
            alignas(32) float tail[kKeyGroup];
            _mm256_store_ps(tail, dots);
            std::copy_n(tail, span - j, dst);
          }
        }
      }
    }
  }
  // Softmax numerators in place, zero outside each query's keys; maximum and sum per query.
  w.max.resize(nq);
  w.sum.resize(nq);
  for (int r = 0; r < nq; ++r) {
    const int i = r / hs;
    float* row = w.scores.data() + static_cast<size_t>(r) * span;
    const int b = std::clamp(first(i) - k0, 0, span);
    const int e = std::clamp(pos0 + i - k0 + 1, b, span);  // valid [b, e), maybe empty in a part
    std::fill(row, row + b, 0.0f);
    std::fill(row + e, row + span, 0.0f);
    float* s = row + b;
    const int len = e - b;
    SoftmaxNumerators(s, len, &w.max[r], &w.sum[r]);
    if (kScaled) {  // each V row's scale, folded into its weight
      const float* vs = w.vscale.data() + static_cast<size_t>((r % hs) / group) * span + b;
      for (int j = 0; j < len; ++j) s[j] *= vs[j];
    }
  }
  // Weighted sum of V in chunks of rows, each chunk's rows shared by every query.
  for (int j0 = 0; j0 < span; j0 += kValueChunk) {
    const int n = std::min(kValueChunk, span - j0);
    const int ahead = j0 + kAhead * kValueChunk;
    if (ahead < span) PrefetchRows(vrows + ahead, std::min(kValueChunk, span - ahead), b0, b1);
    for (int g = 0; g < ng; ++g) {
      const void* vg[kValueChunk];
      for (int e = 0; e < n; ++e) vg[e] = vrows[j0 + e] + b0 + g * head_bytes;
      // This KV head's queries, two at a time.
      int k = 0;
      const int count = m * group;
      auto query = [&](int k) { return (k / group) * hs + g * group + k % group; };
      for (; k < count; k += 2) {
        const int r0 = query(k);
        if (k + 1 < count) {
          const int r1 = query(k + 1);
          const float* p[2] = {w.scores.data() + static_cast<size_t>(r0) * span + j0,
                               w.scores.data() + static_cast<size_t>(r1) * span + j0};
          float* acc[2] = {w.acc[r0], w.acc[r1]};
          WeightedSum<D, 2>(vg, n, hd, p, acc);
        } else {
          const float* p[1] = {w.scores.data() + static_cast<size_t>(r0) * span + j0};
          float* acc[1] = {w.acc[r0]};
          WeightedSum<D, 1>(vg, n, hd, p, acc);
        }
      }
    }
  }
  for (int r = 0; r < nq; ++r) {
    float* acc = w.acc[r];
    if (it.parts == 1) {
      const float inv = 1.0f / w.sum[r];  // a whole span holds the query's own key
      for (int d = 0; d < hd; ++d) acc[d] *= inv;
    } else {
      acc[hd] = w.max[r];
      acc[hd + 1] = w.sum[r];
    }
  }
}

// out[h] of a split decode token from its parts' partial results [parts, n_heads, stride].
void MergeParts(const float* partial, int parts, int n_heads, int hd, float* out) {
  const int64_t stride = PartialStride(hd);
  for (int h = 0; h < n_heads; ++h) {
    float max_score = -INFINITY;
    for (int p = 0; p < parts; ++p) {
      max_score = std::max(max_score, partial[(p * n_heads + h) * stride + hd]);
    }
    float* o = out + static_cast<int64_t>(h) * hd;
    std::fill_n(o, hd, 0.0f);
    float sum = 0.0f;
    for (int p = 0; p < parts; ++p) {
      const float* part = partial + (p * n_heads + h) * stride;
      if (part[hd + 1] == 0.0f) continue;  // no key of this query in the part
      const float f = std::exp(part[hd] - max_score);
      sum += f * part[hd + 1];
      for (int d = 0; d < hd; ++d) o[d] += f * part[d];
    }
    for (int d = 0; d < hd; ++d) o[d] /= sum;
  }
}

template <DType D>
void PagedAttentionAvx2(const float* q, const KvLayerRef& c, const PagedAttentionArgs& a,
                        float* out, ThreadPool* pool) {
  constexpr int kMinPartKeys = 128;  // a split decode token's fewest keys per part
  const std::vector<Tile> tiles = MakeTiles(a);
  // Split decode tokens only when there would be fewer items than twice the threads.
  const int threads = pool == nullptr ? 1 : std::max(1, pool->num_threads());
  int64_t whole = 0;
  for (const Tile& t : tiles) whole += t.m == 1 ? 1 : a.n_kv_heads;
  const int want = whole >= 2 * threads ? 1 : static_cast<int>((2 * threads + whole - 1) / whole);
  std::vector<Item> items;
  std::vector<std::pair<int, int>> split;  // (tile, parts), in the order of their partial results
  int64_t partial_rows = 0;
  for (int t = 0; t < static_cast<int>(tiles.size()); ++t) {
    if (tiles[t].m == 1) {
      const int pos = a.token_pos[tiles[t].t0];
      const int span = pos + 1 - FirstKey(a, pos);
      const int parts = std::clamp(span / kMinPartKeys, 1, want);
      for (int p = 0; p < parts; ++p) {
        items.push_back({t, 0, a.n_kv_heads, p, parts, partial_rows + p * a.n_heads});
      }
      if (parts > 1) {
        split.push_back({t, parts});
        partial_rows += static_cast<int64_t>(parts) * a.n_heads;
      }
    } else {
      for (int g = 0; g < a.n_kv_heads; ++g) items.push_back({t, g, g + 1, 0, 1, 0});
    }
  }
  std::vector<float> partial(partial_rows * PartialStride(a.head_dim));
  // Items in reverse order: the long (late) tiles of a prefill start first, which balances the
  // dynamic split.
  const int64_t n = static_cast<int64_t>(items.size());
  ParallelFor(pool, n, 1, [&](int64_t w0, int64_t w1) {
    thread_local ItemScratch scratch;
    for (int64_t w = w0; w < w1; ++w) {
      const Item& it = items[n - 1 - w];
      AttentionItemAvx2<D>(q, c, a, tiles[it.tile], it, scratch, out, partial.data());
    }
  });
  int64_t at = 0;
  for (const auto& [t, parts] : split) {
    const int64_t token = tiles[t].t0;
    MergeParts(partial.data() + at * PartialStride(a.head_dim), parts, a.n_heads, a.head_dim,
               out + token * a.n_heads * a.head_dim);
    at += static_cast<int64_t>(parts) * a.n_heads;
  }
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
