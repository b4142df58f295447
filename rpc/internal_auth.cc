#include "rpc/internal_auth.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tandem {

// A parsed "v2.ROLE.UNIX_MS.NONCE.AUDIENCE.BODY.MAC" (the hex fields still hex).
struct InternalAuth::Token {
  std::string role, unix_ms, nonce, audience, body, mac;
  int64_t ms = 0;
};

namespace {

constexpr char kMacLabel[] = "tandem-grpc-v2";
// Nonces remembered at most; beyond it the oldest are dropped (a peer would need this many
// calls within the window to replay one).
constexpr size_t kMaxNonces = size_t{1} << 20;
constexpr size_t kNonceHex = 32;
constexpr size_t kInstanceHex = 32;
constexpr size_t kDigestHex = 64;

std::string MacMessage(std::string_view method, std::string_view role, std::string_view unix_ms,
                       std::string_view nonce, std::string_view audience, std::string_view body) {
  return absl::StrFormat("%s\n%s\n%s\n%s\n%s\n%s", method, role, unix_ms, nonce, audience, body);
}

grpc::Status Unauthenticated(std::string_view method, std::string_view why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrFormat("%s: %s; internal calls need the cluster's credentials "
                                      "(--cluster-secret-file, or a certificate naming a role)",
                                      method, why));
}

grpc::Status Forbidden(std::string_view method, RoleSet roles, RoleSet allowed) {
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrFormat("%s: a peer with role %s may not call it (allowed: %s)",
                                      method, roles.ToString(), allowed.ToString()));
}

bool IsHex(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The proof in `ctx`'s metadata, parsed; the refusal when there is none or it is malformed.
grpc::Status ParseToken(const grpc::ServerContextBase& ctx, std::string_view method,
                        std::vector<std::string>* parts) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kClusterAuthMetadata);
  if (it == md.end()) return Unauthenticated(method, "no cluster proof");
  *parts = absl::StrSplit(absl::string_view(it->second.data(), it->second.size()), '.');
  if (!parts->empty() && (*parts)[0] != "v2") {
    return Unauthenticated(
        method, absl::StrFormat("a cluster proof of version %s, not v2 (every process of a "
                                "cluster must run the same release)",
                                (*parts)[0].substr(0, 8)));
  }
  int64_t ms = 0;
  if (parts->size() != 7 || !absl::SimpleAtoi((*parts)[2], &ms) || !IsHex((*parts)[3], kNonceHex) ||
      !((*parts)[4].empty() || IsHex((*parts)[4], kInstanceHex)) ||
      !IsHex((*parts)[5], kDigestHex) || !IsHex((*parts)[6], 2 * ClusterSecret::kMacBytes)) {
    return Unauthenticated(method, "a malformed cluster proof");
  }
  return grpc::Status::OK;
}

}  // namespace

std::string MessageDigest(const google::protobuf::MessageLite& m) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    m.SerializePartialToCodedStream(&coded);
  }
  return Sha256(bytes);
}

InternalAuth::InternalAuth(std::optional<ClusterSecret> secret, bool require_role_certificates)
    : secret_(std::move(secret)),
      require_role_certificates_(require_role_certificates),
      instance_id_(HexEncode(RandomBytes(kInstanceHex / 2))) {}

grpc::Status InternalAuth::Check(grpc::ServerContextBase* ctx, std::string_view method,
                                 RoleSet allowed, const google::protobuf::MessageLite* request,
                                 std::string* identity) {
  if (identity != nullptr) identity->clear();
  ctx->AddTrailingMetadata(kInstanceMetadata, instance_id_);
  if (!secret_ && !require_role_certificates_) {
    return Unauthenticated(method, "this process has no cluster credentials");
  }
  if (require_role_certificates_) {
    if (grpc::Status s = CheckRole(*ctx, method, allowed, identity); !s.ok()) return s;
  }
  if (!secret_) return grpc::Status::OK;
  return CheckProof(*ctx, method, allowed, request);
}

grpc::Status InternalAuth::CheckRole(const grpc::ServerContextBase& ctx, std::string_view method,
                                     RoleSet allowed, std::string* identity) const {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  std::string pem;
  if (auth != nullptr) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
      pem.assign(v.data(), v.size());
    }
  }
  const RoleSet roles = RolesOfCertificate(pem);
  if (roles.empty()) return Unauthenticated(method, "the peer's certificate names no role");
  if (!roles.Intersects(allowed)) return Forbidden(method, roles, allowed);
  if (identity != nullptr) {
    std::string subject;
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
      subject.assign(v.data(), v.size());
    }
    *identity = absl::StrFormat("%s [%s]", subject, roles.ToString());
  }
  return grpc::Status::OK;
}

