// The cluster credentials of the tests: one cluster secret per test process, in a file for the
// tandem-server processes they start, and the InternalAuth with which the tests themselves call
// the internal ports (as an operator's tool holding the secret would).
#ifndef TANDEM_TESTS_CLUSTER_AUTH_H_
#define TANDEM_TESTS_CLUSTER_AUTH_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "rpc/internal_auth.h"
#include "security/cluster_secret.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/test_util.h"

namespace tandem::testing {

inline const std::string& TestClusterSecretFile() {
  static TempDir dir;
  static const std::string path = [] {
    const std::string p = dir.path() + "/cluster.secret";
    if (!ClusterSecret::GenerateFile(p).ok()) std::abort();
    return p;
  }();
  return path;
}

inline const ClusterSecret& TestClusterSecret() {
  static const ClusterSecret secret = *ClusterSecret::Load(TestClusterSecretFile());
  return secret;
}

// The flags that give a tandem-server the test cluster's secret.
inline std::vector<std::string> ClusterSecretFlags() {
  return {"--cluster-secret-file", TestClusterSecretFile()};
}

inline std::shared_ptr<InternalAuth> TestInternalAuth() {
  static const std::shared_ptr<InternalAuth> auth =
      std::make_shared<InternalAuth>(TestClusterSecret(), /*require_role_certificates=*/false);
  return auth;
}

// The instance id of the process serving `method` at `address`, as its refusal of a call
// without a proof names it (and now known to TestInternalAuth); "" when it did not answer.
inline std::string ProbeInstance(const std::string& address, const char* method,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr) {
  grpc::GenericStub stub(
      grpc::CreateChannel(address, credentials ? credentials : grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<void> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status) { done.set_value(); });
  done.get_future().wait();
  TestInternalAuth()->LearnAudience(address, ctx);
  return TestInternalAuth()->AudienceAt(address);
}

// Adds the cluster's proof to a call of `method` over `request` (a stream's first message) to
// the process at `address`, made as `as`.
inline void ProveCluster(grpc::ClientContext* ctx, const char* method, const std::string& address,
                         const google::protobuf::MessageLite& request,
                         PeerRole as = PeerRole::kRouter) {
  if (TestInternalAuth()->AudienceAt(address).empty()) ProbeInstance(address, method);
  TestInternalAuth()->Attach(ctx, method, as, address, request);
}

// ListWorkers on a router's internal port through `stub`, with the cluster's proof.
inline v1::ListWorkersResponse ListWorkers(const std::string& router_internal,
                                           v1::Registry::Stub* stub,
                                           grpc::Status* status = nullptr) {
  const v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  const grpc::Status s = TestInternalAuth()->Call(
      router_internal, internal_method::kListWorkers, PeerRole::kRouter, req,
      [](grpc::ClientContext* ctx) {
        ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      },
      [&](grpc::ClientContext* ctx) { return stub->ListWorkers(ctx, req, &resp); });
  if (status != nullptr) *status = s;
  return resp;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_CLUSTER_AUTH_H_
