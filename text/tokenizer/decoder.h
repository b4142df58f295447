// tokenizer.json decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
// A decoder turns the list of token strings into the pieces of the output text.
//
// Unlike the Rust library, which replaces an incomplete UTF-8 sequence at the end of its output
// with U+FFFD, these decoders keep such a tail as raw bytes: tandem::IncrementalDecoder then
// holds it back until the next token completes the character. Invalid bytes elsewhere become
// U+FFFD exactly as in the Rust library.
#ifndef TANDEM_TEXT_TOKENIZER_DECODER_H_
#define TANDEM_TEXT_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer/json_util.h"

namespace tandem {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites `tokens` in place (it may merge them); the output text is their concatenation.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// From the "decoder" object of tokenizer.json (not null). Unknown types are an error.
absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const json_util::Json& j,
                                                     std::string_view where);

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_DECODER_H_
