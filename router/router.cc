#include "router/router.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/kv/block_pool.h"
#include "engine/sampling/stop.h"
#include "router/request_id.h"
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
    if (grpc::Status s = Check(ctx, internal_method::kRegister, allowed, req, &identity); !s.ok()) {
      return s;
    }
    return r_->Register(req, identity, resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::string identity;
    if (grpc::Status s = Check(ctx, internal_method::kHeartbeat,
                               PeerRole::kPrefill | PeerRole::kDecode, req, &identity);
        !s.ok()) {
      return s;
    }
    return r_->Heartbeat(req, identity, resp);
  }
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override {
    if (grpc::Status s =
            Check(ctx, internal_method::kListWorkers,
                  PeerRole::kRouter | PeerRole::kPrefill | PeerRole::kDecode, req, nullptr);
        !s.ok()) {
      return s;
    }
    return r_->ListWorkers(resp);
  }

 private:
  grpc::Status Check(grpc::ServerContext* ctx, const char* method, RoleSet allowed,
                     const google::protobuf::MessageLite* request, std::string* identity) {
    if (auth_ == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the router has no cluster credentials");
    }
    return auth_->Check(ctx, method, allowed, request, identity);
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
  l.kv_group_window.assign(p.kv_group_window().begin(), p.kv_group_window().end());
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
  // A context watched is a new call (a later attempt's context may sit at an earlier one's
  // address): it starts not abandoned.
  void Watch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) c->TryCancel();
    watched_.insert(c);
    abandoned_.erase(c);
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

void Router::Prove(grpc::ClientContext* ctx, const char* method, const std::string& address,
                   const google::protobuf::MessageLite& request) const {
  if (options_.internal_auth) {
    options_.internal_auth->Attach(ctx, method, PeerRole::kRouter, address, request);
  }
}

