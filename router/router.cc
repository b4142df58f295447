#include "router/router.h"

#include <chrono>
#include <condition_variable>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/block_pool.h"
#include "engine/stop.h"
#include "rpc/grpc_util.h"

namespace tandem {
namespace {

// The public API; every call passes the API keys first.
class GenerationAdaptor final : public v1::Generation::Service {
 public:
  explicit GenerationAdaptor(Router* r) : r_(r) {}
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/true); !s.ok()) return s;
    return r_->Generate(ctx, req, writer);
  }
  grpc::Status Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                     v1::ScoreResponse* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->Score(ctx, req, resp);
  }
  grpc::Status Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                        v1::TokenizeResponse* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->Tokenize(req, resp);
  }
  grpc::Status Detokenize(grpc::ServerContext* ctx, const v1::DetokenizeRequest* req,
                          v1::DetokenizeResponse* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->Detokenize(req, resp);
  }
  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->GetModelInfo(resp);
  }

 private:
  grpc::Status Auth(grpc::ServerContext* ctx, bool generation) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string_view value = it == md.end()
                                       ? std::string_view()
                                       : std::string_view(it->second.data(), it->second.size());
    return r_->Authorize(value, generation);
  }
  Router* r_;
};

// The registry on the internal port: every call proves the cluster's credentials first.
class RegistryAdaptor final : public v1::Registry::Service {
 public:
  RegistryAdaptor(Router* r, InternalAuth* auth) : r_(r), auth_(auth) {}
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    std::string identity;
    const RoleSet allowed = req->role() == v1::WORKER_ROLE_PREFILL ? RoleSet(PeerRole::kPrefill)
                            : req->role() == v1::WORKER_ROLE_DECODE
                                ? RoleSet(PeerRole::kDecode)
                                : PeerRole::kPrefill | PeerRole::kDecode;
    if (grpc::Status s = Check(ctx, internal_method::kRegister, allowed, &identity); !s.ok()) {
      return s;
    }
    return r_->Register(req, identity, resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::string identity;
    if (grpc::Status s = Check(ctx, internal_method::kHeartbeat,
                               PeerRole::kPrefill | PeerRole::kDecode, &identity);
        !s.ok()) {
      return s;
    }
    return r_->Heartbeat(req, identity, resp);
  }
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    if (grpc::Status s = Check(ctx, internal_method::kListWorkers,
                               PeerRole::kRouter | PeerRole::kPrefill | PeerRole::kDecode, nullptr);
        !s.ok()) {
      return s;
    }
    return r_->ListWorkers(resp);
  }

 private:
  grpc::Status Check(grpc::ServerContext* ctx, const char* method, RoleSet allowed,
                     std::string* identity) {
    if (auth_ == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the router has no cluster credentials");
    }
    return auth_->Check(*ctx, method, allowed, identity);
  }
  Router* r_;
  InternalAuth* auth_;
};

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
  return l;
}

}  // namespace

namespace router_internal {

class CancelWatcher;

// One thread for every request's CancelWatcher (not a thread per request): every 5 ms it polls
// each watcher's client, every 100 ms the health of the workers they stream from.
class CancelHub {
 public:
  CancelHub() : thread_([this] { Run(); }) {}
  ~CancelHub() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Add(CancelWatcher* w) {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.insert(w);
  }
  // Once it returns, the hub no longer touches `w`.
  void Remove(CancelWatcher* w) {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.erase(w);
  }

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<CancelWatcher*> watchers_;
  bool stop_ = false;
  std::thread thread_;
};

// Cancels the client contexts of a request's worker calls when the router's own client goes
// away (`cancelled` turns true: a gRPC cancel or deadline, an HTTP disconnect), and a worker
// call whose worker turned unhealthy (WatchWorker). Polled by the router's CancelHub.
class CancelWatcher {
 public:
  CancelWatcher(CancelHub* hub, std::function<bool()> cancelled)
      : hub_(hub), cancelled_fn_(std::move(cancelled)) {
    hub_->Add(this);
  }
  ~CancelWatcher() { hub_->Remove(this); }
  void Watch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) c->TryCancel();
    watched_.insert(c);
  }
  void Unwatch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.erase(c);
    workers_.erase(c);
  }
  // Also cancels `c` when `bad` turns true (checked every 100 ms); abandoned(c) says so after.
  void WatchWorker(grpc::ClientContext* c, std::function<bool()> bad) {
    std::lock_guard<std::mutex> lock(mu_);
    workers_[c] = std::move(bad);
  }
  bool abandoned(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_.count(c) > 0;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

  // The hub's poll (on its thread, never concurrently with itself).
  void Poll(bool check_workers) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cancelled_ && cancelled_fn_) {
      lock.unlock();
      const bool gone = cancelled_fn_();
      lock.lock();
      if (gone) {
        cancelled_ = true;
        for (auto* c : watched_) c->TryCancel();
      }
    }
    if (!check_workers || workers_.empty()) return;
    auto workers = workers_;
    lock.unlock();
    std::vector<grpc::ClientContext*> bad;
    for (auto& [c, fn] : workers) {
      if (fn()) bad.push_back(c);
    }
    lock.lock();
    for (auto* c : bad) {
      if (workers_.erase(c) == 0) continue;  // unwatched meanwhile
      abandoned_.insert(c);
      c->TryCancel();
    }
  }

 private:
  CancelHub* hub_;
  std::function<bool()> cancelled_fn_;
  std::mutex mu_;
  std::set<grpc::ClientContext*> watched_;
  std::map<grpc::ClientContext*, std::function<bool()>> workers_;
  std::set<grpc::ClientContext*> abandoned_;
  bool cancelled_ = false;
};

