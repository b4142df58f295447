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
//   hello  (receiver -> sender, 40 bytes): "TKVA" | version u16 (2) | flags u16 (bit 0: secret
//          required) | nonce[32]
//   answer (sender -> receiver, 72 bytes): "TKVA" | version u16 | flags u16 | nonce[32] | mac[32]
//   proof  (receiver -> sender, 32 bytes): mac[32]
// Without a secret the macs are zeros and unchecked (the TLS roles are the proof).
//
// Proving the secret once is not enough: whoever relays the handshake between two members would
// own the connection after it. So with a secret, every frame after the handshake is sealed
// (KvSession): each direction has its own key, HMAC(secret, label, receiver nonce | sender
// nonce), known only to the two ends of this connection, and its own record counter. A frame's
// header and its payload are two records, each followed by a 16-byte tag, HMAC-SHA256(key,
// counter | record) truncated:
//   header[88] | tag[16] | payload[payload_length] | tag[16]
// A header is acted on only once its tag checks, a payload only once its own does. A record
// that was altered, injected, replayed, reordered, dropped or spliced from another connection
// fails its tag, and the connection ends without an answer to it.
#ifndef TANDEM_KV_TRANSFER_KV_AUTH_H_
#define TANDEM_KV_TRANSFER_KV_AUTH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

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

inline constexpr size_t kKvFrameTagBytes = 16;

// The frame seals of one authenticated KV connection: one direction's key and counter for what
// this end sends, the other's for what it receives. Sending and receiving may run on two
// threads; each side is used by one thread at a time.
class KvSession {
 public:
  // Unsealed: TLS protects the frames (or a test speaks the bare protocol); tags are empty.
  KvSession() = default;
  // The keys of a connection whose handshake exchanged these nonces, for the receiver of KV
  // (the decode worker) when `receiver`, else for the sender.
  KvSession(const ClusterSecret& secret, std::string_view receiver_nonce,
            std::string_view sender_nonce, bool receiver);

  bool sealed() const { return send_ != nullptr; }
  // Bytes after each frame: kKvFrameTagBytes when sealed, else 0.
  size_t tag_bytes() const { return sealed() ? kKvFrameTagBytes : 0; }

  // The tag of the next record sent ("" when unsealed).
  std::string Tag(std::string_view record);
  // Receiving a record in pieces (a payload read through a small buffer): BeginReceive,
  // ReceivePart for each piece in order, then ReceivedTagValid with the tag read after it.
  void BeginReceive();
  void ReceivePart(std::string_view bytes);
  bool ReceivedTagValid(std::string_view tag);
  // The same for a record at hand.
  bool Open(std::string_view record, std::string_view tag);

 private:
  std::unique_ptr<HmacSha256> send_, receive_;
  uint64_t sent_ = 0, received_ = 0;  // frames so far, each direction
};

// An encoded frame (header then payload, kv_transfer/wire.h) as it goes on a connection of
// `session`: with the tags after its header and its payload when sealed.
std::string SealKvFrame(KvSession& session, std::string_view frame);

// Runs the connection's authentication on `sock` as the receiver (`receiver`) or the sender, by
// `deadline`: the connection's session. UNAUTHENTICATED when the peer fails a check, UNAVAILABLE
// or DEADLINE_EXCEEDED when the connection breaks or stalls.
absl::StatusOr<std::unique_ptr<KvSession>> AuthenticateKvConnection(SecureSocket& sock,
                                                                    const KvAuth& auth,
                                                                    bool receiver,
                                                                    const std::atomic<bool>& stop,
                                                                    absl::Time deadline);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_KV_AUTH_H_
