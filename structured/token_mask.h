// Which tokens of a vocabulary may come next under a JsonMatcher (structured/json_matcher.h):
// a token is allowed when the matcher accepts all of its bytes; the end-of-sequence tokens when
// the value is complete (and only they once nothing can follow).
//
// Where the constraint forces the text that follows (a prefix such as a tool call's opening tag, a
// property name, a `const`: exactly one byte may come at each position), only the longest token
// inside that text is allowed, and the tokens that cover all of it and go on: the forced text is
// written in as few tokens as the vocabulary allows, as its tokenizer would write it, rather than
// in whichever short pieces the model prefers for text it did not choose.
//
// Work per step: tokens are grouped by their first byte, and only the groups whose first byte the
// matcher accepts are tried, one copied matcher per token. Inside a string with no length limit
// (most of a JSON text's bytes) the tokens of plain string content are allowed without trying
// them; only the others (quotes, backslashes, control bytes, split UTF-8) are tried.
#ifndef TANDEM_STRUCTURED_TOKEN_MASK_H_
#define TANDEM_STRUCTURED_TOKEN_MASK_H_

#include <array>
#include <span>
#include <string>
#include <vector>

#include "structured/json_matcher.h"

namespace tandem::structured {

class TokenMask {
 public:
  // token_bytes[id]: the bytes token id adds to a text, empty for tokens that must never be
  // generated inside a value (special tokens).
  explicit TokenMask(std::vector<std::string> token_bytes);

  // allowed[id] = 1 for every token that may follow `state`, 0 for the others (resized to the
  // vocabulary); eos_ids (the model's: the tokens it stops at) are allowed exactly where the
  // value is complete. Never all zero: when no token can continue (a vocabulary without some
  // byte), the EOS tokens are allowed. Notes progress to the step running on this thread as it
  // goes (kernels/step_progress.h): a wide pattern's mask over a large vocabulary is long work,
  // and a worker's health must not take it for a step that never returns.
  void Allowed(const JsonMatcher& state, std::span<const int> eos_ids,
               std::vector<uint8_t>* allowed) const;

  // Feeds token `id` to `state`; false when it is not allowed there.
  bool Advance(JsonMatcher* state, int id) const;

  int vocab_size() const { return static_cast<int>(bytes_.size()); }

  // The text the constraint forces after `state` and its one possible next byte `first`: byte by
  // byte while exactly one may follow (at most kMaxForced bytes).
  static constexpr size_t kMaxForced = 64;
  static std::string ForcedText(const JsonMatcher& state, unsigned char first);

 private:
  // Restricts `allowed` to the tokens of a forced text (above).
  void KeepForcedTokens(const JsonMatcher& state, unsigned char first,
                        std::vector<uint8_t>* allowed) const;
  std::vector<std::string> bytes_;
  std::array<std::vector<int>, 256> by_first_byte_;
  std::vector<int> plain_;  // whole UTF-8 characters, no '"', '\' or control bytes
  std::vector<int> other_;  // the rest of the non-empty tokens
};

}  // namespace tandem::structured

#endif  // TANDEM_STRUCTURED_TOKEN_MASK_H_
