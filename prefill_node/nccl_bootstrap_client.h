// The prefill side of the NCCL KV transport's bootstrap over gRPC: NcclBootstrapFn calling the
// DecodeWorker.NcclBootstrap RPC of the decode worker at the peer address ("HOST:PORT", the
// nccl:// endpoint of a KV target).
#ifndef TANDEM_PREFILL_NODE_NCCL_BOOTSTRAP_CLIENT_H_
#define TANDEM_PREFILL_NODE_NCCL_BOOTSTRAP_CLIENT_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "kv_transfer/nccl/nccl_kv.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace tandem {

class InternalAuth;

// One channel per decode worker, kept for the next bootstrap. `prefill_worker` names this worker
// in the decode's logs; each call has `timeout` as its deadline. The RPC's error comes back as
// it is (UNIMPLEMENTED: the decode worker does not use the nccl transport); a response whose
// unique_id is not 128 bytes is DATA_LOSS. Each call carries `auth`'s proof (the decode worker
// serves NcclBootstrap to prefill workers only).
NcclBootstrapFn MakeGrpcNcclBootstrap(std::string prefill_worker,
                                      std::shared_ptr<grpc::ChannelCredentials> credentials,
                                      std::shared_ptr<const InternalAuth> auth,
                                      absl::Duration timeout = absl::Seconds(10));

}  // namespace tandem

#endif  // TANDEM_PREFILL_NODE_NCCL_BOOTSTRAP_CLIENT_H_
