// The checks a JSON request body passes before any parser sees it. nlohmann::json recurses per
// nesting level (100k levels overflow the stack) and throws on numbers a double cannot hold, so
// both are refused here first, with an error a client can act on.
#ifndef TANDEM_HTTP_JSON_LIMITS_H_
#define TANDEM_HTTP_JSON_LIMITS_H_

#include <string_view>

#include "absl/status/status.h"

namespace tandem {

// Bodies may nest JSON this deep at most (objects and arrays).
inline constexpr int kMaxJsonDepth = 64;

// Nesting deeper than `max_depth` and numbers a double cannot hold (1e400) are INVALID_ARGUMENT
// naming where they are ("temperature: the number 1e400 is out of range",
// "messages[0].content: JSON nested deeper than 64 levels"). Malformed JSON is left to the
// parser. One pass, no allocation beyond the path of open containers.
absl::Status CheckJsonLimits(std::string_view body, int max_depth = kMaxJsonDepth);

}  // namespace tandem

#endif  // TANDEM_HTTP_JSON_LIMITS_H_
