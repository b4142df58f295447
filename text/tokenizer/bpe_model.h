// The BPE model of tokenizer.json: vocabulary, ranked merges, unknown-token and byte-fallback
// handling, optional continuing-subword prefix / end-of-word suffix.
#ifndef TANDEM_TEXT_TOKENIZER_BPE_MODEL_H_
#define TANDEM_TEXT_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "text/tokenizer/json_util.h"
#include "text/tokenizer/string_map.h"

namespace tandem {

class BpeModel {
 public:
  // From the "model" object of tokenizer.json.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const json_util::Json& j);

  // Appends the ids of one pre-tokenized piece (non-empty valid UTF-8). Thread-safe.
  void Tokenize(std::string_view word, std::vector<int>* ids) const;

  // -1 when absent.
  int TokenToId(std::string_view token) const;
  // Null when `id` has no token.
  const std::string* IdToToken(int id) const;
  // One past the largest id.
  int id_limit() const { return static_cast<int>(tokens_.size()); }

 private:
  struct MergeResult {
    uint32_t rank;
    int new_id;
  };

  // Results for recently seen words: most text repeats a small set of words, and a lookup is
  // much cheaper than running the merges. Sharded so threads rarely contend on a lock; a full
  // shard stops taking new words (bounded memory, as in the Rust library).
  class WordCache {
   public:
    bool Lookup(std::string_view word, std::vector<int>* ids) const;
    void Insert(std::string_view word, const int* ids, size_t n);

   private:
    static constexpr size_t kShards = 16;
    static size_t ShardOf(std::string_view word);  // `word` is non-empty
    static constexpr size_t kWordsPerShard = 8192;
    struct Shard {
      mutable std::mutex mu;
      StringMap<std::vector<int>> words;
    };
    std::array<Shard, kShards> shards_;
  };

  BpeModel() = default;
  absl::Status Init(const json_util::Json& j);
  // Tokenizes one word through the cache.
  void TokenizeWord(std::string_view word, std::vector<int>* ids) const;
  // Runs the merges on `word`; appends ids.
  void MergeWord(std::string_view word, std::vector<int>* ids) const;
  int CharId(std::string_view ch, uint32_t cp) const;

  StringMap<int> vocab_;
  std::vector<std::string> tokens_;  // [id_limit()] token string per id ("" for holes)
  std::vector<bool> has_token_;      // [id_limit()]
  absl::flat_hash_map<uint64_t, MergeResult> merges_;  // key: left id << 32 | right id
  // Ids of single-code-point tokens, the starting symbols of every word.
  std::vector<int> low_char_ids_;  // [kLowChars]
  absl::flat_hash_map<uint32_t, int> char_ids_;
  static constexpr uint32_t kLowChars = 0x800;

  int unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int, 256> byte_ids_{};  // id of "<0xXX>", -1 when absent

  // When set, words are cut before every run of this code point (U+2581 in sentencepiece-style
  // vocabularies). Enabled only when the vocabulary proves it exact: no token contains the
  // character after a different one, so no merge can ever span such a cut.
  bool split_before_runs_ = false;
  std::string split_char_;

  mutable WordCache cache_;
};

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_BPE_MODEL_H_
