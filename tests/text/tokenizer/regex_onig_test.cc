// The tokenizer's regex engine (lib/regex/regex.h) against Oniguruma, the engine Hugging
// Face tokenizers runs split patterns with: the same matches, in the same order, for the
// pre-tokenizer patterns of GPT-2, Llama 3 and Qwen and for patterns built from each construct
// the engine supports, over random multi-script texts and the tokenizer reference vectors.
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/regex/regex.h"
#include "lib/unicode/unicode.h"
#include "nlohmann/json.hpp"
#include "tests/text/tokenizer/onig_reference.h"

namespace tandem {
namespace {

const std::vector<std::string>& Patterns() {
  static const std::vector<std::string> patterns = {
      // GPT-2, Llama 3, Qwen2/3.
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      // The Whitespace pre-tokenizer's.
      R"(\w+|[^\w\s]+)",
      // One construct at a time.
      R"(\p{Lu}\p{Ll}*)",
      R"(\P{L}+)",
      R"(\p{^N}+)",
      R"([a-c\d]{2,3})",
      R"(\d+?x)",
      R"(a*+a)",
      R"((?>ab|a)b)",
      R"((?<=a)b+)",
      R"((?<!a)b+)",
      R"(\w+(?=!))",
      R"(\b\w+\b)",
      R"(\B\w)",
      R"(\s+$)",
      R"(^\S+)",
      R"(\A\w+)",
      R"(\w+\z)",
      R"(\h+)",
      R"((?i:AB|ü)+)",
      R"([^\s\p{L}]+)",
      R"(.)",
      R"(x*)",
  };
  return patterns;
}

std::vector<std::string> Texts() {
  static const char* kPieces[] = {"a",  "b",  "x",  "A",  "B",  "'s", "'T",     "1", "22", "333",
                                  " ",  "  ", "\n", "\r", "\t", "!",  ".",      ",", "ü",  "Ü",
                                  "中", "文", "한", "ك",  "😀",  "é",  "\u00a0", "_", "-",  "ab"};
  std::mt19937 rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) t += kPieces[rng() % std::size(kPieces)];
    texts.push_back(t);
  }
  for (const char* name : {"qwen3", "mistral"}) {
    std::ifstream in(std::string(TANDEM_SHARED_DIR) + "/testdata/tokenizers/" + name +
                     ".vectors.json");
    std::stringstream ss;
    ss << in.rdbuf();
    for (const auto& v : nlohmann::json::parse(ss.str())) texts.push_back(v["text"]);
  }
  return texts;
}

std::vector<std::string> Pieces(const std::string& text, const std::vector<Regex::Match>& m) {
  std::vector<std::string> out;
  for (const auto& x : m) out.push_back(text.substr(x.begin, x.end - x.begin));
  return out;
}

TEST(RegexOnigTest, SameMatchesAsOniguruma) {
  const std::vector<std::string> texts = Texts();
  for (const std::string& pattern : Patterns()) {
    auto ours = Regex::Compile(pattern);
    ASSERT_TRUE(ours.ok()) << pattern << ": " << ours.status();
    testing::OnigReference onig(pattern);
    ASSERT_TRUE(onig.ok()) << pattern;
    int differ = 0;
    for (const std::string& text : texts) {
      std::vector<Regex::Match> a, b;
      (*ours)->FindAll(text, &a);
      onig.FindAll(text, &b);
      const auto pa = Pieces(text, a), pb = Pieces(text, b);
      if (pa != pb && ++differ <= 3) {
        ADD_FAILURE() << "pattern " << pattern << "\ntext " << nlohmann::json(text).dump()
                      << "\nours " << nlohmann::json(pa).dump() << "\nonig "
                      << nlohmann::json(pb).dump();
      }
    }
    EXPECT_EQ(differ, 0) << pattern;
  }
}

// Every class escape and category against Oniguruma on every code point.
TEST(RegexOnigTest, EveryCodePointInEveryClass) {
  for (const std::string pattern :
       {R"(\w)", R"(\W)", R"(\s)", R"(\d)", R"(\h)", R"(\p{L})", R"(\p{Lu})", R"(\p{Ll})",
        R"(\p{M})", R"(\p{N})", R"(\p{P})", R"(\p{S})", R"(\p{Z})", R"(\p{C})", R"(.)",
        R"([^\s\p{L}\p{N}])", R"((?i:k))", R"((?i:ß))"}) {
    auto ours = Regex::Compile(pattern);
    ASSERT_TRUE(ours.ok()) << pattern << ": " << ours.status();
    testing::OnigReference onig(pattern);
    ASSERT_TRUE(onig.ok()) << pattern;
    int differ = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) continue;  // surrogates are not UTF-8
      std::string text;
      unicode::AppendUtf8(cp, &text);
      std::vector<Regex::Match> a, b;
      (*ours)->FindAll(text, &a);
      onig.FindAll(text, &b);
      if (a.size() != b.size() && ++differ <= 3) {
        ADD_FAILURE() << pattern << " at U+" << std::hex << cp << ": ours " << a.size()
                      << " matches, Oniguruma " << b.size();
      }
    }
    EXPECT_EQ(differ, 0) << pattern;
  }
}

}  // namespace
}  // namespace tandem
