#include "lib/unicode/unicode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "lib/unicode/unicode_tables.h"

namespace tandem::unicode {
namespace {

using unicode_internal::CharInfoRun;

constexpr int kBlockBits = 8;
constexpr uint32_t kBlockSize = 1u << kBlockBits;
constexpr uint32_t kNumBlocks = (kMaxCodePoint + 1) >> kBlockBits;

// Two-level lookup of the 16-bit char info (layout in unicode_tables.h). Built once from the
// run-length table: the generated source stays small and a lookup is two loads. Identical
// 256-code-point blocks are shared, which keeps the table near 300 KB.
class CharInfoTable {
 public:
  CharInfoTable() {
    index_.resize(kNumBlocks);
    absl::flat_hash_map<std::string, uint16_t> seen;
    std::vector<uint16_t> block(kBlockSize);
    size_t run = 0;
    for (uint32_t b = 0; b < kNumBlocks; ++b) {
      for (uint32_t j = 0; j < kBlockSize; ++j) {
        const uint32_t cp = (b << kBlockBits) | j;
        while (run + 1 < unicode_internal::kNumCharInfoRuns &&
               unicode_internal::kCharInfoRuns[run + 1].first <= cp) {
          ++run;
        }
        block[j] = unicode_internal::kCharInfoRuns[run].info;
      }
      std::string key(reinterpret_cast<const char*>(block.data()), kBlockSize * sizeof(uint16_t));
      auto [it, inserted] = seen.emplace(std::move(key), static_cast<uint16_t>(seen.size()));
      if (inserted) blocks_.insert(blocks_.end(), block.begin(), block.end());
      index_[b] = it->second;
    }
  }

  uint16_t Get(uint32_t cp) const {
    if (cp > kMaxCodePoint) return static_cast<uint16_t>(GeneralCategory::kCn);
    return blocks_[(static_cast<uint32_t>(index_[cp >> kBlockBits]) << kBlockBits) |
                   (cp & (kBlockSize - 1))];
  }

 private:
  std::vector<uint16_t> index_;   // [kNumBlocks] block number
  std::vector<uint16_t> blocks_;  // [unique blocks * kBlockSize] char info
};

const CharInfoTable& Table() {
  static const CharInfoTable* const table = new CharInfoTable();
  return *table;
}

inline uint16_t Info(uint32_t cp) { return Table().Get(cp); }
inline int InfoCcc(uint16_t info) { return info >> 8; }
inline int InfoQuickCheck(uint16_t info) { return (info >> 6) & 3; }

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

const unicode_internal::Decomposition* FindDecomposition(
    const unicode_internal::Decomposition* table, size_t n, uint32_t cp) {
  const auto* end = table + n;
  const auto* it = std::lower_bound(
      table, end, cp,
      [](const unicode_internal::Decomposition& d, uint32_t c) { return d.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

void Decompose(uint32_t cp, bool compat, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < 0xA0) {  // Nothing below U+00A0 decomposes.
    out->push_back(cp);
    return;
  }
  if (compat) {
    if (const auto* d = FindDecomposition(unicode_internal::kCompatDecompositions,
                                          unicode_internal::kNumCompatDecompositions, cp)) {
      out->insert(out->end(), unicode_internal::kCompatDecompositionsData + d->offset,
                  unicode_internal::kCompatDecompositionsData + d->offset + d->length);
      return;
    }
  }
  if (const auto* d = FindDecomposition(unicode_internal::kCanonicalDecompositions,
                                        unicode_internal::kNumCanonicalDecompositions, cp)) {
    out->insert(out->end(), unicode_internal::kCanonicalDecompositionsData + d->offset,
                unicode_internal::kCanonicalDecompositionsData + d->offset + d->length);
    return;
  }
  out->push_back(cp);
}

// The primary composite of `a` followed by `b`, or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* begin = unicode_internal::kCompositions;
  const auto* end = begin + unicode_internal::kNumCompositions;
  const auto* it = std::lower_bound(
      begin, end, std::make_pair(a, b),
      [](const unicode_internal::Composition& c, const std::pair<uint32_t, uint32_t>& key) {
        return std::make_pair(c.first, c.second) < key;
      });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

}  // namespace

uint32_t Properties(uint32_t cp) {
  const uint16_t info = Info(cp);
  return (1u << (info & 0x1F)) | ((info & 0x20) ? kWhiteSpaceBit : 0);
}

GeneralCategory Category(uint32_t cp) { return static_cast<GeneralCategory>(Info(cp) & 0x1F); }

bool IsWhiteSpace(uint32_t cp) { return (Info(cp) & 0x20) != 0; }

int CombiningClass(uint32_t cp) { return InfoCcc(Info(cp)); }

uint32_t SimpleFold(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  const auto* begin = unicode_internal::kCaseFolds;
  const auto* end = begin + unicode_internal::kNumCaseFolds;
  const auto* it = std::lower_bound(
      begin, end, cp, [](const unicode_internal::CaseFold& f, uint32_t c) { return f.cp < c; });
  return (it != end && it->cp == cp) ? it->folded : cp;
}

const char* UnicodeVersion() { return unicode_internal::kUnicodeVersion; }

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// What the bytes at s[i] are: a valid sequence of `length` bytes; an invalid one whose maximal
// subpart (the bytes to replace with one U+FFFD) has `length` bytes; or a valid prefix of
// `length` bytes cut off by the end of `s`.
struct SequenceCheck {
  enum State { kValid, kInvalid, kTruncated } state;
  size_t length;
};

SequenceCheck CheckSequenceAt(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char c = p[i];
  if (c < 0x80) return {SequenceCheck::kValid, 1};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return {SequenceCheck::kInvalid, 1};
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return {SequenceCheck::kTruncated, k};
    const unsigned char b = p[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return {SequenceCheck::kInvalid, k};
  }
  return {SequenceCheck::kValid, need};
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const SequenceCheck check = CheckSequenceAt(s, i);
    if (check.state != SequenceCheck::kValid) return i;
    i += check.length;
  }
  return std::string_view::npos;
}

std::string ToValidUtf8(std::string_view s, bool keep_incomplete_tail) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const SequenceCheck check = CheckSequenceAt(s, i);
    if (check.state == SequenceCheck::kValid) {
      out.append(s.data() + i, check.length);
    } else if (check.state == SequenceCheck::kTruncated && keep_incomplete_tail) {
      out.append(s.data() + i, s.size() - i);
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    i += check.length;
  }
  return out;
}

namespace {

// The full algorithm (decompose, reorder, compose) on `text`, appended to `out`.
void NormalizeSpan(NormalizationForm form, std::string_view text, std::string* out) {
  const bool compose = form == NormalizationForm::kNfc || form == NormalizationForm::kNfkc;
  const bool compat = form == NormalizationForm::kNfkc || form == NormalizationForm::kNfkd;
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) Decompose(DecodeUtf8(text, &i), compat, &cps);