void CancelHub::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (int64_t tick = 1; !stop_; ++tick) {
    for (CancelWatcher* w : watchers_) w->Poll(tick % 20 == 0);
    cv_.wait_for(lock, std::chrono::milliseconds(5));
  }
}

}  // namespace router_internal

namespace {

using router_internal::CancelWatcher;

double Since(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

const char* RoleName(WorkerRole role) {
  return role == WorkerRole::kPrefill ? "prefill" : "decode";
}

// A request counts as waiting until its first token is sent, then as running until it ends.
class PhaseGauges {
 public:
  explicit PhaseGauges(RouterMetrics* m) : m_(m) {
    if (m_) m_->num_requests_waiting.Increment();
  }
  ~PhaseGauges() {
    if (m_) (running_ ? m_->num_requests_running : m_->num_requests_waiting).Decrement();
  }
  void Running() {
    if (m_ && !running_) {
      m_->num_requests_waiting.Decrement();
      m_->num_requests_running.Increment();
    }
    running_ = true;
  }

 private:
  RouterMetrics* m_;
  bool running_ = false;
};

}  // namespace

Router::Router(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, RouterOptions options,
               RouterMetrics* metrics)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      metrics_(metrics),
      generation_(std::make_unique<GenerationAdaptor>(this)),
      registry_service_(std::make_unique<RegistryAdaptor>(this, options.internal_auth.get())),
      cancel_hub_(std::make_unique<router_internal::CancelHub>()),
      registry_(options.registry) {
  if (metrics_) {
    metrics_hook_ = metrics_->registry.AddCollectHook([this] { UpdateWorkerMetrics(); });
  }
}

Router::~Router() {
  if (metrics_) metrics_->registry.RemoveCollectHook(metrics_hook_);
}

void Router::ForgetSilentWorkersLocked(absl::Time now) {
  for (const WorkerEntry& w : registry_.ForgetSilent(now)) {
    std::fprintf(stderr, "[router] forgot worker %s at %s: no heartbeat for %s\n", w.id.c_str(),
                 w.address.c_str(), absl::FormatDuration(now - w.last_seen).c_str());
    if (metrics_) metrics_->worker_healthy(w.id, RoleName(w.role)).Set(0);
    channels_.erase(w.address);
  }
}

void Router::UpdateWorkerMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  ForgetSilentWorkersLocked(now);
  for (const WorkerEntry* w : registry_.List()) {
    metrics_->worker_healthy(w->id, RoleName(w->role)).Set(registry_.Healthy(*w, now) ? 1 : 0);
  }
}

std::shared_ptr<grpc::Channel> Router::ChannelFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ch = channels_[address];
  if (!ch) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options_.keepalive_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(1000, options_.keepalive_ms / 2));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    ch = grpc::CreateCustomChannel(address,
                                   options_.worker_credentials ? options_.worker_credentials
                                                               : grpc::InsecureChannelCredentials(),
                                   args);
  }
  return ch;
}

std::optional<std::string> Router::AddressOf(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerEntry* w = registry_.Find(worker_id);
  if (w == nullptr) return std::nullopt;
  return w->address;
}

void Router::Prove(grpc::ClientContext* ctx, const char* method) const {
  if (options_.internal_auth) options_.internal_auth->Attach(ctx, method, PeerRole::kRouter);
}

