// The paged KV cache on the device: writing new tokens' K and V into their slots, and packing /
// unpacking a token range of one layer for transfer. Cache layout per layer, K and V each:
// [num_blocks, block_size, width] of the cache dtype (width = n_kv_heads * head_dim); a slot is
// block * block_size + offset. fp8 (E4M3) caches carry scales [num_blocks, 2 (K, V),
// n_kv_heads] per layer: value = stored * scale, set per sequence by its first chunk and copied
// into each of its blocks (engine/kv/kv_cache.h). CPU twins: cpu::WriteKv, SetFp8Scales,
// GatherKv / ScatterKv (kv_transfer/kv_pack.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/dtype.h"

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

int Threads(int width) { return width >= 256 ? 256 : (width + 31) / 32 * 32; }

// The CPU's own constants (kernels/dtype.h), so the twins cannot drift apart.
constexpr float kFp8Headroom = kFp8ScaleHeadroom;
constexpr float kFp8Max = kFp8E4M3Max;

// Stores x (divided by the scale for fp8) as the cache dtype: bf16 and fp8 round to nearest
// even, fp8 saturates at +-448 (as kernels/dtype.h F32ToBf16 / F32ToFp8E4M3).
template <typename T>
__device__ __forceinline__ T StoreAs(float x, float inv_scale);
template <>
__device__ __forceinline__ __nv_bfloat16 StoreAs<__nv_bfloat16>(float x, float) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 StoreAs<__nv_fp8_e4m3>(float x, float inv_scale) {
  __nv_fp8_e4m3 out;
  out.__x = __nv_cvt_float_to_fp8(x * inv_scale, __NV_SATFINITE, __NV_E4M3);
  return out;
}

// grid (n tokens, 2: K or V); the head of element i is i / head_dim.
template <typename T>
__global__ void WriteKvTypedKernel(const float* __restrict__ k,    // [n, width]
                                   const float* __restrict__ v,    // [n, width]
                                   const int* __restrict__ slots,  // [n]
                                   int n_kv_heads, int head_dim, int block_size,
                                   const float* __restrict__ scales,  // fp8: [blocks, 2, heads]
                                   T* __restrict__ k_cache, T* __restrict__ v_cache) {
  const int width = n_kv_heads * head_dim, which = blockIdx.y;
  const int slot = slots[blockIdx.x];
  const float* src = (which == 0 ? k : v) + static_cast<int64_t>(blockIdx.x) * width;
  T* dst = (which == 0 ? k_cache : v_cache) + static_cast<int64_t>(slot) * width;
  const float* s = scales != nullptr
                       ? scales + (static_cast<int64_t>(slot / block_size) * 2 + which) * n_kv_heads
                       : nullptr;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float inv = s != nullptr ? 1.0f / s[i / head_dim] : 1.0f;
    dst[i] = StoreAs<T>(src[i], inv);
  }
}

// grid (num_chunks); one thread block per chunk. A chunk at start_pos 0 sets its sequence's
// scales (per K/V and head: max(amax * headroom / 448, 1e-12) over its rows) in every block of
// its table it writes; a later chunk copies the sequence's (its first block's) into the blocks
// it starts.
__global__ void SetFp8ScalesKernel(const float* __restrict__ k,  // [tokens, width]
                                   const float* __restrict__ v,
                                   const int* __restrict__ q_indptr,   // [num_chunks + 1] rows
                                   const int* __restrict__ token_pos,  // [tokens]
                                   const int* __restrict__ tables,     // [num_chunks, stride]
                                   int table_stride, int n_kv_heads, int head_dim, int block_size,
                                   float* __restrict__ scales) {  // [blocks, 2, heads]
  __shared__ float seq[2 * 256];                                  // n_kv_heads <= 256
  __shared__ float warp_max[32];
  const int c = blockIdx.x, row0 = q_indptr[c], count = q_indptr[c + 1] - row0;
  if (count <= 0) return;
  const int start = token_pos[row0], width = n_kv_heads * head_dim, pairs = 2 * n_kv_heads;
  const int* table = tables + static_cast<int64_t>(c) * table_stride;
  if (start == 0) {
    for (int p = 0; p < pairs; ++p) {
      const float* x = (p < n_kv_heads ? k : v) + (p % n_kv_heads) * head_dim;
      float m = 0.0f;
      for (int i = threadIdx.x; i < count * head_dim; i += blockDim.x) {
        m = fmaxf(m, fabsf(x[static_cast<int64_t>(row0 + i / head_dim) * width + i % head_dim]));
      }
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
      __syncthreads();
      if (threadIdx.x == 0) {
        float amax = 0.0f;
        for (int w = 0; w < (blockDim.x + 31) / 32; ++w) amax = fmaxf(amax, warp_max[w]);
        seq[p] = fmaxf(amax * kFp8Headroom / kFp8Max, 1e-12f);
      }
      __syncthreads();
    }
  } else {
    const float* first = scales + static_cast<int64_t>(table[0]) * pairs;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) seq[p] = first[p];
    __syncthreads();
  }
  const int first_block = start == 0 ? 0 : (start + block_size - 1) / block_size;
  const int end_block = (start + count + block_size - 1) / block_size;
  for (int b = first_block; b < end_block; ++b) {
    float* dst = scales + static_cast<int64_t>(table[b]) * pairs;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) dst[p] = seq[p];
  }
}

