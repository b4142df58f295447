// tandem-router: the public tandem.v1.Generation API and the tandem.v1.Registry the workers
// report to. For each request: validate (router/ingress.h), tokenize, admit on a decode worker
// (the decode stream), prefill on a prefill worker into that lease, then relay the tokens with
// incremental detokenization and stop strings. A client cancel or deadline cancels both calls,
// which frees the blocks on both workers.
#ifndef TANDEM_ROUTER_ROUTER_H_
#define TANDEM_ROUTER_ROUTER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "absl/time/time.h"
#include "engine/model_config.h"
#include "engine/sampling/output_constraint.h"
#include "kv_transfer/kv_transfer.h"
#include "metrics/metrics.h"
#include "router/admission.h"
#include "router/cluster_view.h"
#include "router/ingress.h"
#include "router/registry.h"
#include "router/tenant_quota.h"
#include "rpc/api_keys.h"
#include "rpc/internal_auth.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "text/tokenizer.h"

namespace tandem {

namespace async {
class Executor;
class Signal;
class Timer;
}  // namespace async

struct RouterOptions;

namespace router_internal {

// What a request's steps use (router/generate_transaction.h), fixed for the router's life: the
// model, the options, the runtime, and the cluster (its state only behind ClusterView's lock).
struct RequestContext {
  const ModelConfig* config = nullptr;
  const Tokenizer* tokenizer = nullptr;
  OutputConstraints* constraints = nullptr;
  const RouterOptions* options = nullptr;
  RouterMetrics* metrics = nullptr;
  async::Executor* executor = nullptr;
  async::Timer* timer = nullptr;
  const std::atomic<bool>* draining = nullptr;
  ClusterView* cluster = nullptr;
};

}  // namespace router_internal

struct RouterOptions {
  std::string model_name;
  int heartbeat_interval_ms = 500;
  RegistryOptions registry;
  int decode_attempts = 3;  // decode workers tried per admission when one refuses
  IngressLimits limits;
  // Fault tolerance: a request whose worker dies or whose KV transfer fails is resumed on other
  // workers (prompt + tokens streamed so far) at most this many times.
  int max_resumes = 3;
  // A prefill (compute and KV transfer) taking longer is abandoned and resumed elsewhere.
  absl::Duration prefill_timeout = absl::Seconds(30);
  // Overload: requests in flight at once; requests waiting for decode room, and how long.
  // Beyond either: RESOURCE_EXHAUSTED with a retry hint of `retry_after_ms`.
  int max_in_flight = 16384;
  int max_queued = 16384;
  absl::Duration queue_timeout = absl::Seconds(10);
  int retry_after_ms = 200;
  // Bytes of long texts (64 KiB and more) the router tokenizes at once, over every request
  // (text/encode_budget.h): tokenizing costs tens of times the text in transient memory.
  size_t encode_budget_bytes = size_t{8} << 20;
  // Keepalive pings on the channels to workers: a peer silent this long (plus half as much for
  // the ping's answer) is declared gone, failing its calls with UNAVAILABLE.
  int keepalive_ms = 10000;
  // Bearer tokens required on the Generation API (none: open).
  ApiKeys api_keys;
  // The credentials of the calls to workers (rpc/tls.h MakePeerChannelCredentials); nullptr:
  // plaintext.
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials;
  // The cluster's credentials: checked on every registry call, proven on every call to a
  // worker. Required for the registry to answer.
  std::shared_ptr<InternalAuth> internal_auth;
  // Threads that run the requests' steps between their waits (validation, tokenizing, token
  // relay and detokenizing); a request holds none while it waits.
  int event_threads = 2;
};

// A Generate call as the event-driven front ends make it (the gRPC reactor, the HTTP API).
struct AsyncCall {
  absl::Time deadline = absl::InfiniteFuture();  // the client's deadline
  // Fired by the front end when the client goes away (cancel, disconnect); null: never.
  std::shared_ptr<async::Signal> gone;
  // Sends one message to the client and calls `done(sent)` once it is taken (false: the client
  // is gone), possibly before returning. The next write comes after `done`.
  std::function<void(const v1::GenerateResponse&, std::function<void(bool)> done)> write;
  std::string caller;  // as StreamCall's
  std::string tenant;
  // The caller's API key's limits (Router::LimitsOf), kept per tenant (router/tenant_quota.h).
  KeyLimits limits;
};

// A Generate call made by a caller that waits for it (GenerateStream: tests, tools).
struct StreamCall {
  absl::Time deadline = absl::InfiniteFuture();  // the client's deadline
  // Polled every few ms: true once the client went away (cancel, disconnect).
  std::function<bool()> cancelled;
  // Sends one message to the client; false when the client is gone.
  std::function<bool(const v1::GenerateResponse&)> write;
  // The namespace of the ids this caller chooses (router/request_id.h CallerNamespace): a
  // request_id is unique among the caller's requests in flight only, and never collides with
  // another caller's. Empty: "local".
  std::string caller;
  // Who the request counts for in the line for KV room (router/admission.h): its API key, else
  // its client's address. Empty: one tenant with every other empty one.
  std::string tenant;
};

class Router {
 public:
  // `metrics` (nullptr: none) must outlive the router.
  Router(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, RouterOptions options,
         RouterMetrics* metrics = nullptr);
  ~Router();

