// The /metrics HTTP endpoint of a process (prometheus-cpp's civetweb exposer).
#ifndef TANDEM_METRICS_METRICS_SERVER_H_
#define TANDEM_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace tandem {

class MetricsServer {
 public:
  // Serves `registry` at http://HOST:PORT/metrics; port 0 picks a free one. UNAVAILABLE when
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<MetricsRegistry> registry);
  ~MetricsServer();

  int port() const { return port_; }
  // "HOST:PORT", the address to scrape.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<MetricsRegistry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
};

}  // namespace tandem

#endif  // TANDEM_METRICS_METRICS_SERVER_H_
