#include "text/gguf_tokenizer.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// std::map-backed objects: a vocabulary of 10^5 keys in an ordered_json (linear key search)
// would take seconds to build.
using Json = nlohmann::json;

// tokenizer.ggml.token_type values.
constexpr int kControl = 3;
constexpr int kUserDefined = 4;

constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", false},
          {"use_regex", use_regex}};
}
Json Split(const char* regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

// The pre-tokenizer that tokenizer.ggml.pre `name` stands for.
absl::StatusOr<Json> Gpt2PreTokenizer(const GgufFile& f, const std::string& name) {
  if (name == "default" || name == "gpt-2") return ByteLevel(true);
  if (name == "smollm") {
    return Json{
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, ByteLevel(true)}}};
  }
  if (name == "llama-bpe" || name == "llama3") {
    return Json{{"type", "Sequence"}, {"pretokenizers", {Split(kLlama3Regex), ByteLevel(false)}}};
  }
  if (name == "qwen2") {
    return Json{{"type", "Sequence"}, {"pretokenizers", {Split(kQwen2Regex), ByteLevel(false)}}};
  }
  return absl::UnimplementedError(absl::StrFormat(
      "%s: tokenizer.ggml.pre \"%s\" (Tandem knows default, gpt-2, smollm, llama-bpe and qwen2)",
      f.path(), name));
}

// sentencepiece merges from scores: every split of a token into two tokens is a merge, ranked by
// the merged token's score (highest first), then by the pieces' ids.
Json MergesFromScores(const std::vector<std::string>& tokens, const std::vector<double>& scores) {
  std::unordered_map<std::string, int> id;
  for (size_t i = 0; i < tokens.size(); ++i) id.emplace(tokens[i], static_cast<int>(i));
  std::vector<std::tuple<double, int, int, int>> merges;  // -score, merged, left, right
  for (size_t m = 0; m < tokens.size(); ++m) {
    const std::string& t = tokens[m];
    for (size_t cut = 1; cut < t.size(); ++cut) {
      auto l = id.find(t.substr(0, cut));
      auto r = id.find(t.substr(cut));
      if (l != id.end() && r != id.end()) {
        merges.emplace_back(-scores[m], static_cast<int>(m), l->second, r->second);
      }
    }
  }
  std::sort(merges.begin(), merges.end());
  Json out = Json::array();
  for (const auto& [score, merged, l, r] : merges)
    out.push_back(Json::array({tokens[l], tokens[r]}));
  return out;
}

// The added_tokens entries: every control and user-defined token. A sentencepiece ("llama")
// vocabulary's user-defined tokens are matched in the text as written, before spaces become
// U+2581 (as llama.cpp matches them: Gemma's "  " is two spaces, never a "▁▁" typed in the
// text); a byte-level one's in the normalized text.
Json AddedTokens(const std::vector<std::string>& tokens, const std::vector<double>& types,
                 bool spm) {
  const int n = static_cast<int>(tokens.size());
  Json added = Json::array();
  for (int i = 0; i < n; ++i) {
    const int type = static_cast<int>(types[i]);
    if (type != kControl && type != kUserDefined) continue;
    added.push_back({{"id", i},
                     {"content", tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", type == kUserDefined && !spm},
                     {"special", type == kControl}});
  }
  return added;
}

// Writes the normalizer, pre-tokenizer, decoder and model of a sentencepiece ("llama")
// vocabulary into `j`; `unk` is the unknown token's id or -1.
absl::Status AddSpmModel(const GgufFile& f, const std::vector<std::string>& tokens,
                         const Json& vocab, int unk, bool add_space_prefix, Json* j) {
  const GgufValue* scores = f.Find("tokenizer.ggml.scores");
  if (scores == nullptr || scores->numbers.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tokenizer.ggml.scores must have one score per token", f.path()));
  }
  Json normalizers = Json::array();
  if (add_space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back(
      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  (*j)["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
  (*j)["pre_tokenizer"] = nullptr;
  Json decoders =
      Json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}});
  if (add_space_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  (*j)["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  (*j)["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", unk >= 0 ? Json(tokens[unk]) : Json(nullptr)},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", true},
                   {"byte_fallback", true},
                   {"vocab", vocab},
                   {"merges", MergesFromScores(tokens, scores->numbers)}};
  return absl::OkStatus();
}

// Writes the normalizer, pre-tokenizer, decoder and model of a byte-level BPE ("gpt2")
// vocabulary into `j`.
absl::Status AddGpt2Model(const GgufFile& f, const Json& vocab, Json* j) {
  const GgufValue* merges = f.Find("tokenizer.ggml.merges");
  if (merges == nullptr || merges->element_type != GgufType::kString) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: a gpt2 tokenizer needs tokenizer.ggml.merges", f.path()));
  }
  auto pre_name = f.String("tokenizer.ggml.pre");
  const std::string name = pre_name.ok() ? *pre_name : "default";
  auto pre = Gpt2PreTokenizer(f, name);
  if (!pre.ok()) return pre.status();
  // Qwen2's and Qwen3's own tokenizer.json normalise the text to NFC before the split, and so
  // does the tokenizer transformers builds from such a GGUF; llama.cpp does not (its ids differ
  // from the model's on text that is not in NFC).
  (*j)["normalizer"] = name == "qwen2" ? Json{{"type", "NFC"}} : Json(nullptr);
  (*j)["pre_tokenizer"] = *pre;
  (*j)["decoder"] = ByteLevel(true);
  Json merge_list = Json::array();
  for (const std::string& m : merges->strings) merge_list.push_back(m);
  (*j)["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", ""},
                   {"end_of_word_suffix", ""},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"vocab", vocab},
                   {"merges", merge_list}};
  return absl::OkStatus();
}

