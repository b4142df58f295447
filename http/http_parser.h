// An incremental HTTP/1.1 request parser: bytes in as they arrive, one request out when it is
// whole (request line, headers, and a body framed by Content-Length or chunked transfer
// coding). Pure: no sockets, no threads, no clock; the server (http/http_listener.h) owns the
// deadlines. Every limit is checked before the bytes it guards are kept, so a request that
// announces more than the limits costs no memory.
#ifndef TANDEM_HTTP_HTTP_PARSER_H_
#define TANDEM_HTTP_HTTP_PARSER_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

struct HttpRequest {
  std::string method;     // "GET", "POST", ...
  std::string target;     // as sent: path and query
  std::string path;       // target without the query
  int version_minor = 1;  // HTTP/1.x
  // Names lowercased, values trimmed, in order.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string peer;    // the client's IP address (set by the server)
  std::string tenant;  // who it counts for in the server's lines (set by the server)

  // The first header named `name` (lowercase), or "".
  std::string_view Header(std::string_view name) const;
  // HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "Connection: keep-alive".
  bool KeepAlive() const;
};

struct HttpParserLimits {
  size_t max_header_bytes = 64 << 10;  // request line and headers
  size_t max_headers = 100;
  size_t max_body_bytes = 16 << 20;
};

class HttpRequestParser {
 public:
  enum class State {
    kHeaders,  // reading the request line and headers
    kBody,     // headers done, reading the body
    kDone,     // a whole request: take it with TakeRequest
    kError,    // error_status() / error_message() say why; the connection must close
  };

  // With `pause_after_head`, Feed stops at the end of each request's headers until AcceptHead:
  // the server decides on the head (API key, length) before a byte of the body is kept.
  explicit HttpRequestParser(HttpParserLimits limits = {}, bool pause_after_head = false)
      : limits_(limits), pause_after_head_(pause_after_head) {}

  // Consumes bytes from `data` and returns how many it used (it stops at the end of a request,
  // so pipelined bytes after it are left for the next one, and at a paused head).
  size_t Feed(std::string_view data);

  State state() const { return state_; }
  // The request line and headers are complete and wait for AcceptHead (pause_after_head); head()
  // has them. Nothing more is consumed until then.
  bool HeadPending() const { return head_pending_; }
  const HttpRequest& head() const { return request_; }  // kBody and kDone: all but the body
  void AcceptHead();
  // Headers are complete (and accepted) and the client asked "Expect: 100-continue" (answer it
  // once).
  bool WantsContinue() const {
    return state_ == State::kBody && expect_continue_ && !head_pending_;
  }
  void ContinueSent() { expect_continue_ = false; }
  // Whether any byte of a request has arrived (an idle keep-alive connection has none).
  bool Started() const { return started_; }
  // Bytes of memory the request holds so far: the head being read or parsed, the body and a
  // chunk-size line (buffers count whole: one grows ahead of its bytes).
  size_t buffered_bytes() const {
    return head_.capacity() + parsed_head_bytes_ + request_.body.capacity() +
           chunk_line_.capacity();
  }

  // kDone: the request; the parser is then ready for the next one.
  HttpRequest TakeRequest();

  int error_status() const { return error_status_; }  // 400, 413, 431, 501, 505
  const std::string& error_message() const { return error_message_; }

 private:
  size_t FeedHeaders(std::string_view data);
  size_t FeedBody(std::string_view data);
  size_t FeedChunked(std::string_view data);
  bool ParseHead();  // request line and headers in head_
  void Fail(int status, std::string message);

  HttpParserLimits limits_;
  bool pause_after_head_;
  State state_ = State::kHeaders;
  bool head_pending_ = false;
  bool started_ = false;
  bool expect_continue_ = false;
  std::string head_;              // bytes of the request line and headers so far
  size_t parsed_head_bytes_ = 0;  // their size once parsed into request_
  HttpRequest request_;
  // Body framing.
  bool chunked_ = false;
  size_t content_left_ = 0;  // Content-Length bytes still to come
  enum class ChunkState { kSize, kData, kDataEnd, kTrailers } chunk_state_ = ChunkState::kSize;
  std::string chunk_line_;  // a chunk-size line or a trailer line so far
  size_t chunk_left_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace tandem

#endif  // TANDEM_HTTP_HTTP_PARSER_H_
