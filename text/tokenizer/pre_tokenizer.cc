#include "text/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/regex/regex.h"
#include "lib/unicode/unicode.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/pattern.h"

namespace tandem {
namespace {

// What happens to the matched delimiters when a piece is split (the Rust library's
// SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ParseBehavior(const json_util::Json& j, std::string_view where) {
  auto name = json_util::GetString(j, "behavior", where);
  if (!name.ok()) return name.status();
  if (*name == "Removed") return SplitBehavior::kRemoved;
  if (*name == "Isolated") return SplitBehavior::kIsolated;
  if (*name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (*name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (*name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrFormat("tokenizer.json: %s.behavior \"%s\" is unknown", where, *name));
}

// Splits `piece` at `matches` (sorted, non-overlapping byte ranges) following `behavior` and
// emits the non-empty results. `invert` swaps which ranges count as delimiters.
void EmitSplits(std::string_view piece, bool at_start, const std::vector<Regex::Match>& matches,
                bool invert, SplitBehavior behavior, PieceSink emit) {
  struct Span {
    size_t begin, end;
    bool flag;  // is a delimiter on input; "remove" on output
  };
  std::vector<Span> spans;  // covers the whole piece
  size_t prev = 0;
  for (const auto& m : matches) {
    if (prev != m.begin) spans.push_back({prev, m.begin, invert});
    spans.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != piece.size()) spans.push_back({prev, piece.size(), invert});

  std::vector<Span> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      out = std::move(spans);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : spans) out.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kContiguous:
      for (const auto& s : spans) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  for (const auto& s : out) {
    if (s.flag || s.begin == s.end) continue;
    emit(piece.substr(s.begin, s.end - s.begin), at_start && s.begin == 0);
  }
}

// Each code point satisfying `pred` is one match.
template <typename Pred>
std::vector<Regex::Match> CharMatches(std::string_view piece, Pred pred) {
  std::vector<Regex::Match> matches;
  size_t i = 0;
  while (i < piece.size()) {
    const size_t begin = i;
    if (pred(unicode::DecodeUtf8(piece, &i))) matches.push_back({begin, i});
  }
  return matches;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const override {
    std::vector<Regex::Match> matches;
    pattern_.FindMatches(piece, &matches);
    EmitSplits(piece, at_start, matches, invert_, behavior_, emit);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// The GPT-2 split used by ByteLevel when use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}

  void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const override {
    std::string prefixed;
    if (add_prefix_space_ && piece.front() != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    std::string mapped;
    auto emit_mapped = [&](std::string_view sub, bool sub_at_start) {
      mapped.clear();
      byte_level::AppendMapped(sub, &mapped);
      emit(mapped, sub_at_start);
    };
    if (split_ == nullptr) {
      emit_mapped(piece, at_start);
      return;
    }
    std::vector<Regex::Match> matches;
    split_->FindAll(piece, &matches);
    EmitSplits(piece, at_start, matches, /*invert=*/false, SplitBehavior::kIsolated, emit_mapped);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> split_;  // null without use_regex
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class PrependScheme { kFirst, kNever, kAlways };

  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    size_t i = 0;
    replacement_cp_ = unicode::DecodeUtf8(replacement_, &i);
  }

  void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const override {
    std::string text;
    text.reserve(piece.size() + replacement_.size() * 4);
    const bool prepend =
        scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_start);
    if (prepend && piece.front() != ' ' && piece.substr(0, replacement_.size()) != replacement_) {
      text.append(replacement_);
    }
    for (char c : piece) {
      if (c == ' ') {
        text.append(replacement_);
      } else {
        text.push_back(c);
      }
    }
    if (!split_) {
      emit(text, at_start);
      return;
    }
    const uint32_t r = replacement_cp_;
    EmitSplits(text, at_start, CharMatches(text, [r](uint32_t cp) { return cp == r; }), false,
               SplitBehavior::kMergedWithNext, emit);
  }

 private:
  std::string replacement_;
  uint32_t replacement_cp_;
  PrependScheme scheme_;
  bool split_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits) : individual_(individual_digits) {}

  void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const override {
    // Rust's char::is_numeric: general categories Nd, Nl and No.
    auto matches = CharMatches(
        piece, [](uint32_t cp) { return (unicode::Properties(cp) & unicode::kNumberMask) != 0; });
    EmitSplits(piece, at_start, matches, false,
               individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, emit);
  }

 private:
  bool individual_;
};

// Whitespace (a regex kept, inverted) and WhitespaceSplit (White_Space removed).
class RegexOrWhitespacePreTokenizer final : public PreTokenizer {
 public:
  explicit RegexOrWhitespacePreTokenizer(std::unique_ptr<Regex> words) : words_(std::move(words)) {}

