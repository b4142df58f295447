#include "security/secure_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// Every blocking wait is cut into slices this long so a stop flag is seen promptly even when
// nobody shuts the socket down.
constexpr int kPollSliceMs = 100;

std::string OpenSslError(const char* what) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return absl::StrFormat("%s failed", what);
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return absl::StrFormat("%s: %s", what, buf);
}

// Loads `pem` (certificates, leaf first) as the context's chain and `key_pem` as its key.
absl::Status UseCertificate(SSL_CTX* ctx, const TlsConfig& tls) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(tls.cert_pem.data(), static_cast<int>(tls.cert_pem.size())), BIO_free);
  X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr || SSL_CTX_use_certificate(ctx, leaf) != 1) {
    X509_free(leaf);
    return absl::InvalidArgumentError(OpenSslError("tls certificate"));
  }
  X509_free(leaf);
  while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) X509_free(extra);
  }
  ERR_clear_error();  // the end of the chain reads as an error
  std::unique_ptr<BIO, decltype(&BIO_free)> kbio(
      BIO_new_mem_buf(tls.key_pem.data(), static_cast<int>(tls.key_pem.size())), BIO_free);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr);
  const bool ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1 &&
                  SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  if (!ok) return absl::InvalidArgumentError(OpenSslError("tls private key"));
  return absl::OkStatus();
}

absl::Status UseCa(SSL_CTX* ctx, const std::string& ca_pem) {
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())), BIO_free);
  int n = 0;
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, c);
    X509_free(c);
    ++n;
  }
  ERR_clear_error();
  if (n == 0) return absl::InvalidArgumentError("tls ca: no certificate");
  return absl::OkStatus();
}

SSL_CTX* NewContext(bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return nullptr;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

}  // namespace

std::string PeerHost(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, buf, sizeof(buf));
  } else if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

absl::StatusOr<std::shared_ptr<SslContext>> SslContext::ForServer(const TlsConfig& tls) {
  if (!tls.enabled || tls.cert_pem.empty()) {
    return absl::InvalidArgumentError("a TLS server needs a certificate and key");
  }
  SSL_CTX* ctx = NewContext(/*server=*/true);
  if (ctx == nullptr) return absl::InternalError(OpenSslError("SSL_CTX_new"));
  std::shared_ptr<SslContext> out(new SslContext(ctx));
  if (absl::Status s = UseCertificate(ctx, tls); !s.ok()) return s;
  if (!tls.ca_pem.empty()) {
    if (absl::Status s = UseCa(ctx, tls.ca_pem); !s.ok()) return s;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<SslContext>> SslContext::ForClient(const TlsConfig& tls) {
  SSL_CTX* ctx = NewContext(/*server=*/false);
  if (ctx == nullptr) return absl::InternalError(OpenSslError("SSL_CTX_new"));
  std::shared_ptr<SslContext> out(new SslContext(ctx));
  if (!tls.cert_pem.empty()) {
    if (absl::Status s = UseCertificate(ctx, tls); !s.ok()) return s;
  }
  if (!tls.ca_pem.empty()) {
    if (absl::Status s = UseCa(ctx, tls.ca_pem); !s.ok()) return s;
  } else {
    SSL_CTX_set_default_verify_paths(ctx);
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  return out;
}

SslContext::~SslContext() { SSL_CTX_free(ctx_); }

absl::Status WaitReady(int fd, short events, const std::atomic<bool>& stop, absl::Time deadline) {
  for (;;) {
    if (stop.load(std::memory_order_relaxed)) return absl::CancelledError("shutting down");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("i/o timeout");
    const int ms =
        left > absl::Milliseconds(kPollSliceMs)
            ? kPollSliceMs
            : static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrFormat("poll: %s", std::strerror(errno)));
    }
    if (r > 0) return absl::OkStatus();
  }
}

SecureSocket::SecureSocket(int fd, std::shared_ptr<SslContext> tls, bool server) : fd_(fd) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  if (tls == nullptr) return;
  // OpenSSL writes with write(2): a peer that closed must be an error, not a SIGPIPE.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { ::signal(SIGPIPE, SIG_IGN); });
  ssl_ = SSL_new(tls->get());
  if (ssl_ == nullptr) return;  // every step then reports the error
  SSL_set_fd(ssl_, fd_);
  if (server) {
    SSL_set_accept_state(ssl_);
  } else {
    SSL_set_connect_state(ssl_);
  }
}

SecureSocket::~SecureSocket() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ::close(fd_);
}

SecureSocket::Io SecureSocket::SslResult(int ret, const char* what, std::string* error) {
  const int e = SSL_get_error(ssl_, ret);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      return Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Io::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Io::kClosed;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0 && (ret == 0 || errno == 0 || errno == ECONNRESET)) {
        ERR_clear_error();
        return Io::kClosed;
      }
      [[fallthrough]];
    default:
      if (error != nullptr) {
        *error = e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0
                     ? absl::StrFormat("%s: %s", what, std::strerror(errno))
                     : OpenSslError(what);
      }
      ERR_clear_error();
      return Io::kError;
  }
}

