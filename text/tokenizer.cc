#include "text/tokenizer.h"

#include "lib/unicode/unicode.h"

namespace tandem {

size_t CompleteUtf8Prefix(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a trailing multi-byte sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return back < need ? n - back : n;
  }
  return n;  // only continuation bytes: invalid, nothing to wait for
}

std::string ToValidUtf8(std::string_view s) { return unicode::ToValidUtf8(s); }

IncrementalDecoder::IncrementalDecoder(const Tokenizer* tokenizer, std::span<const int> prompt_ids)
    : tokenizer_(tokenizer), ids_(prompt_ids.begin(), prompt_ids.end()) {
  // A few ids of context are enough for every decoder's cross-token rules (leading-space
  // stripping, byte-fallback sequences of up to 4 bytes).
  prefix_offset_ = ids_.size() > 6 ? ids_.size() - 6 : 0;
  read_offset_ = ids_.size();
}

std::string IncrementalDecoder::Add(int id) {
  ids_.push_back(id);
  std::span<const int> all(ids_);
  const std::string prefix_text =
      tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_));
  const std::string new_text = tokenizer_->Decode(all.subspan(prefix_offset_));
  // A character is at most 4 byte tokens: more ids than this still held back are not waiting
  // for one, but are output that never completes (a run of lone lead bytes or of U+FFFD).
  // Holding them forever would re-decode an ever-growing window on every id (quadratic; found
  // with tokenizer_encode_fuzzer) and never stream that text.
  constexpr size_t kMaxHeldIds = 8;
  const bool overdue = ids_.size() - read_offset_ >= kMaxHeldIds;
  if (new_text == prefix_text && overdue) {  // ids that add no text: nothing to wait for
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    return "";
  }
  // Emit only when the new text extends the old and ends on a complete character.
  if (new_text.size() <= prefix_text.size() ||
      new_text.compare(0, prefix_text.size(), prefix_text) != 0) {
    return "";
  }
  // Hold back an incomplete UTF-8 tail, and U+FFFD that a byte-fallback decoder may produce
  // for a character whose remaining bytes are still to come.
  const bool incomplete =
      CompleteUtf8Prefix(new_text) < new_text.size() ||
      (new_text.size() >= 3 && new_text.compare(new_text.size() - 3, 3, "\xEF\xBF\xBD") == 0);
  if (incomplete && !overdue) return "";
  std::string delta = new_text.substr(prefix_text.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return ToValidUtf8(delta);
}

std::string IncrementalDecoder::Flush() {
  std::span<const int> all(ids_);
  const std::string prefix_text =
      tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_));
  const std::string new_text = tokenizer_->Decode(all.subspan(prefix_offset_));
  prefix_offset_ = read_offset_ = ids_.size();
  if (new_text.size() <= prefix_text.size()) return "";
  return ToValidUtf8(new_text.substr(prefix_text.size()));
}

}  // namespace tandem
