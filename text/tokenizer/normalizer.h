// tokenizer.json normalizers: NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence.
// A normalizer rewrites one segment of input text (the text between added tokens) before
// pre-tokenization.
#ifndef TANDEM_TEXT_TOKENIZER_NORMALIZER_H_
#define TANDEM_TEXT_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "text/tokenizer/json_util.h"

namespace tandem {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8 and stays so.
  virtual void Normalize(std::string* text) const = 0;
};

// From the "normalizer" object of tokenizer.json (not null). Unknown types are an error.
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const json_util::Json& j,
                                                           std::string_view where);

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_NORMALIZER_H_
