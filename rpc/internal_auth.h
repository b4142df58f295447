// Authentication of the cluster's internal gRPC calls: the registry on the router, the prefill
// and decode worker services, the NCCL bootstrap. These live on internal ports only, and each
// call must prove that it comes from the cluster:
//   - with a cluster secret (security/cluster_secret.h): metadata `x-tandem-cluster-auth` holds
//     "v2.ROLE.UNIX_MS.NONCE.AUDIENCE.BODY.MAC": MAC = HMAC-SHA256 over the method, the caller's
//     role, the time, a random nonce, the instance id of the process the call is for (AUDIENCE)
//     and the SHA-256 of the request message (BODY; for a stream, of its first message). A proof
//     is accepted once (its nonce is remembered for as long as its time is valid), within
//     kClockSkew of the server's clock, by the one process it names, for the one method and
//     message it was made for. A recorded proof is thus useless to an observer: replayed at the
//     same process it is a replay, at another process (or the same one restarted: a new
//     instance) it names someone else, with another message its hash differs;
//   - under mutual TLS: the peer's certificate must name a role (security/tls_config.h) allowed
//     to make the call.
// When both are configured, both are required. Health checks stay open on every port (they
// reveal only whether the process serves).
//
// Instance ids are not secret: every internal answer, refusals included, carries the server's in
// the trailing metadata `x-tandem-instance`, and a client that named an unknown or stale one
// learns it there and tries once more (Call). Routers learn workers' ids at registration.
// Request messages are hashed in protobuf's deterministic serialization: every process of a
// cluster must run the same protocol version.
#ifndef TANDEM_RPC_INTERNAL_AUTH_H_
#define TANDEM_RPC_INTERNAL_AUTH_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
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
inline constexpr char kInstanceMetadata[] = "x-tandem-instance";

// SHA-256 of `m`'s deterministic serialization: what a proof binds a call's message by.
std::string MessageDigest(const google::protobuf::MessageLite& m);

class InternalAuth {
 public:
  static constexpr absl::Duration kClockSkew = absl::Seconds(120);

  // `secret`: the cluster secret (nullopt: no secret proofs). `require_role_certificates`: the
  // ports run mutual TLS and peers must show a role. At least one must be set: internal
  // surfaces are never open. Each InternalAuth is one instance (a random id): a process makes
  // one and serves every internal port with it.
  InternalAuth(std::optional<ClusterSecret> secret, bool require_role_certificates);

  // This process's instance id (32 hex digits), the AUDIENCE its callers' proofs must name.
  const std::string& instance_id() const { return instance_id_; }

  // ---- Server side -------------------------------------------------------------------------
  // First thing in every internal handler. OK when the call carries a valid proof for `method`,
  // this instance and `request` (nullptr: a stream whose first message is checked later by
  // CheckFirstMessage), and its peer holds a role in `allowed`. UNAUTHENTICATED when a proof or
  // role certificate is missing or wrong, PERMISSION_DENIED for a cluster role that may not
  // make this call. `identity` (may be null) receives who the peer is under mutual TLS (its
  // certificate's subject and roles), empty otherwise. Adds this instance's id to the trailing
  // metadata.
  grpc::Status Check(grpc::ServerContextBase* ctx, std::string_view method, RoleSet allowed,
                     const google::protobuf::MessageLite* request, std::string* identity = nullptr);
  // A stream's first message against the hash its proof named (after Check passed).
  grpc::Status CheckFirstMessage(const grpc::ServerContextBase& ctx, std::string_view method,
                                 const google::protobuf::MessageLite& first) const;

  // ---- Client side -------------------------------------------------------------------------
  // The metadata value for a call of `method`, made as `as`, to the instance `audience` (""
  // when unknown: refused, and the refusal names the instance), over `request` (a stream's
  // first message). A fresh proof each call; "" without a secret.
  std::string Proof(std::string_view method, PeerRole as, std::string_view audience,
                    const google::protobuf::MessageLite& request) const;
  // Adds Proof(...) to `ctx`, for the instance last known at `address`.
  void Attach(grpc::ClientContext* ctx, std::string_view method, PeerRole as,
              const std::string& address, const google::protobuf::MessageLite& request) const;

  // The instance last known at `address` ("" when none).
  std::string AudienceAt(const std::string& address) const;
  // Records the instance at `address` (a registering worker's, say).
  void SetAudience(const std::string& address, const std::string& instance) const;
  // After a call to `address` finished: records the instance its trailing metadata named. True
  // when that differs from what was known at `address` (a call refused for that may now pass).
  bool LearnAudience(const std::string& address, const grpc::ClientContext& ctx) const;

  // A unary internal call with its proof: `call` makes it on a fresh context that `prepare`
  // (may be null) set up first. When the call was refused UNAUTHENTICATED because its proof
  // named an unknown or stale instance, it is made once more for the instance the refusal
  // named (a restarted server, or the first call to it).
  grpc::Status Call(const std::string& address, std::string_view method, PeerRole as,
                    const google::protobuf::MessageLite& request,
                    const std::function<void(grpc::ClientContext*)>& prepare,
                    const std::function<grpc::Status(grpc::ClientContext*)>& call) const;

  bool has_secret() const { return secret_.has_value(); }
  bool requires_role_certificates() const { return require_role_certificates_; }

 private:
  struct Token;
  // Records `nonce` as seen; false when it was seen within the window (a replay).
  bool FirstUse(const std::string& nonce, absl::Time now);
  grpc::Status CheckRole(const grpc::ServerContextBase& ctx, std::string_view method,
                         RoleSet allowed, std::string* identity) const;
  grpc::Status CheckProof(const grpc::ServerContextBase& ctx, std::string_view method,
                          RoleSet allowed, const google::protobuf::MessageLite* request);

  const std::optional<ClusterSecret> secret_;
  const bool require_role_certificates_;
  const std::string instance_id_;
  std::mutex mu_;
  absl::flat_hash_set<std::string> seen_;                      // nonces within the window
  std::deque<std::pair<absl::Time, std::string>> seen_order_;  // oldest first
  mutable std::mutex audience_mu_;
  mutable absl::flat_hash_map<std::string, std::string> audience_;  // address -> instance
};

}  // namespace tandem

#endif  // TANDEM_RPC_INTERNAL_AUTH_H_
