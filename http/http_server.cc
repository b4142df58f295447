#include "http/http_server.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "formats/mapped_file.h"
#include "http/http_listener.h"
#include "http/responses.h"
#include "router/async.h"
#include "router/request_id.h"
#include "router/router.h"
#include "security/secure_socket.h"

namespace tandem {
namespace {

using openai::ApiError;
using openai::Endpoint;

// An error response; a 429 or 503 (overload, quotas, no worker) also says when to come back:
// Retry-After in whole seconds, from the "retry after N ms" its message carries (else 1).
void Reply(HttpResponseWriter& w, const ApiError& e) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.http_status == 429 || e.http_status == 503) {
    int64_t ms = 1000;
    constexpr absl::string_view kHint = "retry after ";
    if (const size_t at = absl::string_view(e.message).find(kHint); at != absl::string_view::npos) {
      const absl::string_view rest = absl::string_view(e.message).substr(at + kHint.size());
      int64_t v = 0;
      if (absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &v) && v > 0) ms = v;
    }
    headers.emplace_back("Retry-After", std::to_string(std::max<int64_t>(1, (ms + 999) / 1000)));
  }
  w.Send(e.http_status, "application/json", openai::ErrorBody(e), headers);
}

ApiError Error(int status, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = status >= 500 ? "server_error" : "invalid_request_error";
  if (status == 404) e.code = "not_found";
  e.message = std::move(message);
  return e;
}

// What a whole response holds per generated token, as built (http/openai.h): its text and id,
// and each log-probability entry (the token's and every top alternative's).
constexpr size_t kBytesPerToken = 64;
constexpr size_t kBytesPerLogprob = 160;

uint64_t RandomSeed() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  return gen();
}

}  // namespace

absl::Status HttpServerOptions::Validate() const {
  if (port < 0 || port > 65535)
    return absl::InvalidArgumentError("http port must be in [0, 65535]");
  if (threads < 1) return absl::InvalidArgumentError("http threads must be >= 1");
  if (request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http request timeout must be positive");
  }
  if (max_connections < 1 || max_connections_per_client < 1) {
    return absl::InvalidArgumentError("http connection limits must be >= 1");
  }
  if (max_queued < 1) return absl::InvalidArgumentError("--http-max-queued must be >= 1");
  if (absl::StatusOr<TrustedProxies> p = TrustedProxies::Parse(trusted_proxies); !p.ok()) {
    return p.status();
  }
  if (header_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http header timeout must be positive");
  }
  if (max_buffered_bytes < max_body_bytes + HttpParserLimits().max_header_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("http max buffered bytes must be at least the largest request (%d bytes)",
                        max_body_bytes + HttpParserLimits().max_header_bytes));
  }
  return absl::OkStatus();
}

struct HttpServer::Impl {
  Router* router;
  openai::ServedModel model;
  RouterMetrics* metrics;
  HttpServerOptions options;
  TrustedProxies proxies;
  openai::ResponseStore responses{openai::ResponseStore::Limits{}};
  std::unique_ptr<HttpListener> listener;
  std::atomic<bool> stopping{false};  // the server is shutting down: cancel every request
  std::atomic<size_t> building{0};    // reserved by whole responses being built

  // Counts a generation request that ended before reaching the router (which counts its own).
  void Count(grpc::StatusCode code) {
    if (metrics) metrics->requests(code).Increment();
  }

  void Handle(const HttpRequest& req, HttpResponseWriter& w) {
    try {
      Route(req, w);
    } catch (const std::exception& e) {
      // A bug, not the client's fault; the server keeps serving.
      if (!w.started()) Reply(w, Error(500, absl::StrFormat("internal error: %s", e.what())));
    }
  }

  // On the listener's event loop, from a request's headers, before any byte of its body is read:
  // every /v1 endpoint needs a key when the router has keys (Router::Authorize, which gRPC uses
  // too, counts refused completions as UNAUTHENTICATED requests; /v1/models is not a request
  // there). /metrics too: Prometheus sends the key as a bearer token (authorization in its scrape
  // config). A refused connection is closed without reading its body.
  std::optional<HttpRefusal> CheckHead(const HttpRequest& head) const {
    const std::string& path = head.path;
    // /tokenize and /detokenize as gRPC's Tokenize and Detokenize (vLLM leaves them open);
    // /health, /ping and /version stay open.
    if (!path.starts_with("/v1/") && path != "/metrics" && path != "/tokenize" &&
        path != "/detokenize" && path != "/tokenizer_info") {
      return std::nullopt;
    }
    const bool generation = path.starts_with("/v1/") && !path.starts_with("/v1/models");
    const grpc::Status s = router->Authorize(std::string(head.Header("authorization")), generation);
    if (s.ok()) return std::nullopt;
    const ApiError e = openai::ToApiError(s, nullptr);
    return HttpRefusal{e.http_status, openai::ErrorBody(e), {}};
  }

