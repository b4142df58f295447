#include "kernels/backend_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

absl::StatusOr<const TandemCudaApi*> LoadOnce() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TANDEM_CUDA_LIB"); env && *env) candidates.push_back(env);
  candidates.push_back(ExecutableDir() + "/libtandem_cuda.so");
  candidates.push_back("libtandem_cuda.so");
  std::string errors;
  for (const auto& path : candidates) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      errors += absl::StrFormat("\n  %s: %s", path, ::dlerror());
      continue;
    }
    using GetApi = const TandemCudaApi* (*)();
    auto get = reinterpret_cast<GetApi>(::dlsym(handle, "tandem_cuda_get_api"));
    if (get == nullptr) {
      errors += absl::StrFormat("\n  %s: no tandem_cuda_get_api symbol", path);
      continue;
    }
    const TandemCudaApi* api = get();
    if (api == nullptr || api->abi_version != TANDEM_CUDA_ABI_VERSION) {
      errors += absl::StrFormat("\n  %s: ABI version mismatch", path);
      continue;
    }
    if (api->device_count() <= 0) {
      return absl::UnavailableError(
          absl::StrFormat("%s loaded, but no CUDA device is usable (no GPU or no driver)", path));
    }
    return api;
  }
  return absl::UnavailableError("the CUDA backend library is not available:" + errors);
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