void Router::Learn(const std::string& address, const grpc::ClientContext& ctx) const {
  if (options_.internal_auth) options_.internal_auth->LearnAudience(address, ctx);
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
  // The caller's ids live in its key's namespace (any connection presenting it), else in its
  // connection's.
  const auto& md = ctx->client_metadata();
  const auto auth = md.find("authorization");
  const absl::string_view key =
      options_.api_keys.enabled() && auth != md.end()
          ? ApiKeys::BearerToken(absl::string_view(auth->second.data(), auth->second.size()))
          : absl::string_view();
  call.caller = CallerNamespace(std::string_view(key.data(), key.size()), ctx->peer());
  grpc::Status s = GenerateStream(*req, call);
  // A Generate call is one sequence: n = 1 (HttpServer counts the HTTP API's n).
  if (s.ok() && metrics_) metrics_->request_params_n.Observe(1);
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

namespace router_internal {

using DecodeStream = grpc::ClientReaderWriter<v1::DecodeClientMessage, v1::DecodeServerMessage>;

// One request, over as many attempts as faults require, as a transaction whose phases are the
// steps of RunAttempt and Run:
//   admit     wait (bounded) for healthy workers, then admit `prompt + tokens streamed so far` on
//             a decode worker, which leases KV blocks for it;
//   prefill   a prefill worker computes the prompt's KV into that lease and the first token;
//   stream    relay the decode worker's tokens to the client;
//   resume    after a worker death or a failed KV transfer, back off and start a new attempt
//             after the last token the client has, on workers that have not failed this
//             request (sampling is keyed by (seed, position), so the resumed tokens are the
//             ones the failed worker would have produced);
//   finish    the last message written, the metrics recorded.
// The router's lock is taken only around registry and queue bookkeeping.
class GenerateTransaction {
 public:
  GenerateTransaction(Router* router, const v1::GenerateRequest& req, const StreamCall& call)
      : r_(router), req_(req), call_(call), t0_(absl::Now()) {}
  ~GenerateTransaction();

  grpc::Status Run();

 private:
  // What one attempt holds; destroyed (the decode stream closed, the queue place given back)
  // when the attempt ends.
  struct Attempt {
    explicit Attempt(Router* r) : queued{r} {}
    std::vector<int> prompt;  // the request's prompt + the tokens already streamed
    int len = 0;
    int remaining = 0;       // tokens still allowed
    int total_tokens = 0;    // what the request may reach: prompt + remaining, within the context
    absl::Time queue_until;  // waiting for a healthy worker of a role, until then
    absl::Time room_until;   // waiting for KV room on a decode worker, until then
    // A place in the router's wait queue (first come, first admitted), taken while the request
    // waits for workers or for KV room, given back when it is admitted or gives up.
    struct QueueSlot {
      Router* r;
      bool held = false;
      uint64_t ticket = 0;
      void ReleaseLocked() {
        if (!held) return;
        held = false;
        --r->waiting_for_room_;
        auto& order = r->admit_order_;
        order.erase(std::find(order.begin(), order.end(), ticket));
        r->room_cv_.notify_all();  // the next in line may try
      }
      ~QueueSlot() {
        std::lock_guard<std::mutex> lock(r->mu_);
        ReleaseLocked();
      }
    } queued;
    std::unique_ptr<grpc::ClientContext> d_ctx;
    std::unique_ptr<DecodeStream> d_stream;
    std::string decode_id;
    KvTarget target;
    v1::PrefillResponse presp;
    // Closes the decode stream on every exit once admitted; cancelling it frees the blocks
    // there.
    struct StreamCloser {
      StreamCloser(grpc::ClientContext* c, DecodeStream* s, CancelWatcher* w) : c(c), s(s), w(w) {}
      StreamCloser(const StreamCloser&) = delete;
      StreamCloser& operator=(const StreamCloser&) = delete;
      grpc::ClientContext* c;
      DecodeStream* s;
      CancelWatcher* w;
      bool finished = false;
      ~StreamCloser() {
        if (!finished) {
          c->TryCancel();
          s->Finish().ok();
        }
        w->Unwatch(c);
      }
    };
    std::optional<StreamCloser> closer;
  };

  grpc::Status Begin();
  grpc::Status RunAttempt();
  grpc::Status Enqueue(Attempt& a);  // under r_->mu_
  // Under r_->mu_: whether `a` may look for room now (no one waits, or it is first in line).
  bool MyTurnLocked(const Attempt& a) const;
  // The request's deadline passed while it waited for KV room.
  grpc::Status NoRoom();
  grpc::Status WaitForWorkers(Attempt& a);
  grpc::Status Admit(Attempt& a);
  // One admission try on decode worker `pick`: OK and the stream in `a`, or why not (*vanished:
  // the worker left the registry).
  grpc::Status TryAdmit(Attempt& a, const std::string& pick, bool* vanished);
  grpc::Status Prefill(Attempt& a);
  grpc::Status Stream(Attempt& a);
  grpc::Status DecodeBroke(Attempt& a, grpc::Status s);
  // The next state after a failed attempt: kResume, or the final status in *final_status.
  bool PrepareResume(const grpc::Status& s, int resumes, grpc::Status* final_status);
  void RecordSuccess();

  // Adds one token (and its logprobs, when asked for) to the pending response; true when the
  // request ends with it.
  bool AddToken(int token, const v1::TokenLogprobs* logprobs);
  // OK unless the request is constrained and ended at EOS without a whole value (the model
  // found no token to continue it): then it fails, never returning invalid output as "stop".
  grpc::Status EndsWhole() const;
  void FinishResponse();
  // Sends the pending response and counts its tokens: the first one for TTFT, every later one
  // for the inter-token latency (a message of k tokens spreads its wait over the k).
  bool Write();
  void ClearResponse();
  // The client's own timer fires first and cancels the stream; our copy of its deadline (sent as
  // a relative timeout) lands a little later. A cancel that close to the deadline is the
  // deadline.
  grpc::Status ClientGone() const;
  bool IsGone();
  // A worker that failed this request: not picked again for it, and reported to the registry.
  void Report(const std::string& worker, std::set<std::string>* failed);

  Router* const r_;
  const v1::GenerateRequest& req_;
  const StreamCall& call_;
  const absl::Time t0_;
  std::optional<GenerationRequest> greq_;
  int prompt_len_ = 0;
  std::string request_id_;  // scoped to the caller (router/request_id.h): logs, workers
  std::string client_id_;   // what the client sees: its own id, or the one the router drew
  bool in_flight_ = false;
  std::optional<PhaseGauges> phase_;
  std::optional<CancelWatcher> watcher_;
  // What the client has been sent (or is about to be): it survives the attempts.
  std::optional<IncrementalDecoder> detok_;
  std::optional<StopStringMatcher> stop_;
  std::vector<int> generated_;
  std::optional<FinishReason> finish_;
  v1::GenerateResponse resp_;
  absl::Time admitted_at_;
  v1::PrefillResponse first_presp_;  // the first attempt's prefill (for the timings)
  double ttft_ = 0;                  // router receipt to the first token sent
  absl::Time last_token_at_;
  std::set<std::string> failed_decode_, failed_prefill_;
  // Set when an attempt failed after the request already waited its bounded time for workers:
  // not resumed.
  bool final_ = false;
};

GenerateTransaction::~GenerateTransaction() {
  if (!in_flight_) return;
  {
    std::lock_guard<std::mutex> lock(r_->mu_);
    r_->in_flight_.erase(request_id_);
  }
  r_->room_cv_.notify_all();
}

grpc::Status GenerateTransaction::Run() {
  if (grpc::Status s = Begin(); !s.ok()) return s;
  for (int resumes = 0;; ++resumes) {
    grpc::Status s = RunAttempt();
    if (s.ok()) {
      RecordSuccess();
      return s;
    }
    grpc::Status final_status;
    if (!PrepareResume(s, resumes, &final_status)) return final_status;
  }
}

// Validation and a place among the requests in flight.
grpc::Status GenerateTransaction::Begin() {
  if (r_->draining_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "router is draining (shutting down); send to another replica");
  }
  auto parsed = ValidateGenerateRequest(req_, r_->config_, *r_->tokenizer_, r_->options_.limits);
  if (!parsed.ok()) return ToGrpc(parsed.status());
  greq_ = std::move(*parsed);
  // Structured output: its constraint, for EndsWhole.
  if (absl::Status s = AttachConstraint(r_->constraints_.get(), &greq_->sampling); !s.ok()) {
    return ToGrpc(s);
  }
  prompt_len_ = static_cast<int>(greq_->prompt.size());
  request_id_ = ScopedRequestId(call_.caller, req_.request_id());
  client_id_ = req_.request_id().empty() ? request_id_ : req_.request_id();
  {
    std::lock_guard<std::mutex> lock(r_->mu_);
    if (static_cast<int>(r_->in_flight_.size()) >= r_->options_.max_in_flight) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrFormat("router: %d requests in flight (the limit); retry after "
                                          "%d ms",
                                          r_->options_.max_in_flight, r_->options_.retry_after_ms));
    }
    if (!r_->in_flight_.insert(request_id_).second) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("request_id: \"%s\" is already in flight", client_id_));
    }
    in_flight_ = true;
  }
  phase_.emplace(r_->metrics_);
  watcher_.emplace(r_->cancel_hub_.get(), call_.cancelled);
  detok_.emplace(r_->tokenizer_.get(), greq_->prompt);
  stop_.emplace(greq_->stop_strings);
  resp_.set_request_id(client_id_);
  return grpc::Status::OK;
}

