#include "router/router.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "router/async.h"
#include "router/generate_transaction.h"
#include "router/request_id.h"
#include "router/router_services.h"
#include "rpc/grpc_util.h"
#include "text/encode_budget.h"

namespace tandem {
namespace {

WorkerLoadSnapshot FromProto(const v1::WorkerLoad& p) {
  WorkerLoadSnapshot l;
  l.queue_depth = p.queue_depth();
  l.running = p.running_requests();
  l.free_blocks = p.free_kv_blocks();
  l.total_blocks = p.total_kv_blocks();
  l.block_size = p.block_size();
  l.growth_blocks = p.growth_kv_blocks();
  l.watermark_blocks = p.watermark_kv_blocks();
  l.reserves_max_tokens = p.reserves_max_tokens();
  l.kv_group_window.assign(p.kv_group_window().begin(), p.kv_group_window().end());
  return l;
}

// How often the open requests' worker calls are checked against the workers' health.
constexpr absl::Duration kSweepEvery = absl::Milliseconds(100);

const char* RoleName(WorkerRole role) {
  return role == WorkerRole::kPrefill ? "prefill" : "decode";
}

}  // namespace

Router::Router(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, RouterOptions options,
               RouterMetrics* metrics)
    : config_(std::move(config)),
      tokenizer_(WithEncodeBudget(std::move(tokenizer), options.encode_budget_bytes)),
      options_(options),
      metrics_(metrics),
      generation_(MakeGenerationService(this)),
      registry_service_(MakeRegistryService(this, options.internal_auth.get())),
      executor_(std::make_unique<async::Executor>(options.event_threads)),
      timer_(std::make_unique<async::Timer>()),
      cluster_(std::make_unique<ClusterView>(
          ClusterViewOptions{options.registry, options.max_queued, options.keepalive_ms,
                             options.worker_credentials, options.internal_auth},
          executor_.get())) {
  request_context_ = {&config_,     tokenizer_.get(), constraints_.get(),
                      &options_,    metrics_,         executor_.get(),
                      timer_.get(), &draining_,       cluster_.get()};
  if (metrics_) {
    metrics_hook_ = metrics_->registry.AddCollectHook([this] { UpdateWorkerMetrics(); });
  }
  ScheduleSweep();
}

Router::~Router() {
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    stopping_ = true;
  }
  cluster_.reset();  // waits for the decode streams gRPC still holds
  timer_.reset();
  executor_.reset();
  if (metrics_) metrics_->registry.RemoveCollectHook(metrics_hook_);
}

void Router::ScheduleSweep() {
  std::lock_guard<std::mutex> lock(sweep_mu_);
  if (stopping_) return;
  timer_->At(absl::Now() + kSweepEvery, [this] {
    executor_->Post([this] {
      {
        std::lock_guard<std::mutex> lock(sweep_mu_);
        if (stopping_) return;
      }
      cluster_->SweepCalls();
      ScheduleSweep();
    });
  });
}

void Router::ForgetSilent(ClusterView::Locked& cluster, absl::Time now) {
  for (const WorkerEntry& w : cluster.ForgetSilent(now)) {
    std::fprintf(stderr, "[router] forgot worker %s at %s: no heartbeat for %s\n", w.id.c_str(),
                 w.address.c_str(), absl::FormatDuration(now - w.last_seen).c_str());
    if (metrics_) metrics_->worker_healthy(w.id, RoleName(w.role)).Set(0);
  }
}

void Router::UpdateWorkerMetrics() {
  ClusterView::Locked cluster = cluster_->Lock();
  const absl::Time now = absl::Now();
  ForgetSilent(cluster, now);
  for (const WorkerEntry* w : cluster.registry().List()) {
    metrics_->worker_healthy(w->id, RoleName(w->role))
        .Set(cluster.registry().Healthy(*w, now) ? 1 : 0);
  }
}

grpc::Status Router::Authorize(std::string_view authorization, bool generation) const {
  if (options_.api_keys.Allows(absl::string_view(authorization.data(), authorization.size()))) {
    return grpc::Status::OK;
  }
  if (metrics_ && generation) metrics_->requests(grpc::StatusCode::UNAUTHENTICATED).Increment();
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      authorization.empty()
                          ? "authorization: a bearer token is required (\"Bearer KEY\")"
                          : "authorization: the bearer token is not a known API key");
}

int Router::HealthyWorkers(WorkerRole role) {
  return cluster_->Lock().registry().CountHealthy(role, absl::Now());
}

