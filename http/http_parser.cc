#include "http/http_parser.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

constexpr size_t kMaxChunkLineBytes = 1024;
// A body's buffer before its bytes come (it then doubles as they do).
constexpr size_t kInitialBodyReserve = 16 << 10;

bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return {};
}

bool HttpRequest::KeepAlive() const {
  const std::string connection = Lower(Header("connection"));
  if (version_minor == 0) return connection == "keep-alive";
  return connection != "close";
}

void HttpRequestParser::Fail(int status, std::string message) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
}

size_t HttpRequestParser::Feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && !head_pending_ &&
         (state_ == State::kHeaders || state_ == State::kBody)) {
    const std::string_view rest = data.substr(used);
    used += state_ == State::kHeaders ? FeedHeaders(rest)
            : chunked_                ? FeedChunked(rest)
                                      : FeedBody(rest);
  }
  // A body of length zero completes with the headers.
  if (state_ == State::kBody && !head_pending_ && !chunked_ && content_left_ == 0) {
    state_ = State::kDone;
  }
  return used;
}

void HttpRequestParser::AcceptHead() {
  head_pending_ = false;
  if (state_ == State::kBody && !chunked_ && content_left_ == 0) state_ = State::kDone;
}

size_t HttpRequestParser::FeedHeaders(std::string_view data) {
  size_t skipped = 0;
  if (head_.empty()) {
    // Empty lines before a request line are ignored (RFC 9112 2.2).
    while (skipped < data.size() && (data[skipped] == '\r' || data[skipped] == '\n')) ++skipped;
    data.remove_prefix(skipped);
    if (data.empty()) return skipped;
  }
  started_ = true;
  // The end of the head is the first empty line; look for it across the old and new bytes.
  const size_t old = head_.size();
  const size_t from = old >= 3 ? old - 3 : 0;
  std::string window = head_.substr(from);
  window.append(data.substr(0, std::min(data.size(), limits_.max_header_bytes + 4)));
  size_t end = std::string::npos;  // in `window`, one past the empty line
  for (size_t i = 0; i + 1 < window.size(); ++i) {
    if (window[i] != '\n') continue;
    if (window[i + 1] == '\n') {
      end = i + 2;
      break;
    }
    if (window[i + 1] == '\r' && i + 2 < window.size() && window[i + 2] == '\n') {
      end = i + 3;
      break;
    }
  }
  const size_t take = end == std::string::npos ? data.size() : from + end - old;
  if (old + take > limits_.max_header_bytes) {
    Fail(431,
         absl::StrFormat("the request line and headers exceed %d bytes", limits_.max_header_bytes));
    return skipped + std::min(take, data.size());
  }
  head_.append(data.substr(0, take));
  if (end != std::string::npos && ParseHead()) {
    parsed_head_bytes_ = head_.size();
    std::string().swap(head_);  // up to 64 KiB: not kept for an idle keep-alive connection
    state_ = State::kBody;
    head_pending_ = pause_after_head_;
  }
  return skipped + take;
}