grpc::Status GenerateTransaction::RunAttempt() {
  Attempt a(r_);
  a.prompt = greq_->prompt;
  a.prompt.insert(a.prompt.end(), generated_.begin(), generated_.end());
  a.len = static_cast<int>(a.prompt.size());
  a.remaining = greq_->max_tokens - static_cast<int>(generated_.size());
  a.total_tokens =
      static_cast<int>(std::min<int64_t>(int64_t{a.len} + a.remaining, r_->config_.max_seq_len));
  a.queue_until = std::min(call_.deadline, absl::Now() + r_->options_.queue_timeout);
  a.room_until = call_.deadline;
  if (grpc::Status s = WaitForWorkers(a); !s.ok()) return s;
  if (grpc::Status s = Admit(a); !s.ok()) return s;
  if (grpc::Status s = Prefill(a); !s.ok()) return s;
  return Stream(a);
}

grpc::Status GenerateTransaction::Enqueue(Attempt& a) {
  if (a.queued.held) return grpc::Status::OK;
  if (r_->waiting_for_room_ >= r_->options_.max_queued) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrFormat("no decode worker has room and %d requests are queued "
                                        "(the limit); retry after %d ms",
                                        r_->options_.max_queued, r_->options_.retry_after_ms));
  }
  ++r_->waiting_for_room_;
  a.queued.held = true;
  a.queued.ticket = r_->next_ticket_++;
  r_->admit_order_.push_back(a.queued.ticket);
  return grpc::Status::OK;
}

grpc::Status GenerateTransaction::NoRoom() {
  final_ = true;
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "no decode worker had KV room before the request's deadline");
}

bool GenerateTransaction::MyTurnLocked(const Attempt& a) const {
  return r_->admit_order_.empty() || (a.queued.held && r_->admit_order_.front() == a.queued.ticket);
}

