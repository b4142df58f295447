// The HTTP/1.1 parser (pure: every framing rule and limit, and any split of the bytes), the
// JSON body limits, and the listener with hostile clients: slow headers, idle floods, oversized
// announcements, refused heads, bodies past the budget of buffered bytes. Every listener test
// ends with no connection left open.
#include "http/http_listener.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "http/http_parser.h"
#include "http/json_limits.h"

namespace tandem {
namespace {

using State = HttpRequestParser::State;

HttpRequestParser Parsed(std::string_view bytes, HttpParserLimits limits = {}) {
  HttpRequestParser p(limits);
  p.Feed(bytes);
  return p;
}

TEST(HttpParserTest, GetAndPostWithContentLength) {
  HttpRequestParser p = Parsed("GET /health?x=1 HTTP/1.1\r\nHost: a\r\nX-Y:  z \r\n\r\n");
  ASSERT_EQ(p.state(), State::kDone);
  HttpRequest r = p.TakeRequest();
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/health?x=1");
  EXPECT_EQ(r.path, "/health");
  EXPECT_EQ(r.Header("x-y"), "z");
  EXPECT_TRUE(r.KeepAlive());
  EXPECT_EQ(p.state(), State::kHeaders);

  p = Parsed(
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
  ASSERT_EQ(p.state(), State::kDone);
  r = p.TakeRequest();
  EXPECT_EQ(r.body, "hello");
  EXPECT_FALSE(r.KeepAlive());
  // HTTP/1.0 keeps the connection only when asked to.
  r = Parsed("GET / HTTP/1.0\r\n\r\n").TakeRequest();
  EXPECT_FALSE(r.KeepAlive());
  r = Parsed("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").TakeRequest();
  EXPECT_TRUE(r.KeepAlive());
}

TEST(HttpParserTest, PipelinedRequestsAreTakenOneAtATime) {
  const std::string two = "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\r\n\r\n";
  HttpRequestParser p;
  const size_t used = p.Feed(two);
  ASSERT_EQ(p.state(), State::kDone);
  EXPECT_EQ(p.TakeRequest().body, "hi");
  p.Feed(std::string_view(two).substr(used));
  ASSERT_EQ(p.state(), State::kDone);
  EXPECT_EQ(p.TakeRequest().path, "/b");
}

TEST(HttpParserTest, ChunkedBodyWithExtensionsAndTrailers) {
  HttpRequestParser p = Parsed(
      "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\n");
  ASSERT_EQ(p.state(), State::kDone) << p.error_message();
  EXPECT_EQ(p.TakeRequest().body, "Wikipedia in\r\n\r\nchunks.");
}

// Whatever the split of the bytes across reads, the same request (or the same error) results.
TEST(HttpParserTest, AnySplitOfTheBytesGivesTheSameResult) {
  const std::vector<std::string> inputs = {
      "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n{\"a\": true}",
      "\r\n\r\nPOST /c HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
      "GET / HTTP/1.1\nHost: lf-only\n\n",
      "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
      "GET / HTTP/2.0\r\n\r\n",
  };
  std::mt19937 rng(7);
  for (const std::string& in : inputs) {
    HttpRequestParser whole;
    whole.Feed(in);
    const State want = whole.state();
    const HttpRequest want_req = want == State::kDone ? whole.TakeRequest() : HttpRequest();
    for (int trial = 0; trial < 200; ++trial) {
      HttpRequestParser p;
      size_t at = 0;
      while (at < in.size() && (p.state() == State::kHeaders || p.state() == State::kBody)) {
        const size_t n = std::min<size_t>(in.size() - at, 1 + rng() % 7);
        const size_t used = p.Feed(std::string_view(in).substr(at, n));
        at += used;
        if (used < n) break;
      }
      ASSERT_EQ(p.state(), want) << in;
      if (want == State::kDone) {
        const HttpRequest r = p.TakeRequest();
        EXPECT_EQ(r.path, want_req.path);
        EXPECT_EQ(r.body, want_req.body);
        EXPECT_EQ(r.headers, want_req.headers);
      } else {
        EXPECT_EQ(p.error_status(), whole.error_status());
      }
    }
  }
}

TEST(HttpParserTest, EveryMalformedOrOversizedRequestIsRefusedWithItsStatus) {
  HttpParserLimits small;
  small.max_header_bytes = 256;
  small.max_body_bytes = 100;
  small.max_headers = 4;
  struct Case {
    std::string bytes;
    int status;
  };
  const std::vector<Case> cases = {
      {"GET\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET nopath HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET / HTTP/1.1\r\nNo colon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\n" + std::string(300, 'x') + ": y\r\n\r\n", 431},
      {"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n", 431},
      {"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n", 413},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 400},
  };
  for (const Case& c : cases) {
    HttpRequestParser p = Parsed(c.bytes, small);
    EXPECT_EQ(p.state(), State::kError) << c.bytes;
    EXPECT_EQ(p.error_status(), c.status) << c.bytes << ": " << p.error_message();
  }
  // An announced body is not allocated before it arrives beyond the limit: a header naming a
  // huge length is refused at once.
  HttpRequestParser p =
      Parsed("POST / HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n", HttpParserLimits{});
  EXPECT_EQ(p.error_status(), 413);
}

TEST(HttpParserTest, ExpectContinueIsAskedOnceWhenABodyFollows) {
  HttpRequestParser p =
      Parsed("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_TRUE(p.WantsContinue());
  p.ContinueSent();
  EXPECT_FALSE(p.WantsContinue());
  p.Feed("ok");
  EXPECT_EQ(p.state(), State::kDone);
  EXPECT_FALSE(Parsed("GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").WantsContinue());
}

// Paused after its head (as the listener runs it), the parser keeps no byte of the body until
// the head is accepted, then reads on as if it had never stopped, however the bytes are split.
TEST(HttpParserTest, PausedHeadKeepsNoBodyUntilAccepted) {
  const std::string req =
      "POST /v1/x HTTP/1.1\r\nAuthorization: Bearer k\r\nExpect: 100-continue\r\n"
      "Content-Length: 5\r\n\r\nhello";
  HttpRequestParser p({}, /*pause_after_head=*/true);
  EXPECT_EQ(p.Feed(req), req.size() - 5);
  ASSERT_TRUE(p.HeadPending());
  EXPECT_EQ(p.state(), State::kBody);
  EXPECT_EQ(p.head().path, "/v1/x");
  EXPECT_EQ(p.head().Header("authorization"), "Bearer k");
  EXPECT_FALSE(p.WantsContinue());  // not before the server has decided
  EXPECT_EQ(p.Feed("hello"), 0u);
  EXPECT_TRUE(p.head().body.empty());
  p.AcceptHead();
  EXPECT_TRUE(p.WantsContinue());
  EXPECT_EQ(p.Feed("hello"), 5u);
  ASSERT_EQ(p.state(), State::kDone);
  EXPECT_EQ(p.TakeRequest().body, "hello");
  // Without a body the request is whole once accepted.
  p.Feed("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(p.HeadPending());
  EXPECT_EQ(p.state(), State::kBody);
  p.AcceptHead();
  EXPECT_EQ(p.state(), State::kDone);
  p.TakeRequest();

  std::mt19937 rng(11);
  const std::string two =
      "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
  for (int trial = 0; trial < 100; ++trial) {
    HttpRequestParser q({}, /*pause_after_head=*/true);
    size_t at = 0;
    int heads = 0;
    while (q.state() != State::kDone && q.state() != State::kError) {
      if (q.HeadPending()) {
        ++heads;
        q.AcceptHead();
        continue;
      }
      ASSERT_LT(at, two.size());
      at += q.Feed(
          std::string_view(two).substr(at, std::min<size_t>(two.size() - at, 1 + rng() % 9)));
    }
    ASSERT_EQ(q.state(), State::kDone);
    EXPECT_EQ(heads, 1);
    EXPECT_EQ(q.TakeRequest().body, "abc");
  }
}

// A length announced costs nothing until its bytes come: the body's buffer starts small and
// grows with them, and the parser's count of bytes held follows.
TEST(HttpParserTest, BufferedBytesFollowWhatArrived) {
  HttpRequestParser p;
  p.Feed("POST / HTTP/1.1\r\nContent-Length: 16000000\r\n\r\n");
  ASSERT_EQ(p.state(), State::kBody);
  EXPECT_LT(p.buffered_bytes(), size_t{64} << 10);
  p.Feed(std::string(1 << 20, 'x'));
  EXPECT_GE(p.buffered_bytes(), size_t{1} << 20);
  EXPECT_LE(p.buffered_bytes(), size_t{3} << 20);
}

// ---- JSON body limits ---------------------------------------------------------------------

// An object of `keys` keys "0": 1, "1": 1, ...
std::string ObjectOfKeys(size_t keys) {
  std::string out = "{";
  for (size_t i = 0; i < keys; ++i) absl::StrAppend(&out, i ? ", " : "", "\"", i, "\": 1");
  return out + "}";
}

TEST(JsonLimitsTest, KeysPerObjectAreBoundedAndTheObjectNamed) {
  EXPECT_TRUE(
      CheckJsonLimits(absl::StrCat(R"({"logit_bias": )", ObjectOfKeys(kMaxJsonObjectKeys), "}"))
          .ok());
  absl::Status s = CheckJsonLimits(
      absl::StrCat(R"({"prompt": "a", "logit_bias": )", ObjectOfKeys(kMaxJsonObjectKeys + 1), "}"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "logit_bias: a JSON object with more than 4096 keys");
  s = CheckJsonLimits(ObjectOfKeys(kMaxJsonObjectKeys + 1));
  EXPECT_EQ(s.message(), "the request body: a JSON object with more than 4096 keys");
  s = CheckJsonLimits(absl::StrCat(
      R"({"tools": [{"type": "function"}, {"function": {"parameters": {"properties": )",
      ObjectOfKeys(kMaxJsonObjectKeys + 1), "}}}]}"));
  EXPECT_EQ(s.message(),
            "tools[1].function.parameters.properties: a JSON object with more than 4096 keys");
  // Strings that look like JSON are not JSON; keys of sibling objects are counted apart.
  JsonLimits three;
  three.max_object_keys = 3;
  const std::string siblings = R"({"a": "{\"x\": 1, \"y\": 2, \"z\": 3, \"w\": 4}",
      "b": {"c": 1, "d": 2, "e": 3}, "f": [{"g": 1, "h": 2, "i": 3}]})";
  EXPECT_TRUE(CheckJsonLimits(siblings, three).ok());
}

TEST(JsonLimitsTest, ValuesAreBoundedAndWhereTheLimitWasPassedNamed) {
  JsonLimits five;
  five.max_values = 5;
  // Every object, array, string, number, true, false and null is a value; keys are not.
  EXPECT_TRUE(CheckJsonLimits(R"([1, "two", true, null])", five).ok());
  EXPECT_TRUE(CheckJsonLimits(R"({"a": 1, "b": 2, "c": [false]})", five).ok());
  absl::Status s = CheckJsonLimits(R"({"prompt": [1, 2, 3, 4, 5]})", five);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "prompt[3]: more than 5 JSON values in the request body");
  // The default: a million values.
  std::string prompt = R"({"prompt": [)";
  for (size_t i = 0; i + 2 < kMaxJsonValues; ++i) prompt += i ? ",0" : "0";
  EXPECT_TRUE(CheckJsonLimits(prompt + "]}").ok());
  s = CheckJsonLimits(prompt + ",0,0]}");
  EXPECT_EQ(s.message(), "prompt[1048574]: more than 1048576 JSON values in the request body");
}

TEST(JsonLimitsTest, DepthAndNumbersAreStillChecked) {
  EXPECT_EQ(CheckJsonLimits(R"({"a": [[[1]]]})", JsonLimits{.max_depth = 3}).message(),
            "a[0][0]: JSON nested deeper than 3 levels");
  EXPECT_EQ(CheckJsonLimits(R"({"t": 1e400})").message(), "t: the number 1e400 is out of range");
  EXPECT_EQ(CheckJsonLimits(absl::StrCat(R"({"t": )", std::string(320, '9'), "}")).message(),
            absl::StrCat("t: the number ", std::string(32, '9'), " is out of range"));
  EXPECT_TRUE(CheckJsonLimits(R"({"t": 1e300, "u": -0.5e-400, "v": 12345678901234567890})").ok());
}

// ---- the listener -------------------------------------------------------------------------

// A client socket from `source` (a loopback address: 127.0.0.2 is another client) to `port`.
int Connect(int port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes or `timeout_ms` passes.
std::string ReadAll(int fd, int timeout_ms = 5000) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

// Whether the server closes `fd` (end of stream, or a reset) within `timeout_ms`, ignoring any
// bytes it sends first.
bool ClosedByServer(int fd, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    if (::recv(fd, buf, sizeof(buf), 0) <= 0) return true;
  }
  return false;
}

// One request on a new connection from `source`; the response as read until the server closes.
std::string Exchange(int port, const std::string& request, const char* source = "127.0.0.1") {
  const int fd = Connect(port, source);
  if (fd < 0) return "connect failed";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string got = ReadAll(fd);
  ::close(fd);
  return got;
}

class HttpListenerTest : public ::testing::Test {
 protected:
  void Start(HttpListenerOptions o = {}) {
    auto l = HttpListener::Start(
        o,
        [this](const HttpRequest& r, HttpResponseWriter& w) {
          ++handled_;
          {
            std::lock_guard<std::mutex> lock(order_mu_);
            order_.push_back(r.path);
          }
          if (r.path == "/hold") {  // holds its connection and a worker until released
            while (hold_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          if (r.path == "/flood") {  // streams until its client fails it
            w.StartStream(200, "text/event-stream");
            const std::string piece(16 << 10, 'x');
            for (int i = 0; i < 4096 && w.Write(piece); ++i) {
            }
            flood_failed_ = w.ClientGone();
            w.End();
            return;
          }
          if (r.path == "/held") {
            // Answered after the handler returned, from another thread, without waiting.
            std::shared_ptr<HttpResponseWriter> held = w.Hold();
            std::thread([held] {
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
              held->StartStream(200, "text/event-stream");
              held->WriteThen("data: held\n\n", [held](bool room) {
                if (room) held->End();
                held->Release();
              });
            }).detach();
            return;
          }
          if (r.path == "/until-gone") {
            // Held until its client leaves, which arrives as an event.
            std::shared_ptr<HttpResponseWriter> held = w.Hold();
            held->StartStream(200, "text/event-stream");
            w.OnClientGone([this, held] {
              ++gone_events_;
              held->Release();
            });
            return;
          }
          if (r.path == "/big") {  // a whole response far past the per-connection bound
            w.Send(200, "text/plain", std::string(8 << 20, 'b'));
            return;
          }
          if (r.path == "/stream") {
            w.StartStream(200, "text/event-stream");
            for (int i = 0; i < 3; ++i) w.Write(absl::StrCat("data: ", i, "\n\n"));
            w.End();
            return;
          }
          w.Send(200, "text/plain", absl::StrCat(r.method, " ", r.path, " ", r.body));
        },
        [](int status, const std::string& message) {
          return absl::StrFormat("{\"status\":%d,\"message\":\"%s\"}", status, message);
        });
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = *std::move(l);
    port_ = std::stoi(listener_->address().substr(listener_->address().rfind(':') + 1));
  }
  void TearDown() override {
    hold_ = false;
    // The leak check: every connection is closed once its client is gone.
    for (int i = 0; i < 200 && listener_ && listener_->connections() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (listener_) {
      EXPECT_EQ(listener_->connections(), 0);
    }
  }

  std::unique_ptr<HttpListener> listener_;
  int port_ = 0;
  std::atomic<int> handled_{0};
  std::atomic<bool> hold_{true};
  std::atomic<bool> flood_failed_{false};
  std::atomic<int> gone_events_{0};
  std::mutex order_mu_;
  std::vector<std::string> order_;  // paths, in the order handlers took them
};

TEST_F(HttpListenerTest, KeepAliveChunkedStreamAndErrors) {
  Start();
  const int fd = Connect(port_);
  ASSERT_GE(fd, 0);
  const std::string two =
      "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /stream HTTP/1.1\r\n"
      "Connection: close\r\n\r\n";
  ::send(fd, two.data(), two.size(), MSG_NOSIGNAL);
  const std::string got = ReadAll(fd);
  ::close(fd);
  EXPECT_NE(got.find("HTTP/1.1 200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: keep-alive"), std::string::npos) << got;
  EXPECT_NE(got.find("POST /a abc"), std::string::npos) << got;
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos) << got;
  EXPECT_NE(got.find("9\r\ndata: 2\n\n\r\n0\r\n\r\n"), std::string::npos) << got;
  EXPECT_EQ(handled_.load(), 2);

  const std::string bad = Exchange(port_, "GET / HTTP/3\r\n\r\n");
  EXPECT_EQ(bad.rfind("HTTP/1.1 505", 0), 0u) << bad;
  EXPECT_NE(bad.find("\"status\":505"), std::string::npos) << bad;
  const std::string big = Exchange(port_, "POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 413", 0), 0u) << big;
}

TEST_F(HttpListenerTest, ExpectContinueIsAnswered) {
  Start();
  const int fd = Connect(port_);
  const std::string head =
      "POST /up HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\nConnection: close\r\n\r\n";
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  char buf[64] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  EXPECT_EQ(std::string(buf, n), "HTTP/1.1 100 Continue\r\n\r\n");
  ::send(fd, "data", 4, MSG_NOSIGNAL);
  EXPECT_NE(ReadAll(fd).find("POST /up data"), std::string::npos);
  ::close(fd);
}

// Slow clients (a header byte every 200 ms) and idle ones take no serving thread: with one
// handler thread and 150 of them connected, a real request is answered at once, and the slow
// ones are closed at the header deadline.
TEST_F(HttpListenerTest, SlowAndIdleClientsDoNotStarveOthers) {
  HttpListenerOptions o;
  o.threads = 1;
  o.header_timeout = absl::Seconds(2);
  Start(o);
  std::vector<int> slow;
  for (int i = 0; i < 150; ++i) {
    const int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    const std::string request = "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n";
    for (size_t i = 0; !stop.load() && i < request.size(); ++i) {
      for (int fd : slow) ::send(fd, &request[i], 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = Exchange(port_, "GET /fast HTTP/1.1\r\nConnection: close\r\n\r\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(got.find("GET /fast"), std::string::npos) << got;
  EXPECT_LT(seconds, 1.0);
  // Past the header deadline every slow connection is closed by the server.
  int closed = 0;
  for (int fd : slow) closed += ClosedByServer(fd, 4000);
  stop = true;
  drip.join();
  for (int fd : slow) ::close(fd);
  EXPECT_EQ(closed, 150);
  EXPECT_EQ(handled_.load(), 1);
}

// A client that never reads its stream holds no serving thread: its outbox fills, it takes
// nothing for a second (the grace) and its stream fails, which frees the one handler thread for
// another client long before the 60 s write timeout. A whole response far larger than the
// outbox bound is taken at once and written after its handler has gone.
TEST_F(HttpListenerTest, ClientsThatDoNotReadHoldNoServingThread) {
  HttpListenerOptions o;
  o.threads = 1;
  o.write_timeout = absl::Seconds(60);
  o.response_buffer_bytes = 64 << 10;
  o.min_write_rate = 1 << 20;
  Start(o);
  const int sleeper = Connect(port_);
  ASSERT_GE(sleeper, 0);
  int small = 4096;
  ::setsockopt(sleeper, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const std::string flood = "GET /flood HTTP/1.1\r\n\r\n";
  ::send(sleeper, flood.data(), flood.size(), MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = Exchange(port_, "GET /after HTTP/1.1\r\nConnection: close\r\n\r\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(got.find("GET /after"), std::string::npos) << got;
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(flood_failed_.load());
  // The server closed the sleeper's connection (its client has not).
  for (int i = 0; i < 250 && listener_->connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(listener_->connections(), 0);
  ::close(sleeper);

  // The whole response: the handler is done before its client reads a byte.
  const int reader = Connect(port_);
  const std::string big = "GET /big HTTP/1.1\r\nConnection: close\r\n\r\n";
  ::send(reader, big.data(), big.size(), MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_NE(Exchange(port_, "GET /other HTTP/1.1\r\nConnection: close\r\n\r\n").find("GET /other"),
            std::string::npos);
  EXPECT_GT(listener_->response_bytes(), 0u);
  const std::string body = ReadAll(reader, 10000);
  ::close(reader);
  EXPECT_NE(body.find("Content-Length: 8388608"), std::string::npos);
  EXPECT_EQ(body.size() - body.find("\r\n\r\n") - 4, size_t{8} << 20);
  EXPECT_EQ(listener_->response_bytes(), 0u);
}

// A held response needs no serving thread: with one thread, a request held until its client
// leaves and one answered later from elsewhere do not delay a third; the leaving client's close
// reaches its holder as an event, and its connection is closed.
TEST_F(HttpListenerTest, HeldResponsesNeedNoThreadAndHearTheirClientLeave) {
  HttpListenerOptions o;
  o.threads = 1;
  Start(o);
  const int waiter = Connect(port_);
  ASSERT_GE(waiter, 0);
  const std::string until_gone = "GET /until-gone HTTP/1.1\r\n\r\n";
  ::send(waiter, until_gone.data(), until_gone.size(), MSG_NOSIGNAL);
  const int later = Connect(port_);
  ASSERT_GE(later, 0);
  const std::string held = "GET /held HTTP/1.1\r\nConnection: close\r\n\r\n";
  ::send(later, held.data(), held.size(), MSG_NOSIGNAL);
  EXPECT_NE(Exchange(port_, "GET /now HTTP/1.1\r\nConnection: close\r\n\r\n").find("GET /now"),
            std::string::npos);
  const std::string got = ReadAll(later);
  ::close(later);
  EXPECT_NE(got.find("data: held"), std::string::npos) << got;
  EXPECT_NE(got.find("0\r\n\r\n"), std::string::npos) << "the stream's end";
  EXPECT_EQ(gone_events_.load(), 0);
  ::close(waiter);
  for (int i = 0; i < 250 && gone_events_.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(gone_events_.load(), 1);
}

// Requests waiting for the one serving thread take turns by client address: the quiet client's
// request waits behind one of the flooding client's, not all of them; when the line is full,
// the flood's newest request makes room (429), and the flood's next one is refused, never the
// quiet client's.
TEST_F(HttpListenerTest, TenantsTakeTurnsAndAFullLineRefusesTheLargest) {
  HttpListenerOptions o;
  o.threads = 1;
  o.max_queued_requests = 4;
  Start(o);
  auto send = [&](const char* source, const std::string& path) {
    const int fd = Connect(port_, source);
    const std::string req = "GET " + path + " HTTP/1.1\r\nConnection: close\r\n\r\n";
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // in line before the next
    return fd;
  };
  std::vector<int> flood;
  flood.push_back(send("127.0.0.1", "/hold"));
  for (int i = 1; i <= 4; ++i) flood.push_back(send("127.0.0.1", "/a" + std::to_string(i)));
  const int quiet = send("127.0.0.2", "/quiet");  // the line is full: /a4 makes room
  flood.push_back(send("127.0.0.1", "/a5"));      // the flood holds the most: refused
  const std::string bumped = ReadAll(flood[4], 2000);
  EXPECT_EQ(bumped.rfind("HTTP/1.1 429", 0), 0u) << bumped;
  EXPECT_NE(bumped.find("Retry-After: 1"), std::string::npos) << bumped;
  EXPECT_NE(bumped.find("holds the most"), std::string::npos) << bumped;
  EXPECT_EQ(ReadAll(flood[5], 2000).rfind("HTTP/1.1 429", 0), 0u);
  hold_ = false;
  EXPECT_NE(ReadAll(quiet).find("GET /quiet"), std::string::npos);
  for (int i = 0; i < 4; ++i) EXPECT_NE(ReadAll(flood[i]).find("200 OK"), std::string::npos);
  for (int fd : flood) ::close(fd);
  ::close(quiet);
  std::lock_guard<std::mutex> lock(order_mu_);
  EXPECT_EQ(order_, (std::vector<std::string>{"/hold", "/a1", "/quiet", "/a2", "/a3"}));
}

// Past the per-client cap, the longest-waiting idle connection of that client makes room, so
// a flood from one address neither grows without bound nor locks out a request, from that
// address or another.
TEST_F(HttpListenerTest, ConnectionFloodIsCappedAndRequestsStillGetIn) {
  HttpListenerOptions o;
  o.max_connections_per_client = 20;
  o.max_connections = 30;
  Start(o);
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(Connect(port_));
  for (int i = 0; i < 100 && listener_->connections() > 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LE(listener_->connections(), 20);
  EXPECT_NE(Exchange(port_, "GET /same HTTP/1.1\r\nConnection: close\r\n\r\n").find("GET /same"),
            std::string::npos);
  EXPECT_NE(Exchange(port_, "GET /other HTTP/1.1\r\nConnection: close\r\n\r\n", "127.0.0.2")
                .find("GET /other"),
            std::string::npos);
  // Another address's flood fills the total cap; the oldest idle connections make room.
  std::vector<int> more;
  for (int i = 0; i < 40; ++i) more.push_back(Connect(port_, "127.0.0.3"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(listener_->connections(), 30);
  EXPECT_NE(Exchange(port_, "GET /again HTTP/1.1\r\nConnection: close\r\n\r\n", "127.0.0.4")
                .find("GET /again"),
            std::string::npos);
  for (int fd : idle) ::close(fd);
  for (int fd : more) ::close(fd);
}

// When every connection at a cap holds a request (none can make room), a new connection is still
// read up to its request head and answered, 429 past the per-address cap and 503 past the total,
// each with Retry-After: a client is never closed without a reply. The refused requests never
// reach a handler, and the held ones finish normally.
TEST_F(HttpListenerTest, ConnectionsPastTheCapsAreAnsweredWithRetryAfter) {
  HttpListenerOptions o;
  o.max_connections_per_client = 4;
  o.max_connections = 6;
  Start(o);
  const std::string hold = "GET /hold HTTP/1.1\r\nConnection: close\r\n\r\n";
  std::vector<int> held;
  auto hold_from = [&](const char* address, int want_handled) {
    const int fd = Connect(port_, address);
    ASSERT_GE(fd, 0);
    ::send(fd, hold.data(), hold.size(), MSG_NOSIGNAL);
    held.push_back(fd);
    for (int i = 0; i < 500 && handled_.load() < want_handled; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(handled_.load(), want_handled);
  };
  for (int i = 1; i <= 4; ++i) hold_from("127.0.0.1", i);
  const std::string per_client =
      Exchange(port_, "GET /more HTTP/1.1\r\nConnection: close\r\n\r\n", "127.0.0.1");
  EXPECT_EQ(per_client.rfind("HTTP/1.1 429 ", 0), 0u) << per_client;
  EXPECT_NE(per_client.find("Retry-After: 1\r\n"), std::string::npos) << per_client;
  EXPECT_NE(per_client.find("--http-max-connections-per-client"), std::string::npos);

  for (int i = 5; i <= 6; ++i) hold_from("127.0.0.2", i);
  const std::string total =
      Exchange(port_, "GET /more HTTP/1.1\r\nConnection: close\r\n\r\n", "127.0.0.3");
  EXPECT_EQ(total.rfind("HTTP/1.1 503 ", 0), 0u) << total;
  EXPECT_NE(total.find("Retry-After: 1\r\n"), std::string::npos) << total;
  EXPECT_NE(total.find("--http-max-connections)"), std::string::npos) << total;
  EXPECT_EQ(handled_.load(), 6);

  hold_ = false;
  for (int fd : held) {
    const std::string got = ReadAll(fd);
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  }
  // Room again: a request from the address that was refused gets in.
  EXPECT_NE(Exchange(port_, "GET /after HTTP/1.1\r\nConnection: close\r\n\r\n", "127.0.0.1")
                .find("GET /after"),
            std::string::npos);
}

// Polls until `pred` holds (true) or `timeout_ms` passes (false).
bool WaitUntil(const std::function<bool()>& pred, int timeout_ms = 5000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A head the server refuses (check_head: the router's API key) is answered before any byte of
// the body is kept, and the connection closed without reading the rest: clients announcing 8 MB
// without a key hold nothing while they send.
TEST_F(HttpListenerTest, RefusedHeadsAreAnsweredBeforeTheBodyIsRead) {
  HttpListenerOptions o;
  o.check_head = [](const HttpRequest& head) -> std::optional<HttpRefusal> {
    if (head.Header("authorization") == "Bearer good") return std::nullopt;
    return HttpRefusal{401, R"({"error": "no key"})", {{"WWW-Authenticate", "Bearer"}}};
  };
  Start(o);
  const std::string part(1 << 20, 'x');
  size_t peak = 0;
  for (int i = 0; i < 10; ++i) {
    const int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    const std::string head = "POST /up HTTP/1.1\r\nContent-Length: 8000000\r\n\r\n";
    ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    ::send(fd, part.data(), part.size(), MSG_NOSIGNAL);  // fails once the server has closed
    peak = std::max(peak, listener_->buffered_bytes());
    const std::string got = ReadAll(fd);
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 401 Unauthorized\r\n", 0), 0u) << got.substr(0, 200);
    EXPECT_NE(got.find("WWW-Authenticate: Bearer\r\n"), std::string::npos) << got;
    EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
  }
  EXPECT_LT(peak, size_t{64} << 10);
  EXPECT_EQ(handled_.load(), 0);
  // With the key the same request is read and handled.
  const std::string ok =
      Exchange(port_,
               "POST /up HTTP/1.1\r\nAuthorization: Bearer good\r\nContent-Length: 2\r\n"
               "Connection: close\r\n\r\nhi");
  EXPECT_NE(ok.find("POST /up hi"), std::string::npos) << ok;
  EXPECT_EQ(handled_.load(), 1);
}

// Bytes of requests held over every connection stay within max_buffered_bytes. A connection
// growing past it makes room by refusing the reading connection that holds the most (503 with
// Retry-After), or is refused itself when it holds the most; small requests keep being served,
// and once the clients are gone nothing is held.
TEST_F(HttpListenerTest, BufferedBytesStayWithinTheBudgetLargestFirst) {
  HttpListenerOptions o;
  o.limits.max_body_bytes = 1 << 20;
  o.max_buffered_bytes = 2 << 20;
  Start(o);
  const std::string head = "POST /big HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n";
  auto send_part = [&](size_t bytes) {
    const int fd = Connect(port_);
    const std::string part(bytes, 'x');
    ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    ::send(fd, part.data(), part.size(), MSG_NOSIGNAL);
    return fd;
  };
  // A holds a 1 MiB buffer, B half of one.
  const int a = send_part(1000000);
  ASSERT_TRUE(WaitUntil([&] { return listener_->buffered_bytes() >= 1000000; }));
  const int b = send_part(500000);
  ASSERT_TRUE(WaitUntil([&] { return listener_->buffered_bytes() >= 1500000; }));
  size_t peak = listener_->buffered_bytes();
  // C's buffer grows to half a MiB too: past 2 MiB, so A, holding the most, is refused.
  const int c = send_part(400000);
  const std::string got_a = ReadAll(a, 5000);
  EXPECT_EQ(got_a.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << got_a.substr(0, 300);
  EXPECT_NE(got_a.find("Retry-After: 1\r\n"), std::string::npos) << got_a;
  EXPECT_NE(got_a.find("2097152 bytes of requests"), std::string::npos) << got_a;
  ASSERT_TRUE(WaitUntil([&] { return listener_->buffered_bytes() >= 900000; }));
  peak = std::max(peak, listener_->buffered_bytes());
  // D grows to a whole MiB: it would hold the most, so it is refused itself.
  const int d = send_part(1000000);
  const std::string got_d = ReadAll(d, 5000);
  EXPECT_EQ(got_d.rfind("HTTP/1.1 503", 0), 0u) << got_d.substr(0, 300);
  peak = std::max(peak, listener_->buffered_bytes());
  EXPECT_LE(peak, o.max_buffered_bytes);
  // B and C still wait for the rest of their bodies; a small request is served meanwhile.
  for (int fd : {b, c}) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "a connection under the budget was answered";
  }
  EXPECT_NE(
      Exchange(port_, "POST /small HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
               "127.0.0.2")
          .find("POST /small hi"),
      std::string::npos);
  for (int fd : {a, b, c, d}) ::close(fd);
  EXPECT_TRUE(WaitUntil([&] { return listener_->buffered_bytes() == 0; }))
      << listener_->buffered_bytes();
  EXPECT_EQ(handled_.load(), 1);
}

// The budget must hold the largest request.
TEST(HttpListenerOptionsTest, BudgetSmallerThanTheLargestRequestIsRefused) {
  HttpListenerOptions o;
  o.max_buffered_bytes = o.limits.max_body_bytes;
  auto l = HttpListener::Start(
      o, [](const HttpRequest&, HttpResponseWriter&) {},
      [](int, const std::string&) { return std::string(); });
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("max buffered bytes"), std::string::npos) << l.status();
}

}  // namespace
}  // namespace tandem