  void Route(const HttpRequest& req, HttpResponseWriter& w) {
    const std::string& path = req.path;
    // The API key was checked from the headers (CheckHead).
    auto method = [&](const char* want) {
      if (req.method == want) return true;
      Reply(w, Error(405, absl::StrFormat("%s %s: the method must be %s", req.method, path, want)));
      return false;
    };
    if (path == "/health") {
      if (method("GET")) Health(w);
    } else if (path == "/ping") {
      // vLLM's (and SageMaker's) health check, GET or POST: /health's answer.
      if (req.method == "POST" || method("GET")) Health(w);
    } else if (path == "/version") {
      if (method("GET")) w.Send(200, "application/json", R"({"version": ")" TANDEM_VERSION R"("})");
    } else if (path == "/tokenize") {
      if (method("POST")) Tokenize(req, w);
    } else if (path == "/detokenize") {
      if (method("POST")) Detokenize(req, w);
    } else if (path == "/tokenizer_info") {
      if (method("GET")) TokenizerInfo(w);
    } else if (path == "/metrics" && (!options.serve_metrics || metrics == nullptr)) {
      Reply(w, Error(404,
                     "GET /metrics: off on this port (the router runs with --no-http-metrics; "
                     "scrape its --metrics-port)"));
    } else if (path == "/metrics") {
      // The process's whole registry, as on the metrics port (vLLM serves it on its API port).
      if (method("GET")) {
        w.Send(200, "text/plain; version=0.0.4; charset=utf-8", metrics->registry.Serialize());
      }
    } else if (path == "/v1/models") {
      if (method("GET")) Models("", w);
    } else if (path.starts_with("/v1/models/") && path.size() > 11) {
      if (method("GET")) Models(path.substr(11), w);
    } else if (path == "/v1/completions") {
      if (method("POST")) Generate(Endpoint::kCompletions, req, w);
    } else if (path == "/v1/chat/completions") {
      if (method("POST")) Generate(Endpoint::kChatCompletions, req, w);
    } else if (path == "/v1/responses") {
      if (method("POST")) Generate(Endpoint::kResponses, req, w);
    } else if (constexpr std::string_view kStored = "/v1/responses/";
               path.starts_with(kStored) && path.size() > kStored.size() &&
               path.find('/', kStored.size()) == std::string::npos) {
      if (req.method == "DELETE" || method("GET")) {
        StoredResponse(req, path.substr(kStored.size()), w);
      }
    } else {
      Reply(w, Error(404, absl::StrFormat("no such endpoint: %s %s", req.method, path)));
    }
  }

  void Models(const std::string& id, HttpResponseWriter& w) {
    nlohmann::ordered_json m = {{"id", model.id},
                                {"object", "model"},
                                {"created", 0},
                                {"owned_by", "tandem"},
                                {"max_model_len", model.max_context}};
    if (!id.empty()) {
      if (id != model.id) {
        Reply(w, openai::ToApiError(
                     grpc::Status(grpc::StatusCode::NOT_FOUND,
                                  absl::StrFormat("model: the model '%s' does not exist", id)),
                     nullptr));
        return;
      }
      w.Send(200, "application/json", m.dump());
      return;
    }
    nlohmann::ordered_json list = {{"object", "list"}, {"data", {m}}};
    w.Send(200, "application/json", list.dump());
  }

  void Health(HttpResponseWriter& w) {
    v1::ModelInfo info;
    router->GetModelInfo(&info);
    const bool ok = info.prefill_workers() > 0 && info.decode_workers() > 0;
    nlohmann::ordered_json body = {{"status", ok ? "ok" : "unavailable"},
                                   {"prefill_workers", info.prefill_workers()},
                                   {"decode_workers", info.decode_workers()}};
    w.Send(ok ? 200 : 503, "application/json", body.dump());
  }

