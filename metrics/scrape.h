// Reading Prometheus metrics back: a parser for the text exposition format, a lookup that sums
// the series matching some labels, and a tiny HTTP GET for /metrics and the Prometheus query API.
// Used by the tests and by `tandem plan calibrate`, which reads the workers' step histograms.
#ifndef TANDEM_METRICS_SCRAPE_H_
#define TANDEM_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace tandem {

struct MetricSample {
  std::string name;  // with its _bucket / _sum / _count suffix
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses `name{k="v",...} value` lines; comments are skipped. Label values in Tandem's metrics
// hold no escaped quotes.
inline std::vector<MetricSample> ParseMetricsText(const std::string& text) {
  std::vector<MetricSample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    MetricSample s;
    size_t i = line.find_first_of("{ ");
    if (i == std::string::npos) continue;
    s.name = line.substr(0, i);
    if (line[i] == '{') {
      const size_t end = line.find('}', i);
      if (end == std::string::npos) continue;
      std::string body = line.substr(i + 1, end - i - 1);
      size_t p = 0;
      while (p < body.size()) {
        const size_t eq = body.find('=', p);
        const size_t q1 = body.find('"', eq);
        const size_t q2 = body.find('"', q1 + 1);
        if (eq == std::string::npos || q1 == std::string::npos || q2 == std::string::npos) break;
        s.labels[body.substr(p, eq - p)] = body.substr(q1 + 1, q2 - q1 - 1);
        p = q2 + 1;
        if (p < body.size() && body[p] == ',') ++p;
      }
      i = end + 1;
    }
    const std::string value = line.substr(line.find_first_not_of(' ', i));
    if (!absl::SimpleAtod(value.substr(0, value.find(' ')), &s.value)) continue;
    out.push_back(std::move(s));
  }
  return out;
}

// The sum over the series named `name` whose labels include every pair of `match`; -1 when no
// series matches (so a missing metric never passes for a zero).
inline double MetricValue(const std::vector<MetricSample>& samples, const std::string& name,
                          const std::map<std::string, std::string>& match = {}) {
  double sum = 0;
  bool found = false;
  for (const auto& s : samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      all &= it != s.labels.end() && it->second == v;
    }
    if (!all) continue;
    sum += s.value;
    found = true;
  }
  return found ? sum : -1;
}

// GET http://`host_port``path` (HTTP/1.0, the whole body), bounded by `timeout_ms`.
inline absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                           int timeout_ms = 5000) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("no port in " + host_port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
  if (::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError("not an IPv4 address: " + host_port);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError("cannot connect to " + host_port);
  }
  const std::string request =
      absl::StrFormat("GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host_port);
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError("send failed");
  }
  std::string response;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          give_up - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return absl::DeadlineExceededError("GET " + path + " timed out");
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0) return absl::UnavailableError("recv failed");
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError("not an HTTP response");
  }
  const std::string status = response.substr(9, 3);
  if (status != "200") {
    return absl::UnavailableError(
        absl::StrFormat("GET %s: HTTP %s: %s", path, status, response.substr(body + 4, 300)));
  }
  return response.substr(body + 4);
}

// The samples of one process's /metrics; empty when it cannot be read.
inline std::vector<MetricSample> Scrape(const std::string& host_port) {
  auto text = HttpGet(host_port, "/metrics");
  return text.ok() ? ParseMetricsText(*text) : std::vector<MetricSample>{};
}

}  // namespace tandem

#endif  // TANDEM_METRICS_SCRAPE_H_
