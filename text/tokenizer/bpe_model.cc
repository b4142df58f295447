#include "text/tokenizer/bpe_model.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/unicode/unicode.h"

namespace tandem {
namespace {

// Words longer than this are not cached (they are rare, and would crowd out common ones).
constexpr size_t kMaxCachedWordBytes = 256;

// Vocabulary ids may skip at most this many values (real files skip none).
constexpr int64_t kMaxVocabHoles = 1 << 16;

absl::Status ModelError(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("tokenizer.json: model: %s", what));
}

uint64_t PairKey(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

// Shards are picked from a few bytes rather than a full hash: the map hashes the word anyway.
size_t BpeModel::WordCache::ShardOf(std::string_view word) {
  return (word.size() * 131 + static_cast<unsigned char>(word.front()) * 31 +
          static_cast<unsigned char>(word.back())) %
         kShards;
}

bool BpeModel::WordCache::Lookup(std::string_view word, std::vector<int>* ids) const {
  const Shard& shard = shards_[ShardOf(word)];
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.words.find(word);
  if (it == shard.words.end()) return false;
  ids->insert(ids->end(), it->second.begin(), it->second.end());
  return true;
}

void BpeModel::WordCache::Insert(std::string_view word, const int* ids, size_t n) {
  Shard& shard = shards_[ShardOf(word)];
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= kWordsPerShard) return;
  shard.words.try_emplace(word, ids, ids + n);
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json_util::Json& j) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  if (auto st = model->Init(j); !st.ok()) return st;
  return model;
}

absl::Status BpeModel::Init(const json_util::Json& j) {
  if (auto st = json_util::CheckObject(j, "model"); !st.ok()) return st;
  if (auto it = j.find("type"); it != j.end()) {
    if (!it->is_string()) return ModelError("type must be a string");
    if (*it != "BPE") {
      return absl::UnimplementedError(absl::StrFormat(
          "tokenizer.json: model type \"%s\" is not supported (only BPE)", it->get<std::string>()));
    }
  }
  auto vocab_it = j.find("vocab");
  auto merges_it = j.find("merges");
  if (vocab_it == j.end() || !vocab_it->is_object()) return ModelError("vocab must be an object");
  if (merges_it == j.end() || !merges_it->is_array()) return ModelError("merges must be an array");

  // Vocabulary.
  vocab_.reserve(vocab_it->size());
  // Ids index dense tables (tokens_, has_token_), so they may leave only a bounded number of
  // holes: a tiny file with one huge id must not make the loader allocate gigabytes.
  const int64_t id_bound = static_cast<int64_t>(vocab_it->size()) + kMaxVocabHoles;
  int max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return ModelError(absl::StrFormat("vocab[\"%s\"] must be an integer id", it.key()));
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= id_bound) {
      return ModelError(absl::StrFormat(
          "vocab[\"%s\"] = %d is out of range [0, %d) (the entries plus %d unused ids)", it.key(),
          id, id_bound, kMaxVocabHoles));
    }
    vocab_[it.key()] = static_cast<int>(id);
    max_id = std::max(max_id, static_cast<int>(id));
  }
  tokens_.assign(max_id + 1, std::string());
  has_token_.assign(max_id + 1, false);
  low_char_ids_.assign(kLowChars, -1);
  for (const auto& [token, id] : vocab_) {
    tokens_[id] = token;
    has_token_[id] = true;
    size_t i = 0;
    const uint32_t cp = unicode::DecodeUtf8(token, &i);
    if (!token.empty() && i == token.size()) {
      if (cp < kLowChars) {
        low_char_ids_[cp] = id;
      } else {
        char_ids_[cp] = id;
      }
    }
  }

  // Options. null and a missing field both mean "off"; "" prefix/suffix behaves as none.
  auto unk = json_util::GetOptionalString(j, "unk_token", "model");
  if (!unk.ok()) return unk.status();
  if (unk->has_value()) {
    // Rust fails on encode when the unk token is absent from the vocabulary; failing at load
    // gives the same answer earlier.
    auto it = vocab_.find(**unk);
    if (it == vocab_.end()) {
      return ModelError(absl::StrFormat("unk_token \"%s\" is not in the vocabulary", **unk));
    }
    unk_id_ = it->second;
  }
  for (auto [field, out] : {std::pair<const char*, bool*>{"fuse_unk", &fuse_unk_},
                            {"byte_fallback", &byte_fallback_},
                            {"ignore_merges", &ignore_merges_}}) {
    auto v = json_util::GetBool(j, field, "model", false);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  for (auto [field, out] : {std::pair<const char*, std::string*>{"continuing_subword_prefix",
                                                                 &continuing_subword_prefix_},
                            {"end_of_word_suffix", &end_of_word_suffix_}}) {
    auto v = json_util::GetOptionalString(j, field, "model");
    if (!v.ok()) return v.status();
    *out = v->value_or("");
  }
  // "dropout" only matters for training; inference runs without it, deterministically.
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(absl::StrFormat("<0x%02X>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  // Merges: "a b" strings or ["a", "b"] pairs; rank = position (skipping "#version" lines). A
  // later duplicate of a pair overrides the earlier one, as in the Rust library.
  merges_.reserve(merges_it->size());
  uint32_t rank = 0;
  std::string merged;
  for (size_t i = 0; i < merges_it->size(); ++i) {
    const auto& m = (*merges_it)[i];
    std::string_view a, b;
    std::string line;
    if (m.is_string()) {
      line = m.get<std::string>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return ModelError(absl::StrFormat("merges[%d] \"%s\" is not two tokens", i, line));
      }
      a = std::string_view(line).substr(0, space);
      b = std::string_view(line).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      return ModelError(absl::StrFormat("merges[%d] must be \"a b\" or [\"a\", \"b\"]", i));
    }
    auto a_it = vocab_.find(a);
    auto b_it = vocab_.find(b);
    if (a_it == vocab_.end() || b_it == vocab_.end()) {
      return ModelError(absl::StrFormat("merges[%d]: \"%s\" is not in the vocabulary", i,
                                        a_it == vocab_.end() ? a : b));
    }
    merged.assign(a);
    merged.append(b.substr(std::min(continuing_subword_prefix_.size(), b.size())));
    auto new_it = vocab_.find(merged);
    if (new_it == vocab_.end()) {
      return ModelError(absl::StrFormat(
          "merges[%d]: the merged token \"%s\" is not in the vocabulary", i, merged));
    }
    merges_[PairKey(a_it->second, b_it->second)] = {rank, new_it->second};
    ++rank;
  }

  // Cutting words before runs of a separator character (see split_before_runs_).
  if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
    for (std::string_view candidate : {"\xE2\x96\x81" /* U+2581 */, " "}) {
      if (!vocab_.contains(candidate)) continue;
      bool safe = true;
      for (const auto& [token, id] : vocab_) {
        const std::string_view t = token;
        for (size_t pos = t.find(candidate, 1); pos != std::string_view::npos;
             pos = t.find(candidate, pos + 1)) {
          if (pos < candidate.size() ||
              t.substr(pos - candidate.size(), candidate.size()) != candidate) {
            safe = false;
            break;
          }
        }
        if (!safe) break;
      }
      if (safe) {
        split_before_runs_ = true;
        split_char_ = std::string(candidate);
        break;
      }
    }
  }
  return absl::OkStatus();
}

int BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::IdToToken(int id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int>* ids) const {
  if (!split_before_runs_) {
    TokenizeWord(word, ids);
    return;
  }
  // Cut before each run of split_char_ that follows other text.
  const std::string_view sep = split_char_;
  size_t start = 0;
  for (size_t pos = word.find(sep, 1); pos != std::string_view::npos;
       pos = word.find(sep, pos + sep.size())) {
    const bool after_sep = pos >= sep.size() && word.substr(pos - sep.size(), sep.size()) == sep;
    if (!after_sep && pos > start) {
      TokenizeWord(word.substr(start, pos - start), ids);
      start = pos;
    }
  }
  TokenizeWord(word.substr(start), ids);
}

void BpeModel::TokenizeWord(std::string_view word, std::vector<int>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable && cache_.Lookup(word, ids)) return;
  const size_t first = ids->size();
  MergeWord(word, ids);
  if (cacheable) cache_.Insert(word, ids->data() + first, ids->size() - first);
}

int BpeModel::CharId(std::string_view ch, uint32_t cp) const {
  if (cp < kLowChars) return low_char_ids_[cp];
  auto it = char_ids_.find(cp);
  return it == char_ids_.end() ? -1 : it->second;
}

void BpeModel::MergeWord(std::string_view word, std::vector<int>* ids) const {
  struct Symbol {
    int id;
    int prev;  // index, -1 at the start
    int next;  // index, -1 at the end
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int id) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, false});
  };

  // Initial symbols: one per character (with prefix / suffix where configured); unknown
  // characters become their <0xXX> byte tokens, or the unknown token (consecutive ones fused
  // when fuse_unk), or are dropped when the model has neither.
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  bool pending_unk = false;
  std::string affixed;
  size_t i = 0;
  while (i < word.size()) {
    const size_t begin = i;
    const uint32_t cp = unicode::DecodeUtf8(word, &i);
    std::string_view ch = word.substr(begin, i - begin);
    int id;
    if (!affixes) {
      id = CharId(ch, cp);
    } else {
      affixed.clear();
      if (begin > 0) affixed.append(continuing_subword_prefix_);
      affixed.append(ch);
      if (i == word.size()) affixed.append(end_of_word_suffix_);
      ch = affixed;
      id = TokenToId(ch);
    }
    if (id >= 0) {
      if (pending_unk) add(unk_id_);
      pending_unk = false;
      add(id);
      continue;
    }
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [this](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      // Rust keeps a pending unknown token across byte-fallback characters.
      for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) add(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(unk_id_);

  // Merge the lowest-ranked adjacent pair first (leftmost on ties) until none is left. Queue
  // entries go stale when a neighbour merges; they are recognised and skipped on pop.
  struct Candidate {
    uint32_t rank;
    int pos;
    int new_id;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::vector<Candidate> heap;
  auto push_pair = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int p = 0; p + 1 < static_cast<int>(symbols.size()); ++p) push_pair(p);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) ids->push_back(s.id);
  }
}

}  // namespace tandem
