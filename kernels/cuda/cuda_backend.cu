// libtandem_cuda.so: CUDA kernels behind the C table in cuda_api.h (the table's kernel entries;
// engine/cuda/cuda_plugin.cu adds the device model's and exports it). Each kernel has a CPU twin
// in kernels/cpu/cpu_ops.cc; tests/kernels/cuda_twin_test.cc compares them on a GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/fi_attention.h"
#include "kernels/cuda/ops.h"

namespace {
thread_local char g_error[256] = "";
}  // namespace

namespace tandem::cuda {

int Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  std::snprintf(g_error, sizeof(g_error), "%s: %s", what, cudaGetErrorString(e));
  return static_cast<int>(e);
}

int BadArg(const char* what, const char* why) {
  std::snprintf(g_error, sizeof(g_error), "%s: %s", what, why);
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace tandem::cuda

namespace {

using tandem::cuda::Check;
using tandem::cuda::LaunchCheck;

// One block per row; a block-wide reduction of the sum of squares.
__global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ w,
                              float* __restrict__ y, int dim, float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  __shared__ float partial[32];
  for (int off = 16; off > 0; off /= 2) ss += __shfl_down_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < (blockDim.x + 31) / 32 ? partial[threadIdx.x] : 0.f;
    for (int off = 16; off > 0; off /= 2) ss += __shfl_down_sync(0xffffffffu, ss, off);
    if (threadIdx.x == 0) partial[0] = ss;
  }
  __syncthreads();
  const float scale = rsqrtf(partial[0] / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (scale * xr[i]);
}

__global__ void SiluMulKernel(const float* g, const float* u, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = g[i];
    out[i] = v / (1.f + expf(-v)) * u[i];
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// grid (n tokens, n_heads), block head_dim / 2 threads: one rotation pair each.
__global__ void RopeKernel(float* x, int n_heads, int head_dim, const int* positions,
                           const float* inv_freq, int style) {
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = head_dim / 2;
  if (i >= half) return;
  float* v = x + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
  const float angle = static_cast<float>(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  const int a = style == 0 ? 2 * i : i;
  const int b = style == 0 ? 2 * i + 1 : i + half;
  const float v0 = v[a], v1 = v[b];
  v[a] = v0 * c - v1 * s;
  v[b] = v0 * s + v1 * c;
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear: no driver or no device is not an error here
    return 0;
  }
  return n;
}

const char* LastError() { return g_error; }

int DeviceName(int device, char* buf, size_t len) {
  cudaDeviceProp prop;
  if (int e = Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties")) return e;
  std::snprintf(buf, len, "%s", prop.name);
  return 0;
}

int DeviceMemory(size_t* free_bytes, size_t* total_bytes) {
  return Check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

int Malloc(void** p, size_t bytes) { return Check(cudaMalloc(p, bytes), "cudaMalloc"); }
int Free(void* p) { return Check(cudaFree(p), "cudaFree"); }
int H2D(void* d, const void* s, size_t b) {
  return Check(cudaMemcpy(d, s, b, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
int D2H(void* d, const void* s, size_t b) {
  return Check(cudaMemcpy(d, s, b, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
int Sync() { return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace

namespace tandem::cuda {

int RmsNorm(const float* x, const float* w, float* y, int n, int dim, float eps,
            cudaStream_t stream) {
  if (n < 0 || dim <= 0) return BadArg("rmsnorm", "n >= 0 and dim > 0");
  if (n == 0) return 0;
  RmsNormKernel<<<n, 256, 0, stream>>>(x, w, y, dim, eps);
  return LaunchCheck("rmsnorm");
}
int SiluMul(const float* g, const float* u, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return 0;
  SiluMulKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(g, u, out, n);
  return LaunchCheck("silu_mul");
}
int Rope(float* x, int n, int n_heads, int head_dim, const int* pos, const float* inv_freq,
         int style, cudaStream_t stream) {
  if (n < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > 2048) {
    return BadArg("rope", "n >= 0, n_heads > 0, head_dim even and in (0, 2048]");
  }
  if (n == 0) return 0;
  RopeKernel<<<dim3(n, n_heads), (head_dim / 2 + 31) / 32 * 32, 0, stream>>>(x, n_heads, head_dim,
                                                                             pos, inv_freq, style);
  return LaunchCheck("rope");
}
int Add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return 0;
  AddKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, y, n);
  return LaunchCheck("add");
}

}  // namespace tandem::cuda

namespace {

// The C table's launchers run on the legacy default stream.
int RmsNormC(const float* x, const float* w, float* y, int n, int dim, float eps) {
  return tandem::cuda::RmsNorm(x, w, y, n, dim, eps, 0);
}
int SiluMulC(const float* g, const float* u, float* out, int64_t n) {
  return tandem::cuda::SiluMul(g, u, out, n, 0);
}
int RopeC(float* x, int n, int n_heads, int head_dim, const int* pos, const float* inv_freq,
          int style) {
  return tandem::cuda::Rope(x, n, n_heads, head_dim, pos, inv_freq, style, 0);
}
int AddC(float* x, const float* y, int64_t n) { return tandem::cuda::Add(x, y, n, 0); }
int EmbeddingC(const int* ids, int dtype, const void* table, int64_t rows, int64_t cols, float* out,
               int n, int* bad) {
  return tandem::cuda::Embedding(ids, dtype, table, rows, cols, out, n, bad, 0);
}
int WriteKvC(const float* k, const float* v, const int* slots, int n, int width, float* kc,
             float* vc) {
  return tandem::cuda::WriteKv(k, v, slots, n, width, kc, vc, 0);
}
int PackKvC(const float* kc, const float* vc, const int* table, int bs, int width, int start,
            int count, float* wire) {
  return tandem::cuda::PackKv(kc, vc, table, bs, width, start, count, wire, 0);
}
int UnpackKvC(const float* wire, const int* table, int bs, int width, int start, int count,
              float* kc, float* vc) {
  return tandem::cuda::UnpackKv(wire, table, bs, width, start, count, kc, vc, 0);
}
int FiSupportedC(int head_dim, int kv_dtype, const char** why) {
  return tandem::cuda::FiSupported(head_dim, kv_dtype, why) ? 1 : 0;
}
int WriteKvTypedC(const float* k, const float* v, const int* slots, int n, int heads, int hd,
                  int bs, int dtype, const float* scales, void* kc, void* vc) {
  return tandem::cuda::WriteKvTyped(k, v, slots, n, heads, hd, bs, dtype, scales, kc, vc, 0);
}
int SetFp8ScalesC(const float* k, const float* v, const int* q_indptr, const int* pos,
                  int num_chunks, const int* tables, int stride, int heads, int hd, int bs,
                  float* scales) {
  return tandem::cuda::SetFp8Scales(k, v, q_indptr, pos, num_chunks, tables, stride, heads, hd, bs,
                                    scales, 0);
}
int PackKvTypedC(const void* kc, const void* vc, const float* scales, const int* table, int bs,
                 int heads, int hd, int dtype, int start, int count, void* wire) {
  return tandem::cuda::PackKvTyped(kc, vc, scales, table, bs, heads, hd, dtype, start, count, wire,
                                   0);
}
int UnpackKvTypedC(const void* wire, const int* table, int bs, int heads, int hd, int dtype,
                   int start, int count, void* kc, void* vc, float* scales) {
  return tandem::cuda::UnpackKvTyped(wire, table, bs, heads, hd, dtype, start, count, kc, vc,
                                     scales, 0);
}
int PagedAttentionDecodeC(const float* q, const float* k, const float* v,
                          const TandemPagedAttentionArgs* args, int max_context, void* ws,
                          size_t ws_bytes, float* out) {
  if (args == nullptr) return tandem::cuda::BadArg("paged_attention", "args is null");
  return tandem::cuda::PagedAttentionDecode(q, k, v, *args, max_context, ws, ws_bytes, out, 0);
}
// kBf16: the tensor-core variant (prefill_attention_bf16).
template <bool kBf16>
int PrefillAttentionC(const float* q, const float* k, const float* v,
                      const TandemPagedAttentionArgs* args, const int* tiles, int num_tiles,
                      float* out) {
  if (args == nullptr) return tandem::cuda::BadArg("prefill_attention", "args is null");
  return tandem::cuda::PrefillAttention(q, k, v, *args, tiles, num_tiles, kBf16, out, 0);
}
int SampleC(const float* logits, int rows, int vocab, const TandemSampleRowParams* params, void* ws,
            size_t ws_bytes, int* tokens) {
  return tandem::cuda::Sample(logits, rows, vocab, params, ws, ws_bytes, tokens, 0);
}

// One cuBLAS handle for the C table's gemm, created on first use (the device model has its
// own, bound to its stream).
cublasHandle_t SharedHandle() {
  static std::mutex mu;
  static cublasHandle_t handle = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (handle == nullptr && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) handle = nullptr;
  return handle;
}
int GemmC(const float* x, int w_dtype, const void* w, const float* bias, float* y, int n, int rows,
          int cols, void* ws, size_t ws_bytes) {
  cublasHandle_t h = SharedHandle();
  if (h == nullptr) return tandem::cuda::BadArg("gemm", "cublasCreate failed");
  return tandem::cuda::Gemm(h, x, w_dtype, w, bias, y, n, rows, cols, ws, ws_bytes, 0);
}

}  // namespace

namespace tandem::cuda {

void FillKernelEntries(TandemCudaApi* api) {
  api->abi_version = TANDEM_CUDA_ABI_VERSION;
  api->device_count = DeviceCount;
  api->last_error = LastError;
  api->device_name = DeviceName;
  api->malloc = Malloc;
  api->free = Free;
  api->memcpy_h2d = H2D;
  api->memcpy_d2h = D2H;
  api->synchronize = Sync;
  api->rmsnorm = RmsNormC;
  api->silu_mul = SiluMulC;
  api->rope = RopeC;
  api->add = AddC;
  api->embedding = EmbeddingC;
  api->write_kv = WriteKvC;
  api->pack_kv = PackKvC;
  api->unpack_kv = UnpackKvC;
  api->paged_attention_workspace_bytes = tandem::cuda::PagedAttentionWorkspaceBytes;
  api->paged_attention_decode = PagedAttentionDecodeC;
  api->sample_workspace_bytes = tandem::cuda::SampleWorkspaceBytes;
  api->sample = SampleC;
  api->gemm_workspace_bytes = tandem::cuda::GemmWorkspaceBytes;
  api->gemm = GemmC;
  api->prefill_attention = PrefillAttentionC<false>;
  api->prefill_attention_bf16 = PrefillAttentionC<true>;
  api->fi_attention_supported = FiSupportedC;
  api->device_memory = DeviceMemory;
  api->write_kv_typed = WriteKvTypedC;
  api->set_fp8_scales = SetFp8ScalesC;
  api->pack_kv_typed = PackKvTypedC;
  api->unpack_kv_typed = UnpackKvTypedC;
}

}  // namespace tandem::cuda
