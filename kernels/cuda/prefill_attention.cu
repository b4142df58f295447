// Causal attention for prefill (and chunked prefill after a prefix hit, start_pos > 0), reading
// K/V from the paged cache, in the flash-attention way: a thread block takes a tile of up to
// TANDEM_PREFILL_TILE_TOKENS consecutive query tokens of one chunk and one query head, walks the
// keys the tile can see in tiles of kKeys positions, and keeps per query row a running max, sum and
// output (online softmax), so memory is O(tile), not O(context²). CPU twin: cpu::PagedAttention
// (kernels/cpu/attention.cc), whose contract it follows:
//   out[t, h, :] = softmax_j(q[t, h] · k_j / sqrt(head_dim)) · v_j over positions j of the
//   token's sequence in [first, pos], first = max(0, pos - window + 1) with a sliding window;
//   kv head of query head h = h / (n_heads / n_kv_heads).
// Precondition (PlanStep guarantees it): a tile's tokens belong to one chunk and have
// consecutive positions.
#include <cuda_bf16.h>
#include <mma.h>

#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tandem::cuda {
namespace {

constexpr int kRows = TANDEM_PREFILL_TILE_TOKENS;  // query rows per block (32)
constexpr int kKeys = 32;                          // keys per inner tile
constexpr int kLanes = 8;                          // threads per query row
constexpr int kThreads = kRows * kLanes;           // 256
constexpr int kMaxHeadDim = 256;
constexpr int kMaxDimsPerLane = kMaxHeadDim / kLanes;  // 32 output dims held in registers
static_assert(kKeys % kLanes == 0);

// Dynamic shared memory: Q [kRows, hd], K [kKeys, hd + 1] (padded: lanes of a row read
// different keys at the same d), V [kKeys, hd], P [kRows, kKeys].
size_t SmemBytes(int hd) {
  return sizeof(float) * (static_cast<size_t>(kRows) * hd + static_cast<size_t>(kKeys) * (hd + 1) +
                          static_cast<size_t>(kKeys) * hd + kRows * kKeys);
}

// grid (num_tiles, n_heads), block kThreads. Thread (row = tid / kLanes, lane = tid % kLanes)
// owns query row `row` and output dims lane, lane + kLanes, ...
__global__ void __launch_bounds__(kThreads)
    PrefillAttentionKernel(const float* __restrict__ q,        // [T, n_heads, hd]
                           const float* __restrict__ k_cache,  // [slots, n_kv, hd]
                           const float* __restrict__ v_cache,  // [slots, n_kv, hd]
                           PagedAttentionDeviceArgs a,
                           const int* __restrict__ tiles,  // [num_tiles, 2]
                           float* __restrict__ out) {      // [T, n_heads, hd]
  extern __shared__ float smem[];
  const int hd = a.head_dim;
  float* sq = smem;                   // [kRows, hd]
  float* sk = sq + kRows * hd;        // [kKeys, hd + 1]
  float* sv = sk + kKeys * (hd + 1);  // [kKeys, hd]
  float* sp = sv + kKeys * hd;        // [kRows, kKeys]
  const int t0 = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
  const int h = blockIdx.y;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int row = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int p0 = a.token_pos[t0];
  const int p_last = p0 + count - 1;
  const int* table = a.block_tables + static_cast<int64_t>(a.token_seq[t0]) * a.max_blocks_per_seq;
  const int window = a.sliding_window;
  const int key_begin = window > 0 ? max(0, p0 - window + 1) : 0;

  for (int i = threadIdx.x; i < kRows * hd; i += kThreads) {
    const int r = i / hd, d = i % hd;
    sq[i] = r < count ? q[(static_cast<int64_t>(t0 + r) * a.n_heads + h) * hd + d] : 0.f;
  }
  const bool active = row < count;
  const int my_pos = p0 + row;
  const int my_first = window > 0 ? max(0, my_pos - window + 1) : 0;
  const float scale = rsqrtf(static_cast<float>(hd));
  float m = -INFINITY, l = 0.f;
  float o[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) o[i] = 0.f;

  for (int k0 = key_begin; k0 <= p_last; k0 += kKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    const int nk = min(kKeys, p_last + 1 - k0);
    for (int i = threadIdx.x; i < kKeys * hd; i += kThreads) {
      const int j = i / hd, d = i % hd;
      float kv = 0.f, vv = 0.f;
      if (j < nk) {
        const int pos = k0 + j;
        const int64_t slot =
            static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
        const int64_t at = (slot * a.n_kv_heads + kvh) * hd + d;
        kv = k_cache[at];
        vv = v_cache[at];
      }
      sk[j * (hd + 1) + d] = kv;
      sv[j * hd + d] = vv;
    }
    __syncthreads();
    // Scores of this row for keys lane, lane + kLanes, ... (kKeys / kLanes of them).
    float s[kKeys / kLanes];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kKeys / kLanes; ++c) {
      const int j = lane + c * kLanes;
      const int pos = k0 + j;
      float v = -INFINITY;
      if (active && j < nk && pos >= my_first && pos <= my_pos) {
        float acc = 0.f;
        const float* qr = sq + row * hd;
        const float* kr = sk + j * (hd + 1);
        for (int d = 0; d < hd; ++d) acc += qr[d] * kr[d];
        v = acc * scale;
      }
      s[c] = v;
      tile_max = fmaxf(tile_max, v);
    }
    // The kLanes threads of a row are consecutive lanes of one warp.
    for (int off = kLanes / 2; off > 0; off /= 2) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off, kLanes));
    }
    const float m_new = fmaxf(m, tile_max);
    float tile_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kKeys / kLanes; ++c) {
      const float p = m_new == -INFINITY ? 0.f : __expf(s[c] - m_new);  // exp(-inf) = 0
      sp[row * kKeys + lane + c * kLanes] = p;
      tile_sum += p;
    }
    for (int off = kLanes / 2; off > 0; off /= 2) {
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, off, kLanes);
    }
    const float correction = m == -INFINITY ? 0.f : __expf(m - m_new);
    l = l * correction + tile_sum;
    m = m_new;
    __syncwarp();  // the row's P values, written by its kLanes threads, are visible
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) o[i] *= correction;
    for (int j = 0; j < nk; ++j) {
      const float p = sp[row * kKeys + j];
      const float* vr = sv + j * hd;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + i * kLanes;
        if (d < hd) o[i] += p * vr[d];
      }
    }
  }
  if (!active) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* orow = out + (static_cast<int64_t>(t0 + row) * a.n_heads + h) * hd;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + i * kLanes;
    if (d < hd) orow[d] = o[i] * inv;
  }
}

