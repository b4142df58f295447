#include "text/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lib/unicode/unicode.h"
#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/json_util.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/post_processor.h"
#include "text/tokenizer/pre_tokenizer.h"

namespace tandem {
namespace {

using json_util::Json;

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open %s", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrFormat("cannot read %s", path.string()));
  return ss.str();
}

// Reads `path` when it exists; "" when it does not.
absl::StatusOr<std::string> ReadOptionalFile(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::string();
  return ReadFile(path);
}

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("%s is not valid JSON: %s", what, e.what()));
  }
}

// A token named in tokenizer_config.json: a string, {"content": "..."}, or null.
absl::StatusOr<std::optional<std::string>> ConfigToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "tokenizer_config.json: %s must be a string, {\"content\": ...} or null", key));
}

// transformers' clean_up_tokenization, in its order.
std::string CleanUpTokenizationSpaces(std::string text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t last = 0;
    for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, last)) {
      out.append(text, last, pos - last);
      out.append(to);
      last = pos + from.size();
    }
    out.append(text, last);
    text = std::move(out);
  }
  return text;
}

}  // namespace

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  std::filesystem::path file(path);
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "tokenizer.json";
  auto text = ReadFile(file);
  if (!text.ok()) return text.status();

  // PREFIXtokenizer.json -> PREFIXtokenizer_config.json, PREFIXgeneration_config.json.
  const std::string name = file.filename().string();
  constexpr std::string_view kSuffix = "tokenizer.json";
  std::string prefix;
  if (name.size() >= kSuffix.size() &&
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    prefix = name.substr(0, name.size() - kSuffix.size());
  }
  auto config = ReadOptionalFile(file.parent_path() / (prefix + "tokenizer_config.json"));
  if (!config.ok()) return config.status();
  auto generation = ReadOptionalFile(file.parent_path() / (prefix + "generation_config.json"));
  if (!generation.ok()) return generation.status();

  auto tokenizer = FromJson(*text, *config, *generation);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrFormat("%s: %s", file.string(), tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view config_json,
    std::string_view generation_config_json) {
  std::unique_ptr<HfTokenizer> tokenizer(new HfTokenizer());
  absl::Status st;
  try {
    st = tokenizer->Init(tokenizer_json, config_json, generation_config_json);
  } catch (const Json::exception& e) {
    // A backstop: field access is checked, but a JSON type surprise must not escape.
    st = absl::InvalidArgumentError(absl::StrFormat("tokenizer.json: %s", e.what()));
  }
  if (!st.ok()) return st;
  return tokenizer;
}

absl::Status HfTokenizer::Init(std::string_view tokenizer_json, std::string_view config_json,
                               std::string_view generation_config_json) {
  auto root = ParseJson(tokenizer_json, "tokenizer.json");
  if (!root.ok()) return root.status();
  if (auto st = json_util::CheckObject(*root, "the top level"); !st.ok()) return st;

  auto component = [&](const char* key) -> const Json* {
    auto it = root->find(key);
    return it == root->end() || it->is_null() ? nullptr : &*it;
  };
  const Json* model = component("model");
  if (model == nullptr) return absl::InvalidArgumentError("tokenizer.json: model is missing");
  auto bpe = BpeModel::FromJson(*model);
  if (!bpe.ok()) return bpe.status();
  model_ = *std::move(bpe);

  if (const Json* j = component("normalizer")) {
    auto n = MakeNormalizer(*j, "normalizer");
    if (!n.ok()) return n.status();
    normalizer_ = *std::move(n);
  }
  if (const Json* j = component("pre_tokenizer")) {
    auto p = MakePreTokenizer(*j, "pre_tokenizer");
    if (!p.ok()) return p.status();
    pre_tokenizer_ = *std::move(p);
  }
  if (const Json* j = component("post_processor")) {
    auto p = MakePostProcessor(*j, "post_processor");
    if (!p.ok()) return p.status();
    post_processor_ = *std::move(p);
  }
  if (const Json* j = component("decoder")) {
    auto d = MakeDecoder(*j, "decoder");
    if (!d.ok()) return d.status();
    decoder_ = *std::move(d);
  }

  std::vector<AddedToken> added;
  vocab_size_ = model_->id_limit();
  if (const Json* j = component("added_tokens")) {
    if (!j->is_array())
      return absl::InvalidArgumentError("tokenizer.json: added_tokens must be an array");
    for (size_t i = 0; i < j->size(); ++i) {
      const Json& t = (*j)[i];
      const std::string where = absl::StrFormat("added_tokens[%d]", i);
      if (auto st = json_util::CheckObject(t, where); !st.ok()) return st;
      AddedToken token;
      auto id = json_util::GetInt(t, "id", where, -1);
      if (!id.ok()) return id.status();
      if (*id < 0 || *id > (1 << 30)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("tokenizer.json: %s.id must be a non-negative integer", where));
      }
      token.id = static_cast<int>(*id);
      auto content = json_util::GetString(t, "content", where);
      if (!content.ok()) return content.status();
      if (content->empty()) continue;  // ignored, as in the Rust library
      token.content = *std::move(content);
      // Defaults are those of the Rust library's AddedToken.
      for (auto [field, out, def] :
           {std::tuple<const char*, bool*, bool>{"single_word", &token.single_word, false},
            {"lstrip", &token.lstrip, false},
            {"rstrip", &token.rstrip, false},
            {"normalized", &token.normalized, true},
            {"special", &token.special, false}}) {
        auto v = json_util::GetBool(t, field, where, def);
        if (!v.ok()) return v.status();
        *out = *v;
      }
      vocab_size_ = std::max(vocab_size_, token.id + 1);
      added.push_back(std::move(token));
    }
  }
  added_ = std::make_unique<AddedVocabulary>(std::move(added), normalizer_.get());

  // tokenizer_config.json: BOS / EOS tokens and the decoding clean-up default.
  if (!config_json.empty()) {
    auto config = ParseJson(config_json, "tokenizer_config.json");
    if (!config.ok()) return config.status();
    if (!config->is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json must hold an object");
    }
    auto bos = ConfigToken(*config, "bos_token");
    if (!bos.ok()) return bos.status();
    if (bos->has_value()) {
      bos_id_ = TokenToId(**bos);
      if (bos_id_ < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tokenizer_config.json: bos_token \"%s\" is not in the vocabulary", **bos));
      }
    }
    auto eos = ConfigToken(*config, "eos_token");
    if (!eos.ok()) return eos.status();
    if (eos->has_value()) {
      const int id = TokenToId(**eos);
      if (id < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tokenizer_config.json: eos_token \"%s\" is not in the vocabulary", **eos));
      }
      eos_ids_.push_back(id);
    }
    auto cleanup =
        json_util::GetBool(*config, "clean_up_tokenization_spaces", "tokenizer_config.json", false);
    if (!cleanup.ok()) return cleanup.status();
    clean_up_tokenization_spaces_ = *cleanup;
  }
  // generation_config.json may name more EOS ids (Qwen3: <|im_end|> and <|endoftext|>).
  if (!generation_config_json.empty()) {
    auto gen = ParseJson(generation_config_json, "generation_config.json");
    if (!gen.ok()) return gen.status();
    if (gen->is_object() && gen->contains("eos_token_id")) {
      const Json& e = (*gen)["eos_token_id"];
      std::vector<Json> ids = e.is_array() ? e.get<std::vector<Json>>() : std::vector<Json>{e};
      for (const Json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size_) {
          return absl::InvalidArgumentError(
              "generation_config.json: eos_token_id must hold ids of the vocabulary");
        }
        if (std::find(eos_ids_.begin(), eos_ids_.end(), id.get<int>()) == eos_ids_.end()) {
          eos_ids_.push_back(id.get<int>());
        }
      }
    }
  }
  return absl::OkStatus();
}

