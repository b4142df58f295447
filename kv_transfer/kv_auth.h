// Who may open a KV connection. A tcp KV connection starts with the cluster's proof, before any
// frame is read:
//   1. under TLS (the cluster has certificates and a CA), the TLS handshake with mutual
//      verification; the receiver requires the peer's certificate to name the prefill role and
//      the sender the decode role (security/tls_config.h);
//   2. with a cluster secret, a challenge-response both ways: the receiver's hello carries a
//      32-byte nonce, the sender answers with its own nonce and HMAC(secret, "client", both
//      nonces), the receiver with HMAC(secret, "server", both nonces). Neither side ever sends
//      the secret, and a recorded answer is useless against a fresh nonce.
// A connection that fails or does not finish within the handshake deadline is closed without a
// word about the receiver's leases.
//
//   hello  (receiver -> sender, 40 bytes): "TKVA" | version u16 (1) | flags u16 (bit 0: secret
//          required) | nonce[32]
//   answer (sender -> receiver, 72 bytes): "TKVA" | version u16 | flags u16 | nonce[32] | mac[32]
//   proof  (receiver -> sender, 32 bytes): mac[32]
// Without a secret the macs are zeros and unchecked (the TLS roles are the proof).
#ifndef TANDEM_KV_TRANSFER_KV_AUTH_H_
#define TANDEM_KV_TRANSFER_KV_AUTH_H_

#include <atomic>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/cluster_secret.h"
#include "security/secure_socket.h"
#include "security/tls_config.h"

namespace tandem {

struct KvAuth {
  std::optional<ClusterSecret> secret;
  std::shared_ptr<SslContext> tls;  // a server context for receivers, a client one for senders

  // Neither: a tcp KV endpoint refuses to run open.
  bool secured() const { return secret.has_value() || tls != nullptr; }
};

// The KvAuth of a process: TLS when `tls` is mutual, the secret when given. INVALID_ARGUMENT when
// there is neither, or the TLS files do not make a context.
absl::StatusOr<KvAuth> MakeKvAuth(std::optional<ClusterSecret> secret, const TlsConfig& tls,
                                  bool receiver);

// Runs the connection's authentication on `sock` as the receiver (`receiver`) or the sender, by
// `deadline`. UNAUTHENTICATED when the peer fails a check, UNAVAILABLE or DEADLINE_EXCEEDED when
// the connection breaks or stalls.
absl::Status AuthenticateKvConnection(SecureSocket& sock, const KvAuth& auth, bool receiver,
                                      const std::atomic<bool>& stop, absl::Time deadline);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_KV_AUTH_H_
