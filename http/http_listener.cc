#include "http/http_listener.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include "http/fair_queue.h"
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

// ---- HttpListener ---------------------------------------------------------------------------

struct HttpListener::Impl {
  struct Conn {
    uint64_t id = 0;
    std::unique_ptr<SecureSocket> sock;
    std::string peer;
    // kDispatched: a handler holds the request (its outbox may be written meanwhile);
    // kFlushing: the handler is done and the loop writes the rest of the response.
    enum class Phase { kHandshake, kReading, kDispatched, kFlushing } phase = Phase::kHandshake;
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
    std::shared_ptr<ResponseOutbox> out;  // the response being written (dispatched, flushing)
    bool reuse = false;                   // flushing: read the next request once written
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
  std::atomic<size_t> buffered{0};        // buffered_now, for other threads
  std::atomic<size_t> response_bytes{0};  // unwritten, over every outbox

  std::mutex mu;
  std::condition_variable work_cv;
  FairQueue<Work> queue;           // whole requests for the workers, by tenant
  std::vector<Conn*> returned;     // keep-alive connections back from the workers
  std::vector<Conn*> finished;     // connections the workers are done with, to close
  std::vector<uint64_t> to_write;  // connections whose outbox has new bytes
  bool workers_stop = false;
  // Responses begun and not finished (by their handlers or, when held, their holders).
  int open_responses = 0;
  std::condition_variable responses_cv;

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
    if (c->out) c->out->Fail("the connection closed");
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
      if (c.get() == except || c->phase == Conn::Phase::kDispatched ||
          c->phase == Conn::Phase::kFlushing || c->charged == 0) {
        continue;
      }
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
        if (c->phase == Conn::Phase::kDispatched || c->phase == Conn::Phase::kFlushing ||
            c->refusal || (same_peer && c->peer != peer)) {
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
      // The kernel's send buffer is bounded like the outbox (Linux grows it to megabytes on
      // its own), so that a client that stops reading is seen to stop within a few hundred
      // KiB, not after megabytes of work done for nobody.
      if (options.socket_send_buffer > 0) {
        ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &options.socket_send_buffer,
                     sizeof(options.socket_send_buffer));
      }
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
    Watch(c, EPOLLRDHUP);  // a client that leaves fails its outbox: its request is cancelled
    OutboxLimits limits;
    limits.max_bytes = options.response_buffer_bytes;
    limits.max_total = options.max_response_bytes;
    limits.min_bytes_per_second = options.min_write_rate;
    limits.stall_timeout = options.write_timeout;
    const uint64_t id = c->id;
    c->out = std::make_shared<ResponseOutbox>(limits, &response_bytes, [this, id] {
      {
        std::lock_guard<std::mutex> lock(mu);
        to_write.push_back(id);
      }
      Wake();
    });
    request.tenant = options.tenant_of ? options.tenant_of(request) : c->peer;
    const std::string tenant = request.tenant;
    std::optional<Work> bumped;
    size_t held = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      held = queue.Waiting(tenant);
      // A full line makes room with the newest request of the tenant holding the most, when
      // that tenant would still hold more than this one.
      if (static_cast<int>(queue.size()) >= options.max_queued_requests) {
        bumped = queue.TakeNewestOfLargest(held + 1);
      }
      if (static_cast<int>(queue.size()) < options.max_queued_requests) {
        c->phase = Conn::Phase::kDispatched;
        queue.Push(tenant, {c, std::move(request)});
        work_cv.notify_one();
        c = nullptr;
      }
    }
    const std::string full =
        absl::StrFormat("the server's line of %d requests waiting (--http-max-queued) is full",
                        options.max_queued_requests);
    const std::string most = full + " and this client holds the most of them; retry later";
    if (bumped) {
      Conn* other = bumped->conn;
      bumped.reset();  // its request, freed before the connection is uncharged
      Refuse(other, 429, most, {{"Retry-After", "1"}});
    }
    if (c == nullptr) return;
    if (held > 0) {
      Refuse(c, 429, most, {{"Retry-After", "1"}});
    } else {
      Refuse(c, 503, full + "; retry later", {{"Retry-After", "1"}});
    }
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

  // ---- Responses: written from the outbox by the loop ----

  // Writes what c's outbox holds until it is empty or the socket is full (then EPOLLOUT tells
  // when to go on). A flushing connection whose response is all written is done with it.
  void Flush(Conn* c) {
    ResponseOutbox& out = *c->out;
    const bool flushing = c->phase == Conn::Phase::kFlushing;
    for (;;) {
      if (out.failed()) break;
      const std::string_view next = out.Front();
      if (next.empty()) break;
      size_t wrote = 0;
      switch (c->sock->TryWrite(next.data(), next.size(), &wrote)) {
        case SecureSocket::Io::kOk: {
          const absl::Time now = absl::Now();
          out.Consumed(wrote, now);
          if (flushing) c->deadline = now + options.write_timeout;
          continue;
        }
        case SecureSocket::Io::kWantWrite:
          Watch(c, flushing ? EPOLLOUT : EPOLLOUT | EPOLLRDHUP);
          return;
        case SecureSocket::Io::kWantRead:  // TLS: the write needs the peer's bytes first
          Watch(c, EPOLLIN);
          return;
        default:
          out.Fail("the connection failed while writing the response");
      }
    }
    if (!flushing) {
      // The handler's next bytes come with a notice (to_write); meanwhile a close is watched.
      if (!out.failed()) Watch(c, EPOLLRDHUP);
    } else if (out.failed()) {
      Close(c);
    } else {
      c->out.reset();
      if (c->reuse && !stop.load()) {
        Resume(c);
      } else {
        Close(c);
      }
    }
  }