grpc::Status Router::CheckKvTarget(const std::string& decode_id, const KvTarget& target) {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerEntry* w = registry_.Find(decode_id);
  if (w == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("decode worker %s vanished", decode_id));
  }
  if (!w->kv_endpoint.empty() && target.endpoint != w->kv_endpoint) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("decode worker %s admitted with KV endpoint %s, not the "
                                        "%s it registered",
                                        decode_id, target.endpoint, w->kv_endpoint));
  }
  return grpc::Status::OK;
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
  std::lock_guard<std::mutex> lock(mu_);
  return registry_.CountHealthy(role, absl::Now());
}

int Router::InFlight() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(in_flight_.size());
}

namespace {
absl::Time DeadlineOf(const grpc::ServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}
}  // namespace

grpc::Status Router::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                              grpc::ServerWriter<v1::GenerateResponse>* writer) {
  StreamCall call;
  call.deadline = DeadlineOf(ctx);
  call.cancelled = [ctx] { return ctx->IsCancelled(); };
  call.write = [writer](const v1::GenerateResponse& r) { return writer->Write(r); };
  grpc::Status s = GenerateStream(*req, call);
  if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    // gRPC's retry pushback: a well-behaved client waits this long before trying again.
    ctx->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(options_.retry_after_ms));
  }
  return s;
}

grpc::Status Router::GenerateStream(const v1::GenerateRequest& req, const StreamCall& call) {
  grpc::Status s = RunGenerate(req, call);
  if (metrics_) metrics_->requests(s.error_code()).Increment();
  return s;
}

namespace {

// Whether a failed attempt may be resumed on other workers: the fault was a worker's or the
// KV transfer's, not the request's.
bool Resumable(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:        // a worker died or its stream broke
    case grpc::StatusCode::ABORTED:            // the KV transfer failed (refused, lost)
    case grpc::StatusCode::DATA_LOSS:          // a KV chunk failed its checksum
    case grpc::StatusCode::DEADLINE_EXCEEDED:  // an internal deadline (the client's is checked)
      return true;
    default:
      return false;
  }
}

// Whether a worker's answer means the worker failed (it died, misbehaved or is misconfigured),
// as opposed to a verdict on the request (INVALID_ARGUMENT), no room (RESOURCE_EXHAUSTED) or
// the client going away. Such a worker is reported to the registry, which ejects one that keeps
// failing.
bool WorkerFault(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return true;
    default:
      return false;
  }
}

}  // namespace