  // vLLM's /tokenize: through Router::Tokenize, as gRPC's Tokenize (the same limits).
  void Tokenize(const HttpRequest& req, HttpResponseWriter& w) {
    auto t = openai::ParseTokenizeRequest(req.body, model);
    if (!t.ok()) return Reply(w, openai::ToApiError(t.status(), nullptr));
    v1::TokenizeRequest tr;
    tr.set_text(std::move(t->text));
    tr.set_add_special_tokens(t->add_special_tokens);
    v1::TokenizeResponse resp;
    if (grpc::Status s = router->Tokenize(&tr, &resp); !s.ok()) {
      return Reply(w, openai::ToApiError(s, nullptr));  // "text: ..." is the prompt
    }
    tr.Clear();
    // Streamed as it is built (24 answers of 4 MB prompts with their token strings took the
    // router to 8 GB when each was built whole).
    if (!w.StartStream(200, "application/json")) return;
    if (openai::WriteTokenizeResponse(
            std::span<const int>(resp.token_ids().data(), resp.token_ids_size()),
            t->return_token_strs, model, [&](std::string_view piece) { return w.Write(piece); })) {
      w.End();
    }
  }

  // Whose stored responses a request may read: its API key's where keys are checked (its
  // tenant, as the listener found it), else everyone's (the API is open; response ids are
  // unguessable).
  std::string StoreScope(const HttpRequest& req) const {
    return router->api_keys_enabled() ? req.tenant : "";
  }

