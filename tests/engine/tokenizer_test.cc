#include "engine/tokenizer.h"

#include <gtest/gtest.h>

#include "engine/llama2c_tokenizer.h"
#include "engine/stop.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::unique_ptr<Llama2cTokenizer> Tok() {
  auto t = Llama2cTokenizer::Load(testing::Tok512(), 512);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(Llama2cTokenizerTest, EncodesLikeRunC) {
  auto tok = Tok();
  const auto ref = testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
  for (const auto& c : ref["greedy"]) {
    EXPECT_EQ(tok->Encode(c["prompt"].get<std::string>(), true),
              c["prompt_ids"].get<std::vector<int>>());
  }
  EXPECT_EQ(tok->Encode("", true), std::vector<int>{1});  // no dummy prefix for empty text
  EXPECT_TRUE(tok->Encode("", false).empty());
}

TEST(Llama2cTokenizerTest, ByteFallbackRoundTrips) {
  auto tok = Tok();
  const std::string text = "naïve café 日本 🙂";
  const auto ids = tok->Encode(text, true);
  EXPECT_EQ(tok->Decode(ids), text);
}

TEST(Utf8Test, CompletePrefix) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE6\x97"), 1u);      // 3-byte char missing a byte
  EXPECT_EQ(CompleteUtf8Prefix("a\xE6\x97\xA5"), 4u);  // complete
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x99"), 0u);   // 4-byte char missing a byte
  EXPECT_EQ(CompleteUtf8Prefix("\xC3"), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("\x80\x80"), 2u);  // stray continuation: nothing to wait for
}

TEST(IncrementalDecoderTest, StreamingEqualsFullDecodeAndNeverSplitsCharacters) {
  auto tok = Tok();
  const std::string text = "Once upon a time 日本語 and 🙂 emoji, café.";
  const auto ids = tok->Encode(text, true);
  for (size_t split = 1; split < ids.size(); split += 3) {
    std::vector<int> prompt(ids.begin(), ids.begin() + split);
    IncrementalDecoder dec(tok.get(), prompt);
    std::string streamed;
    for (size_t i = split; i < ids.size(); ++i) {
      const std::string d = dec.Add(ids[i]);
      EXPECT_EQ(CompleteUtf8Prefix(d), d.size()) << "emitted half a character";
      streamed += d;
    }
    streamed += dec.Flush();
    EXPECT_EQ(tok->Decode(prompt) + streamed, text) << split;
  }
}

TEST(StopStringMatcherTest, HoldsBackPossibleStopPrefix) {
  StopStringMatcher m({"\nUser:", "END"});
  bool stopped = false;
  EXPECT_EQ(m.Add("Hello", &stopped), "Hello");
  EXPECT_EQ(m.Add(" wor\nUs", &stopped), " wor");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.Add("ually", &stopped), "\nUsually");
  EXPECT_EQ(m.Add(" E", &stopped), " ");
  EXPECT_EQ(m.Add("ND tail", &stopped), "");
  EXPECT_TRUE(stopped);
}

TEST(StopStringMatcherTest, FlushReturnsHeldText) {
  StopStringMatcher m({"abc"});
  bool stopped = false;
  EXPECT_EQ(m.Add("xxab", &stopped), "xx");
  EXPECT_EQ(m.Flush(), "ab");
}

}  // namespace
}  // namespace tandem
