// What a tandem-server process listens on, from its flags: every port checked before anything
// slow (server/port_check.h), and the router's HTTP API options.
#ifndef TANDEM_SERVER_LISTEN_OPTIONS_H_
#define TANDEM_SERVER_LISTEN_OPTIONS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http/http_server.h"
#include "server/server_config.h"

namespace tandem {

// Each port flag of the process's role (--port, --metrics-port; a router's --internal-port and
// --http-port) free to bind now, or the error naming the flag and the cause.
absl::Status CheckServerPorts(const ServerConfig& c);

// The router's HTTP API options from its flags, checked (INVALID_ARGUMENT naming the flags).
absl::StatusOr<HttpServerOptions> RouterHttpOptions(const ServerConfig& c);

}  // namespace tandem

#endif  // TANDEM_SERVER_LISTEN_OPTIONS_H_
