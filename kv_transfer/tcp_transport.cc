#include "kv_transfer/tcp_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/crc32c.h"
#include "kv_transfer/transport_common.h"
#include "kv_transfer/wire.h"

namespace tandem {
namespace {

// Every blocking wait is cut into slices this long so a stop flag is seen promptly even when
// nobody shuts the socket down.
constexpr int kPollSliceMs = 100;

absl::Status Errno(std::string_view what) {
  return absl::UnavailableError(absl::StrFormat("kv tcp: %s: %s", what, std::strerror(errno)));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits until `fd` is ready for `events`, `stop` is set (CANCELLED) or `deadline` passes
// (DEADLINE_EXCEEDED). Hang-ups and errors count as ready: the next read or write reports them.
absl::Status PollFor(int fd, short events, const std::atomic<bool>& stop, absl::Time deadline) {
  for (;;) {
    if (stop.load(std::memory_order_relaxed)) {
      return absl::CancelledError("kv tcp: shutting down");
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("kv tcp: i/o timeout");
    const int ms =
        left > absl::Milliseconds(kPollSliceMs)
            ? kPollSliceMs
            : static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("poll");
    }
    if (r > 0) return absl::OkStatus();
  }
}

// Reads exactly `n` bytes. Before the first byte the wait is bounded by `first_deadline` (an
// idle connection between frames may wait forever); after it, each stall by `io_timeout`.
absl::Status ReadFull(int fd, char* buf, size_t n, const std::atomic<bool>& stop,
                      absl::Time first_deadline, absl::Duration io_timeout) {
  size_t got = 0;
  absl::Time deadline = first_deadline;
  while (got < n) {
    if (absl::Status s = PollFor(fd, POLLIN, stop, deadline); !s.ok()) return s;
    const ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      deadline = absl::Now() + io_timeout;
    } else if (r == 0) {
      return absl::UnavailableError(got == 0 ? "kv tcp: peer closed the connection"
                                             : "kv tcp: peer closed the connection mid-frame");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Errno("recv");
    }
  }
  return absl::OkStatus();
}

// Writes the header then the payload, resuming partial writes; a stall longer than
// `io_timeout` fails. MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE.
absl::Status WriteAll(int fd, std::span<const char> a, std::span<const char> b,
                      const std::atomic<bool>& stop, absl::Duration io_timeout) {
  iovec iov[2] = {{const_cast<char*>(a.data()), a.size()}, {const_cast<char*>(b.data()), b.size()}};
  int first = 0;
  const int count = b.empty() ? 1 : 2;
  absl::Time deadline = absl::Now() + io_timeout;
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = count - first;
    const ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("send");
      if (absl::Status s = PollFor(fd, POLLOUT, stop, deadline); !s.ok()) return s;
      continue;
    }
    size_t left = static_cast<size_t>(r);
    while (first < count && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
    deadline = absl::Now() + io_timeout;
  }
  return absl::OkStatus();
}

absl::Status WriteAck(int fd, const KvFrameHeader& data, const absl::Status& status,
                      const std::atomic<bool>& stop, absl::Duration io_timeout) {
  const std::string ack = EncodeKvAckFrame(data.seq, data.chunk, status);
  return WriteAll(fd, ack, {}, stop, io_timeout);
}

// ---------------------------------------------------------------------------------------------

class TcpKvReceiver final : public KvReceiver {
 public:
  TcpKvReceiver(KvSink* sink, const KvReceiverOptions& options, int listen_fd, std::string endpoint)
      : sink_(sink), options_(options), listen_fd_(listen_fd), endpoint_(std::move(endpoint)) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpKvReceiver() override { Shutdown(); }

  std::string endpoint() const override { return endpoint_; }

  void Shutdown() override {
    absl::MutexLock once(&shutdown_mu_);
    if (listen_fd_ < 0) return;
    stop_.store(true);
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    ::close(listen_fd_);
    listen_fd_ = -1;
    std::list<std::unique_ptr<Conn>> conns;
    {
      absl::MutexLock lock(&mu_);
      conns.swap(conns_);
      for (auto& c : conns) ::shutdown(c->fd, SHUT_RDWR);
    }
    for (auto& c : conns) {
      c->thread.join();
      ::close(c->fd);
    }
  }

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void AcceptLoop() {
    while (!stop_.load()) {
      ReapFinished();
      pollfd p{listen_fd_, POLLIN, 0};
      const int r = poll(&p, 1, kPollSliceMs);
      if (r <= 0 || stop_.load()) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        // EMFILE and friends leave the connection pending; back off instead of spinning.
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      SetNoDelay(fd);
      absl::MutexLock lock(&mu_);
      auto conn = std::make_unique<Conn>();
      conn->fd = fd;
      Conn* c = conn.get();
      conns_.push_back(std::move(conn));
      c->thread = std::thread([this, c] { Serve(c); });
    }
  }

