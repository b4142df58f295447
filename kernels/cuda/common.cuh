// Shared by the .cu files of libtandem_cuda.so: error reporting and launch checks.
#ifndef TANDEM_KERNELS_CUDA_COMMON_CUH_
#define TANDEM_KERNELS_CUDA_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// Records "what: message" as last_error(); returns the CUDA error code (0 on success).
int Check(cudaError_t e, const char* what);
inline int LaunchCheck(const char* what) { return Check(cudaGetLastError(), what); }
// A shape/argument error found by a launcher: last_error() = "what: why"; returns
// cudaErrorInvalidValue.
int BadArg(const char* what, const char* why);

inline bool Aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_COMMON_CUH_
