// HfTokenizer against the reference vectors of ../shared/testdata/tokenizers (made with
// transformers.js and cross-checked with the Rust `tokenizers` library), plus round-trip,
// streaming and malformed-input tests.
#include "text/tokenizer/hf_tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/unicode/unicode.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

const std::string kDataDir = std::string(TANDEM_SHARED_DIR) + "/testdata/tokenizers/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loaded once per tokenizer: loading Qwen3's 11 MB file for every test would dominate.
const HfTokenizer& Get(const std::string& name) {
  static auto* const cache = new std::map<std::string, std::unique_ptr<HfTokenizer>>();
  auto& slot = (*cache)[name];
  if (slot == nullptr) {
    auto t = HfTokenizer::Load(kDataDir + name + ".tokenizer.json");
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      std::abort();
    }
    slot = *std::move(t);
  }
  return *slot;
}

std::vector<int> Ids(const Json& j) { return j.get<std::vector<int>>(); }

std::string Escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

class VectorTest : public testing::TestWithParam<std::string> {};

TEST_P(VectorTest, MatchesReference) {
  const HfTokenizer& tok = Get(GetParam());
  const Json vectors = Json::parse(ReadFile(kDataDir + GetParam() + ".vectors.json"));
  ASSERT_TRUE(vectors.is_array());
  ASSERT_GT(vectors.size(), 50u);
  int checked = 0;
  for (const Json& v : vectors) {
    // Texts may hold NUL: take them with their byte length.
    const std::string text = v["text"].get<std::string>();
    ASSERT_EQ(text.size(), v["utf8_len"].get<size_t>()) << v["id"];
    SCOPED_TRACE(v["id"].get<std::string>() + ": \"" + Escaped(text) + "\"");
    const std::vector<int> ids = tok.Encode(text, /*add_special_tokens=*/false);
    EXPECT_EQ(ids, Ids(v["ids"]));
    if (!v["ids_with_special"].is_null()) {
      EXPECT_EQ(tok.Encode(text, /*add_special_tokens=*/true), Ids(v["ids_with_special"]));
      EXPECT_EQ(tok.Decode(Ids(v["ids_with_special"])),
                v["decoded_with_special"].get<std::string>());
    }
    EXPECT_EQ(tok.Decode(Ids(v["ids"])), v["decoded"].get<std::string>());
    HfTokenizer::DecodeOptions cleanup;
    cleanup.clean_up_tokenization_spaces = tok.clean_up_tokenization_spaces();
    EXPECT_EQ(tok.Decode(Ids(v["ids"]), cleanup), v["decoded_cleanup"].get<std::string>());
    // The token strings too: they pin down which vocabulary entry each id came from.
    const auto tokens = v["tokens"].get<std::vector<std::string>>();
    ASSERT_EQ(tokens.size(), v["ids"].size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string* t = tok.IdToToken(v["ids"][i].get<int>());
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(*t, tokens[i]);
    }
    if (v["roundtrip"].get<bool>()) {
      EXPECT_EQ(tok.Decode(ids), text);
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(vectors.size()));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, VectorTest, testing::Values("qwen3", "mistral"));

// Feeds `ids` one at a time through IncrementalDecoder; returns the concatenated output.
std::string Stream(const Tokenizer& tok, const std::vector<int>& prompt,
                   const std::vector<int>& ids) {
  IncrementalDecoder decoder(&tok, prompt);
  std::string out;
  for (int id : ids) {
    const std::string piece = decoder.Add(id);
    // Nothing streamed may end inside a UTF-8 character.
    EXPECT_EQ(CompleteUtf8Prefix(piece), piece.size());
    out += piece;
  }
  return out + decoder.Flush();
}

TEST_P(VectorTest, StreamingDecodeEqualsFullDecode) {
  const HfTokenizer& tok = Get(GetParam());
  const Json vectors = Json::parse(ReadFile(kDataDir + GetParam() + ".vectors.json"));
  for (const Json& v : vectors) {
    SCOPED_TRACE(v["id"].get<std::string>());
    const std::vector<int> ids = Ids(v["ids"]);
    EXPECT_EQ(Stream(tok, {}, ids), tok.Decode(ids));
  }
}

// Random text mixing scripts, marks, whitespace, controls and astral characters.
std::string RandomText(std::mt19937& rng, bool allow_metaspace_char) {
  static constexpr std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x20, 0x7E},       {0x09, 0x0D},       {0x00, 0x1F},     {0xA0, 0x24F},    {0x300, 0x36F},
      {0x370, 0x52F},     {0x590, 0x6FF},     {0x900, 0x97F},   {0x1100, 0x11FF}, {0x2000, 0x206F},
      {0x3000, 0x30FF},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3}, {0xE000, 0xF8FF}, {0xFB00, 0xFFFD},
      {0x1F300, 0x1F6FF}, {0x10000, 0x10FFFF}};
  std::uniform_int_distribution<int> length(0, 40);
  std::uniform_int_distribution<size_t> range(0, std::size(kRanges) - 1);
  std::string s;
  const int n = length(rng);
  for (int i = 0; i < n; ++i) {
    const auto [lo, hi] = kRanges[range(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp == 0x2581 && !allow_metaspace_char) cp = ' ';
    unicode::AppendUtf8(cp, &s);
  }
  return s;
}