grpc::Status InternalAuth::CheckProof(const grpc::ServerContextBase& ctx, std::string_view method,
                                      RoleSet allowed,
                                      const google::protobuf::MessageLite* request) {
  std::vector<std::string> p;
  if (grpc::Status s = ParseToken(ctx, method, &p); !s.ok()) return s;
  const std::string& role = p[1];
  const std::string& nonce = p[3];
  const std::string& audience = p[4];
  const std::string& body = p[5];
  if (!secret_->Verify(kMacLabel, MacMessage(method, role, p[2], nonce, audience, body),
                       *HexDecode(p[6]))) {
    return Unauthenticated(method, "the cluster proof does not verify");
  }
  // The proof is genuine; whether it is for this call is what remains.
  if (audience != instance_id_) {
    return Unauthenticated(
        method, absl::StrFormat("the cluster proof is for instance \"%s\", not this process "
                                "(%s): a proof is good at one process only",
                                audience, instance_id_));
  }
  const absl::Time now = absl::Now();
  int64_t unix_ms = 0;
  (void)absl::SimpleAtoi(p[2], &unix_ms);
  const absl::Time at = absl::FromUnixMillis(unix_ms);
  if (at < now - kClockSkew || at > now + kClockSkew) {
    return Unauthenticated(
        method, absl::StrFormat("the cluster proof is %s old (clocks more than %s apart?)",
                                absl::FormatDuration(now - at), absl::FormatDuration(kClockSkew)));
  }
  const RoleSet claimed = RoleOfUri(absl::StrFormat("urn:tandem:role:%s", role));
  if (!claimed.Intersects(allowed)) return Forbidden(method, claimed, allowed);
  if (request != nullptr && HexEncode(MessageDigest(*request)) != body) {
    return Unauthenticated(method, "the cluster proof was made for another message");
  }
  if (!FirstUse(nonce, now)) return Unauthenticated(method, "a replayed cluster proof");
  return grpc::Status::OK;
}

grpc::Status InternalAuth::CheckFirstMessage(const grpc::ServerContextBase& ctx,
                                             std::string_view method,
                                             const google::protobuf::MessageLite& first) const {
  if (!secret_) return grpc::Status::OK;
  std::vector<std::string> p;
  if (grpc::Status s = ParseToken(ctx, method, &p); !s.ok()) return s;
  if (HexEncode(MessageDigest(first)) != p[5]) {
    return Unauthenticated(method, "the cluster proof was made for another message");
  }
  return grpc::Status::OK;
}

bool InternalAuth::FirstUse(const std::string& nonce, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  // A proof is valid for kClockSkew either side of its time, so a nonce must be remembered
  // for twice that.
  while (!seen_order_.empty() &&
         (seen_order_.front().first < now - 2 * kClockSkew || seen_order_.size() >= kMaxNonces)) {
    seen_.erase(seen_order_.front().second);
    seen_order_.pop_front();
  }
  if (!seen_.insert(nonce).second) return false;
  seen_order_.emplace_back(now, nonce);
  return true;
}

std::string InternalAuth::Proof(std::string_view method, PeerRole as, std::string_view audience,
                                const google::protobuf::MessageLite& request) const {
  if (!secret_) return "";
  const std::string role = RoleName(as);
  const std::string unix_ms = absl::StrCat(absl::ToUnixMillis(absl::Now()));
  const std::string nonce = HexEncode(RandomBytes(kNonceHex / 2));
  const std::string body = HexEncode(MessageDigest(request));
  const std::string mac =
      secret_->Mac(kMacLabel, MacMessage(method, role, unix_ms, nonce, audience, body));
  return absl::StrFormat("v2.%s.%s.%s.%s.%s.%s", role, unix_ms, nonce, audience, body,
                         HexEncode(mac));
}

void InternalAuth::Attach(grpc::ClientContext* ctx, std::string_view method, PeerRole as,
                          const std::string& address,
                          const google::protobuf::MessageLite& request) const {
  if (secret_)
    ctx->AddMetadata(kClusterAuthMetadata, Proof(method, as, AudienceAt(address), request));
}

std::string InternalAuth::AudienceAt(const std::string& address) const {
  std::lock_guard<std::mutex> lock(audience_mu_);
  auto it = audience_.find(address);
  return it == audience_.end() ? std::string() : it->second;
}

void InternalAuth::SetAudience(const std::string& address, const std::string& instance) const {
  if (!instance.empty() && !IsHex(instance, kInstanceHex)) return;
  std::lock_guard<std::mutex> lock(audience_mu_);
  if (instance.empty()) {
    audience_.erase(address);
  } else {
    audience_[address] = instance;
  }
}

bool InternalAuth::LearnAudience(const std::string& address, const grpc::ClientContext& ctx) const {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find(kInstanceMetadata);
  if (it == md.end()) return false;
  const std::string instance(it->second.data(), it->second.size());
  if (!IsHex(instance, kInstanceHex)) return false;
  std::lock_guard<std::mutex> lock(audience_mu_);
  std::string& known = audience_[address];
  const bool changed = known != instance;
  known = instance;
  return changed;
}

grpc::Status InternalAuth::Call(
    const std::string& address, std::string_view method, PeerRole as,
    const google::protobuf::MessageLite& request,
    const std::function<void(grpc::ClientContext*)>& prepare,
    const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    if (prepare) prepare(&ctx);
    // The instance this proof names; calls to the same address from other threads may learn the
    // right one meanwhile, so a retry is decided against this, not against what is known now.
    const std::string named = AudienceAt(address);
    if (secret_) ctx.AddMetadata(kClusterAuthMetadata, Proof(method, as, named, request));
    grpc::Status s = call(&ctx);
    LearnAudience(address, ctx);
    const bool learned = AudienceAt(address) != named;
    if (attempt > 0 || !learned || !secret_ ||
        s.error_code() != grpc::StatusCode::UNAUTHENTICATED) {
      return s;
    }
  }
}

}  // namespace tandem
