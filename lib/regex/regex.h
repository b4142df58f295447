// A small backtracking regular-expression engine for the patterns found in tokenizer.json
// files (the GPT-2, Llama 3, Qwen and similar pre-tokenizer splits).
//
// The Rust `tokenizers` library runs these patterns with Oniguruma, so this engine follows its
// syntax and semantics: leftmost-first alternation, greedy / lazy (`*?`) / possessive (`*+`)
// quantifiers, `{n,m}`, groups `(...)` `(?:...)` `(?i:...)` `(?>...)`, lookahead `(?=...)`
// `(?!...)`, bounded lookbehind `(?<=...)` `(?<!...)`, anchors `^ $ \A \z \Z \b \B`, classes
// `[...]` with ranges and negation, `.`, `\s \S \d \D \w \W \h \H`, and Unicode general
// categories `\p{L}`, `\p{Lu}`, `\p{Letter}`, `\P{N}`, `\p{^N}` correct for all of Unicode.
// Unsupported syntax (backreferences, named groups, class intersection, scripts) is rejected
// at compile time with a clear error instead of being misread.
//
// Matching works on code points; offsets in and out are bytes of valid UTF-8.
//
// Kept instead of linking Oniguruma: it finds the same matches (tests/text/tokenizer/
// regex_onig_test.cc checks every class on every code point and random texts against it) and is
// faster on the Llama 3 and Qwen patterns (bench/regex_bench, docs/models.md).
#ifndef TANDEM_LIB_REGEX_REGEX_H_
#define TANDEM_LIB_REGEX_REGEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Regex {
 public:
  struct Match {
    size_t begin;  // byte offset
    size_t end;    // byte offset, exclusive
  };

  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();

  // Appends to `matches` the successive non-overlapping matches in `text` (valid UTF-8), in the
  // order Oniguruma's find_iter reports them (after an empty match the search moves on one
  // character). A match attempt that exceeds the engine's step or depth budget (catastrophic
  // backtracking in a pathological pattern) counts as no match at that position.
  void FindAll(std::string_view text, std::vector<Match>* matches) const;

  const std::string& pattern() const { return pattern_; }

  struct Node;
  struct CharClass;
  using Seq = std::vector<int>;  // indices into nodes_, matched in order

 private:
  friend class RegexParser;
  friend class RegexMatcher;
  Regex();

  std::string pattern_;
  std::vector<Node> nodes_;
  std::vector<CharClass> classes_;
  Seq root_;
};

}  // namespace tandem

#endif  // TANDEM_LIB_REGEX_REGEX_H_
