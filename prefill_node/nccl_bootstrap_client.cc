#include "prefill_node/nccl_bootstrap_client.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "rpc/grpc_util.h"
#include "rpc/internal_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {
namespace {

class GrpcNcclBootstrap {
 public:
  GrpcNcclBootstrap(std::string prefill_worker,
                    std::shared_ptr<grpc::ChannelCredentials> credentials,
                    std::shared_ptr<const InternalAuth> auth, absl::Duration timeout)
      : prefill_worker_(std::move(prefill_worker)),
        credentials_(credentials != nullptr ? std::move(credentials)
                                            : grpc::InsecureChannelCredentials()),
        auth_(std::move(auth)),
        timeout_(timeout) {}

  absl::StatusOr<NcclUniqueId> Call(const std::string& peer) {
    std::shared_ptr<v1::DecodeWorker::Stub> stub = StubFor(peer);
    v1::NcclBootstrapRequest req;
    req.set_prefill_worker(prefill_worker_);
    v1::NcclBootstrapResponse resp;
    auto prepare = [&](grpc::ClientContext* ctx) {
      ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    };
    auto call = [&](grpc::ClientContext* ctx) { return stub->NcclBootstrap(ctx, req, &resp); };
    grpc::Status s;
    if (auth_) {
      s = auth_->Call(peer, internal_method::kNcclBootstrap, PeerRole::kPrefill, req, prepare,
                      call);
    } else {
      grpc::ClientContext ctx;
      prepare(&ctx);
      s = call(&ctx);
    }
    if (!s.ok()) {
      return absl::Status(FromGrpc(s).code(),
                          absl::StrFormat("NcclBootstrap at %s: %s", peer, s.error_message()));
    }
    NcclUniqueId id;
    if (resp.unique_id().size() != id.size()) {
      return absl::DataLossError(
          absl::StrFormat("NcclBootstrap at %s: unique_id has %d bytes, want %d", peer,
                          resp.unique_id().size(), id.size()));
    }
    std::memcpy(id.data(), resp.unique_id().data(), id.size());
    return id;
  }

 private:
  std::shared_ptr<v1::DecodeWorker::Stub> StubFor(const std::string& peer) {
    absl::MutexLock lock(&mu_);
    auto& stub = stubs_[peer];
    if (stub == nullptr) {
      stub = v1::DecodeWorker::NewStub(grpc::CreateChannel(peer, credentials_));
    }
    return stub;
  }

  const std::string prefill_worker_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const std::shared_ptr<const InternalAuth> auth_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<v1::DecodeWorker::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

NcclBootstrapFn MakeGrpcNcclBootstrap(std::string prefill_worker,
                                      std::shared_ptr<grpc::ChannelCredentials> credentials,
                                      std::shared_ptr<const InternalAuth> auth,
                                      absl::Duration timeout) {
  auto client = std::make_shared<GrpcNcclBootstrap>(
      std::move(prefill_worker), std::move(credentials), std::move(auth), timeout);
  return [client](const std::string& peer) { return client->Call(peer); };
}

}  // namespace tandem