  // Joins and closes connections whose peer went away, so a long-lived receiver does not
  // accumulate threads and descriptors.
  void ReapFinished() {
    absl::MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        ::close((*it)->fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Serve(Conn* c) {
    std::vector<char> buf;
    char hdr[kKvFrameHeaderBytes];
    for (;;) {
      if (!ReadFull(c->fd, hdr, sizeof(hdr), stop_, absl::InfiniteFuture(), options_.io_timeout)
               .ok()) {
        break;
      }
      KvFrameHeader raw;
      absl::StatusOr<KvFrameHeader> h = DecodeKvFrameHeader(hdr, options_.max_frame_bytes, &raw);
      if (!h.ok()) {
        // An intact but invalid header can still be answered; either way the payload that
        // follows cannot be delimited, so the connection ends.
        if (h.status().code() != absl::StatusCode::kDataLoss) {
          WriteAck(c->fd, raw, h.status(), stop_, options_.io_timeout).IgnoreError();
        }
        break;
      }
      if (h->kind != KvFrameKind::kData) break;
      const size_t len = static_cast<size_t>(h->payload_length);
      if (buf.size() < len) buf.resize(len);
      if (!ReadFull(c->fd, buf.data(), len, stop_, absl::Now() + options_.io_timeout,
                    options_.io_timeout)
               .ok()) {
        break;
      }
      const absl::Status verdict =
          DeliverKvChunk(sink_, *h, std::span<const char>(buf.data(), len));
      if (!WriteAck(c->fd, *h, verdict, stop_, options_.io_timeout).ok()) break;
    }
    c->done.store(true);
  }

  KvSink* const sink_;
  const KvReceiverOptions options_;
  int listen_fd_;
  const std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  absl::Mutex shutdown_mu_;
  absl::Mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------

class TcpKvSender final : public KvSender {
 public:
  explicit TcpKvSender(const KvSenderOptions& options) : options_(options), tracker_(options) {}
  ~TcpKvSender() override { Shutdown(); }

  absl::Status Send(const KvTarget& target, const KvChunkHeader& header,
                    std::string payload) override {
    absl::StatusOr<KvSendTracker::Started> started =
        tracker_.BeginSend("tcp", target, header, std::move(payload));
    if (!started.ok()) return started.status();
    if (!started->chunk) return absl::OkStatus();  // dropped (fault injection)
    absl::MutexLock lock(&mu_);
    if (stop_.load()) {
      return tracker_.Abandon(*started->chunk, absl::CancelledError("kv tcp sender: shut down"));
    }
    std::unique_ptr<Channel>& ch = channels_[target.endpoint];
    if (ch == nullptr) {
      ch = std::make_unique<Channel>();
      ch->endpoint = target.endpoint;
      ch->address = std::move(started->endpoint);
      Channel* c = ch.get();
      ch->writer = std::thread([this, c] { WriterLoop(c); });
    }
    ch->queue.push_back(*std::move(started->chunk));
    return absl::OkStatus();
  }

  absl::Status Wait(const KvTarget& target, absl::Time deadline) override {
    return tracker_.Wait(target, deadline);
  }
  void Forget(const KvTarget& target) override { tracker_.Forget(target); }
  size_t num_targets() const override { return tracker_.num_targets(); }

  void Shutdown() override {
    absl::MutexLock once(&shutdown_mu_);
    absl::flat_hash_map<std::string, std::unique_ptr<Channel>> channels;
    {
      absl::MutexLock lock(&mu_);
      stop_.store(true);
      channels.swap(channels_);
    }
    for (auto& [name, ch] : channels) ch->writer.join();
  }

 private:
  struct Channel {
    std::string endpoint;
    KvEndpoint address;
    std::thread writer;
    std::deque<KvOutgoingChunk> queue;  // guarded by mu_
    // The open connection. fd and reader belong to the writer thread.
    int fd = -1;
    std::thread reader;
    std::atomic<bool> reader_stop{false};
    bool broken = false;  // guarded by mu_: the reader saw the connection end
    // seq -> target of each chunk written and not yet acknowledged; guarded by mu_.
    absl::flat_hash_map<uint64_t, std::shared_ptr<KvTargetState>> in_flight;
  };

  void WriterLoop(Channel* ch) {
    for (;;) {
      KvOutgoingChunk item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this, ch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_.load() || !ch->queue.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stop_.load()) break;
        item = std::move(ch->queue.front());
        ch->queue.pop_front();
      }
      const uint64_t bytes = item.payload.size();
      if (absl::Status skip = tracker_.SkipReason(*item.state); !skip.ok()) {
        tracker_.Complete(*item.state, skip);
      } else {
        WriteChunk(ch, item);
      }
      tracker_.Dequeued(bytes);
    }
    const absl::Status cancelled = absl::CancelledError("kv tcp sender: shut down");
    CloseConnection(ch, cancelled);
    absl::MutexLock lock(&mu_);
    FailQueue(ch, cancelled);
  }

  void WriteChunk(Channel* ch, KvOutgoingChunk& item) {
    KvFrameHeader h;
    h.kind = KvFrameKind::kData;
    h.chunk = item.chunk;
    h.payload_length = item.payload.size();
    h.payload_crc = Crc32c(item.payload);
    if (item.fault == KvFault::kCorrupt) CorruptKvPayload(&item.payload);

    bool connected;
    {
      absl::MutexLock lock(&mu_);
      connected = ch->fd >= 0 && !ch->broken;
    }
    if (!connected) {
      CloseConnection(ch, absl::UnavailableError("kv tcp: connection lost"));
      size_t backlog;
      {
        absl::MutexLock lock(&mu_);
        backlog = ch->queue.size();
      }
      if (absl::Status s = Connect(ch); !s.ok()) {
        // Fail what was queued when the attempt began too, so a dead peer costs one connect
        // timeout, not one per chunk; chunks queued since then get an attempt of their own.
        tracker_.Complete(*item.state, s);
        absl::MutexLock lock(&mu_);
        FailQueue(ch, s, backlog);
        return;
      }
    }
    h.seq = next_seq_.fetch_add(1);
    {
      absl::MutexLock lock(&mu_);
      if (ch->broken) {
        tracker_.Complete(*item.state, absl::UnavailableError(absl::StrFormat(
                                           "kv send to %s: connection lost", ch->endpoint)));
        return;
      }
      // Registered before writing: the ACK may arrive before WriteAll returns.
      ch->in_flight[h.seq] = item.state;
    }
    char hdr[kKvFrameHeaderBytes];
    EncodeKvFrameHeader(h, hdr);
    absl::Status s = WriteAll(ch->fd, hdr, item.payload, stop_, options_.io_timeout);
    if (!s.ok()) {
      CloseConnection(ch, absl::UnavailableError(
                              absl::StrFormat("kv send to %s: %s", ch->endpoint, s.message())));
    }
  }

  absl::Status Connect(Channel* ch) {
    const KvEndpoint& a = ch->address;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(a.port);
    if (int rc = getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return absl::UnavailableError(
          absl::StrFormat("kv tcp: resolve %s: %s", a.host, gai_strerror(rc)));
    }
    const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      freeaddrinfo(res);
      return Errno("socket");
    }
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    absl::Status s;
    if (rc < 0 && errno != EINPROGRESS) {
      s = Errno(absl::StrFormat("connect %s", ch->endpoint));
    } else if (rc < 0) {
      s = PollFor(fd, POLLOUT, stop_, absl::Now() + options_.connect_timeout);
      int err = 0;
      socklen_t len = sizeof(err);
      if (s.ok() && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
        errno = err;
        s = Errno(absl::StrFormat("connect %s", ch->endpoint));
      }
    }
    if (!s.ok()) {
      ::close(fd);
      return absl::UnavailableError(s.message());
    }
    SetNoDelay(fd);
    ch->fd = fd;
    ch->reader_stop.store(false);
    ch->reader = std::thread([this, ch, fd] { ReaderLoop(ch, fd); });
    return absl::OkStatus();
  }

