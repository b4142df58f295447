// JSON text into nlohmann::ordered_json in time linear in the text. ordered_json's own parser
// inserts every key with a linear search of the keys before it, so one object of n keys costs
// n^2/2 string comparisons (100k keys: 20 s); this parser finds repeated keys through a hash
// table instead. Objects keep the text's key order; a repeated key keeps nlohmann's rule (the
// last value wins, at the place of the first). Parsing is iterative: nesting costs heap, not
// stack (callers bound it, and the number of values, before parsing: http/json_limits.h).
#ifndef TANDEM_STRUCTURED_JSON_PARSE_H_
#define TANDEM_STRUCTURED_JSON_PARSE_H_

#include <functional>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::structured {

// Malformed JSON is INVALID_ARGUMENT with nlohmann's description of the error (byte offset and
// what was expected). `cancelled`, when given, is polled every 4096 values; once it returns true
// the parse stops with CANCELLED (a client that went away).
absl::StatusOr<nlohmann::ordered_json> ParseJson(std::string_view text,
                                                 const std::function<bool()>& cancelled = {});

}  // namespace tandem::structured

#endif  // TANDEM_STRUCTURED_JSON_PARSE_H_
