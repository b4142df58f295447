#include "kv_transfer/kv_transfer.h"

#include "absl/strings/str_format.h"
#include "kv_transfer/local_transport.h"
#include "kv_transfer/tcp_transport.h"
#include "kv_transfer/transport_common.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvSender>> MakeKvSender(std::string_view kind,
                                                       const KvSenderOptions& options) {
  if (kind == "tcp") return CreateTcpKvSender(options);
  if (kind == "local") return CreateLocalKvSender(options);
  return absl::InvalidArgumentError(
      absl::StrFormat("kv transport: unknown kind \"%s\" (want tcp or local)", kind));
}

absl::StatusOr<std::unique_ptr<KvReceiver>> MakeKvReceiver(std::string_view kind,
                                                           std::string_view address, KvSink* sink,
                                                           const KvReceiverOptions& options) {
  if (kind == "tcp") {
    absl::StatusOr<KvEndpoint> a = ParseTcpAddress(address);
    if (!a.ok()) return a.status();
    return CreateTcpKvReceiver(a->host, a->port, sink, options);
  }
  if (kind == "local") return CreateLocalKvReceiver(address, sink);
  return absl::InvalidArgumentError(
      absl::StrFormat("kv transport: unknown kind \"%s\" (want tcp or local)", kind));
}

}  // namespace tandem
