// A connected stream socket, plaintext or TLS (OpenSSL), with non-blocking primitives for event
// loops and deadline-bounded blocking helpers for threads. Used by the KV transfer's tcp
// transport and the HTTP server; no gRPC.
//
// Thread safety: one reader and one writer may use a socket at the same time (the KV sender
// reads ACKs on one thread while writing chunks on another); the TLS state is locked around
// each OpenSSL call, and no call blocks while holding that lock.
#ifndef TANDEM_SECURITY_SECURE_SOCKET_H_
#define TANDEM_SECURITY_SECURE_SOCKET_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/tls_config.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
struct sockaddr_storage;

namespace tandem {

// The IP address of a peer as text ("" when it is neither IPv4 nor IPv6): the HTTP server and
// the KV receiver cap connections per peer host.
std::string PeerHost(const sockaddr_storage& address);

// An OpenSSL context made from a TlsConfig (TLS 1.2 or later).
class SslContext {
 public:
  // Presents the certificate; with a CA, requires a client certificate the CA signed.
  static absl::StatusOr<std::shared_ptr<SslContext>> ForServer(const TlsConfig& tls);
  // Verifies the server against the CA (the system's roots without one; the host name is not
  // checked: the cluster's peers are named by address and authorized by role); presents the
  // certificate when there is one.
  static absl::StatusOr<std::shared_ptr<SslContext>> ForClient(const TlsConfig& tls);
  ~SslContext();
  SSL_CTX* get() const { return ctx_; }

 private:
  explicit SslContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

// Waits until `fd` is ready for `events` (poll flags), `stop` is set (CANCELLED) or `deadline`
// passes (DEADLINE_EXCEEDED), in slices short enough to see `stop` promptly. Hang-ups and errors
// count as ready: the next read or write reports them.
absl::Status WaitReady(int fd, short events, const std::atomic<bool>& stop, absl::Time deadline);

class SecureSocket {
 public:
  enum class Io { kOk, kWantRead, kWantWrite, kClosed, kError };

  // Takes ownership of `fd` (made non-blocking). `tls` null: plaintext. Under TLS the
  // handshake is still to run (TryHandshake or Handshake).
  SecureSocket(int fd, std::shared_ptr<SslContext> tls, bool server);
  ~SecureSocket();
  SecureSocket(const SecureSocket&) = delete;
  SecureSocket& operator=(const SecureSocket&) = delete;

  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }

  // Non-blocking steps. kWantRead/kWantWrite: wait for the socket to be readable/writable,
  // then call again. kClosed: the peer closed the connection. kError: `error` (when given) says
  // why.
  Io TryHandshake(std::string* error = nullptr);
  Io TryRead(char* buf, size_t n, size_t* got, std::string* error = nullptr);
  Io TryWrite(const char* buf, size_t n, size_t* wrote, std::string* error = nullptr);

  // Blocking helpers over the steps. Handshake: the whole TLS handshake by `deadline` (OK at
  // once in plaintext). ReadFull: exactly `n` bytes; before the first byte the wait is bounded
  // by `first_deadline`, after it each stall by `io_timeout`. WriteAll: `a` then `b`, each stall
  // bounded by `io_timeout`. UNAVAILABLE when the peer closes or the socket fails.
  absl::Status Handshake(const std::atomic<bool>& stop, absl::Time deadline);
  absl::Status ReadFull(char* buf, size_t n, const std::atomic<bool>& stop,
                        absl::Time first_deadline, absl::Duration io_timeout);
  absl::Status WriteAll(std::span<const char> a, std::span<const char> b,
                        const std::atomic<bool>& stop, absl::Duration io_timeout);

  // The roles the peer's certificate names (after the handshake; empty in plaintext).
  RoleSet PeerRoles();
  // Wakes any thread blocked on this socket (shutdown(2) of both directions); the descriptor
  // stays open until destruction.
  void ShutdownBoth();

 private:
  // Classifies an OpenSSL call's result (under ssl_mu_).
  Io SslResult(int ret, const char* what, std::string* error);

  int fd_;
  SSL* ssl_ = nullptr;
  std::mutex ssl_mu_;  // OpenSSL calls on ssl_
};

}  // namespace tandem

#endif  // TANDEM_SECURITY_SECURE_SOCKET_H_
