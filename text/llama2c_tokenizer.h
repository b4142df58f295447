// The llama2.c tokenizer (`tokenizer.bin`: int32 max_token_length, then per token a float32
// merge score, an int32 length and the piece bytes), encoding and decoding exactly as run.c.
#ifndef TANDEM_TEXT_LLAMA2C_TOKENIZER_H_
#define TANDEM_TEXT_LLAMA2C_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace tandem {

class Llama2cTokenizer final : public Tokenizer {
 public:
  // `expected_vocab_size` > 0 checks the file against the model (run.c reads exactly that many
  // entries); 0 reads every entry in the file.
  static absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> Load(const std::string& path,
                                                                int expected_vocab_size = 0);

  // run.c encode(): BOS when add_special_tokens, a dummy-prefix space for non-empty text,
  // UTF-8 code points looked up (byte fallback +3 otherwise), then the highest-score merge of
  // adjacent pieces until none applies (the first pair wins ties).
  std::vector<int> Encode(std::string_view text, bool add_special_tokens) const override;

  // run.c decode() over the sequence: the piece after BOS loses its leading space; "<0xXX>"
  // pieces are that byte; BOS and EOS produce nothing. Unlike run.c's safe_printf, bytes >= 0x80
  // are kept (so UTF-8 text survives); other non-printing control bytes are dropped as run.c does.
  std::string Decode(std::span<const int> ids) const override;

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int bos_id() const override { return 1; }
  std::vector<int> eos_ids() const override { return {2}; }
  // <unk>, BOS and EOS.
  bool IsSpecial(int id) const override { return id >= 0 && id <= 2; }
  const std::string& piece(int id) const { return pieces_[id]; }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  absl::flat_hash_map<std::string, int> ids_;  // piece -> lowest id
};

}  // namespace tandem

#endif  // TANDEM_TEXT_LLAMA2C_TOKENIZER_H_
