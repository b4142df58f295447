#include "kernels/plugin_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

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

}  // namespace

absl::StatusOr<FoundPlugin> FindPlugin(const PluginSpec& spec,
                                       const std::function<bool(const void*)>& accept) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv(spec.env_var); env && *env) candidates.push_back(env);
  candidates.push_back(ExecutableDir() + "/" + spec.file);
  candidates.push_back(spec.file);
  std::string errors;
  for (const auto& path : candidates) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      errors += absl::StrFormat("\n  %s: %s", path, ::dlerror());
      continue;
    }
    using GetApi = const void* (*)();
    auto get = reinterpret_cast<GetApi>(::dlsym(handle, spec.get_api_symbol));
    if (get == nullptr) {
      errors += absl::StrFormat("\n  %s: no %s symbol", path, spec.get_api_symbol);
      continue;
    }
    const void* api = get();
    if (api == nullptr || !accept(api)) {
      errors += absl::StrFormat("\n  %s: ABI version mismatch", path);
      continue;
    }
    return FoundPlugin{path, api};
  }
  return absl::UnavailableError(absl::StrFormat("%s is not available:%s", spec.what, errors));
}

}  // namespace tandem
