#include "kv_transfer/tcp_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
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
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/transport_common.h"
#include "kv_transfer/wire.h"
#include "lib/crc32c/crc32c.h"
#include "security/secure_socket.h"

namespace tandem {
namespace {

absl::Status Errno(std::string_view what) {
  return absl::UnavailableError(absl::StrFormat("kv tcp: %s: %s", what, std::strerror(errno)));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::Status WriteAck(SecureSocket& sock, KvSession& session, const KvFrameHeader& data,
                      const absl::Status& status, const std::atomic<bool>& stop,
                      absl::Duration io_timeout) {
  return sock.WriteAll(SealKvFrame(session, EncodeKvAckFrame(data.seq, data.chunk, status)), {},
                       stop, io_timeout);
}

// Reads and drops `n` bytes through a small buffer, into the frame's seal: the payload of a
// refused chunk, so the stream stays delimited without allocating what its header announced.
absl::Status SkipBytes(SecureSocket& sock, KvSession& session, uint64_t n,
                       const std::atomic<bool>& stop, absl::Duration io_timeout) {
  char scratch[64 << 10];
  while (n > 0) {
    const size_t part = static_cast<size_t>(std::min<uint64_t>(n, sizeof(scratch)));
    if (absl::Status s = sock.ReadFull(scratch, part, stop, absl::Now() + io_timeout, io_timeout);
        !s.ok()) {
      return s;
    }
    session.ReceivePart(std::string_view(scratch, part));
    n -= part;
  }
  return absl::OkStatus();
}

// Reads the tag after a record fed to `session`: UNAUTHENTICATED when it does not match (the
// record was altered, injected or replayed; the connection must end without an answer).
absl::Status ReadRecordTag(SecureSocket& sock, KvSession& session, const std::atomic<bool>& stop,
                           absl::Duration io_timeout) {
  std::string tag(session.tag_bytes(), '\0');
  if (!tag.empty()) {
    if (absl::Status s =
            sock.ReadFull(tag.data(), tag.size(), stop, absl::Now() + io_timeout, io_timeout);
        !s.ok()) {
      return s;
    }
  }
  if (!session.ReceivedTagValid(tag)) {
    return absl::UnauthenticatedError(
        "kv tcp: a frame failed its seal (altered, injected or replayed on the way)");
  }
  return absl::OkStatus();
}

// Reads a frame header and its tag: the header once its seal checks.
absl::Status ReadSealedHeader(SecureSocket& sock, KvSession& session, char* hdr,
                              const std::atomic<bool>& stop, absl::Duration io_timeout) {
  if (absl::Status s =
          sock.ReadFull(hdr, kKvFrameHeaderBytes, stop, absl::InfiniteFuture(), io_timeout);
      !s.ok()) {
    return s;
  }
  session.BeginReceive();
  session.ReceivePart(std::string_view(hdr, kKvFrameHeaderBytes));
  return ReadRecordTag(sock, session, stop, io_timeout);
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
      for (auto& c : conns) c->sock->ShutdownBoth();
    }
    for (auto& c : conns) c->thread.join();
  }

 private:
  struct Conn {
    std::unique_ptr<SecureSocket> sock;
    std::string peer;  // the peer's IP address
    std::thread thread;
    std::atomic<bool> authenticated{false};
    std::atomic<bool> done{false};
    bool evicted = false;  // under mu_: shut down to make room, no longer counted
  };

  void AcceptLoop() {
    while (!stop_.load()) {
      ReapFinished();
      pollfd p{listen_fd_, POLLIN, 0};
      const int r = poll(&p, 1, 100);
      if (r <= 0 || stop_.load()) continue;
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        // EMFILE and friends leave the connection pending; back off instead of spinning.
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      SetNoDelay(fd);
      auto conn = std::make_unique<Conn>();
      conn->sock = std::make_unique<SecureSocket>(fd, options_.auth.tls, /*server=*/true);
      conn->peer = PeerHost(addr);
      absl::MutexLock lock(&mu_);
      if (!MakeRoomLocked(conn->peer)) continue;  // conn's destructor closes the socket
      Conn* c = conn.get();
      conns_.push_back(std::move(conn));
      c->thread = std::thread([this, c] { Serve(c); });
    }
  }

