#include "text/tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/unicode/unicode.h"
#include "text/tokenizer/pattern.h"

namespace tandem {
namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalizationForm form) : form_(form) {}
  void Normalize(std::string* text) const override { unicode::Normalize(form_, text); }

 private:
  unicode::NormalizationForm form_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override { *text = pattern_.ReplaceAll(*text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

// Removes White_Space characters from the left and/or right end.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!unicode::IsWhiteSpace(unicode::DecodeUtf8(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t next = start;
        if (!unicode::IsWhiteSpace(unicode::DecodeUtf8(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const json_util::Json& j,
                                                           std::string_view where) {
  auto type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalizationForm::kNfc);
  if (*type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalizationForm::kNfd);
  if (*type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(unicode::NormalizationForm::kNfkc);
  }
  if (*type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(unicode::NormalizationForm::kNfkd);
  }
  if (*type == "Prepend") {
    auto prepend = json_util::GetString(j, "prepend", where);
    if (!prepend.ok()) return prepend.status();
    return std::make_unique<PrependNormalizer>(*std::move(prepend));
  }
  if (*type == "Replace") {
    if (!j.contains("pattern")) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer.json: %s.pattern is missing", where));
    }
    auto pattern = Pattern::FromJson(j["pattern"], absl::StrFormat("%s.pattern", where));
    if (!pattern.ok()) return pattern.status();
    auto content = json_util::GetString(j, "content", where);
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceNormalizer>(*std::move(pattern), *std::move(content));
  }
  if (*type == "Strip") {
    auto left = json_util::GetBool(j, "strip_left", where, true);
    if (!left.ok()) return left.status();
    auto right = json_util::GetBool(j, "strip_right", where, true);
    if (!right.ok()) return right.status();
    return std::make_unique<StripNormalizer>(*left, *right);
  }
  if (*type == "Sequence") {
    auto steps = json_util::GetSequence<Normalizer>(
        j, "normalizers", where,
        [](const json_util::Json& e, const std::string& w) { return MakeNormalizer(e, w); });
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceNormalizer>(*std::move(steps));
  }
  return absl::UnimplementedError(
      absl::StrFormat("tokenizer.json: %s: normalizer type \"%s\" is not supported", where, *type));
}

}  // namespace tandem
