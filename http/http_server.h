// The router's OpenAI-compatible HTTP front (http/http_listener.h): POST /v1/completions,
// POST /v1/chat/completions, POST /v1/responses (JSON or server-sent events), GET /v1/models,
// GET /health, and
// vLLM's /ping, /version, POST /tokenize and /detokenize. Every
// generation goes through Router::GenerateStream, the path gRPC's Generate takes, so both get the
// same validation, limits, cancellation and metrics. A client that disconnects cancels its
// request, which frees it on every worker. Slow or idle clients hold no serving thread (the
// listener reads requests on its event loop), the API key is checked from the headers before
// any byte of a body is read, request bytes held at once are bounded, and bodies are checked for
// JSON nesting, keys, values and number range before they are parsed (in linear time).
#ifndef TANDEM_HTTP_HTTP_SERVER_H_
#define TANDEM_HTTP_HTTP_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "http/client_address.h"
#include "http/http_listener.h"
#include "http/openai.h"
#include "metrics/metrics.h"
#include "rpc/tls.h"

namespace tandem {

class Router;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;     // 0: pick a free port
  int threads = 8;  // requests parsed and tokenized at once (a generation's stream holds none)
  // GET /metrics: the router's Prometheus registry on this port, as vLLM serves it (behind the
  // API keys when the router has them). The router's --no-http-metrics turns it off (it names
  // workers and their load).
  bool serve_metrics = false;
  // Each request's deadline (DEADLINE_EXCEEDED: HTTP 504); infinite: none.
  absl::Duration request_timeout = absl::InfiniteDuration();
  size_t max_body_bytes = size_t{16} << 20;
  // A client must send its request line and headers within `header_timeout`, its body within
  // `body_timeout`; an idle keep-alive connection is closed after `idle_timeout`.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  absl::Duration idle_timeout = absl::Seconds(60);
  // Open connections, in total and per client address (beyond: the longest-waiting connection
  // without a whole request is closed to make room, else the new one is answered 503 or 429 with
  // Retry-After; http/http_listener.h). Clients behind one ingress share its address.
  int max_connections = 16384;
  int max_connections_per_client = 16384;
  // Bytes of requests held in memory over every connection (--http-max-buffered-bytes; see
  // http/http_listener.h): past it, 503 with Retry-After for the connection holding the most.
  size_t max_buffered_bytes = kDefaultMaxBufferedBytes;
  // Unwritten response bytes per connection before a stream waits for its client, and the rate
  // a client must read at while its buffer is full (--http-response-buffer-bytes,
  // --http-min-write-rate; http/response_outbox.h): below it the request is cancelled.
  size_t response_buffer_bytes = size_t{256} << 10;
  size_t min_write_rate = 4096;
  // Whole (non-streamed) generation responses are built in memory before they are sent: the
  // most they may reach (choices x max_tokens, with their logprobs) is reserved against this
  // budget over every request (--http-max-building-bytes); past it, 503 with Retry-After, the
  // message naming `stream` (a streamed response is bounded by its outbox instead).
  size_t max_building_bytes = size_t{512} << 20;
  // Requests waiting for a serving thread, in a line the tenants (API keys, else client
  // addresses) take turns in (--http-max-queued; http/http_listener.h).
  int max_queued = 16384;
  // Proxies whose X-Forwarded-For / Forwarded name the client (--trusted-proxies: addresses and
  // CIDR ranges, comma-separated; http/client_address.h). Empty: the peer is the client.
  std::string trusted_proxies;
  // The process's --tls-cert/--tls-key (HTTPS) and --tls-ca (every client must then present a
  // certificate the CA signed, as on the gRPC ports); none: plain HTTP.
  TlsFlags tls;

  absl::Status Validate() const;
};

class HttpServer {
 public:
  // Binds and starts serving. `router` and `metrics` (nullptr: none) must outlive the server.
  // The router's API keys guard every /v1 endpoint, /tokenize and /detokenize (401 without a
  // valid "Authorization: Bearer KEY"); /health, /ping and /version stay open.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Router* router,
                                                           openai::ServedModel model,
                                                           RouterMetrics* metrics,
                                                           HttpServerOptions options);
  ~HttpServer();  // stops serving; requests in flight are cancelled

  // HOST:PORT actually bound.
  const std::string& address() const { return address_; }
  // Connections open now.
  int connections() const;

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace tandem

#endif  // TANDEM_HTTP_HTTP_SERVER_H_