  // Canonical ordering: a stable sort of each run of non-starters by combining class. Runs
  // are short, so insertion sort.
  std::vector<uint8_t> ccc(cps.size());
  for (size_t k = 0; k < cps.size(); ++k) ccc[k] = cps[k] < 0x300 ? 0 : CombiningClass(cps[k]);
  for (size_t k = 1; k < cps.size(); ++k) {
    if (ccc[k] == 0) continue;
    size_t j = k;
    while (j > 0 && ccc[j - 1] > ccc[j]) {
      std::swap(ccc[j - 1], ccc[j]);
      std::swap(cps[j - 1], cps[j]);
      --j;
    }
  }

  if (compose && !cps.empty()) {
    // Canonical composition (UAX #15): a character combines with the last starter when
    // nothing between them blocks it (a starter, or a mark of the same or higher class).
    size_t starter = 0;
    int last_class = ccc[0] == 0 ? 0 : 256;
    size_t out_len = 1;
    for (size_t k = 1; k < cps.size(); ++k) {
      const uint32_t ch = cps[k];
      const int ch_class = ccc[k];
      const uint32_t composite = (ccc[starter] == 0 && (last_class < ch_class || last_class == 0))
                                     ? Compose(cps[starter], ch)
                                     : 0;
      if (composite != 0) {
        cps[starter] = composite;
        continue;
      }
      if (ch_class == 0) starter = out_len;
      last_class = ch_class;
      ccc[out_len] = static_cast<uint8_t>(ch_class);
      cps[out_len++] = ch;
    }
    cps.resize(out_len);
  }
  for (uint32_t cp : cps) AppendUtf8(cp, out);
}

}  // namespace

void Normalize(NormalizationForm form, std::string* text) {
  if (form != NormalizationForm::kNfc) {
    if (std::all_of(text->begin(), text->end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      return;  // ASCII is invariant under every form.
    }
    std::string out;
    out.reserve(text->size() + 8);
    NormalizeSpan(form, *text, &out);
    *text = std::move(out);
    return;
  }
  // NFC: only the spans around characters that fail the quick check are rewritten. A span
  // starts at the last stable starter before such a character (which it may compose with) and
  // ends before the next stable starter (quick check "yes", combining class 0), which can
  // neither reorder nor compose with anything before it.
  auto stable = [](uint32_t cp) {
    if (cp < 0x300) return true;
    const uint16_t info = Info(cp);
    return InfoCcc(info) == 0 && InfoQuickCheck(info) == 0;
  };
  const std::string_view in = *text;
  std::string out;
  size_t copied = 0;        // in[0, copied) is already in `out`
  size_t last_starter = 0;  // start of the last stable starter seen
  size_t i = 0;
  bool changed = false;
  while (i < in.size()) {
    if (static_cast<unsigned char>(in[i]) < 0x80) {
      last_starter = i++;
      continue;
    }
    const size_t begin = i;
    if (stable(DecodeUtf8(in, &i))) {
      last_starter = begin;
      continue;
    }
    const size_t span_begin = std::max(last_starter, copied);
    size_t span_end = in.size();
    while (i < in.size()) {
      const size_t b = i;
      if (stable(DecodeUtf8(in, &i))) {
        span_end = b;
        break;
      }
    }
    if (!changed) {
      out.reserve(in.size() + 16);
      changed = true;
    }
    out.append(in.substr(copied, span_begin - copied));
    NormalizeSpan(NormalizationForm::kNfc, in.substr(span_begin, span_end - span_begin), &out);
    copied = span_end;
    i = span_end;
    last_starter = span_end;
  }
  if (!changed) return;
  out.append(in.substr(copied));
  *text = std::move(out);
}

}  // namespace tandem::unicode