// One request, over as many attempts as faults require. An attempt admits `prompt + tokens
// streamed so far` on a decode worker, prefills it on a prefill worker and relays the decode
// worker's tokens; when a worker dies or the KV transfer fails, the next attempt resumes after
// the last token the client has, on workers that have not failed this request. Sampling is
// keyed by (seed, position), so the resumed tokens are the ones the failed worker would have
// produced.
grpc::Status Router::RunGenerate(const v1::GenerateRequest& req, const StreamCall& call) {
  const absl::Time t0 = absl::Now();
  if (draining_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "router is draining (shutting down); send to another replica");
  }
  auto parsed = ValidateGenerateRequest(req, config_, *tokenizer_, options_.limits);
  if (!parsed.ok()) return ToGrpc(parsed.status());
  const GenerationRequest& greq = *parsed;
  const int prompt_len = static_cast<int>(greq.prompt.size());

  std::string request_id = req.request_id();
  if (request_id.empty()) request_id = absl::StrFormat("req-%d", next_request_++);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(in_flight_.size()) >= options_.max_in_flight) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrFormat("router: %d requests in flight (the limit); retry after "
                                          "%d ms",
                                          options_.max_in_flight, options_.retry_after_ms));
    }
    if (!in_flight_.insert(request_id).second) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("request_id: \"%s\" is already in flight", request_id));
    }
  }
  struct InFlightGuard {
    Router* r;
    std::string id;
    ~InFlightGuard() {
      {
        std::lock_guard<std::mutex> lock(r->mu_);
        r->in_flight_.erase(id);
      }
      r->room_cv_.notify_all();
    }
  } in_flight_guard{this, request_id};
  PhaseGauges phase(metrics_);
  CancelWatcher watcher(cancel_hub_.get(), call.cancelled);
  // The client's own timer fires first and cancels the stream; our copy of its deadline (sent
  // as a relative timeout) lands a little later. A cancel that close to the deadline is the
  // deadline.
  auto client_gone = [&]() -> grpc::Status {
    if (absl::Now() + absl::Milliseconds(50) >= call.deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  };
  auto is_gone = [&] {
    return watcher.cancelled() || (call.cancelled && call.cancelled()) ||
           absl::Now() >= call.deadline;
  };

  // What the client has been sent (or is about to be): it survives the attempts.
  IncrementalDecoder detok(tokenizer_.get(), greq.prompt);
  StopStringMatcher stop(greq.stop_strings);
  std::vector<int> generated;
  std::optional<FinishReason> finish;
  v1::GenerateResponse resp;
  absl::Time admitted_at;
  v1::PrefillResponse first_presp;  // the first attempt's prefill (for the timings)
  // Adds one token (and its logprobs, when asked for) to `resp`; returns true when the request
  // ends with it.
  auto add_token = [&](int token, const v1::TokenLogprobs* logprobs) {
    generated.push_back(token);
    const int n = static_cast<int>(generated.size());
    resp.add_token_ids(token);
    if (logprobs != nullptr && greq.sampling.logprobs) *resp.add_logprobs() = *logprobs;
    finish = CheckFinish(config_, greq, token, n, prompt_len + n);
    if (finish == FinishReason::kStop) return true;  // EOS: no text
    bool stopped = false;
    resp.mutable_text()->append(stop.Add(detok.Add(token), &stopped));
    if (stopped) finish = FinishReason::kStop;
    return finish.has_value();
  };
  double ttft = 0;  // router receipt to the first token sent
  auto finish_response = [&]() {
    if (*finish != FinishReason::kStop) {
      bool stopped = false;
      std::string tail = stop.Add(detok.Flush(), &stopped);
      if (!stopped) tail += stop.Flush();
      resp.mutable_text()->append(tail);
    }
    resp.set_finish_reason(ToProto(*finish));
    resp.mutable_usage()->set_prompt_tokens(prompt_len);
    resp.mutable_usage()->set_completion_tokens(static_cast<int>(generated.size()));
    v1::Timings* t = resp.mutable_timings();
    t->set_queue_seconds(absl::ToDoubleSeconds(admitted_at - t0));
    t->set_prefill_seconds(first_presp.queue_seconds() + first_presp.compute_seconds() +
                           first_presp.kv_transfer_seconds());
    t->set_kv_transfer_seconds(first_presp.kv_transfer_seconds());
    t->set_ttft_seconds(ttft);
    t->set_e2e_seconds(Since(t0));
  };
  // Sends `resp` to the client and counts its tokens: the first one for TTFT, every later one
  // for the inter-token latency (a message of k tokens spreads its wait over the k).
  absl::Time last_token_at;
  auto write = [&]() {
    if (!call.write(resp)) return false;
    const int n = resp.token_ids_size();
    resp.Clear();
    resp.set_request_id(request_id);
    if (metrics_ == nullptr || n == 0) return true;
    const absl::Time now = absl::Now();
    if (last_token_at == absl::Time()) {
      metrics_->time_to_first_token.Observe(ttft);
      phase.Running();  // the first message holds the first token only
    } else {
      const double each = absl::ToDoubleSeconds(now - last_token_at) / n;
      for (int i = 0; i < n; ++i) metrics_->inter_token_latency.Observe(each);
    }
    last_token_at = now;
    metrics_->generation_tokens.Increment(n);
    return true;
  };
  resp.set_request_id(request_id);

  // Workers that failed this request: not picked again for it.
  std::set<std::string> failed_decode, failed_prefill;
  auto report = [&](const std::string& worker, std::set<std::string>* failed) {
    failed->insert(worker);
    std::lock_guard<std::mutex> lock(mu_);
    registry_.ReportFailure(worker, absl::Now());
  };

  // One attempt. OK: the request finished and its last message is written. Otherwise the
  // status says why (Resumable() ones may be retried, unless `final` is set: the request already
  // waited its bounded time for workers).
  bool final = false;
  auto attempt = [&]() -> grpc::Status {
    std::vector<int> prompt = greq.prompt;
    prompt.insert(prompt.end(), generated.begin(), generated.end());
    const int len = static_cast<int>(prompt.size());
    const int remaining = greq.max_tokens - static_cast<int>(generated.size());
    const int total_tokens =
        static_cast<int>(std::min<int64_t>(int64_t{len} + remaining, config_.max_seq_len));

    // 0. A role with no healthy worker (one stalled or restarting) is waited for, in the same
    //    bounded queue as requests waiting for room: a stall delays requests, it does not fail
    //    them.
    const absl::Time queue_until = std::min(call.deadline, absl::Now() + options_.queue_timeout);
    // Holds a place in the wait queue while the request waits for workers or room.
    struct QueueSlot {
      Router* r;
      bool held = false;
      ~QueueSlot() {
        if (!held) return;
        std::lock_guard<std::mutex> lock(r->mu_);
        --r->waiting_for_room_;
      }
    } queued{this};
    // Under mu_: takes a place in the queue (once); RESOURCE_EXHAUSTED when it is full.
    auto enqueue = [&]() -> grpc::Status {
      if (queued.held) return grpc::Status::OK;
      if (waiting_for_room_ >= options_.max_queued) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrFormat("no decode worker has room and %d requests are queued "
                                            "(the limit); retry after %d ms",
                                            options_.max_queued, options_.retry_after_ms));
      }
      ++waiting_for_room_;
      queued.held = true;
      return grpc::Status::OK;
    };
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        const absl::Time now = absl::Now();
        const bool prefill = registry_.CountHealthy(WorkerRole::kPrefill, now) > 0;
        const bool decode = registry_.CountHealthy(WorkerRole::kDecode, now) > 0;
        if (prefill && decode) break;
        if (grpc::Status s = enqueue(); !s.ok()) return s;
        if (is_gone()) return client_gone();
        if (now >= queue_until) {
          final = true;
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrFormat("no healthy %s worker within the queue timeout (%s)",
                                              prefill ? "decode" : "prefill",
                                              absl::FormatDuration(options_.queue_timeout)));
        }
        room_cv_.wait_for(lock, std::chrono::milliseconds(20));
      }
    }

    // 1. Admission on a decode worker: the stream that lives as long as the request there.
    //    With no room anywhere the request waits (bounded) for room to free up.
    std::set<std::string> tried = failed_decode;
    std::unique_ptr<grpc::ClientContext> d_ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeClientMessage, v1::DecodeServerMessage>>
        d_stream;
    std::string decode_id;
    KvTarget target;
    grpc::Status last_error(grpc::StatusCode::UNAVAILABLE, "no healthy decode worker");
    // Workers refused for room in this round; cleared when the request waits for room.
    int unavailable = 0;
    bool widened = false;
    while (!d_stream) {
      std::optional<std::string> pick;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const absl::Time now = absl::Now();
        // A request that could not fit in any decode worker's whole cache never will.
        if (const int64_t most = registry_.LargestDecodeTokens(now);
            most > 0 && most < total_tokens) {
          final = true;
          return grpc::Status(
              grpc::StatusCode::RESOURCE_EXHAUSTED,
              absl::StrFormat("the request may reach %d tokens (prompt and max_tokens); the "
                              "largest decode worker's KV cache holds %d",
                              total_tokens, most));
        }
        pick = registry_.PickDecode(len, total_tokens, now, tried);
        if (!pick && !widened && !failed_decode.empty()) {
          // Every worker with room failed this request once: a transient fault is retried
          // anywhere (the registry ejects a worker that keeps failing).
          widened = true;
          tried.clear();
          pick = registry_.PickDecode(len, total_tokens, now, tried);
        }
        if (!pick) {
          // No room anywhere (by the heartbeats' view or the workers' refusals), or no healthy
          // decode worker for a moment: wait for a request to end or a heartbeat, in a bounded
          // queue.
          const bool none_healthy = registry_.CountHealthy(WorkerRole::kDecode, now) == 0;
          if (grpc::Status s = enqueue(); !s.ok()) return s;
          if (is_gone()) return client_gone();
          if (now >= queue_until) {
            if (none_healthy) {
              final = true;
              return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  "no healthy decode worker within the queue timeout");
            }
            return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                absl::StrFormat("no decode worker had room within the queue "
                                                "timeout; retry after %d ms",
                                                options_.retry_after_ms));
          }
          room_cv_.wait_for(lock, std::chrono::milliseconds(20));
          tried = failed_decode;
          continue;
        }
      }
      tried.insert(*pick);
      if (metrics_) metrics_->routing_decisions(*pick, "decode").Increment();
      auto address = AddressOf(*pick);
      if (!address) continue;
      auto c = std::make_unique<grpc::ClientContext>();
      c->set_deadline(absl::ToChronoTime(call.deadline));
      Prove(c.get(), internal_method::kDecode);
      watcher.Watch(c.get());
      auto stream = v1::DecodeWorker::NewStub(ChannelFor(*address))->Decode(c.get());
      v1::DecodeClientMessage admit;
      v1::DecodeAdmit* a = admit.mutable_admit();
      a->set_request_id(request_id);
      a->mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
      *a->mutable_sampling() = ToProto(greq.sampling);
      a->set_max_tokens(remaining);
      a->set_ignore_eos(greq.ignore_eos);
      a->set_output_tokens(static_cast<int>(generated.size()));
      v1::DecodeServerMessage reply;
      grpc::Status refused;
      if (stream->Write(admit) && stream->Read(&reply) && reply.has_admitted()) {
        target = tandem::FromProto(reply.admitted().kv_target());
        // A prefill worker sends the prompt's KV where the target says: only to the KV
        // endpoint this decode worker registered, never to an address of its choosing.
        refused = CheckKvTarget(*pick, target);
        if (refused.ok()) {
          d_ctx = std::move(c);
          d_stream = std::move(stream);
          decode_id = *pick;
          std::lock_guard<std::mutex> lock(mu_);
          registry_.ReportSuccess(*pick);
          break;
        }
        c->TryCancel();
      }
      stream->WritesDone();
      grpc::Status s = stream->Finish();
      if (!refused.ok()) s = refused;
      watcher.Unwatch(c.get());
      if (is_gone()) return client_gone();
      last_error =
          s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker closed the stream") : s;
      if (s.ok() || WorkerFault(s)) {
        report(*pick, &failed_decode);
        if (++unavailable >= options_.decode_attempts) return last_error;
      } else if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
        return s;  // e.g. INVALID_ARGUMENT: another worker would say the same
      }
    }
    if (!d_stream) return last_error;
    if (admitted_at == absl::Time()) {
      admitted_at = absl::Now();
      if (metrics_) metrics_->queue_time.Observe(absl::ToDoubleSeconds(admitted_at - t0));
    }
    // Every exit from here closes the decode stream; cancelling it frees the blocks there.
    struct StreamCloser {
      grpc::ClientContext* c;
      grpc::ClientReaderWriter<v1::DecodeClientMessage, v1::DecodeServerMessage>* s;
      CancelWatcher* w;
      bool finished = false;
      ~StreamCloser() {
        if (!finished) {
          c->TryCancel();
          s->Finish().ok();
        }
        w->Unwatch(c);
      }
    } closer{d_ctx.get(), d_stream.get(), &watcher};
    // A decode worker that turns unhealthy (wedged, silent, draining past its deadline) is
    // abandoned: its stream is cancelled and the request resumed elsewhere.
    watcher.WatchWorker(d_ctx.get(), [this, id = decode_id] {
      std::lock_guard<std::mutex> lock(mu_);
      const WorkerEntry* w = registry_.Find(id);
      return w == nullptr || (!registry_.Healthy(*w, absl::Now()) && !w->draining());
    });

    // 2. Prefill into the lease.
    const int bs = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return registry_.PrefillBlockSize();
    }();
    std::vector<uint64_t> hashes;
    if (bs > 0) {
      uint64_t parent = 0;
      for (int b = 0; (b + 1) * bs <= len - 1; ++b) {
        parent = HashBlockTokens(parent, std::span<const int>(prompt).subspan(b * bs, bs));
        hashes.push_back(parent);
      }
    }
    std::optional<std::string> prefill_id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_id = registry_.PickPrefill(hashes, absl::Now(), failed_prefill);
      if (!prefill_id) prefill_id = registry_.PickPrefill(hashes, absl::Now(), {});
    }
    if (!prefill_id) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
    }
    if (metrics_) metrics_->routing_decisions(*prefill_id, "prefill").Increment();
    auto p_address = AddressOf(*prefill_id);
    if (!p_address) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker vanished");
    v1::PrefillRequest preq;
    preq.set_request_id(request_id);
    preq.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
    *preq.mutable_sampling() = ToProto(greq.sampling);
    *preq.mutable_kv_target() = ToProto(target);
    preq.set_output_tokens(static_cast<int>(generated.size()));
    v1::PrefillResponse presp;
    grpc::ClientContext p_ctx;
    // The prefill, KV transfer included, must finish within the prefill timeout: a stalled
    // worker is given up on and the request resumed elsewhere.
    p_ctx.set_deadline(
        absl::ToChronoTime(std::min(call.deadline, absl::Now() + options_.prefill_timeout)));
    Prove(&p_ctx, internal_method::kPrefill);
    watcher.Watch(&p_ctx);
    grpc::Status ps =
        v1::PrefillWorker::NewStub(ChannelFor(*p_address))->Prefill(&p_ctx, preq, &presp);
    watcher.Unwatch(&p_ctx);
    if (is_gone()) return client_gone();
    if (!ps.ok()) {
      // UNAVAILABLE / DEADLINE_EXCEEDED: the prefill worker died or stalled; DATA_LOSS: what
      // it sent failed the checksum. ABORTED: the decode side refused or lost the KV (no blame
      // here; a dead decode worker is found at the next admission).
      if (WorkerFault(ps) || ps.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        report(*prefill_id, &failed_prefill);
      }
      return ps;
    }
    if (presp.first_token() < 0 || presp.first_token() >= config_.vocab_size) {
      report(*prefill_id, &failed_prefill);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrFormat("prefill worker %s answered token id %d, outside the "
                                          "vocabulary",
                                          *prefill_id, presp.first_token()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      registry_.ReportSuccess(*prefill_id);
    }
    if (generated.empty()) {
      first_presp = presp;
      if (metrics_) metrics_->prompt_tokens.Increment(prompt_len);
    }

    // 3. Stream: the first token from the prefill, the rest from the decode worker.
    const bool first_ever = generated.empty();
    const bool done_at_first = add_token(presp.first_token(), &presp.first_logprobs());
    if (first_ever) {
      ttft = Since(t0);
      resp.mutable_timings()->set_ttft_seconds(ttft);
    }
    if (done_at_first) {
      finish_response();
      if (!write()) return client_gone();
      return grpc::Status::OK;  // the closer cancels the decode stream: blocks freed there
    }
    if (!write()) return client_gone();
    auto decode_broke = [&](grpc::Status s) {
      if (is_gone()) return client_gone();
      if (watcher.abandoned(d_ctx.get())) {
        report(decode_id, &failed_decode);
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrFormat("decode worker %s turned unhealthy", decode_id));
      }
      if (s.ok()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode stream ended without Finished");
      }
      if (WorkerFault(s)) report(decode_id, &failed_decode);
      return s;
    };
    v1::DecodeClientMessage start;
    start.mutable_start()->set_first_token(presp.first_token());
    if (!d_stream->Write(start)) {
      closer.finished = true;
      return decode_broke(d_stream->Finish());
    }
    v1::DecodeServerMessage msg;
    while (d_stream->Read(&msg)) {
      bool ended = false;
      if (msg.has_tokens()) {
        const v1::DecodeTokens& t = msg.tokens();
        for (int id : t.ids()) {
          if (id < 0 || id >= config_.vocab_size) {
            // Nothing of this message was sent: the request resumes after what the client has.
            resp.Clear();
            resp.set_request_id(request_id);
            report(decode_id, &failed_decode);
            return grpc::Status(
                grpc::StatusCode::UNAVAILABLE,
                absl::StrFormat("decode worker %s sent token id %d, outside the vocabulary",
                                decode_id, id));
          }
        }
        for (int i = 0; i < t.ids_size() && !ended; ++i) {
          ended = add_token(t.ids(i), i < t.logprobs_size() ? &t.logprobs(i) : nullptr);
        }
      } else if (msg.has_finished()) {
        // The decode worker ended on the same conditions the router checks; trust its reason
        // only if the router had not already ended.
        if (!finish) finish = FinishReason::kLength;
        ended = true;
      }
      if (ended) {
        finish_response();
        if (!write()) return client_gone();
        return grpc::Status::OK;
      }
      if (resp.token_ids_size() > 0 && !write()) return client_gone();
    }
    closer.finished = true;
    return decode_broke(d_stream->Finish());
  };

  for (int resumes = 0;; ++resumes) {
    grpc::Status s = attempt();
    if (s.ok()) {
      if (metrics_) {
        const double e2e = Since(t0);
        const int n = static_cast<int>(generated.size());
        metrics_->success(FinishReasonName(*finish)).Increment();
        metrics_->request_prompt_tokens.Observe(static_cast<double>(greq.prompt.size()));
        metrics_->request_generation_tokens.Observe(n);
        metrics_->e2e_request_latency.Observe(e2e);
        if (n > 1) metrics_->time_per_output_token.Observe((e2e - ttft) / (n - 1));
      }
      return s;
    }
    if (is_gone()) return client_gone();
    if (!Resumable(s) || final) return s;
    if (resumes >= options_.max_resumes) {
      return grpc::Status(s.error_code(), absl::StrFormat("%s (gave up after %d resumes)",
                                                          s.error_message(), resumes));
    }
    // An attempt fails only between writes: every token in `generated` reached the client, and
    // the resumed prompt ends with the last of them.
    resp.Clear();
    resp.set_request_id(request_id);
    finish.reset();
    if (metrics_) metrics_->resumes.Increment();
    // Back off a little (100 ms, doubling, at most 1 s): a worker that just came back needs a
    // heartbeat to be routable again.
    const absl::Time resume_at =
        std::min(call.deadline, absl::Now() + absl::Milliseconds(100 << std::min(resumes, 3)));
    while (absl::Now() < resume_at && !is_gone()) absl::SleepFor(absl::Milliseconds(10));
    if (is_gone()) return client_gone();
    std::fprintf(stderr, "[tandem-router] %s: resuming after %d tokens (%s)\n", request_id.c_str(),
                 static_cast<int>(generated.size()), s.error_message().c_str());
  }
}

