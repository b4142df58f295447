// Causal attention for prefill (and chunked prefill after a prefix hit, start_pos > 0), reading
// K/V from the paged cache, in the flash-attention way: a thread block takes a tile of up to
// kPrefillTileTokens consecutive query tokens of one chunk and one query head, walks the keys
// the tile can see in tiles of kKeys positions, and keeps per query row a running max, sum and
// output (online softmax), so memory is O(tile), not O(context²). CPU twin: cpu::PagedAttention
// (kernels/cpu/attention.cc), whose contract it follows:
//   out[t, h, :] = softmax_j(q[t, h] · k_j / sqrt(head_dim)) · v_j over positions j of the
//   token's sequence in [first, pos], first = max(0, pos - window + 1) with a sliding window;
//   kv head of query head h = h / (n_heads / n_kv_heads).
// Precondition (PlanStep guarantees it): a tile's tokens belong to one chunk and have
// consecutive positions.
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/step_plan.h"

namespace tandem::cuda {
namespace {

constexpr int kRows = kPrefillTileTokens;  // query rows per block (32)
constexpr int kKeys = 32;                  // keys per inner tile
constexpr int kLanes = 8;                  // threads per query row
constexpr int kThreads = kRows * kLanes;   // 256
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

}  // namespace

int PrefillAttention(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                     const PagedAttentionDeviceArgs& a, const int* d_tiles, int num_tiles,
                     float* d_out, cudaStream_t stream) {
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
  const size_t smem = SmemBytes(a.head_dim);
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
    if (int e = Check(cudaFuncSetAttribute(PrefillAttentionKernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)),
                      "prefill_attention cudaFuncSetAttribute")) {
      return e;
    }
  }
  PrefillAttentionKernel<<<dim3(num_tiles, a.n_heads), kThreads, smem, stream>>>(
      d_q, d_k_cache, d_v_cache, a, d_tiles, d_out);
  return LaunchCheck("prefill_attention");
}

}  // namespace tandem::cuda
