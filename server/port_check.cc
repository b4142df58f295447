#include "server/port_check.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tandem {

absl::Status CheckPortFree(const std::string& flag, const std::string& host, int port) {
  if (port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--host: cannot resolve \"%s\": %s", host, gai_strerror(rc)));
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  // As the servers bind: a port left in TIME_WAIT by an earlier run is free.
  const bool bound = fd >= 0 &&
                     ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                     ::bind(fd, res->ai_addr, res->ai_addrlen) == 0;
  const int error = errno;
  ::freeaddrinfo(res);
  if (fd >= 0) ::close(fd);
  if (bound) return absl::OkStatus();
  const std::string where = host.find(':') != std::string::npos
                                ? absl::StrFormat("[%s]:%d", host, port)
                                : absl::StrFormat("%s:%d", host, port);
  switch (error) {
    case EADDRINUSE:
      return absl::UnavailableError(absl::StrFormat(
          "%s: %s is in use by another process (0 picks a free port)", flag, where));
    case EACCES:
      return absl::UnavailableError(absl::StrFormat(
          "%s: binding %s is not permitted (ports below 1024 need privileges)", flag, where));
    case EADDRNOTAVAIL:
      return absl::UnavailableError(
          absl::StrFormat("%s: --host %s is not an address of this machine", flag, host));
    default:
      return absl::UnavailableError(
          absl::StrFormat("%s: cannot listen on %s: %s", flag, where, std::strerror(error)));
  }
}

}  // namespace tandem
