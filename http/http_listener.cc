#include "http/http_listener.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "security/secure_socket.h"

namespace tandem {
namespace {

constexpr size_t kReadChunk = 16 << 10;
// Bytes read from one connection per wake-up before the loop serves the others.
constexpr size_t kReadBudget = 256 << 10;
// The heap is trimmed (malloc_trim walks every arena) once requests of at least
// kLargeRequestBytes have released kTrimAfterBytes since the last time, at most every kTrimEvery.
constexpr size_t kLargeRequestBytes = 256 << 10;
constexpr size_t kTrimAfterBytes = 8 << 20;
constexpr absl::Duration kTrimEvery = absl::Milliseconds(250);

}  // namespace

const char* HttpReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

// ---- HttpResponseWriter ---------------------------------------------------------------------

std::string HttpResponseWriter::Head(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string head = absl::StrFormat("HTTP/1.1 %d %s\r\n", status, HttpReason(status));
  if (!content_type.empty()) absl::StrAppendFormat(&head, "Content-Type: %s\r\n", content_type);
  for (const auto& [name, value] : headers) absl::StrAppendFormat(&head, "%s: %s\r\n", name, value);
  head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return head;
}

bool HttpResponseWriter::WriteRaw(std::string_view a, std::string_view b) {
  if (failed_) return false;
  static const std::atomic<bool> never_stop{false};
  if (!sock_
           ->WriteAll(std::span<const char>(a.data(), a.size()),
                      std::span<const char>(b.data(), b.size()), never_stop, write_timeout_)
           .ok()) {
    failed_ = true;
  }
  return !failed_;
}

bool HttpResponseWriter::Send(int status, std::string_view content_type, std::string_view body,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
  if (started_) return false;
  started_ = true;
  ended_ = true;
  std::string head = Head(status, content_type, headers);
  absl::StrAppendFormat(&head, "Content-Length: %d\r\n\r\n", body.size());
  return WriteRaw(head, body);
}

bool HttpResponseWriter::StartStream(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  if (started_) return false;
  started_ = true;
  streaming_ = true;
  std::string head = Head(status, content_type, headers);
  head += "Transfer-Encoding: chunked\r\n\r\n";
  return WriteRaw(head);
}

bool HttpResponseWriter::Write(std::string_view data) {
  if (!streaming_ || ended_) return false;
  if (data.empty()) return !failed_;
  const std::string size = absl::StrFormat("%x\r\n", data.size());
  std::string framed;
  framed.reserve(data.size() + 2);
  framed.append(data);
  framed += "\r\n";
  return WriteRaw(size, framed);
}

bool HttpResponseWriter::End() {
  if (!streaming_ || ended_) return false;
  ended_ = true;
  return WriteRaw("0\r\n\r\n");
}

bool HttpResponseWriter::ClientGone() const {
  if (failed_) return true;
  pollfd p{sock_->fd(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// ---- HttpListener ---------------------------------------------------------------------------

struct HttpListener::Impl {
  struct Conn {
    uint64_t id = 0;
    std::unique_ptr<SecureSocket> sock;
    std::string peer;
    enum class Phase { kHandshake, kReading, kDispatched } phase = Phase::kHandshake;
    HttpRequestParser parser;
    std::string pending;       // bytes after a whole request (pipelined), fed when it returns
    absl::Time deadline;       // of the current phase
    absl::Time waiting_since;  // since when it waits for a whole request (eviction order)
    uint32_t events = 0;       // registered with epoll
    // Bytes of this connection counted in `buffered`: what its parser and `pending` hold, and
    // while dispatched, its request.
    size_t charged = 0;
    // Accepted past a connection cap: answered with this once its request head arrives. Such a
    // connection counts in neither cap and is never evicted.
    std::optional<HttpRefusal> refusal;
    explicit Conn(const HttpParserLimits& limits) : parser(limits, /*pause_after_head=*/true) {}
  };
  struct Work {
    Conn* conn;
    HttpRequest request;
  };

  HttpListenerOptions options;
  HttpHandler handler;
  std::function<std::string(int, const std::string&)> on_error;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread loop;
  std::vector<std::thread> workers;
  std::atomic<bool> stop{false};
  std::atomic<int> open{0};

  // Owned by the loop thread.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::map<std::string, int> per_client;  // connections within the caps, by address
  int refusing = 0;                       // connections accepted past a cap (Conn::refusal)
  uint64_t next_id = 1;
  size_t buffered_now = 0;         // the sum of every connection's `charged`
  size_t released_since_trim = 0;  // bytes of large requests released since the last trim
  absl::Time last_trim = absl::InfinitePast();
  std::atomic<size_t> buffered{0};  // buffered_now, for other threads

  std::mutex mu;
  std::condition_variable work_cv;
  std::deque<Work> queue;       // whole requests for the workers
  std::vector<Conn*> returned;  // keep-alive connections back from the workers
  std::vector<Conn*> finished;  // connections the workers are done with, to close
  bool workers_stop = false;

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_fd, &one, sizeof(one));
  }

  void Watch(Conn* c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = c->id;
    if (c->events == 0) {
      ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->sock->fd(), &ev);
    } else if (c->events != events) {
      ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c->sock->fd(), &ev);
    }
    c->events = events;
  }
  void Unwatch(Conn* c) {
    if (c->events != 0) ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->sock->fd(), nullptr);
    c->events = 0;
  }

  void Close(Conn* c) {
    Unwatch(c);
    if (c->refusal) {
      --refusing;
    } else if (--per_client[c->peer] == 0) {
      per_client.erase(c->peer);
    }
    --open;
    Uncharge(c, c->charged);
    conns.erase(c->id);
  }

  // A refusal written without blocking (it is small: it fits the socket buffer), then closed
  // without reading what else the client sends.
  void Refuse(Conn* c, const HttpRefusal& r) {
    std::string response = absl::StrFormat("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n",
                                           r.status, HttpReason(r.status));
    for (const auto& [name, value] : r.headers) {
      absl::StrAppendFormat(&response, "%s: %s\r\n", name, value);
    }
    absl::StrAppendFormat(&response, "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                          r.body.size(), r.body);
    size_t wrote = 0;
    c->sock->TryWrite(response.data(), response.size(), &wrote);
    Close(c);
  }
  void Refuse(Conn* c, int status, const std::string& message,
              std::vector<std::pair<std::string, std::string>> headers = {}) {
    Refuse(c, HttpRefusal{status, on_error(status, message), std::move(headers)});
  }

  // ---- The budget of buffered request bytes (loop thread) ----

  void Uncharge(Conn* c, size_t bytes) {
    c->charged -= bytes;
    buffered_now -= bytes;
    if (bytes >= kLargeRequestBytes) released_since_trim += bytes;
    buffered.store(buffered_now, std::memory_order_relaxed);
  }

  // The connection still reading a request that holds the most bytes, other than `except`.
  Conn* LargestReader(const Conn* except) {
    Conn* largest = nullptr;
    for (auto& [id, c] : conns) {
      if (c.get() == except || c->phase == Conn::Phase::kDispatched || c->charged == 0) continue;
      if (largest == nullptr || c->charged > largest->charged) largest = c.get();
    }
    return largest;
  }

  void RefuseOverBudget(Conn* c) {
    Refuse(
        c, 503,
        absl::StrFormat("the server holds its limit of %d bytes of requests "
                        "(--http-max-buffered-bytes) and this request held the most; retry later",
                        options.max_buffered_bytes),
        {{"Retry-After", "1"}});
  }

  // Brings c's charge to what it holds now. Growing past the budget refuses, largest first, the
  // reading connections that hold more than c would; when none does, c itself. False when c
  // was refused (and closed).
  bool Settle(Conn* c) {
    const size_t held = c->parser.buffered_bytes() + c->pending.capacity();
    if (held <= c->charged) {
      Uncharge(c, c->charged - held);
      return true;
    }
    const size_t more = held - c->charged;
    while (buffered_now + more > options.max_buffered_bytes) {
      Conn* largest = LargestReader(c);
      if (largest == nullptr || largest->charged <= held) {
        RefuseOverBudget(c);
        return false;
      }
      RefuseOverBudget(largest);
    }
    c->charged = held;
    buffered_now += more;
    buffered.store(buffered_now, std::memory_order_relaxed);
    return true;
  }

  // Gives the heap's free pages back to the system after large requests: glibc keeps freed
  // blocks of up to 32 MiB in its arenas (its mmap threshold rises to the largest block freed),
  // so without this the router would stay at the size of its largest burst.
  void TrimHeap(absl::Time now) {
    if (released_since_trim < kTrimAfterBytes || now - last_trim < kTrimEvery) return;
    released_since_trim = 0;
    last_trim = now;
#ifdef __GLIBC__
    ::malloc_trim(0);
#endif
  }

  // Makes room for a connection from `peer` within the caps: nullopt, or the answer it gets when
  // no connection without a whole request can make room.
  std::optional<HttpRefusal> MakeRoom(const std::string& peer) {
    auto evict_oldest = [&](bool same_peer) {
      Conn* oldest = nullptr;
      for (auto& [id, c] : conns) {
        if (c->phase == Conn::Phase::kDispatched || c->refusal || (same_peer && c->peer != peer)) {
          continue;
        }
        if (oldest == nullptr || c->waiting_since < oldest->waiting_since) oldest = c.get();
      }
      if (oldest == nullptr) return false;
      Close(oldest);
      return true;
    };
    auto it = per_client.find(peer);
    if (it != per_client.end() && it->second >= options.max_connections_per_client &&
        !evict_oldest(true)) {
      return HttpRefusal{
          429,
          on_error(429, absl::StrFormat("this client address holds its limit of %d connections "
                                        "(--http-max-connections-per-client); retry later",
                                        options.max_connections_per_client)),
          {{"Retry-After", "1"}}};
    }
    if (static_cast<int>(conns.size()) - refusing >= options.max_connections &&
        !evict_oldest(false)) {
      return HttpRefusal{503,
                         on_error(503, absl::StrFormat("the server holds its limit of %d "
                                                       "connections (--http-max-connections); "
                                                       "retry later",
                                                       options.max_connections)),
                         {{"Retry-After", "1"}}};
    }
    return std::nullopt;
  }

  void Accept() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN, or out of descriptors: the rest wait in the backlog
      }
      const std::string peer = PeerHost(addr);
      std::optional<HttpRefusal> refusal = MakeRoom(peer);
      if (refusal && refusing >= options.max_refusing_connections) {
        ::close(fd);  // past every bound: the one case a connection goes unanswered
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Conn>(options.limits);
      c->id = next_id++;
      c->sock = std::make_unique<SecureSocket>(fd, options.tls, /*server=*/true);
      c->peer = peer;
      c->phase = options.tls ? Conn::Phase::kHandshake : Conn::Phase::kReading;
      const absl::Time now = absl::Now();
      c->deadline = now + options.header_timeout;
      c->waiting_since = now;
      if (refusal) {
        c->refusal = std::move(refusal);
        ++refusing;
      } else {
        ++per_client[peer];
      }
      ++open;
      Conn* raw = c.get();
      conns[raw->id] = std::move(c);
      Watch(raw, EPOLLIN | EPOLLRDHUP);
      if (raw->phase == Conn::Phase::kHandshake) Handshake(raw);
    }
  }

  void Handshake(Conn* c) {
    switch (c->sock->TryHandshake()) {
      case SecureSocket::Io::kOk:
        c->phase = Conn::Phase::kReading;
        Watch(c, EPOLLIN | EPOLLRDHUP);
        Read(c);  // the request may have come with the last handshake bytes
        return;
      case SecureSocket::Io::kWantRead:
        Watch(c, EPOLLIN | EPOLLRDHUP);
        return;
      case SecureSocket::Io::kWantWrite:
        Watch(c, EPOLLOUT | EPOLLRDHUP);
        return;
      default:
        Close(c);
    }
  }

  // Feeds bytes to the parser; checks the head, dispatches or refuses once it has decided. False
  // once the connection has left the loop (dispatched or closed).
  bool Feed(Conn* c, std::string_view data) {
    while (!data.empty() || c->parser.state() == HttpRequestParser::State::kDone) {
      const bool was_started = c->parser.Started();
      const bool had_headers = c->parser.state() == HttpRequestParser::State::kBody;
      const size_t used = c->parser.Feed(data);
      data.remove_prefix(used);
      const absl::Time now = absl::Now();
      if (!was_started && c->parser.Started()) c->deadline = now + options.header_timeout;
      if (!had_headers && c->parser.state() == HttpRequestParser::State::kBody) {
        c->deadline = now + options.body_timeout;
      }
      if (c->parser.HeadPending()) {
        if (c->refusal) {  // accepted past a cap: answered now that it has asked
          Refuse(c, *c->refusal);
          return false;
        }
        if (options.check_head) {
          if (std::optional<HttpRefusal> refusal = options.check_head(c->parser.head())) {
            Refuse(c, *refusal);
            return false;
          }
        }
        c->parser.AcceptHead();
      }
      if (c->parser.WantsContinue()) {
        static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        size_t wrote = 0;
        c->sock->TryWrite(kContinue, sizeof(kContinue) - 1, &wrote);
        c->parser.ContinueSent();
      }
      switch (c->parser.state()) {
        case HttpRequestParser::State::kError:
          Refuse(c, c->parser.error_status(), c->parser.error_message());
          return false;
        case HttpRequestParser::State::kDone: {
          c->pending.assign(data.data(), data.size());
          if (!Settle(c)) return false;  // the request stays charged while a handler holds it
          Dispatch(c, c->parser.TakeRequest());
          return false;
        }
        default:
          if (!Settle(c)) return false;
          if (used == 0) return true;
      }
    }
    return true;
  }

  void Dispatch(Conn* c, HttpRequest request) {
    request.peer = c->peer;
    Unwatch(c);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (static_cast<int>(queue.size()) < options.max_queued_requests) {
        c->phase = Conn::Phase::kDispatched;
        queue.push_back({c, std::move(request)});
        work_cv.notify_one();
        return;
      }
    }
    Refuse(c, 503, "the server is busy: too many requests waiting; retry later",
           {{"Retry-After", "1"}});
  }

  void Read(Conn* c) {
    char buf[kReadChunk];
    size_t budget = kReadBudget;
    while (budget > 0) {
      size_t got = 0;
      switch (c->sock->TryRead(buf, sizeof(buf), &got)) {
        case SecureSocket::Io::kOk:
          budget -= std::min(budget, got);
          if (!Feed(c, std::string_view(buf, got))) return;
          break;
        case SecureSocket::Io::kWantRead:
          Watch(c, EPOLLIN | EPOLLRDHUP);
          return;
        case SecureSocket::Io::kWantWrite:
          Watch(c, EPOLLOUT | EPOLLRDHUP);
          return;
        default:
          Close(c);
          return;
      }
    }
  }

  // A connection back from a worker: its next request, maybe already buffered.
  void Resume(Conn* c) {
    c->phase = Conn::Phase::kReading;
    const absl::Time now = absl::Now();
    c->deadline = now + options.idle_timeout;
    c->waiting_since = now;
    std::string pending = std::move(c->pending);
    c->pending.clear();
    Settle(c);  // the handler is done with the request: only the parser's bytes are left
    if (!pending.empty() && !Feed(c, pending)) return;
    Watch(c, EPOLLIN | EPOLLRDHUP);
    Read(c);  // level-triggered epoll would tell too; reading now saves a wake-up
  }

  void SweepDeadlines() {
    const absl::Time now = absl::Now();
    std::vector<Conn*> late;
    for (auto& [id, c] : conns) {
      if (c->phase != Conn::Phase::kDispatched && now > c->deadline) late.push_back(c.get());
    }
    for (Conn* c : late) Close(c);
  }

  void Loop() {
    epoll_event events[256];
    absl::Time next_sweep = absl::Now();
    while (!stop.load()) {
      const int n = ::epoll_wait(epoll_fd, events, 256, 100);
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == 0) {
          Accept();
          continue;
        }
        if (id == UINT64_MAX) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof(v));
          continue;
        }
        auto it = conns.find(id);
        if (it == conns.end()) continue;  // closed earlier in this batch
        Conn* c = it->second.get();
        if (c->phase == Conn::Phase::kHandshake) {
          Handshake(c);
        } else if (c->phase == Conn::Phase::kReading) {
          Read(c);
        }
      }
      std::vector<Conn*> back, done;
      {
        std::lock_guard<std::mutex> lock(mu);
        back.swap(returned);
        done.swap(finished);
      }
      for (Conn* c : done) Close(c);
      for (Conn* c : back) Resume(c);
      if (const absl::Time now = absl::Now(); now >= next_sweep) {
        SweepDeadlines();
        TrimHeap(now);
        next_sweep = now + absl::Milliseconds(100);
      }
    }
    // Stopping: every socket is shut down, so handlers still writing fail at once.
    for (auto& [id, c] : conns) c->sock->ShutdownBoth();
  }

  void Worker() {
    for (;;) {
      Work w;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return workers_stop || !queue.empty(); });
        if (workers_stop) return;
        w = std::move(queue.front());
        queue.pop_front();
      }
      HttpResponseWriter writer(w.conn->sock.get(), w.request.KeepAlive() && !stop.load(),
                                options.write_timeout);
      handler(w.request, writer);
      if (!writer.started()) {
        writer.Send(500, "application/json", on_error(500, "the handler sent no response"));
      }
      w.request = HttpRequest();  // freed before the loop uncharges it
      const bool reuse = writer.keep_alive_ && !writer.failed_ && writer.ended_;
      {
        std::lock_guard<std::mutex> lock(mu);
        (reuse ? returned : finished).push_back(w.conn);
      }
      Wake();
    }
  }
};

