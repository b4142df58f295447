#include "structured/token_mask.h"

#include <algorithm>

#include "kernels/step_progress.h"

namespace tandem::structured {
namespace {

// Whether `s` is whole UTF-8 characters with no quote, backslash or control byte: text that may
// stand anywhere inside a JSON string, in one piece. Lead and continuation ranges as in
// JsonMatcher (no overlong forms, no surrogates, nothing past U+10FFFF).
bool PlainStringContent(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == '"' || c == '\\') return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    int more = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      more = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      more = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      more = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + more >= s.size()) return false;
    for (int k = 1; k <= more; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) return false;
    }
    i += more + 1;
  }
  return true;
}

}  // namespace

TokenMask::TokenMask(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  for (int id = 0; id < static_cast<int>(bytes_.size()); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(b[0])].push_back(id);
    (PlainStringContent(b) ? plain_ : other_).push_back(id);
  }
}

std::string TokenMask::ForcedText(const JsonMatcher& state, unsigned char first) {
  std::string forced(1, static_cast<char>(first));
  JsonMatcher m = state;
  m.Feed(first);
  while (forced.size() < kMaxForced && !m.Complete() && !m.Done()) {
    int next = -1;
    int count = 0;
    for (int b = 0; b < 256 && count < 2; ++b) {
      JsonMatcher trial = m;
      if (trial.Feed(static_cast<unsigned char>(b))) {
        next = b;
        ++count;
      }
    }
    if (count != 1) break;
    forced.push_back(static_cast<char>(next));
    m.Feed(static_cast<unsigned char>(next));
  }
  return forced;
}

void TokenMask::KeepForcedTokens(const JsonMatcher& state, unsigned char first,
                                 std::vector<uint8_t>* allowed) const {
  const std::string forced = ForcedText(state, first);
  if (forced.size() < 2) return;
  const std::vector<int>& group = by_first_byte_[first];
  int best = -1;
  size_t best_size = 0;
  for (int id : group) {
    const std::string& t = bytes_[id];
    if ((*allowed)[id] && t.size() <= forced.size() && t.size() > best_size &&
        forced.compare(0, t.size(), t) == 0) {
      best = id;
      best_size = t.size();
    }
  }
  if (best < 0) return;
  for (int id : group) {
    const std::string& t = bytes_[id];
    const bool covers = t.size() > forced.size() && t.compare(0, forced.size(), forced) == 0;
    if (id != best && !covers) (*allowed)[id] = 0;
  }
}

bool TokenMask::Advance(JsonMatcher* state, int id) const {
  if (id < 0 || id >= vocab_size() || bytes_[id].empty()) return false;
  return state->Feed(bytes_[id]);
}

void TokenMask::Allowed(const JsonMatcher& state, std::span<const int> eos_ids,
                        std::vector<uint8_t>* allowed) const {
  allowed->assign(bytes_.size(), 0);
  auto set_eos = [&](uint8_t value) {
    for (int id : eos_ids) {
      if (id >= 0 && id < vocab_size()) (*allowed)[id] = value;
    }
  };
  if (state.Done()) return set_eos(1);
  bool any = false;
  JsonMatcher trial = state;
  if (state.InFreeString()) {
    for (int id : plain_) (*allowed)[id] = 1;
    any = !plain_.empty();
    for (size_t i = 0; i < other_.size(); ++i) {
      const int id = other_[i];
      trial = state;
      if (trial.Feed(bytes_[id])) {
        (*allowed)[id] = 1;
        any = true;
      }
      if (i % 1024 == 1023) StepProgress::NoteHere();
    }
  } else {
    JsonMatcher first = state;
    int first_bytes = 0;  // bytes that begin an allowed token
    int only = -1;
    for (int b = 0; b < 256; ++b) {
      const std::vector<int>& group = by_first_byte_[b];
      if (group.empty()) continue;
      first = state;
      if (!first.Feed(static_cast<unsigned char>(b))) continue;
      bool any_here = false;
      for (int id : group) {
        trial = first;
        if (trial.Feed(std::string_view(bytes_[id]).substr(1))) {
          (*allowed)[id] = 1;
          any_here = true;
        }
      }
      if (any_here) {
        any = true;
        ++first_bytes;
        only = b;
      }
      StepProgress::NoteHere();  // a wide pattern's mask is long work, not a wedged step
    }
    if (first_bytes == 1 && !state.Complete()) KeepForcedTokens(state, only, allowed);
  }
  // EOS ends the text: allowed where the value is complete (or nothing else can come), never
  // as content.
  set_eos(state.Complete() || !any ? 1 : 0);
}

}  // namespace tandem::structured
