#include "router/router.h"

#include <chrono>
#include <condition_variable>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/block_pool.h"
#include "engine/stop.h"
#include "server/grpc_util.h"

namespace tandem {
namespace {

class GenerationAdaptor final : public v1::Generation::Service {
 public:
  explicit GenerationAdaptor(Router* r) : r_(r) {}
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    return r_->Generate(ctx, req, writer);
  }
  grpc::Status Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                     v1::ScoreResponse* resp) override {
    return r_->Score(ctx, req, resp);
  }
  grpc::Status Tokenize(grpc::ServerContext*, const v1::TokenizeRequest* req,
                        v1::TokenizeResponse* resp) override {
    return r_->Tokenize(req, resp);
  }
  grpc::Status Detokenize(grpc::ServerContext*, const v1::DetokenizeRequest* req,
                          v1::DetokenizeResponse* resp) override {
    return r_->Detokenize(req, resp);
  }
  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* resp) override {
    return r_->GetModelInfo(resp);
  }

 private:
  Router* r_;
};

class RegistryAdaptor final : public v1::Registry::Service {
 public:
  explicit RegistryAdaptor(Router* r) : r_(r) {}
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    return r_->Register(req, resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    return r_->Heartbeat(req, resp);
  }
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    return r_->ListWorkers(resp);
  }

 private:
  Router* r_;
};

WorkerLoadSnapshot FromProto(const v1::WorkerLoad& p) {
  WorkerLoadSnapshot l;
  l.queue_depth = p.queue_depth();
  l.running = p.running_requests();
  l.free_blocks = p.free_kv_blocks();
  l.total_blocks = p.total_kv_blocks();
  l.block_size = p.block_size();
  return l;
}

// Cancels the client contexts of a request's worker calls when the router's own client goes
// away (cancel or deadline). Runs until Done().
class CancelWatcher {
 public:
  explicit CancelWatcher(grpc::ServerContext* ctx) : thread_([this, ctx] { Run(ctx); }) {}
  ~CancelWatcher() { Done(); }
  void Watch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) c->TryCancel();
    watched_.insert(c);
  }
  void Unwatch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.erase(c);
  }
  void Done() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run(grpc::ServerContext* ctx) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      if (!cancelled_ && ctx->IsCancelled()) {
        cancelled_ = true;
        for (auto* c : watched_) c->TryCancel();
      }
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<grpc::ClientContext*> watched_;
  bool cancelled_ = false;
  bool done_ = false;
  std::thread thread_;
};

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
      registry_service_(std::make_unique<RegistryAdaptor>(this)),
      registry_(options.registry) {
  if (metrics_) {
    metrics_hook_ = metrics_->registry.AddCollectHook([this] { UpdateWorkerMetrics(); });
  }
}

Router::~Router() {
  if (metrics_) metrics_->registry.RemoveCollectHook(metrics_hook_);
}

void Router::UpdateWorkerMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  for (const WorkerEntry* w : registry_.List()) {
    metrics_->worker_healthy(w->id, RoleName(w->role)).Set(registry_.Healthy(*w, now) ? 1 : 0);
  }
}

std::shared_ptr<grpc::Channel> Router::ChannelFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ch = channels_[address];
  if (!ch) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return ch;
}

std::optional<std::string> Router::AddressOf(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerEntry* w = registry_.Find(worker_id);
  if (w == nullptr) return std::nullopt;
  return w->address;
}

int Router::HealthyWorkers(WorkerRole role) {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_.CountHealthy(role, absl::Now());
}

int Router::InFlight() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(in_flight_.size());
}

grpc::Status Router::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                              grpc::ServerWriter<v1::GenerateResponse>* writer) {
  grpc::Status s = RunGenerate(ctx, req, writer);
  if (metrics_) metrics_->requests(s.error_code()).Increment();
  return s;
}