  // GET and DELETE /v1/responses/{id}: a stored response, or 404.
  void StoredResponse(const HttpRequest& req, const std::string& id, HttpResponseWriter& w) {
    const std::string scope = StoreScope(req);
    auto not_found = [&] {
      Reply(w, Error(404, absl::StrFormat("no stored response \"%s\" (the router keeps "
                                          "responses made with store for an hour, in memory)",
                                          id)));
    };
    if (req.method == "DELETE") {
      if (!responses.Delete(scope, id)) return not_found();
      w.Send(200, "application/json",
             nlohmann::ordered_json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump());
      return;
    }
    std::optional<openai::StoredResponse> r = responses.Get(scope, id, absl::Now());
    if (!r) return not_found();
    w.Send(200, "application/json",
           r->object.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }

  // vLLM's /tokenizer_info (openai::TokenizerInfoBody).
  void TokenizerInfo(HttpResponseWriter& w) {
    w.Send(200, "application/json",
           openai::TokenizerInfoBody(model).dump(-1, ' ', false,
                                                 nlohmann::ordered_json::error_handler_t::replace));
  }

  void Detokenize(const HttpRequest& req, HttpResponseWriter& w) {
    auto ids = openai::ParseDetokenizeRequest(req.body, model);
    if (!ids.ok()) return Reply(w, openai::ToApiError(ids.status(), nullptr));
    v1::DetokenizeRequest dr;
    dr.mutable_token_ids()->Add(ids->begin(), ids->end());
    v1::DetokenizeResponse resp;
    if (grpc::Status s = router->Detokenize(&dr, &resp); !s.ok()) {
      return Reply(w, openai::ToApiError(s, nullptr));
    }
    w.Send(200, "application/json",
           nlohmann::ordered_json{{"prompt", resp.text()}}.dump(
               -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }

  // A request's deadline, from --http-timeout-ms (none: infinite).
  absl::Time Deadline() const {
    return options.request_timeout == absl::InfiniteDuration()
               ? absl::InfiniteFuture()
               : absl::Now() + options.request_timeout;
  }

  // The prompt's token ids as the router's ingress makes them (text with the model's special
  // tokens), checked as it checks them.
  grpc::Status PromptIds(const v1::GenerateRequest& g, std::vector<int>* ids) const {
    auto invalid = [](const std::string& why) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
    };
    if (g.has_text()) {
      if (g.text().empty()) return invalid("text: must not be empty");
      if (const int limit = IngressLimits().max_text_bytes;
          g.text().size() > static_cast<size_t>(limit)) {
        return invalid(absl::StrFormat("text: longer than %d bytes", limit));
      }
      *ids = model.tokenizer->Encode(g.text(), /*add_special_tokens=*/true);
    } else {
      ids->assign(g.tokens().ids().begin(), g.tokens().ids().end());
    }
    if (ids->empty()) return invalid("text: tokenizes to no tokens");
    if (static_cast<int>(ids->size()) > model.max_context) {
      return invalid(
          absl::StrFormat("tokens.ids: the prompt is %d tokens; the context length is %d",
                          ids->size(), model.max_context));
    }
    for (int id : *ids) {
      if (id < 0 || id >= model.tokenizer->vocab_size()) {
        return invalid(absl::StrFormat("tokens.ids: id %d is outside the vocabulary", id));
      }
    }
    return grpc::Status::OK;
  }

  // Completions' echo with logprobs, vLLM's prompt_logprobs and max_tokens 0: every prompt's
  // tokens (their counts in `prompt_tokens`), scored by Router::Score on a prefill worker when
  // log-probabilities are asked for, given to the builder.
  grpc::Status ScorePrompts(const openai::Request& request, openai::ResponseBuilder* builder,
                            std::vector<int>* prompt_tokens) {
    const size_t group = static_cast<size_t>(std::max(1, request.best_of));
    const int top = std::max(request.echo_logprobs ? request.generate.sampling().top_logprobs() : 0,
                             request.prompt_logprobs);
    for (size_t p = 0; p * group < request.choices.size(); ++p) {
      std::vector<int> ids;
      if (grpc::Status s = PromptIds(request.choices[p * group], &ids); !s.ok()) return s;
      v1::ScoreResponse score;
      if (ids.size() >= 2 && (request.echo_logprobs || request.prompt_logprobs >= 0)) {
        v1::ScoreRequest sr;
        sr.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
        sr.set_top_logprobs(top);
        if (grpc::Status s = router->Score(sr, Deadline(), &score); !s.ok()) return s;
      }
      builder->SetPromptScore(static_cast<int>(p), ids, score);
      prompt_tokens->push_back(static_cast<int>(ids.size()));
    }
    return grpc::Status::OK;
  }

  // max_tokens 0: each choice is its prompt alone (echo), finished at its length.
  void AnswerPromptOnly(const openai::Request& request, const std::vector<int>& prompt_tokens,
                        openai::ResponseBuilder& builder, HttpResponseWriter& w) {
    const std::string id = NewRequestId();
    const size_t group = static_cast<size_t>(std::max(1, request.best_of));
    std::string events;
    for (size_t i = 0; i < request.choices.size(); ++i) {
      v1::GenerateResponse m;
      m.set_request_id(id);
      m.set_finish_reason(v1::FINISH_REASON_LENGTH);
      m.mutable_usage()->set_prompt_tokens(prompt_tokens[i / group]);
      events += builder.Add(static_cast<int>(i), m);
    }
    Count(grpc::StatusCode::OK);
    if (!request.stream) {
      w.Send(200, "application/json", builder.Body());
      return;
    }
    if (w.StartStream(200, "text/event-stream",
                      {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}) &&
        w.Write(events + builder.StreamEnd())) {
      w.End();
    }
  }

  // One generation request once its choices run: held without a thread (the response outlives
  // the handler, HttpResponseWriter::Hold), each choice its own request through the router (a
  // coroutine, Router::StartGenerate). Their messages meet in the builder (and the stream) under
  // `mu`. A client that goes away, and one failing choice, fire `gone`, which cancels them all:
  // the request fails as a whole.
  struct Generation {
    Impl* impl = nullptr;
    openai::Request request;
    std::unique_ptr<openai::AnswerBuilder> answer;
    openai::ResponsesBuilder* responses_answer = nullptr;
    std::string scope;
    std::shared_ptr<HttpResponseWriter> w;
    std::shared_ptr<async::Signal> gone = std::make_shared<async::Signal>();
    std::mutex mu;
    std::vector<grpc::Status> statuses;
    int running = 0;
    size_t reserved = 0;  // of Impl::building, given back once the response is sent

    ~Generation() { impl->building -= reserved; }

    // Choice `index`'s message: its events into the stream (or the whole answer).
    void Write(int index, const v1::GenerateResponse& m, std::function<void(bool)> done) {
      std::lock_guard<std::mutex> lock(mu);
      std::string events;
      try {
        events = answer->Add(index, m);
      } catch (const std::exception& e) {
        // A bug, not the client's fault: this request fails, the server keeps serving.
        statuses[index] = grpc::Status(grpc::StatusCode::INTERNAL,
                                       absl::StrFormat("internal error: %s", e.what()));
        done(false);
        return;
      }
      if (!request.stream) return done(true);
      // Errors before the first token (validation, no capacity, ...) get their HTTP status;
      // once the stream has started they end it as an error event.
      if (!w->started() &&
          !w->StartStream(200, "text/event-stream",
                          {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
        return done(false);
      }
      if (events.empty()) return done(true);
      if (!w->WriteThen(events, done)) done(false);
    }

    void Done(int index, const grpc::Status& s) {
      bool last;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (statuses[index].ok()) statuses[index] = s;
        last = --running == 0;
      }
      if (!s.ok()) gone->Fire();  // the others are cancelled
      if (last) Finish();
    }

    // Every choice has ended: the response's end, then the connection goes back.
    void Finish() {
      // The error to report: the first choice that failed for its own reason (the others were
      // cancelled because of it).
      grpc::Status s = grpc::Status::OK;
      for (const grpc::Status& st : statuses) {
        if (st.ok()) continue;
        if (s.ok() || (s.error_code() == grpc::StatusCode::CANCELLED &&
                       st.error_code() != grpc::StatusCode::CANCELLED)) {
          s = st;
        }
      }
      const int total = static_cast<int>(statuses.size());
      if (s.ok() && responses_answer != nullptr && request.store) {
        impl->responses.Put(scope, responses_answer->id(), responses_answer->ToStore(),
                            absl::Now());
      }
      if (s.ok() && impl->metrics) {
        // vLLM's request_params_n: once per prompt (vLLM makes a request of each).
        for (int p = 0; p * request.best_of < total; ++p) {
          impl->metrics->request_params_n.Observe(request.n);
        }
      }
      if (!request.stream) {
        if (!s.ok()) {
          Reply(*w, openai::ToApiError(s, &request));
        } else {
          w->Send(200, "application/json", answer->Body());
        }
      } else if (!w->started()) {
        Reply(*w, openai::ToApiError(s, &request));
      } else {
        const std::string tail =
            s.ok() ? answer->StreamEnd() : answer->StreamFailure(openai::ToApiError(s, &request));
        // The stream's end, without waiting for a slow client's room on this thread.
        auto end = [w = w](bool room) {
          if (room) w->End();
          w->Release();
        };
        if (!w->WriteThen(tail, end)) w->Release();
        return;
      }
      w->Release();
    }
  };

  // Parsing, tokenizing and prompt scoring run on this handler's thread (the client's bytes are
  // already all here); the choices then run without it, and the thread serves the next request.
  void Generate(Endpoint endpoint, const HttpRequest& req, HttpResponseWriter& w) {
    // A client that left while its request waited or was parsed costs no more work.
    auto gone = [&w] { return w.ClientGone(); };
    auto gen = std::make_shared<Generation>();
    gen->impl = this;
    gen->scope = StoreScope(req);
    auto previous = [&](const std::string& id) -> std::optional<nlohmann::ordered_json> {
      std::optional<openai::StoredResponse> r = responses.Get(gen->scope, id, absl::Now());
      if (!r) return std::nullopt;
      return std::move(r->messages);
    };
    auto parsed = endpoint == Endpoint::kResponses
                      ? openai::ParseResponsesRequest(req.body, model, RandomSeed(), gone, previous)
                      : openai::ParseRequest(endpoint, req.body, model, RandomSeed(), gone);
    if (!parsed.ok()) {
      Count(static_cast<grpc::StatusCode>(parsed.status().code()));
      Reply(w, openai::ToApiError(parsed.status(), nullptr));
      return;
    }
    gen->request = *std::move(parsed);
    const openai::Request& request = gen->request;
    // The API key's limits: choices per request here, the rest in the router.
    const KeyLimits limits = router->LimitsOf(req.Header("authorization"));
    if (const int asked = std::max(request.n, request.best_of);
        limits.max_n > 0 && asked > limits.max_n) {
      const grpc::Status s(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrFormat("%s: %d choices asked; this API key allows at most %d "
                          "(its max_n)",
                          request.best_of > request.n ? "best_of" : "n", asked, limits.max_n));
      Count(s.error_code());
      return Reply(w, openai::ToApiError(s, &request));
    }
    const int64_t created = absl::ToUnixSeconds(absl::Now());
    if (endpoint == Endpoint::kResponses) {
      auto r = std::make_unique<openai::ResponsesBuilder>(request, model, created);
      gen->responses_answer = r.get();
      gen->answer = std::move(r);
    } else {
      auto completions = std::make_unique<openai::ResponseBuilder>(request, model, created);
      if (request.echo_logprobs || request.prompt_logprobs >= 0 || request.score_only) {
        std::vector<int> prompt_tokens;
        if (grpc::Status s = ScorePrompts(request, completions.get(), &prompt_tokens); !s.ok()) {
          Count(s.error_code());
          return Reply(w, openai::ToApiError(s, &request));
        }
        if (request.score_only) {
          return AnswerPromptOnly(request, prompt_tokens, *completions, w);
        }
      }
      gen->answer = std::move(completions);
    }
    const int total = static_cast<int>(request.choices.size());
    if (!request.stream) {
      // The most a whole response may reach, reserved until it is sent.
      const int top = request.generate.sampling().top_logprobs();
      const bool logprobs = request.want_logprobs || request.best_of > request.n;
      const size_t per_token = kBytesPerToken + (logprobs ? (top + 1) * kBytesPerLogprob : 0);
      size_t most = 0;
      for (const v1::GenerateRequest& g : request.choices) {
        most += static_cast<size_t>(std::max(0, g.max_tokens())) * per_token;
      }
      const size_t before = building.fetch_add(most);
      gen->reserved = most;
      if (before + most > options.max_building_bytes && most > 0) {
        const grpc::Status s(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrFormat("stream: this whole response may reach %d MiB and the server is "
                            "building %d MiB of them (--http-max-building-bytes %d MiB); send "
                            "it with \"stream\": true, or retry after 1000 ms",
                            most >> 20, before >> 20, options.max_building_bytes >> 20));
        Count(s.error_code());
        openai::ApiError e = openai::ToApiError(s, &request);
        e.param = "stream";  // the field that would have it served
        return Reply(w, e);
      }
    }
    gen->statuses.assign(total, grpc::Status::OK);
    gen->running = total;
    gen->w = w.Hold();
    if (stopping) gen->gone->Fire();
    w.OnClientGone([g = gen->gone] { g->Fire(); });
    for (int i = 0; i < total; ++i) {
      AsyncCall call;
      call.deadline = Deadline();
      call.tenant = req.tenant;
      call.limits = limits;
      call.gone = gen->gone;
      call.write = [gen, i](const v1::GenerateResponse& m, std::function<void(bool)> done) {
        gen->Write(i, m, std::move(done));
      };
      router->StartGenerate(request.choices[i], std::move(call),
                            [gen, i](grpc::Status s) { gen->Done(i, s); });
    }
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  impl_->stopping = true;
  impl_->listener.reset();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Router* router,
                                                              openai::ServedModel model,
                                                              RouterMetrics* metrics,
                                                              HttpServerOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  Impl* p = impl.get();
  p->router = router;
  p->model = std::move(model);
  p->metrics = metrics;
  p->options = options;
  HttpListenerOptions lo;
  lo.host = options.host;
  lo.port = options.port;
  lo.threads = options.threads;
  lo.limits.max_body_bytes = options.max_body_bytes;
  lo.header_timeout = options.header_timeout;
  lo.body_timeout = options.body_timeout;
  lo.idle_timeout = options.idle_timeout;
  lo.max_connections = options.max_connections;
  lo.max_connections_per_client = options.max_connections_per_client;
  lo.max_buffered_bytes = options.max_buffered_bytes;
  lo.response_buffer_bytes = options.response_buffer_bytes;
  lo.min_write_rate = options.min_write_rate;
  lo.check_head = [p](const HttpRequest& head) { return p->CheckHead(head); };
  lo.max_queued_requests = options.max_queued;
  p->proxies = *TrustedProxies::Parse(options.trusted_proxies);  // checked by Validate
  lo.tenant_of = [p](const HttpRequest& head) {
    return TenantOf(head, p->proxies, p->router->api_keys_enabled());
  };
  if (!options.tls.cert.empty()) {
    // HTTPS with the gRPC ports' certificate; with a CA, client certificates are required.
    auto tls = LoadServerTls(options.tls);
    absl::StatusOr<std::shared_ptr<SslContext>> ctx =
        tls.ok() ? SslContext::ForServer(*tls) : tls.status();
    if (!ctx.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--tls-cert/--tls-key/--tls-ca: the HTTP port cannot use %s and %s%s: %s",
          options.tls.cert, options.tls.key,
          options.tls.ca.empty() ? "" : " with " + options.tls.ca, ctx.status().message()));
    }
    lo.tls = *std::move(ctx);
  }
  auto listener = HttpListener::Start(
      lo, [p](const HttpRequest& req, HttpResponseWriter& w) { p->Handle(req, w); },
      [](int status, const std::string& message) {
        return openai::ErrorBody(Error(status, message));
      });
  if (!listener.ok()) return listener.status();
  p->listener = *std::move(listener);
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(impl)));
  server->address_ = p->listener->address();
  return server;
}

int HttpServer::connections() const { return impl_->listener->connections(); }

}  // namespace tandem