  // The public API (Generation), for the public port.
  grpc::Service* generation_service() { return generation_.get(); }
  // The registry the workers report to, for the internal port only.
  grpc::Service* registry_service() { return registry_service_.get(); }

  // OK when the `authorization` header value passes the API keys (UNAUTHENTICATED naming the
  // header otherwise). The gRPC adaptor and the HTTP API call it before anything else. A refusal
  // of a generation call (`generation`: gRPC Generate, HTTP completions) counts in
  // tandem_requests_total, where generation calls count every outcome; other calls' do not.
  grpc::Status Authorize(std::string_view authorization, bool generation) const;

  // Whether API keys guard the API (only valid keys get past Authorize).
  bool api_keys_enabled() const { return options_.api_keys.enabled(); }
  // The limits of the key an `authorization` header presents (none without keys).
  KeyLimits LimitsOf(std::string_view authorization) const {
    return options_.api_keys.LimitsOf(
        absl::string_view(authorization.data(), authorization.size()));
  }

  // Graceful drain: new requests are UNAVAILABLE from now on; those in flight finish.
  void BeginDrain() { draining_ = true; }

  // Workers registered and healthy, per role.
  int HealthyWorkers(WorkerRole role);
  // Requests in flight (the leak check for the router).
  int InFlight();
  // The model's tokenizer and configuration (the HTTP API renders chat prompts and token texts).
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelConfig& config() const { return config_; }

  // The whole request: validation, admission, prefill, the token stream, resumes, as a coroutine
  // that holds no thread while it waits. Written messages are the gRPC API's; `done` gets the
  // final status (metrics count it), after the request has left the router's books.
  void StartGenerate(const v1::GenerateRequest& req, AsyncCall call,
                     std::function<void(grpc::Status)> done);
  // StartGenerate, waited for on the calling thread (`call.cancelled` polled every few ms).
  grpc::Status GenerateStream(const v1::GenerateRequest& req, const StreamCall& call);

  // RPC bodies (public for the service adaptors). Generate is the gRPC stream's reactor (it
  // deletes itself when the call is done); `auth` is the API keys' verdict, refused at once
  // when not OK.
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* req,
                                                           grpc::Status auth);
  grpc::Status Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                     v1::ScoreResponse* resp);
  // Score with a deadline (the HTTP API's prompt log-probabilities).
  grpc::Status Score(const v1::ScoreRequest& req, absl::Time deadline, v1::ScoreResponse* resp);
  grpc::Status Tokenize(const v1::TokenizeRequest* req, v1::TokenizeResponse* resp);
  grpc::Status Detokenize(const v1::DetokenizeRequest* req, v1::DetokenizeResponse* resp);
  grpc::Status GetModelInfo(v1::ModelInfo* resp);
  // `identity`: the peer's, as InternalAuth::Check found it.
  grpc::Status Register(const v1::RegisterRequest* req, const std::string& identity,
                        v1::RegisterResponse* resp);
  grpc::Status Heartbeat(const v1::HeartbeatRequest* req, const std::string& identity,
                         v1::HeartbeatResponse* resp);
  grpc::Status ListWorkers(v1::ListWorkersResponse* resp);

 private:
  void ScheduleSweep();  // the next health sweep, unless the router is stopping
  // Sets the per-worker health gauges (a collect hook: health changes with time).
  void UpdateWorkerMetrics();
  // Drops workers silent for longer than options_.registry.forget_after (and their channels).
  void ForgetSilent(ClusterView::Locked& cluster, absl::Time now);

  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  RouterOptions options_;
  RouterMetrics* metrics_;
  int metrics_hook_ = 0;
  std::unique_ptr<grpc::Service> generation_;
  std::unique_ptr<grpc::Service> registry_service_;
  // Stopped first in the destructor: the cluster view (it waits for the decode streams gRPC
  // holds), the timer (it posts), then the pool (it runs what was posted).
  std::unique_ptr<async::Executor> executor_;
  std::unique_ptr<async::Timer> timer_;
  std::unique_ptr<ClusterView> cluster_;
  std::mutex sweep_mu_;
  bool stopping_ = false;  // under sweep_mu_
  // Constrained requests' schemas for this vocabulary: a request that ends at EOS is checked to
  // hold a whole value. Borrows tokenizer_ (initialized before it).
  std::unique_ptr<OutputConstraints> constraints_ = std::make_unique<OutputConstraints>(
      std::shared_ptr<const Tokenizer>(std::shared_ptr<void>(), tokenizer_.get()));
  std::atomic<bool> draining_{false};
  // What every request's steps use (router/generate_transaction.h); set once, after the above.
  router_internal::RequestContext request_context_;
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_ROUTER_H_