// ---- The tensor-core variant (bf16 models): Q, K, V and the softmax weights P rounded to bf16,
// products accumulated in f32 (wmma 16x16x16), softmax statistics and the output in f32. A
// thread block (4 warps) takes a tile of kRows query rows of one head and walks the keys in tiles
// of kTcKeys: S = Q Kᵀ (tensor cores) -> masked online softmax (f32, 4 threads per row) -> O =
// O * correction + P V (tensor cores). Needs head_dim % 16 == 0 and sm_80 or newer.
constexpr int kTcKeys = 64;
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcLanesPerRow = kTcThreads / kRows;  // 4
constexpr int kBfPad = 8;                           // bf16 row padding (bank conflicts)
constexpr int kF32Pad = 4;

struct TcSmem {  // element offsets into the dynamic shared memory, 128-byte aligned regions
  size_t q, k, v, s, p, o, stats, total;
  int ld_bf, ld_s, ld_p, ld_o;
};
__host__ __device__ inline size_t Align128(size_t bytes) { return (bytes + 127) / 128 * 128; }
__host__ __device__ inline TcSmem TcLayout(int hd) {
  TcSmem t;
  t.ld_bf = hd + kBfPad;
  t.ld_s = kTcKeys + kF32Pad;
  t.ld_p = kTcKeys + kBfPad;
  t.ld_o = hd + kF32Pad;
  size_t at = 0;
  t.q = at, at = Align128(at + sizeof(__nv_bfloat16) * kRows * t.ld_bf);
  t.k = at, at = Align128(at + sizeof(__nv_bfloat16) * kTcKeys * t.ld_bf);
  t.v = at, at = Align128(at + sizeof(__nv_bfloat16) * kTcKeys * t.ld_bf);
  t.s = at, at = Align128(at + sizeof(float) * kRows * t.ld_s);
  t.p = at, at = Align128(at + sizeof(__nv_bfloat16) * kRows * t.ld_p);
  t.o = at, at = Align128(at + sizeof(float) * kRows * t.ld_o);
  t.stats = at, at = Align128(at + sizeof(float) * 2 * kRows);  // m, l per row
  t.total = at;
  return t;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
namespace wmma = nvcuda::wmma;

// Q -> bf16 (rows past `count` zero), O = 0, m = -inf, l = 0.
__device__ __forceinline__ void TcLoadQ(const float* __restrict__ q,
                                        const PagedAttentionDeviceArgs& a, const TcSmem& L, int t0,
                                        int count, int h, __nv_bfloat16* sq, float* so,
                                        float* row_m, float* row_l) {
  const int hd = a.head_dim;
  const int hd4 = hd / 4;
  for (int i = threadIdx.x; i < kRows * hd4; i += kTcThreads) {
    const int r = i / hd4, d = (i % hd4) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < count) {
      x = *reinterpret_cast<const float4*>(q + (static_cast<int64_t>(t0 + r) * a.n_heads + h) * hd +
                                           d);
    }
    __nv_bfloat16* dst = sq + r * L.ld_bf + d;
    dst[0] = __float2bfloat16_rn(x.x);
    dst[1] = __float2bfloat16_rn(x.y);
    dst[2] = __float2bfloat16_rn(x.z);
    dst[3] = __float2bfloat16_rn(x.w);
    float* o = so + r * L.ld_o + d;
    o[0] = o[1] = o[2] = o[3] = 0.f;
  }
  if (threadIdx.x < kRows) {
    row_m[threadIdx.x] = -INFINITY;
    row_l[threadIdx.x] = 0.f;
  }
}

