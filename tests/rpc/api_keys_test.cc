#include "rpc/api_keys.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(ApiKeysTest, NoKeysAllowsEverything) {
  ApiKeys keys;
  EXPECT_FALSE(keys.enabled());
  EXPECT_TRUE(keys.Allows(""));
  EXPECT_TRUE(keys.Allows("Bearer whatever"));
}

TEST(ApiKeysTest, ParsesKeysCommentsAndBlankLines) {
  auto keys = ApiKeys::Parse("# team keys\n\nkey-0123456789abcdef\n  key-fedcba9876543210  # ci\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_TRUE(keys->Allows("Bearer key-0123456789abcdef"));
  EXPECT_TRUE(keys->Allows("bearer key-fedcba9876543210"));  // the scheme is case-insensitive
  EXPECT_TRUE(keys->Allows("  Bearer   key-fedcba9876543210 "));
}

TEST(ApiKeysTest, RefusesWrongMissingAndMalformedTokens) {
  auto keys = ApiKeys::Parse("key-0123456789abcdef\n");
  ASSERT_TRUE(keys.ok());
  EXPECT_FALSE(keys->Allows(""));
  EXPECT_FALSE(keys->Allows("Bearer"));
  EXPECT_FALSE(keys->Allows("Bearer "));
  EXPECT_FALSE(keys->Allows("key-0123456789abcdef"));          // no scheme
  EXPECT_FALSE(keys->Allows("Basic key-0123456789abcdef"));    // wrong scheme
  EXPECT_FALSE(keys->Allows("Bearer key-0123456789abcde"));    // a prefix of the key
  EXPECT_FALSE(keys->Allows("Bearer key-0123456789abcdefX"));  // the key plus more
  EXPECT_FALSE(keys->Allows("Bearer KEY-0123456789ABCDEF"));   // keys are case-sensitive
}

TEST(ApiKeysTest, BadFilesNameTheLine) {
  auto empty = ApiKeys::Parse("# only a comment\n\n");
  EXPECT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no key"), std::string::npos);
  auto short_key = ApiKeys::Parse("key-0123456789abcdef\nshort\n");
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("line 2"), std::string::npos);
  auto spaced = ApiKeys::Parse("key 0123456789abcdef\n");
  ASSERT_FALSE(spaced.ok());
  EXPECT_NE(spaced.status().message().find("line 1"), std::string::npos);
  auto missing = ApiKeys::Load("/nonexistent/keys.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(ApiKeysTest, LimitsFollowTheirKey) {
  auto keys = ApiKeys::Parse(
      "key-0123456789abcdef max_concurrent=4 max_n=2 tokens_per_minute=60000\n"
      "key-fedcba9876543210\n"
      "key-aaaaaaaaaaaaaaaa\ttokens_per_minute=10 # a comment\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  const KeyLimits a = keys->LimitsOf("Bearer key-0123456789abcdef");
  EXPECT_EQ(a.max_concurrent, 4);
  EXPECT_EQ(a.max_n, 2);
  EXPECT_EQ(a.tokens_per_minute, 60000);
  EXPECT_FALSE(keys->LimitsOf("Bearer key-fedcba9876543210").any());
  EXPECT_EQ(keys->LimitsOf("Bearer key-aaaaaaaaaaaaaaaa").tokens_per_minute, 10);
  EXPECT_FALSE(keys->LimitsOf("Bearer key-unknown-000000000").any());
  EXPECT_TRUE(keys->Allows("Bearer key-aaaaaaaaaaaaaaaa"));
  for (const char* bad :
       {"key-0123456789abcdef max_concurrent=0\n", "key-0123456789abcdef max_n=-1\n",
        "key-0123456789abcdef max_n=two\n", "key-0123456789abcdef burst=3\n",
        "key-0123456789abcdef max_concurrent=99999999999\n"}) {
    auto k = ApiKeys::Parse(bad);
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_NE(k.status().message().find("line 1"), std::string::npos) << k.status();
  }
}

}  // namespace
}  // namespace tandem