SecureSocket::Io SecureSocket::TryHandshake(std::string* error) {
  if (ssl_ == nullptr) return Io::kOk;
  std::lock_guard<std::mutex> lock(ssl_mu_);
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) return Io::kOk;
  const Io io = SslResult(r, "tls handshake", error);
  if (io == Io::kClosed && error != nullptr) *error = "tls handshake: the peer closed";
  return io == Io::kClosed ? Io::kError : io;
}

SecureSocket::Io SecureSocket::TryRead(char* buf, size_t n, size_t* got, std::string* error) {
  *got = 0;
  if (ssl_ == nullptr) {
    for (;;) {
      const ssize_t r = ::recv(fd_, buf, n, MSG_DONTWAIT);
      if (r > 0) {
        *got = static_cast<size_t>(r);
        return Io::kOk;
      }
      if (r == 0) return Io::kClosed;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kWantRead;
      if (errno == ECONNRESET) return Io::kClosed;
      if (error != nullptr) *error = absl::StrFormat("recv: %s", std::strerror(errno));
      return Io::kError;
    }
  }
  std::lock_guard<std::mutex> lock(ssl_mu_);
  ERR_clear_error();
  const int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) {
    *got = static_cast<size_t>(r);
    return Io::kOk;
  }
  return SslResult(r, "tls read", error);
}

SecureSocket::Io SecureSocket::TryWrite(const char* buf, size_t n, size_t* wrote,
                                        std::string* error) {
  *wrote = 0;
  if (ssl_ == nullptr) {
    for (;;) {
      const ssize_t r = ::send(fd_, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (r >= 0) {
        *wrote = static_cast<size_t>(r);
        return Io::kOk;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kWantWrite;
      if (errno == EPIPE || errno == ECONNRESET) return Io::kClosed;
      if (error != nullptr) *error = absl::StrFormat("send: %s", std::strerror(errno));
      return Io::kError;
    }
  }
  std::lock_guard<std::mutex> lock(ssl_mu_);
  ERR_clear_error();
  const int r = SSL_write(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) {
    *wrote = static_cast<size_t>(r);
    return Io::kOk;
  }
  return SslResult(r, "tls write", error);
}

absl::Status SecureSocket::Handshake(const std::atomic<bool>& stop, absl::Time deadline) {
  for (;;) {
    std::string error;
    switch (TryHandshake(&error)) {
      case Io::kOk:
        return absl::OkStatus();
      case Io::kWantRead:
        if (absl::Status s = WaitReady(fd_, POLLIN, stop, deadline); !s.ok()) return s;
        break;
      case Io::kWantWrite:
        if (absl::Status s = WaitReady(fd_, POLLOUT, stop, deadline); !s.ok()) return s;
        break;
      default:
        return absl::UnavailableError(error);
    }
  }
}

absl::Status SecureSocket::ReadFull(char* buf, size_t n, const std::atomic<bool>& stop,
                                    absl::Time first_deadline, absl::Duration io_timeout) {
  size_t got = 0;
  absl::Time deadline = first_deadline;
  while (got < n) {
    size_t r = 0;
    std::string error;
    switch (TryRead(buf + got, n - got, &r, &error)) {
      case Io::kOk:
        got += r;
        deadline = absl::Now() + io_timeout;
        break;
      case Io::kWantRead:
        if (absl::Status s = WaitReady(fd_, POLLIN, stop, deadline); !s.ok()) return s;
        break;
      case Io::kWantWrite:
        if (absl::Status s = WaitReady(fd_, POLLOUT, stop, deadline); !s.ok()) return s;
        break;
      case Io::kClosed:
        return absl::UnavailableError(got == 0 ? "peer closed the connection"
                                               : "peer closed the connection mid-frame");
      case Io::kError:
        return absl::UnavailableError(error);
    }
  }
  return absl::OkStatus();
}

absl::Status SecureSocket::WriteAll(std::span<const char> a, std::span<const char> b,
                                    const std::atomic<bool>& stop, absl::Duration io_timeout) {
  absl::Time deadline = absl::Now() + io_timeout;
  for (std::span<const char> part : {a, b}) {
    size_t done = 0;
    while (done < part.size()) {
      size_t w = 0;
      std::string error;
      switch (TryWrite(part.data() + done, part.size() - done, &w, &error)) {
        case Io::kOk:
          done += w;
          deadline = absl::Now() + io_timeout;
          break;
        case Io::kWantWrite:
          if (absl::Status s = WaitReady(fd_, POLLOUT, stop, deadline); !s.ok()) return s;
          break;
        case Io::kWantRead:
          if (absl::Status s = WaitReady(fd_, POLLIN, stop, deadline); !s.ok()) return s;
          break;
        case Io::kClosed:
          return absl::UnavailableError("peer closed the connection");
        case Io::kError:
          return absl::UnavailableError(error);
      }
    }
  }
  return absl::OkStatus();
}

RoleSet SecureSocket::PeerRoles() {
  if (ssl_ == nullptr) return {};
  std::lock_guard<std::mutex> lock(ssl_mu_);
  X509* cert = SSL_get1_peer_certificate(ssl_);
  if (cert == nullptr) return {};
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(bio.get(), cert);
  X509_free(cert);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  return RolesOfCertificate(std::string_view(data, static_cast<size_t>(len)));
}

void SecureSocket::ShutdownBoth() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace tandem
