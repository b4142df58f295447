// Talking to the HTTP API in tests: curl through popen (what users run), server-sent events
// split into JSON, and a raw socket for requests the test abandons mid-way.
#ifndef TANDEM_TESTS_HTTP_HTTP_CLIENT_H_
#define TANDEM_TESTS_HTTP_HTTP_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace tandem::testing {

struct HttpReply {
  int status = 0;  // 0: curl failed
  std::string body;
  nlohmann::json Json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// `curl -X method` to http://`host_port``path` (method empty: POST `body` when not empty, else
// GET); `headers` as "Name: value".
inline HttpReply CurlMethod(const std::string& host_port, const std::string& method,
                            const std::string& path, const std::string& body = "",
                            const std::vector<std::string>& headers = {}) {
  TempDir dir;
  std::string cmd = "curl -s -S -N --max-time 120 -w '\\n%{http_code}'";
  if (!method.empty()) cmd += " -X " + method;
  for (const std::string& h : headers) cmd += " -H '" + h + "'";
  if (!body.empty()) {
    const std::string file = dir.path() + "/body.json";
    std::ofstream(file) << body;
    cmd += " -H 'Content-Type: application/json' --data-binary @" + file;
  }
  cmd += " 'http://" + host_port + path + "' 2>&1";
  HttpReply reply;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return reply;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  const size_t nl = out.rfind('\n');
  if (nl == std::string::npos) return reply;
  reply.status = std::atoi(out.c_str() + nl + 1);
  reply.body = out.substr(0, nl);
  return reply;
}

inline HttpReply Curl(const std::string& host_port, const std::string& path,
                      const std::string& body = "", const std::vector<std::string>& headers = {}) {
  return CurlMethod(host_port, "", path, body, headers);
}

// The `data:` payloads of a server-sent-event body: JSON objects, and "[DONE]" as a string.
inline std::vector<nlohmann::json> SseEvents(const std::string& body) {
  std::vector<nlohmann::json> out;
  size_t p = 0;
  while ((p = body.find("data: ", p)) != std::string::npos) {
    size_t end = body.find("\n\n", p);
    if (end == std::string::npos) end = body.size();
    const std::string data = body.substr(p + 6, end - p - 6);
    out.push_back(data == "[DONE]" ? nlohmann::json("[DONE]")
                                   : nlohmann::json::parse(data, nullptr, false));
    p = end;
  }
  return out;
}

// An HTTP/1.1 POST on a raw socket, for a client that walks away mid-request.
class RawPost {
 public:
  RawPost(const std::string& host_port, const std::string& path, const std::string& body) {
    const size_t colon = host_port.rfind(':');
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
    ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    const std::string req = absl::StrFormat(
        "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: "
        "%d\r\n\r\n%s",
        path, host_port, body.size(), body);
    sent_ = ::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  }
  ~RawPost() { Close(); }

  bool sent() const { return sent_; }
  // Reads until `marker` arrives (true) or the connection ends or `timeout_ms` passes (false).
  bool ReadUntil(const std::string& marker, int timeout_ms = 30000) {
    char buf[4096];
    for (int waited = 0; received_.find(marker) == std::string::npos; waited += 10) {
      if (waited > timeout_ms) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      received_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  const std::string& received() const { return received_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool sent_ = false;
  std::string received_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_HTTP_HTTP_CLIENT_H_