TEST(HfTokenizerTest, RoundTripRandomUnicode) {
  std::mt19937 rng(20240611);
  const HfTokenizer& qwen = Get("qwen3");
  const HfTokenizer& mistral = Get("mistral");
  for (int i = 0; i < 2000; ++i) {
    const std::string text = RandomText(rng, /*allow_metaspace_char=*/false);
    SCOPED_TRACE(Escaped(text));
    // Qwen3 normalizes to NFC; its byte-level BPE then loses nothing.
    std::string nfc = text;
    unicode::Normalize(unicode::NormalizationForm::kNfc, &nfc);
    const std::vector<int> q = qwen.Encode(text, false);
    ASSERT_EQ(qwen.Decode(q), nfc);
    // Mistral: spaces become U+2581 and back, byte fallback covers everything else.
    const std::vector<int> m = mistral.Encode(text, false);
    ASSERT_EQ(mistral.Decode(m), text);
    for (int id : q) ASSERT_LT(id, qwen.vocab_size());
    for (int id : m) ASSERT_LT(id, mistral.vocab_size());
    if (i % 10 == 0) {
      EXPECT_EQ(Stream(qwen, {}, q), nfc);
      EXPECT_EQ(Stream(mistral, {}, m), text);
    }
  }
}

TEST(HfTokenizerTest, StreamingAfterAPrompt) {
  for (const char* name : {"qwen3", "mistral"}) {
    const HfTokenizer& tok = Get(name);
    const std::vector<int> prompt = tok.Encode("Question: what is 🚀? Answer:", true);
    const std::vector<int> answer = tok.Encode(" It is a rocket 🚀, 火箭, ракета.", false);
    std::vector<int> all = prompt;
    all.insert(all.end(), answer.begin(), answer.end());
    const std::string full = tok.Decode(all);
    const std::string before = tok.Decode(prompt);
    ASSERT_EQ(full.compare(0, before.size(), before), 0) << name;
    EXPECT_EQ(Stream(tok, prompt, answer), full.substr(before.size())) << name;
  }
}

TEST(HfTokenizerTest, SpecialTokensAndConfig) {
  const HfTokenizer& qwen = Get("qwen3");
  EXPECT_EQ(qwen.bos_id(), -1);
  EXPECT_EQ(qwen.eos_ids(), std::vector<int>{151645});  // <|im_end|>
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_EQ(qwen.TokenToId("<|im_start|>"), 151644);
  EXPECT_TRUE(qwen.IsSpecial(151644));
  const std::vector<int> ids = qwen.Encode("<|im_start|>user\nHi<|im_end|>", false);
  HfTokenizer::DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(qwen.Decode(ids, skip), "user\nHi");

  const HfTokenizer& mistral = Get("mistral");
  EXPECT_EQ(mistral.bos_id(), 1);
  EXPECT_EQ(mistral.eos_ids(), std::vector<int>{2});
  EXPECT_EQ(mistral.vocab_size(), 32000);
  EXPECT_EQ(mistral.Encode("Hi", true).front(), 1);
}

TEST(HfTokenizerTest, InvalidUtf8Input) {
  const HfTokenizer& tok = Get("qwen3");
  const std::string bad = "ok \xFF\xFE then \xE4\xB8";
  auto checked = tok.EncodeChecked(bad, false);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(checked.status().message().find("offset 3"), std::string_view::npos);
  // The interface method cannot fail: it encodes the text with U+FFFD in place of bad bytes.
  EXPECT_EQ(tok.Decode(tok.Encode(bad, false)), unicode::ToValidUtf8(bad));
  EXPECT_TRUE(Get("mistral").EncodeChecked(std::string("a\0b", 3), false).ok());
}