  void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const override {
    if (words_ != nullptr) {
      std::vector<Regex::Match> matches;
      words_->FindAll(piece, &matches);
      EmitSplits(piece, at_start, matches, /*invert=*/true, SplitBehavior::kRemoved, emit);
      return;
    }
    EmitSplits(piece, at_start, CharMatches(piece, unicode::IsWhiteSpace), false,
               SplitBehavior::kRemoved, emit);
  }

 private:
  std::unique_ptr<Regex> words_;  // null for WhitespaceSplit
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}

  void PreTokenize(std::string_view piece, bool at_start, PieceSink emit) const override {
    Run(0, piece, at_start, emit);
  }

 private:
  // Each step's pieces flow straight into the next step: no intermediate lists.
  void Run(size_t step, std::string_view piece, bool at_start, PieceSink emit) const {
    if (step == steps_.size()) {
      emit(piece, at_start);
      return;
    }
    steps_[step]->PreTokenize(piece, at_start, [&](std::string_view sub, bool sub_at_start) {
      Run(step + 1, sub, sub_at_start, emit);
    });
  }

  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

absl::StatusOr<std::unique_ptr<Regex>> CompileBuiltin(std::string_view pattern) {
  auto re = Regex::Compile(pattern);
  if (!re.ok()) return absl::InternalError(re.status().message());
  return re;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json_util::Json& j,
                                                               std::string_view where) {
  auto type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "Split") {
    if (!j.contains("pattern")) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer.json: %s.pattern is missing", where));
    }
    auto pattern = Pattern::FromJson(j["pattern"], absl::StrFormat("%s.pattern", where));
    if (!pattern.ok()) return pattern.status();
    auto behavior = ParseBehavior(j, where);
    if (!behavior.ok()) return behavior.status();
    auto invert = json_util::GetBool(j, "invert", where, false);
    if (!invert.ok()) return invert.status();
    return std::make_unique<SplitPreTokenizer>(*std::move(pattern), *behavior, *invert);
  }
  if (*type == "ByteLevel") {
    auto add_prefix_space = json_util::GetBool(j, "add_prefix_space", where, true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    auto use_regex = json_util::GetBool(j, "use_regex", where, true);
    if (!use_regex.ok()) return use_regex.status();
    // trim_offsets only affects offsets, which this tokenizer does not report.
    std::unique_ptr<Regex> split;
    if (*use_regex) {
      auto re = CompileBuiltin(kGpt2Pattern);
      if (!re.ok()) return re.status();
      split = *std::move(re);
    }
    return std::make_unique<ByteLevelPreTokenizer>(*add_prefix_space, std::move(split));
  }
  if (*type == "Metaspace") {
    auto replacement = json_util::GetChar(j, "replacement", where);
    if (!replacement.ok()) return replacement.status();
    auto scheme_name = json_util::GetOptionalString(j, "prepend_scheme", where);
    if (!scheme_name.ok()) return scheme_name.status();
    auto scheme = MetaspacePreTokenizer::PrependScheme::kAlways;
    if (scheme_name->has_value()) {
      if (**scheme_name == "first") {
        scheme = MetaspacePreTokenizer::PrependScheme::kFirst;
      } else if (**scheme_name == "never") {
        scheme = MetaspacePreTokenizer::PrependScheme::kNever;
      } else if (**scheme_name != "always") {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tokenizer.json: %s.prepend_scheme \"%s\" is unknown", where, **scheme_name));
      }
    }
    // Files older than prepend_scheme carry add_prefix_space instead.
    auto add_prefix_space = json_util::GetBool(j, "add_prefix_space", where, true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    if (!*add_prefix_space) scheme = MetaspacePreTokenizer::PrependScheme::kNever;
    auto split = json_util::GetBool(j, "split", where, true);
    if (!split.ok()) return split.status();
    return std::make_unique<MetaspacePreTokenizer>(*std::move(replacement), scheme, *split);
  }
  if (*type == "Digits") {
    auto individual = json_util::GetBool(j, "individual_digits", where, false);
    if (!individual.ok()) return individual.status();
    return std::make_unique<DigitsPreTokenizer>(*individual);
  }
  if (*type == "Whitespace") {
    auto re = CompileBuiltin(R"(\w+|[^\w\s]+)");
    if (!re.ok()) return re.status();
    return std::make_unique<RegexOrWhitespacePreTokenizer>(*std::move(re));
  }
  if (*type == "WhitespaceSplit") return std::make_unique<RegexOrWhitespacePreTokenizer>(nullptr);
  if (*type == "Sequence") {
    auto steps = json_util::GetSequence<PreTokenizer>(
        j, "pretokenizers", where,
        [](const json_util::Json& e, const std::string& w) { return MakePreTokenizer(e, w); });
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequencePreTokenizer>(*std::move(steps));
  }
  return absl::UnimplementedError(absl::StrFormat(
      "tokenizer.json: %s: pre-tokenizer type \"%s\" is not supported", where, *type));
}

}  // namespace tandem
