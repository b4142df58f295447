#include "text/tokenizer/pattern.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/unicode/unicode.h"

namespace tandem {

absl::StatusOr<Pattern> Pattern::FromJson(const json_util::Json& j, std::string_view where) {
  if (j.is_object() && j.size() == 1) {
    if (auto it = j.find("String"); it != j.end() && it->is_string()) {
      return Literal(it->get<std::string>());
    }
    if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
      auto re = Regex::Compile(it->get<std::string>());
      if (!re.ok()) {
        return absl::Status(re.status().code(), absl::StrFormat("tokenizer.json: %s: %s", where,
                                                                re.status().message()));
      }
      Pattern p;
      p.regex_ = std::move(*re);
      return p;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("tokenizer.json: %s must be {\"String\": ...} or {\"Regex\": ...}", where));
}

Pattern Pattern::Literal(std::string literal) {
  Pattern p;
  p.literal_ = std::move(literal);
  return p;
}

void Pattern::FindMatches(std::string_view text, std::vector<Regex::Match>* matches) const {
  if (regex_ != nullptr) {
    const size_t invalid = unicode::FindInvalidUtf8(text);
    regex_->FindAll(invalid == std::string_view::npos ? text : text.substr(0, invalid), matches);
    return;
  }
  if (literal_.empty()) return;  // Like the Rust library: an empty literal matches nothing.
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size())) {
    matches->push_back({pos, pos + literal_.size()});
  }
}

std::string Pattern::ReplaceAll(std::string_view text, std::string_view content) const {
  std::vector<Regex::Match> matches;
  FindMatches(text, &matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t last = 0;
  for (const auto& m : matches) {
    out.append(text.substr(last, m.begin - last));
    out.append(content);
    last = m.end;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace tandem
