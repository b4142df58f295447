// The cluster credentials of the tests: one cluster secret per test process, in a file for the
// tandem-server processes they start, and the InternalAuth with which the tests themselves call
// the internal ports (as an operator's tool holding the secret would).
#ifndef TANDEM_TESTS_CLUSTER_AUTH_H_
#define TANDEM_TESTS_CLUSTER_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "rpc/internal_auth.h"
#include "security/cluster_secret.h"
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

// Adds the cluster's proof to a call to an internal port, made as `as`.
inline void ProveCluster(grpc::ClientContext* ctx, const char* method,
                         PeerRole as = PeerRole::kRouter) {
  TestInternalAuth()->Attach(ctx, method, as);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_CLUSTER_AUTH_H_
