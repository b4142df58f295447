// A small HTTP/1.1 server built to face the internet: one event-loop thread reads every
// connection's requests (TLS handshakes included) without blocking, and only a whole request
// reaches a handler on the worker pool. A client that sends slowly, or not at all, holds a
// socket and a small buffer but never a worker, and is closed at its deadline: the request
// line and headers must arrive within `header_timeout`, the body within `body_timeout`, the
// next request on an idle keep-alive connection within `idle_timeout`. Connections are capped
// in total and per client address; at a cap the connection that has waited longest without a
// whole request is closed to make room, so a flood of idle or slow connections cannot lock out
// a client that sends its request. When every connection at the cap holds a request, a new one is
// still accepted, read up to its request head and answered (429 past the per-address cap, 503
// past the total, each with Retry-After), never closed without a reply; only past
// `max_refusing_connections` such connections at once is one closed unanswered.
//
// Request bytes held in memory are bounded over all connections together (`max_buffered_bytes`:
// heads and bodies being read, and whole requests waiting for or held by a handler). A
// connection whose bytes would pass the bound is refused 503 with Retry-After, or instead the
// reading connection that holds the most when that is another: a flood of large bodies sent
// slowly, or never finished, costs its senders their connections, not the server its memory or
// its small requests. A request's head is checked (`check_head`: the API key) before any byte of
// its body is read, and a refused connection is closed without reading the rest. Memory freed
// after large requests is given back to the system.
//
// Whole requests wait for a serving thread in a line shared fairly by tenants (the API key, else
// the client's address; `tenant_of`): one tenant's flood delays another's request by at most
// one of its own.
//
// Handlers write through HttpResponseWriter: a whole response, or a chunked stream (server-sent
// events), into the connection's outbox; the event loop writes the socket. A stream's unwritten
// bytes are bounded per connection and over all of them, and a client that leaves its outbox
// full reading less than `min_write_rate` (or nothing for `write_timeout`) fails its stream,
// which cancels the request (http/response_outbox.h); the handler's thread is never held by a
// socket. A whole response, and a stream's tail after its handler ends, are written by the loop
// while the thread serves another request.
#ifndef TANDEM_HTTP_HTTP_LISTENER_H_
#define TANDEM_HTTP_HTTP_LISTENER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "http/http_parser.h"
#include "http/response_outbox.h"

