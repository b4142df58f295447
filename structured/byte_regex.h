// A regular expression compiled to an automaton over bytes, for constrained decoding (vLLM's
// guided_regex): the output must match the whole pattern. The automaton is Glushkov's position
// automaton: one state per character position of the pattern (repetitions expanded), a state set
// held in one 128-bit mask, so that stepping it is a few mask operations and copying a matcher
// is copying the mask.
//
// Syntax (Python's re and JavaScript's, as outlines and vLLM take them, for a whole match):
// literals and escaped punctuation, `.` (any character but a newline), classes `[a-z_]` and
// `[^...]` (members ASCII), `\d \w \s \D \W \S`, `\n \t \r \f \v \xHH`, groups `(...)` and
// `(?:...)`, `|`, `* + ?` and `{n}` `{n,}` `{n,m}` (a lazy `?` after them changes nothing for a
// whole match), `^` at the start and `$` at the end. Characters are UTF-8: `.` and negated
// classes match whole multi-byte characters. Refused by name (INVALID_ARGUMENT): backreferences,
// lookaround, `\b`, anchors elsewhere, named groups, non-ASCII class members, a repetition over
// kMaxRepeat, and a pattern needing more than kMaxPositions positions.
#ifndef TANDEM_STRUCTURED_BYTE_REGEX_H_
#define TANDEM_STRUCTURED_BYTE_REGEX_H_

#include <array>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::structured {

class ByteRegex {
 public:
  using Mask = unsigned __int128;  // bit p: position p (0 is the start)
  static constexpr int kMaxPositions = 127;
  static constexpr int kMaxRepeat = 64;
  static constexpr size_t kMaxPatternBytes = 4096;

  static absl::StatusOr<std::shared_ptr<const ByteRegex>> Compile(std::string_view pattern);

  // The state before any byte.
  static constexpr Mask Start() { return 1; }
  // The state after `byte` from `state`; 0 when `byte` cannot come next.
  Mask Step(Mask state, unsigned char byte) const {
    Mask next = 0;
    for (Mask s = state; s != 0; s &= s - 1) next |= follow_[Lowest(s)];
    return next & accepts_[byte];
  }
  // Whether the bytes that led to `state` match the whole pattern.
  bool Accepting(Mask state) const { return (state & last_) != 0; }
  // The character positions the pattern compiled to (state bits 1..positions()).
  int positions() const { return positions_; }
  // Whether every position accepts some byte for which `usable(byte)` holds: then every state
  // can still reach a match using only such bytes.
  template <typename Pred>
  bool EveryPositionAcceptsSome(Pred usable) const {
    Mask covered = 0;
    for (int b = 0; b < 256; ++b) {
      if (usable(static_cast<unsigned char>(b))) covered |= accepts_[b];
    }
    const Mask all = ((Mask{1} << (positions_ + 1)) - 1) & ~Start();
    return (covered & all) == all;
  }

 private:
  friend class RegexBuilder;
  static int Lowest(Mask m) {
    const uint64_t lo = static_cast<uint64_t>(m);
    return lo != 0 ? __builtin_ctzll(lo) : 64 + __builtin_ctzll(static_cast<uint64_t>(m >> 64));
  }
  std::array<Mask, kMaxPositions + 1> follow_{};  // positions that may come after each
  std::array<Mask, 256> accepts_{};               // positions whose class holds the byte
  Mask last_ = 0;                                 // accepting positions (0 if the empty text is)
  int positions_ = 0;
};

}  // namespace tandem::structured

#endif  // TANDEM_STRUCTURED_BYTE_REGEX_H_
