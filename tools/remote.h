// The `tandem` CLI's client side of a running cluster (no gRPC in this header): streaming
// generation through a router, and `tandem up`, which starts a local cluster.
#ifndef TANDEM_TOOLS_REMOTE_H_
#define TANDEM_TOOLS_REMOTE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sampling/sampler.h"
#include "rpc/tls.h"

namespace tandem {

struct RemoteGenerateRequest {
  std::string router;  // host:port
  std::string prompt;
  SamplingParams sampling;
  int max_tokens = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool speculative = true;  // false: opts out of the decode workers' speculation
  double timeout_seconds = 600;
  ClientSecurity security;  // TLS files and the API key
};

struct RemoteGenerateResult {
  std::vector<int> tokens;
  std::string finish_reason;
  double ttft_seconds = 0;
  double e2e_seconds = 0;
};

// Streams the completion; `on_text` gets each text delta.
absl::StatusOr<RemoteGenerateResult> RemoteGenerate(
    const RemoteGenerateRequest& req, const std::function<void(std::string_view)>& on_text);

struct ClusterOptions {
  std::string model;
  std::string tokenizer;  // empty: found next to the model
  int prefill = 1;
  int decode = 1;
  int router_port = 0;
  int http_port = 0;          // the router's OpenAI-compatible HTTP API
  std::string server_binary;  // tandem-server; default: next to the running executable
  std::vector<std::string> extra_worker_flags;
  std::vector<std::string> extra_router_flags;
  // The prefill workers' --cpu-nice: on one host they share the cores with the decode workers,
  // and a decode step that waits for a prompt's matrix products is a stalled stream.
  int prefill_nice = 10;
  // Instead: the prefill workers at SCHED_IDLE (--cpu-idle), computing only on CPU time the
  // decode workers and the router leave (tandem up --prefill-idle).
  bool prefill_idle = false;
  // A worker that exits is started again (with a growing delay, 5 times a minute at most);
  // false: any exit stops the cluster.
  bool restart_workers = true;
  TlsFlags tls;               // passed to every process; the readiness probe uses them too
  std::string api_keys_file;  // passed to the router
  // The cluster's secret for every process; empty: a new one in a private temporary folder,
  // removed when the cluster stops.
  std::string cluster_secret_file;
};

class InternalAuth;

// The cluster secret of processes started here: the file given, or a new secret in a private
// temporary folder that is removed with this object.
class LocalClusterSecret {
 public:
  static absl::StatusOr<std::unique_ptr<LocalClusterSecret>> Make(const std::string& file = "");
  ~LocalClusterSecret();
  // For --cluster-secret-file.
  const std::string& file() const { return file_; }
  // This process's proofs to the cluster's internal ports.
  const InternalAuth& auth() const { return *auth_; }

 private:
  LocalClusterSecret() = default;
  std::string dir_;
  std::string file_;
  std::unique_ptr<InternalAuth> auth_;
};

// Waits (up to 60 s) until the router whose internal port is `router_internal` lists `n`
// healthy workers, asking with `auth`'s proof; `credentials` null: plaintext.
bool WaitForWorkers(const std::string& router_internal, int n, const InternalAuth& auth,
                    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// `tandem up`: starts a router and the workers on 127.0.0.1, prints "ready router=HOST:PORT"
// once every worker is registered and healthy, "internal router=HOST:PORT secret=FILE" (where
// more workers can register, and the secret they need), then "metrics ROLE=HOST:PORT" for each
// process
// and "http router=HOST:PORT" (the OpenAI-compatible API), and stops them all on SIGINT/SIGTERM (or
// when a child dies). Returns the exit code.
int RunLocalCluster(const ClusterOptions& options);

}  // namespace tandem

#endif  // TANDEM_TOOLS_REMOTE_H_
