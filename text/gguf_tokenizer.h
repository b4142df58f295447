// The tokenizer and chat template a GGUF file carries in its metadata (tokenizer.ggml.*,
// tokenizer.chat_template), expressed as the Hugging Face files that describe the same
// tokenizer, so that one implementation (text/tokenizer/) serves both formats and
// `tandem model convert` can write them out.
//
//   tokenizer.ggml.model "gpt2": byte-level BPE from tokens and merges; the pre-tokenizer from
//     tokenizer.ggml.pre: "default"/"gpt-2" (GPT-2's regex), "smollm" (every digit split off,
//     then GPT-2's regex: llama.cpp's reading of the name and the model's own tokenizer.json;
//     transformers' GGUF converter omits the digit split), "llama-bpe" (Llama 3) and "qwen2"
//     (Qwen2 and Qwen3: NFC first, as their tokenizer.json and transformers do; llama.cpp does
//     not normalise).
//   tokenizer.ggml.model "llama": sentencepiece-style BPE with byte fallback; the merges are
//     derived from the scores (a merge ranks by its result's score, as sentencepiece merges).
// Control tokens become special added tokens; tokenizer.ggml.add_bos_token (and add_eos_token)
// the post-processor.
#ifndef TANDEM_TEXT_GGUF_TOKENIZER_H_
#define TANDEM_TEXT_GGUF_TOKENIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "formats/gguf.h"

namespace tandem {

struct GgufTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;  // bos_token, eos_token, add_bos_token, chat_template
};

// UNIMPLEMENTED naming the key for a tokenizer model or pre-tokenizer Tandem does not have;
// INVALID_ARGUMENT for inconsistent metadata (array lengths, ids out of range).
absl::StatusOr<GgufTokenizerFiles> GgufTokenizer(const GgufFile& file);

}  // namespace tandem

#endif  // TANDEM_TEXT_GGUF_TOKENIZER_H_
