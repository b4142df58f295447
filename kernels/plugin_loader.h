// Loading a device library at run time (the CUDA backend, the NCCL transport) so that no binary
// links libcuda or libnccl and every binary starts on a machine without a GPU. Each library
// exports `const Api* <get_api_symbol>()`, a table of C functions whose first field is its ABI
// version and which has `int device_count()`.
#ifndef TANDEM_KERNELS_PLUGIN_LOADER_H_
#define TANDEM_KERNELS_PLUGIN_LOADER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace tandem {

struct PluginSpec {
  const char* env_var;  // a path to try first, e.g. "TANDEM_CUDA_LIB"
  const char* file;     // e.g. "libtandem_cuda.so": next to the executable, then dlopen's path
  const char* get_api_symbol;  // e.g. "tandem_cuda_get_api"
  const char* what;            // e.g. "the CUDA backend library", for the error
};

struct FoundPlugin {
  std::string path;
  const void* api = nullptr;
};

// The first candidate that loads, exports the symbol and whose table `accept`s; UNAVAILABLE
// listing why each candidate failed otherwise.
absl::StatusOr<FoundPlugin> FindPlugin(const PluginSpec& spec,
                                       const std::function<bool(const void*)>& accept);

// FindPlugin for a table type `Api` of ABI `abi_version`; UNAVAILABLE when the library loads
// but sees no usable device.
template <typename Api>
absl::StatusOr<const Api*> LoadPluginApi(const PluginSpec& spec, int abi_version) {
  auto found = FindPlugin(spec, [abi_version](const void* api) {
    return static_cast<const Api*>(api)->abi_version == abi_version;
  });
  if (!found.ok()) return found.status();
  const Api* api = static_cast<const Api*>(found->api);
  if (api->device_count() <= 0) {
    return absl::UnavailableError(absl::StrFormat(
        "%s loaded, but no CUDA device is usable (no GPU or no driver)", found->path));
  }
  return api;
}

}  // namespace tandem

#endif  // TANDEM_KERNELS_PLUGIN_LOADER_H_
