#include "text/llama2c_tokenizer.h"

#include <cctype>
#include <cstring>
#include <queue>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "formats/mapped_file.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::Load(const std::string& path,
                                                                         int expected_vocab_size) {
  auto data = ReadFileToString(path);
  if (!data.ok()) return data.status();
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrFormat("%s: not a valid llama2.c tokenizer: %s", path, why));
  };
  const std::string& d = *data;
  if (d.size() < 4) return corrupt("shorter than its 4-byte header");
  int32_t max_len;
  std::memcpy(&max_len, d.data(), 4);
  if (max_len <= 0 || max_len > 1 << 16) return corrupt("bad max_token_length");
  auto tok = std::unique_ptr<Llama2cTokenizer>(new Llama2cTokenizer());
  size_t off = 4;
  while (off < d.size()) {
    if (expected_vocab_size > 0 && tok->vocab_size() == expected_vocab_size) break;
    if (d.size() - off < 8) return corrupt("truncated entry");
    float score;
    int32_t len;
    std::memcpy(&score, d.data() + off, 4);
    std::memcpy(&len, d.data() + off + 4, 4);
    off += 8;
    if (len < 0 || len > max_len || static_cast<size_t>(len) > d.size() - off) {
      return corrupt(absl::StrFormat("entry %d has bad length %d", tok->vocab_size(), len));
    }
    const int id = tok->vocab_size();
    tok->pieces_.emplace_back(d.data() + off, len);
    tok->scores_.push_back(score);
    tok->ids_.try_emplace(tok->pieces_.back(), id);
    off += len;
  }
  if (expected_vocab_size > 0 && tok->vocab_size() != expected_vocab_size) {
    return corrupt(
        absl::StrFormat("%d entries, the model needs %d", tok->vocab_size(), expected_vocab_size));
  }
  if (tok->vocab_size() < 3 + 256) {
    return corrupt("fewer than the 259 entries (specials and byte pieces) run.c relies on");
  }
  return tok;
}

std::vector<int> Llama2cTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int> tokens;
  if (add_special_tokens) tokens.push_back(1);
  auto lookup = [this](std::string_view s) {
    auto it = ids_.find(absl::string_view(s.data(), s.size()));
    return it == ids_.end() ? -1 : it->second;
  };
  if (!text.empty()) {
    const int space = lookup(" ");
    if (space >= 0) tokens.push_back(space);
  }
  // Code points (as run.c groups bytes: a lead byte plus up to 3 continuation bytes).
  std::string buf;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if ((ch & 0xC0) != 0x80) buf.clear();
    buf.push_back(static_cast<char>(ch));
    const bool next_is_cont =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_cont && buf.size() < 4) continue;
    const int id = lookup(buf);
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (unsigned char b : buf) tokens.push_back(b + 3);
    }
    buf.clear();
  }
  // Greedy merges by score, as run.c does them: repeatedly the adjacent pair whose merge has the
  // highest score (the leftmost among equals; only scores above -1e10). run.c rescans the whole
  // sequence per merge, O(n^2), which let one long prompt hold the router for minutes (found
  // with ingress_fuzzer); a heap of candidate pairs over a linked list makes the same merges in
  // O(n log n).
  struct Candidate {
    float score;
    int left, right;  // positions in `tokens`
    int left_id, right_id, merged_id;
  };
  auto after = [](const Candidate& a, const Candidate& b) {  // b pops first
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> heap(after);
  const int n = static_cast<int>(tokens.size());
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  std::vector<bool> alive(n, true);
  std::string merged;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    merged = pieces_[tokens[left]];
    merged += pieces_[tokens[right]];
    const int id = lookup(merged);
    if (id == -1 || !(scores_[id] > -1e10f)) return;
    heap.push({scores_[id], left, right, tokens[left], tokens[right], id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale: one side was merged away or changed since the pair was queued.
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right ||
        tokens[c.left] != c.left_id || tokens[c.right] != c.right_id) {
      continue;
    }
    tokens[c.left] = c.merged_id;
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  std::vector<int> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    if (alive[i]) out.push_back(tokens[i]);
  }
  return out;
}

std::string Llama2cTokenizer::Decode(std::span<const int> ids) const {
  std::string out;
  int prev = -1;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size()) {
      prev = id;
      continue;
    }
    if (id == 1 || id == 2) {
      prev = id;
      continue;
    }
    std::string_view piece = pieces_[id];
    if (prev == 1 && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    prev = id;
    unsigned int byte;
    if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' &&
        std::sscanf(std::string(piece).c_str(), "<0x%02X>", &byte) == 1) {
      const unsigned char b = static_cast<unsigned char>(byte);
      if (b < 0x80 && !std::isprint(b) && !std::isspace(b)) continue;  // as safe_printf
      out.push_back(static_cast<char>(b));
      continue;
    }
    out.append(piece);
  }
  return out;
}

}  // namespace tandem