const std::string* HfTokenizer::IdToToken(int id) const {
  if (const AddedToken* t = added_->Find(id)) return &t->content;
  return model_->IdToToken(id);
}

int HfTokenizer::TokenToId(std::string_view token) const {
  for (const AddedToken& t : added_->tokens()) {
    if (t.content == token) return t.id;
  }
  return model_->TokenToId(token);
}

bool HfTokenizer::IsSpecial(int id) const {
  const AddedToken* t = added_->Find(id);
  return t != nullptr && t->special;
}

std::vector<int> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (unicode::FindInvalidUtf8(text) == std::string_view::npos) {
    return EncodeValid(text, add_special_tokens);
  }
  return EncodeValid(unicode::ToValidUtf8(text), add_special_tokens);
}

absl::StatusOr<std::vector<int>> HfTokenizer::EncodeChecked(std::string_view text,
                                                            bool add_special_tokens) const {
  const size_t bad = unicode::FindInvalidUtf8(text);
  if (bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("text is not valid UTF-8 (byte offset %d)", bad));
  }
  return EncodeValid(text, add_special_tokens);
}

std::vector<int> HfTokenizer::EncodeValid(std::string_view text, bool add_special_tokens) const {
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<AddedVocabulary::Segment> segments;
  added_->Split(text, /*normalized_tokens=*/false, &segments);
  std::string normalized;
  std::vector<AddedVocabulary::Segment> inner;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    normalized.assign(text.substr(seg.begin, seg.end - seg.begin));
    if (normalizer_ != nullptr) normalizer_->Normalize(&normalized);
    const bool at_start = seg.begin == 0;
    if (!added_->has_normalized_tokens()) {
      EncodeSegment(normalized, at_start, &ids);
      continue;
    }
    inner.clear();
    added_->Split(normalized, /*normalized_tokens=*/true, &inner);
    for (const auto& sub : inner) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
      } else {
        EncodeSegment(std::string_view(normalized).substr(sub.begin, sub.end - sub.begin),
                      at_start && sub.begin == 0, &ids);
      }
    }
  }
  if (post_processor_ != nullptr) post_processor_->Process(&ids, add_special_tokens);
  return ids;
}

void HfTokenizer::EncodeSegment(std::string_view segment, bool at_start,
                                std::vector<int>* ids) const {
  if (segment.empty()) return;
  if (pre_tokenizer_ == nullptr) {
    model_->Tokenize(segment, ids);
    return;
  }
  pre_tokenizer_->PreTokenize(segment, at_start,
                              [&](std::string_view word, bool) { model_->Tokenize(word, ids); });
}

std::string HfTokenizer::Decode(std::span<const int> ids) const {
  return Decode(ids, DecodeOptions());
}

std::string HfTokenizer::Decode(std::span<const int> ids, const DecodeOptions& options) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    if (options.skip_special_tokens && IsSpecial(id)) continue;
    if (const std::string* t = IdToToken(id)) tokens.push_back(*t);
  }
  std::string text;
  if (decoder_ != nullptr) {
    decoder_->DecodeChain(&tokens);
    for (const std::string& t : tokens) text.append(t);
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text.push_back(' ');
      text.append(tokens[i]);
    }
  }
  if (options.clean_up_tokenization_spaces) text = CleanUpTokenizationSpaces(std::move(text));
  return text;
}

}  // namespace tandem
