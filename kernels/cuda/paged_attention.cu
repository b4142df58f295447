// Paged attention for decode: one query token per row (many sequences, GQA), the context split
// into partitions of up to kPartition positions processed by separate thread blocks (each for the
// query heads that share a KV head, so K and V are read once per group), then a reduce that
// merges the partitions' (max, sum, output) in the log-sum-exp way. CPU twin:
// cpu::PagedAttention (kernels/cpu/attention.cc), whose contract it follows:
//   out[t, h, :] = softmax_j(q[t, h] · k_j / sqrt(head_dim)) · v_j over positions j of the
//   token's sequence in [first, pos], first = max(0, pos - window + 1) with a sliding window;
//   kv head of query head h = h / (n_heads / n_kv_heads).
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tandem::cuda {
namespace {

constexpr int kPartition = 256;  // the largest partition (positions per thread block)
constexpr int kThreads = 256;    // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxGroup = 8;  // query heads of one KV head handled by one thread block
constexpr int kUnroll = 4;    // positions per warp in flight (their loads issued together)

// Query heads [h0, h0 + count) of the head chunk `chunk` (blockIdx.y): the query heads of one
// KV head, at most kMaxGroup per chunk, so that K and V are read once per group (GQA), not once
// per query head.
struct HeadChunk {
  int kvh, h0, count;
};
__device__ inline HeadChunk ChunkOf(int chunk, int group) {
  const int per_kv = (group + kMaxGroup - 1) / kMaxGroup;
  HeadChunk c;
  c.kvh = chunk / per_kv;
  const int first = (chunk % per_kv) * kMaxGroup;
  c.h0 = c.kvh * group + first;
  c.count = min(kMaxGroup, group - first);
  return c;
}

// grid (num_tokens, head chunks, max_partitions), block kThreads. Writes, per query head of its
// chunk, for its partition: m (max score), l (sum of exp(score - m)) and acc[head_dim] =
// sum exp(score - m) * v; an empty partition writes m = -inf, l = 0. Decode attention is
// memory-latency bound at small batches: each warp takes kUnroll positions at a time (8 warps:
// 32 K or V rows in flight per block), its lanes holding dims lane, lane + 32, ... of a row.
// kDimsPerLane = ceil(head_dim / 32) rounded up to 2, 4 or 8: registers sized to the head
// (head_dim 128 needs half of 256's, so twice the blocks fit on a multiprocessor).
template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads)
    PartitionKernel(const float* __restrict__ q,        // [T, n_heads, head_dim]
                    const float* __restrict__ k_cache,  // [slots, n_kv, head_dim]
                    const float* __restrict__ v_cache,  // [slots, n_kv, head_dim]
                    PagedAttentionDeviceArgs a,
                    float* __restrict__ part_m,    // [T, n_heads, P]
                    float* __restrict__ part_l,    // [T, n_heads, P]
                    float* __restrict__ part_acc,  // [T, n_heads, P, head_dim]
                    int max_partitions, int partition) {
  const int t = blockIdx.x, p = blockIdx.z;
  const int hd = a.head_dim;
  const HeadChunk hc = ChunkOf(blockIdx.y, a.n_heads / a.n_kv_heads);
  const int pos = a.token_pos[t];
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int begin = first + p * partition;
  const int end = min(pos + 1, begin + partition);
  auto pidx = [&](int g) {
    return (static_cast<int64_t>(t) * a.n_heads + hc.h0 + g) * max_partitions + p;
  };
  if (begin >= end) {
    for (int i = threadIdx.x; i < hc.count * hd; i += blockDim.x) {
      const int g = i / hd, d = i % hd;
      if (d == 0) {
        part_m[pidx(g)] = -INFINITY;
        part_l[pidx(g)] = 0.f;
      }
      part_acc[pidx(g) * hd + d] = 0.f;
    }
    return;
  }
  __shared__ float sq[kMaxGroup][kMaxHeadDim];
  __shared__ float scores[kMaxGroup][kPartition];
  __shared__ float sacc[kMaxGroup][kMaxHeadDim];
  for (int i = threadIdx.x; i < hc.count * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    sq[g][d] = q[(static_cast<int64_t>(t) * a.n_heads + hc.h0 + g) * hd + d];
    sacc[g][d] = 0.f;
  }
  __syncthreads();
  const int* table = a.block_tables + static_cast<int64_t>(a.token_seq[t]) * a.max_blocks_per_seq;
  const float scale = rsqrtf(static_cast<float>(hd));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = end - begin;
  // Rows [slot * n_kv + kvh] of the caches for positions j0 .. j0 + kUnroll - 1 (-1: past end).
  auto rows_at = [&](int j0, int64_t* row) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u;
      row[u] = -1;
      if (j < end) {
        const int64_t slot =
            static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
        row[u] = slot * a.n_kv_heads + hc.kvh;
      }
    }
  };
  // Scores: a warp's lanes hold kUnroll K rows in registers and take their dot products with
  // every query head of the chunk.
  for (int j0 = begin + warp * kUnroll; j0 < end; j0 += kWarps * kUnroll) {
    int64_t row[kUnroll];
    rows_at(j0, row);
    float kr[kUnroll][kDimsPerLane];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        kr[u][i] = row[u] >= 0 && d < hd ? k_cache[row[u] * hd + d] : 0.f;
      }
    }
    for (int g = 0; g < hc.count; ++g) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) s += sq[g][d] * kr[u][i];
        }
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0 && row[u] >= 0) scores[g][j0 + u - begin] = s * scale;
      }
    }
  }
  __syncthreads();
  // Softmax statistics: one warp per query head.
  for (int g = warp; g < hc.count; g += kWarps) {
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, scores[g][i]);
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float e = __expf(scores[g][i] - m);
      scores[g][i] = e;
      l += e;
    }
    for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
      part_m[pidx(g)] = m;
      part_l[pidx(g)] = l;
    }
  }
  __syncthreads();
  // Output: the same split of positions over warps; each V row is read once for the whole
  // group, the warps' partial sums meet in shared memory.
  float acc[kMaxGroup][kDimsPerLane];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] = 0.f;
  }
  for (int j0 = begin + warp * kUnroll; j0 < end; j0 += kWarps * kUnroll) {
    int64_t row[kUnroll];
    rows_at(j0, row);
    float vr[kUnroll][kDimsPerLane];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        vr[u][i] = row[u] >= 0 && d < hd ? v_cache[row[u] * hd + d] : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (row[u] < 0) continue;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= hc.count) break;
        const float w = scores[g][j0 + u - begin];
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] += w * vr[u][i];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= hc.count) break;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) atomicAdd(&sacc[g][d], acc[g][i]);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < hc.count * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    part_acc[pidx(g) * hd + d] = sacc[g][d];
  }
}