// grid (token_count, 2: K or V): one row of row_bytes bytes, copied in Words (16 bytes where
// rows and pointers allow, else bytes). Pack: wire <- the cache slot of token start + t, else
// the reverse.
template <bool kPack, typename Word>
__global__ void PackRowsKernel(char* __restrict__ wire,  // [2, token_count, row_bytes]
                               char* __restrict__ k_cache, char* __restrict__ v_cache,
                               const int* __restrict__ block_table, int block_size, int row_bytes,
                               int token_start, int token_count) {
  const int t = blockIdx.x, which = blockIdx.y;
  const int pos = token_start + t;
  const int64_t slot =
      static_cast<int64_t>(block_table[pos / block_size]) * block_size + pos % block_size;
  Word* cache = reinterpret_cast<Word*>((which == 0 ? k_cache : v_cache) + slot * row_bytes);
  Word* w =
      reinterpret_cast<Word*>(wire + (static_cast<int64_t>(which) * token_count + t) * row_bytes);
  const int words = row_bytes / static_cast<int>(sizeof(Word));
  for (int i = threadIdx.x; i < words; i += blockDim.x) {
    if constexpr (kPack) {
      w[i] = cache[i];
    } else {
      cache[i] = w[i];
    }
  }
}

// Rows of row_bytes between the caches and the wire, the widest copies the layout allows.
template <bool kPack>
void PackRows(char* wire, char* k_cache, char* v_cache, const int* block_table, int block_size,
              int row_bytes, int token_start, int token_count, cudaStream_t stream) {
  const dim3 grid(token_count, 2);
  if (row_bytes % 16 == 0 && Aligned(wire, 16) && Aligned(k_cache, 16) && Aligned(v_cache, 16)) {
    PackRowsKernel<kPack, uint4><<<grid, Threads(row_bytes / 16), 0, stream>>>(
        wire, k_cache, v_cache, block_table, block_size, row_bytes, token_start, token_count);
  } else {
    PackRowsKernel<kPack, unsigned char><<<grid, Threads(row_bytes), 0, stream>>>(
        wire, k_cache, v_cache, block_table, block_size, row_bytes, token_start, token_count);
  }
}

// The scales of a packed fp8 chunk: pack copies the chunk's first block's [2, heads] to the
// wire's tail, unpack copies the tail into every block the chunk touches. One thread block.
template <bool kPack>
__global__ void PackScalesKernel(float* __restrict__ wire_scales,  // [2, heads]
                                 float* __restrict__ scales,       // [blocks, 2, heads]
                                 const int* __restrict__ block_table, int block_size, int pairs,
                                 int token_start, int token_count) {
  const int first = token_start / block_size;
  if constexpr (kPack) {
    const float* src = scales + static_cast<int64_t>(block_table[first]) * pairs;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) wire_scales[p] = src[p];
  } else {
    const int last = (token_start + token_count - 1) / block_size;
    for (int b = first; b <= last; ++b) {
      float* dst = scales + static_cast<int64_t>(block_table[b]) * pairs;
      for (int p = threadIdx.x; p < pairs; p += blockDim.x) dst[p] = wire_scales[p];
    }
  }
}

