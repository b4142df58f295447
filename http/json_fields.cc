#include "http/json_fields.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::openai {

using Json = nlohmann::ordered_json;

absl::Status Invalid(absl::string_view param, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", why));
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

const Json* Field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const Json& v, absl::string_view param) {
  if (!v.is_boolean()) return Invalid(param, absl::StrCat("must be a boolean, got ", TypeName(v)));
  return v.get<bool>();
}

absl::StatusOr<double> GetNumber(const Json& v, absl::string_view param) {
  if (!v.is_number()) return Invalid(param, absl::StrCat("must be a number, got ", TypeName(v)));
  return v.get<double>();
}

absl::StatusOr<int64_t> GetInt(const Json& v, absl::string_view param, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) {
    return Invalid(param, absl::StrCat("must be an integer, got ", TypeName(v)));
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(param, absl::StrFormat("must be at most %d", hi));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    return Invalid(param, absl::StrFormat("must be in [%d, %d], got %d", lo, hi, x));
  return x;
}

}  // namespace tandem::openai
