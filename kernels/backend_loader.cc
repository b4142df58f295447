#include "kernels/backend_loader.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/plugin_loader.h"

namespace tandem {
namespace {

absl::StatusOr<const TandemCudaApi*> LoadOnce() {
  return LoadPluginApi<TandemCudaApi>(
      {"TANDEM_CUDA_LIB", "libtandem_cuda.so", "tandem_cuda_get_api", "the CUDA backend library"},
      TANDEM_CUDA_ABI_VERSION);
}

}  // namespace

absl::StatusOr<const TandemCudaApi*> LoadCudaApi() {
  static const absl::StatusOr<const TandemCudaApi*> api = LoadOnce();
  return api;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu" || device == "auto") return MakeCpuBackend();
  if (device == "cuda") {
    auto api = LoadCudaApi();
    if (!api.ok()) return api.status();
    return absl::UnimplementedError(
        "a CUDA device is present, but the CUDA forward pass is not built yet; use "
        "--device=cpu or auto");
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("device: \"%s\" is not one of auto, cpu, cuda", device));
}

}  // namespace tandem
