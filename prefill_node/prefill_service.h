// tandem.v1.PrefillWorker over a PrefillEngine.
#ifndef TANDEM_PREFILL_NODE_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_NODE_PREFILL_SERVICE_H_

#include <atomic>

#include "prefill_node/prefill_engine.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class PrefillService final : public v1::PrefillWorker::Service {
 public:
  explicit PrefillService(PrefillEngine* engine) : engine_(engine) {}

  grpc::Status Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                       v1::PrefillResponse* resp) override;
  grpc::Status Score(grpc::ServerContext* ctx, const v1::PrefillScoreRequest* req,
                     v1::PrefillScoreResponse* resp) override;

 private:
  PrefillEngine* engine_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace tandem

#endif  // TANDEM_PREFILL_NODE_PREFILL_SERVICE_H_
