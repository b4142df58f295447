// Chooses the compute backend at run time and loads the CUDA library when asked for it.
#ifndef TANDEM_KERNELS_BACKEND_LOADER_H_
#define TANDEM_KERNELS_BACKEND_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_api.h"

namespace tandem {

// The CUDA library's function table, or why it is not available (library not built or not
// found, no driver, no device). Searched: $TANDEM_CUDA_LIB, then libtandem_cuda.so next to the
// running executable, then the dynamic linker's path. Loaded once per process.
absl::StatusOr<const TandemCudaApi*> LoadCudaApi();

// device: "cpu", "cuda" or "auto". "auto" is the CPU backend unless a CUDA forward pass is
// available; "cuda" fails with the reason when it is not. The CUDA library today carries the
// element-wise kernels and their twin tests; the full CUDA forward pass (GEMMs, paged attention,
// device-resident weights) is not built yet, so "cuda" reports UNIMPLEMENTED after checking
// the device.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

}  // namespace tandem

#endif  // TANDEM_KERNELS_BACKEND_LOADER_H_