  // Writer thread only: stops the reader, closes the socket and fails what was in flight.
  void CloseConnection(Channel* ch, const absl::Status& why) {
    if (ch->fd < 0) return;
    ch->reader_stop.store(true);
    ::shutdown(ch->fd, SHUT_RDWR);
    ch->reader.join();
    ::close(ch->fd);
    ch->fd = -1;
    absl::MutexLock lock(&mu_);
    FailInFlight(ch, why);
    ch->broken = false;
  }

  void ReaderLoop(Channel* ch, int fd) {
    char hdr[kKvFrameHeaderBytes];
    std::string message;
    absl::Status why;
    for (;;) {
      why = ReadFull(fd, hdr, sizeof(hdr), ch->reader_stop, absl::InfiniteFuture(),
                     options_.io_timeout);
      if (!why.ok()) break;
      absl::StatusOr<KvFrameHeader> h = DecodeKvFrameHeader(hdr, options_.max_frame_bytes);
      if (!h.ok()) {
        why = h.status();
        break;
      }
      if (h->kind != KvFrameKind::kAck) {
        why = absl::InternalError("kv tcp: peer sent a DATA frame where an ACK was due");
        break;
      }
      message.resize(h->payload_length);
      why = ReadFull(fd, message.data(), message.size(), ch->reader_stop,
                     absl::Now() + options_.io_timeout, options_.io_timeout);
      if (!why.ok()) break;
      const absl::Status verdict = Crc32c(message) == h->payload_crc
                                       ? KvAckStatus(*h, message)
                                       : absl::DataLossError("kv tcp: ACK checksum mismatch");
      absl::MutexLock lock(&mu_);
      auto it = ch->in_flight.find(h->seq);
      if (it != ch->in_flight.end()) {
        tracker_.Complete(*it->second, verdict);
        ch->in_flight.erase(it);
      }
    }
    absl::MutexLock lock(&mu_);
    ch->broken = true;
    FailInFlight(ch, stop_.load()
                         ? absl::CancelledError("kv tcp sender: shut down")
                         : absl::UnavailableError(absl::StrFormat(
                               "kv send to %s: connection lost: %s", ch->endpoint, why.message())));
  }