  // Caps the connections, in total and per peer host. At a cap, the oldest connection still
  // proving itself (of that peer, for the per-peer cap) is shut down to make room; when every
  // counted connection is authenticated, the newcomer is refused. A flood of strangers thus
  // costs bounded threads and memory and cannot lock out the cluster's own prefill workers.
  bool MakeRoomLocked(const std::string& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int total = 0, same_peer = 0;
    for (const auto& c : conns_) {
      if (c->evicted || c->done.load()) continue;
      ++total;
      same_peer += c->peer == peer;
    }
    auto evict_oldest = [&](bool same_peer_only) {
      for (auto& c : conns_) {
        if (c->evicted || c->done.load() || c->authenticated.load()) continue;
        if (same_peer_only && c->peer != peer) continue;
        c->evicted = true;
        c->sock->ShutdownBoth();
        return true;
      }
      return false;
    };
    if (same_peer >= options_.max_connections_per_peer && !evict_oldest(true)) return false;
    if (total >= options_.max_connections && same_peer < options_.max_connections_per_peer &&
        !evict_oldest(false)) {
      return false;
    }
    return true;
  }

  // Joins connections whose peer went away, so a long-lived receiver does not accumulate
  // threads and descriptors.
  void ReapFinished() {
    std::list<std::unique_ptr<Conn>> finished;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        if ((*it)->done.load()) {
          finished.push_back(std::move(*it));
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& c : finished) c->thread.join();
  }

  void Serve(Conn* c) {
    SecureSocket& sock = *c->sock;
    absl::StatusOr<std::unique_ptr<KvSession>> session = AuthenticateKvConnection(
        sock, options_.auth, /*receiver=*/true, stop_, absl::Now() + options_.handshake_timeout);
    if (session.ok()) {
      c->authenticated.store(true);
      ServeFrames(sock, **session);
    }
    c->done.store(true);
  }

