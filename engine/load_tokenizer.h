// Picks and loads the tokenizer for a path: a Hugging Face tokenizer.json (or a directory holding
// one) or a llama2.c tokenizer.bin.
#ifndef TANDEM_ENGINE_LOAD_TOKENIZER_H_
#define TANDEM_ENGINE_LOAD_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer.h"

namespace tandem {

// `expected_vocab_size` > 0 checks a llama2.c tokenizer against the model.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path,
                                                         int expected_vocab_size = 0);

// The tokenizer that belongs with a model path when none is named: tokenizer.json or
// tokenizer.bin inside an HF directory; tokenizer.bin or tok<vocab>.bin beside a llama2.c
// checkpoint. NOT_FOUND when there is none.
absl::StatusOr<std::string> FindTokenizerFor(const std::string& model_path, int vocab_size);

}  // namespace tandem

#endif  // TANDEM_ENGINE_LOAD_TOKENIZER_H_