TEST(HfTokenizerTest, LoadFromDirectoryAndErrors) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "hf_tok_dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDataDir + "mistral.tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto t = HfTokenizer::Load(dir.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("Hello world", false), (std::vector<int>{22557, 1526}));
  EXPECT_EQ((*t)->bos_id(), -1);  // no tokenizer_config.json there

  auto missing = HfTokenizer::Load((dir / "nope").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);

  // A truncated real file is an error, never a crash.
  const std::string full = ReadFile(kDataDir + "mistral.tokenizer.json");
  for (size_t cut : {size_t{0}, size_t{1}, full.size() / 3, full.size() - 2}) {
    EXPECT_FALSE(HfTokenizer::FromJson(full.substr(0, cut)).ok()) << cut;
  }
}

// A small tokenizer.json with the given model / components, for the behaviours the real files
// do not exercise.
std::string TinyTokenizer(const Json& model, const Json& extra = Json::object()) {
  Json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", Json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder", nullptr},
            {"model", model}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j.dump();
}

Json TinyBpe(const Json& vocab, const Json& merges) {
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
}

absl::StatusCode LoadError(const std::string& json) {
  auto t = HfTokenizer::FromJson(json);
  return t.ok() ? absl::StatusCode::kOk : t.status().code();
}

TEST(HfTokenizerTest, MalformedFiles) {
  const Json model = TinyBpe({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b"});
  EXPECT_TRUE(HfTokenizer::FromJson(TinyTokenizer(model)).ok());

  using absl::StatusCode;
  EXPECT_EQ(LoadError("not json"), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError("[1, 2]"), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError("{}"), StatusCode::kInvalidArgument);  // no model
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", "zero"}}, Json::array()))),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", 0}}, {"a c"}))),
            StatusCode::kInvalidArgument);  // merge of an unknown token
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", 0}, {"b", 1}}, {"a b"}))),
            StatusCode::kInvalidArgument);  // merged token missing
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", 0}}, {"a b c"}))), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", 0}}, {42}))), StatusCode::kInvalidArgument);
  // Found by tokenizer_json_fuzzer: one huge id made the loader allocate ~32 GB for its dense
  // id -> token table. Ids may leave at most 65536 holes.
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", 0}, {"b", 1000000000}}, Json::array()))),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(TinyBpe({{"a", 0}, {"b", 65538}}, Json::array()))),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      HfTokenizer::FromJson(TinyTokenizer(TinyBpe({{"a", 0}, {"b", 65537}}, Json::array()))).ok());
  EXPECT_EQ(LoadError(TinyTokenizer({{"type", "Unigram"}, {"vocab", Json::array()}})),
            StatusCode::kUnimplemented);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"normalizer", {{"type", "Lowercase"}}}})),
            StatusCode::kUnimplemented);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"pre_tokenizer", {{"type", "Bogus"}}}})),
            StatusCode::kUnimplemented);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"decoder", {{"type", "CTC"}}}})),
            StatusCode::kUnimplemented);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"post_processor", {{"kind", "x"}}}})),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"pre_tokenizer",
                                             {{"type", "Split"},
                                              {"pattern", {{"Regex", "(a"}}},
                                              {"behavior", "Isolated"},
                                              {"invert", false}}}})),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"pre_tokenizer",
                                             {{"type", "Split"},
                                              {"pattern", {{"Regex", "a"}}},
                                              {"behavior", "Sideways"},
                                              {"invert", false}}}})),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"added_tokens", {{{"id", "x"}, {"content", "y"}}}}})),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadError(TinyTokenizer(model, {{"decoder", {{"type", "Strip"}, {"content", "ab"}}}})),
            StatusCode::kInvalidArgument);
  auto bad_config = HfTokenizer::FromJson(TinyTokenizer(model), R"({"bos_token": "<s>"})");
  EXPECT_EQ(bad_config.status().code(), StatusCode::kInvalidArgument);

  // Every prefix of a small valid file fails cleanly.
  const std::string small = TinyTokenizer(model);
  for (size_t cut = 0; cut < small.size(); cut += 7) {
    EXPECT_FALSE(HfTokenizer::FromJson(small.substr(0, cut)).ok()) << cut;
  }
}