// The key tile at positions [k0, k0 + nk) of kv head `kvh` from the paged cache -> bf16 K and V
// (rows past `nk` zero).
__device__ __forceinline__ void TcLoadKv(const float* __restrict__ k_cache,
                                         const float* __restrict__ v_cache,
                                         const PagedAttentionDeviceArgs& a, const TcSmem& L,
                                         const int* table, int kvh, int k0, int nk,
                                         __nv_bfloat16* sk, __nv_bfloat16* sv) {
  const int hd = a.head_dim;
  const int hd4 = hd / 4;
  for (int i = threadIdx.x; i < kTcKeys * hd4; i += kTcThreads) {
    const int j = i / hd4, d = (i % hd4) * 4;
    float4 kx = make_float4(0.f, 0.f, 0.f, 0.f), vx = kx;
    if (j < nk) {
      const int pos = k0 + j;
      const int64_t slot =
          static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
      const int64_t at = (slot * a.n_kv_heads + kvh) * hd + d;
      kx = *reinterpret_cast<const float4*>(k_cache + at);
      vx = *reinterpret_cast<const float4*>(v_cache + at);
    }
    __nv_bfloat16* kd = sk + j * L.ld_bf + d;
    __nv_bfloat16* vd = sv + j * L.ld_bf + d;
    kd[0] = __float2bfloat16_rn(kx.x);
    kd[1] = __float2bfloat16_rn(kx.y);
    kd[2] = __float2bfloat16_rn(kx.z);
    kd[3] = __float2bfloat16_rn(kx.w);
    vd[0] = __float2bfloat16_rn(vx.x);
    vd[1] = __float2bfloat16_rn(vx.y);
    vd[2] = __float2bfloat16_rn(vx.z);
    vd[3] = __float2bfloat16_rn(vx.w);
  }
}

// S[kRows, kTcKeys] = Q Kᵀ: warp w computes key columns [16 w, 16 w + 16) of both row tiles.
__device__ __forceinline__ void TcScores(const __nv_bfloat16* sq, const __nv_bfloat16* sk,
                                         float* ss, const TcSmem& L, int hd, int warp) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0, acc1;
  wmma::fill_fragment(acc0, 0.f);
  wmma::fill_fragment(acc1, 0.f);
  for (int kk = 0; kk < hd; kk += 16) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::load_matrix_sync(b, sk + (warp * 16) * L.ld_bf + kk, L.ld_bf);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a0, a1;
    wmma::load_matrix_sync(a0, sq + kk, L.ld_bf);
    wmma::load_matrix_sync(a1, sq + 16 * L.ld_bf + kk, L.ld_bf);
    wmma::mma_sync(acc0, a0, b, acc0);
    wmma::mma_sync(acc1, a1, b, acc1);
  }
  wmma::store_matrix_sync(ss + warp * 16, acc0, L.ld_s, wmma::mem_row_major);
  wmma::store_matrix_sync(ss + 16 * L.ld_s + warp * 16, acc1, L.ld_s, wmma::mem_row_major);
}