// A role with no healthy worker (one stalled or restarting) is waited for, in the same bounded
// queue as requests waiting for room: a stall delays requests, it does not fail them.
grpc::Status GenerateTransaction::WaitForWorkers(Attempt& a) {
  std::unique_lock<std::mutex> lock(r_->mu_);
  for (;;) {
    const absl::Time now = absl::Now();
    const bool prefill = r_->registry_.CountHealthy(WorkerRole::kPrefill, now) > 0;
    const bool decode = r_->registry_.CountHealthy(WorkerRole::kDecode, now) > 0;
    if (prefill && decode) return grpc::Status::OK;
    if (grpc::Status s = Enqueue(a); !s.ok()) return s;
    if (IsGone()) return ClientGone();
    if (now >= a.queue_until) {
      final_ = true;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrFormat("no healthy %s worker within the queue timeout (%s)",
                                          prefill ? "decode" : "prefill",
                                          absl::FormatDuration(r_->options_.queue_timeout)));
    }
    r_->room_cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

// Admission on a decode worker: the stream that lives as long as the request there. With no
// room anywhere the request waits in line (first come, first admitted; the queue's places are
// bounded) for room to free up, until its own deadline or until its client leaves: a full cache
// delays requests, it does not fail them.
grpc::Status GenerateTransaction::Admit(Attempt& a) {
  std::set<std::string> tried = failed_decode_;
  grpc::Status last_error(grpc::StatusCode::UNAVAILABLE, "no healthy decode worker");
  int unavailable = 0;  // workers that failed in this round
  bool widened = false;
  while (!a.d_stream) {
    std::optional<std::string> pick;
    {
      std::unique_lock<std::mutex> lock(r_->mu_);
      const absl::Time now = absl::Now();
      if (!MyTurnLocked(a)) {
        // Requests that came first are waiting for room: wait behind them.
        if (grpc::Status s = Enqueue(a); !s.ok()) return s;
        if (IsGone()) return ClientGone();
        if (now >= a.room_until) return NoRoom();
        r_->room_cv_.wait_for(lock, std::chrono::milliseconds(20));
        continue;
      }
      // A request that could not fit in any decode worker's whole cache never will.
      if (const int64_t most = r_->registry_.LargestDecodeTokens(now);
          most > 0 && most < a.total_tokens) {
        final_ = true;
        return grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrFormat("the request may reach %d tokens (prompt and max_tokens); the "
                            "largest decode worker's KV cache holds %d",
                            a.total_tokens, most));
      }
      pick = r_->registry_.PickDecode(a.len, a.total_tokens, now, tried);
      if (!pick && !widened && !failed_decode_.empty()) {
        // Every worker with room failed this request once: a transient fault is retried
        // anywhere (the registry ejects a worker that keeps failing).
        widened = true;
        tried.clear();
        pick = r_->registry_.PickDecode(a.len, a.total_tokens, now, tried);
      }
      if (!pick) {
        // No room anywhere (by the heartbeats' view or the workers' refusals), or no healthy
        // decode worker for a moment: wait for a request to end or a heartbeat, in a bounded
        // queue.
        const bool none_healthy = r_->registry_.CountHealthy(WorkerRole::kDecode, now) == 0;
        if (grpc::Status s = Enqueue(a); !s.ok()) return s;
        if (IsGone()) return ClientGone();
        if (none_healthy && now >= a.queue_until) {
          final_ = true;
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "no healthy decode worker within the queue timeout");
        }
        if (now >= a.room_until) return NoRoom();
        r_->room_cv_.wait_for(lock, std::chrono::milliseconds(20));
        tried = failed_decode_;
        continue;
      }
    }
    tried.insert(*pick);
    bool vanished = false;
    grpc::Status s = TryAdmit(a, *pick, &vanished);
    if (a.d_stream) break;
    if (vanished) continue;
    if (IsGone()) return ClientGone();
    last_error =
        s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker closed the stream") : s;
    if (s.ok() || WorkerFault(s)) {
      Report(*pick, &failed_decode_);
      if (++unavailable >= r_->options_.decode_attempts) return last_error;
    } else if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      return s;  // e.g. INVALID_ARGUMENT: another worker would say the same
    }
  }
  {
    std::lock_guard<std::mutex> lock(r_->mu_);
    a.queued.ReleaseLocked();  // admitted: the next in line may look for room
  }
  if (admitted_at_ == absl::Time()) {
    admitted_at_ = absl::Now();
    if (r_->metrics_) {
      r_->metrics_->queue_time.Observe(absl::ToDoubleSeconds(admitted_at_ - t0_));
    }
  }
  a.closer.emplace(a.d_ctx.get(), a.d_stream.get(), &*watcher_);
  // A decode worker that turns unhealthy (wedged, silent, draining past its deadline) is
  // abandoned: its stream is cancelled and the request resumed elsewhere.
  watcher_->WatchWorker(a.d_ctx.get(), [r = r_, id = a.decode_id] {
    std::lock_guard<std::mutex> lock(r->mu_);
    const WorkerEntry* w = r->registry_.Find(id);
    return w == nullptr || (!r->registry_.Healthy(*w, absl::Now()) && !w->draining());
  });
  return grpc::Status::OK;
}