  // Frames until the connection ends. Under a sealed session nothing is acted on before its
  // seal checks: the header before it is decoded, the payload before it is delivered.
  void ServeFrames(SecureSocket& sock, KvSession& session) {
    std::vector<char> buf;
    char hdr[kKvFrameHeaderBytes];
    const absl::Duration io = options_.io_timeout;
    for (;;) {
      if (!ReadSealedHeader(sock, session, hdr, stop_, io).ok()) return;
      KvFrameHeader raw;
      absl::StatusOr<KvFrameHeader> h = DecodeKvFrameHeader(hdr, options_.max_frame_bytes, &raw);
      if (!h.ok()) {
        // An intact but invalid header can still be answered; either way the payload that
        // follows cannot be delimited, so the connection ends.
        if (h.status().code() != absl::StatusCode::kDataLoss) {
          WriteAck(sock, session, raw, h.status(), stop_, io).IgnoreError();
        }
        return;
      }
      if (h->kind != KvFrameKind::kData) return;
      // The lease, its capability and the size it can hold are checked before a byte of the
      // payload is buffered: a refused chunk's payload is read through and dropped.
      session.BeginReceive();
      if (absl::Status verdict = sink_->CheckHeader(h->chunk); !verdict.ok()) {
        if (!SkipBytes(sock, session, h->payload_length, stop_, io).ok() ||
            !ReadRecordTag(sock, session, stop_, io).ok() ||
            !WriteAck(sock, session, *h, verdict, stop_, io).ok()) {
          return;
        }
        continue;
      }
      const size_t len = static_cast<size_t>(h->payload_length);
      if (buf.size() < len) buf.resize(len);
      if (!sock.ReadFull(buf.data(), len, stop_, absl::Now() + io, io).ok()) return;
      session.ReceivePart(std::string_view(buf.data(), len));
      if (!ReadRecordTag(sock, session, stop_, io).ok()) return;
      const absl::Status verdict =
          DeliverKvChunk(sink_, *h, std::span<const char>(buf.data(), len));
      if (!WriteAck(sock, session, *h, verdict, stop_, io).ok()) return;
    }
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
    // The open connection. sock, session and reader belong to the writer thread; the reader
    // thread uses the session's receiving side.
    std::unique_ptr<SecureSocket> sock;
    std::unique_ptr<KvSession> session;
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
      connected = ch->sock != nullptr && !ch->broken;
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
    absl::Status s;
    if (ch->session->sealed()) {
      std::string head(hdr, sizeof(hdr));
      head += ch->session->Tag(head);
      const std::string tail = ch->session->Tag(item.payload);
      s = ch->sock->WriteAll(head, item.payload, stop_, options_.io_timeout);
      if (s.ok()) s = ch->sock->WriteAll(tail, {}, stop_, options_.io_timeout);
    } else {
      s = ch->sock->WriteAll(hdr, item.payload, stop_, options_.io_timeout);
    }
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
      s = WaitReady(fd, POLLOUT, stop_, absl::Now() + options_.connect_timeout);
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
    auto sock = std::make_unique<SecureSocket>(fd, options_.auth.tls, /*server=*/false);
    absl::StatusOr<std::unique_ptr<KvSession>> session = AuthenticateKvConnection(
        *sock, options_.auth, /*receiver=*/false, stop_, absl::Now() + options_.connect_timeout);
    if (!session.ok()) {
      return absl::UnavailableError(absl::StrFormat("kv tcp: handshake with %s: %s", ch->endpoint,
                                                    session.status().message()));
    }
    ch->sock = std::move(sock);
    ch->session = *std::move(session);
    ch->reader_stop.store(false);
    ch->reader = std::thread(
        [this, ch, s = ch->sock.get(), seal = ch->session.get()] { ReaderLoop(ch, *s, *seal); });
    return absl::OkStatus();
  }

  // Writer thread only: stops the reader, closes the socket and fails what was in flight.
  void CloseConnection(Channel* ch, const absl::Status& why) {
    if (ch->sock == nullptr) return;
    ch->reader_stop.store(true);
    ch->sock->ShutdownBoth();
    ch->reader.join();
    ch->sock.reset();
    ch->session.reset();
    absl::MutexLock lock(&mu_);
    FailInFlight(ch, why);
    ch->broken = false;
  }

  void ReaderLoop(Channel* ch, SecureSocket& sock, KvSession& seal) {
    char hdr[kKvFrameHeaderBytes];
    std::string message;
    absl::Status why;
    for (;;) {
      // An ACK is believed only with its seals: a relay in the middle cannot answer for the
      // decode worker.
      why = ReadSealedHeader(sock, seal, hdr, ch->reader_stop, options_.io_timeout);
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
      why = sock.ReadFull(message.data(), message.size(), ch->reader_stop,
                          absl::Now() + options_.io_timeout, options_.io_timeout);
      if (!why.ok()) break;
      seal.BeginReceive();
      seal.ReceivePart(message);
      why = ReadRecordTag(sock, seal, ch->reader_stop, options_.io_timeout);
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
  if (!options.auth.secured()) {
    return absl::InvalidArgumentError(
        "kv tcp receiver: no cluster credentials (a secret or mutual TLS): the KV port is never "
        "open");
  }
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

absl::StatusOr<std::unique_ptr<KvSender>> CreateTcpKvSender(const KvSenderOptions& options) {
  if (!options.auth.secured()) {
    return absl::InvalidArgumentError(
        "kv tcp sender: no cluster credentials (a secret or mutual TLS) to prove to decode "
        "workers");
  }
  return std::make_unique<TcpKvSender>(options);
}

}  // namespace tandem