  // The handler is done with c's request; the rest of its response is written before the
  // connection reads its next request (`reuse`) or closes.
  void Complete(Conn* c, bool reuse) {
    c->phase = Conn::Phase::kFlushing;
    c->reuse = reuse;
    c->deadline = absl::Now() + options.write_timeout;
    Settle(c);  // the request is gone: only the parser's bytes are left
    Flush(c);
  }

  // A connection whose response is written: its next request, maybe already buffered.
  void Resume(Conn* c) {
    c->phase = Conn::Phase::kReading;
    const absl::Time now = absl::Now();
    c->deadline = now + options.idle_timeout;
    c->waiting_since = now;
    std::string pending = std::move(c->pending);
    c->pending.clear();
    Settle(c);
    if (!pending.empty() && !Feed(c, pending)) return;
    Watch(c, EPOLLIN | EPOLLRDHUP);
    Read(c);  // level-triggered epoll would tell too; reading now saves a wake-up
  }

  void SweepDeadlines() {
    const absl::Time now = absl::Now();
    std::vector<Conn*> late;
    for (auto& [id, c] : conns) {
      if (c->phase != Conn::Phase::kDispatched && now > c->deadline) late.push_back(c.get());
      if (c->phase == Conn::Phase::kDispatched) c->out->Judge(now);
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
        } else if (c->phase == Conn::Phase::kDispatched &&
                   (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
          // The client left while its request is served: the handler hears it as an event (a
          // response still being made for a half-closed client is written all the same).
          Unwatch(c);
          c->out->ClientLeft();
        } else {
          Flush(c);
        }
      }
      std::vector<Conn*> back, done;
      std::vector<uint64_t> writable;
      {
        std::lock_guard<std::mutex> lock(mu);
        back.swap(returned);
        done.swap(finished);
        writable.swap(to_write);
      }
      for (uint64_t id : writable) {
        auto it = conns.find(id);
        if (it != conns.end() && it->second->phase == Conn::Phase::kDispatched) {
          Flush(it->second.get());
        }
      }
      for (Conn* c : done) Complete(c, false);
      for (Conn* c : back) Complete(c, true);
      if (const absl::Time now = absl::Now(); now >= next_sweep) {
        SweepDeadlines();
        TrimHeap(now);
        next_sweep = now + absl::Milliseconds(100);
      }
    }
    // Stopping: every socket is shut down and every outbox failed, so handlers still writing
    // fail at once.
    for (auto& [id, c] : conns) {
      c->sock->ShutdownBoth();
      if (c->out) c->out->Fail("the server is stopping");
    }
  }

  void Worker() {
    for (;;) {
      Work w;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return workers_stop || !queue.empty(); });
        if (workers_stop) return;
        w = *queue.Pop();
      }
      std::shared_ptr<HttpResponseWriter> writer(new HttpResponseWriter(
          w.conn->out, w.conn->sock->fd(), w.request.KeepAlive() && !stop.load()));
      Conn* conn = w.conn;
      writer->finish_ = [this, conn](HttpResponseWriter& done) { Finish(conn, done); };
      {
        std::lock_guard<std::mutex> lock(mu);
        ++open_responses;
      }
      handler(w.request, *writer);
      w.request = HttpRequest();             // freed before the loop uncharges it
      if (!writer->held_) writer->Finish();  // else its holder finishes it
    }
  }

  // The end of a response: the connection goes back to the loop.
  void Finish(Conn* conn, HttpResponseWriter& w) {
    if (!w.started()) {
      w.Send(500, "application/json", on_error(500, "the handler sent no response"));
    }
    const bool reuse = w.keep_alive_ && !w.failed_ && w.ended_;
    {
      std::lock_guard<std::mutex> lock(mu);
      (reuse ? returned : finished).push_back(conn);
      if (--open_responses == 0) responses_cv.notify_all();
    }
    Wake();
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
    impl_->queue.Clear();  // requests not started are dropped with their connections
  }
  impl_->work_cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
  {
    // Held responses end once their outboxes failed (every one did as the loop stopped).
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->responses_cv.wait(lock, [&] { return impl_->open_responses == 0; });
  }
  impl_->conns.clear();
}

int HttpListener::connections() const { return impl_->open.load(); }

size_t HttpListener::buffered_bytes() const { return impl_->buffered.load(); }

size_t HttpListener::response_bytes() const { return impl_->response_bytes.load(); }

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
  if (options.response_buffer_bytes < 1 || options.max_response_bytes < 1) {
    return absl::InvalidArgumentError("http response buffer bytes must be >= 1");
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
