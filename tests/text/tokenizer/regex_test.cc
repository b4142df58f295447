#include "lib/regex/regex.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer/pre_tokenizer.h"

namespace tandem {
namespace {

std::vector<std::string> Matches(std::string_view pattern, std::string_view text) {
  auto re = Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status();
  if (!re.ok()) return {};
  std::vector<Regex::Match> m;
  (*re)->FindAll(text, &m);
  std::vector<std::string> out;
  for (const auto& x : m) out.emplace_back(text.substr(x.begin, x.end - x.begin));
  return out;
}

using V = std::vector<std::string>;

constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(RegexTest, Gpt2Pattern) {
  EXPECT_EQ(Matches(kGpt2, "Hello world's  end  "),
            (V{"Hello", " world", "'s", " ", " end", "  "}));
  EXPECT_EQ(Matches(kGpt2, "x1234 ü中文!!"), (V{"x", "1234", " ü中文", "!!"}));
}

TEST(RegexTest, Llama3Pattern) {
  EXPECT_EQ(Matches(kLlama3, "I'M 12345 ok\n\n  x"),
            (V{"I", "'M", " ", "123", "45", " ok", "\n\n", " ", " x"}));
  // Case-insensitive with Unicode simple folding: U+017F (long s) folds to 's'.
  EXPECT_EQ(Matches(kLlama3, "it\xC5\xBF"), (V{"it\xC5\xBF"}));  // U+017F is a letter
  EXPECT_EQ(Matches(kLlama3, "a'\xC5\xBF"), (V{"a", "'\xC5\xBF"}));
}

TEST(RegexTest, Quantifiers) {
  EXPECT_EQ(Matches("a{2,3}", "aaaaaaa"), (V{"aaa", "aaa"}));
  EXPECT_EQ(Matches("a+?", "aaa"), (V{"a", "a", "a"}));
  EXPECT_EQ(Matches("a*+a", "aaa"), V{});  // possessive never gives back
  EXPECT_EQ(Matches("(?:ab)+", "ababxab"), (V{"abab", "ab"}));
  EXPECT_EQ(Matches("x*", "ab"), (V{"", "", ""}));  // empty matches advance one character
  EXPECT_EQ(Matches("(?>a|ab)c", "abc ac"), (V{"ac"}));
  EXPECT_EQ(Matches("a{,2}b", "aaab"), (V{"aab"}));
  EXPECT_EQ(Matches("a{x", "a{x"), (V{"a{x"}));  // not a quantifier: literal brace
}

TEST(RegexTest, ClassesAndProperties) {
  EXPECT_EQ(Matches(R"(\p{Lu}+)", "abcDEFghi\xF0\x9D\x90\x80"), (V{"DEF", "\xF0\x9D\x90\x80"}));
  EXPECT_EQ(Matches(R"([^\s\p{L}]+)", "ab 12!? c"), (V{"12!?"}));
  EXPECT_EQ(Matches(R"(\P{L}+)", "ab12cd"), (V{"12"}));
  EXPECT_EQ(Matches(R"(\p{^N}+)", "ab12cd"), (V{"ab", "cd"}));
  EXPECT_EQ(Matches(R"([a-c\d]+)", "abcd123"), (V{"abc", "123"}));
  EXPECT_EQ(Matches(R"(\s+)",
                    "a\xE3\x80\x80\xC2\x85"
                    "b"),
            (V{"\xE3\x80\x80\xC2\x85"}));
  EXPECT_EQ(Matches(R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)", "HelloWORLD"),
            (V{"Hello"}));
  EXPECT_EQ(Matches(R"(\x{4E2D}|\u6587)", "中文"), (V{"中", "文"}));
}

TEST(RegexTest, Lookaround) {
  EXPECT_EQ(Matches(R"(\s+(?!\S))", "a   b"), (V{"  "}));
  EXPECT_EQ(Matches(R"(a(?=b))", "ab ac"), (V{"a"}));
  EXPECT_EQ(Matches(R"((?<=a)b)", "ab cb"), (V{"b"}));
  EXPECT_EQ(Matches(R"((?<!a)b)", "ab cb"), (V{"b"}));
  EXPECT_EQ(Matches(R"(\bfoo\b)", "foo foobar"), (V{"foo"}));
  EXPECT_EQ(Matches("^a|b$", "a\na\nb"), (V{"a", "a", "b"}));
}

TEST(RegexTest, RejectsWhatItCannotDo) {
  EXPECT_FALSE(Regex::Compile("(a)\\1").ok());
  EXPECT_FALSE(Regex::Compile("\\p{Han}").ok());
  EXPECT_FALSE(Regex::Compile("[a&&b]").ok());
  EXPECT_FALSE(Regex::Compile("(?<=a+)b").ok());
  EXPECT_FALSE(Regex::Compile("(ab").ok());
  EXPECT_FALSE(Regex::Compile("ab)").ok());
  EXPECT_FALSE(Regex::Compile("[ab").ok());
  EXPECT_FALSE(Regex::Compile("*a").ok());
  EXPECT_FALSE(Regex::Compile("\xFF").ok());
}

TEST(RegexTest, PathologicalPatternDoesNotHang) {
  // Exponential backtracking (2^24 paths from the first position) is cut off by the step
  // budget instead of running for ages; later positions finish within it.
  const std::string text(24, 'a');
  auto re = Regex::Compile("(a|a)*c");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  (*re)->FindAll(text, &m);
  EXPECT_TRUE(m.empty());
  // A group repeat deeper than the recursion budget gives up instead of overflowing the stack.
  auto deep = Regex::Compile("(?:a)*b");
  ASSERT_TRUE(deep.ok());
  m.clear();
  (*deep)->FindAll(std::string(5000, 'a') + "b", &m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_LT(m[0].end - m[0].begin, 5001u);  // the first, too-deep attempts found nothing
  EXPECT_EQ(m[0].end, 5001u);
}

std::vector<std::string> Pieces(const nlohmann::json& config, std::string_view text) {
  auto pre = MakePreTokenizer(config, "pre_tokenizer");
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> out;
  if (pre.ok()) {
    (*pre)->PreTokenize(text, true, [&](std::string_view piece, bool) { out.emplace_back(piece); });
  }
  return out;
}

// The split behaviours, with the expectations of the Rust library's own tests.
TEST(PreTokenizerTest, SplitBehaviours) {
  auto split = [](const char* behavior) {
    return nlohmann::json{{"type", "Split"},
                          {"pattern", {{"Regex", R"(\w+|[^\w\s]+)"}}},
                          {"behavior", behavior},
                          {"invert", true}};
  };
  const std::string text = "How are you doing?";
  EXPECT_EQ(Pieces(split("Removed"), text), (V{"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(Pieces(split("Isolated"), text), (V{"How", " ", "are", " ", "you", " ", "doing", "?"}));
  EXPECT_EQ(Pieces(split("MergedWithPrevious"), text), (V{"How ", "are ", "you ", "doing", "?"}));
  EXPECT_EQ(Pieces(split("MergedWithNext"), text), (V{"How", " are", " you", " doing", "?"}));
  EXPECT_EQ(Pieces(split("Contiguous"), text), (V{"How", " ", "are", " ", "you", " ", "doing?"}));
}

TEST(PreTokenizerTest, MetaspaceDigitsWhitespace) {
  const nlohmann::json metaspace = {{"type", "Metaspace"},
                                    {"replacement", "\xE2\x96\x81"},
                                    {"prepend_scheme", "always"},
                                    {"split", true}};
  EXPECT_EQ(Pieces(metaspace, "Hey   friend!"),
            (V{"\xE2\x96\x81Hey", "\xE2\x96\x81", "\xE2\x96\x81",
               "\xE2\x96\x81"
               "friend!"}));
  EXPECT_EQ(Pieces({{"type", "Digits"}, {"individual_digits", true}}, "a123b"),
            (V{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(Pieces({{"type", "Digits"}, {"individual_digits", false}}, "a123b4"),
            (V{"a", "123", "b", "4"}));
  EXPECT_EQ(Pieces({{"type", "WhitespaceSplit"}}, " a\tbc  d "), (V{"a", "bc", "d"}));
  EXPECT_EQ(Pieces({{"type", "Whitespace"}}, "Hey friend!!"), (V{"Hey", "friend", "!!"}));
  EXPECT_EQ(
      Pieces({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}, "Hi there"),
      (V{"\xC4\xA0Hi", "\xC4\xA0there"}));
}

}  // namespace
}  // namespace tandem
