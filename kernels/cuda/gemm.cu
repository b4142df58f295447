// Matrix products through cuBLAS, plus the small kernels around them (bias, bf16 rounding of the
// input, gathering the rows that need logits, random weights for benchmarks). CPU twin of Gemm:
// cpu::Matmul (kernels/cpu/matmul.cc).
//
// Row-major y[n, rows] = x[n, cols] · Wᵀ with W row-major [rows, cols] is, in cuBLAS's
// column-major terms, yᵀ[rows, n] = op_T(W as [cols, rows]) · xᵀ[cols, n]: one GemmEx with
// transa = T, lda = cols, ldb = cols, ldc = rows.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace tandem::cuda {
namespace {

int CublasCheck(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char why[96];
  std::snprintf(why, sizeof(why), "cuBLAS status %d (%s)", static_cast<int>(s),
                cublasGetStatusString(s));
  BadArg(what, why);
  return 1000 + static_cast<int>(s);  // outside cudaError_t's range in practice
}

__global__ void ToBf16Kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y,
                             int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// grid (n), block 256: y[r, :] += bias.
__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, int rows) {
  float* yr = y + static_cast<int64_t>(blockIdx.x) * rows;
  for (int i = threadIdx.x; i < rows; i += blockDim.x) yr[i] += bias[i];
}

__global__ void GatherRowsKernel(const float* __restrict__ src, const int* __restrict__ idx,
                                 int cols, float* __restrict__ dst) {
  const float* s = src + static_cast<int64_t>(idx[blockIdx.x]) * cols;
  float* d = dst + static_cast<int64_t>(blockIdx.x) * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
}

// Decode-sized products with bf16 weights (n <= kGemvMaxN): cuBLAS's kernels for such shapes
// read the weights well below the memory's speed (a 4096 x 4096 matrix at about 1 TB/s on an
// H200), so a GEMV of our own streams them instead: one warp per weight row, each lane loading
// 8 bf16 (16 bytes) at a time and multiplying them with the n inputs, kept in f32 (as the CPU
// twin does). block 256 (8 warps, a row each, or `split` warps a row). Needs cols % 8 == 0 and
// 16-byte aligned x and w. Each lane reads 32 n bytes of x (from L1) per 16 bytes of weights,
// so the L1 caps it as n grows: on an H200 a Llama-3-8B decode step took 5.8 ms at n = 1
// (cuBLAS 6.2) but 19.9 ms at n = 8 (cuBLAS 7.4); n <= 2 keeps x's reads at 4x the weights'.
constexpr int kGemvMaxN = 2;
template <int N>
__global__ void __launch_bounds__(256)
    GemvBf16Kernel(const float* __restrict__ x,          // [N, cols]
                   const __nv_bfloat16* __restrict__ w,  // [rows, cols]
                   const float* __restrict__ bias,       // [rows] or null
                   float* __restrict__ y,                // [N, rows]
                   int rows, int cols, int split) {
  // `split` warps share a row (each takes every split-th 256-column slice), so that matrices of
  // few rows (the K and V projections: 1024) still give the GPU enough warps.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * (8 / split) + warp / split;
  const int part = warp % split;
  float acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = 0.f;
  if (r < rows) {
    const __nv_bfloat16* wr = w + static_cast<int64_t>(r) * cols;
#pragma unroll 4
    for (int c = part * 256 + lane * 8; c < cols; c += 256 * split) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wr + c));
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
      float wf[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h2[k]);
        wf[2 * k] = f.x;
        wf[2 * k + 1] = f.y;
      }
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float4* xp = reinterpret_cast<const float4*>(x + static_cast<int64_t>(n) * cols + c);
        const float4 a = __ldg(xp), b = __ldg(xp + 1);
        acc[n] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                  wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
      }
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    for (int off = 16; off > 0; off /= 2) acc[n] += __shfl_xor_sync(0xffffffffu, acc[n], off);
  }
  __shared__ float partial[8][N];
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < N; ++n) partial[warp][n] = acc[n];
  }
  __syncthreads();
  if (lane == 0 && part == 0 && r < rows) {
    const float b = bias != nullptr ? bias[r] : 0.f;
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float sum = 0.f;
      for (int k = 0; k < split; ++k) sum += partial[warp + k][n];
      y[static_cast<int64_t>(n) * rows + r] = sum + b;
    }
  }
}

template <int N>
void LaunchGemv(const float* x, const void* w, const float* bias, float* y, int rows, int cols,
                cudaStream_t stream) {
  // Warps per row: enough for about 8192 warps in all (64 on each of 128 multiprocessors).
  int split = 1;
  while (split < 8 && static_cast<int64_t>(rows) * split < 8192) split *= 2;
  const int rows_per_block = 8 / split;
  GemvBf16Kernel<N><<<(rows + rows_per_block - 1) / rows_per_block, 256, 0, stream>>>(
      x, static_cast<const __nv_bfloat16*>(w), bias, y, rows, cols, split);
}

