// The compiled form of a Regex (lib/regex/regex.h), shared by its compiler (regex.cc) and its
// matcher (regex_match.cc). Internal to text/tokenizer/.
#ifndef TANDEM_LIB_REGEX_REGEX_INTERNAL_H_
#define TANDEM_LIB_REGEX_REGEX_INTERNAL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "lib/regex/regex.h"
#include "lib/unicode/unicode.h"

namespace tandem {
namespace regex_internal {

using unicode::CategoryBit;
using unicode::GeneralCategory;

constexpr int kUnbounded = -1;
// Budgets for one match attempt. The patterns tokenizers use need a handful of steps per
// character; these only stop pathological patterns from hanging or overflowing the stack.
constexpr int64_t kMaxStepsPerAttempt = 10'000'000;
constexpr int kMaxDepth = 4000;

// Oniguruma's \w: letters, marks, decimal digits and connector punctuation, and the code points
// of kOnigWordExtra (the Alphabetic letter numbers and enclosed letters, Latin-1's superscript
// digits and fractions), which the matcher marks with kWordExtraBit. Found by comparing every
// code point with Oniguruma 6.9; tests/text/tokenizer/regex_onig_test.cc keeps it so.
constexpr uint32_t kWordExtraBit = 1u << 31;  // past the categories and kWhiteSpaceBit
constexpr uint32_t kWordMask = unicode::kLetterMask | unicode::kMarkMask |
                               CategoryBit(GeneralCategory::kNd) |
                               CategoryBit(GeneralCategory::kPc) | kWordExtraBit;

// unicode::Properties plus kWordExtraBit.
uint32_t MatchProperties(uint32_t cp);
constexpr uint32_t kDigitMask = CategoryBit(GeneralCategory::kNd);

}  // namespace regex_internal

struct Regex::CharClass {
  uint32_t mask = 0;                // matches when any of these property bits is set
  std::vector<uint32_t> neg_masks;  // ... or when none of the bits of one of these is set
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // ... or the code point is in a range
  bool negated = false;
  bool icase = false;

  bool MatchesRaw(uint32_t cp, uint32_t props) const {
    if (props & mask) return true;
    for (uint32_t m : neg_masks) {
      if ((props & m) == 0) return true;
    }
    for (const auto& [lo, hi] : ranges) {
      if (cp >= lo && cp <= hi) return true;
    }
    return false;
  }

  bool Matches(uint32_t cp, uint32_t props) const {
    bool m = MatchesRaw(cp, props);
    if (!m && icase) {
      // Simple case folding: try the folded form, and for ASCII letters the other case.
      const uint32_t folded = unicode::SimpleFold(cp);
      if (folded != cp) m = MatchesRaw(folded, unicode::Properties(folded));
      if (!m && cp >= 'a' && cp <= 'z') m = MatchesRaw(cp - 32, props);
    }
    return m != negated;
  }
};

// What the first code point of a match of a sequence can be, for skipping alternatives that
// cannot match without entering them. `any` when unknown or when the sequence may match empty.
struct FirstCharFilter {
  bool any = true;
  std::vector<std::pair<uint32_t, bool>> literals;  // (code point, compare case-folded)
  std::vector<int> classes;                         // indices into Regex::classes_
};

struct Regex::Node {
  enum class Kind {
    kLiteral,  // cp (folded when icase)
    kClass,    // class_index
    kAny,      // any code point but '\n'
    kGroup,    // alts: leftmost-first alternatives
    kRepeat,   // body repeated [min, max] times
    kLookahead,
    kLookbehind,  // body of width [min_width, max_width]
    kAtomic,
    kLineStart,
    kLineEnd,
    kTextStart,
    kTextEnd,
    kTextEndOrFinalNewline,
    kWordBoundary,
    kNotWordBoundary,
  };
  enum class Greed { kGreedy, kLazy, kPossessive };

  Kind kind = Kind::kLiteral;
  uint32_t cp = 0;
  bool icase = false;
  int class_index = -1;
  std::vector<Seq> alts;
  std::vector<FirstCharFilter> alt_filters;  // kGroup: one per alternative
  Seq body;
  int min = 0;
  int max = 0;  // kUnbounded for no limit
  Greed greed = Greed::kGreedy;
  bool negate = false;       // lookaround
  bool single_char = false;  // kRepeat whose body is one code-point matcher
  int min_width = 0, max_width = 0;
};

}  // namespace tandem

#endif  // TANDEM_LIB_REGEX_REGEX_INTERNAL_H_