grpc::Status GenerateTransaction::TryAdmit(Attempt& a, const std::string& pick, bool* vanished) {
  if (r_->metrics_) r_->metrics_->routing_decisions(pick, "decode").Increment();
  auto address = r_->AddressOf(pick);
  if (!address) {
    *vanished = true;
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "decode worker vanished");
  }
  v1::DecodeClientMessage admit;
  v1::DecodeAdmit* m = admit.mutable_admit();
  m->set_request_id(request_id_);
  m->mutable_prompt_ids()->Add(a.prompt.begin(), a.prompt.end());
  *m->mutable_sampling() = ToProto(greq_->sampling);
  m->set_max_tokens(a.remaining);
  m->set_ignore_eos(greq_->ignore_eos);
  m->set_disable_speculation(!greq_->speculative);
  m->set_output_tokens(static_cast<int>(generated_.size()));
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(call_.deadline));
  r_->Prove(c.get(), internal_method::kDecode, *address, admit);
  watcher_->Watch(c.get());
  auto stream = v1::DecodeWorker::NewStub(r_->ChannelFor(*address))->Decode(c.get());
  v1::DecodeServerMessage reply;
  grpc::Status refused;
  if (stream->Write(admit) && stream->Read(&reply) && reply.has_admitted()) {
    KvTarget target = tandem::FromProto(reply.admitted().kv_target());
    // A prefill worker sends the prompt's KV where the target says: only to the KV endpoint
    // this decode worker registered, never to an address of its choosing.
    refused = r_->CheckKvTarget(pick, target);
    if (refused.ok()) {
      a.target = target;
      a.d_ctx = std::move(c);
      a.d_stream = std::move(stream);
      a.decode_id = pick;
      std::lock_guard<std::mutex> lock(r_->mu_);
      r_->registry_.ReportSuccess(pick);
      return grpc::Status::OK;
    }
    c->TryCancel();
  }
  stream->WritesDone();
  grpc::Status s = stream->Finish();
  r_->Learn(*address, *c);
  if (!refused.ok()) s = refused;
  watcher_->Unwatch(c.get());
  return s;
}

