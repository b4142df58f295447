#include "server/listen_options.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "server/port_check.h"

namespace tandem {

absl::Status CheckServerPorts(const ServerConfig& c) {
  const bool router = c.common.role == "router" || c.common.role == "all";
  std::vector<std::pair<const char*, int64_t>> ports = {{"--port", c.common.port},
                                                        {"--metrics-port", c.common.metrics_port}};
  if (router) {
    ports.push_back({"--internal-port", c.router.internal_port});
    ports.push_back({"--http-port", c.router.http_port});
  }
  for (const auto& [flag, port] : ports) {
    if (absl::Status s = CheckPortFree(flag, c.common.host, static_cast<int>(port)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HttpServerOptions> RouterHttpOptions(const ServerConfig& c) {
  const RouterConfig& rc = c.router;
  HttpServerOptions o;
  o.host = c.common.host;
  o.port = static_cast<int>(rc.http_port);
  o.serve_metrics = rc.http_metrics;
  o.tls = {c.common.tls_cert, c.common.tls_key, c.common.tls_ca};
  o.threads = static_cast<int>(std::min<int64_t>(rc.http_threads, 1 << 14));
  o.max_buffered_bytes = static_cast<size_t>(rc.http_max_buffered_bytes);
  o.max_connections = static_cast<int>(rc.http_max_connections);
  o.max_connections_per_client = static_cast<int>(rc.http_max_connections_per_client);
  o.response_buffer_bytes = static_cast<size_t>(rc.http_response_buffer_bytes);
  o.min_write_rate = static_cast<size_t>(rc.http_min_write_rate);
  o.max_building_bytes = static_cast<size_t>(rc.http_max_building_bytes);
  o.max_queued = static_cast<int>(rc.http_max_queued);
  o.trusted_proxies = rc.trusted_proxies;
  if (rc.http_timeout_ms > 0) o.request_timeout = absl::Milliseconds(rc.http_timeout_ms);
  if (absl::Status s = o.Validate(); !s.ok()) {
    return absl::InvalidArgumentError("--http-port/--http-threads: " + std::string(s.message()));
  }
  return o;
}

}  // namespace tandem
