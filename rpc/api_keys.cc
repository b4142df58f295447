#include "rpc/api_keys.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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
    for (char c : line) {
      if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
          !absl::ascii_isprint(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(
            absl::StrFormat("api keys line %d: a key must be printable, without spaces", line_no));
      }
    }
    if (line.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrFormat("api keys line %d: a key must have at least 16 characters", line_no));
    }
    keys.keys_.emplace_back(line);
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

bool ApiKeys::Allows(absl::string_view authorization) const {
  if (keys_.empty()) return true;
  const absl::string_view presented = BearerToken(authorization);
  if (presented.empty()) return false;
  bool allowed = false;
  for (const std::string& k : keys_) allowed |= ConstantTimeEquals(presented, k);
  return allowed;
}

}  // namespace tandem