int Router::InFlight() { return static_cast<int>(cluster_->Lock().in_flight().size()); }

namespace {

// A gRPC caller's tenant, as HTTP's (http/client_address.h): its API key's namespace, else its
// address without the port ("ipv4:10.0.0.5:41234" -> "addr:10.0.0.5").
std::string GrpcTenant(std::string_view key, const std::string& peer) {
  if (!key.empty()) return CallerNamespace(key, "");
  std::string_view host = peer;
  if (const size_t scheme = host.find(':'); scheme != std::string_view::npos) {
    host.remove_prefix(scheme + 1);  // "ipv4:" / "ipv6:"
  }
  if (const size_t port = host.rfind(':'); port != std::string_view::npos) {
    host = host.substr(0, port);
  }
  return "addr:" + std::string(host);
}

}  // namespace

namespace {

// One gRPC Generate stream: the request runs as a coroutine (Router::StartGenerate); its
// messages are written one at a time, and a client's cancel or deadline (OnCancel) fires the
// request's `gone` signal, which cancels its worker calls.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(grpc::CallbackServerContext* ctx, int retry_after_ms, RouterMetrics* metrics)
      : ctx_(ctx), retry_after_ms_(retry_after_ms), metrics_(metrics) {}

  void Run(Router* r, const v1::GenerateRequest& req, AsyncCall call) {
    call.gone = gone_;
    call.write = [this](const v1::GenerateResponse& m, std::function<void(bool)> done) {
      out_ = m;
      write_done_ = std::move(done);
      StartWrite(&out_);
    };
    r->StartGenerate(req, std::move(call), [this](grpc::Status s) { End(s); });
  }

  void End(const grpc::Status& s) {
    // A Generate call is one sequence: n = 1 (HttpServer counts the HTTP API's n).
    if (s.ok() && metrics_) metrics_->request_params_n.Observe(1);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // gRPC's retry pushback: a well-behaved client waits this long before trying again.
      ctx_->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(retry_after_ms_));
    }
    Finish(s);
  }

  void OnWriteDone(bool ok) override { std::exchange(write_done_, nullptr)(ok); }
  void OnCancel() override { gone_->Fire(); }
  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* ctx_;
  const int retry_after_ms_;
  RouterMetrics* metrics_;
  std::shared_ptr<async::Signal> gone_ = std::make_shared<async::Signal>();
  v1::GenerateResponse out_;
  std::function<void(bool)> write_done_;
};

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* Router::Generate(grpc::CallbackServerContext* ctx,
                                                                 const v1::GenerateRequest* req,
                                                                 grpc::Status auth) {
  auto* reactor = new GenerateReactor(ctx, options_.retry_after_ms, metrics_);
  if (!auth.ok()) {
    reactor->End(auth);
    return reactor;
  }
  AsyncCall call;
  call.deadline = DeadlineOf(ctx);
  // The caller's ids live in its key's namespace (any connection presenting it), else in its
  // connection's.
  const auto& md = ctx->client_metadata();
  const auto auth_header = md.find("authorization");
  const absl::string_view key = options_.api_keys.enabled() && auth_header != md.end()
                                    ? ApiKeys::BearerToken(absl::string_view(
                                          auth_header->second.data(), auth_header->second.size()))
                                    : absl::string_view();
  call.caller = CallerNamespace(std::string_view(key.data(), key.size()), ctx->peer());
  call.tenant = GrpcTenant(std::string_view(key.data(), key.size()), ctx->peer());
  if (auth_header != md.end()) {
    call.limits =
        LimitsOf(std::string_view(auth_header->second.data(), auth_header->second.size()));
  }
  reactor->Run(this, *req, std::move(call));
  return reactor;
}

void Router::StartGenerate(const v1::GenerateRequest& req, AsyncCall call,
                           std::function<void(grpc::Status)> done) {
  auto txn = std::make_shared<router_internal::GenerateTransaction>(request_context_, req,
                                                                    std::move(call));
  async::Task<grpc::Status> run = txn->Run();
  async::Spawn<grpc::Status>(
      std::move(run),
      [this, txn = std::move(txn), done = std::move(done)](grpc::Status s) mutable {
        txn.reset();  // off the books before the caller hears of the end
        if (metrics_) metrics_->requests(s.error_code()).Increment();
        done(s);
      },
      [](const std::exception& e) {
        // A bug, not the client's fault: this request fails, the router keeps serving.
        return grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrFormat("internal error: %s", e.what()));
      });
}