bool GemvEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TANDEM_CUDA_GEMV");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// splitmix64 of (seed, i): a counter-based draw, the same whatever the launch shape.
__device__ inline float UniformAt(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
}

template <typename T>
__global__ void FillKernel(T* out, int64_t n, uint64_t seed, float scale, int constant) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = constant ? scale : (2.f * UniformAt(seed, i) - 1.f) * scale;
    if constexpr (sizeof(T) == 4) {
      out[i] = v;
    } else {
      out[i] = __float2bfloat16_rn(v);
    }
  }
}

}  // namespace

size_t GemmWorkspaceBytes(int n, int cols, int w_dtype) {
  return w_dtype == 2 ? static_cast<size_t>(n) * cols * sizeof(__nv_bfloat16) : 0;
}

int Gemm(cublasHandle_t handle, const float* d_x, int w_dtype, const void* d_w, const float* d_bias,
         float* d_y, int n, int rows, int cols, void* d_x16, size_t x16_bytes, cudaStream_t stream,
         bool x16_ready) {
  if (n < 0 || rows <= 0 || cols <= 0) return BadArg("gemm", "n >= 0, rows and cols > 0");
  if (w_dtype != 0 && w_dtype != 2) return BadArg("gemm", "w_dtype must be 0 (f32) or 2 (bf16)");
  if (handle == nullptr) return BadArg("gemm", "no cuBLAS handle");
  if (n == 0) return 0;
  if (w_dtype == 2 && n <= kGemvMaxN && cols % 8 == 0 && Aligned(d_x, 16) && Aligned(d_w, 16) &&
      GemvEnabled()) {
    static_assert(kGemvMaxN == 2);
    if (n == 1) {
      LaunchGemv<1>(d_x, d_w, d_bias, d_y, rows, cols, stream);
    } else {
      LaunchGemv<2>(d_x, d_w, d_bias, d_y, rows, cols, stream);
    }
    return LaunchCheck("gemm (gemv)");
  }
  const float alpha = 1.f, beta = 0.f;
  const void* x = d_x;
  cudaDataType_t type = CUDA_R_32F;
  if (w_dtype == 2) {
    if (x16_bytes < GemmWorkspaceBytes(n, cols, w_dtype) || d_x16 == nullptr) {
      return BadArg("gemm", "bf16 workspace too small (gemm_workspace_bytes)");
    }
    // cuBLAS wants the same type for both inputs: round the activations to bf16 (as every bf16
    // inference engine does); products and sums stay f32.
    const int64_t count = static_cast<int64_t>(n) * cols;
    if (!x16_ready) {
      ToBf16Kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(
          d_x, static_cast<__nv_bfloat16*>(d_x16), count);
      if (int e = LaunchCheck("gemm bf16 input")) return e;
    }
    x = d_x16;
    type = CUDA_R_16BF;
  }
  // cublasSetStream resets a handle's workspace to the default pool (cuBLAS documentation), which
  // would undo the device model's own workspace (needed for graph capture): set it only when
  // the handle is bound elsewhere.
  cudaStream_t bound = nullptr;
  if (int e = CublasCheck(cublasGetStream(handle, &bound), "gemm cublasGetStream")) return e;
  if (bound != stream) {
    if (int e = CublasCheck(cublasSetStream(handle, stream), "gemm cublasSetStream")) return e;
  }
  if (int e = CublasCheck(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha, d_w,
                                       type, cols, x, type, cols, &beta, d_y, CUDA_R_32F, rows,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                          "gemm cublasGemmEx")) {
    return e;
  }
  if (d_bias != nullptr) {
    AddBiasKernel<<<n, 256, 0, stream>>>(d_y, d_bias, rows);
    if (int e = LaunchCheck("gemm bias")) return e;
  }
  return 0;
}

int GatherRows(const float* d_src, const int* d_rows, int n, int cols, float* d_dst,
               cudaStream_t stream) {
  if (n < 0 || cols <= 0) return BadArg("gather_rows", "n >= 0 and cols > 0");
  if (n == 0) return 0;
  GatherRowsKernel<<<n, 256, 0, stream>>>(d_src, d_rows, cols, d_dst);
  return LaunchCheck("gather_rows");
}

int FillRandom(void* d_out, int dtype, int64_t n, uint64_t seed, float scale, int constant,
               cudaStream_t stream) {
  if (n <= 0) return 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  if (dtype == 0) {
    FillKernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(d_out), n, seed, scale, constant);
  } else if (dtype == 2) {
    FillKernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(d_out), n, seed, scale,
                                           constant);
  } else {
    return BadArg("fill_random", "dtype must be 0 (f32) or 2 (bf16)");
  }
  return LaunchCheck("fill_random");
}

}  // namespace tandem::cuda
