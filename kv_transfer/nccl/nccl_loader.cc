#include "kv_transfer/nccl/nccl_loader.h"

#include <string>

#include "absl/strings/str_format.h"
#include "kernels/plugin_loader.h"

namespace tandem {
namespace {

absl::StatusOr<const TandemNcclApi*> LoadOnce() {
  return LoadPluginApi<TandemNcclApi>({"TANDEM_NCCL_LIB", "libtandem_nccl.so",
                                       "tandem_nccl_get_api", "the NCCL KV transport library"},
                                      TANDEM_NCCL_ABI_VERSION);
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
