#include "text/tokenizer/decoder.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/unicode/unicode.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/pattern.h"

namespace tandem {
namespace {

std::string Replacements(size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) unicode::AppendUtf8(unicode::kReplacementChar, &out);
  return out;
}

// Maps each token's characters back to bytes (a token with a character outside the mapping is
// taken as-is) and joins everything into one string.
class ByteLevelDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& token : *tokens) {
      token_bytes.clear();
      bool all_mapped = unicode::FindInvalidUtf8(token) == std::string_view::npos;
      size_t i = 0;
      while (all_mapped && i < token.size()) {
        const int b = byte_level::CharToByte(unicode::DecodeUtf8(token, &i));
        if (b < 0) {
          all_mapped = false;
        } else {
          token_bytes.push_back(static_cast<char>(b));
        }
      }
      bytes.append(all_mapped ? token_bytes : token);
    }
    tokens->assign(1, unicode::ToValidUtf8(bytes, /*keep_incomplete_tail=*/true));
  }
};

// Turns runs of "<0xXX>" tokens into their bytes.
class ByteFallbackDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;  // bytes of the current run
    auto flush = [&](bool at_end) {
      if (pending.empty()) return;
      const size_t invalid = unicode::FindInvalidUtf8(pending);
      if (invalid == std::string_view::npos) {
        out.push_back(std::move(pending));
      } else if (at_end && unicode::ToValidUtf8(pending, true) == pending) {
        out.push_back(std::move(pending));  // only an incomplete tail: keep it for streaming
      } else {
        out.push_back(Replacements(pending.size()));  // one U+FFFD per byte, as in Rust
      }
      pending.clear();
    };
    for (std::string& token : *tokens) {
      int byte = ParseByteToken(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      flush(false);
      out.push_back(std::move(token));
    }
    flush(true);
    *tokens = std::move(out);
  }

 private:
  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // The byte of a "<0xXX>" token, or -1.
  static int ParseByteToken(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    const int hi = HexValue(t[3]), lo = HexValue(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = pattern_.ReplaceAll(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined.append(token);
    tokens->assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    const std::string_view c = content_;
    for (std::string& token : *tokens) {
      std::string_view t = token;
      for (int i = 0; i < start_ && t.substr(0, c.size()) == c; ++i) t.remove_prefix(c.size());
      for (int i = 0; i < stop_ && t.size() >= c.size() && t.substr(t.size() - c.size()) == c;
           ++i) {
        t.remove_suffix(c.size());
      }
      token = std::string(t);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

// Replacement characters become spaces, except in the first token when the pre-tokenizer
// prepended one (there it marks the start of the text and is dropped).
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_in_first)
      : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      (*tokens)[i] = Pattern::Literal(replacement_)
                         .ReplaceAll((*tokens)[i], i == 0 && drop_in_first_ ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool drop_in_first_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const json_util::Json& j,
                                                     std::string_view where) {
  auto type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (*type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (*type == "Fuse") return std::make_unique<FuseDecoder>();
  if (*type == "Replace") {
    if (!j.contains("pattern")) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer.json: %s.pattern is missing", where));
    }
    auto pattern = Pattern::FromJson(j["pattern"], absl::StrFormat("%s.pattern", where));
    if (!pattern.ok()) return pattern.status();
    auto content = json_util::GetString(j, "content", where);
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceDecoder>(*std::move(pattern), *std::move(content));
  }
  if (*type == "Strip") {
    auto content = json_util::GetChar(j, "content", where);
    if (!content.ok()) return content.status();
    auto start = json_util::GetInt(j, "start", where, 0);
    if (!start.ok()) return start.status();
    auto stop = json_util::GetInt(j, "stop", where, 0);
    if (!stop.ok()) return stop.status();
    if (*start < 0 || *stop < 0 || *start > 1 << 20 || *stop > 1 << 20) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer.json: %s: start/stop out of range", where));
    }
    return std::make_unique<StripDecoder>(*std::move(content), static_cast<int>(*start),
                                          static_cast<int>(*stop));
  }
  if (*type == "Metaspace") {
    auto replacement = json_util::GetChar(j, "replacement", where);
    if (!replacement.ok()) return replacement.status();
    auto scheme = json_util::GetOptionalString(j, "prepend_scheme", where);
    if (!scheme.ok()) return scheme.status();
    auto add_prefix_space = json_util::GetBool(j, "add_prefix_space", where, true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    const bool never = (scheme->has_value() && **scheme == "never") || !*add_prefix_space;
    return std::make_unique<MetaspaceDecoder>(*std::move(replacement), !never);
  }
  if (*type == "Sequence") {
    auto steps = json_util::GetSequence<Decoder>(
        j, "decoders", where,
        [](const json_util::Json& e, const std::string& w) { return MakeDecoder(e, w); });
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceDecoder>(*std::move(steps));
  }
  return absl::UnimplementedError(
      absl::StrFormat("tokenizer.json: %s: decoder type \"%s\" is not supported", where, *type));
}

}  // namespace tandem