std::vector<int> EncodeWith(const std::string& json, std::string_view text) {
  auto t = HfTokenizer::FromJson(json);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? (*t)->Encode(text, false) : std::vector<int>{};
}

TEST(HfTokenizerTest, BpeModelOptions) {
  using Ids = std::vector<int>;
  // Unknown characters: fused into one <unk> or one each.
  Json unk = TinyBpe({{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}}, {"a b"});
  unk["unk_token"] = "<unk>";
  unk["fuse_unk"] = true;
  EXPECT_EQ(EncodeWith(TinyTokenizer(unk), "abxyb"), (Ids{3, 0, 2}));
  unk["fuse_unk"] = false;
  EXPECT_EQ(EncodeWith(TinyTokenizer(unk), "abxyb"), (Ids{3, 0, 0, 2}));
  // Without an unk token an unknown character is dropped.
  EXPECT_EQ(EncodeWith(TinyTokenizer(TinyBpe({{"a", 0}}, Json::array())), "axa"), (Ids{0, 0}));
  // Byte fallback.
  Json bytes = TinyBpe({{"<0x78>", 0}, {"a", 1}}, Json::array());
  bytes["byte_fallback"] = true;
  EXPECT_EQ(EncodeWith(TinyTokenizer(bytes), "xa"), (Ids{0, 1}));
  // continuing_subword_prefix: the merge of "a" and "##b" is "ab".
  Json prefix = TinyBpe({{"a", 0}, {"##b", 1}, {"ab", 2}, {"##c", 3}},
                        Json::array({Json::array({"a", "##b"})}));
  prefix["continuing_subword_prefix"] = "##";
  EXPECT_EQ(EncodeWith(TinyTokenizer(prefix), "abc"), (Ids{2, 3}));
  // end_of_word_suffix.
  Json suffix = TinyBpe({{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}}, {"a b</w>"});
  suffix["end_of_word_suffix"] = "</w>";
  EXPECT_EQ(EncodeWith(TinyTokenizer(suffix), "ab"), (Ids{2}));
  // ignore_merges: a word in the vocabulary is taken whole.
  Json whole = TinyBpe({{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}, {"ab", 4}}, {"a b"});
  EXPECT_EQ(EncodeWith(TinyTokenizer(whole), "abc"), (Ids{4, 2}));
  whole["ignore_merges"] = true;
  EXPECT_EQ(EncodeWith(TinyTokenizer(whole), "abc"), (Ids{3}));
  // Merge order: lowest rank first, leftmost on ties.
  Json order =
      TinyBpe({{"a", 0}, {"b", 1}, {"ab", 2}, {"ba", 3}, {"bab", 4}}, {"b a", "a b", "ba b"});
  EXPECT_EQ(EncodeWith(TinyTokenizer(order), "abab"), (Ids{0, 4}));
}

TEST(HfTokenizerTest, AddedTokenFlags) {
  using Ids = std::vector<int>;
  const Json model =
      TinyBpe({{"a", 0}, {"b", 1}, {"c", 2}, {" ", 3}, {"s", 4}, {"w", 5}}, Json::array());
  auto token = [](int id, const char* content) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  Json lstrip = token(10, "<x>");
  lstrip["lstrip"] = true;
  Json rstrip = token(11, "[y]");
  rstrip["rstrip"] = true;
  Json single = token(12, "sw");
  single["single_word"] = true;
  Json normalized = token(13, "Qc");
  normalized["normalized"] = true;
  normalized["special"] = false;
  const Json longer = token(14, "<x>>");
  const std::string json = TinyTokenizer(
      model,
      {{"added_tokens", {lstrip, rstrip, single, normalized, longer}},
       {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", "Q"}}}, {"content", "a"}}}});
  EXPECT_EQ(EncodeWith(json, "a  <x>b"), (Ids{0, 10, 1}));
  EXPECT_EQ(EncodeWith(json, "[y]  a"), (Ids{11, 0}));
  EXPECT_EQ(EncodeWith(json, "a sw b"), (Ids{0, 3, 12, 3, 1}));
  EXPECT_EQ(EncodeWith(json, "asw"), (Ids{0, 4, 5}));
  EXPECT_EQ(EncodeWith(json, "bQc"), (Ids{1, 13}));  // matched after normalization
  EXPECT_EQ(EncodeWith(json, "bac"), (Ids{1, 13}));
  EXPECT_EQ(EncodeWith(json, "<x>>a"), (Ids{14, 0}));  // longest match
}

}  // namespace
}  // namespace tandem
