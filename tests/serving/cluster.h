// Real Tandem processes on 127.0.0.1 for the integration tests: a router plus workers (or one
// --role=all process), each on port 0, stopped (SIGTERM, then SIGKILL) when the object dies.
#ifndef TANDEM_TESTS_SERVING_CLUSTER_H_
#define TANDEM_TESTS_SERVING_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/cluster_auth.h"
#include "tests/test_util.h"
#include "tools/server_process.h"

namespace tandem::testing {

// TLS and API keys for a cluster (tests/security).
struct ClusterSecurity {
  std::vector<std::string> all_flags;     // every process (--tls-*)
  std::vector<std::string> router_flags;  // the router only (--api-keys-file)
  // The credentials of this object's channel to the router; nullptr: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

class Cluster {
 public:
  // prefill == 0 && decode == 0: one `tandem-server --role=all` process.
  // `router_flags` go to the router (or the --role=all process) only; `model` replaces
  // stories260K's --model and --tokenizer flags.
  Cluster(int prefill, int decode, std::vector<std::string> worker_flags = {},
          std::vector<std::string> router_flags = {}, std::vector<std::string> model = {}) {
    Init(prefill, decode, std::move(worker_flags), {}, std::move(router_flags), std::move(model));
  }
  // With TLS flags for every process and API keys for the router (security tests).
  Cluster(int prefill, int decode, std::vector<std::string> worker_flags,
          const ClusterSecurity& security) {
    Init(prefill, decode, std::move(worker_flags), security, {}, {});
  }

 private:
  void Init(int prefill, int decode, std::vector<std::string> worker_flags,
            const ClusterSecurity& security, std::vector<std::string> router_flags,
            std::vector<std::string> model) {
    if (model.empty()) model = {"--model", Stories260K(), "--tokenizer", Tok512()};
    model.insert(model.end(), security.all_flags.begin(), security.all_flags.end());
    const std::vector<std::string> secret = ClusterSecretFlags();
    model.insert(model.end(), secret.begin(), secret.end());
    router_flags.insert(router_flags.end(), security.router_flags.begin(),
                        security.router_flags.end());
    if (prefill == 0 && decode == 0) {
      std::vector<std::string> argv = {"--role=all"};
      argv.insert(argv.end(), model.begin(), model.end());
      argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
      argv.insert(argv.end(), router_flags.begin(), router_flags.end());
      router_ = Start(argv);
      expected_workers_ = 2;
    } else {
      std::vector<std::string> argv = {"--role=router", "--heartbeat-ms", "100"};
      argv.insert(argv.end(), model.begin(), model.end());
      argv.insert(argv.end(), router_flags.begin(), router_flags.end());
      router_ = Start(argv);
      for (int i = 0; i < prefill + decode; ++i) {
        std::vector<std::string> w = {i < prefill ? "--role=prefill" : "--role=decode", "--router",
                                      router_internal_};
        w.insert(w.end(), model.begin(), model.end());
        w.insert(w.end(), worker_flags.begin(), worker_flags.end());
        workers_.push_back(Start(w));
      }
      expected_workers_ = prefill + decode;
    }
    auto credentials =
        security.credentials ? security.credentials : grpc::InsecureChannelCredentials();
    channel_ = grpc::CreateChannel(router_, credentials);
    internal_channel_ = grpc::CreateChannel(router_internal_, credentials);
    generation_ = v1::Generation::NewStub(channel_);
    registry_ = v1::Registry::NewStub(internal_channel_);
    ready_ = WaitHealthy(expected_workers_);
  }

 public:
  ~Cluster() {
    // Close our channel first: the servers' graceful shutdown waits on open client channels.
    generation_.reset();
    registry_.reset();
    channel_.reset();
    internal_channel_.reset();
    StopProcesses(pids_);
  }

  bool ready() const { return ready_; }
  // The router's public gRPC API, and its internal port (the registry).
  const std::string& router() const { return router_; }
  const std::string& router_internal() const { return router_internal_; }
  const std::vector<std::string>& workers() const { return workers_; }
  v1::Generation::Stub* generation() { return generation_.get(); }
  std::vector<pid_t>& pids() { return pids_; }
  // The /metrics address (HOST:PORT) of each process, in start order: the router first.
  const std::vector<std::string>& metrics() const { return metrics_; }
  // The router's OpenAI-compatible HTTP API (HOST:PORT).
  const std::string& http() const { return http_; }

  v1::ListWorkersResponse Workers() { return ListWorkers(router_internal_, registry_.get()); }

  // The leak check across processes: every worker reports all KV blocks free and nothing
  // queued or running (waits for the heartbeats to catch up).
  bool AllBlocksFree(int timeout_ms = 5000) {
    for (int waited = 0; waited < timeout_ms; waited += 50) {
      bool all = true;
      const v1::ListWorkersResponse workers = Workers();
      for (const auto& w : workers.workers()) {
        all &= w.load().free_kv_blocks() == w.load().total_kv_blocks() &&
               w.load().running_requests() == 0 && w.load().queue_depth() == 0;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  // Starts tandem-server with `args`; returns the address it prints.
  std::string Start(const std::vector<std::string>& args) {
    const ServerProcess p = StartServerProcess(BinDir() + "/tandem-server", args);
    if (p.pid > 0) pids_.push_back(p.pid);
    metrics_.push_back(p.metrics);
    if (http_.empty()) http_ = p.http;  // the router starts first
    if (router_internal_.empty()) router_internal_ = p.internal;
    return p.address;
  }

  bool WaitHealthy(int n) {
    for (int i = 0; i < 200; ++i) {
      int healthy = 0;
      const v1::ListWorkersResponse workers = Workers();
      for (const auto& w : workers.workers()) healthy += w.healthy();
      if (healthy >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::vector<pid_t> pids_;
  std::vector<std::string> metrics_;
  std::string http_;
  std::string router_;
  std::string router_internal_;
  std::vector<std::string> workers_;
  int expected_workers_ = 0;
  bool ready_ = false;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> internal_channel_;
  std::unique_ptr<v1::Generation::Stub> generation_;
  std::unique_ptr<v1::Registry::Stub> registry_;
};

struct Streamed {
  grpc::Status status;
  std::vector<int> tokens;
  std::vector<float> logprobs;  // with sampling.logprobs
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  int messages = 0;
  v1::Timings last_timings;  // the timings of the last message
};

// Runs one Generate call to the end.
inline Streamed Generate(v1::Generation::Stub* stub, const v1::GenerateRequest& req,
                         int deadline_ms = 60000) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  auto reader = stub->Generate(&ctx, req);
  Streamed out;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    ++out.messages;
    out.tokens.insert(out.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    for (const v1::TokenLogprobs& l : resp.logprobs()) out.logprobs.push_back(l.logprob());
    out.text += resp.text();
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.finish = resp.finish_reason();
    out.last_timings = resp.timings();
  }
  out.status = reader->Finish();
  return out;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SERVING_CLUSTER_H_
