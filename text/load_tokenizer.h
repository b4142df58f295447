// Picks and loads the tokenizer (and the chat template) for a path: a Hugging Face tokenizer.json
// (or a directory holding one), a GGUF file (the tokenizer in its metadata) or a llama2.c
// tokenizer.bin.
#ifndef TANDEM_TEXT_LOAD_TOKENIZER_H_
#define TANDEM_TEXT_LOAD_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "text/chat_template/chat_template.h"
#include "text/tokenizer.h"

namespace tandem {

// `expected_vocab_size` > 0 checks a llama2.c tokenizer against the model.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path,
                                                         int expected_vocab_size = 0);

// The tokenizer that belongs with a model path when none is named: tokenizer.json or
// tokenizer.bin inside an HF directory; a GGUF file itself; tokenizer.bin or tok<vocab>.bin
// beside a llama2.c checkpoint. NOT_FOUND when there is none.
absl::StatusOr<std::string> FindTokenizerFor(const std::string& model_path, int vocab_size);

// The chat template for a model: `chat_template_path` when given (a tokenizer_config.json, or a
// file holding the Jinja template itself), else the tokenizer_config.json beside the tokenizer
// or in the model directory (with chat_template.jinja beside it when the config holds no
// template, as transformers 5 saves it), or a GGUF file's own metadata. NOT_FOUND when there is
// none; the parse error of a template that uses Jinja this engine does not support (UNIMPLEMENTED
// naming the construct and line).
absl::StatusOr<TokenizerChatTemplate> LoadChatTemplate(const std::string& model_path,
                                                       const std::string& tokenizer_path,
                                                       const std::string& chat_template_path);

}  // namespace tandem

#endif  // TANDEM_TEXT_LOAD_TOKENIZER_H_
