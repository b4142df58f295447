// The tcp KV transport: host memory over persistent loopback or LAN sockets.
//
// Every connection first proves the cluster's credentials (kv_transfer/kv_auth.h: TLS with
// roles and/or the cluster secret); both factories refuse to run without them.
//
// Receiver: listens on HOST:PORT (port 0: the kernel picks; endpoint() tells which); one reader
// thread per accepted connection, capped in total and per peer host, authenticates the peer,
// then reads frames, checks each header with the sink before buffering its payload, verifies
// the payload, calls the sink and writes the ACK. A payload checksum mismatch is answered with
// DATA_LOSS and the connection stays usable; a corrupt or invalid header loses the framing, so
// it is answered when possible and the connection closed.
//
// Sender: one persistent connection per endpoint, opened on first use and reopened after a
// failure; a writer thread per connection drains its queue (frames pipelined, not waiting for
// ACKs) and a reader thread matches ACKs to chunks by seq. A lost connection fails the chunks
// in flight on it with UNAVAILABLE.
#ifndef TANDEM_KV_TRANSFER_TCP_TRANSPORT_H_
#define TANDEM_KV_TRANSFER_TCP_TRANSPORT_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "kv_transfer/kv_transfer.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateTcpKvReceiver(std::string_view host, int port,
                                                                KvSink* sink,
                                                                const KvReceiverOptions& options);
absl::StatusOr<std::unique_ptr<KvSender>> CreateTcpKvSender(const KvSenderOptions& options);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_TCP_TRANSPORT_H_
