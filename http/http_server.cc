// The only translation unit that includes cpp-httplib.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/mapped_file.h"
#include "router/router.h"

namespace tandem {
namespace {

using openai::ApiError;
using openai::Endpoint;

// Whether the HTTP client of a request has gone away. cpp-httplib 0.11 gives handlers no handle
// on their connection, so the socket is found by its address pair (local port, peer address and
// port: unique among open connections), then polled for the peer's FIN or a reset. A request
// whose socket is not found is only noticed through a failed write.
class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req) : fd_(FindSocket(req)) {}

  bool Gone() const {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
  }

 private:
  static std::string AddressOf(const sockaddr_storage& a, int* port) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      *port = ntohs(in->sin_port);
      ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    } else if (a.ss_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
      *port = ntohs(in->sin6_port);
      ::inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf));
    }
    return buf;
  }

  static int FindSocket(const httplib::Request& req) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    while (dirent* e = ::readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0') continue;
      sockaddr_storage local{}, peer{};
      socklen_t ll = sizeof(local), pl = sizeof(peer);
      if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
          ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) {
        continue;
      }
      int local_port = -1, peer_port = -1;
      AddressOf(local, &local_port);
      const std::string peer_addr = AddressOf(peer, &peer_port);
      if (local_port == req.local_port && peer_port == req.remote_port &&
          peer_addr == req.remote_addr) {
        found = static_cast<int>(fd);
        break;
      }
    }
    ::closedir(dir);
    return found;
  }

  int fd_;
};

void Reply(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(openai::ErrorBody(e), "application/json");
}

ApiError NotFound(const std::string& what) {
  ApiError e;
  e.http_status = 404;
  e.type = "invalid_request_error";
  e.code = "not_found";
  e.message = what;
  return e;
}

uint64_t RandomSeed() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  return gen();
}

// One streaming request: the generation runs on its own thread (the handler must return before
// httplib sends anything), its server-sent events queue here for the content provider.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> events;
  bool started = false;  // the first message arrived: the answer is 200
  bool done = false;
  grpc::Status status;
  std::atomic<bool> gone{false};  // the client left (a write failed, or the server stops)
  std::thread thread;
};

}  // namespace

absl::Status HttpServerOptions::Validate() const {
  if (port < 0 || port > 65535)
    return absl::InvalidArgumentError("http port must be in [0, 65535]");
  if (threads < 1) return absl::InvalidArgumentError("http threads must be >= 1");
  if (request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http request timeout must be positive");
  }
  return absl::OkStatus();
}

struct HttpServer::Impl {
  Router* router;
  openai::ServedModel model;
  RouterMetrics* metrics;
  HttpServerOptions options;
  std::unique_ptr<httplib::Server> server;  // an httplib::SSLServer under TLS
  std::thread thread;
  std::atomic<bool> stopping{false};  // the server is shutting down: cancel every request

  // Counts a generation request that ended before reaching the router (which counts its own).
  void Count(grpc::StatusCode code) {
    if (metrics) metrics->requests(code).Increment();
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    nlohmann::ordered_json m = {{"id", model.id},
                                {"object", "model"},
                                {"created", 0},
                                {"owned_by", "tandem"},
                                {"max_model_len", model.max_context}};
    if (req.matches.size() > 1) {
      if (req.matches[1] != model.id) {
        Reply(res, openai::ToApiError(
                       grpc::Status(grpc::StatusCode::NOT_FOUND,
                                    absl::StrFormat("model: the model '%s' does not exist",
                                                    req.matches[1].str())),
                       nullptr));
        return;
      }
      res.set_content(m.dump(), "application/json");
      return;
    }
    nlohmann::ordered_json list = {{"object", "list"}, {"data", {m}}};
    res.set_content(list.dump(), "application/json");
  }

  void Health(httplib::Response& res) {
    v1::ModelInfo info;
    router->GetModelInfo(&info);
    const bool ok = info.prefill_workers() > 0 && info.decode_workers() > 0;
    nlohmann::ordered_json body = {{"status", ok ? "ok" : "unavailable"},
                                   {"prefill_workers", info.prefill_workers()},
                                   {"decode_workers", info.decode_workers()}};
    res.status = ok ? 200 : 503;
    res.set_content(body.dump(), "application/json");
  }