// Prefill into the lease: the prompt's KV is sent to the decode worker, the first token comes
// back.
grpc::Status GenerateTransaction::Prefill(Attempt& a) {
  const int bs = [&] {
    std::lock_guard<std::mutex> lock(r_->mu_);
    return r_->registry_.PrefillBlockSize();
  }();
  std::vector<uint64_t> hashes;
  if (bs > 0) {
    uint64_t parent = 0;
    for (int b = 0; (b + 1) * bs <= a.len - 1; ++b) {
      parent = HashBlockTokens(parent, std::span<const int>(a.prompt).subspan(b * bs, bs));
      hashes.push_back(parent);
    }
  }
  std::optional<std::string> prefill_id;
  {
    std::lock_guard<std::mutex> lock(r_->mu_);
    prefill_id = r_->registry_.PickPrefill(hashes, absl::Now(), failed_prefill_);
    if (!prefill_id) prefill_id = r_->registry_.PickPrefill(hashes, absl::Now(), {});
  }
  if (!prefill_id) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
  if (r_->metrics_) r_->metrics_->routing_decisions(*prefill_id, "prefill").Increment();
  auto p_address = r_->AddressOf(*prefill_id);
  if (!p_address) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker vanished");
  v1::PrefillRequest preq;
  preq.set_request_id(request_id_);
  preq.mutable_prompt_ids()->Add(a.prompt.begin(), a.prompt.end());
  *preq.mutable_sampling() = ToProto(greq_->sampling);
  *preq.mutable_kv_target() = ToProto(a.target);
  preq.set_output_tokens(static_cast<int>(generated_.size()));
  // Waiting in a busy prefill worker's queue is not a failure: the call lives as long as the
  // request, its compute is bounded by the prefill timeout (counted by the worker from when the
  // prompt starts computing), and a worker that stalls (its step loop stops: health) is given
  // up on and the request resumed elsewhere.
  preq.set_compute_timeout_ms(static_cast<int32_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(r_->options_.prefill_timeout), INT32_MAX)));
  grpc::ClientContext p_ctx;
  p_ctx.set_deadline(absl::ToChronoTime(call_.deadline));
  r_->Prove(&p_ctx, internal_method::kPrefill, *p_address, preq);
  watcher_->Watch(&p_ctx);
  watcher_->WatchWorker(&p_ctx, [r = r_, id = *prefill_id] {
    std::lock_guard<std::mutex> lock(r->mu_);
    const WorkerEntry* w = r->registry_.Find(id);
    return w == nullptr || (!r->registry_.Healthy(*w, absl::Now()) && !w->draining());
  });
  grpc::Status ps =
      v1::PrefillWorker::NewStub(r_->ChannelFor(*p_address))->Prefill(&p_ctx, preq, &a.presp);
  watcher_->Unwatch(&p_ctx);
  r_->Learn(*p_address, p_ctx);
  if (IsGone()) return ClientGone();
  if (!ps.ok() && watcher_->abandoned(&p_ctx)) {
    Report(*prefill_id, &failed_prefill_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("prefill worker %s turned unhealthy", *prefill_id));
  }
  if (!ps.ok()) {
    // UNAVAILABLE / DEADLINE_EXCEEDED: the prefill worker died or stalled; DATA_LOSS: what it
    // sent failed the checksum. ABORTED: the decode side refused or lost the KV (no blame here;
    // a dead decode worker is found at the next admission).
    if (WorkerFault(ps) || ps.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      Report(*prefill_id, &failed_prefill_);
    } else if (ps.error_code() == grpc::StatusCode::ABORTED) {
      // The KV did not land in this decode worker's lease (it refused it, or its KV endpoint
      // did not answer as the decode worker it registered): the resumed attempt tries another
      // first, without counting it against the worker.
      failed_decode_.insert(a.decode_id);
    }
    return ps;
  }
  if (a.presp.first_token() < 0 || a.presp.first_token() >= r_->config_.vocab_size) {
    Report(*prefill_id, &failed_prefill_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("prefill worker %s answered token id %d, outside the "
                                        "vocabulary",
                                        *prefill_id, a.presp.first_token()));
  }
  {
    std::lock_guard<std::mutex> lock(r_->mu_);
    r_->registry_.ReportSuccess(*prefill_id);
  }
  if (generated_.empty()) {
    first_presp_ = a.presp;
    if (r_->metrics_) r_->metrics_->prompt_tokens.Increment(prompt_len_);
  }
  return grpc::Status::OK;
}

// The first token from the prefill, the rest from the decode worker.
grpc::Status GenerateTransaction::Stream(Attempt& a) {
  const bool first_ever = generated_.empty();
  const bool done_at_first = AddToken(a.presp.first_token(), &a.presp.first_logprobs());
  if (first_ever) {
    ttft_ = Since(t0_);
    resp_.mutable_timings()->set_ttft_seconds(ttft_);
  }
  if (done_at_first) {
    if (grpc::Status s = EndsWhole(); !s.ok()) return s;
    FinishResponse();
    if (!Write()) return ClientGone();
    return grpc::Status::OK;  // the closer cancels the decode stream: blocks freed there
  }
  if (!Write()) return ClientGone();
  v1::DecodeClientMessage start;
  start.mutable_start()->set_first_token(a.presp.first_token());
  if (!a.d_stream->Write(start)) {
    a.closer->finished = true;
    return DecodeBroke(a, a.d_stream->Finish());
  }
  v1::DecodeServerMessage msg;
  while (a.d_stream->Read(&msg)) {
    bool ended = false;
    if (msg.has_tokens()) {
      const v1::DecodeTokens& t = msg.tokens();
      for (int id : t.ids()) {
        if (id < 0 || id >= r_->config_.vocab_size) {
          // Nothing of this message was sent: the request resumes after what the client has.
          ClearResponse();
          Report(a.decode_id, &failed_decode_);
          return grpc::Status(
              grpc::StatusCode::UNAVAILABLE,
              absl::StrFormat("decode worker %s sent token id %d, outside the vocabulary",
                              a.decode_id, id));
        }
      }
      for (int i = 0; i < t.ids_size() && !ended; ++i) {
        ended = AddToken(t.ids(i), i < t.logprobs_size() ? &t.logprobs(i) : nullptr);
      }
    } else if (msg.has_finished()) {
      // The decode worker ended on the same conditions the router checks; trust its reason only
      // if the router had not already ended.
      if (!finish_) finish_ = FinishReason::kLength;
      ended = true;
    }
    if (ended) {
      if (grpc::Status s = EndsWhole(); !s.ok()) return s;
      FinishResponse();
      if (!Write()) return ClientGone();
      return grpc::Status::OK;
    }
    if (resp_.token_ids_size() > 0 && !Write()) return ClientGone();
  }
  a.closer->finished = true;
  return DecodeBroke(a, a.d_stream->Finish());
}

