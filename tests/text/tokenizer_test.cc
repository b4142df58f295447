#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "engine/sampling/stop.h"
#include "formats/mapped_file.h"
#include "tests/test_util.h"
#include "text/encode_budget.h"
#include "text/llama2c_tokenizer.h"

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

// run.c's encode() as written there (O(n^2) merges), straight from tokenizer.bin.
std::vector<int> RunCEncode(const std::string& text) {
  const std::string bin = *ReadFileToString(testing::Tok512());
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::map<std::string, int> ids;
  for (size_t off = 4; off < bin.size();) {
    float score;
    int32_t len;
    std::memcpy(&score, bin.data() + off, 4);
    std::memcpy(&len, bin.data() + off + 4, 4);
    pieces.emplace_back(bin.data() + off + 8, len);
    scores.push_back(score);
    ids.try_emplace(pieces.back(), static_cast<int>(pieces.size()) - 1);
    off += 8 + len;
  }
  auto lookup = [&](const std::string& s) {
    auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  };
  std::vector<int> tokens = {1};
  if (!text.empty()) tokens.push_back(lookup(" "));
  std::string buf;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) buf.clear();
    buf.push_back(text[i]);
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 &&
        buf.size() < 4) {
      continue;
    }
    if (const int id = lookup(buf); id != -1) {
      tokens.push_back(id);
    } else {
      for (unsigned char b : buf) tokens.push_back(b + 3);
    }
    buf.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1, best_idx = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int id = lookup(pieces[tokens[i]] + pieces[tokens[i + 1]]);
      if (id != -1 && scores[id] > best_score) {
        best_score = scores[id];
        best_id = id;
        best_idx = static_cast<int>(i);
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  return tokens;
}

// The merges run from a heap since ingress_fuzzer showed run.c's O(n^2) loop holding the router
// for minutes on one 64 KB prompt; they must stay exactly run.c's, ties included.
TEST(Llama2cTokenizerTest, HeapMergesEqualRunCLoop) {
  auto tok = Tok();
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {
      "the",  " ", "a",    "e", "Once upon a time", "ing", "ll", "é", "日本", "🙂", "\n", "  ",
      "Lily", "!", "\xff", "x"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
    ASSERT_EQ(tok->Encode(text, true), RunCEncode(text)) << text;
  }
  // Long repetitive input (many equal-score ties) too.
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "aaaa bbbb the the the ";
  EXPECT_EQ(tok->Encode(long_text, true), RunCEncode(long_text));
}

TEST(Utf8Test, CompletePrefix) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE6\x97"), 1u);      // 3-byte char missing a byte
  EXPECT_EQ(CompleteUtf8Prefix("a\xE6\x97\xA5"), 4u);  // complete
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x99"), 0u);   // 4-byte char missing a byte
  EXPECT_EQ(CompleteUtf8Prefix("\xC3"), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("\x80\x80"), 2u);  // stray continuation: nothing to wait for
}

