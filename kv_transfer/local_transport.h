// The local KV transport: sender and receiver in one process (colocated mode, tests). A
// process-wide registry maps "local://NAME" to a receiver; the sender's worker thread checks
// the CRC and calls the sink, so the semantics (asynchronous Send, ACK status through Wait,
// DATA_LOSS for a corrupted chunk) match the tcp transport.
#ifndef TANDEM_KV_TRANSFER_LOCAL_TRANSPORT_H_
#define TANDEM_KV_TRANSFER_LOCAL_TRANSPORT_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "kv_transfer/kv_transfer.h"

namespace tandem {

// ALREADY_EXISTS if `name` is registered.
absl::StatusOr<std::unique_ptr<KvReceiver>> CreateLocalKvReceiver(std::string_view name,
                                                                  KvSink* sink);
std::unique_ptr<KvSender> CreateLocalKvSender(const KvSenderOptions& options);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_LOCAL_TRANSPORT_H_