// grid (num_tokens, n_heads), block head_dim threads (rounded to a warp): merges partitions.
__global__ void ReduceKernel(const float* __restrict__ part_m, const float* __restrict__ part_l,
                             const float* __restrict__ part_acc, int max_partitions, int n_heads,
                             int head_dim, float* __restrict__ out) {
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  if (d >= head_dim) return;
  const int64_t base = (static_cast<int64_t>(t) * n_heads + h) * max_partitions;
  float m = -INFINITY;
  for (int p = 0; p < max_partitions; ++p) m = fmaxf(m, part_m[base + p]);
  float l = 0.f, acc = 0.f;
  for (int p = 0; p < max_partitions; ++p) {
    const float pm = part_m[base + p];
    if (pm == -INFINITY) continue;
    const float w = __expf(pm - m);
    l += w * part_l[base + p];
    acc += w * part_acc[(base + p) * head_dim + d];
  }
  out[(static_cast<int64_t>(t) * n_heads + h) * head_dim + d] = l > 0.f ? acc / l : 0.f;
}

// Partition size: small batches have too few (token, KV head) pairs to fill the GPU, so their
// contexts are cut finer (down to 32 positions: more thread blocks, shorter serial loops) until
// there are kTargetBlocks thread blocks, as long as the partials stay under kMaxPartialRows
// rows (a few tens of MB) and fit the workspace; otherwise kPartition. Finer than needed costs
// (more partials written and merged: at batch 64 on an H200, 32 positions took 342 us a layer,
// 256 took 213). The same inputs always give the same size (graph capture).
// The workspace asked for (PagedAttentionWorkspaceBytes) grows with tokens and context, so one
// sized for the largest step serves every smaller one.
constexpr size_t kMaxPartialRows = size_t{1} << 16;
constexpr int64_t kTargetBlocks = 528;  // 4 per multiprocessor of an H100 / H200
size_t PartialRows(int num_tokens, int n_heads, int max_context, int partition) {
  return static_cast<size_t>(num_tokens) * n_heads * ((max_context + partition - 1) / partition);
}
size_t PartialBytes(size_t rows, int head_dim) {
  return rows * (2 + static_cast<size_t>(head_dim)) * sizeof(float);
}
int PartitionSize(int num_tokens, int n_heads, int head_chunks, int head_dim, int max_context,
                  size_t workspace_bytes) {
  int best = kPartition;
  for (int size = kPartition / 2; size >= 32; size /= 2) {
    const int64_t blocks = static_cast<int64_t>(num_tokens) * head_chunks *
                           ((max_context + 2 * size - 1) / (2 * size));
    if (blocks >= kTargetBlocks) break;  // the coarser size already fills the GPU
    const size_t rows = PartialRows(num_tokens, n_heads, max_context, size);
    if (rows > kMaxPartialRows || PartialBytes(rows, head_dim) > workspace_bytes) break;
    best = size;
  }
  return best;
}

}  // namespace

