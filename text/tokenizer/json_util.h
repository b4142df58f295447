// Reading tokenizer.json fields with errors that name the offending field instead of the
// exceptions nlohmann::json would throw.
#ifndef TANDEM_TEXT_TOKENIZER_JSON_UTIL_H_
#define TANDEM_TEXT_TOKENIZER_JSON_UTIL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
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

// The steps of a "Sequence" component: `j[key]` must be an array, and each element is built by
// `make(element, where)` with `where` naming it ("decoder.decoders[2]"). Shared by the
// normalizer, pre-tokenizer, decoder and post-processor parsers.
template <typename T, typename Make>
absl::StatusOr<std::vector<std::unique_ptr<T>>> GetSequence(const Json& j, std::string_view key,
                                                            std::string_view where,
                                                            const Make& make) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer.json: %s.%s must be an array", where, key));
  }
  std::vector<std::unique_ptr<T>> steps;
  for (size_t i = 0; i < it->size(); ++i) {
    absl::StatusOr<std::unique_ptr<T>> step =
        make((*it)[i], absl::StrFormat("%s.%s[%d]", where, key, i));
    if (!step.ok()) return step.status();
    steps.push_back(*std::move(step));
  }
  return steps;
}

}  // namespace tandem::json_util

#endif  // TANDEM_TEXT_TOKENIZER_JSON_UTIL_H_
