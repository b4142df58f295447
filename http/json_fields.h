// Reading the fields of a parsed JSON request body (OpenAI's APIs): each getter checks the type
// and names the field in its error ("temperature: must be a number, got a string"), the shape
// every 400 of the HTTP API has (http/openai.h ToApiError makes `param` of the name).
#ifndef TANDEM_HTTP_JSON_FIELDS_H_
#define TANDEM_HTTP_JSON_FIELDS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {

// INVALID_ARGUMENT "PARAM: WHY".
absl::Status Invalid(absl::string_view param, absl::string_view why);

// "null", "a boolean", "a string", "an array", "an object", "a number", "an integer".
const char* TypeName(const nlohmann::ordered_json& v);

// The field `key` of the object `body`; nullptr when absent or null (OpenAI treats null as
// unset).
const nlohmann::ordered_json* Field(const nlohmann::ordered_json& body, const char* key);

absl::StatusOr<bool> GetBool(const nlohmann::ordered_json& v, absl::string_view param);
absl::StatusOr<double> GetNumber(const nlohmann::ordered_json& v, absl::string_view param);
// An integer in [lo, hi].
absl::StatusOr<int64_t> GetInt(const nlohmann::ordered_json& v, absl::string_view param, int64_t lo,
                               int64_t hi);

}  // namespace tandem::openai

#endif  // TANDEM_HTTP_JSON_FIELDS_H_
