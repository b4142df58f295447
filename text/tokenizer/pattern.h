// The `pattern` of Split, Replace (normalizer and decoder): {"String": "..."} matches the text
// literally, {"Regex": "..."} is a regex (lib/regex/regex.h).
#ifndef TANDEM_TEXT_TOKENIZER_PATTERN_H_
#define TANDEM_TEXT_TOKENIZER_PATTERN_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/regex/regex.h"
#include "text/tokenizer/json_util.h"

namespace tandem {

class Pattern {
 public:
  static absl::StatusOr<Pattern> FromJson(const json_util::Json& j, std::string_view where);
  static Pattern Literal(std::string literal);

  // Successive non-overlapping matches in `text`. A literal may search any bytes; a regex
  // only searches the valid UTF-8 prefix of `text` (decoder output may end mid-character).
  void FindMatches(std::string_view text, std::vector<Regex::Match>* matches) const;
  // `text` with every match replaced by `content`.
  std::string ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // null for a literal
};

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_PATTERN_H_
