#include "text/tokenizer/post_processor.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

absl::Status Bad(std::string_view where, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("tokenizer.json: %s: %s", where, what));
}

// The "single" template as a list of items: a run of special-token ids, or the sequence.
class TemplateProcessor final : public PostProcessor {
 public:
  struct Item {
    bool is_sequence;
    std::vector<int> ids;  // special token ids when !is_sequence
  };
  explicit TemplateProcessor(std::vector<Item> items) : items_(std::move(items)) {}

  void Process(std::vector<int>* ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int> out;
    out.reserve(ids->size() + 8);
    for (const Item& item : items_) {
      if (item.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    *ids = std::move(out);
  }

 private:
  std::vector<Item> items_;
};

class NoOpProcessor final : public PostProcessor {
 public:
  void Process(std::vector<int>*, bool) const override {}
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void Process(std::vector<int>* ids, bool add_special_tokens) const override {
    for (const auto& step : steps_) step->Process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> MakeTemplate(const json_util::Json& j,
                                                            std::string_view where) {
  // special_tokens: {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}, ...}
  absl::flat_hash_map<std::string, std::vector<int>> specials;
  if (auto it = j.find("special_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Bad(where, "special_tokens must be an object");
    for (auto st = it->begin(); st != it->end(); ++st) {
      const auto& ids = st.value().find("ids");
      if (!st.value().is_object() || ids == st.value().end() || !ids->is_array()) {
        return Bad(where, absl::StrFormat("special_tokens[\"%s\"].ids must be an array", st.key()));
      }
      std::vector<int> v;
      for (const auto& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 30)) {
          return Bad(where, absl::StrFormat("special_tokens[\"%s\"].ids: bad id", st.key()));
        }
        v.push_back(id.get<int>());
      }
      specials[st.key()] = std::move(v);
    }
  }
  auto special = [&](const std::string& name) -> absl::StatusOr<std::vector<int>> {
    auto it = specials.find(name);
    if (it == specials.end()) {
      return Bad(where, absl::StrFormat("template uses \"%s\", missing from special_tokens", name));
    }
    return it->second;
  };

  auto single = j.find("single");
  if (single == j.end()) return Bad(where, "single is missing");
  std::vector<TemplateProcessor::Item> items;
  if (single->is_string()) {
    // The string form: "[CLS] $A [SEP]", with optional ":type_id" suffixes.
    const std::string spec = single->get<std::string>();
    for (size_t begin = 0; begin < spec.size();) {
      size_t end = spec.find(' ', begin);
      if (end == std::string::npos) end = spec.size();
      const std::string_view piece = std::string_view(spec).substr(begin, end - begin);
      begin = end + 1;
      if (piece.empty()) continue;
      std::string name(piece.substr(
          0, piece.rfind(':') == std::string_view::npos ? piece.size() : piece.rfind(':')));
      if (name == "$" || name == "$A" || name == "$0") {
        items.push_back({true, {}});
      } else if (name.size() > 1 && name[0] == '$') {
        return Bad(where, absl::StrFormat("single template refers to \"%s\"", name));
      } else {
        auto ids = special(name);
        if (!ids.ok()) return ids.status();
        items.push_back({false, *std::move(ids)});
      }
    }
  } else if (single->is_array()) {
    for (const auto& piece : *single) {
      if (piece.is_object() && piece.contains("Sequence")) {
        items.push_back({true, {}});
      } else if (piece.is_object() && piece.contains("SpecialToken") &&
                 piece["SpecialToken"].is_object() && piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        auto ids = special(piece["SpecialToken"]["id"].get<std::string>());
        if (!ids.ok()) return ids.status();
        items.push_back({false, *std::move(ids)});
      } else {
        return Bad(where, "single template items must be {Sequence} or {SpecialToken}");
      }
    }
  } else {
    return Bad(where, "single must be a string or an array");
  }
  return std::make_unique<TemplateProcessor>(std::move(items));
}

// Bert ("cls", "sep") and Roberta ("cls", "sep"): [cls] A [sep], each given as [token, id].
absl::StatusOr<std::unique_ptr<PostProcessor>> MakeClsSep(const json_util::Json& j,
                                                          std::string_view where) {
  std::vector<TemplateProcessor::Item> items;
  for (const char* field : {"cls", "sep"}) {
    auto it = j.find(field);
    if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
      return Bad(where, absl::StrFormat("%s must be [token, id]", field));
    }
    items.push_back({false, {(*it)[1].get<int>()}});
    if (std::string_view(field) == "cls") items.push_back({true, {}});
  }
  return std::make_unique<TemplateProcessor>(std::move(items));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const json_util::Json& j,
                                                                 std::string_view where) {
  auto type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "TemplateProcessing") return MakeTemplate(j, where);
  // ByteLevel only trims offsets, which this tokenizer does not report.
  if (*type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (*type == "BertProcessing" || *type == "RobertaProcessing") return MakeClsSep(j, where);
  if (*type == "Sequence") {
    auto steps = json_util::GetSequence<PostProcessor>(
        j, "processors", where,
        [](const json_util::Json& e, const std::string& w) { return MakePostProcessor(e, w); });
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceProcessor>(*std::move(steps));
  }
  return absl::UnimplementedError(absl::StrFormat(
      "tokenizer.json: %s: post-processor type \"%s\" is not supported", where, *type));
}

}  // namespace tandem
