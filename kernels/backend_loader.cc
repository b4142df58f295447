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

absl::StatusOr<std::string> ResolveDevice(const std::string& device) {
  if (device == "cpu") return std::string("cpu");
  if (device == "cuda" || device == "auto") {
    auto api = LoadCudaApi();
    if (api.ok()) return std::string("cuda");
    if (device == "auto") return std::string("cpu");
    return absl::UnavailableError(absl::StrFormat("--device=cuda: %s", api.status().message()));
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("device: \"%s\" is not one of auto, cpu, cuda", device));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu" || device == "auto") return MakeCpuBackend();
  if (device == "cuda") {
    auto api = LoadCudaApi();
    if (!api.ok()) {
      return absl::UnavailableError(absl::StrFormat("--device=cuda: %s", api.status().message()));
    }
    return absl::UnimplementedError(
        "--device=cuda: CUDA is not a per-op backend; the CUDA forward pass is the device model "
        "of engine/model_runner.h");
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("device: \"%s\" is not one of auto, cpu, cuda", device));
}

}  // namespace tandem
