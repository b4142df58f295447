// Embedding gather: out[n, cols] = rows ids[n] of table[rows, cols] (f32, f16 or bf16), as
// float32. CPU twin: cpu::Embedding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tandem::cuda {
namespace {

template <typename T>
__device__ float ToF32(T v);
template <>
__device__ float ToF32<float>(float v) {
  return v;
}
template <>
__device__ float ToF32<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ float ToF32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// grid n tokens, block 256 threads striding over cols. An id outside [0, rows) writes zeros
// and sets *bad (the launcher checks ids on the host only in debug use).
template <typename T>
__global__ void EmbeddingKernel(const int* __restrict__ ids, const T* __restrict__ table,
                                float* __restrict__ out, int64_t rows, int64_t cols, int* bad) {
  const int id = ids[blockIdx.x];
  float* o = out + static_cast<int64_t>(blockIdx.x) * cols;
  if (id < 0 || id >= rows) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = 0.f;
    if (threadIdx.x == 0) atomicExch(bad, 1);
    return;
  }
  const T* row = table + id * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = ToF32<T>(row[c]);
}

}  // namespace

int Embedding(const int* d_ids, int dtype, const void* d_table, int64_t rows, int64_t cols,
              float* d_out, int n, int* d_bad, cudaStream_t stream) {
  if (n < 0 || rows <= 0 || cols <= 0) return BadArg("embedding", "n >= 0, rows and cols > 0");
  if (d_bad == nullptr) return BadArg("embedding", "d_bad must point to one device int");
  if (n == 0) return 0;
  switch (dtype) {
    case 0:
      EmbeddingKernel<<<n, 256, 0, stream>>>(d_ids, static_cast<const float*>(d_table), d_out, rows,
                                             cols, d_bad);
      break;
    case 1:
      EmbeddingKernel<<<n, 256, 0, stream>>>(d_ids, static_cast<const __half*>(d_table), d_out,
                                             rows, cols, d_bad);
      break;
    case 2:
      EmbeddingKernel<<<n, 256, 0, stream>>>(d_ids, static_cast<const __nv_bfloat16*>(d_table),
                                             d_out, rows, cols, d_bad);
      break;
    default:
      return BadArg("embedding", "dtype must be 0 (f32), 1 (f16) or 2 (bf16)");
  }
  return LaunchCheck("embedding");
}

}  // namespace tandem::cuda