HttpListener::HttpListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpListener::~HttpListener() {
  impl_->stop = true;
  impl_->Wake();
  if (impl_->loop.joinable()) impl_->loop.join();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->workers_stop = true;
    impl_->queue.clear();  // requests not started are dropped with their connections
  }
  impl_->work_cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
  impl_->conns.clear();
}

int HttpListener::connections() const { return impl_->open.load(); }

size_t HttpListener::buffered_bytes() const { return impl_->buffered.load(); }

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    HttpListenerOptions options, HttpHandler handler,
    std::function<std::string(int status, const std::string& message)> on_error) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError("http port must be in [0, 65535]");
  }
  if (options.threads < 1) return absl::InvalidArgumentError("http threads must be >= 1");
  // Every connection is a descriptor: the process's soft open-files limit (often 1,024) would
  // turn clients away long before max_connections does, so it is raised to the hard limit.
  if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  if (options.max_connections < 1 || options.max_connections_per_client < 1 ||
      options.max_refusing_connections < 0) {
    return absl::InvalidArgumentError("http connection limits must be >= 1");
  }
  if (options.max_buffered_bytes <
      options.limits.max_header_bytes + options.limits.max_body_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "http max buffered bytes (%d) must hold the largest request (%d bytes of headers and %d "
        "of body)",
        options.max_buffered_bytes, options.limits.max_header_bytes,
        options.limits.max_body_bytes));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  impl->on_error = std::move(on_error);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options.port);
  if (int rc = ::getaddrinfo(options.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("http: cannot resolve %s: %s", options.host, gai_strerror(rc)));
  }
  impl->listen_fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  bool ok = impl->listen_fd >= 0 &&
            ::setsockopt(impl->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            ::bind(impl->listen_fd, res->ai_addr, res->ai_addrlen) == 0 &&
            ::listen(impl->listen_fd, 1024) == 0;
  ::freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ok = ok && ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0;
  if (!ok) {
    return absl::UnavailableError(absl::StrFormat("http: cannot listen on %s:%d: %s", options.host,
                                                  options.port, std::strerror(errno)));
  }
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->epoll_fd < 0 || impl->wake_fd < 0) {
    return absl::InternalError(absl::StrFormat("http: epoll: %s", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  ::epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->listen_fd, &ev);
  ev.data.u64 = UINT64_MAX;
  ::epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->wake_fd, &ev);

  Impl* p = impl.get();
  std::unique_ptr<HttpListener> listener(new HttpListener(std::move(impl)));
  listener->address_ = options.host.find(':') != std::string::npos
                           ? absl::StrFormat("[%s]:%d", options.host, bound_port)
                           : absl::StrFormat("%s:%d", options.host, bound_port);
  for (int i = 0; i < options.threads; ++i) p->workers.emplace_back([p] { p->Worker(); });
  p->loop = std::thread([p] { p->Loop(); });
  return listener;
}

}  // namespace tandem