  void FailInFlight(Channel* ch, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [seq, state] : ch->in_flight) tracker_.Complete(*state, why);
    ch->in_flight.clear();
  }

  // Fails the first `n` queued chunks (all by default).
  void FailQueue(Channel* ch, const absl::Status& why, size_t n = SIZE_MAX)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    n = std::min(n, ch->queue.size());
    for (size_t i = 0; i < n; ++i) {
      KvOutgoingChunk& item = ch->queue[i];
      tracker_.Dequeued(item.payload.size());
      tracker_.Complete(*item.state, why);
    }
    ch->queue.erase(ch->queue.begin(), ch->queue.begin() + n);
  }

  const KvSenderOptions options_;
  KvSendTracker tracker_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_seq_{1};
  absl::Mutex shutdown_mu_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateTcpKvReceiver(std::string_view host, int port,
                                                                KvSink* sink,
                                                                const KvReceiverOptions& options) {
  if (sink == nullptr) return absl::InvalidArgumentError("kv tcp receiver: sink is null");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string host_str(host);
  const std::string port_str = std::to_string(port);
  if (int rc = getaddrinfo(host_str.c_str(), port_str.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv tcp receiver: resolve %s: %s", host, gai_strerror(rc)));
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return Errno("socket");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  absl::Status s;
  if (bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
    s = Errno(absl::StrFormat("bind %s:%d", host, port));
  } else if (listen(fd, 128) < 0) {
    s = Errno("listen");
  }
  freeaddrinfo(res);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (s.ok() && getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    s = Errno("getsockname");
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  const int bound_port = addr.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  const bool v6 = host_str.find(':') != std::string::npos;
  std::string endpoint = v6 ? absl::StrFormat("tcp://[%s]:%d", host_str, bound_port)
                            : absl::StrFormat("tcp://%s:%d", host_str, bound_port);
  return std::make_unique<TcpKvReceiver>(sink, options, fd, std::move(endpoint));
}

std::unique_ptr<KvSender> CreateTcpKvSender(const KvSenderOptions& options) {
  return std::make_unique<TcpKvSender>(options);
}

}  // namespace tandem