bool HttpRequestParser::ParseHead() {
  std::vector<std::string_view> lines;
  std::string_view h = head_;
  while (!h.empty()) {
    size_t nl = h.find('\n');
    std::string_view line = h.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (nl == std::string_view::npos) break;
    h.remove_prefix(nl + 1);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) {
    Fail(400, "empty request");
    return false;
  }
  // Request line: METHOD SP TARGET SP HTTP/1.x
  const std::string_view rl = lines[0];
  const size_t sp1 = rl.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      rl.find(' ', sp2 + 1) != std::string_view::npos) {
    Fail(400, "malformed request line");
    return false;
  }
  const std::string_view method = rl.substr(0, sp1);
  const std::string_view target = rl.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = rl.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), IsTokenChar)) {
    Fail(400, "malformed method");
    return false;
  }
  if (target.empty() || (target[0] != '/' && target != "*") ||
      std::any_of(target.begin(), target.end(),
                  [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; })) {
    Fail(400, "malformed request target");
    return false;
  }
  if (version == "HTTP/1.1") {
    request_.version_minor = 1;
  } else if (version == "HTTP/1.0") {
    request_.version_minor = 0;
  } else {
    Fail(505, absl::StrFormat("HTTP version '%s' is not supported (HTTP/1.1 is)",
                              std::string(version.substr(0, 16))));
    return false;
  }
  request_.method = std::string(method);
  request_.target = std::string(target);
  request_.path = request_.target.substr(0, request_.target.find('?'));
  if (lines.size() - 1 > limits_.max_headers) {
    Fail(431, absl::StrFormat("more than %d headers", limits_.max_headers));
    return false;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos || line[0] == ' ' || line[0] == '\t') {
      Fail(400, "malformed header line");
      return false;
    }
    const std::string_view name = line.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), IsTokenChar)) {
      Fail(400, "malformed header name");
      return false;
    }
    request_.headers.emplace_back(Lower(name), std::string(Trim(line.substr(colon + 1))));
  }

  // Body framing. Both Transfer-Encoding and Content-Length is how requests are smuggled past
  // proxies: refused.
  const std::string te = Lower(request_.Header("transfer-encoding"));
  bool has_length = false;
  size_t length = 0;
  for (const auto& [n, v] : request_.headers) {
    if (n != "content-length") continue;
    size_t value = 0;
    if (v.empty() || v.size() > 18 ||
        !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      Fail(400, "Content-Length: not a number");
      return false;
    }
    for (char c : v) value = value * 10 + static_cast<size_t>(c - '0');
    if (has_length && value != length) {
      Fail(400, "Content-Length: given twice with different values");
      return false;
    }
    has_length = true;
    length = value;
  }
  if (!te.empty()) {
    if (has_length) {
      Fail(400, "both Transfer-Encoding and Content-Length");
      return false;
    }
    if (te != "chunked") {
      Fail(501, absl::StrFormat("Transfer-Encoding '%s' is not supported (chunked is)",
                                te.substr(0, 32)));
      return false;
    }
    chunked_ = true;
    chunk_state_ = ChunkState::kSize;
  } else if (length > limits_.max_body_bytes) {
    Fail(413, absl::StrFormat("the request body is larger than %d bytes", limits_.max_body_bytes));
    return false;
  } else {
    // The body's buffer grows as its bytes arrive: a length announced costs nothing.
    content_left_ = length;
    request_.body.reserve(std::min(length, kInitialBodyReserve));
  }
  expect_continue_ =
      Lower(request_.Header("expect")) == "100-continue" && (chunked_ || content_left_ > 0);
  return true;
}

size_t HttpRequestParser::FeedBody(std::string_view data) {
  const size_t take = std::min(data.size(), content_left_);
  request_.body.append(data.substr(0, take));
  content_left_ -= take;
  if (content_left_ == 0) state_ = State::kDone;
  return take;
}

size_t HttpRequestParser::FeedChunked(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && state_ == State::kBody) {
    const char c = data[used];
    switch (chunk_state_) {
      case ChunkState::kSize:
      case ChunkState::kTrailers: {
        ++used;
        if (c != '\n') {
          if (chunk_line_.size() >= kMaxChunkLineBytes) {
            Fail(400, "chunked body: a chunk-size or trailer line is too long");
            return used;
          }
          chunk_line_.push_back(c);
          break;
        }
        std::string_view line = chunk_line_;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (chunk_state_ == ChunkState::kTrailers) {
          if (line.empty()) state_ = State::kDone;  // trailers are read and dropped
          chunk_line_.clear();
          break;
        }
        line = Trim(line.substr(0, line.find(';')));  // chunk extensions are ignored
        size_t size = 0;
        if (line.empty() || line.size() > 15 ||
            !std::all_of(line.begin(), line.end(), [](char h) { return std::isxdigit(h); })) {
          Fail(400, "chunked body: malformed chunk size");
          return used;
        }
        for (char h : line) {
          size = size * 16 +
                 static_cast<size_t>(std::isdigit(h) ? h - '0' : std::tolower(h) - 'a' + 10);
        }
        chunk_line_.clear();
        if (size > limits_.max_body_bytes - request_.body.size()) {
          Fail(413,
               absl::StrFormat("the request body is larger than %d bytes", limits_.max_body_bytes));
          return used;
        }
        chunk_left_ = size;
        chunk_state_ = size == 0 ? ChunkState::kTrailers : ChunkState::kData;
        break;
      }
      case ChunkState::kData: {
        const size_t take = std::min(data.size() - used, chunk_left_);
        request_.body.append(data.substr(used, take));
        used += take;
        chunk_left_ -= take;
        if (chunk_left_ == 0) chunk_state_ = ChunkState::kDataEnd;
        break;
      }
      case ChunkState::kDataEnd:
        // The CRLF after a chunk's data.
        ++used;
        if (c == '\n') {
          chunk_state_ = ChunkState::kSize;
        } else if (c != '\r') {
          Fail(400, "chunked body: chunk data longer than its size");
          return used;
        }
        break;
    }
  }
  return used;
}

HttpRequest HttpRequestParser::TakeRequest() {
  HttpRequest out = std::move(request_);
  request_ = HttpRequest();
  state_ = State::kHeaders;
  head_pending_ = false;
  parsed_head_bytes_ = 0;
  started_ = false;
  expect_continue_ = false;
  chunked_ = false;
  content_left_ = 0;
  chunk_line_.clear();
  chunk_left_ = 0;
  return out;
}

}  // namespace tandem