grpc::Status Router::GenerateStream(const v1::GenerateRequest& req, const StreamCall& call) {
  AsyncCall ac;
  ac.deadline = call.deadline;
  ac.caller = call.caller;
  ac.tenant = call.tenant;
  ac.gone = std::make_shared<async::Signal>();
  ac.write = [&call](const v1::GenerateResponse& m, std::function<void(bool)> done) {
    done(call.write(m));
  };
  std::mutex mu;
  std::condition_variable cv;
  std::optional<grpc::Status> result;
  StartGenerate(req, ac, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    result = s;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  while (!cv.wait_for(lock, std::chrono::milliseconds(5), [&] { return result.has_value(); })) {
    if (call.cancelled && !ac.gone->fired()) {
      lock.unlock();
      if (call.cancelled()) ac.gone->Fire();
      lock.lock();
    }
  }
  return *result;
}

grpc::Status Router::Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                           v1::ScoreResponse* resp) {
  return Score(*req, DeadlineOf(ctx), resp);
}

grpc::Status Router::Score(const v1::ScoreRequest& request, absl::Time deadline,
                           v1::ScoreResponse* resp) {
  const v1::ScoreRequest* req = &request;
  if (req->top_logprobs() < 0 || req->top_logprobs() > kMaxTopLogprobs) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("top_logprobs: must be in [0, %d], got %d", kMaxTopLogprobs,
                                        req->top_logprobs()));
  }
  // A score needs a token to predict and one to predict it from.
  absl::StatusOr<std::vector<int>> prompt = ValidatePrompt(
      req->has_text() ? &req->text() : nullptr, req->has_tokens() ? &req->tokens() : nullptr,
      config_, *tokenizer_, options_.limits, {.min_tokens = 2, .max_tokens = config_.max_seq_len});
  if (!prompt.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(prompt.status().code()),
                        std::string(prompt.status().message()));
  }
  const std::vector<int>& ids = *prompt;
  std::optional<std::string> pick;
  pick = cluster_->Lock().registry().PickPrefill({}, absl::Now(), {});
  if (!pick) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
  auto address = cluster_->AddressOf(*pick);
  if (!address) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker vanished");
  v1::PrefillScoreRequest preq;
  preq.mutable_token_ids()->Add(ids.begin(), ids.end());
  preq.set_top_logprobs(req->top_logprobs());
  v1::PrefillScoreResponse presp;
  grpc::ClientContext c;
  c.set_deadline(absl::ToChronoTime(deadline));
  cluster_->Prove(&c, internal_method::kPrefillScore, *address, preq);
  grpc::Status s =
      v1::PrefillWorker::NewStub(cluster_->ChannelFor(*address))->Score(&c, preq, &presp);
  cluster_->Learn(*address, c);
  if (!s.ok()) return s;
  resp->mutable_token_ids()->Add(ids.begin(), ids.end());
  double nll = 0;
  for (float lp : presp.logprobs()) {
    resp->add_logprobs(lp);
    nll -= lp;
  }
  nll /= std::max(1, presp.logprobs_size());
  *resp->mutable_top_logprobs() = presp.top_logprobs();
  *resp->mutable_ranks() = presp.ranks();
  resp->set_mean_cross_entropy(nll);
  resp->set_perplexity(std::exp(nll));
  return grpc::Status::OK;
}

grpc::Status Router::Tokenize(const v1::TokenizeRequest* req, v1::TokenizeResponse* resp) {
  if (req->text().size() > static_cast<size_t>(options_.limits.max_text_bytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("text: %d bytes, more than the %d-byte limit",
                                        req->text().size(), options_.limits.max_text_bytes));
  }
  const auto ids = tokenizer_->Encode(req->text(), req->add_special_tokens());
  resp->mutable_token_ids()->Add(ids.begin(), ids.end());
  return grpc::Status::OK;
}

grpc::Status Router::Detokenize(const v1::DetokenizeRequest* req, v1::DetokenizeResponse* resp) {
  // As many ids as a context holds, with room for a client's concatenations.
  const int64_t max_ids = std::max<int64_t>(int64_t{4} * config_.max_seq_len, 1 << 16);
  if (req->token_ids_size() > max_ids) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("token_ids: %d ids, more than the limit of %d",
                                        req->token_ids_size(), max_ids));
  }
  std::vector<int> ids(req->token_ids().begin(), req->token_ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tokenizer_->vocab_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("token_ids: id %d at index %d is outside [0, %d)", ids[i],
                                          i, tokenizer_->vocab_size()));
    }
  }
  resp->set_text(ToValidUtf8(tokenizer_->Decode(ids)));
  return grpc::Status::OK;
}