grpc::Status Router::RunGenerate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                 grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time t0 = absl::Now();
  auto parsed = ValidateGenerateRequest(*req, config_, *tokenizer_, options_.limits);
  if (!parsed.ok()) return ToGrpc(parsed.status());
  const GenerationRequest& greq = *parsed;
  const int prompt_len = static_cast<int>(greq.prompt.size());

  std::string request_id = req->request_id();
  if (request_id.empty()) request_id = absl::StrFormat("req-%d", next_request_++);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!in_flight_.insert(request_id).second) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("request_id: \"%s\" is already in flight", request_id));
    }
  }
  struct InFlightGuard {
    Router* r;
    std::string id;
    ~InFlightGuard() {
      std::lock_guard<std::mutex> lock(r->mu_);
      r->in_flight_.erase(id);
    }
  } in_flight_guard{this, request_id};
  PhaseGauges phase(metrics_);
  CancelWatcher watcher(ctx);
  // The client's own timer fires first and cancels the stream; our copy of its deadline (sent
  // as a relative timeout) lands a little later. A cancel that close to the deadline is the
  // deadline.
  auto client_gone = [&]() -> grpc::Status {
    if (absl::Now() + absl::Milliseconds(50) >= absl::FromChrono(ctx->deadline())) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  };

  // 1. Admission on a decode worker: the stream that lives as long as the request there.
  const int total_tokens = static_cast<int>(
      std::min<int64_t>(int64_t{prompt_len} + greq.max_tokens, config_.max_seq_len));
  std::set<std::string> tried;
  std::unique_ptr<grpc::ClientContext> d_ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeClientMessage, v1::DecodeServerMessage>>
      d_stream;
  std::string decode_id;
  KvTarget target;
  grpc::Status last_error(grpc::StatusCode::UNAVAILABLE, "no healthy decode worker");
  for (int attempt = 0; attempt < options_.decode_attempts && !d_stream; ++attempt) {
    std::optional<std::string> pick;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pick = registry_.PickDecode(total_tokens, absl::Now(), tried);
      if (!pick && registry_.CountHealthy(WorkerRole::kDecode, absl::Now()) > 0) {
        last_error = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                  "no decode worker has room for the request");
      }
    }
    if (!pick) break;
    tried.insert(*pick);
    if (metrics_) metrics_->routing_decisions(*pick, "decode").Increment();
    auto address = AddressOf(*pick);
    if (!address) continue;
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(ctx->deadline());
    watcher.Watch(c.get());
    auto stream = v1::DecodeWorker::NewStub(ChannelFor(*address))->Decode(c.get());
    v1::DecodeClientMessage admit;
    v1::DecodeAdmit* a = admit.mutable_admit();
    a->set_request_id(request_id);
    a->mutable_prompt_ids()->Add(greq.prompt.begin(), greq.prompt.end());
    *a->mutable_sampling() = ToProto(greq.sampling);
    a->set_max_tokens(greq.max_tokens);
    a->set_ignore_eos(greq.ignore_eos);
    v1::DecodeServerMessage reply;
    if (stream->Write(admit) && stream->Read(&reply) && reply.has_admitted()) {
      target = tandem::FromProto(reply.admitted().kv_target());
      d_ctx = std::move(c);
      d_stream = std::move(stream);
      decode_id = *pick;
      std::lock_guard<std::mutex> lock(mu_);
      registry_.ReportSuccess(*pick);
      break;
    }
    stream->WritesDone();
    grpc::Status s = stream->Finish();
    watcher.Unwatch(c.get());
    if (ctx->IsCancelled()) return client_gone();
    last_error =
        s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker closed the stream") : s;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      std::lock_guard<std::mutex> lock(mu_);
      registry_.ReportFailure(*pick, absl::Now());
    } else if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      return s;  // e.g. INVALID_ARGUMENT: another worker would say the same
    }
  }
  if (!d_stream) return last_error;
  const absl::Time admitted = absl::Now();
  if (metrics_) metrics_->queue_time.Observe(absl::ToDoubleSeconds(admitted - t0));
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

  // 2. Prefill into the lease.
  const int bs = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return registry_.PrefillBlockSize();
  }();
  std::vector<uint64_t> hashes;
  if (bs > 0) {
    uint64_t parent = 0;
    for (int b = 0; (b + 1) * bs <= prompt_len - 1; ++b) {
      parent = HashBlockTokens(parent, std::span<const int>(greq.prompt).subspan(b * bs, bs));
      hashes.push_back(parent);
    }
  }
  std::optional<std::string> prefill_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_id = registry_.PickPrefill(hashes, absl::Now(), {});
  }
  if (!prefill_id) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
  if (metrics_) metrics_->routing_decisions(*prefill_id, "prefill").Increment();
  auto p_address = AddressOf(*prefill_id);
  if (!p_address) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker vanished");
  v1::PrefillRequest preq;
  preq.set_request_id(request_id);
  preq.mutable_prompt_ids()->Add(greq.prompt.begin(), greq.prompt.end());
  *preq.mutable_sampling() = ToProto(greq.sampling);
  *preq.mutable_kv_target() = ToProto(target);
  v1::PrefillResponse presp;
  grpc::ClientContext p_ctx;
  p_ctx.set_deadline(ctx->deadline());
  watcher.Watch(&p_ctx);
  grpc::Status ps =
      v1::PrefillWorker::NewStub(ChannelFor(*p_address))->Prefill(&p_ctx, preq, &presp);
  watcher.Unwatch(&p_ctx);
  if (ctx->IsCancelled()) return client_gone();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ps.ok()) {
      registry_.ReportSuccess(*prefill_id);
    } else if (ps.error_code() == grpc::StatusCode::UNAVAILABLE) {
      registry_.ReportFailure(*prefill_id, absl::Now());
    }
  }
  if (!ps.ok()) return ps;
  if (metrics_) metrics_->prompt_tokens.Increment(prompt_len);

  // 3. Stream: the first token from the prefill, the rest from the decode worker.
  IncrementalDecoder detok(tokenizer_.get(), greq.prompt);
  StopStringMatcher stop(greq.stop_strings);
  int generated = 0;
  std::optional<FinishReason> finish;
  v1::GenerateResponse resp;
  resp.set_request_id(request_id);
  // Adds one token (and its logprobs, when asked for) to `resp`; returns true when the request
  // ends with it.
  auto add_token = [&](int token, const v1::TokenLogprobs* logprobs) {
    ++generated;
    resp.add_token_ids(token);
    if (logprobs != nullptr && greq.sampling.logprobs) *resp.add_logprobs() = *logprobs;
    finish = CheckFinish(config_, greq, token, generated, prompt_len + generated);
    if (finish == FinishReason::kStop) return true;  // EOS: no text
    bool stopped = false;
    resp.mutable_text()->append(stop.Add(detok.Add(token), &stopped));
    if (stopped) finish = FinishReason::kStop;
    return finish.has_value();
  };
  auto finish_response = [&]() {
    if (*finish != FinishReason::kStop) {
      bool stopped = false;
      std::string tail = stop.Add(detok.Flush(), &stopped);
      if (!stopped) tail += stop.Flush();
      resp.mutable_text()->append(tail);
    }
    resp.set_finish_reason(ToProto(*finish));
    resp.mutable_usage()->set_prompt_tokens(prompt_len);
    resp.mutable_usage()->set_completion_tokens(generated);
    v1::Timings* t = resp.mutable_timings();
    t->set_queue_seconds(absl::ToDoubleSeconds(admitted - t0));
    t->set_prefill_seconds(presp.queue_seconds() + presp.compute_seconds() +
                           presp.kv_transfer_seconds());
    t->set_kv_transfer_seconds(presp.kv_transfer_seconds());
    t->set_e2e_seconds(Since(t0));
  };

  // Sends `resp` to the client and counts its tokens: the first one for TTFT, every later one
  // for the inter-token latency (a message of k tokens spreads its wait over the k).
  absl::Time last_token_at;
  double ttft = 0;
  auto write = [&]() {
    if (!writer->Write(resp)) return false;
    const int n = resp.token_ids_size();
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
  // The request ended well and its last message is written.
  auto succeeded = [&]() {
    if (metrics_ == nullptr) return grpc::Status::OK;
    const double e2e = Since(t0);
    metrics_->success(FinishReasonName(*finish)).Increment();
    metrics_->e2e_request_latency.Observe(e2e);
    if (generated > 1) metrics_->time_per_output_token.Observe((e2e - ttft) / (generated - 1));
    return grpc::Status::OK;
  };

  const bool done_at_first = add_token(presp.first_token(), &presp.first_logprobs());
  ttft = Since(t0);
  resp.mutable_timings()->set_ttft_seconds(ttft);
  if (done_at_first) {
    finish_response();
    if (!write()) return client_gone();
    return succeeded();  // the closer cancels the decode stream: blocks freed there
  }
  if (!write()) return client_gone();
  v1::DecodeClientMessage start;
  start.mutable_start()->set_first_token(presp.first_token());
  if (!d_stream->Write(start)) {
    closer.finished = true;
    grpc::Status s = d_stream->Finish();
    if (ctx->IsCancelled()) return client_gone();
    return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker closed the stream")
                  : s;
  }
  v1::DecodeServerMessage msg;
  while (d_stream->Read(&msg)) {
    resp.Clear();
    resp.set_request_id(request_id);
    bool ended = false;
    if (msg.has_tokens()) {
      const v1::DecodeTokens& t = msg.tokens();
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
      return succeeded();
    }
    if (resp.token_ids_size() > 0 && !write()) return client_gone();
  }
  closer.finished = true;
  grpc::Status s = d_stream->Finish();
  if (ctx->IsCancelled()) return client_gone();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
      registry_.ReportFailure(decode_id, absl::Now());
  }
  return s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode stream ended without Finished")
                : s;
}

