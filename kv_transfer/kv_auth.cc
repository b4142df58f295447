#include "kv_transfer/kv_auth.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "kv_transfer/wire.h"

namespace tandem {
namespace {

constexpr char kMagic[4] = {'T', 'K', 'V', 'A'};
constexpr uint16_t kVersion = 2;  // 2: frames after the handshake are sealed
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloBytes = 8 + kNonceBytes;
constexpr size_t kAnswerBytes = kHelloBytes + ClusterSecret::kMacBytes;
constexpr char kClientLabel[] = "tandem-kv-client-v1";
constexpr char kServerLabel[] = "tandem-kv-server-v1";
constexpr char kToReceiverLabel[] = "tandem-kv-frames-to-receiver-v2";
constexpr char kToSenderLabel[] = "tandem-kv-frames-to-sender-v2";

std::string Counter(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

std::string Hello(bool secret, const std::string& nonce) {
  std::string out(kMagic, 4);
  out.push_back(static_cast<char>(kVersion & 0xff));
  out.push_back(static_cast<char>(kVersion >> 8));
  out.push_back(secret ? 1 : 0);
  out.push_back(0);
  out += nonce;
  return out;
}

// Parses a hello (the first kHelloBytes of `bytes`): the peer's flags and nonce.
absl::Status ParseHello(const std::string& bytes, bool* secret, std::string* nonce) {
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return absl::UnauthenticatedError("kv: the peer did not start a Tandem KV handshake");
  }
  const uint16_t version = static_cast<uint8_t>(bytes[4]) | static_cast<uint8_t>(bytes[5]) << 8;
  if (version != kVersion) {
    return absl::UnauthenticatedError(
        absl::StrFormat("kv: handshake version %d, want %d", version, kVersion));
  }
  *secret = (bytes[6] & 1) != 0;
  *nonce = bytes.substr(8, kNonceBytes);
  return absl::OkStatus();
}

absl::Status RequireRole(SecureSocket& sock, PeerRole role) {
  const RoleSet roles = sock.PeerRoles();
  if (!roles.Has(role)) {
    return absl::UnauthenticatedError(absl::StrFormat(
        "kv: the peer's certificate names role %s, not %s", roles.ToString(), RoleName(role)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvAuth> MakeKvAuth(std::optional<ClusterSecret> secret, const TlsConfig& tls,
                                  bool receiver) {
  KvAuth auth;
  auth.secret = std::move(secret);
  if (tls.mutual()) {
    auto ctx = receiver ? SslContext::ForServer(tls) : SslContext::ForClient(tls);
    if (!ctx.ok()) return ctx.status();
    auth.tls = *std::move(ctx);
  }
  if (!auth.secured()) {
    return absl::InvalidArgumentError(
        "kv tcp: needs a cluster secret (--cluster-secret-file) or mutual TLS (--tls-cert, "
        "--tls-key, --tls-ca): the KV port is never open");
  }
  return auth;
}

KvSession::KvSession(const ClusterSecret& secret, std::string_view receiver_nonce,
                     std::string_view sender_nonce, bool receiver) {
  std::string context(receiver_nonce);
  context.append(sender_nonce);
  auto to_receiver = std::make_unique<HmacSha256>(secret.DeriveKey(kToReceiverLabel, context));
  auto to_sender = std::make_unique<HmacSha256>(secret.DeriveKey(kToSenderLabel, context));
  send_ = receiver ? std::move(to_sender) : std::move(to_receiver);
  receive_ = receiver ? std::move(to_receiver) : std::move(to_sender);
}

std::string KvSession::Tag(std::string_view record) {
  if (!send_) return "";
  send_->Reset();
  send_->Update(Counter(sent_++));
  send_->Update(record);
  return send_->Final().substr(0, kKvFrameTagBytes);
}

void KvSession::BeginReceive() {
  if (!receive_) return;
  receive_->Reset();
  receive_->Update(Counter(received_++));
}

void KvSession::ReceivePart(std::string_view bytes) {
  if (receive_) receive_->Update(bytes);
}

bool KvSession::ReceivedTagValid(std::string_view tag) {
  if (!receive_) return tag.empty();
  return ConstantTimeEquals(receive_->Final().substr(0, kKvFrameTagBytes), tag);
}

bool KvSession::Open(std::string_view record, std::string_view tag) {
  BeginReceive();
  ReceivePart(record);
  return ReceivedTagValid(tag);
}

std::string SealKvFrame(KvSession& session, std::string_view frame) {
  const std::string_view header = frame.substr(0, std::min(frame.size(), kKvFrameHeaderBytes));
  const std::string_view payload = frame.substr(header.size());
  std::string out(header);
  out += session.Tag(header);
  out.append(payload);
  out += session.Tag(payload);
  return out;
}

absl::StatusOr<std::unique_ptr<KvSession>> AuthenticateKvConnection(SecureSocket& sock,
                                                                    const KvAuth& auth,
                                                                    bool receiver,
                                                                    const std::atomic<bool>& stop,
                                                                    absl::Time deadline) {
  if (!auth.secured()) return absl::UnauthenticatedError("kv: no cluster credentials configured");
  if (sock.tls()) {
    if (absl::Status s = sock.Handshake(stop, deadline); !s.ok()) return s;
    if (absl::Status s = RequireRole(sock, receiver ? PeerRole::kPrefill : PeerRole::kDecode);
        !s.ok()) {
      return s;
    }
  }
  const bool have_secret = auth.secret.has_value();
  const std::string my_nonce = RandomBytes(kNonceBytes);
  const absl::Duration io = absl::Seconds(5);
  auto read = [&](size_t n, std::string* out) {
    out->assign(n, '\0');
    return sock.ReadFull(out->data(), n, stop, deadline, io);
  };
  auto mismatch = [&](bool peer_secret) {
    return absl::UnauthenticatedError(absl::StrFormat(
        "kv: the peer %s a cluster secret and this process %s: every worker of a cluster must "
        "use the same --cluster-secret-file",
        peer_secret ? "uses" : "does not use", have_secret ? "does" : "does not"));
  };
  if (receiver) {
    const std::string hello = Hello(have_secret, my_nonce);
    if (absl::Status s = sock.WriteAll(hello, {}, stop, io); !s.ok()) return s;
    std::string answer;
    if (absl::Status s = read(kAnswerBytes, &answer); !s.ok()) return s;
    bool peer_secret = false;
    std::string peer_nonce;
    if (absl::Status s = ParseHello(answer, &peer_secret, &peer_nonce); !s.ok()) return s;
    if (peer_secret != have_secret) return mismatch(peer_secret);
    std::string proof(ClusterSecret::kMacBytes, '\0');
    if (have_secret) {
      if (!auth.secret->Verify(kClientLabel, my_nonce + peer_nonce, answer.substr(kHelloBytes))) {
        return absl::UnauthenticatedError("kv: the peer's proof of the cluster secret is wrong");
      }
      proof = auth.secret->Mac(kServerLabel, peer_nonce + my_nonce);
    }
    if (absl::Status s = sock.WriteAll(proof, {}, stop, io); !s.ok()) return s;
    if (!have_secret) return std::make_unique<KvSession>();
    return std::make_unique<KvSession>(*auth.secret, my_nonce, peer_nonce, /*receiver=*/true);
  }
  std::string hello;
  if (absl::Status s = read(kHelloBytes, &hello); !s.ok()) return s;
  bool peer_secret = false;
  std::string peer_nonce;
  if (absl::Status s = ParseHello(hello, &peer_secret, &peer_nonce); !s.ok()) return s;
  if (peer_secret != have_secret) return mismatch(peer_secret);
  std::string answer = Hello(have_secret, my_nonce);
  answer += have_secret ? auth.secret->Mac(kClientLabel, peer_nonce + my_nonce)
                        : std::string(ClusterSecret::kMacBytes, '\0');
  if (absl::Status s = sock.WriteAll(answer, {}, stop, io); !s.ok()) return s;
  std::string proof;
  if (absl::Status s = read(ClusterSecret::kMacBytes, &proof); !s.ok()) return s;
  if (have_secret && !auth.secret->Verify(kServerLabel, my_nonce + peer_nonce, proof)) {
    return absl::UnauthenticatedError(
        "kv: the receiver's proof of the cluster secret is wrong (not this cluster's decode "
        "worker)");
  }
  if (!have_secret) return std::make_unique<KvSession>();
  return std::make_unique<KvSession>(*auth.secret, peer_nonce, my_nonce, /*receiver=*/false);
}

}  // namespace tandem