grpc::Status Router::Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                           v1::ScoreResponse* resp) {
  std::vector<int> ids;
  if (req->has_text()) {
    if (req->text().empty())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text: must not be empty");
    if (req->text().size() > static_cast<size_t>(options_.limits.max_text_bytes)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("text: %d bytes, more than the %d-byte limit",
                                          req->text().size(), options_.limits.max_text_bytes));
    }
    ids = tokenizer_->Encode(req->text(), true);
  } else if (req->has_tokens()) {
    if (req->tokens().ids_size() > config_.max_seq_len) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "tokens.ids: longer than the context length");
    }
    ids.assign(req->tokens().ids().begin(), req->tokens().ids().end());
  } else {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "input: one of text or tokens is required");
  }
  if (ids.size() < 2)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "input: needs at least 2 tokens");
  if (static_cast<int64_t>(ids.size()) > config_.max_seq_len) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "input: longer than the context length");
  }
  for (int t : ids) {
    if (t < 0 || t >= config_.vocab_size) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "tokens.ids: id outside the vocabulary");
    }
  }
  std::optional<std::string> pick;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pick = registry_.PickPrefill({}, absl::Now(), {});
  }
  if (!pick) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
  auto address = AddressOf(*pick);
  if (!address) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker vanished");
  v1::PrefillScoreRequest preq;
  preq.mutable_token_ids()->Add(ids.begin(), ids.end());
  v1::PrefillScoreResponse presp;
  grpc::ClientContext c;
  c.set_deadline(ctx->deadline());
  Prove(&c, internal_method::kPrefillScore);
  grpc::Status s = v1::PrefillWorker::NewStub(ChannelFor(*address))->Score(&c, preq, &presp);
  if (!s.ok()) return s;
  resp->mutable_token_ids()->Add(ids.begin(), ids.end());
  double nll = 0;
  for (float lp : presp.logprobs()) {
    resp->add_logprobs(lp);
    nll -= lp;
  }
  nll /= std::max(1, presp.logprobs_size());
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
    std::lock_guard<std::mutex> lock(mu_);
    ForgetSilentWorkersLocked(absl::Now());
    // A prefill worker cannot send KV to a decode worker of another transport or KV dtype:
    // refuse the newcomer rather than fail its requests one by one.
    if (const WorkerRegistry::KvConflict c =
            registry_.FindKvConflict(req->worker_id(), req->kv_transport(), req->kv_dtype());
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
    if (absl::Status s =
            registry_.Register(req->worker_id(), role, req->address(), FromProto(req->load()),
                               absl::Now(), {identity, req->kv_endpoint()});
        !s.ok()) {
      return ToGrpc(s);
    }
    registry_.SetKvSettings(req->worker_id(), req->kv_transport(), req->kv_dtype());
  }
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  return grpc::Status::OK;
}

grpc::Status Router::Heartbeat(const v1::HeartbeatRequest* req, const std::string& identity,
                               v1::HeartbeatResponse* resp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ForgetSilentWorkersLocked(absl::Now());
    resp->set_known(registry_.Heartbeat(req->worker_id(), FromProto(req->load()), req->serving(),
                                        absl::Now(), req->draining(), identity));
  }
  room_cv_.notify_all();  // fresh load: queued requests look for room again
  return grpc::Status::OK;
}

grpc::Status Router::ListWorkers(v1::ListWorkersResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  ForgetSilentWorkersLocked(now);
  for (const WorkerEntry* w : registry_.List()) {
    v1::WorkerInfo* info = resp->add_workers();
    info->set_worker_id(w->id);
    info->set_role(w->role == WorkerRole::kPrefill ? v1::WORKER_ROLE_PREFILL
                                                   : v1::WORKER_ROLE_DECODE);
    info->set_address(w->address);
    info->set_kv_endpoint(w->kv_endpoint);
    *info->mutable_load() = ToProto(w->load);
    info->set_healthy(registry_.Healthy(*w, now));
  }
  return grpc::Status::OK;
}

}  // namespace tandem
