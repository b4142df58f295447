// Fuzzes what an HTTP client controls before any handler runs: the HTTP/1.1 request parser
// (http/http_parser.h), fed the input whole and in pieces of sizes the input itself picks, also
// paused after the head as the listener runs it (the same request, or the same refusal, must come
// out), and the JSON body checks (http/json_limits.h) on the body of every request that parses.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "http/http_parser.h"
#include "http/json_limits.h"

namespace {

struct Outcome {
  tandem::HttpRequestParser::State state;
  int status = 0;
  std::string body;
  size_t used = 0;
};

Outcome Run(std::string_view bytes, size_t piece, bool pause_after_head = false) {
  tandem::HttpParserLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 1 << 16;
  tandem::HttpRequestParser p(limits, pause_after_head);
  Outcome o;
  while (o.used < bytes.size() && (p.state() == tandem::HttpRequestParser::State::kHeaders ||
                                   p.state() == tandem::HttpRequestParser::State::kBody)) {
    if (p.HeadPending()) p.AcceptHead();
    const size_t n = std::min(piece, bytes.size() - o.used);
    size_t used = p.Feed(bytes.substr(o.used, n));
    if (p.HeadPending()) {  // stopped at the end of the head, inside this piece
      p.AcceptHead();
      used += p.Feed(bytes.substr(o.used + used, n - used));
    }
    o.used += used;
    if (used < n) break;
  }
  if (p.HeadPending()) p.AcceptHead();
  o.state = p.state();
  o.status = p.error_status();
  if (o.state == tandem::HttpRequestParser::State::kDone) o.body = p.TakeRequest().body;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const Outcome whole = Run(bytes, bytes.size() + 1);
  const size_t piece = size == 0 ? 1 : 1 + data[0] % 13;
  const Outcome pieces = Run(bytes, piece);
  const Outcome paused = Run(bytes, piece, /*pause_after_head=*/true);
  for (const Outcome& o : {pieces, paused}) {
    if (whole.state != o.state || whole.status != o.status || whole.body != o.body) {
      std::abort();  // the parser's answer depends on how the bytes were split, or on the pause
    }
  }
  (void)tandem::CheckJsonLimits(whole.body,
                                {.max_depth = 8, .max_object_keys = 8, .max_values = 64});
  (void)tandem::CheckJsonLimits(bytes);
  return 0;
}
