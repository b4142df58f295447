// Added tokens of tokenizer.json (special tokens such as "<|im_start|>", and plain added
// tokens). They are found in the text before the model runs: leftmost match first, the longest
// one where several start at the same place, with lstrip / rstrip / single_word honoured.
// Tokens with normalized=false are matched in the raw text, the others in normalized text.
#ifndef TANDEM_TEXT_TOKENIZER_ADDED_VOCABULARY_H_
#define TANDEM_TEXT_TOKENIZER_ADDED_VOCABULARY_H_

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "text/tokenizer/normalizer.h"

namespace tandem {

struct AddedToken {
  int id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

class AddedVocabulary {
 public:
  // A piece of the split text: an added token (id >= 0) or text to encode further (id -1).
  struct Segment {
    size_t begin;  // byte offsets
    size_t end;
    int id;
  };

  AddedVocabulary() = default;
  // `normalizer` (may be null) turns the content of normalized tokens into what they match.
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` into consecutive segments covering it, using the raw-text tokens
  // (`normalized_tokens` false) or the normalized-text ones. Empty segments are left out.
  void Split(std::string_view text, bool normalized_tokens, std::vector<Segment>* out) const;

  bool has_normalized_tokens() const { return !normalized_.empty(); }
  // Null when `id` is not an added token.
  const AddedToken* Find(int id) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the token texts: finds the longest token starting at a position.
  class Trie {
   public:
    Trie();
    void Insert(std::string_view key, int value);
    // Length of the longest key at text[pos...] (0 if none) and its value.
    size_t LongestAt(std::string_view text, size_t pos, int* value) const;
    bool empty() const { return nodes_.size() == 1; }
    bool MayStartWith(unsigned char c) const { return first_bytes_[c]; }

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int>> children;
      int value = -1;
    };
    std::vector<Node> nodes_;
    std::array<bool, 256> first_bytes_{};
  };

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int, size_t> by_id_;  // id -> index in tokens_
  Trie raw_;                                // values: index in tokens_
  Trie normalized_;                         // values: index in tokens_
};

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_ADDED_VOCABULARY_H_
