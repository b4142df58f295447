// tandem-router: the public tandem.v1.Generation API and the tandem.v1.Registry the workers
// report to. For each request: validate (router/ingress.h), tokenize, admit on a decode worker
// (the decode stream), prefill on a prefill worker into that lease, then relay the tokens with
// incremental detokenization and stop strings. A client cancel or deadline cancels both calls,
// which frees the blocks on both workers.
#ifndef TANDEM_ROUTER_ROUTER_H_
#define TANDEM_ROUTER_ROUTER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "metrics/metrics.h"
#include "router/ingress.h"
#include "router/registry.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

struct RouterOptions {
  std::string model_name;
  int heartbeat_interval_ms = 500;
  RegistryOptions registry;
  int decode_attempts = 3;  // decode workers tried when one has no room
  IngressLimits limits;
};

class Router {
 public:
  // `metrics` (nullptr: none) must outlive the router.
  Router(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, RouterOptions options,
         RouterMetrics* metrics = nullptr);
  ~Router();

  grpc::Service* generation_service() { return generation_.get(); }
  grpc::Service* registry_service() { return registry_service_.get(); }

  // Workers registered and healthy, per role.
  int HealthyWorkers(WorkerRole role);
  // Requests in flight (the leak check for the router).
  int InFlight();

  // RPC bodies (public for the service adaptors).
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer);
  grpc::Status Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                     v1::ScoreResponse* resp);
  grpc::Status Tokenize(const v1::TokenizeRequest* req, v1::TokenizeResponse* resp);
  grpc::Status Detokenize(const v1::DetokenizeRequest* req, v1::DetokenizeResponse* resp);
  grpc::Status GetModelInfo(v1::ModelInfo* resp);
  grpc::Status Register(const v1::RegisterRequest* req, v1::RegisterResponse* resp);
  grpc::Status Heartbeat(const v1::HeartbeatRequest* req, v1::HeartbeatResponse* resp);
  grpc::Status ListWorkers(v1::ListWorkersResponse* resp);

 private:
  // Generate without the per-status count.
  grpc::Status RunGenerate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                           grpc::ServerWriter<v1::GenerateResponse>* writer);
  // Sets the per-worker health gauges (a collect hook: health changes with time).
  void UpdateWorkerMetrics();
  // Drops workers silent for longer than options_.registry.forget_after (and their channels).
  void ForgetSilentWorkersLocked(absl::Time now);
  std::shared_ptr<grpc::Channel> ChannelFor(const std::string& address);
  std::optional<std::string> AddressOf(const std::string& worker_id);

  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  RouterOptions options_;
  RouterMetrics* metrics_;
  int metrics_hook_ = 0;
  std::unique_ptr<grpc::Service> generation_;
  std::unique_ptr<grpc::Service> registry_service_;

  std::mutex mu_;
  WorkerRegistry registry_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  std::set<std::string> in_flight_;
  std::atomic<uint64_t> next_request_{1};
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_ROUTER_H_
