#include "text/tokenizer/json_util.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/unicode/unicode.h"

namespace tandem::json_util {
namespace {

absl::Status BadField(std::string_view where, std::string_view key, std::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrFormat("tokenizer.json: %s.%s must be %s", where, key, expected));
}

const Json* Find(const Json& j, std::string_view key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

absl::Status CheckObject(const Json& j, std::string_view where) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer.json: %s must be an object", where));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GetType(const Json& j, std::string_view where) {
  if (auto st = CheckObject(j, where); !st.ok()) return st;
  const Json* v = Find(j, "type");
  if (v == nullptr || !v->is_string()) return BadField(where, "type", "a string");
  return v->get<std::string>();
}

absl::StatusOr<std::string> GetString(const Json& j, std::string_view key, std::string_view where) {
  const Json* v = Find(j, key);
  if (v == nullptr || !v->is_string()) return BadField(where, key, "a string");
  return v->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& j, std::string_view key,
                                                             std::string_view where) {
  const Json* v = Find(j, key);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) return BadField(where, key, "a string or null");
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<bool> GetBool(const Json& j, std::string_view key, std::string_view where,
                             bool default_value) {
  const Json* v = Find(j, key);
  if (v == nullptr || v->is_null()) return default_value;
  if (!v->is_boolean()) return BadField(where, key, "a boolean");
  return v->get<bool>();
}

absl::StatusOr<int64_t> GetInt(const Json& j, std::string_view key, std::string_view where,
                               int64_t default_value) {
  const Json* v = Find(j, key);
  if (v == nullptr || v->is_null()) return default_value;
  if (!v->is_number_integer()) return BadField(where, key, "an integer");
  return v->get<int64_t>();
}

absl::StatusOr<std::string> GetChar(const Json& j, std::string_view key, std::string_view where) {
  auto s = GetString(j, key, where);
  if (!s.ok()) return s.status();
  size_t i = 0;
  if (s->empty() || (unicode::DecodeUtf8(*s, &i), i != s->size())) {
    return BadField(where, key, "a single character");
  }
  return s;
}

}  // namespace tandem::json_util
