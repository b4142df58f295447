#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "lib/unicode/unicode.h"

namespace tandem {
namespace {

// The code point that ends at byte `end` of `text` (end > 0); sets *begin to its start.
uint32_t CodePointBefore(std::string_view text, size_t end, size_t* begin) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  *begin = b;
  size_t i = b;
  return unicode::DecodeUtf8(text, &i);
}

// A "word" character for single_word tokens, like the Rust regex \w (letters, marks, decimal
// digits, connector punctuation).
bool IsWordChar(uint32_t cp) {
  constexpr uint32_t kWord = unicode::kLetterMask | unicode::kMarkMask |
                             unicode::CategoryBit(unicode::GeneralCategory::kNd) |
                             unicode::CategoryBit(unicode::GeneralCategory::kPc);
  return (unicode::Properties(cp) & kWord) != 0;
}

}  // namespace

AddedVocabulary::Trie::Trie() : nodes_(1) {}

void AddedVocabulary::Trie::Insert(std::string_view key, int value) {
  if (key.empty()) return;
  int node = 0;
  for (char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    auto& children = nodes_[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [c](const auto& child) { return child.first == c; });
    if (it != children.end()) {
      node = it->second;
      continue;
    }
    const int next = static_cast<int>(nodes_.size());
    nodes_[node].children.emplace_back(c, next);
    nodes_.emplace_back();
    node = next;
  }
  if (nodes_[node].value < 0) nodes_[node].value = value;  // the first of duplicates wins
  first_bytes_[static_cast<unsigned char>(key[0])] = true;
}

size_t AddedVocabulary::Trie::LongestAt(std::string_view text, size_t pos, int* value) const {
  size_t best = 0;
  int node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto& children = nodes_[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [c](const auto& child) { return child.first == c; });
    if (it == children.end()) break;
    node = it->second;
    if (nodes_[node].value >= 0) {
      best = i + 1 - pos;
      *value = nodes_[node].value;
    }
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    by_id_.try_emplace(t.id, i);
    if (!t.normalized) {
      raw_.Insert(t.content, static_cast<int>(i));
      continue;
    }
    std::string pattern = t.content;
    if (normalizer != nullptr) normalizer->Normalize(&pattern);
    normalized_.Insert(pattern, static_cast<int>(i));
  }
}

const AddedToken* AddedVocabulary::Find(int id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocabulary::Split(std::string_view text, bool normalized_tokens,
                            std::vector<Segment>* out) const {
  const Trie& trie = normalized_tokens ? normalized_ : raw_;
  size_t done = 0;  // text before this is already in `out`
  size_t pos = 0;
  while (!trie.empty() && pos < text.size()) {
    int index;
    const size_t len = trie.MayStartWith(static_cast<unsigned char>(text[pos]))
                           ? trie.LongestAt(text, pos, &index)
                           : 0;
    if (len == 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos, stop = pos + len;
    pos = stop;  // the search resumes after the match even when it is discarded below
    if (token.single_word) {
      size_t b;
      const bool word_before = start > 0 && IsWordChar(CodePointBefore(text, start, &b));
      size_t i = stop;
      const bool word_after = stop < text.size() && IsWordChar(unicode::DecodeUtf8(text, &i));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Swallow the White_Space before the token, but not text already emitted.
      size_t s = start;
      while (s > done) {
        size_t b;
        if (!unicode::IsWhiteSpace(CodePointBefore(text, s, &b))) break;
        s = b;
      }
      start = std::max(s, done);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t i = stop;
        if (!unicode::IsWhiteSpace(unicode::DecodeUtf8(text, &i))) break;
        stop = i;
      }
      // A later token may not begin inside the swallowed space.
      pos = std::max(pos, stop);
    }
    if (done < start) out->push_back({done, start, -1});
    out->push_back({start, stop, token.id});
    done = stop;
  }
  if (done < text.size()) out->push_back({done, text.size(), -1});
}

}  // namespace tandem