grpc::Status Router::Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                           v1::ScoreResponse* resp) {
  std::vector<int> ids;
  if (req->has_text()) {
    if (req->text().empty())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text: must not be empty");
    ids = tokenizer_->Encode(req->text(), true);
  } else if (req->has_tokens()) {
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
  const auto ids = tokenizer_->Encode(req->text(), req->add_special_tokens());
  resp->mutable_token_ids()->Add(ids.begin(), ids.end());
  return grpc::Status::OK;
}

grpc::Status Router::Detokenize(const v1::DetokenizeRequest* req, v1::DetokenizeResponse* resp) {
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

grpc::Status Router::Register(const v1::RegisterRequest* req, v1::RegisterResponse* resp) {
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
    registry_.Register(req->worker_id(), role, req->address(), FromProto(req->load()), absl::Now());
  }
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  return grpc::Status::OK;
}

grpc::Status Router::Heartbeat(const v1::HeartbeatRequest* req, v1::HeartbeatResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  resp->set_known(
      registry_.Heartbeat(req->worker_id(), FromProto(req->load()), req->serving(), absl::Now()));
  return grpc::Status::OK;
}

grpc::Status Router::ListWorkers(v1::ListWorkersResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  for (const WorkerEntry* w : registry_.List()) {
    v1::WorkerInfo* info = resp->add_workers();
    info->set_worker_id(w->id);
    info->set_role(w->role == WorkerRole::kPrefill ? v1::WORKER_ROLE_PREFILL
                                                   : v1::WORKER_ROLE_DECODE);
    info->set_address(w->address);
    *info->mutable_load() = ToProto(w->load);
    info->set_healthy(registry_.Healthy(*w, now));
  }
  return grpc::Status::OK;
}

}  // namespace tandem