grpc::Status GenerateTransaction::DecodeBroke(Attempt& a, grpc::Status s) {
  if (IsGone()) return ClientGone();
  if (watcher_->abandoned(a.d_ctx.get())) {
    Report(a.decode_id, &failed_decode_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("decode worker %s turned unhealthy", a.decode_id));
  }
  if (s.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode stream ended without Finished");
  }
  if (WorkerFault(s)) Report(a.decode_id, &failed_decode_);
  return s;
}

bool GenerateTransaction::PrepareResume(const grpc::Status& s, int resumes,
                                        grpc::Status* final_status) {
  if (IsGone()) {
    *final_status = ClientGone();
    return false;
  }
  if (!Resumable(s) || final_) {
    *final_status = s;
    return false;
  }
  if (resumes >= r_->options_.max_resumes) {
    *final_status = grpc::Status(s.error_code(), absl::StrFormat("%s (gave up after %d resumes)",
                                                                 s.error_message(), resumes));
    return false;
  }
  // An attempt fails only between writes: every token in `generated_` reached the client, and
  // the resumed prompt ends with the last of them.
  ClearResponse();
  finish_.reset();
  if (r_->metrics_) r_->metrics_->resumes.Increment();
  // Back off a little (100 ms, doubling, at most 1 s): a worker that just came back needs a
  // heartbeat to be routable again.
  const absl::Time resume_at =
      std::min(call_.deadline, absl::Now() + absl::Milliseconds(100 << std::min(resumes, 3)));
  while (absl::Now() < resume_at && !IsGone()) absl::SleepFor(absl::Milliseconds(10));
  if (IsGone()) {
    *final_status = ClientGone();
    return false;
  }
  std::fprintf(stderr, "[tandem-router] %s: resuming after %d tokens (%s)\n", request_id_.c_str(),
               static_cast<int>(generated_.size()), s.error_message().c_str());
  return true;
}

void GenerateTransaction::RecordSuccess() {
  RouterMetrics* m = r_->metrics_;
  if (m == nullptr) return;
  const double e2e = Since(t0_);
  const int n = static_cast<int>(generated_.size());
  m->success(FinishReasonName(*finish_)).Increment();
  m->request_prompt_tokens.Observe(static_cast<double>(greq_->prompt.size()));
  m->request_generation_tokens.Observe(n);
  m->e2e_request_latency.Observe(e2e);
  if (n > 1) m->time_per_output_token.Observe((e2e - ttft_) / (n - 1));
  // vLLM's phases: from admission (its "scheduled") to the first token and on to the last.
  const double queue = absl::ToDoubleSeconds(admitted_at_ - t0_);
  m->request_prefill_time.Observe(std::max(0.0, ttft_ - queue));
  m->request_decode_time.Observe(std::max(0.0, e2e - ttft_));
  m->request_inference_time.Observe(std::max(0.0, e2e - queue));
  m->request_params_max_tokens.Observe(greq_->max_tokens);
}

bool GenerateTransaction::AddToken(int token, const v1::TokenLogprobs* logprobs) {
  generated_.push_back(token);
  const int n = static_cast<int>(generated_.size());
  resp_.add_token_ids(token);
  if (logprobs != nullptr && greq_->sampling.logprobs) *resp_.add_logprobs() = *logprobs;
  finish_ = CheckFinish(r_->config_, *greq_, token, n, prompt_len_ + n);
  if (finish_ == FinishReason::kStop) return true;  // EOS: no text
  bool stopped = false;
  resp_.mutable_text()->append(stop_->Add(detok_->Add(token), &stopped));
  if (stopped) finish_ = FinishReason::kStop;
  return finish_.has_value();
}

