// Whether the ports a process is told to listen on can be had, checked before anything slow
// (loading a model, sizing a KV cache): each error names the flag and the cause.
#ifndef TANDEM_SERVER_PORT_CHECK_H_
#define TANDEM_SERVER_PORT_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace tandem {

// OK when `port` is 0 (a free one is picked later) or `host:port` can be bound now (the probe
// socket is closed again). UNAVAILABLE naming `flag`: "--http-port: 127.0.0.1:9000 is in use by
// another process (0 picks a free port)", permission denied, or a --host that is not an address
// of this machine.
absl::Status CheckPortFree(const std::string& flag, const std::string& host, int port);

}  // namespace tandem

#endif  // TANDEM_SERVER_PORT_CHECK_H_