  StreamCall MakeCall() const {
    StreamCall call;
    call.deadline = options.request_timeout == absl::InfiniteDuration()
                        ? absl::InfiniteFuture()
                        : absl::Now() + options.request_timeout;
    return call;
  }

  void Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    auto parsed = openai::ParseRequest(endpoint, req.body, model, RandomSeed());
    if (!parsed.ok()) {
      Count(static_cast<grpc::StatusCode>(parsed.status().code()));
      Reply(res, openai::ToApiError(parsed.status(), nullptr));
      return;
    }
    // Shared with the content provider and the generation thread, which may outlive this call.
    auto request = std::make_shared<openai::Request>(std::move(*parsed));
    auto builder = std::make_shared<openai::ResponseBuilder>(*request, model,
                                                             absl::ToUnixSeconds(absl::Now()));
    auto watch = std::make_shared<ClientWatch>(req);
    StreamCall call = MakeCall();

    if (!request->stream) {
      call.cancelled = [this, watch] { return stopping.load() || watch->Gone(); };
      call.write = [builder](const v1::GenerateResponse& m) {
        builder->Add(m);
        return true;
      };
      const grpc::Status s = router->GenerateStream(request->generate, call);
      if (!s.ok()) {
        Reply(res, openai::ToApiError(s, request.get()));
        return;
      }
      res.set_content(builder->Body(), "application/json");
      return;
    }

    auto state = std::make_shared<StreamState>();
    call.cancelled = [this, state, watch] {
      return stopping.load() || state->gone.load() || watch->Gone();
    };
    call.write = [state, builder](const v1::GenerateResponse& m) {
      std::string events = builder->Add(m);
      std::lock_guard<std::mutex> lock(state->mu);
      if (!events.empty()) state->events.push_back(std::move(events));
      state->started = true;
      state->cv.notify_all();
      return !state->gone.load();
    };
    state->thread = std::thread([this, state, request, call] {
      grpc::Status s = router->GenerateStream(request->generate, call);
      std::lock_guard<std::mutex> lock(state->mu);
      state->status = std::move(s);
      state->done = true;
      state->cv.notify_all();
    });
    {
      // Errors before the first token (validation, no capacity, ...) get their HTTP status.
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock, [&] { return state->started || state->done; });
      if (!state->started) {
        lock.unlock();
        state->thread.join();
        Reply(res, openai::ToApiError(state->status, request.get()));
        return;
      }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [state, builder, request](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(state->mu);
          for (;;) {
            state->cv.wait(lock, [&] { return !state->events.empty() || state->done; });
            while (!state->events.empty()) {
              std::string events = std::move(state->events.front());
              state->events.pop_front();
              lock.unlock();
              const bool ok = sink.write(events.data(), events.size());
              lock.lock();
              if (!ok) {
                state->gone = true;  // the generation sees it through `cancelled`
                return false;
              }
            }
            if (state->done) break;
          }
          const std::string tail = state->status.ok()
                                       ? builder->StreamEnd()
                                       : openai::ResponseBuilder::StreamError(
                                             openai::ToApiError(state->status, request.get())) +
                                             "data: [DONE]\n\n";
          lock.unlock();
          if (!sink.write(tail.data(), tail.size())) return false;
          sink.done();
          return true;
        },
        [state](bool) {
          // The response is gone (sent, failed, or never started): end the generation.
          state->gone = true;
          if (state->thread.joinable()) state->thread.join();
        });
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  impl_->stopping = true;
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
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
  if (options.tls.cert.empty()) {
    p->server = std::make_unique<httplib::Server>();
  } else {
    // HTTPS with the gRPC ports' certificate; with a CA, client certificates are required.
    auto ssl = std::make_unique<httplib::SSLServer>(
        options.tls.cert.c_str(), options.tls.key.c_str(),
        options.tls.ca.empty() ? nullptr : options.tls.ca.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--tls-cert/--tls-key/--tls-ca: the HTTP port cannot use %s and %s%s", options.tls.cert,
          options.tls.key, options.tls.ca.empty() ? "" : " with " + options.tls.ca));
    }
    p->server = std::move(ssl);
  }
  httplib::Server& svr = *p->server;
  const int threads = options.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(options.max_body_bytes);

  // Authentication before routing: every /v1 endpoint needs a key when the router has keys
  // (Router::Authorize, which gRPC uses too, counts refused completions as UNAUTHENTICATED
  // requests; /v1/models is not a request there).
  svr.set_pre_routing_handler([p](const httplib::Request& req, httplib::Response& res) {
    if (!req.path.starts_with("/v1/")) return httplib::Server::HandlerResponse::Unhandled;
    const bool generation = !req.path.starts_with("/v1/models");
    const grpc::Status s = p->router->Authorize(req.get_header_value("Authorization"), generation);
    if (s.ok()) return httplib::Server::HandlerResponse::Unhandled;
    Reply(res, openai::ToApiError(s, nullptr));
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.Get("/health", [p](const httplib::Request&, httplib::Response& res) { p->Health(res); });
  svr.Get("/v1/models",
          [p](const httplib::Request& req, httplib::Response& res) { p->Models(req, res); });
  svr.Get(R"(/v1/models/(.+))",
          [p](const httplib::Request& req, httplib::Response& res) { p->Models(req, res); });
  svr.Post("/v1/completions", [p](const httplib::Request& req, httplib::Response& res) {
    p->Generate(Endpoint::kCompletions, req, res);
  });
  svr.Post("/v1/chat/completions", [p](const httplib::Request& req, httplib::Response& res) {
    p->Generate(Endpoint::kChatCompletions, req, res);
  });
  // Errors httplib produces itself (no route, body too large, ...) in OpenAI's shape; ours
  // already have a body.
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [max = options.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.is_chunked_content_provider_) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        ApiError e;
        e.http_status = res.status;
        e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
        if (res.status == 404) {
          e = NotFound(absl::StrFormat("no such endpoint: %s %s", req.method, req.path));
        } else if (res.status == 413) {
          e.message = absl::StrFormat("the request body is larger than %d bytes", max);
        } else {
          e.message = absl::StrFormat(
              "%s %s: HTTP status %d (malformed request, or a method this "
              "endpoint does not take)",
              req.method, req.path, res.status);
        }
        Reply(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));

  const int port = options.port == 0
                       ? svr.bind_to_any_port(options.host)
                       : (svr.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrFormat("http: cannot listen on %s:%d", options.host, options.port));
  }
  p->thread = std::thread([p] { p->server->listen_after_bind(); });
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(impl)));
  server->address_ = absl::StrFormat("%s:%d", options.host, port);
  return server;
}