__global__ void F32ToBf16Kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void Bf16ToF32Kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ y,
                                int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __bfloat162float(x[i]);
}

}  // namespace

size_t KvElementBytes(int kv_dtype) {
  switch (kv_dtype) {
    case kKvF32:
      return 4;
    case kKvBf16:
      return 2;
    case kKvFp8:
      return 1;
    default:
      return 0;
  }
}

size_t KvWireBytes(int kv_dtype, int n_kv_heads, int head_dim, int token_count) {
  return 2 * static_cast<size_t>(token_count) * n_kv_heads * head_dim * KvElementBytes(kv_dtype) +
         (kv_dtype == kKvFp8 ? 2 * static_cast<size_t>(n_kv_heads) * sizeof(float) : 0);
}

int WriteKvTyped(const float* d_k, const float* d_v, const int* d_slots, int n, int n_kv_heads,
                 int head_dim, int block_size, int kv_dtype, const float* d_scales, void* d_k_cache,
                 void* d_v_cache, cudaStream_t stream) {
  if (n < 0 || n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0) {
    return BadArg("write_kv_typed", "n >= 0, n_kv_heads, head_dim and block_size > 0");
  }
  if (kv_dtype == kKvFp8 && d_scales == nullptr) {
    return BadArg("write_kv_typed", "an fp8 cache needs its scales");
  }
  if (n == 0) return 0;
  const int width = n_kv_heads * head_dim;
  if (kv_dtype == kKvF32) {
    return WriteKv(d_k, d_v, d_slots, n, width, static_cast<float*>(d_k_cache),
                   static_cast<float*>(d_v_cache), stream);
  }
  const dim3 grid(n, 2);
  if (kv_dtype == kKvBf16) {
    WriteKvTypedKernel<__nv_bfloat16><<<grid, Threads(width), 0, stream>>>(
        d_k, d_v, d_slots, n_kv_heads, head_dim, block_size, nullptr,
        static_cast<__nv_bfloat16*>(d_k_cache), static_cast<__nv_bfloat16*>(d_v_cache));
  } else if (kv_dtype == kKvFp8) {
    WriteKvTypedKernel<__nv_fp8_e4m3><<<grid, Threads(width), 0, stream>>>(
        d_k, d_v, d_slots, n_kv_heads, head_dim, block_size, d_scales,
        static_cast<__nv_fp8_e4m3*>(d_k_cache), static_cast<__nv_fp8_e4m3*>(d_v_cache));
  } else {
    return BadArg("write_kv_typed", "kv_dtype must be 0 (f32), 2 (bf16) or 3 (fp8)");
  }
  return LaunchCheck("write_kv_typed");
}

int SetFp8Scales(const float* d_k, const float* d_v, const int* d_q_indptr, const int* d_token_pos,
                 int num_chunks, const int* d_tables, int table_stride, int n_kv_heads,
                 int head_dim, int block_size, float* d_scales, cudaStream_t stream) {
  if (num_chunks < 0 || n_kv_heads <= 0 || n_kv_heads > 256 || head_dim <= 0 || block_size <= 0 ||
      table_stride <= 0) {
    return BadArg("set_fp8_scales",
                  "num_chunks >= 0, 0 < n_kv_heads <= 256, head_dim, block_size and table_stride "
                  "> 0");
  }
  if (num_chunks == 0) return 0;
  SetFp8ScalesKernel<<<num_chunks, 256, 0, stream>>>(d_k, d_v, d_q_indptr, d_token_pos, d_tables,
                                                     table_stride, n_kv_heads, head_dim, block_size,
                                                     d_scales);
  return LaunchCheck("set_fp8_scales");
}

