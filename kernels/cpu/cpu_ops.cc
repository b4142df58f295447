#include "kernels/cpu/cpu_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace tandem::cpu {
namespace {

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

float DotScalar(const float* a, const float* b, int64_t n) {
  float acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}

__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int64_t n) {
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

// out[t] = w · x[t] for 4 rows of x at once, sharing the loads of w.
__attribute__((target("avx2,fma"))) void Dot4Avx2(const float* w, const float* x0, const float* x1,
                                                  const float* x2, const float* x3, int64_t n,
                                                  float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wv = _mm256_loadu_ps(w + i);
    a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + i), a0);
    a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + i), a1);
    a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x2 + i), a2);
    a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x3 + i), a3);
  }
  out[0] = HorizontalSum(a0);
  out[1] = HorizontalSum(a1);
  out[2] = HorizontalSum(a2);
  out[3] = HorizontalSum(a3);
  for (; i < n; ++i) {
    out[0] += w[i] * x0[i];
    out[1] += w[i] * x1[i];
    out[2] += w[i] * x2[i];
    out[3] += w[i] * x3[i];
  }
}

__attribute__((target("avx2,fma,f16c"))) void ConvertRowAvx2(DType dtype, const void* src,
                                                             float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
    for (; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
  } else {
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) dst[i] = F16ToF32(s[i]);
  }
}

// A float32 view of weight row r: the row itself for f32, else converted into `scratch`.
const float* WeightRow(const WeightRef& w, int64_t r, float* scratch) {
  const size_t esize = DTypeSize(w.dtype);
  const void* src = static_cast<const char*>(w.data) + r * w.cols * esize;
  if (w.dtype == DType::kF32) return static_cast<const float*>(src);
  if (HasAvx2Fma()) {
    ConvertRowAvx2(w.dtype, src, scratch, w.cols);
  } else {
    ConvertToF32(w.dtype, src, scratch, w.cols);
  }
  return scratch;
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  return HasAvx2Fma() ? DotAvx2(a, b, n) : DotScalar(a, b, n);
}

void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n) {
  const int64_t rows = w.rows, cols = w.cols;
  const bool avx = HasAvx2Fma();
  // Each task takes a range of output rows and walks every token for each row, so a weight row
  // is read from memory once per call (decode is bound by exactly that read).
  DefaultThreadPool().ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(w.dtype == DType::kF32 ? 0 : cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = WeightRow(w, r, scratch.data());
      const float b = bias ? bias[r] : 0.0f;
      int t = 0;
      if (avx) {
        float out[4];
        for (; t + 4 <= n; t += 4) {
          Dot4Avx2(wr, x + t * cols, x + (t + 1) * cols, x + (t + 2) * cols, x + (t + 3) * cols,
                   cols, out);
          for (int j = 0; j < 4; ++j) y[(t + j) * rows + r] = out[j] + b;
        }
      }
      for (; t < n; ++t) y[t * rows + r] = Dot(wr, x + t * cols, cols) + b;
    }
  });
}

void RmsNorm(const float* x, const float* weight, float* y, int n, int dim, float eps) {
  for (int t = 0; t < n; ++t) {
    const float* xr = x + static_cast<int64_t>(t) * dim;
    float* yr = y + static_cast<int64_t>(t) * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    ss /= dim;
    ss += eps;
    ss = 1.0f / std::sqrt(ss);
    for (int i = 0; i < dim; ++i) yr[i] = weight[i] * (ss * xr[i]);
  }
}

void Rope(float* x, int n, int n_heads, int head_dim, const int* positions, const float* inv_freq,
          RopeStyle style) {
  const int half = head_dim / 2;
  std::vector<float> cos_v(half), sin_v(half);
  for (int t = 0; t < n; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
        const int b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const float v0 = v[a], v1 = v[b];
        v[a] = v0 * cos_v[i] - v1 * sin_v[i];
        v[b] = v0 * sin_v[i] + v1 * cos_v[i];
      }
    }
  }
}

void WriteKv(const float* k, const float* v, const int* slots, int n, int width, float* k_cache,
             float* v_cache) {
  for (int t = 0; t < n; ++t) {
    const int64_t dst = static_cast<int64_t>(slots[t]) * width;
    std::copy(k + static_cast<int64_t>(t) * width, k + static_cast<int64_t>(t + 1) * width,
              k_cache + dst);
    std::copy(v + static_cast<int64_t>(t) * width, v + static_cast<int64_t>(t + 1) * width,
              v_cache + dst);
  }
}

void PagedAttention(const float* q, const float* k_cache, const float* v_cache,
                    const PagedAttentionArgs& a, float* out) {
  const int group = a.n_heads / a.n_kv_heads;
  const int64_t kv_width = static_cast<int64_t>(a.n_kv_heads) * a.head_dim;
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  const int64_t work = static_cast<int64_t>(a.num_tokens) * a.n_heads;
  DefaultThreadPool().ParallelFor(work, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    for (int64_t w = w0; w < w1; ++w) {
      const int t = static_cast<int>(w / a.n_heads);
      const int h = static_cast<int>(w % a.n_heads);
      const int kvh = h / group;
      const int pos = a.token_pos[t];
      const int* table =
          a.block_tables + static_cast<int64_t>(a.token_seq[t]) * a.max_blocks_per_seq;
      const float* qh = q + (static_cast<int64_t>(t) * a.n_heads + h) * a.head_dim;
      float* oh = out + (static_cast<int64_t>(t) * a.n_heads + h) * a.head_dim;
      const int first = a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
      scores.resize(pos + 1);
      float max_score = -INFINITY;
      for (int j = first; j <= pos; ++j) {
        const int64_t slot =
            static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
        const float* kj = k_cache + slot * kv_width + static_cast<int64_t>(kvh) * a.head_dim;
        scores[j] = Dot(qh, kj, a.head_dim) * inv_sqrt;
        max_score = std::max(max_score, scores[j]);
      }
      float sum = 0.0f;
      for (int j = first; j <= pos; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        sum += scores[j];
      }
      std::fill(oh, oh + a.head_dim, 0.0f);
      for (int j = first; j <= pos; ++j) {
        const int64_t slot =
            static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
        const float* vj = v_cache + slot * kv_width + static_cast<int64_t>(kvh) * a.head_dim;
        const float p = scores[j] / sum;
        for (int d = 0; d < a.head_dim; ++d) oh[d] += p * vj[d];
      }
    }
  });
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

void Embedding(const int* ids, const WeightRef& table, float* out, int n) {
  const size_t esize = DTypeSize(table.dtype);
  for (int t = 0; t < n; ++t) {
    const void* row = static_cast<const char*>(table.data) + ids[t] * table.cols * esize;
    ConvertToF32(table.dtype, row, out + static_cast<int64_t>(t) * table.cols, table.cols);
  }
}

void Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace tandem::cpu