absl::StatusOr<TokenizerChatTemplate> LoadChatTemplate(const std::string& model_path,
                                                       const std::string& tokenizer_path,
                                                       const std::string& chat_template_path) {
  namespace fs = std::filesystem;
  // The tokenizer_config.json that names the special tokens: beside the tokenizer, or in the
  // model directory.
  std::string config_path;
  for (const std::string& p : {tokenizer_path, model_path}) {
    if (p.empty()) continue;
    std::error_code ec;
    const fs::path dir = fs::is_directory(p, ec) ? fs::path(p) : fs::path(p).parent_path();
    if (fs::exists(dir / "tokenizer_config.json", ec)) {
      config_path = (dir / "tokenizer_config.json").string();
      break;
    }
  }
  if (chat_template_path.empty()) {
    if (config_path.empty()) return absl::NotFoundError("no tokenizer_config.json for the model");
    auto text = ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    return TokenizerChatTemplate::FromConfig(*text);
  }
  auto text = ReadFileToString(chat_template_path);
  if (!text.ok()) return text.status();
  if (chat_template_path.ends_with(".json")) return TokenizerChatTemplate::FromConfig(*text);
  // A bare Jinja template: with the special tokens of the model's config, when it has one.
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (!config_path.empty()) {
    auto c = ReadFileToString(config_path);
    if (c.ok()) {
      config = nlohmann::ordered_json::parse(*c, nullptr, false);
      if (!config.is_object()) config = nlohmann::ordered_json::object();
    }
  }
  config["chat_template"] = *text;
  return TokenizerChatTemplate::FromConfig(config.dump());
}

}  // namespace tandem
