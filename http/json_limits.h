// The checks a JSON request body passes before any parser sees it. What reads a parsed document
// (dump, the chat template's values, the schema compiler) recurses per nesting level (100k levels
// overflow the stack), and numbers a double cannot hold throw, so both are refused here first,
// with an error a client can act on. The keys of one object and the values of the whole body are
// bounded too: what comes after the parser (the key lookups of the request's fields, the chat
// template's dicts) is not all linear in them, and millions of values cost memory and time out
// of proportion with their bytes.
#ifndef TANDEM_HTTP_JSON_LIMITS_H_
#define TANDEM_HTTP_JSON_LIMITS_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace tandem {

// Bodies may nest JSON this deep at most (objects and arrays).
inline constexpr int kMaxJsonDepth = 64;
// Keys in one JSON object (a `logit_bias`, a tool's `properties`, the body's own fields). Far
// above what any client sends: OpenAI allows 300 `logit_bias` entries, the engine 1024
// (kMaxLogitBias, which names itself when exceeded).
inline constexpr size_t kMaxJsonObjectKeys = 4096;
// Values in one body: every object, array, string, number, true, false and null, keys not
// counted. A prompt of 64 x 16k token ids fits.
inline constexpr size_t kMaxJsonValues = size_t{1} << 20;

struct JsonLimits {
  int max_depth = kMaxJsonDepth;
  size_t max_object_keys = kMaxJsonObjectKeys;
  size_t max_values = kMaxJsonValues;
};

// Nesting deeper than `max_depth`, an object with more than `max_object_keys` keys, more than
// `max_values` values, and numbers a double cannot hold (1e400) are INVALID_ARGUMENT naming
// where they are ("temperature: the number 1e400 is out of range", "messages[0].content: JSON
// nested deeper than 64 levels", "logit_bias: a JSON object with more than 4096 keys"). Malformed
// JSON is left to the parser. One pass, no allocation beyond the path of open containers.
absl::Status CheckJsonLimits(std::string_view body, const JsonLimits& limits = {});

}  // namespace tandem

#endif  // TANDEM_HTTP_JSON_LIMITS_H_
