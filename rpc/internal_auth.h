// Authentication of the cluster's internal gRPC calls: the registry on the router, the prefill
// and decode worker services, the NCCL bootstrap. These live on internal ports only, and each
// call must prove that it comes from the cluster:
//   - with a cluster secret (security/cluster_secret.h): metadata `x-tandem-cluster-auth` holds
//     "v1.ROLE.UNIX_MS.NONCE.MAC", MAC = HMAC-SHA256 over the method, the caller's role, the
//     time and a random nonce. The time must be within kClockSkew of the server's and a nonce is
//     accepted once, so a recorded proof cannot be replayed or moved to another method;
//   - under mutual TLS: the peer's certificate must name a role (security/tls_config.h) allowed
//     to make the call.
// When both are configured, both are required. Health checks stay open on every port (they
// reveal only whether the process serves).
#ifndef TANDEM_RPC_INTERNAL_AUTH_H_
#define TANDEM_RPC_INTERNAL_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "security/cluster_secret.h"
#include "security/tls_config.h"

namespace tandem {

// The internal methods and the roles that may call them.
namespace internal_method {
inline constexpr char kRegister[] = "/tandem.v1.Registry/Register";
inline constexpr char kHeartbeat[] = "/tandem.v1.Registry/Heartbeat";
inline constexpr char kListWorkers[] = "/tandem.v1.Registry/ListWorkers";
inline constexpr char kPrefill[] = "/tandem.v1.PrefillWorker/Prefill";
inline constexpr char kPrefillScore[] = "/tandem.v1.PrefillWorker/Score";
inline constexpr char kDecode[] = "/tandem.v1.DecodeWorker/Decode";
inline constexpr char kNcclBootstrap[] = "/tandem.v1.DecodeWorker/NcclBootstrap";
}  // namespace internal_method

inline constexpr char kClusterAuthMetadata[] = "x-tandem-cluster-auth";

class InternalAuth {
 public:
  static constexpr absl::Duration kClockSkew = absl::Seconds(120);

  // `secret`: the cluster secret (nullopt: no secret proofs). `require_role_certificates`: the
  // ports run mutual TLS and peers must show a role. At least one must be set: internal
  // surfaces are never open.
  InternalAuth(std::optional<ClusterSecret> secret, bool require_role_certificates);

  // Server side, first thing in every internal handler. OK when the call carries a valid proof
  // for `method` and its peer holds a role in `allowed`. UNAUTHENTICATED when a proof or role
  // certificate is missing or wrong, PERMISSION_DENIED for a cluster role that may not make
  // this call. `identity` (may be null) receives who the peer is under mutual TLS (its
  // certificate's subject and roles), empty otherwise.
  grpc::Status Check(const grpc::ServerContext& ctx, std::string_view method, RoleSet allowed,
                     std::string* identity = nullptr);

  // Client side: adds the proof for `method`, made as `as` (nothing without a secret).
  void Attach(grpc::ClientContext* ctx, std::string_view method, PeerRole as) const;
  // The metadata value Attach adds: a fresh proof each call.
  std::string Proof(std::string_view method, PeerRole as) const;

  bool has_secret() const { return secret_.has_value(); }
  bool requires_role_certificates() const { return require_role_certificates_; }

 private:
  // Records `nonce` as seen; false when it was seen within the window (a replay).
  bool FirstUse(const std::string& nonce, absl::Time now);

  const std::optional<ClusterSecret> secret_;
  const bool require_role_certificates_;
  std::mutex mu_;
  absl::flat_hash_set<std::string> seen_;                      // nonces within the window
  std::deque<std::pair<absl::Time, std::string>> seen_order_;  // oldest first
};

}  // namespace tandem

#endif  // TANDEM_RPC_INTERNAL_AUTH_H_