size_t PagedAttentionWorkspaceBytes(int num_tokens, int n_heads, int head_dim, int max_context) {
  // What the largest partition needs, or the finest one's need up to kMaxPartialRows rows.
  const size_t at_largest =
      PartialBytes(PartialRows(num_tokens, n_heads, max_context, kPartition), head_dim);
  const size_t finest = PartialBytes(PartialRows(num_tokens, n_heads, max_context, 32), head_dim);
  return std::max(at_largest, std::min(finest, PartialBytes(kMaxPartialRows, head_dim)));
}

int PagedAttentionDecode(const float* d_q, const float* d_k_cache, const float* d_v_cache,
                         const PagedAttentionDeviceArgs& a, int max_context, void* d_workspace,
                         size_t workspace_bytes, float* d_out, cudaStream_t stream) {
  if (a.num_tokens < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.head_dim <= 0 ||
      a.block_size <= 0 || a.max_blocks_per_seq <= 0 || max_context <= 0) {
    return BadArg("paged_attention", "sizes must be positive (num_tokens >= 0)");
  }
  if (a.n_heads % a.n_kv_heads != 0) {
    return BadArg("paged_attention", "n_heads must be a multiple of n_kv_heads");
  }
  if (a.head_dim > kMaxHeadDim) return BadArg("paged_attention", "head_dim must be <= 256");
  if (max_context > a.max_blocks_per_seq * a.block_size) {
    return BadArg("paged_attention", "max_context exceeds max_blocks_per_seq * block_size");
  }
  if (workspace_bytes <
      PagedAttentionWorkspaceBytes(a.num_tokens, a.n_heads, a.head_dim, max_context)) {
    return BadArg("paged_attention", "workspace too small (paged_attention_workspace_bytes)");
  }
  if (!Aligned(d_workspace, 16)) return BadArg("paged_attention", "workspace not 16-byte aligned");
  if (a.num_tokens == 0) return 0;
  const int group = a.n_heads / a.n_kv_heads;
  const int chunks = a.n_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup);
  const int partition =
      PartitionSize(a.num_tokens, a.n_heads, chunks, a.head_dim, max_context, workspace_bytes);
  const int parts = (max_context + partition - 1) / partition;
  const size_t rows = PartialRows(a.num_tokens, a.n_heads, max_context, partition);
  float* m = static_cast<float*>(d_workspace);
  float* l = m + rows;
  float* acc = l + rows;
  const dim3 grid(a.num_tokens, chunks, parts);
  if (a.head_dim <= 64) {
    PartitionKernel<2>
        <<<grid, kThreads, 0, stream>>>(d_q, d_k_cache, d_v_cache, a, m, l, acc, parts, partition);
  } else if (a.head_dim <= 128) {
    PartitionKernel<4>
        <<<grid, kThreads, 0, stream>>>(d_q, d_k_cache, d_v_cache, a, m, l, acc, parts, partition);
  } else {
    PartitionKernel<8>
        <<<grid, kThreads, 0, stream>>>(d_q, d_k_cache, d_v_cache, a, m, l, acc, parts, partition);
  }
  if (int e = LaunchCheck("paged_attention partitions")) return e;
  ReduceKernel<<<dim3(a.num_tokens, a.n_heads), (a.head_dim + 31) / 32 * 32, 0, stream>>>(
      m, l, acc, parts, a.n_heads, a.head_dim, d_out);
  return LaunchCheck("paged_attention reduce");
}

}  // namespace tandem::cuda
