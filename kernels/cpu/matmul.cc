// Matmul on the CPU: y[n, rows] = x[n, cols] · wᵀ (+ bias), w [rows, cols] of f32/f16/bf16.
// This file holds the scalar and AVX2 kernels; the AVX-512 ones (avx512_kernels.inc) follow the
// same plan with 16-lane vectors.
//
// Both operands are contiguous along `cols`, so the AVX2 path works in "dot form": 8-lane
// accumulators per (weight row, token), each weight vector loaded once (converting f16/bf16 to
// float32 there) and reduced horizontally at the end. Nothing is packed: the weights are read
// straight from the mapping.
//  - Decode (n <= 3): one row at a time, all tokens, so that each thread reads its rows as one
//    sequential stream in large chunks (the hardware prefetcher follows it). Each weight is read
//    from memory once per call; the loop is bound by memory bandwidth.
//  - Prefill and batched decode (n >= 4): tiles of 3 rows × 4 tokens, 12 accumulators (12 FMAs
//    for 3 weight loads and 4 token loads; 15 of the 16 vector registers). Tokens go in blocks of
//    kTokenBlock so that a block of x stays in L2 while a chunk of weight rows goes through it,
//    and each 3-row weight tile stays in L1 across the block's tokens; the loop is bound by FMA
//    throughput.
// The last cols % 8 elements go through the same FMAs as a zero-padded vector, so that results
// do not depend on the dtype a value came from (a bf16 matrix converted to f32 at load gives
// bit-identical logits). Threads split the weight rows (chunks handed out dynamically).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile_prefetch.h"
#include "kernels/quant.h"

