// The paged KV cache on the device: writing new tokens' K and V into their slots, and packing /
// unpacking a token range of one layer for transfer. Cache layout per layer, K and V each:
// [num_blocks, block_size, width] float32 (width = n_kv_heads * head_dim); a slot is
// block * block_size + offset. CPU twins: cpu::WriteKv, GatherKv / ScatterKv
// (kv_transfer/kv_pack.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tandem::cuda {
namespace {

// grid n tokens; float4 copies when width % 4 == 0 and the pointers are 16-byte aligned.
template <bool kVec>
__global__ void WriteKvKernel(const float* __restrict__ k,    // [n, width]
                              const float* __restrict__ v,    // [n, width]
                              const int* __restrict__ slots,  // [n]
                              int width, float* __restrict__ k_cache, float* __restrict__ v_cache) {
  const int64_t src = static_cast<int64_t>(blockIdx.x) * width;
  const int64_t dst = static_cast<int64_t>(slots[blockIdx.x]) * width;
  if constexpr (kVec) {
    for (int i = threadIdx.x; i < width / 4; i += blockDim.x) {
      reinterpret_cast<float4*>(k_cache + dst)[i] = reinterpret_cast<const float4*>(k + src)[i];
      reinterpret_cast<float4*>(v_cache + dst)[i] = reinterpret_cast<const float4*>(v + src)[i];
    }
  } else {
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
      k_cache[dst + i] = k[src + i];
      v_cache[dst + i] = v[src + i];
    }
  }
}

// grid (token_count, 2: K or V). Pack: wire[kv][t][width] <- cache slot of token start + t.
template <bool kPack>
__global__ void PackKernel(float* __restrict__ wire,  // [2, token_count, width]
                           float* __restrict__ k_cache, float* __restrict__ v_cache,
                           const int* __restrict__ block_table, int block_size, int width,
                           int token_start, int token_count) {
  const int t = blockIdx.x, which = blockIdx.y;
  const int pos = token_start + t;
  const int64_t slot =
      static_cast<int64_t>(block_table[pos / block_size]) * block_size + pos % block_size;
  float* cache = (which == 0 ? k_cache : v_cache) + slot * width;
  float* w = wire + (static_cast<int64_t>(which) * token_count + t) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    if constexpr (kPack) {
      w[i] = cache[i];
    } else {
      cache[i] = w[i];
    }
  }
}

int Threads(int width) { return width >= 256 ? 256 : (width + 31) / 32 * 32; }

}  // namespace

int WriteKv(const float* d_k, const float* d_v, const int* d_slots, int n, int width,
            float* d_k_cache, float* d_v_cache, cudaStream_t stream) {
  if (n < 0 || width <= 0) return BadArg("write_kv", "n >= 0 and width > 0");
  if (n == 0) return 0;
  const bool vec = width % 4 == 0 && Aligned(d_k, 16) && Aligned(d_v, 16) &&
                   Aligned(d_k_cache, 16) && Aligned(d_v_cache, 16);
  if (vec) {
    WriteKvKernel<true>
        <<<n, Threads(width / 4), 0, stream>>>(d_k, d_v, d_slots, width, d_k_cache, d_v_cache);
  } else {
    WriteKvKernel<false>
        <<<n, Threads(width), 0, stream>>>(d_k, d_v, d_slots, width, d_k_cache, d_v_cache);
  }
  return LaunchCheck("write_kv");
}

int PackKv(const float* d_k_cache, const float* d_v_cache, const int* d_block_table, int block_size,
           int width, int token_start, int token_count, float* d_wire, cudaStream_t stream) {
  if (block_size <= 0 || width <= 0 || token_start < 0 || token_count <= 0) {
    return BadArg("pack_kv", "block_size, width, token_count > 0 and token_start >= 0");
  }
  PackKernel<true><<<dim3(token_count, 2), Threads(width), 0, stream>>>(
      d_wire, const_cast<float*>(d_k_cache), const_cast<float*>(d_v_cache), d_block_table,
      block_size, width, token_start, token_count);
  return LaunchCheck("pack_kv");
}

int UnpackKv(const float* d_wire, const int* d_block_table, int block_size, int width,
             int token_start, int token_count, float* d_k_cache, float* d_v_cache,
             cudaStream_t stream) {
  if (block_size <= 0 || width <= 0 || token_start < 0 || token_count <= 0) {
    return BadArg("unpack_kv", "block_size, width, token_count > 0 and token_start >= 0");
  }
  PackKernel<false><<<dim3(token_count, 2), Threads(width), 0, stream>>>(
      const_cast<float*>(d_wire), d_k_cache, d_v_cache, d_block_table, block_size, width,
      token_start, token_count);
  return LaunchCheck("unpack_kv");
}

}  // namespace tandem::cuda
