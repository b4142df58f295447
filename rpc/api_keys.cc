#include "rpc/api_keys.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace {

// Compares every byte of the longer input: the time does not reveal where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::Parse(absl::string_view text) {
  ApiKeys keys;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const absl::string_view key = fields[0];
    for (char c : key) {
      if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(
            absl::StrFormat("api keys line %d: a key must be printable, without spaces", line_no));
      }
    }
    if (key.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrFormat("api keys line %d: a key must have at least 16 characters", line_no));
    }
    KeyLimits limits;
    for (size_t i = 1; i < fields.size(); ++i) {
      const std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
      int64_t value = 0;
      const bool number = absl::SimpleAtoi(kv.second, &value) && value > 0;
      if (!number || (kv.first != "tokens_per_minute" && value > INT32_MAX)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "api keys line %d: %s: the value must be a positive number", line_no, kv.first));
      }
      if (kv.first == "max_concurrent") {
        limits.max_concurrent = static_cast<int>(value);
      } else if (kv.first == "max_n") {
        limits.max_n = static_cast<int>(value);
      } else if (kv.first == "tokens_per_minute") {
        limits.tokens_per_minute = value;
      } else {
        return absl::InvalidArgumentError(absl::StrFormat(
            "api keys line %d: unknown limit \"%s\" (max_concurrent, max_n, tokens_per_minute)",
            line_no, kv.first));
      }
    }
    keys.keys_.emplace_back(key);
    keys.limits_.push_back(limits);
  }
  if (keys.keys_.empty()) return absl::InvalidArgumentError("api keys: the file holds no key");
  return keys;
}

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("api keys: cannot read %s", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto keys = Parse(ss.str());
  if (!keys.ok()) {
    return absl::Status(keys.status().code(),
                        absl::StrFormat("%s (%s)", keys.status().message(), path));
  }
  return keys;
}

absl::string_view ApiKeys::BearerToken(absl::string_view authorization) {
  authorization = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(authorization, kScheme)) {
    return {};
  }
  return absl::StripLeadingAsciiWhitespace(authorization.substr(kScheme.size()));
}

int ApiKeys::Find(absl::string_view authorization) const {
  const absl::string_view presented = BearerToken(authorization);
  if (presented.empty()) return -1;
  int found = -1;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (ConstantTimeEquals(presented, keys_[i])) found = static_cast<int>(i);
  }
  return found;
}

bool ApiKeys::Allows(absl::string_view authorization) const {
  return keys_.empty() || Find(authorization) >= 0;
}

KeyLimits ApiKeys::LimitsOf(absl::string_view authorization) const {
  if (keys_.empty()) return {};
  const int i = Find(authorization);
  return i < 0 ? KeyLimits() : limits_[i];
}

}  // namespace tandem