// Online softmax for row srow over columns [spart * 16, spart * 16 + 16) of the key tile at k0
// (nk keys): the masked, scaled scores -> bf16 weights P, O rescaled by the correction, and the
// row's m and l updated. Row srow sees positions [my_first, my_pos]; an inactive row (past the
// tile's tokens) sees none.
__device__ __forceinline__ void TcSoftmaxUpdate(const float* ss, __nv_bfloat16* sp, float* so,
                                                float* row_m, float* row_l, const TcSmem& L, int hd,
                                                int k0, int nk, float scale, int srow, int spart,
                                                int my_first, int my_pos, bool row_active) {
  constexpr int kColsPerLane = kTcKeys / kTcLanesPerRow;  // 16
  float sv_[kColsPerLane];
  float tile_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < kColsPerLane; ++c) {
    const int j = spart * kColsPerLane + c, pos = k0 + j;
    const bool ok = row_active && j < nk && pos >= my_first && pos <= my_pos;
    sv_[c] = ok ? ss[srow * L.ld_s + j] * scale : -INFINITY;
    tile_max = fmaxf(tile_max, sv_[c]);
  }
  for (int off = kTcLanesPerRow / 2; off > 0; off /= 2) {
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off, kTcLanesPerRow));
  }
  const float m_old = row_m[srow];
  const float m_new = fmaxf(m_old, tile_max);
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kColsPerLane; ++c) {
    const __nv_bfloat16 pb = __float2bfloat16_rn(m_new == -INFINITY ? 0.f : __expf(sv_[c] - m_new));
    sp[srow * L.ld_p + spart * kColsPerLane + c] = pb;
    sum += __bfloat162float(pb);  // the weights P V uses
  }
  for (int off = kTcLanesPerRow / 2; off > 0; off /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, off, kTcLanesPerRow);
  }
  const float corr = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
  float* orow = so + srow * L.ld_o;
  for (int d = spart; d < hd; d += kTcLanesPerRow) orow[d] *= corr;
  __syncwarp();  // every lane of the row has read row_m before it changes
  if (spart == 0) {
    row_l[srow] = row_l[srow] * corr + sum;
    row_m[srow] = m_new;
  }
}

// O[kRows, hd] += P V: warp w takes the output tiles w, w + kTcWarps, ... of the
// 2 x (hd / 16) tiles.
__device__ __forceinline__ void TcAccumulatePv(const __nv_bfloat16* sp, const __nv_bfloat16* sv,
                                               float* so, const TcSmem& L, int hd, int warp) {
  for (int f = warp; f < 2 * (hd / 16); f += kTcWarps) {
    const int rt = f % 2, ct = f / 2;
    float* o = so + rt * 16 * L.ld_o + ct * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, o, L.ld_o, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < kTcKeys; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
      wmma::load_matrix_sync(pa, sp + rt * 16 * L.ld_p + kk, L.ld_p);
      wmma::load_matrix_sync(vb, sv + kk * L.ld_bf + ct * 16, L.ld_bf);
      wmma::mma_sync(acc, pa, vb, acc);
    }
    wmma::store_matrix_sync(o, acc, L.ld_o, wmma::mem_row_major);
  }
}

// The epilogue: out = O / l for the tile's `count` rows (0 where l is 0).
__device__ __forceinline__ void TcStoreOutput(const float* so, const float* row_l,
                                              const PagedAttentionDeviceArgs& a, const TcSmem& L,
                                              int t0, int count, int h, float* __restrict__ out) {
  const int hd = a.head_dim;
  for (int i = threadIdx.x; i < count * hd; i += kTcThreads) {
    const int r = i / hd, d = i % hd;
    const float l = row_l[r];
    out[(static_cast<int64_t>(t0 + r) * a.n_heads + h) * hd + d] =
        l > 0.f ? so[r * L.ld_o + d] / l : 0.f;
  }
}
#endif  // __CUDA_ARCH__ >= 800

