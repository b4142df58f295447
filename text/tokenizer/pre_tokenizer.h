// tokenizer.json pre-tokenizers: Split, ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Sequence. A pre-tokenizer cuts a normalized segment into the pieces
// ("words") the model tokenizes independently, possibly rewriting them (ByteLevel maps bytes to
// characters, Metaspace spaces to U+2581).
#ifndef TANDEM_TEXT_TOKENIZER_PRE_TOKENIZER_H_
#define TANDEM_TEXT_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "text/tokenizer/json_util.h"

namespace tandem {

// Receives each output piece (never empty) in order. `at_start`: the piece begins where the
// input text began (Metaspace's prepend_scheme "first" depends on it). The view is only valid
// during the call.
using PieceSink = absl::FunctionRef<void(std::string_view piece, bool at_start)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // `piece` is non-empty valid UTF-8.
  virtual void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const = 0;
};

// From the "pre_tokenizer" object of tokenizer.json (not null). Unknown types are an error.
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json_util::Json& j,
                                                               std::string_view where);

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_PRE_TOKENIZER_H_
