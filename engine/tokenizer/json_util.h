// Reading tokenizer.json fields with errors that name the offending field instead of the
// exceptions nlohmann::json would throw.
#ifndef TANDEM_ENGINE_TOKENIZER_JSON_UTIL_H_
#define TANDEM_ENGINE_TOKENIZER_JSON_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::json_util {

using Json = nlohmann::json;

// `where` names the object in messages, e.g. "pre_tokenizer.pretokenizers[1]".
absl::Status CheckObject(const Json& j, std::string_view where);
// The "type" field of a component.
absl::StatusOr<std::string> GetType(const Json& j, std::string_view where);
absl::StatusOr<std::string> GetString(const Json& j, std::string_view key, std::string_view where);
// Missing or null gives nullopt.
absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& j, std::string_view key,
                                                             std::string_view where);
// Missing or null gives `default_value`.
absl::StatusOr<bool> GetBool(const Json& j, std::string_view key, std::string_view where,
                             bool default_value);
absl::StatusOr<int64_t> GetInt(const Json& j, std::string_view key, std::string_view where,
                               int64_t default_value);
// A field holding exactly one Unicode character (Metaspace "replacement", Strip "content").
absl::StatusOr<std::string> GetChar(const Json& j, std::string_view key, std::string_view where);

}  // namespace tandem::json_util

#endif  // TANDEM_ENGINE_TOKENIZER_JSON_UTIL_H_
