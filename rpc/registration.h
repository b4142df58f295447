// A worker's link to the routers: `--router HOST:PORT` where HOST may be a DNS name that
// resolves to several router replicas (a Kubernetes headless Service). The worker registers
// with, then heartbeats its load to, every address the name resolves to, re-resolving
// periodically; it registers again when a router forgets it or restarts. On shutdown it sends
// each router a last heartbeat with serving=false, so no new request is routed to it.
#ifndef TANDEM_RPC_REGISTRATION_H_
#define TANDEM_RPC_REGISTRATION_H_

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/scheduling/scheduler.h"
#include "rpc/internal_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

// "HOST:PORT" or "[IPV6]:PORT" -> every address HOST resolves to (A and AAAA records, or the
// literal itself), as sorted, distinct "IP:PORT" / "[IP]:PORT" strings. INVALID_ARGUMENT for a
// malformed target, UNAVAILABLE when the name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveHostPort(const std::string& target);

// "HOST:PORT", bracketing an IPv6 literal.
std::string JoinHostPort(const std::string& host, int port);

struct RegistrationOptions {
  absl::Duration resolve_interval = absl::Seconds(10);      // re-resolving the router name
  absl::Duration retry_interval = absl::Milliseconds(200);  // before a router accepted us
  // Of the channels to the routers (nullptr: plaintext); TLS/mTLS from rpc/tls.h.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The cluster's proof on every call (the routers' registries refuse calls without it).
  std::shared_ptr<const InternalAuth> auth;
};

class RegistrationClient {
 public:
  // `router`: HOST:PORT as given to --router (validated by ResolveHostPort's rules; a name
  // that does not resolve yet is retried). `load`, `serving` and `draining` (nullptr: never)
  // are called from the link threads.
  RegistrationClient(std::string router, v1::RegisterRequest base,
                     std::function<WorkerLoadSnapshot()> load, std::function<bool()> serving,
                     std::function<bool()> draining = nullptr, RegistrationOptions options = {});
  ~RegistrationClient();

  // Routers (resolved addresses) this worker is registered with now.
  std::vector<std::string> registered_with() const;
  bool registered() const { return !registered_with().empty(); }

 private:
  class Link;
  void Run();

  const std::string router_;
  const v1::RegisterRequest base_;
  const std::function<WorkerLoadSnapshot()> load_;
  const std::function<bool()> serving_;
  const std::function<bool()> draining_;
  const RegistrationOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, std::unique_ptr<Link>> links_;  // by resolved address
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_RPC_REGISTRATION_H_