grpc::Status GenerateTransaction::EndsWhole() const {
  const OutputConstraint* c = greq_->sampling.constraint.get();
  if (c == nullptr || finish_ != FinishReason::kStop || generated_.empty()) {
    return grpc::Status::OK;
  }
  const std::vector<int>& eos = r_->config_.eos_token_ids;
  std::span<const int> text(generated_);
  if (std::find(eos.begin(), eos.end(), text.back()) != eos.end())
    text = text.first(text.size() - 1);
  if (c->Completes(text)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      "structured output (sampling.json_schema, choice or regex): the model "
                      "ended its output before the value was complete (no token of its "
                      "vocabulary could continue it)");
}

void GenerateTransaction::FinishResponse() {
  if (*finish_ != FinishReason::kStop) {
    bool stopped = false;
    std::string tail = stop_->Add(detok_->Flush(), &stopped);
    if (!stopped) tail += stop_->Flush();
    resp_.mutable_text()->append(tail);
  }
  resp_.set_finish_reason(ToProto(*finish_));
  resp_.mutable_usage()->set_prompt_tokens(prompt_len_);
  resp_.mutable_usage()->set_completion_tokens(static_cast<int>(generated_.size()));
  v1::Timings* t = resp_.mutable_timings();
  t->set_queue_seconds(absl::ToDoubleSeconds(admitted_at_ - t0_));
  t->set_prefill_seconds(first_presp_.queue_seconds() + first_presp_.compute_seconds() +
                         first_presp_.kv_transfer_seconds());
  t->set_kv_transfer_seconds(first_presp_.kv_transfer_seconds());
  t->set_ttft_seconds(ttft_);
  t->set_e2e_seconds(Since(t0_));
}

bool GenerateTransaction::Write() {
  if (!call_.write(resp_)) return false;
  const int n = resp_.token_ids_size();
  ClearResponse();
  RouterMetrics* m = r_->metrics_;
  if (m == nullptr || n == 0) return true;
  const absl::Time now = absl::Now();
  if (last_token_at_ == absl::Time()) {
    m->time_to_first_token.Observe(ttft_);
    phase_->Running();  // the first message holds the first token only
  } else {
    const double each = absl::ToDoubleSeconds(now - last_token_at_) / n;
    for (int i = 0; i < n; ++i) m->inter_token_latency.Observe(each);
  }
  last_token_at_ = now;
  m->generation_tokens.Increment(n);
  return true;
}

void GenerateTransaction::ClearResponse() {
  resp_.Clear();
  resp_.set_request_id(client_id_);
}

grpc::Status GenerateTransaction::ClientGone() const {
  if (absl::Now() + absl::Milliseconds(50) >= call_.deadline) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

bool GenerateTransaction::IsGone() {
  return watcher_->cancelled() || (call_.cancelled && call_.cancelled()) ||
         absl::Now() >= call_.deadline;
}

void GenerateTransaction::Report(const std::string& worker, std::set<std::string>* failed) {
  failed->insert(worker);
  std::lock_guard<std::mutex> lock(r_->mu_);
  r_->registry_.ReportFailure(worker, absl::Now());
}

}  // namespace router_internal

grpc::Status Router::RunGenerate(const v1::GenerateRequest& req, const StreamCall& call) {
  return router_internal::GenerateTransaction(this, req, call).Run();
}

grpc::Status Router::Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                           v1::ScoreResponse* resp) {
  const bool no_deadline = ctx->deadline() == std::chrono::system_clock::time_point::max();
  return Score(*req, no_deadline ? absl::InfiniteFuture() : absl::FromChrono(ctx->deadline()),
               resp);
}

grpc::Status Router::Score(const v1::ScoreRequest& request, absl::Time deadline,
                           v1::ScoreResponse* resp) {
  const v1::ScoreRequest* req = &request;
  if (req->top_logprobs() < 0 || req->top_logprobs() > kMaxTopLogprobs) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("top_logprobs: must be in [0, %d], got %d", kMaxTopLogprobs,
                                        req->top_logprobs()));
  }
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
  preq.set_top_logprobs(req->top_logprobs());
  v1::PrefillScoreResponse presp;
  grpc::ClientContext c;
  c.set_deadline(absl::ToChronoTime(deadline));
  Prove(&c, internal_method::kPrefillScore, *address, preq);
  grpc::Status s = v1::PrefillWorker::NewStub(ChannelFor(*address))->Score(&c, preq, &presp);
  Learn(*address, c);
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
  // The router's calls to this worker prove themselves for this process alone.
  if (options_.internal_auth)
    options_.internal_auth->SetAudience(req->address(), req->instance_id());
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
