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

// The device a model runs on for a --device flag value: "cpu" -> "cpu"; "cuda" -> "cuda" when
// the CUDA library loads and sees a device, else UNAVAILABLE naming --device=cuda and why;
// "auto" -> "cuda" when available, else "cpu". INVALID_ARGUMENT for any other value.
absl::StatusOr<std::string> ResolveDevice(const std::string& device);

// The host Backend (per-op, host pointers) for device "cpu" or "auto": the CPU backend. The
// CUDA forward pass is not a per-op Backend but a device-resident model behind
// engine/model_runner.h (ResolveDevice, then MakeModelRunner); "cuda" here reports why CUDA is
// unavailable, or UNIMPLEMENTED saying so.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

}  // namespace tandem

#endif  // TANDEM_KERNELS_BACKEND_LOADER_H_
