// Hugging Face `tokenizer.json` tokenizers (byte-level BPE as in GPT-2 / Llama 3 / Qwen, and
// sentencepiece-style BPE with byte fallback as in Llama 2 / Mistral), exact against the
// reference implementation.
//
// Encoding runs the same stages as the Rust `tokenizers` library: added tokens are cut out of
// the raw text; each remaining segment is normalized, pre-tokenized into words and each word
// is BPE-encoded; the post-processor adds the model's special tokens on request. Decoding maps
// ids to token strings and runs the decoder chain.
//
// Supported components: model BPE; normalizers NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip,
// Sequence; pre-tokenizers Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit,
// Sequence; decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence;
// post-processors TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence.
// Anything else is rejected at load time with an UNIMPLEMENTED status naming it.
#ifndef TANDEM_TEXT_TOKENIZER_HF_TOKENIZER_H_
#define TANDEM_TEXT_TOKENIZER_HF_TOKENIZER_H_

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace tandem {

class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;

class HfTokenizer final : public Tokenizer {
 public:
  struct DecodeOptions {
    // Leave out added tokens marked special.
    bool skip_special_tokens = false;
    // transformers' clean_up_tokenization: " ." -> ".", " n't" -> "n't", and so on.
    bool clean_up_tokenization_spaces = false;
  };

  // `path` is a tokenizer.json file or a directory holding one. Beside the file, the optional
  // tokenizer_config.json (BOS / EOS tokens, clean_up_tokenization_spaces) and
  // generation_config.json (further EOS ids) are read too; for a file named PREFIXtokenizer.json
  // they are PREFIXtokenizer_config.json and PREFIXgeneration_config.json. Errors: NOT_FOUND,
  // INVALID_ARGUMENT for malformed files (naming the field), UNIMPLEMENTED for component types
  // this implementation does not have.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& path);

  // The same from the files' contents. `config_json` and `generation_config_json` may be empty.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view config_json = {},
      std::string_view generation_config_json = {});

  ~HfTokenizer() override;

  // Invalid UTF-8 in `text` is replaced by U+FFFD first (use EncodeChecked to reject it).
  std::vector<int> Encode(std::string_view text, bool add_special_tokens) const override;
  // INVALID_ARGUMENT (with the byte offset) when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int>> EncodeChecked(std::string_view text,
                                                 bool add_special_tokens) const;

  // Special tokens kept, no clean-up: the pure tokenizer.json decoder. Unknown ids are skipped.
  std::string Decode(std::span<const int> ids) const override;
  std::string Decode(std::span<const int> ids, const DecodeOptions& options) const;

  int vocab_size() const override { return vocab_size_; }
  int bos_id() const override { return bos_id_; }
  std::vector<int> eos_ids() const override { return eos_ids_; }

  // The token string of `id` (added tokens first), or null.
  const std::string* IdToToken(int id) const;
  // The id of a token string (added tokens first), or -1.
  int TokenToId(std::string_view token) const;
  bool IsSpecial(int id) const override;
  // From tokenizer_config.json; false when absent.
  bool clean_up_tokenization_spaces() const { return clean_up_tokenization_spaces_; }

 private:
  HfTokenizer();
  absl::Status Init(std::string_view tokenizer_json, std::string_view config_json,
                    std::string_view generation_config_json);
  // `text` is valid UTF-8.
  std::vector<int> EncodeValid(std::string_view text, bool add_special_tokens) const;
  // Normalized, pre-tokenized and BPE-encoded: one segment between added tokens.
  void EncodeSegment(std::string_view segment, bool at_start, std::vector<int>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer_;  // may be null
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;  // may be null
  std::unique_ptr<Decoder> decoder_;               // may be null
  std::unique_ptr<AddedVocabulary> added_;
  int vocab_size_ = 0;
  int bos_id_ = -1;
  std::vector<int> eos_ids_;
  bool clean_up_tokenization_spaces_ = false;
};

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_HF_TOKENIZER_H_