namespace tandem::cpu {
namespace {

constexpr int kTokenBlock = 64;  // tokens per x block: 64 × 2048 × 4 B = 512 KB at most in L2
constexpr int kTileRows = 3;     // weight rows per prefill tile
constexpr int kTileTokens = 4;   // tokens per prefill tile
constexpr int64_t kDepthBlock = 1024;  // max columns per pass of a prefill tile

// ---------------------------------------------------------------------------------------------
// Scalar path.

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

// Rows [r0, r1) of y for every token.
void MatmulRowsScalar(const float* x, const WeightRef& w, const float* bias, float* y, int n,
                      int64_t r0, int64_t r1) {
  const int64_t rows = w.rows, cols = w.cols;
  const size_t esize = DTypeSize(w.dtype);
  std::vector<float> scratch(w.dtype == DType::kF32 ? 0 : cols);
  for (int64_t r = r0; r < r1; ++r) {
    const void* src = static_cast<const char*>(w.data) + r * cols * esize;
    const float* wr = static_cast<const float*>(src);
    if (w.dtype != DType::kF32) {
      ConvertToF32(w.dtype, src, scratch.data(), cols);
      wr = scratch.data();
    }
    const float b = bias ? bias[r] : 0.0f;
    for (int t = 0; t < n; ++t) y[t * rows + r] = DotScalar(wr, x + t * cols, cols) + b;
  }
}

// ---------------------------------------------------------------------------------------------
// AVX2 path.

// y[t0 + t, r0 + r] (+)= out[r][t] (+ bias) for r < nr (rows past nr were computed on an
// alias): the first depth block stores with the bias, later ones accumulate.
template <int NR, int NT>
inline void StoreTile(const float out[NR][NT], const float* bias, bool accumulate, float* y,
                      int64_t ldy, int t0, int64_t r0, int nr) {
  for (int t = 0; t < NT; ++t) {
    float* yt = y + (t0 + t) * ldy + r0;
    for (int r = 0; r < nr; ++r) {
      yt[r] = accumulate ? yt[r] + out[r][t] : out[r][t] + (bias ? bias[r0 + r] : 0.0f);
    }
  }
}

template <DType D, int NT>
TANDEM_AVX2 void TileAt(const void* const* w, const float* x, int64_t ldx, int64_t depth,
                        const float* bias, bool accumulate, float* y, int64_t ldy, int t0,
                        int64_t r0, int nr) {
  float out[kTileRows][NT];
  simd::DotTile<D, kTileRows, NT>(w, x + t0 * ldx, ldx, depth, out);
  StoreTile<kTileRows, NT>(out, bias, accumulate, y, ldy, t0, r0, nr);
}

// Prefill: rows [r0, r1) of y for every token, in tiles of kTileRows × kTileTokens, over depth
// blocks of at most kDepthBlock so that a 3-row weight tile (3 × 1024 × 4 B = 12 KB) stays in L1
// next to the token rows streaming past it.
template <DType D>
TANDEM_AVX2 void GemmRowsAvx2(const float* x, const WeightRef& w, const float* bias, float* y,
                              int64_t ldy, int n, int64_t r0, int64_t r1) {
  constexpr int64_t kEsize = D == DType::kF32 ? 4 : 2;
  const int64_t cols = w.cols, row_bytes = cols * kEsize;
  const int64_t depth_blocks = (cols + kDepthBlock - 1) / kDepthBlock;
  const int64_t depth_step = (cols + depth_blocks - 1) / depth_blocks;
  for (int tb = 0; tb < n; tb += kTokenBlock) {
    const int te = std::min(n, tb + kTokenBlock);
    const int groups = (te - tb + kTileTokens - 1) / kTileTokens;
    for (int64_t k0 = 0; k0 < cols; k0 += depth_step) {
      const int64_t depth = std::min(depth_step, cols - k0);
      const float* xk = x + k0;
      const bool accumulate = k0 > 0;
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int nr = static_cast<int>(std::min<int64_t>(kTileRows, r1 - r));
        const void* rows[kTileRows];
        for (int i = 0; i < kTileRows; ++i) {  // rows past the end alias the last one
          rows[i] = static_cast<const char*>(w.data) + (r + std::min(i, nr - 1)) * row_bytes +
                    k0 * kEsize;
        }
        NextTile<kTileRows> next;
        next.Set(rows, r, r1, row_bytes, depth * kEsize, groups);
        int t = tb, g = 0;
        for (; t + kTileTokens <= te; t += kTileTokens, ++g) {
          next.Prefetch(g);
          TileAt<D, kTileTokens>(rows, xk, cols, depth, bias, accumulate, y, ldy, t, r, nr);
        }
        if (t < te) next.Prefetch(g);
        switch (te - t) {
          case 1:
            TileAt<D, 1>(rows, xk, cols, depth, bias, accumulate, y, ldy, t, r, nr);
            break;
          case 2:
            TileAt<D, 2>(rows, xk, cols, depth, bias, accumulate, y, ldy, t, r, nr);
            break;
          case 3:
            TileAt<D, 3>(rows, xk, cols, depth, bias, accumulate, y, ldy, t, r, nr);
            break;
          default:
            break;
        }
      }
    }
  }
}

// Decode: y[t, r] for rows [r0, r1) and NT <= 3 tokens, one row at a time (a sequential
// stream). kAcc accumulators per token hide the FMA latency (4 cycles): with one token, 2 chains
// would cap a core at 16 weights per 4 cycles, below what memory delivers for f16/bf16.
template <DType D, int NT>
TANDEM_AVX2 void GemvRowsAvx2(const float* x, const WeightRef& w, const float* bias, float* y,
                              int64_t r0, int64_t r1) {
  constexpr int kAcc = NT == 1 ? 4 : 2;
  constexpr int64_t kEsize = D == DType::kF32 ? 4 : 2;
  const int64_t cols = w.cols, ldy = w.rows;
  for (int64_t r = r0; r < r1; ++r) {
    const char* wr = static_cast<const char*>(w.data) + r * cols * kEsize;
    __m256 acc[NT][kAcc];
    for (int t = 0; t < NT; ++t) {
      for (int a = 0; a < kAcc; ++a) acc[t][a] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 8 * kAcc <= cols; k += 8 * kAcc) {
      __m256 wv[kAcc];
#pragma GCC unroll 4
      for (int a = 0; a < kAcc; ++a) wv[a] = simd::Load8<D>(wr, k + 8 * a);
#pragma GCC unroll 3
      for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 4
        for (int a = 0; a < kAcc; ++a) {
          acc[t][a] = _mm256_fmadd_ps(wv[a], _mm256_loadu_ps(x + t * cols + k + 8 * a), acc[t][a]);
        }
      }
    }
    for (; k < cols; k += 8) {  // the rest, the last vector zero-padded (see simd::DotTile)
      const int rem = static_cast<int>(std::min<int64_t>(8, cols - k));
      alignas(32) char wtail[8 * 4] = {};
      alignas(32) float xtail[8] = {};
      std::memcpy(wtail, wr + k * kEsize, rem * kEsize);
      const __m256 wv = simd::Load8<D>(wtail, 0);
      for (int t = 0; t < NT; ++t) {
        std::memcpy(xtail, x + t * cols + k, rem * sizeof(float));
        acc[t][0] = _mm256_fmadd_ps(wv, _mm256_load_ps(xtail), acc[t][0]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      __m256 sum = acc[t][0];
      for (int a = 1; a < kAcc; ++a) sum = _mm256_add_ps(sum, acc[t][a]);
      y[t * ldy + r] = simd::HorizontalSum(sum) + (bias ? bias[r] : 0.0f);
    }
  }
}

// Weight rows per chunk of the vector paths (AVX2 and AVX-512). Decode (n <= 3): about 4
// chunks per thread, long sequential streams with some balancing (at least 64 rows, 192 KB of
// f32 weights for stories110M). Prefill: 96-row chunks, each going once through every x block.
int64_t RowChunk(int n, int64_t rows, ThreadPool* pool) {
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  return n <= 3 ? std::max<int64_t>(64, rows / (4 * threads)) : 32 * kTileRows;
}

template <DType D>
void MatmulAvx2(const float* x, const WeightRef& w, const float* bias, float* y, int n,
                ThreadPool* pool) {
  const int64_t grain = RowChunk(n, w.rows, pool);
  if (n <= 3) {
    ParallelFor(pool, w.rows, grain, [&](int64_t r0, int64_t r1) {
      if (n == 1) GemvRowsAvx2<D, 1>(x, w, bias, y, r0, r1);
      if (n == 2) GemvRowsAvx2<D, 2>(x, w, bias, y, r0, r1);
      if (n == 3) GemvRowsAvx2<D, 3>(x, w, bias, y, r0, r1);
    });
  } else {
    ParallelFor(pool, w.rows, grain,
                [&](int64_t r0, int64_t r1) { GemmRowsAvx2<D>(x, w, bias, y, w.rows, n, r0, r1); });
  }
}

}  // namespace

void GemmF32Tile(const float* x, const float* w, int64_t rows, int64_t cols, const float* bias,
                 float* y, int64_t ldy, int n) {
  const WeightRef tile{DType::kF32, w, rows, cols};
  if (ActiveIsa() >= Isa::kAvx512) {
    return ActiveAvx512Kernels().matmul_rows(x, tile, bias, y, ldy, n, 0, rows);
  }
  GemmRowsAvx2<DType::kF32>(x, tile, bias, y, ldy, n, 0, rows);
}

float Dot(const float* a, const float* b, int64_t n) {
  return ActiveIsa() != Isa::kScalar ? simd::Dot(a, b, n) : DotScalar(a, b, n);
}

void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n,
            ThreadPool* pool) {
  if (n <= 0 || w.rows == 0) return;
  if (IsQuantized(w.dtype)) return QuantizedMatmul(x, w, bias, y, n, pool);
  const Isa isa = ActiveIsa();
  const bool floats = w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16;
  if (isa >= Isa::kAvx512 && floats) {
    const Avx512Kernels& k = ActiveAvx512Kernels();
    return ParallelFor(pool, w.rows, RowChunk(n, w.rows, pool), [&](int64_t r0, int64_t r1) {
      k.matmul_rows(x, w, bias, y, w.rows, n, r0, r1);
    });
  }
  if (isa != Isa::kScalar) {
    switch (w.dtype) {
      case DType::kF32:
        return MatmulAvx2<DType::kF32>(x, w, bias, y, n, pool);
      case DType::kF16:
        return MatmulAvx2<DType::kF16>(x, w, bias, y, n, pool);
      case DType::kBF16:
        return MatmulAvx2<DType::kBF16>(x, w, bias, y, n, pool);
      default:
        break;  // weights are never stored in fp8: the scalar path below
    }
  }
  ParallelFor(pool, w.rows, 16,
              [&](int64_t r0, int64_t r1) { MatmulRowsScalar(x, w, bias, y, n, r0, r1); });
}

}  // namespace tandem::cpu
