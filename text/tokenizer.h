// The tokenizer interface every model format implements: llama2.c `tokenizer.bin`
// (text/llama2c_tokenizer.h) and Hugging Face `tokenizer.json` (text/tokenizer/).
#ifndef TANDEM_TEXT_TOKENIZER_H_
#define TANDEM_TEXT_TOKENIZER_H_

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids for `text`. With `add_special_tokens` the model's own framing is added (BOS for
  // Llama-style models, the post-processor template for tokenizer.json).
  virtual std::vector<int> Encode(std::string_view text, bool add_special_tokens) const = 0;

  // The text of `ids` as the format's decoder produces it (special tokens kept). The result may
  // end in an incomplete UTF-8 sequence when `ids` stops mid-character; IncrementalDecoder
  // handles that for streaming.
  virtual std::string Decode(std::span<const int> ids) const = 0;

  // Number of token ids (the model's embedding rows may be more).
  virtual int vocab_size() const = 0;
  // -1 when the format has none.
  virtual int bos_id() const = 0;
  virtual std::vector<int> eos_ids() const = 0;
  // Control tokens (BOS, EOS, chat markers such as "<|im_start|>"): never text a constrained
  // output may contain (engine/sampling/output_constraint.h).
  virtual bool IsSpecial(int /*id*/) const { return false; }
};

// Streams text for a growing sequence of ids without ever emitting half a UTF-8 character, and
// without the artefacts of decoding tokens one at a time (sentencepiece's leading-space rule,
// byte-fallback pieces split across tokens). Decodes a short window of recent ids and emits the
// part of it that is new and complete.
class IncrementalDecoder {
 public:
  // `prompt_ids` give context (their text is never emitted); may be empty.
  IncrementalDecoder(const Tokenizer* tokenizer, std::span<const int> prompt_ids);

  // Adds one generated id; returns the newly completed text (often empty mid-character). The
  // text is always valid UTF-8: bytes that can never form a character become U+FFFD.
  std::string Add(int id);
  // Text held back at the end of the stream (an incomplete tail becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::vector<int> ids_;
  size_t prefix_offset_ = 0;  // window start: ids before it are never decoded again
  size_t read_offset_ = 0;    // text of ids_[prefix_offset_, read_offset_) was already emitted
};

// `s` with every maximal ill-formed subsequence replaced by U+FFFD (Rust's from_utf8_lossy,
// which the Hugging Face decoders use), so the text can travel in a proto3 string or JSON.
std::string ToValidUtf8(std::string_view s);

// Length of the longest prefix of `s` that is complete UTF-8 (an incomplete trailing sequence is
// excluded; invalid bytes in the middle count as complete so they are not held forever).
size_t CompleteUtf8Prefix(std::string_view s);

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_H_
