#include "kv_transfer/nccl/nccl_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

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

absl::StatusOr<const TandemNcclApi*> LoadOnce() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TANDEM_NCCL_LIB"); env && *env) candidates.push_back(env);
  candidates.push_back(ExecutableDir() + "/libtandem_nccl.so");
  candidates.push_back("libtandem_nccl.so");
  std::string errors;
  for (const auto& path : candidates) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      errors += absl::StrFormat("\n  %s: %s", path, ::dlerror());
      continue;
    }
    using GetApi = const TandemNcclApi* (*)();
    auto get = reinterpret_cast<GetApi>(::dlsym(handle, "tandem_nccl_get_api"));
    const TandemNcclApi* api = get != nullptr ? get() : nullptr;
    if (api == nullptr || api->abi_version != TANDEM_NCCL_ABI_VERSION) {
      errors += absl::StrFormat("\n  %s: no tandem_nccl_get_api or ABI version mismatch", path);
      continue;
    }
    if (api->device_count() <= 0) {
      return absl::UnavailableError(
          absl::StrFormat("%s loaded, but no CUDA device is usable (no GPU or no driver)", path));
    }
    return api;
  }
  return absl::UnavailableError("the NCCL KV transport library is not available:" + errors);
}

absl::Status Error(const TandemNcclApi* api, int code, const char* what) {
  return absl::UnavailableError(
      absl::StrFormat("%s failed (%d): %s", what, code, api->last_error()));
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const TandemNcclApi* api, void* handle, int rank)
      : api_(api), handle_(handle), rank_(rank) {}
  ~NcclCommunicator() override {
    if (handle_ == nullptr) return;
    // Destroy only a communicator with nothing in flight; otherwise abort (never wait).
    if (api_->poll(handle_) == TANDEM_NCCL_POLL_IDLE) {
      api_->destroy(handle_);
    } else {
      api_->abort(handle_);
    }
  }
  int rank() const override { return rank_; }
  absl::Status GroupStart() override { return Call(api_->group_start(Live()), "ncclGroupStart"); }
  absl::Status GroupEnd() override { return Call(api_->group_end(Live()), "ncclGroupEnd"); }
  absl::Status Send(std::span<const char> data, int peer) override {
    if (handle_ == nullptr) return Aborted();
    return Call(api_->send(handle_, data.data(), data.size(), peer), "ncclSend");
  }
  absl::Status Recv(std::span<char> data, int peer) override {
    if (handle_ == nullptr) return Aborted();
    return Call(api_->recv(handle_, data.data(), data.size(), peer), "ncclRecv");
  }
  absl::StatusOr<CommPoll> Poll() override {
    if (handle_ == nullptr) return Aborted();
    const int r = api_->poll(handle_);
    if (r == TANDEM_NCCL_POLL_IDLE) return CommPoll::kIdle;
    if (r == TANDEM_NCCL_POLL_PENDING) return CommPoll::kPending;
    return absl::UnavailableError(absl::StrFormat("nccl: %s", api_->last_error()));
  }
  void Abort() override {
    if (handle_ == nullptr) return;
    api_->abort(handle_);
    handle_ = nullptr;
  }

 private:
  static absl::Status Aborted() {
    return absl::FailedPreconditionError("nccl communicator was aborted");
  }
  void* Live() const { return handle_; }
  absl::Status Call(int code, const char* what) {
    if (handle_ == nullptr) return Aborted();
    return code == 0 ? absl::OkStatus() : Error(api_, code, what);
  }

  const TandemNcclApi* const api_;
  void* handle_;
  const int rank_;
};

class NcclFactory : public CommunicatorFactory {
 public:
  NcclFactory(const TandemNcclApi* api, int device) : api_(api), device_(device) {}
  absl::StatusOr<NcclUniqueId> NewUniqueId() override {
    NcclUniqueId id;
    if (int e = api_->get_unique_id(id.data())) return Error(api_, e, "ncclGetUniqueId");
    return id;
  }
  absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const NcclUniqueId& id, int nranks,
                                                         int rank) override {
    void* handle = nullptr;
    if (int e = api_->comm_init(id.data(), nranks, rank, device_, &handle)) {
      return Error(api_, e, "ncclCommInitRankConfig");
    }
    return std::unique_ptr<Communicator>(new NcclCommunicator(api_, handle, rank));
  }

 private:
  const TandemNcclApi* const api_;
  const int device_;
};

}  // namespace

absl::StatusOr<const TandemNcclApi*> LoadNcclApi() {
  static const absl::StatusOr<const TandemNcclApi*> api = LoadOnce();
  return api;
}

absl::StatusOr<std::unique_ptr<CommunicatorFactory>> MakeNcclCommunicatorFactory(int device) {
  absl::StatusOr<const TandemNcclApi*> api = LoadNcclApi();
  if (!api.ok()) return api.status();
  const int n = (*api)->device_count();
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nccl: device %d is outside [0, %d)", device, n));
  }
  return std::unique_ptr<CommunicatorFactory>(new NcclFactory(*api, device));
}

}  // namespace tandem
