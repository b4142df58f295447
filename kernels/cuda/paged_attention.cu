// Paged attention for decode: one query token per row (many sequences, GQA), the context split
// into partitions of kPartition positions processed by separate thread blocks, then a reduce
// that merges the partitions' (max, sum, output) in the log-sum-exp way. CPU twin:
// cpu::PagedAttention (kernels/cpu/attention.cc), whose contract it follows:
//   out[t, h, :] = softmax_j(q[t, h] · k_j / sqrt(head_dim)) · v_j over positions j of the
//   token's sequence in [first, pos], first = max(0, pos - window + 1) with a sliding window;
//   kv head of query head h = h / (n_heads / n_kv_heads).
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tandem::cuda {
namespace {

constexpr int kPartition = 256;  // positions per thread block
constexpr int kThreads = 128;    // 4 warps
constexpr int kMaxHeadDim = 256;

// grid (num_tokens, n_heads, max_partitions). Writes for its partition: m (max score),
// l (sum of exp(score - m)) and acc[head_dim] = sum exp(score - m) * v; an empty partition
// writes m = -inf, l = 0.
__global__ void PartitionKernel(const float* __restrict__ q,        // [T, n_heads, head_dim]
                                const float* __restrict__ k_cache,  // [slots, n_kv, head_dim]
                                const float* __restrict__ v_cache,  // [slots, n_kv, head_dim]
                                PagedAttentionDeviceArgs a,
                                float* __restrict__ part_m,    // [T, n_heads, P]
                                float* __restrict__ part_l,    // [T, n_heads, P]
                                float* __restrict__ part_acc,  // [T, n_heads, P, head_dim]
                                int max_partitions) {
  const int t = blockIdx.x, h = blockIdx.y, p = blockIdx.z;
  const int hd = a.head_dim;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int pos = a.token_pos[t];
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int begin = first + p * kPartition;
  const int end = min(pos + 1, begin + kPartition);
  const int64_t pidx = (static_cast<int64_t>(t) * a.n_heads + h) * max_partitions + p;
  float* acc_out = part_acc + pidx * hd;
  if (begin >= end) {
    if (threadIdx.x == 0) {
      part_m[pidx] = -INFINITY;
      part_l[pidx] = 0.f;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) acc_out[d] = 0.f;
    return;
  }
  __shared__ float sq[kMaxHeadDim];
  __shared__ float scores[kPartition];
  __shared__ float red[32];
  const float* qv = q + (static_cast<int64_t>(t) * a.n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) sq[d] = qv[d];
  __syncthreads();
  const int* table = a.block_tables + static_cast<int64_t>(a.token_seq[t]) * a.max_blocks_per_seq;
  const float scale = rsqrtf(static_cast<float>(hd));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  // One warp per position: lanes split head_dim, then a warp reduction.
  for (int j = begin + warp; j < end; j += warps) {
    const int64_t slot =
        static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    const float* kv = k_cache + (slot * a.n_kv_heads + kvh) * hd;
    float s = 0.f;
    for (int d = lane; d < hd; d += 32) s += sq[d] * kv[d];
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) scores[j - begin] = s * scale;
  }
  __syncthreads();
  const int n = end - begin;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, scores[i]);
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float l = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = __expf(scores[i] - m);
    scores[i] = e;
    l += e;
  }
  for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < warps; ++w) total += red[w];
    part_m[pidx] = m;
    part_l[pidx] = total;
  }
  // Each thread owns output dims d, d + blockDim, ...
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.f;
    for (int j = begin; j < end; ++j) {
      const int64_t slot =
          static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
      acc += scores[j - begin] * v_cache[(slot * a.n_kv_heads + kvh) * hd + d];
    }
    acc_out[d] = acc;
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

int Partitions(int max_context) { return (max_context + kPartition - 1) / kPartition; }

}  // namespace

size_t PagedAttentionWorkspaceBytes(int num_tokens, int n_heads, int head_dim, int max_context) {
  const size_t rows = static_cast<size_t>(num_tokens) * n_heads * Partitions(max_context);
  return rows * (2 + static_cast<size_t>(head_dim)) * sizeof(float);
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
  const int parts = Partitions(max_context);
  const size_t rows = static_cast<size_t>(a.num_tokens) * a.n_heads * parts;
  float* m = static_cast<float*>(d_workspace);
  float* l = m + rows;
  float* acc = l + rows;
  PartitionKernel<<<dim3(a.num_tokens, a.n_heads, parts), kThreads, 0, stream>>>(
      d_q, d_k_cache, d_v_cache, a, m, l, acc, parts);
  if (int e = LaunchCheck("paged_attention partitions")) return e;
  ReduceKernel<<<dim3(a.num_tokens, a.n_heads), (a.head_dim + 31) / 32 * 32, 0, stream>>>(
      m, l, acc, parts, a.n_heads, a.head_dim, d_out);
  return LaunchCheck("paged_attention reduce");
}

}  // namespace tandem::cuda