// The post-processor: BOS / EOS around a single sequence, as the metadata asks (ids of -1: none).
Json PostProcessor(const std::vector<std::string>& tokens, bool spm, bool add_bos, int bos,
                   bool add_eos, int eos) {
  Json single = Json::array(), special = Json::object();
  auto special_token = [&](int id) {
    single.push_back({{"SpecialToken", {{"id", tokens[id]}, {"type_id", 0}}}});
    special[tokens[id]] = {{"id", tokens[id]}, {"ids", {id}}, {"tokens", {tokens[id]}}};
  };
  if (add_bos && bos >= 0) special_token(bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos && eos >= 0) special_token(eos);
  Json pair = single;
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  const Json templ = {{"type", "TemplateProcessing"},
                      {"single", single},
                      {"pair", pair},
                      {"special_tokens", special}};
  return spm ? templ
             : Json{{"type", "Sequence"}, {"processors", Json::array({ByteLevel(false), templ})}};
}

}  // namespace

absl::StatusOr<GgufTokenizerFiles> GgufTokenizer(const GgufFile& f) {
  auto model = f.String("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  const GgufValue* tokens_v = f.Find("tokenizer.ggml.tokens");
  if (tokens_v == nullptr || tokens_v->type != GgufType::kArray ||
      tokens_v->element_type != GgufType::kString || tokens_v->strings.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tokenizer.ggml.tokens must be an array of strings", f.path()));
  }
  const std::vector<std::string>& tokens = tokens_v->strings;
  const int n = static_cast<int>(tokens.size());
  std::vector<double> types(n, 1);
  if (const GgufValue* t = f.Find("tokenizer.ggml.token_type")) {
    if (t->numbers.size() != tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: tokenizer.ggml.token_type has %d entries for %d tokens", f.path(),
                          t->numbers.size(), n));
    }
    types = t->numbers;
  }
  auto token_id = [&](const char* key) -> absl::StatusOr<int> {
    auto v = f.Int(key, -1);
    if (!v.ok()) return v.status();
    if (*v < -1 || *v >= n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s %d is not a token id", f.path(), key, *v));
    }
    return static_cast<int>(*v);
  };
  auto bos = token_id("tokenizer.ggml.bos_token_id");
  auto eos = token_id("tokenizer.ggml.eos_token_id");
  auto unk = token_id("tokenizer.ggml.unknown_token_id");
  for (const auto* v : {&bos, &eos, &unk}) {
    if (!v->ok()) return v->status();
  }
  const bool spm = *model == "llama";
  if (!spm && *model != "gpt2") {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: tokenizer.ggml.model \"%s\" (Tandem reads gpt2 and llama)", f.path(), *model));
  }
  auto add_bos = f.Bool("tokenizer.ggml.add_bos_token", spm);
  auto add_eos = f.Bool("tokenizer.ggml.add_eos_token", false);
  auto add_space_prefix = f.Bool("tokenizer.ggml.add_space_prefix", true);
  for (const auto* v : {&add_bos, &add_eos, &add_space_prefix}) {
    if (!v->ok()) return v->status();
  }

  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = AddedTokens(tokens, types, spm);
  Json vocab = Json::object();
  for (int i = 0; i < n; ++i) vocab[tokens[i]] = i;
  const absl::Status model_status =
      spm ? AddSpmModel(f, tokens, vocab, *unk, *add_space_prefix, &j) : AddGpt2Model(f, vocab, &j);
  if (!model_status.ok()) return model_status;
  j["post_processor"] = PostProcessor(tokens, spm, *add_bos, *bos, *add_eos, *eos);

  Json config;
  config["add_bos_token"] = *add_bos;
  config["add_eos_token"] = *add_eos;
  if (*bos >= 0) config["bos_token"] = tokens[*bos];
  if (*eos >= 0) config["eos_token"] = tokens[*eos];
  if (*unk >= 0) config["unk_token"] = tokens[*unk];
  config["clean_up_tokenization_spaces"] = false;
  if (auto t = f.String("tokenizer.chat_template"); t.ok()) config["chat_template"] = *t;
  config["tokenizer_class"] = spm ? "LlamaTokenizerFast" : "GPT2TokenizerFast";
  // Tokens, the template and the special tokens must be UTF-8 text (byte tokens are spelled
  // <0xNN>, byte-level vocabularies map bytes to printable characters).
  try {
    return GgufTokenizerFiles{j.dump(), config.dump(2)};
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the tokenizer metadata (tokenizer.ggml.tokens, tokenizer.chat_template) is not "
        "valid UTF-8 (%s)",
        f.path(), e.what()));
  }
}

}  // namespace tandem