TEST(Utf8Test, ToValidUtf8ReplacesOnlyIllFormedBytes) {
  EXPECT_EQ(ToValidUtf8("abc \xE6\x97\xA5 \xF0\x9F\x99\x82"), "abc \xE6\x97\xA5 \xF0\x9F\x99\x82");
  EXPECT_EQ(ToValidUtf8("a\x80"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");                                                  // stray continuation
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(ToValidUtf8("x\xE6\x97"), "x\xEF\xBF\xBD");  // truncated: one maximal subpart
  EXPECT_EQ(ToValidUtf8(std::string("\0", 1)), std::string("\0", 1));
}

TEST(IncrementalDecoderTest, OutputIsValidUtf8EvenForByteSoup) {
  auto tok = Tok();
  // Byte-fallback ids (3 + byte) that form no character: 0x80, 0xFF, then "A".
  std::vector<int> ids = {1, 3 + 0x80, 3 + 0xFF, 3 + 'A', 3 + 0xE6, 3 + 0x97};
  IncrementalDecoder dec(tok.get(), {});
  std::string all;
  for (int id : ids) all += dec.Add(id);
  all += dec.Flush();
  EXPECT_EQ(ToValidUtf8(all), all);
  EXPECT_NE(all.find('A'), std::string::npos);
}

// Found with tokenizer_encode_fuzzer: output that never completes a character (lone lead
// bytes, U+FFFD) was held back forever, so every Add re-decoded the whole growing window
// (quadratic) and none of it was streamed. It now streams within a few ids.
TEST(IncrementalDecoderTest, NeverCompletingOutputStillStreams) {
  auto tok = Tok();
  IncrementalDecoder dec(tok.get(), {});
  std::string streamed;
  for (int i = 0; i < 1000; ++i) streamed += dec.Add(3 + 0xE6);  // lone lead bytes
  EXPECT_EQ(ToValidUtf8(streamed), streamed);
  // Each lone byte is one U+FFFD; all but the last few ids are out already.
  EXPECT_GE(streamed.size(), 3u * (1000 - 8));
  streamed += dec.Flush();
  EXPECT_EQ(streamed.size(), 3u * 1000);
  // And a real character after the junk still arrives whole.
  IncrementalDecoder dec2(tok.get(), {});
  std::string out;
  for (int i = 0; i < 20; ++i) out += dec2.Add(3 + 0xE6);
  for (int id : tok->Encode("日本", false)) out += dec2.Add(id);
  out += dec2.Flush();
  EXPECT_EQ(ToValidUtf8(out), out);
  EXPECT_NE(out.find("日本"), std::string::npos) << out;
}

TEST(IncrementalDecoderTest, StreamingEqualsFullDecodeAndNeverSplitsCharacters) {
  auto tok = Tok();
  const std::string text = "Once upon a time 日本語 and 🙂 emoji, café.";
  const auto ids = tok->Encode(text, true);
  for (size_t split = 1; split < ids.size(); split += 3) {
    std::vector<int> prompt(ids.begin(), ids.begin() + split);
    // A prompt is text: it ends on a character boundary.
    const std::string prompt_text = tok->Decode(prompt);
    if (ToValidUtf8(prompt_text) != prompt_text) continue;
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

// A tokenizer whose Encode takes a while and records the bytes being encoded at once.
class SlowTokenizer : public Tokenizer {
 public:
  std::vector<int> Encode(std::string_view text, bool) const override {
    const size_t now = (in_flight_ += text.size());
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    while (text.size() >= kEncodeBudgetMinBytes && !open.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    in_flight_ -= text.size();
    return {static_cast<int>(text.size() % 7)};
  }
  std::string Decode(std::span<const int>) const override { return ""; }
  int vocab_size() const override { return 7; }
  int bos_id() const override { return -1; }
  std::vector<int> eos_ids() const override { return {}; }
  size_t peak() const { return peak_.load(); }
  size_t in_flight() const { return in_flight_.load(); }
  std::atomic<bool> open{true};  // false: encodes in progress do not end

 private:
  mutable std::atomic<size_t> in_flight_{0};
  mutable std::atomic<size_t> peak_{0};
};

// Long texts are encoded within the budget at once (a text larger than all of it alone); short
// ones pass beside them without waiting; every caller gets the inner tokenizer's answer.
TEST(EncodeBudgetTest, LongTextsWaitTheirTurnShortOnesDoNot) {
  auto inner = std::make_unique<SlowTokenizer>();
  const SlowTokenizer* slow = inner.get();
  const std::unique_ptr<Tokenizer> tok = WithEncodeBudget(std::move(inner), size_t{2} << 20);
  const std::string mib(size_t{1} << 20, 'a'), three(size_t{3} << 20, 'b');
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back(
        [&] { right += tok->Encode(mib, true) == std::vector<int>{(1 << 20) % 7}; });
  }
  threads.emplace_back([&] { right += tok->Encode(three, true).size() == 1; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(right.load(), 9);
  EXPECT_LE(slow->peak(), size_t{3} << 20);  // the 3 MiB text alone, or two of 1 MiB
  // Short texts never wait: 20 of them finish while two long ones hold the whole budget and
  // cannot end (a short one that waited would never return).
  SlowTokenizer* gate = const_cast<SlowTokenizer*>(slow);
  gate->open = false;
  threads.clear();
  for (int i = 0; i < 2; ++i) threads.emplace_back([&] { tok->Encode(mib, true); });
  while (gate->in_flight() < (size_t{2} << 20)) std::this_thread::yield();
  std::vector<std::thread> shorts;
  for (int i = 0; i < 20; ++i) shorts.emplace_back([&] { tok->Encode("short", true); });
  for (auto& t : shorts) t.join();
  gate->open = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(tok->vocab_size(), 7);
}

}  // namespace
}  // namespace tandem
