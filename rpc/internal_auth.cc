#include "rpc/internal_auth.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tandem {
namespace {

constexpr char kMacLabel[] = "tandem-grpc-v1";
// Nonces remembered at most; beyond it the oldest are dropped (a peer would need this many
// calls within the window to replay one).
constexpr size_t kMaxNonces = size_t{1} << 20;

std::string MacMessage(std::string_view method, std::string_view role, std::string_view unix_ms,
                       std::string_view nonce) {
  return absl::StrFormat("%s\n%s\n%s\n%s", method, role, unix_ms, nonce);
}

grpc::Status Unauthenticated(std::string_view method, std::string_view why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrFormat("%s: %s; internal calls need the cluster's credentials "
                                      "(--cluster-secret-file, or a certificate naming a role)",
                                      method, why));
}

}  // namespace

InternalAuth::InternalAuth(std::optional<ClusterSecret> secret, bool require_role_certificates)
    : secret_(std::move(secret)), require_role_certificates_(require_role_certificates) {}

grpc::Status InternalAuth::Check(const grpc::ServerContext& ctx, std::string_view method,
                                 RoleSet allowed, std::string* identity) {
  if (identity != nullptr) identity->clear();
  if (!secret_ && !require_role_certificates_) {
    return Unauthenticated(method, "this process has no cluster credentials");
  }
  if (require_role_certificates_) {
    const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    std::string pem;
    if (auth != nullptr) {
      for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
        pem.assign(v.data(), v.size());
      }
    }
    const RoleSet roles = RolesOfCertificate(pem);
    if (roles.empty()) return Unauthenticated(method, "the peer's certificate names no role");
    if (!roles.Intersects(allowed)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrFormat("%s: a peer with role %s may not call it (allowed: %s)",
                                          method, roles.ToString(), allowed.ToString()));
    }
    if (identity != nullptr) {
      std::string subject;
      for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
        subject.assign(v.data(), v.size());
      }
      *identity = absl::StrFormat("%s [%s]", subject, roles.ToString());
    }
  }
  if (!secret_) return grpc::Status::OK;

  const auto& md = ctx.client_metadata();
  auto it = md.find(kClusterAuthMetadata);
  if (it == md.end()) return Unauthenticated(method, "no cluster proof");
  const std::string token(it->second.data(), it->second.size());
  std::vector<std::string> parts = absl::StrSplit(token, '.');
  int64_t unix_ms = 0;
  if (parts.size() != 5 || parts[0] != "v1" || !absl::SimpleAtoi(parts[2], &unix_ms)) {
    return Unauthenticated(method, "a malformed cluster proof");
  }
  const std::optional<std::string> mac = HexDecode(parts[4]);
  if (!mac || parts[3].size() != 32 ||
      !secret_->Verify(kMacLabel, MacMessage(method, parts[1], parts[2], parts[3]), *mac)) {
    return Unauthenticated(method, "the cluster proof does not verify");
  }
  const absl::Time now = absl::Now();
  const absl::Time at = absl::FromUnixMillis(unix_ms);
  if (at < now - kClockSkew || at > now + kClockSkew) {
    return Unauthenticated(
        method, absl::StrFormat("the cluster proof is %s old (clocks more than %s apart?)",
                                absl::FormatDuration(now - at), absl::FormatDuration(kClockSkew)));
  }
  const RoleSet claimed = RoleOfUri(absl::StrFormat("urn:tandem:role:%s", parts[1]));
  if (!claimed.Intersects(allowed)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrFormat("%s: a peer with role %s may not call it (allowed: %s)",
                                        method, claimed.ToString(), allowed.ToString()));
  }
  if (!FirstUse(parts[3], now)) {
    return Unauthenticated(method, "a replayed cluster proof");
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

std::string InternalAuth::Proof(std::string_view method, PeerRole as) const {
  if (!secret_) return "";
  const std::string role = RoleName(as);
  const std::string unix_ms = absl::StrCat(absl::ToUnixMillis(absl::Now()));
  const std::string nonce = HexEncode(RandomBytes(16));
  const std::string mac = secret_->Mac(kMacLabel, MacMessage(method, role, unix_ms, nonce));
  return absl::StrFormat("v1.%s.%s.%s.%s", role, unix_ms, nonce, HexEncode(mac));
}

void InternalAuth::Attach(grpc::ClientContext* ctx, std::string_view method, PeerRole as) const {
  if (secret_) ctx->AddMetadata(kClusterAuthMetadata, Proof(method, as));
}

}  // namespace tandem
