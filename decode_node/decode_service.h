// tandem.v1.DecodeWorker over a DecodeEngine.
#ifndef TANDEM_DECODE_NODE_DECODE_SERVICE_H_
#define TANDEM_DECODE_NODE_DECODE_SERVICE_H_

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "decode_node/decode_engine.h"
#include "kv_transfer/nccl/nccl_transport.h"
#include "rpc/internal_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

// Decode streams run on gRPC's callback API: a stream holds a little state and no thread; the
// engine's notifier hands it each step's tokens (DecodeEngine::Watch).
class DecodeService final
    : public v1::DecodeWorker::WithCallbackMethod_Decode<v1::DecodeWorker::Service> {
 public:
  // `auth` checks every call (Decode: routers; NcclBootstrap: prefill workers). `nccl`: the
  // engine's receiver when its transport is nccl (serves NcclBootstrap), else null.
  DecodeService(DecodeEngine* engine, std::shared_ptr<InternalAuth> auth,
                NcclKvTransportReceiver* nccl = nullptr)
      : engine_(engine), auth_(std::move(auth)), nccl_(nccl) {}

  // The engine handles of the streams' requests by request id (DecodeAdmit.replaces_request_id).
  class RequestHandles {
   public:
    void Track(const std::string& id, uint64_t handle);
    void Untrack(const std::string& id, uint64_t handle);  // only while `id` names `handle`
    std::optional<uint64_t> Find(const std::string& id) const;

   private:
    mutable std::mutex mu_;
    absl::flat_hash_map<std::string, uint64_t> handles_;
  };

  // One stream per request: Admit -> Admitted; Start -> Tokens... -> Finished. A cancelled or
  // broken stream cancels the request at once (its place frees; its blocks at the next step).
  grpc::ServerBidiReactor<v1::DecodeClientMessage, v1::DecodeServerMessage>* Decode(
      grpc::CallbackServerContext* ctx) override;

  // The NCCL KV transport's bootstrap: a unique id whose rank 0 this worker started.
  // UNIMPLEMENTED when this worker's transport is not nccl.
  grpc::Status NcclBootstrap(grpc::ServerContext* ctx, const v1::NcclBootstrapRequest* req,
                             v1::NcclBootstrapResponse* resp) override;

 private:
  DecodeEngine* engine_;
  std::shared_ptr<InternalAuth> auth_;
  NcclKvTransportReceiver* nccl_;
  RequestHandles handles_;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_NODE_DECODE_SERVICE_H_
