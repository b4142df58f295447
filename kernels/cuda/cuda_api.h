/* The plain C interface of libtandem_cuda.so, the CUDA backend library. Binaries never link the
 * library (nor libcuda): kernels/backend_loader.cc dlopen()s it and calls
 * tandem_cuda_get_api(), so every binary starts on machines without a GPU or driver.
 *
 * Pointers named d_* are device pointers. Every function returns 0 on success, or a non-zero
 * CUDA error code with last_error() describing it. Shapes are in comments as [dims]. */
#ifndef TANDEM_KERNELS_CUDA_CUDA_API_H_
#define TANDEM_KERNELS_CUDA_CUDA_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TANDEM_CUDA_ABI_VERSION 1

typedef struct TandemCudaApi {
  int abi_version;
  /* Number of usable devices; 0 when there is no driver or no GPU (never an error). */
  int (*device_count)(void);
  const char* (*last_error)(void);
  int (*device_name)(int device, char* buf, size_t len);

  int (*malloc)(void** d_ptr, size_t bytes);
  int (*free)(void* d_ptr);
  int (*memcpy_h2d)(void* d_dst, const void* src, size_t bytes);
  int (*memcpy_d2h)(void* dst, const void* d_src, size_t bytes);
  int (*synchronize)(void);

  /* d_y[n, dim] = d_x / sqrt(mean(d_x^2) + eps) * d_w[dim] */
  int (*rmsnorm)(const float* d_x, const float* d_w, float* d_y, int n, int dim, float eps);
  /* d_out[i] = silu(d_gate[i]) * d_up[i] */
  int (*silu_mul)(const float* d_gate, const float* d_up, float* d_out, int64_t n);
  /* Rotates d_x[n, n_heads, head_dim] in place; d_positions[n], d_inv_freq[head_dim / 2];
   * style 0 = interleaved pairs (llama2.c), 1 = halves (Hugging Face). */
  int (*rope)(float* d_x, int n, int n_heads, int head_dim, const int* d_positions,
              const float* d_inv_freq, int style);
  /* d_x[i] += d_y[i] */
  int (*add)(float* d_x, const float* d_y, int64_t n);
} TandemCudaApi;

/* Exported by libtandem_cuda.so. */
const TandemCudaApi* tandem_cuda_get_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KERNELS_CUDA_CUDA_API_H_ */