grpc::Status Router::GetModelInfo(v1::ModelInfo* resp) {
  resp->set_model(options_.model_name);
  resp->set_architecture(config_.architecture);
  resp->set_vocab_size(config_.vocab_size);
  resp->set_max_context(config_.max_seq_len);
  resp->set_bos_token_id(config_.bos_token_id);
  for (int e : config_.eos_token_ids) resp->add_eos_token_ids(e);
  resp->set_prefill_workers(HealthyWorkers(WorkerRole::kPrefill));
  resp->set_decode_workers(HealthyWorkers(WorkerRole::kDecode));
  return grpc::Status::OK;
}

grpc::Status Router::Register(const v1::RegisterRequest* req, const std::string& identity,
                              v1::RegisterResponse* resp) {
  if (req->worker_id().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id: required");
  if (req->address().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "address: required");
  WorkerRole role;
  if (req->role() == v1::WORKER_ROLE_PREFILL) {
    role = WorkerRole::kPrefill;
  } else if (req->role() == v1::WORKER_ROLE_DECODE) {
    role = WorkerRole::kDecode;
  } else {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "role: must be PREFILL or DECODE");
  }
  {
    ClusterView::Locked cluster = cluster_->Lock();
    ForgetSilent(cluster, absl::Now());
    // A prefill worker cannot send KV to a decode worker of another transport or KV dtype:
    // refuse the newcomer rather than fail its requests one by one.
    if (const WorkerRegistry::KvConflict c = cluster.registry().FindKvConflict(
            req->worker_id(), req->kv_transport(), req->kv_dtype());
        c.other != nullptr) {
      const bool transport = std::string_view(c.field) == "kv_transport";
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrFormat("%s: this worker uses --%s=%s but worker %s (%s) uses %s; every "
                          "prefill and decode worker of a cluster must use the same",
                          c.field, transport ? "kv-transport" : "kv-dtype",
                          transport ? req->kv_transport() : req->kv_dtype(), c.other->id,
                          c.other->address, transport ? c.other->kv_transport : c.other->kv_dtype));
    }
    if (absl::Status s = cluster.registry().Register(req->worker_id(), role, req->address(),
                                                     FromProto(req->load()), absl::Now(),
                                                     {identity, req->kv_endpoint()});
        !s.ok()) {
      return ToGrpc(s);
    }
    cluster.registry().SetKvSettings(req->worker_id(), req->kv_transport(), req->kv_dtype());
    cluster.Notify();  // requests waiting for a worker of this role look again
  }
  // The router's calls to this worker prove themselves for this process alone.
  if (options_.internal_auth)
    options_.internal_auth->SetAudience(req->address(), req->instance_id());
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  return grpc::Status::OK;
}

grpc::Status Router::Heartbeat(const v1::HeartbeatRequest* req, const std::string& identity,
                               v1::HeartbeatResponse* resp) {
  {
    ClusterView::Locked cluster = cluster_->Lock();
    ForgetSilent(cluster, absl::Now());
    resp->set_known(cluster.registry().Heartbeat(req->worker_id(), FromProto(req->load()),
                                                 req->serving(), absl::Now(), req->draining(),
                                                 identity));
    cluster.Notify();  // fresh load: queued requests look for room again
  }
  return grpc::Status::OK;
}

grpc::Status Router::ListWorkers(v1::ListWorkersResponse* resp) {
  ClusterView::Locked cluster = cluster_->Lock();
  const absl::Time now = absl::Now();
  ForgetSilent(cluster, now);
  for (const WorkerEntry* w : cluster.registry().List()) {
    v1::WorkerInfo* info = resp->add_workers();
    info->set_worker_id(w->id);
    info->set_role(w->role == WorkerRole::kPrefill ? v1::WORKER_ROLE_PREFILL
                                                   : v1::WORKER_ROLE_DECODE);
    info->set_address(w->address);
    info->set_kv_endpoint(w->kv_endpoint);
    *info->mutable_load() = ToProto(w->load);
    info->set_healthy(cluster.registry().Healthy(*w, now));
  }
  return grpc::Status::OK;
}

}  // namespace tandem