// grid (num_tiles, n_heads), block kTcThreads. Same contract as PrefillAttentionKernel.
__global__ void __launch_bounds__(kTcThreads)
    PrefillAttentionTcKernel(const float* __restrict__ q,        // [T, n_heads, hd]
                             const float* __restrict__ k_cache,  // [slots, n_kv, hd]
                             const float* __restrict__ v_cache,  // [slots, n_kv, hd]
                             PagedAttentionDeviceArgs a,
                             const int* __restrict__ tiles,  // [num_tiles, 2]
                             float* __restrict__ out) {      // [T, n_heads, hd]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const int hd = a.head_dim;
  const TcSmem L = TcLayout(hd);
  auto* sq = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.q);  // [kRows, ld_bf]
  auto* sk = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.k);  // [kTcKeys, ld_bf]
  auto* sv = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.v);  // [kTcKeys, ld_bf]
  auto* ss = reinterpret_cast<float*>(tc_smem + L.s);          // [kRows, ld_s]
  auto* sp = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.p);  // [kRows, ld_p]
  auto* so = reinterpret_cast<float*>(tc_smem + L.o);          // [kRows, ld_o]
  auto* row_m = reinterpret_cast<float*>(tc_smem + L.stats);   // [kRows]
  float* row_l = row_m + kRows;                                // [kRows]

  const int t0 = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
  const int h = blockIdx.y;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int warp = threadIdx.x / 32;
  const int p0 = a.token_pos[t0];
  const int p_last = p0 + count - 1;
  const int* table = a.block_tables + static_cast<int64_t>(a.token_seq[t0]) * a.max_blocks_per_seq;
  const int window = a.sliding_window;
  const int key_begin = window > 0 ? max(0, p0 - window + 1) : 0;

  TcLoadQ(q, a, L, t0, count, h, sq, so, row_m, row_l);
  const float scale = rsqrtf(static_cast<float>(hd));
  // The softmax thread layout: kTcLanesPerRow consecutive threads per query row.
  const int srow = threadIdx.x / kTcLanesPerRow, spart = threadIdx.x % kTcLanesPerRow;
  const int my_pos = p0 + srow;
  const int my_first = window > 0 ? max(0, my_pos - window + 1) : 0;
  const bool row_active = srow < count;

  for (int k0 = key_begin; k0 <= p_last; k0 += kTcKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    const int nk = min(kTcKeys, p_last + 1 - k0);
    TcLoadKv(k_cache, v_cache, a, L, table, kvh, k0, nk, sk, sv);
    __syncthreads();
    TcScores(sq, sk, ss, L, hd, warp);
    __syncthreads();
    TcSoftmaxUpdate(ss, sp, so, row_m, row_l, L, hd, k0, nk, scale, srow, spart, my_first, my_pos,
                    row_active);
    __syncthreads();
    TcAccumulatePv(sp, sv, so, L, hd, warp);
  }
  __syncthreads();
  TcStoreOutput(so, row_l, a, L, t0, count, h, out);
#endif
}

}  // namespace

int PrefillAttention(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                     const PagedAttentionDeviceArgs& a, const int* d_tiles, int num_tiles,
                     bool bf16, float* d_out, cudaStream_t stream) {
  if (num_tiles < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.head_dim <= 0 ||
      a.block_size <= 0 || a.max_blocks_per_seq <= 0) {
    return BadArg("prefill_attention", "sizes must be positive (num_tiles >= 0)");
  }
  if (a.n_heads % a.n_kv_heads != 0) {
    return BadArg("prefill_attention", "n_heads must be a multiple of n_kv_heads");
  }
  if (a.head_dim > kMaxHeadDim) return BadArg("prefill_attention", "head_dim must be <= 256");
  if (a.n_heads > 65535) return BadArg("prefill_attention", "n_heads must be <= 65535");
  if (num_tiles == 0) return 0;
  if (bf16 && a.head_dim % 16 != 0) {
    return BadArg("prefill_attention", "the bf16 (tensor-core) variant needs head_dim % 16 == 0");
  }
  const size_t smem = bf16 ? TcLayout(a.head_dim).total : SmemBytes(a.head_dim);
  const void* kernel = bf16 ? reinterpret_cast<const void*>(PrefillAttentionTcKernel)
                            : reinterpret_cast<const void*>(PrefillAttentionKernel);
  if (smem > 48 * 1024) {
    // Above the default 48 KiB a kernel must opt in (sm_80: up to 163 KiB, sm_90: 227 KiB).
    int device = 0, limit = 0;
    if (int e = Check(cudaGetDevice(&device), "prefill_attention cudaGetDevice")) return e;
    if (int e =
            Check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                  "prefill_attention cudaDeviceGetAttribute")) {
      return e;
    }
    if (smem > static_cast<size_t>(limit)) {
      return BadArg("prefill_attention", "head_dim needs more shared memory than the device has");
    }
    if (int e = Check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)),
                      "prefill_attention cudaFuncSetAttribute")) {
      return e;
    }
  }
  if (bf16) {
    PrefillAttentionTcKernel<<<dim3(num_tiles, a.n_heads), kTcThreads, smem, stream>>>(
        d_q, d_k_cache, d_v_cache, a, d_tiles, d_out);
  } else {
    PrefillAttentionKernel<<<dim3(num_tiles, a.n_heads), kThreads, smem, stream>>>(
        d_q, d_k_cache, d_v_cache, a, d_tiles, d_out);
  }
  return LaunchCheck("prefill_attention");
}

}  // namespace tandem::cuda
