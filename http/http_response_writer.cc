// HttpResponseWriter (declared in http/http_listener.h): the bytes of a response, framed, into
// the connection's outbox.
#include <poll.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "http/http_listener.h"

namespace tandem {

const char* HttpReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string HttpResponseWriter::Head(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string head = absl::StrFormat("HTTP/1.1 %d %s\r\n", status, HttpReason(status));
  if (!content_type.empty()) absl::StrAppendFormat(&head, "Content-Type: %s\r\n", content_type);
  for (const auto& [name, value] : headers) absl::StrAppendFormat(&head, "%s: %s\r\n", name, value);
  head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return head;
}

bool HttpResponseWriter::WriteRaw(std::string_view a, std::string_view b, bool wait_for_room) {
  if (failed_) return false;
  if (!out_->Push(a, b, wait_for_room)) failed_ = true;
  return !failed_;
}

bool HttpResponseWriter::Send(int status, std::string_view content_type, std::string_view body,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
  if (started_) return false;
  started_ = true;
  ended_ = true;
  std::string head = Head(status, content_type, headers);
  absl::StrAppendFormat(&head, "Content-Length: %d\r\n\r\n", body.size());
  return WriteRaw(head, body, /*wait_for_room=*/false);
}

bool HttpResponseWriter::StartStream(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  if (started_) return false;
  started_ = true;
  streaming_ = true;
  std::string head = Head(status, content_type, headers);
  head += "Transfer-Encoding: chunked\r\n\r\n";
  return WriteRaw(head);
}

bool HttpResponseWriter::Write(std::string_view data) {
  if (!streaming_ || ended_) return false;
  if (data.empty()) return !failed_;
  std::string framed = absl::StrFormat("%x\r\n", data.size());
  framed.append(data);
  framed += "\r\n";
  return WriteRaw(framed);
}

bool HttpResponseWriter::WriteThen(std::string_view data, std::function<void(bool)> room) {
  if (!streaming_ || ended_ || failed_) return false;
  std::string framed = absl::StrFormat("%x\r\n", data.size());
  framed.append(data);
  framed += "\r\n";
  if (data.empty()) framed.clear();
  if (!out_->PushThen(framed, {}, std::move(room))) {
    failed_ = true;
    return false;
  }
  return true;
}

void HttpResponseWriter::OnClientGone(std::function<void()> fn) { out_->OnFail(std::move(fn)); }

std::shared_ptr<HttpResponseWriter> HttpResponseWriter::Hold() {
  held_ = true;
  return shared_from_this();
}

void HttpResponseWriter::Release() { Finish(); }

void HttpResponseWriter::Finish() {
  if (finished_.exchange(true)) return;
  out_->OnFail(nullptr);
  if (finish_) finish_(*this);
}

bool HttpResponseWriter::End() {
  if (!streaming_ || ended_) return false;
  ended_ = true;
  return WriteRaw("0\r\n\r\n");
}

bool HttpResponseWriter::ClientGone() const {
  if (failed_ || out_->failed()) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

}  // namespace tandem
