#include "metrics/metrics_server.h"

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "prometheus/exposer.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<MetricsRegistry> registry) {
  if (port < 0 || port > 65535) return absl::InvalidArgumentError("metrics port out of range");
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->registry_ = std::move(registry);
  const std::string bind = absl::StrFormat("%s:%d", host, port);
  try {
    // One thread: a scrape is cheap and scrapers are few.
    s->exposer_ = std::make_unique<prometheus::Exposer>(bind, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrFormat("cannot serve metrics on %s: %s", bind, e.what()));
  }
  s->exposer_->RegisterCollectable(s->registry_);
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(absl::StrFormat("metrics server on %s has no port", bind));
  }
  s->port_ = ports[0];
  s->address_ = absl::StrFormat("%s:%d", host, s->port_);
  return s;
}

MetricsServer::~MetricsServer() = default;

}  // namespace tandem