int PackKvTyped(const void* d_k_cache, const void* d_v_cache, const float* d_scales,
                const int* d_block_table, int block_size, int n_kv_heads, int head_dim,
                int kv_dtype, int token_start, int token_count, void* d_wire, cudaStream_t stream) {
  const size_t esize = KvElementBytes(kv_dtype);
  if (block_size <= 0 || n_kv_heads <= 0 || head_dim <= 0 || token_start < 0 || token_count <= 0 ||
      esize == 0 || (kv_dtype == kKvFp8 && d_scales == nullptr)) {
    return BadArg(kv_dtype == kKvF32 ? "pack_kv" : "pack_kv_typed",
                  "block_size, n_kv_heads, head_dim, token_count > 0, token_start >= 0, a known "
                  "kv_dtype (fp8 with its scales)");
  }
  const int row_bytes = static_cast<int>(n_kv_heads * head_dim * esize);
  char* wire = static_cast<char*>(d_wire);
  PackRows<true>(wire, static_cast<char*>(const_cast<void*>(d_k_cache)),
                 static_cast<char*>(const_cast<void*>(d_v_cache)), d_block_table, block_size,
                 row_bytes, token_start, token_count, stream);
  if (kv_dtype == kKvFp8) {
    PackScalesKernel<true><<<1, 256, 0, stream>>>(
        reinterpret_cast<float*>(wire + 2 * static_cast<int64_t>(token_count) * row_bytes),
        const_cast<float*>(d_scales), d_block_table, block_size, 2 * n_kv_heads, token_start,
        token_count);
  }
  return LaunchCheck(kv_dtype == kKvF32 ? "pack_kv" : "pack_kv_typed");
}

int UnpackKvTyped(const void* d_wire, const int* d_block_table, int block_size, int n_kv_heads,
                  int head_dim, int kv_dtype, int token_start, int token_count, void* d_k_cache,
                  void* d_v_cache, float* d_scales, cudaStream_t stream) {
  const size_t esize = KvElementBytes(kv_dtype);
  if (block_size <= 0 || n_kv_heads <= 0 || head_dim <= 0 || token_start < 0 || token_count <= 0 ||
      esize == 0 || (kv_dtype == kKvFp8 && d_scales == nullptr)) {
    return BadArg(kv_dtype == kKvF32 ? "unpack_kv" : "unpack_kv_typed",
                  "block_size, n_kv_heads, head_dim, token_count > 0, token_start >= 0, a known "
                  "kv_dtype (fp8 with its scales)");
  }
  const int row_bytes = static_cast<int>(n_kv_heads * head_dim * esize);
  char* wire = static_cast<char*>(const_cast<void*>(d_wire));
  PackRows<false>(wire, static_cast<char*>(d_k_cache), static_cast<char*>(d_v_cache), d_block_table,
                  block_size, row_bytes, token_start, token_count, stream);
  if (kv_dtype == kKvFp8) {
    PackScalesKernel<false><<<1, 256, 0, stream>>>(
        reinterpret_cast<float*>(wire + 2 * static_cast<int64_t>(token_count) * row_bytes),
        d_scales, d_block_table, block_size, 2 * n_kv_heads, token_start, token_count);
  }
  return LaunchCheck(kv_dtype == kKvF32 ? "unpack_kv" : "unpack_kv_typed");
}

int F32ToBf16(const float* d_x, void* d_y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return n == 0 ? 0 : BadArg("f32_to_bf16", "n >= 0");
  F32ToBf16Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      d_x, static_cast<__nv_bfloat16*>(d_y), n);
  return LaunchCheck("f32_to_bf16");
}

int Bf16ToF32(const void* d_x, float* d_y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return n == 0 ? 0 : BadArg("bf16_to_f32", "n >= 0");
  Bf16ToF32Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(d_x), d_y, n);
  return LaunchCheck("bf16_to_f32");
}

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
  return PackKvTyped(d_k_cache, d_v_cache, nullptr, d_block_table, block_size, 1, width, kKvF32,
                     token_start, token_count, d_wire, stream);
}

int UnpackKv(const float* d_wire, const int* d_block_table, int block_size, int width,
             int token_start, int token_count, float* d_k_cache, float* d_v_cache,
             cudaStream_t stream) {
  return UnpackKvTyped(d_wire, d_block_table, block_size, 1, width, kKvF32, token_start,
                       token_count, d_k_cache, d_v_cache, nullptr, stream);
}

}  // namespace tandem::cuda