namespace tandem {

class SslContext;

// A response the listener writes itself before closing the connection.
struct HttpRefusal {
  int status = 0;
  std::string body;  // application/json
  std::vector<std::pair<std::string, std::string>> headers;
};

// Decides on a request from its line and headers (HttpRequest without its body), on the event
// loop before any body byte is read: a refusal, or nullopt to read the body. Must not block.
using HttpHeadCheck = std::function<std::optional<HttpRefusal>(const HttpRequest& head)>;

// Bytes of requests held at once by default (HttpListenerOptions::max_buffered_bytes).
inline constexpr size_t kDefaultMaxBufferedBytes = size_t{128} << 20;

struct HttpListenerOptions {
  std::string host = "127.0.0.1";
  int port = 0;      // 0: pick a free port
  int threads = 64;  // handlers running at once (a stream holds one while it produces)
  // Whole requests waiting for a handler, in a line the tenants share fairly (http/fair_queue.h:
  // they take turns). When it is full, the newest request of the tenant holding the most
  // waiting makes room (429 for it); when no tenant holds more than the newcomer's, the
  // newcomer is refused: 429 when it has requests waiting itself, else 503. Retry-After on each.
  int max_queued_requests = 16384;
  // A request's tenant, from its head, on the event loop (must not block); none: the client's
  // address.
  std::function<std::string(const HttpRequest& head)> tenant_of;
  HttpParserLimits limits;
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  absl::Duration idle_timeout = absl::Seconds(60);
  absl::Duration write_timeout = absl::Seconds(30);  // a response write that makes no progress
  // Unwritten response bytes of one connection before a streamed piece waits, and over every
  // connection; a client whose outbox is full must read at least `min_write_rate` bytes/s
  // (judged after a second of waiting).
  size_t response_buffer_bytes = size_t{256} << 10;
  size_t max_response_bytes = size_t{256} << 20;
  size_t min_write_rate = 4096;
  // SO_SNDBUF of each connection (the kernel doubles it); 0: the system's, which grows by itself.
  int socket_send_buffer = 64 << 10;
  int max_connections = 16384;
  // Per client address. Every client behind one ingress or load balancer shares its address, so
  // the default is the total; lower it where clients reach the server directly.
  int max_connections_per_client = 16384;
  // Connections past a cap held at once until their request head arrives, to be answered.
  int max_refusing_connections = 256;
  // Bytes of requests held in memory over every connection (heads, bodies, requests waiting for
  // or held by a handler); at least the largest request (max_header_bytes + max_body_bytes).
  size_t max_buffered_bytes = kDefaultMaxBufferedBytes;
  HttpHeadCheck check_head;         // none: every head is read on
  std::shared_ptr<SslContext> tls;  // null: plain HTTP
};

// One response, written by a handler into its connection's outbox (http/response_outbox.h);
// the event loop writes it to the socket. Not thread-safe: one writer at a time (a handler, or
// whoever holds it after the handler returned).
class HttpResponseWriter : public std::enable_shared_from_this<HttpResponseWriter> {
 public:
  // A whole response with Content-Length (taken at once, whatever its size).
  bool Send(int status, std::string_view content_type, std::string_view body,
            const std::vector<std::pair<std::string, std::string>>& headers = {});
  // A chunked response: Start once, then Write for each piece, then End. A piece waits while
  // the connection holds its bound of unwritten bytes; false once the client is gone or reads
  // too slowly (then the request should end).
  bool StartStream(int status, std::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers = {});
  bool Write(std::string_view data);
  // Write without waiting: the piece is taken, then `room(true)` runs when the next may be
  // written (at once if it may), `room(false)` once the client is gone or reads too slowly.
  // False, taking nothing, when the stream has failed or was not started.
  bool WriteThen(std::string_view data, std::function<void(bool)> room);
  bool End();
  // Runs `fn` once if the client goes away while the response is made (its connection closes
  // or fails, or it reads too slowly): an event, for a response made without a thread.
  void OnClientGone(std::function<void()> fn);
  // Keeps the response open after the handler returns, without its thread: it is finished when
  // the holder calls Release (from any thread), as if the handler had returned then.
  std::shared_ptr<HttpResponseWriter> Hold();
  void Release();
  // Whether the client closed its side, the connection failed or the client reads too slowly.
  bool ClientGone() const;
  bool started() const { return started_; }

 private:
  friend class HttpListener;
  HttpResponseWriter(std::shared_ptr<ResponseOutbox> out, int fd, bool keep_alive)
      : out_(std::move(out)), fd_(fd), keep_alive_(keep_alive) {}
  // The listener's end of the response (once): a 500 if nothing was sent, the connection back.
  void Finish();
  bool WriteRaw(std::string_view a, std::string_view b = {}, bool wait_for_room = true);
  std::string Head(int status, std::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers);

  std::shared_ptr<ResponseOutbox> out_;
  int fd_;  // polled for the client's close
  bool keep_alive_;
  bool started_ = false;
  bool streaming_ = false;
  bool ended_ = false;
  bool failed_ = false;
  bool held_ = false;
  std::function<void(HttpResponseWriter&)> finish_;  // set by the listener
  std::atomic<bool> finished_{false};
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponseWriter&)>;

class HttpListener {
 public:
  // Binds, then serves on its own threads until destroyed. A request the parser refuses is
  // answered by `on_error(status, message)`'s body (application/json) and the connection closed.
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(
      HttpListenerOptions options, HttpHandler handler,
      std::function<std::string(int status, const std::string& message)> on_error);
  ~HttpListener();  // stops accepting, closes every connection, waits for handlers

  const std::string& address() const { return address_; }  // HOST:PORT bound
  // Connections open now (the leak check of tests).
  int connections() const;
  // Bytes of requests held now (counted against max_buffered_bytes).
  size_t buffered_bytes() const;
  // Response bytes not yet written, over every connection.
  size_t response_bytes() const;

 private:
  struct Impl;
  explicit HttpListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// The standard reason phrase of a status code ("OK", "Not Found", ...).
const char* HttpReason(int status);

}  // namespace tandem

#endif  // TANDEM_HTTP_HTTP_LISTENER_H_
