// tandem.v1.DecodeWorker over a DecodeEngine.
#ifndef TANDEM_DECODE_NODE_DECODE_SERVICE_H_
#define TANDEM_DECODE_NODE_DECODE_SERVICE_H_

#include "decode_node/decode_engine.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class DecodeService final : public v1::DecodeWorker::Service {
 public:
  explicit DecodeService(DecodeEngine* engine) : engine_(engine) {}

  // One stream per request: Admit -> Admitted; Start -> Tokens... -> Finished. A cancelled or
  // broken stream cancels the request, which frees its blocks.
  grpc::Status Decode(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::DecodeServerMessage, v1::DecodeClientMessage>* stream) override;

 private:
  DecodeEngine* engine_;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_NODE_DECODE_SERVICE_H_
