// tandem.v1.PrefillWorker over a PrefillEngine.
#ifndef TANDEM_PREFILL_NODE_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_NODE_PREFILL_SERVICE_H_

#include <atomic>
#include <memory>

#include "prefill_node/prefill_engine.h"
#include "rpc/internal_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class PrefillService final : public v1::PrefillWorker::Service {
 public:
  // `auth` checks every call: only routers may call a prefill worker.
  PrefillService(PrefillEngine* engine, std::shared_ptr<InternalAuth> auth)
      : engine_(engine), auth_(std::move(auth)) {}

  grpc::Status Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                       v1::PrefillResponse* resp) override;
  grpc::Status Score(grpc::ServerContext* ctx, const v1::PrefillScoreRequest* req,
                     v1::PrefillScoreResponse* resp) override;

 private:
  PrefillEngine* engine_;
  std::shared_ptr<InternalAuth> auth_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace tandem

#endif  // TANDEM_PREFILL_NODE_PREFILL_SERVICE_H_
