// A relay in the middle of tcp KV connections, as an attacker on the path (or an impostor
// registered as a decode worker) would run one: it passes the handshake between a sender and a
// real receiver untouched, so both ends prove the cluster secret to each other through it, and
// then does what its mode says with the frames that follow. Frames are read as a sealed session
// lays them out (kv_transfer/kv_auth.h): header | tag | payload | tag.
#ifndef TANDEM_TESTS_KV_TRANSFER_KV_RELAY_H_
#define TANDEM_TESTS_KV_TRANSFER_KV_RELAY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/wire.h"
#include "security/cluster_secret.h"

namespace tandem::testing {

class KvRelay {
 public:
  enum class Mode {
    kPass,              // every byte both ways: the control
    kAnswerItself,      // keeps the frames and answers each with an OK ACK of its own
    kTamperPayload,     // forwards every frame with its payload altered (checksum fixed)
    kReplayFirstFrame,  // forwards the first frame, then the same bytes again
  };

  // `upstream`: the real receiver's "tcp://HOST:PORT".
  KvRelay(const std::string& upstream, Mode mode) : mode_(mode) {
    const std::string hp = upstream.substr(upstream.find("://") + 3);
    upstream_port_ = std::stoi(hp.substr(hp.rfind(':') + 1));
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    endpoint_ = absl::StrCat("tcp://127.0.0.1:", ntohs(a.sin_port));
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~KvRelay() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    ::close(listen_fd_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    // A connection's thread may still start its answer pump: join until none is left.
    for (;;) {
      std::thread t;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (threads_.empty()) break;
        t = std::move(threads_.back());
        threads_.pop_back();
      }
      t.join();
    }
    for (int fd : fds_) ::close(fd);
  }

  // Where senders should connect ("tcp://127.0.0.1:PORT").
  const std::string& endpoint() const { return endpoint_; }
  int handshakes() const { return handshakes_.load(); }  // relayed to the end
  int frames() const { return frames_.load(); }          // sender frames read after them
  int forged_acks() const { return forged_acks_.load(); }

 private:
  static bool ReadN(int fd, std::string* out, size_t n) {
    out->assign(n, '\0');
    for (size_t got = 0; got < n;) {
      const ssize_t r = ::recv(fd, out->data() + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  static bool WriteAll(int fd, std::string_view bytes) {
    for (size_t put = 0; put < bytes.size();) {
      const ssize_t w = ::send(fd, bytes.data() + put, bytes.size() - put, MSG_NOSIGNAL);
      if (w <= 0) return false;
      put += static_cast<size_t>(w);
    }
    return true;
  }
  // Copies `n` bytes from one socket to the other.
  static bool Relay(int from, int to, size_t n) {
    std::string b;
    return ReadN(from, &b, n) && WriteAll(to, b);
  }
  // One sealed frame from `fd`: its header, payload and the bytes as read.
  static bool ReadFrame(int fd, KvFrameHeader* h, std::string* payload, std::string* raw) {
    std::string head, tail;
    if (!ReadN(fd, &head, kKvFrameHeaderBytes + kKvFrameTagBytes)) return false;
    absl::StatusOr<KvFrameHeader> d = DecodeKvFrameHeader(head.substr(0, kKvFrameHeaderBytes));
    if (!d.ok()) return false;
    *h = *d;
    if (!ReadN(fd, &tail, d->payload_length + kKvFrameTagBytes)) return false;
    *payload = tail.substr(0, d->payload_length);
    *raw = head + tail;
    return true;
  }

  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0 || stop_) continue;
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(upstream_port_));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(client);
      fds_.push_back(up);
      threads_.emplace_back([this, client, up] { Serve(client, up); });
    }
  }

  void Serve(int client, int up) {
    // The handshake, untouched: hello (40), answer (72), proof (32).
    if (!Relay(up, client, 40) || !Relay(client, up, 72) || !Relay(up, client, 32)) return;
    ++handshakes_;
    if (mode_ == Mode::kPass || mode_ == Mode::kTamperPayload || mode_ == Mode::kReplayFirstFrame) {
      // What the receiver answers goes back to the sender as it is.
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      threads_.emplace_back([client, up] {
        char buf[65536];
        for (ssize_t n; (n = ::recv(up, buf, sizeof(buf), 0)) > 0;) {
          if (!WriteAll(client, std::string_view(buf, n))) break;
        }
        ::shutdown(client, SHUT_RDWR);
      });
    }
    KvFrameHeader h;
    std::string payload, raw;
    while (ReadFrame(client, &h, &payload, &raw)) {
      const int n = ++frames_;
      switch (mode_) {
        case Mode::kPass:
          if (!WriteAll(up, raw)) return;
          break;
        case Mode::kAnswerItself: {
          const std::string ack = EncodeKvAckFrame(h.seq, h.chunk, absl::OkStatus());
          const std::string head = ack.substr(0, kKvFrameHeaderBytes);
          const std::string message = ack.substr(kKvFrameHeaderBytes);
          // No key: the best it can do for the tags is guess. Counted before it is written: the
          // sender may refuse it, and the test look, before this thread goes on.
          ++forged_acks_;
          if (!WriteAll(client, head + RandomBytes(kKvFrameTagBytes) + message +
                                    RandomBytes(kKvFrameTagBytes))) {
            return;
          }
          break;
        }
        case Mode::kTamperPayload: {
          std::string altered = payload;
          if (!altered.empty()) altered[0] ^= 0x5a;
          // A well-formed frame for the altered payload (its checksums right), under the
          // original frame's tags.
          const std::string frame = EncodeKvDataFrame(h.seq, h.chunk, altered);
          const std::string tag1 = raw.substr(kKvFrameHeaderBytes, kKvFrameTagBytes);
          const std::string tag2 = raw.substr(raw.size() - kKvFrameTagBytes);
          if (!WriteAll(up, frame.substr(0, kKvFrameHeaderBytes) + tag1 +
                                frame.substr(kKvFrameHeaderBytes) + tag2)) {
            return;
          }
          break;
        }
        case Mode::kReplayFirstFrame:
          if (!WriteAll(up, raw)) return;
          if (n == 1 && !WriteAll(up, raw)) return;
          break;
      }
    }
  }

  const Mode mode_;
  int upstream_port_ = 0;
  int listen_fd_ = -1;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<int> handshakes_{0}, frames_{0}, forged_acks_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  bool closing_ = false;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_KV_TRANSFER_KV_RELAY_H_
